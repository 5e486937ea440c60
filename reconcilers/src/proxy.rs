//! The proxy planner: the egress proxy daemon as the config wants it, and
//! the fail-closed rule for Docker sandboxes.
//!
//! - enabled, not set up (CA, tokens, mappings) → setup;
//! - enabled, not running → start;
//! - running with other settings, or not answering its health check →
//!   restart;
//! - disabled and running → stop;
//! - the proxy-only network (or its firewall chain) there while
//!   `proxy.enforce_network` is off (or the proxy disabled) → remove both;
//!   kept, and reported, while containers are attached to it (they are
//!   recreated off it first — the warm sandboxes by the persistence
//!   planner, those made on demand removed by the reaping planner — and
//!   the pass plans again).
//!
//! A plan whose proxy operations change the daemon or wait on the network
//! is followed by more stages ([`crate::plan_stages`]): [`predict`] says
//! what the proxy operations leave behind (set up, running and healthy on
//! the desired settings, stopped, the network gone or empty), and the
//! planner plans again against that.
//!
//! On the kubernetes backend the proxy is set up here (its files are what
//! the cluster's proxy Pod serves from) and runs in the cluster, never as
//! a daemon of this host ([`crate::kubernetes::proxy`]).
//!
//! Fail closed (`proxy.enabled` with `proxy.enforce_on_docker`): while the
//! proxy is not set up, not running, not healthy or not yet on the current
//! settings, every create, start or recreate of a Docker sandbox is
//! blocked with the reason. Nothing ever falls back to handing a sandbox a
//! real key: an unwired sandbox has no keys at all.

use hermes_model::action::{Action, InstanceAction, PodAction, ProxyAction, SandboxAction};
use hermes_model::config::Backend;
use hermes_model::desired::{Desired, Egress};
use hermes_model::observed::{Observed, ProxyObserved};
use hermes_model::plan::{Describe, Kind, Op, Target};

/// The verb of the report that keeps the proxy-only network while
/// containers are attached to it: a pass plans again once they are
/// recreated off it ([`has_proxy_work`]).
pub const NETWORK_IN_USE: &str = "network-in-use";

/// The operations on the proxy daemon and its network.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let mut ops: Vec<Op<Action>> = network(desired, observed).into_iter().collect();
    ops.extend(daemon(desired, observed));
    ops
}

/// The proxy-only network's operation: its removal when it is no longer
/// wanted.
fn network(desired: &Desired, observed: &Observed) -> Option<Op<Action>> {
    let proxy = &desired.config.proxy;
    if proxy.enabled && proxy.enforce_network {
        return None;
    }
    let net = observed.proxy.network.as_ref()?;
    let why = if proxy.enabled {
        "proxy.enforce_network is off"
    } else {
        "the proxy is disabled"
    };
    if net.exists && !net.attached.is_empty() {
        return Some(Op {
            changes: Vec::new(),
            target: Target::Proxy,
            action: Action::Keep {
                id: net.name.clone(),
                verb: NETWORK_IN_USE,
            },
            cause: format!(
                "{why}; the network {} and its firewall chain {} are kept while {} container(s) are attached, removed once they are off it",
                net.name,
                net.chain,
                net.attached.len()
            ),
        });
    }
    let what = match (net.exists, net.chain_exists) {
        (true, true) => format!(
            "the network {} and its firewall chain {}",
            net.name, net.chain
        ),
        (true, false) => format!("the network {}", net.name),
        (false, _) => format!("the firewall chain {}", net.chain),
    };
    Some(Op {
        changes: Vec::new(),
        target: Target::Proxy,
        action: Action::Proxy(ProxyAction::RemoveNetwork),
        cause: format!("{why}; {what} still there"),
    })
}

