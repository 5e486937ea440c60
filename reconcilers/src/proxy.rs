//! The proxy planner: the egress proxy daemon as the config wants it, and
//! the fail-closed rule for Docker sandboxes.
//!
//! - enabled, not set up (CA, tokens, mappings) → setup;
//! - enabled, not running → start;
//! - running with other settings, or not answering its health check →
//!   restart;
//! - disabled and running → stop.
//!
//! Fail closed (`proxy.enabled` with `proxy.enforce_on_docker`): while the
//! proxy is not set up, not running, not healthy or not yet on the current
//! settings, every create, start or recreate of a Docker sandbox is
//! blocked with the reason. Nothing ever falls back to handing a sandbox a
//! real key: an unwired sandbox has no keys at all.

use hermes_model::action::{Action, InstanceAction, ProxyAction, SandboxAction};
use hermes_model::config::Backend;
use hermes_model::desired::{Desired, Egress};
use hermes_model::observed::{Observed, ProxyObserved};
use hermes_model::plan::{Describe, Kind, Op, Target};

/// The operations on the proxy daemon.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let p = &observed.proxy;
    let op = |action: ProxyAction, cause: String| {
        vec![Op {
            target: Target::Proxy,
            action: Action::Proxy(action),
            cause,
        }]
    };
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
        Egress::On { .. } => Vec::new(),
    }
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
                | SandboxAction::Start { .. }
                | SandboxAction::Recreate { .. } => true,
                SandboxAction::Remove { .. } => false,
            },
            Action::Instance(a) => match a {
                InstanceAction::Start(_) | InstanceAction::Restart(_) => true,
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

/// Whether a plan has operations on the proxy that change it.
pub fn has_proxy_work(ops: &[Op<Action>]) -> bool {
    ops.iter()
        .any(|op| op.target == Target::Proxy && op.action.kind() != Kind::Report)
}

#[cfg(test)]
mod tests;
