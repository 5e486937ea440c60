//! The persistence reconciler: for each desired persistent sandbox,
//!
//! - none → create and start;
//! - running with an equal spec hash → nothing;
//! - created or exited with an equal hash → start;
//! - a different hash, or dead → recreate (the data is in bind mounts);
//! - several for one (profile, task) → keep the running one started last
//!   (tie: created last), remove the others;
//! - a labelled container without a spec hash → reported, never removed.
//!
//! - left in `created` longer than [`STUCK_SECONDS`] → recreate (a start
//!   that failed).
//! - a container of the profile holding the sandbox's name under another
//!   key (its task or session label is not the sandbox's) → removed before the create when
//!   it is on its way out (exited, dead, being removed, or a create left
//!   stale), blocked on while it runs; one without a spec hash is never
//!   removed.
//!
//! Labelled containers of the active profile that no warm sandbox claims
//! are the reaping planner's ([`crate::reaping`]).

use std::collections::BTreeSet;

use hermes_model::action::{Action, SandboxAction};
use hermes_model::desired::Desired;
use hermes_model::observed::{ContainerState, Observed, ObservedContainer};
use hermes_model::plan::Change;
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{SandboxSpec, sanitize};
use hermes_model::settings::{self, LABEL_SETTINGS};

use crate::{adoption, age};

/// How long a container may stay `created` before it counts as a start
/// that failed.
pub const STUCK_SECONDS: i64 = 60;

/// The cause of a container left in `created`.
pub(crate) fn stuck_cause(c: &ObservedContainer, now: i64) -> String {
    format!(
        "stuck in created for {} (> {}): a start that failed",
        age(now - c.created),
        age(STUCK_SECONDS)
    )
}

/// What the persistence planner decided, and which containers it took
/// charge of (by id): the reaping planner sees to the rest.
#[derive(Debug, Default)]
pub struct Planned {
    pub ops: Vec<Op<Action>>,
    pub claimed: BTreeSet<String>,
}

/// The operations that converge the warm sandboxes.
pub fn plan(desired: &Desired, observed: &Observed, now: i64) -> Planned {
    let mut ops = Vec::new();
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    let profile = sanitize(&desired.profile);
    for spec in &desired.sandboxes {
        let target = target_of(spec);
        let ours: Vec<&ObservedContainer> = observed
            .containers
            .iter()
            .filter(|c| {
                c.profile() == Some(profile.as_str())
                    && c.task() == Some(sanitize(&spec.key.task).as_str())
                    && c.session().map(str::to_string) == spec.key.session.as_deref().map(sanitize)
            })
            .collect();
        if let Some(holder) = observed.containers.iter().find(|c| {
            c.name == spec.name
                && c.profile() == Some(profile.as_str())
                && !ours.iter().any(|o| o.id == c.id)
        }) {
            claimed.insert(holder.id.clone());
            let op = holder_op(holder, &target, now);
            let blocked = op.action == Action::Blocked;
            ops.push(op);
            if blocked {
                continue;
            }
        }
        let (managed, unmanaged): (Vec<_>, Vec<_>) =
            ours.into_iter().partition(|c| c.spec_hash().is_some());
        if spec.key.session.is_none() {
            // A persistent sandbox's containers without a spec hash are
            // Hermes Agent's: adopted, or removed as duplicates.
            for c in managed.iter().chain(&unmanaged) {
                claimed.insert(c.id.clone());
            }
            let keep = pick_keeper(&managed);
            for c in &managed {
                if keep.is_some_and(|k| k.id != c.id) {
                    ops.push(duplicate_of(c, keep, &target));
                }
            }
            let task = sanitize(&spec.key.task);
            if let Some(legacy) = observed.legacy.iter().find(|l| l.data.task == task) {
                ops.extend(adoption::plan_agent_made(
                    spec,
                    &target,
                    &unmanaged,
                    keep.or(unmanaged.first().copied()),
                    |c| recreate_cost(spec, c),
                ));
                let cost = keep.map(|k| recreate_cost(spec, k)).unwrap_or_default();
                ops.push(adoption::plan_legacy(spec, &target, legacy, keep, &cost));
                continue;
            }
            ops.extend(adoption::plan_agent_made(
                spec,
                &target,
                &unmanaged,
                keep,
                |c| recreate_cost(spec, c),
            ));
            match keep {
                Some(keep) => {
                    if let Some(op) =
                        converge_one(spec, keep, target, observed, now, desired.idle_stop_after())
                    {
                        ops.push(op);
                    }
                }
                None if unmanaged.is_empty() => ops.push(Op {
                    changes: Vec::new(),
                    target,
                    action: Action::Sandbox(SandboxAction::Create(Box::new(spec.clone()))),
                    cause: create_cause(desired, observed, spec),
                }),
                None => {}
            }
            continue;
        }
        for c in &unmanaged {
            claimed.insert(c.id.clone());
            ops.push(unmanaged_op(c));
        }
        // An unmanaged container holding our name would make every create
        // fail: say so instead of looping.
        if let Some(squatter) = unmanaged.iter().find(|c| c.name == spec.name) {
            if managed.is_empty() {
                ops.push(Op {
                    changes: Vec::new(),
                    target,
                    action: Action::Blocked,
                    cause: format!(
                        "container {} (no hermes-spec-hash label) holds the name; remove it by hand",
                        squatter.name
                    ),
                });
                continue;
            }
        }
        let Some(keep) = pick_keeper(&managed) else {
            ops.push(Op {
                changes: Vec::new(),
                target,
                action: Action::Sandbox(SandboxAction::Create(Box::new(spec.clone()))),
                cause: create_cause(desired, observed, spec),
            });
            continue;
        };
        for c in &managed {
            claimed.insert(c.id.clone());
            if c.id != keep.id {
                ops.push(duplicate_of(c, Some(keep), &target));
            }
        }
        if let Some(op) = converge_one(spec, keep, target, observed, now, None) {
            ops.push(op);
        }
    }
    Planned { ops, claimed }
}