/// The operations on the proxy daemon.
fn daemon(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let p = &observed.proxy;
    let op = |action: ProxyAction, cause: String| {
        vec![Op {
            changes: Vec::new(),
            target: Target::Proxy,
            action: Action::Proxy(action),
            cause,
        }]
    };
    if desired.backend() == Backend::Kubernetes && matches!(desired.egress, Egress::On { .. }) {
        // Set up here, it runs in the cluster (the kubernetes planner's
        // proxy Pod): no daemon on this host, and one left from another
        // backend (holding keys) goes.
        if p.running {
            return op(
                ProxyAction::Stop,
                "terminal.backend is kubernetes: the proxy runs in the cluster, not on this host"
                    .to_string(),
            );
        }
        return Vec::new();
    }
    match &desired.egress {
        Egress::Off if p.running => op(
            ProxyAction::Stop,
            "disabled in config (proxy.enabled: false), running".to_string(),
        ),
        Egress::Off => Vec::new(),
        Egress::NotSetUp { missing } => op(ProxyAction::Setup, format!("not set up: {missing}")),
        Egress::On { .. } if !p.running => op(
            ProxyAction::Start,
            "enabled in config, not running".to_string(),
        ),
        Egress::On { settings, .. } if p.settings.as_deref() != Some(settings.as_str()) => op(
            ProxyAction::Restart,
            format!(
                "settings changed: {} -> {settings}",
                p.settings.as_deref().unwrap_or("unknown")
            ),
        ),
        Egress::On { .. } if !p.healthy => op(
            ProxyAction::Restart,
            format!(
                "running but not healthy: {}",
                p.problem.as_deref().unwrap_or("no answer")
            ),
        ),
        Egress::On { .. } => match keys_cause(desired, p) {
            Some(cause) => op(ProxyAction::Reload, cause),
            None => Vec::new(),
        },
    }
}

/// What differs between the real keys the proxy should hold and those it
/// does, in words (`keys: 1 added (openai), 1 changed (anthropic)`);
/// `None` when they agree or either side is not known.
fn keys_cause(desired: &Desired, p: &hermes_model::observed::ProxyObserved) -> Option<String> {
    let (wanted, held) = (desired.egress_keys.as_ref()?, p.keys.as_ref()?);
    let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    for (provider, want) in wanted {
        let have = held.get(provider);
        let loaded = have.is_some_and(|h| h.loaded);
        match (want.loaded, loaded) {
            (true, false) => added.push(provider.as_str()),
            (false, true) => removed.push(provider.as_str()),
            (true, true) => {
                let digest = have.and_then(|h| h.digest.as_ref());
                if let (Some(a), Some(b)) = (&want.digest, digest)
                    && a != b
                {
                    changed.push(provider.as_str());
                }
            }
            (false, false) => {}
        }
    }
    let parts: Vec<String> = [("added", added), ("changed", changed), ("removed", removed)]
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(what, list)| format!("{} {what} ({})", list.len(), list.join(", ")))
        .collect();
    (!parts.is_empty()).then(|| format!("keys: {}", parts.join(", ")))
}

/// Why Docker sandboxes (and singularity instances) may not start now (or,
/// on the ssh backend, the remote host may not run commands), when the
/// proxy is enforced there (`proxy.enforce_on_docker`, which covers
/// singularity too; `proxy.enforce_on_ssh`) and not ready; `None` when
/// they may.
pub fn fail_closed_reason(desired: &Desired, proxy: &ProxyObserved) -> Option<String> {
    let enforced = match desired.backend() {
        Backend::Docker | Backend::Singularity => desired.egress_enforced(),
        Backend::Ssh => desired.config.proxy.enabled && desired.config.proxy.enforce_on_ssh,
        // A bwrap sandbox's only way out is the proxy.
        Backend::Local => {
            desired.config.proxy.enabled && desired.config.terminal.local_sandbox == "bwrap"
        }
        _ => false,
    };
    if !enforced {
        return None;
    }
    let why = match &desired.egress {
        Egress::Off => return None,
        Egress::NotSetUp { missing } => format!("not set up ({missing})"),
        Egress::On { .. } if !proxy.running => "not running".to_string(),
        Egress::On { settings, .. } if proxy.settings.as_deref() != Some(settings.as_str()) => {
            "not yet on the current settings".to_string()
        }
        Egress::On { .. } if !proxy.healthy => format!(
            "not healthy: {}",
            proxy.problem.as_deref().unwrap_or("no answer")
        ),
        Egress::On { .. } => return None,
    };
    Some(format!("egress proxy {why} (fail closed)"))
}

