//! The reaping planner: what becomes of the labelled containers of the
//! active profile that no warm sandbox claims. Each rule names its cause in
//! the plan:
//!
//! - no spec hash, made by Hermes Agent (its labels only), for a task
//!   hermes does not keep warm → the agent's own rules: exited or dead,
//!   finished longer than the orphan limit below ago (or never started
//!   for as long) → removed; its backend probe ([`AGENT_PROBE_TASK`]),
//!   idle longer than `lifetime_seconds` → removed; running off the
//!   proxy-only network while it is enforced, idle → removed (its commands
//!   would bypass the proxy), whatever `docker_orphan_reaper`; anything else, and
//!   any of them while a command runs inside → kept, saying when it goes;
//! - no spec hash otherwise → reported, never removed;
//! - left in `created` longer than [`STUCK_SECONDS`] → removed (a start
//!   that failed);
//! - exited or dead, finished longer than 2 × max(60, `lifetime_seconds`)
//!   ago, with `docker_orphan_reaper` → removed as an orphan;
//! - made on demand and still on the proxy-only network once
//!   `proxy.enforce_network` is off (or the proxy disabled), where the
//!   proxy no longer listens → removed when idle (the next exec makes it
//!   anew, off the network, and the network can go), kept while busy;
//! - a sandbox made on demand (a session's, another task's, or the default
//!   task's when it is not kept warm), idle longer than its limit →
//!   removed; busy (an exec or a background process inside) or of unknown
//!   activity → kept;
//! - no longer desired (the backend is not docker, or a persistent sandbox
//!   while `container_persistent` is false) → removed only when pruning,
//!   else reported "not desired, kept".
//!
//! Other profiles' containers are never looked at. [`end_session`] plans
//! `hermes session end`: the removal of a session's containers. A persistent sandbox's
//! data lives in bind mounts on the host, so removing its container loses
//! no file.

use std::collections::BTreeSet;

use hermes_model::action::{Action, SandboxAction};
use hermes_model::desired::{Desired, Egress, Role};
use hermes_model::observed::{
    AGENT_PROBE_TASK, ContainerState, Idleness, Observed, ObservedContainer,
};
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{DRAIN_GRACE_SECONDS, LABEL_EGRESS, SandboxKey, sanitize};

use crate::age;
use crate::persistence::{STUCK_SECONDS, stuck_cause, unmanaged_op};

/// The shortest orphan age, before doubling: one minute.
const ORPHAN_FLOOR_SECONDS: u64 = 60;

/// The operations on the active profile's containers outside `claimed`.
pub fn plan(
    desired: &Desired,
    observed: &Observed,
    now: i64,
    claimed: &BTreeSet<String>,
) -> Vec<Op<Action>> {
    let profile = sanitize(&desired.profile);
    observed
        .containers
        .iter()
        .filter(|c| c.profile() == Some(profile.as_str()) && !claimed.contains(&c.id))
        .filter_map(|c| plan_one(desired, observed, c, now))
        .collect()
}

/// Seconds after its finish that an exited container counts as an orphan.
pub fn orphan_limit(desired: &Desired) -> i64 {
    let lifetime = desired.config.terminal.lifetime_seconds;
    i64::try_from(2 * lifetime.max(ORPHAN_FLOOR_SECONDS)).unwrap_or(i64::MAX)
}