/// The removal of a duplicate of hermes's own beside `keep`.
fn duplicate_of(
    c: &ObservedContainer,
    keep: Option<&ObservedContainer>,
    target: &Target,
) -> Op<Action> {
    let kept = keep.map_or_else(String::new, |k| {
        format!("; {} {} is kept", k.state.as_str(), k.name)
    });
    Op {
        changes: Vec::new(),
        target: target.clone(),
        action: Action::Sandbox(SandboxAction::Remove {
            id: c.id.clone(),
            name: c.name.clone(),
            disk: None,
        }),
        cause: format!("duplicate {} ({}){kept}", c.name, c.state.as_str()),
    }
}

pub(crate) fn target_of(spec: &SandboxSpec) -> Target {
    Target::Sandbox {
        profile: spec.key.profile.clone(),
        task: spec.key.task.clone(),
        session: spec.key.session.clone(),
    }
}

/// What becomes of a container holding the sandbox's name that its key
/// does not claim: every create would meet it. Removed (before the
/// create: removals go first) when it is on its way out; else, or without
/// a spec hash (not hermes's to remove), the sandbox is blocked on it.
fn holder_op(holder: &ObservedContainer, target: &Target, now: i64) -> Op<Action> {
    let whose = format!(
        "task {}{}",
        holder.task().unwrap_or("(none)"),
        holder
            .session()
            .map(|s| format!(", session {s}"))
            .unwrap_or_default()
    );
    let leaving = match holder.state {
        ContainerState::Exited | ContainerState::Dead | ContainerState::Removing => true,
        ContainerState::Created => now - holder.created > STUCK_SECONDS,
        ContainerState::Running | ContainerState::Paused | ContainerState::Restarting => false,
    };
    if holder.spec_hash().is_none() || !leaving {
        return Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Blocked,
            cause: format!(
                "container {} ({}, {whose}) holds the name; remove it by hand",
                holder.name,
                holder.state.as_str()
            ),
        };
    }
    Op {
        changes: Vec::new(),
        target: target.clone(),
        action: Action::Sandbox(SandboxAction::Remove {
            id: holder.id.clone(),
            name: holder.name.clone(),
            disk: None,
        }),
        cause: format!(
            "container {} ({}, {whose}) holds the name; removed before the create",
            holder.name,
            holder.state.as_str()
        ),
    }
}