/// Turns every operation that would run a Docker sandbox or a
/// singularity instance into a refusal naming `reason`.
pub fn block_sandboxes(ops: &mut [Op<Action>], reason: &str) {
    for op in ops {
        let runs_a_sandbox = match &op.action {
            Action::Sandbox(a) => match a {
                SandboxAction::Create(_)
                | SandboxAction::Warm(_)
                | SandboxAction::Start { .. }
                | SandboxAction::Recreate { .. }
                | SandboxAction::Migrate { .. } => true,
                SandboxAction::Remove { .. }
                | SandboxAction::ReleaseDisk(_)
                | SandboxAction::Stop { .. }
                | SandboxAction::Adopt { .. } => false,
            },
            Action::Instance(a) => match a {
                InstanceAction::Start(_) | InstanceAction::Restart(_) => true,
                InstanceAction::End { .. } | InstanceAction::Stop { .. } => false,
            },
            Action::Pod(a) => match a {
                PodAction::Create(_) | PodAction::Replace { .. } | PodAction::Resume { .. } => true,
                PodAction::CreateClaim(_)
                | PodAction::Delete { .. }
                | PodAction::DeleteIdle { .. }
                | PodAction::Suspend { .. }
                | PodAction::ApplyProxy { .. }
                | PodAction::DeleteProxy { .. } => false,
            },
            Action::Proxy(_)
            | Action::Ssh(_)
            | Action::Cloud(_)
            | Action::Blocked
            | Action::Keep { .. } => false,
        };
        if runs_a_sandbox {
            op.cause = format!("{reason}; wanted: {} ({})", op.action.verb(), op.cause);
            op.action = Action::Blocked;
        }
    }
}

/// Whether a plan has operations on the proxy that change it, or a
/// proxy-only network that waits for its containers to leave: either is a
/// reason to plan again once the plan is applied.
pub fn has_proxy_work(ops: &[Op<Action>]) -> bool {
    ops.iter().any(|op| {
        op.target == Target::Proxy
            && (op.action.kind() != Kind::Report
                || matches!(op.action, Action::Keep { verb, .. } if verb == NETWORK_IN_USE))
    })
}

/// What a predicted setup stands in for until the setup has made the
/// proxy's files: the CA's hash, the tokens and the settings fingerprint
/// are known only then. A sandbox planned against it differs from any
/// made before the setup, as the one planned after it will.
pub const AFTER_SETUP: &str = hermes_model::egress::AFTER_SETUP;