fn plan_one(
    desired: &Desired,
    observed: &Observed,
    c: &ObservedContainer,
    now: i64,
) -> Option<Op<Action>> {
    if c.is_agents() {
        return Some(agent_leftover(desired, observed, c, now));
    }
    if c.spec_hash().is_none() {
        return Some(unmanaged_op(c));
    }
    let remove = |cause: String| Some(remove_op(c, cause));
    if c.state == ContainerState::Created && now - c.created > STUCK_SECONDS {
        return remove(stuck_cause(c, now));
    }
    if let Some(why) = off_the_network(desired, observed, c) {
        return match observed.idleness(c) {
            // Kept: the network waits for it (its report says so).
            Idleness::Busy { .. } | Idleness::Unknown => None,
            Idleness::NotRunning | Idleness::IdleSince(_) => remove(why),
        };
    }
    if let Some(op) = egress_recreate(desired, c) {
        return Some(op);
    }
    // Stopped when idle (`terminal.idle_action: stop`): the next command
    // starts it; it is no orphan.
    let stopped_on_purpose = desired.idle_stop_after().is_some()
        && c.session().is_none()
        && c.state == ContainerState::Exited;
    if desired.config.terminal.docker_orphan_reaper
        && !stopped_on_purpose
        && matches!(c.state, ContainerState::Exited | ContainerState::Dead)
    {
        let finished = c.finished_at.unwrap_or(c.created);
        let limit = orphan_limit(desired);
        if now - finished > limit {
            return remove(format!(
                "orphan: {} {} ago (> {})",
                c.state.as_str(),
                age(now - finished),
                age(limit)
            ));
        }
    }
    match desired.role(c.session().is_some()) {
        Role::OnDemand {
            idle_limit: Some(limit),
        } => {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            match observed.idleness(c) {
                Idleness::IdleSince(t)
                    if now - t > limit
                        && c.session().is_none()
                        && desired.idle_stop_after().is_some() =>
                {
                    Some(Op {
                        changes: Vec::new(),
                        target: target(c),
                        action: Action::Sandbox(SandboxAction::Stop { id: c.id.clone() }),
                        cause: crate::persistence::idle_stop_cause(
                            now - t,
                            limit,
                            if desired
                                .config
                                .terminal
                                .persistent_max_idle_seconds
                                .is_some()
                            {
                                "terminal.persistent_max_idle_seconds"
                            } else {
                                "terminal.lifetime_seconds"
                            },
                        ),
                    })
                }
                Idleness::IdleSince(t) if now - t > limit => remove(format!(
                    "idle {} (> {}, {})",
                    age(now - t),
                    age(limit),
                    if c.session().is_some() {
                        "terminal.lifetime_seconds"
                    } else if desired.config.terminal.docker_persist_across_processes {
                        "terminal.persistent_max_idle_seconds"
                    } else {
                        "terminal.lifetime_seconds"
                    }
                )),
                _ => None,
            }
        }
        Role::OnDemand { idle_limit: None } => None,
        Role::NotDesired if desired.config.reconcile.prune => remove(format!(
            "not desired ({}); pruned{}",
            c.state.as_str(),
            removal_cost(c)
        )),
        Role::NotDesired => Some(Op {
            changes: Vec::new(),
            target: Target::Container {
                name: c.name.clone(),
            },
            action: Action::Keep {
                id: c.id.clone(),
                verb: "kept",
            },
            cause: format!(
                "not desired ({}), kept; `hermes reconcile --prune` removes it",
                c.state.as_str()
            ),
        }),
    }
}

/// The recreate of a sandbox made on demand (a session's, another
/// task's) whose egress wiring is not the proxy's of now (made before the
/// proxy was set up, or with other settings, or wired while it is now
/// off), as a warm sandbox's would be: its commands would otherwise run
/// without the proxy's route and CA while their variables name it (exec
/// refuses them while the proxy is enforced). Not while the proxy still
/// awaits its setup: the setup comes first, and the wiring is known after.
fn egress_recreate(desired: &Desired, c: &ObservedContainer) -> Option<Op<Action>> {
    if matches!(desired.egress, Egress::NotSetUp { .. })
        || c.state == ContainerState::Removing
        || !matches!(desired.role(c.session().is_some()), Role::OnDemand { .. })
    {
        return None;
    }
    let (profile, task) = (c.profile()?, c.task()?);
    let key = match c.session() {
        Some(session) => SandboxKey::session(profile, task, session),
        None => SandboxKey::persistent(profile, task),
    };
    let spec = desired.sandbox(key);
    let label = |l: Option<&str>| l.unwrap_or("off").to_string();
    let (had, wants) = (
        label(c.label(LABEL_EGRESS)),
        label(spec.labels.get(LABEL_EGRESS).map(String::as_str)),
    );
    if spec.name != c.name || had == wants {
        return None;
    }
    let why = match (had.as_str(), wants.as_str()) {
        ("off", _) => "made before the egress proxy was on",
        (_, "off") => "wired to the egress proxy, which is off",
        _ => "wired to other egress proxy settings",
    };
    Some(Op {
        changes: Vec::new(),
        target: target(c),
        action: Action::Sandbox(SandboxAction::Recreate {
            old_id: c.id.clone(),
            spec: Box::new(spec.clone()),
        }),
        cause: format!(
            "egress wiring changed: {why}{}",
            crate::persistence::recreate_cost(&spec, c)
        ),
    })
}