pub(crate) fn unmanaged_op(c: &ObservedContainer) -> Op<Action> {
    Op {
        changes: Vec::new(),
        target: Target::Container {
            name: c.name.clone(),
        },
        action: Action::Keep {
            id: c.id.clone(),
            verb: "unmanaged",
        },
        cause: "no hermes-spec-hash label; left alone".to_string(),
    }
}

/// The running container started last; without a running one, the one
/// created last. Ties break on the id, so the choice is deterministic.
fn pick_keeper<'a>(managed: &[&'a ObservedContainer]) -> Option<&'a ObservedContainer> {
    managed.iter().copied().max_by(|a, b| {
        let key = |c: &ObservedContainer| {
            (
                c.state == ContainerState::Running,
                c.started_at.unwrap_or(i64::MIN),
                c.created,
                c.id.clone(),
            )
        };
        key(a).cmp(&key(b))
    })
}

/// `idle_stop`: with `terminal.idle_action: stop`, how long the sandbox
/// may be idle before it is stopped (and a stopped one is left stopped:
/// the next command starts it).
fn converge_one(
    spec: &SandboxSpec,
    keep: &ObservedContainer,
    target: Target,
    observed: &Observed,
    now: i64,
    idle_stop: Option<u64>,
) -> Option<Op<Action>> {
    let observed_hash = keep.spec_hash().unwrap_or_default();
    if observed_hash != spec.hash() || keep.name != spec.name {
        let changes = if observed_hash != spec.hash() {
            changed_settings(spec, keep)
        } else {
            Vec::new()
        };
        let mut cause = if keep.name != spec.name {
            format!("container named {}, wanted {}", keep.name, spec.name)
        } else if changes.is_empty() {
            format!("spec changed: {observed_hash} -> {}", spec.hash())
        } else {
            let list: Vec<String> = changes.iter().map(|c| c.describe()).collect();
            format!("{} (forces recreate)", list.join(", "))
        };
        cause.push_str(&pull_cost(observed, spec));
        cause.push_str(&recreate_cost(spec, keep));
        return Some(Op {
            changes,
            target,
            action: Action::Sandbox(SandboxAction::Recreate {
                old_id: keep.id.clone(),
                spec: Box::new(spec.clone()),
            }),
            cause,
        });
    }
    let (action, cause) = match keep.state {
        ContainerState::Running => {
            let limit = i64::try_from(idle_stop?).unwrap_or(i64::MAX);
            match observed.idleness(keep) {
                hermes_model::observed::Idleness::IdleSince(t) if now - t > limit => (
                    Action::Sandbox(SandboxAction::Stop {
                        id: keep.id.clone(),
                    }),
                    idle_stop_cause(now - t, limit, "terminal.lifetime_seconds"),
                ),
                _ => return None,
            }
        }
        ContainerState::Exited if idle_stop.is_some() => return None,
        ContainerState::Restarting | ContainerState::Removing => {
            return None;
        }
        ContainerState::Paused => (
            Action::Keep {
                id: keep.id.clone(),
                verb: "paused",
            },
            "paused by hand; left alone".to_string(),
        ),
        ContainerState::Created if now - keep.created > STUCK_SECONDS => (
            Action::Sandbox(SandboxAction::Recreate {
                old_id: keep.id.clone(),
                spec: Box::new(spec.clone()),
            }),
            stuck_cause(keep, now),
        ),
        ContainerState::Created => (
            Action::Sandbox(SandboxAction::Start {
                id: keep.id.clone(),
            }),
            format!("created {} ago, never started", age(now - keep.created)),
        ),
        ContainerState::Exited => (
            Action::Sandbox(SandboxAction::Start {
                id: keep.id.clone(),
            }),
            {
                let exited = match keep.finished_at {
                    Some(t) => format!("exited {} ago", age(now - t)),
                    None => "exited".to_string(),
                };
                // gVisor keeps the changes to its root in the sandbox's
                // memory (runsc's default overlay): they ended with it.
                if hermes_model::sandbox::runs_on_host_kernel(keep.runtime().as_deref()) {
                    exited
                } else {
                    format!(
                        "{exited}; under {} its files outside /workspace and /root ended with it",
                        keep.runtime().unwrap_or_default()
                    )
                }
            },
        ),
        ContainerState::Dead => (
            Action::Sandbox(SandboxAction::Recreate {
                old_id: keep.id.clone(),
                spec: Box::new(spec.clone()),
            }),
            "dead: the engine cannot start it; /workspace and /root are kept".to_string(),
        ),
    };
    Some(Op {
        changes: Vec::new(),
        target,
        action,
        cause,
    })
}