/// Makes `desired` and `observed` what they will be once `ops` (a stage of
/// the plan) are carried out, as far as the proxy goes: a setup leaves
/// the proxy set up (a running one on its new settings: `egress setup`
/// restarts it), a start or a restart leaves it running and healthy
/// on the desired settings, a stop leaves it stopped, the network's
/// removal leaves no network, and a network kept in use empties once the
/// stage moves every container attached to it off it (recreates,
/// removals).
/// Returns what the next stage waits for, in words; `None` when `ops`
/// change nothing of the proxy (no next stage to plan).
pub fn predict(
    desired: &mut Desired,
    observed: &mut Observed,
    ops: &[Op<Action>],
) -> Option<String> {
    let mut after: Vec<String> = Vec::new();
    // The containers the stage takes off the network: those it recreates
    // (the new one is made off it) or removes.
    let moved: Vec<&str> = ops
        .iter()
        .filter_map(|op| match &op.action {
            Action::Sandbox(SandboxAction::Recreate { old_id, .. }) => Some(old_id.as_str()),
            Action::Sandbox(SandboxAction::Remove { id, .. }) => Some(id.as_str()),
            _ => None,
        })
        .collect();
    if let Some(hermes_model::kubernetes::KubeObserved::Seen { proxy, .. }) =
        observed.kubernetes.as_mut()
        && let Some(what) = crate::kubernetes::proxy::predict(proxy, ops)
    {
        after.push(what);
    }
    for op in ops.iter().filter(|op| op.target == Target::Proxy) {
        match &op.action {
            Action::Proxy(ProxyAction::Setup) => {
                if let Egress::NotSetUp { .. } = desired.egress {
                    let proxy = &desired.config.proxy;
                    // As the caller predicted it from the proxy's files;
                    // without that, nothing of it is known.
                    let wiring = desired.egress_after_setup.clone().unwrap_or_else(|| {
                        hermes_model::egress::EgressWiring {
                            gateway: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                            tunnel_port: proxy.tunnel_port,
                            ca_host_path: std::path::PathBuf::from(AFTER_SETUP),
                            ca_sha256: AFTER_SETUP.to_string(),
                            tokens: Vec::new(),
                            network: proxy.enforce_network.then(|| AFTER_SETUP.to_string()),
                            gcp_adc_host_path: None,
                            env_dir_host_path: Some(std::path::PathBuf::from(AFTER_SETUP)),
                        }
                    });
                    desired.set_egress(Egress::On {
                        wiring,
                        settings: AFTER_SETUP.to_string(),
                    });
                }
                if observed.proxy.running {
                    // `egress setup` restarts (or reloads) a running proxy
                    // on what it wrote.
                    observed.proxy.healthy = true;
                    observed.proxy.problem = None;
                    observed.proxy.settings = Some(AFTER_SETUP.to_string());
                    after.push("the proxy is set up and runs on its new settings".to_string());
                } else {
                    after.push("the proxy is set up".to_string());
                }
            }
            Action::Proxy(ProxyAction::Start | ProxyAction::Restart) => {
                let settings = match &desired.egress {
                    Egress::On { settings, .. } => Some(settings.clone()),
                    Egress::Off | Egress::NotSetUp { .. } => None,
                };
                observed.proxy.running = true;
                observed.proxy.healthy = true;
                observed.proxy.problem = None;
                observed.proxy.settings = settings;
                // A proxy that starts loads the keys of now.
                observed.proxy.keys = desired.egress_keys.clone();
                after.push("the proxy runs, healthy, on the current settings".to_string());
            }
            // The keys are the proxy's own: nothing waits on them.
            Action::Proxy(ProxyAction::Reload) => {
                observed.proxy.keys = desired.egress_keys.clone();
            }
            Action::Proxy(ProxyAction::Stop) => {
                observed.proxy.running = false;
                observed.proxy.healthy = false;
                observed.proxy.settings = None;
                after.push("the proxy is stopped".to_string());
            }
            Action::Proxy(ProxyAction::RemoveNetwork) => {
                observed.proxy.network = None;
                after.push("the proxy-only network is gone".to_string());
            }
            Action::Keep { verb, .. } if *verb == NETWORK_IN_USE => {
                let Some(net) = observed.proxy.network.as_mut() else {
                    continue;
                };
                net.attached.retain(|id| !moved.contains(&id.as_str()));
                if !net.attached.is_empty() {
                    continue;
                }
                after.push("the sandboxes are off the proxy-only network".to_string());
            }
            Action::Sandbox(_)
            | Action::Ssh(_)
            | Action::Instance(_)
            | Action::Cloud(_)
            | Action::Pod(_)
            | Action::Blocked
            | Action::Keep { .. } => {}
        }
    }
    (!after.is_empty()).then(|| after.join(", and "))
}

#[cfg(test)]
mod tests;