/// A container Hermes Agent made for a task no warm sandbox of hermes's
/// is (another task's, its backend probe), by the agent's own rules
/// (`tools/environments/docker.py`, `reap_orphan_containers`): removed
/// once exited (or never started) for longer than the orphan limit, the
/// probe once idle for `lifetime_seconds`, and, while the proxy-only
/// network is enforced, any running one off it once idle; never while a
/// command runs in it, and nothing else of the agent's.
fn agent_leftover(
    desired: &Desired,
    observed: &Observed,
    c: &ObservedContainer,
    now: i64,
) -> Op<Action> {
    let terminal = &desired.config.terminal;
    let limit = orphan_limit(desired);
    let idle_limit = i64::try_from(terminal.lifetime_seconds).unwrap_or(i64::MAX);
    let task = c.task().unwrap_or_default();
    let probe = task == AGENT_PROBE_TASK;
    let whose = if probe {
        "Hermes Agent's backend probe".to_string()
    } else {
        format!("made by Hermes Agent for task {task} (not kept warm here)")
    };
    let kept = |verb: &'static str, cause: String| Op {
        changes: Vec::new(),
        target: target(c),
        action: Action::Keep {
            id: c.id.clone(),
            verb,
        },
        cause,
    };
    let state = c.state.as_str();
    // Enforcement comes first, whatever docker_orphan_reaper says.
    let off_network = off_the_enforced_network(desired, observed, c);
    if !terminal.docker_orphan_reaper && off_network.is_none() {
        return kept(
            "unmanaged",
            format!("{whose}, {state}; left alone (terminal.docker_orphan_reaper is off)"),
        );
    }
    let exited = matches!(c.state, ContainerState::Exited | ContainerState::Dead);
    if terminal.docker_orphan_reaper && (exited || c.state == ContainerState::Created) {
        let (since, what) = match c.finished_at {
            Some(t) if exited => (t, state),
            _ if exited => (c.created, state),
            _ => (c.created, "created, never started,"),
        };
        if now - since > limit {
            return remove_op(
                c,
                format!(
                    "{whose}: {what} {} ago (> {}, the agent's orphan rule: 2 × \
                     terminal.lifetime_seconds)",
                    age(now - since),
                    age(limit)
                ),
            );
        }
    }
    let when = if probe && c.state == ContainerState::Running {
        format!(
            "removed once idle for {} (terminal.lifetime_seconds)",
            age(idle_limit)
        )
    } else {
        format!(
            "removed once exited for {} (2 × terminal.lifetime_seconds)",
            age(limit)
        )
    };
    match observed.idleness(c) {
        Idleness::IdleSince(_) if off_network.is_some() => remove_op(
            c,
            format!("{whose}, idle, {}", off_network.unwrap_or_default()),
        ),
        Idleness::Busy { processes } if off_network.is_some() => kept(
            "busy",
            format!(
                "{whose} runs {processes} command{}; removed once idle: {}",
                if processes == 1 { "" } else { "s" },
                off_network.unwrap_or_default()
            ),
        ),
        Idleness::IdleSince(t) if probe && now - t > idle_limit => remove_op(
            c,
            format!(
                "{whose}, idle {} (> {}, terminal.lifetime_seconds)",
                age(now - t),
                age(idle_limit)
            ),
        ),
        Idleness::Busy { processes } => kept(
            "busy",
            format!(
                "{whose} runs {processes} command{}; {when}",
                if processes == 1 { "" } else { "s" }
            ),
        ),
        _ => kept("unmanaged", format!("{whose}, {state}; {when}")),
    }
}