/// The settings that differ between the container's settings label and
/// the wanted spec. Empty when the container has no readable label (made
/// before it existed): the cause then falls back to the two hashes, never
/// to a guessed diff.
fn changed_settings(spec: &SandboxSpec, keep: &ObservedContainer) -> Vec<Change> {
    keep.label(LABEL_SETTINGS)
        .and_then(settings::parse_label)
        .map(|old| settings::diff(&old, &spec.settings()))
        .unwrap_or_default()
}

/// Why a sandbox is made, and what it costs the host beyond the
/// container: where hermes makes disk images, a persistent sandbox's data
/// goes on a sparse image of `terminal.container_disk` beside its data
/// directory, loop-mounted while a container of it exists (one whose
/// data directory already holds files keeps it instead).
fn create_cause(desired: &Desired, observed: &Observed, spec: &SandboxSpec) -> String {
    let cause = format!(
        "no container with these labels{}",
        pull_cost(observed, spec)
    );
    let image = (desired.host.disk_images && spec.disk_mb > 0 && spec.key.session.is_none())
        .then(|| spec.data_dir())
        .flatten()
        .and_then(|data| data.file_name().map(|n| n.to_string_lossy().into_owned()));
    match image {
        Some(task) => format!(
            "{cause}; its data on a sparse {} ext4 image (.{task}.disk), loop-mounted while it exists",
            size_of_mb(spec.disk_mb)
        ),
        None => cause,
    }
}

/// The cause of an idle sandbox's stop (`terminal.idle_action: stop`).
pub(crate) fn idle_stop_cause(idle: i64, limit: i64, key: &str) -> String {
    format!(
        "idle {} (> {}, {key}); stopped, as terminal.idle_action says: its files stay, the next command starts it",
        age(idle),
        age(limit)
    )
}

/// `; pulls image X first (not on this engine)` when the engine lacks
/// the spec's image.
pub(crate) fn pull_cost(observed: &Observed, spec: &SandboxSpec) -> String {
    if observed.missing_images.contains(&spec.image) {
        format!("; pulls image {} first (not on this engine)", spec.image)
    } else {
        String::new()
    }
}

/// `51200` (MB) → `50 GiB`; `1500` → `1500 MB`.
fn size_of_mb(mb: u64) -> String {
    if mb >= 1024 && mb % 1024 == 0 {
        format!("{} GiB", mb / 1024)
    } else {
        format!("{mb} MB")
    }
}

/// What a recreate costs, for the cause: the processes it stops, and the
/// files it loses (all but the data mounts and the configured volumes; a
/// session sandbox keeps nothing).
pub(crate) fn recreate_cost(spec: &SandboxSpec, c: &ObservedContainer) -> String {
    let stops = match (c.state, c.processes) {
        (ContainerState::Running, Some(0)) => "no command running".to_string(),
        (ContainerState::Running, Some(1)) => "stops 1 running process".to_string(),
        (ContainerState::Running, Some(n)) => format!("stops {n} running processes"),
        (ContainerState::Running, None) => "stops what runs in it".to_string(),
        _ => "not running".to_string(),
    };
    let mut kept: Vec<&str> = Vec::new();
    if spec.key.session.is_none() {
        kept.extend(["/workspace", "/root"]);
    }
    let runner = spec.runner_bind();
    for b in &spec.binds {
        let wiring = hermes_model::egress::WIRING_MOUNTS.contains(&b.container.as_str());
        if runner.as_ref() != Some(b) && !wiring && !kept.contains(&b.container.as_str()) {
            kept.push(&b.container);
        }
    }
    let lost = match kept.as_slice() {
        [] => "every file in it is lost".to_string(),
        [one] => format!("files outside {one} are lost"),
        [init @ .., last] => format!("files outside {} and {last} are lost", init.join(", ")),
    };
    format!("; {stops}; {lost}")
}

#[cfg(test)]
mod tests;