/// What a removal of a running container costs, for the cause: the
/// commands it waits for, up to [`DRAIN_GRACE_SECONDS`], and then stops.
pub(crate) fn removal_cost(c: &ObservedContainer) -> String {
    let grace = age(i64::try_from(DRAIN_GRACE_SECONDS).unwrap_or(i64::MAX));
    match (c.state, c.processes) {
        (ContainerState::Running, Some(0)) => String::new(),
        (ContainerState::Running, Some(1)) => {
            format!("; waits up to {grace} for the 1 process running in it, then stops it")
        }
        (ContainerState::Running, Some(n)) => {
            format!("; waits up to {grace} for the {n} processes running in it, then stops them")
        }
        (ContainerState::Running, None) => {
            format!("; waits up to {grace} for what runs in it, then stops it")
        }
        _ => String::new(),
    }
}

/// Why a running container of the agent's must go while the proxy-only
/// network is enforced, when it is not on that network: what runs in it
/// would reach the network without the proxy. Its data is in bind mounts;
/// the agent makes it again when it needs it.
fn off_the_enforced_network(
    desired: &Desired,
    observed: &Observed,
    c: &ObservedContainer,
) -> Option<String> {
    let proxy = &desired.config.proxy;
    if !(proxy.enabled && proxy.enforce_network) || c.state != ContainerState::Running {
        return None;
    }
    let attached = observed
        .proxy
        .network
        .as_ref()
        .is_some_and(|n| n.exists && n.attached.contains(&c.id));
    (!attached).then(|| {
        "off the proxy-only network while proxy.enforce_network is on (its commands would \
         bypass the proxy)"
            .to_string()
    })
}

fn remove_op(c: &ObservedContainer, cause: String) -> Op<Action> {
    Op {
        changes: Vec::new(),
        target: target(c),
        action: Action::Sandbox(SandboxAction::Remove {
            id: c.id.clone(),
            name: c.name.clone(),
            disk: None,
        }),
        cause,
    }
}

/// Why `c` must leave the proxy-only network, when it is attached to it
/// and the network is no longer wanted: the cause of its removal.
fn off_the_network(
    desired: &Desired,
    observed: &Observed,
    c: &ObservedContainer,
) -> Option<String> {
    let proxy = &desired.config.proxy;
    if proxy.enabled && proxy.enforce_network {
        return None;
    }
    let net = observed.proxy.network.as_ref()?;
    if !net.exists || !net.attached.contains(&c.id) {
        return None;
    }
    let why = if proxy.enabled {
        "proxy.enforce_network is off"
    } else {
        "the proxy is disabled"
    };
    let lost = if c.session().is_some() {
        "every file in it is lost"
    } else {
        "files outside /workspace and /root are lost"
    };
    Some(format!(
        "on the proxy-only network {}, which goes ({why}); the next exec makes it anew off it; {lost}",
        net.name
    ))
}

/// The sandbox a container is, from its labels.
/// The operations of `hermes session end ID`: the removal of every
/// container of `profile` labelled with session `session`, whatever its
/// task, each with the cause that the session was ended by hand. Other
/// profiles' and sessions' containers are not looked at.
pub fn end_session(profile: &str, session: &str, observed: &Observed) -> Vec<Op<Action>> {
    let profile = sanitize(profile);
    let session = sanitize(session);
    observed
        .containers
        .iter()
        .filter(|c| c.profile() == Some(profile.as_str()) && c.session() == Some(session.as_str()))
        .map(|c| Op {
            changes: Vec::new(),
            target: target(c),
            action: Action::Sandbox(SandboxAction::Remove {
                id: c.id.clone(),
                name: c.name.clone(),
                disk: None,
            }),
            cause: format!("session {session} ended by hand{}", removal_cost(c)),
        })
        .collect()
}

pub(crate) fn target(c: &ObservedContainer) -> Target {
    if c.is_unclaimed_pool_member() {
        return Target::Pool {
            profile: c.profile().unwrap_or_default().to_string(),
            task: c
                .label(hermes_model::sandbox::LABEL_SESSION_TASK)
                .unwrap_or_default()
                .to_string(),
        };
    }
    Target::Sandbox {
        profile: c.profile().unwrap_or_default().to_string(),
        task: c.task().unwrap_or_default().to_string(),
        session: c.session().map(str::to_string),
    }
}

#[cfg(test)]
mod tests;
