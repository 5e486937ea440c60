//! The warm pool planner (`terminal.warm_pool`): the profile's unclaimed
//! session sandboxes, made ahead of the sessions that claim them.
//!
//! A member is *ready* once it answered a command since its last start
//! (its record, [`Observed::pool_ready`]); only a ready member whose spec
//! is the current one is claimed. For each unclaimed member of the
//! profile:
//!
//! - the pool is 0 → removed (while the backend is not docker, only when
//!   pruning: reported as not desired otherwise);
//! - its spec is not the current pool's → removed: a member is replaced,
//!   never claimed stale;
//! - exited or dead, or left in `created` longer than [`STUCK_SECONDS`]
//!   → removed;
//! - running but not ready [`READY_GRACE_SECONDS`] after its start →
//!   removed (a start that never became ready);
//! - more ready or coming than the pool keeps → the newest removed.
//!
//! Then as many members are made ([`SandboxAction::Warm`]) as the pool
//! lacks, under names no container holds. Claimed members (renamed to a
//! session's name) are session sandboxes, the reaping planner's; the
//! unclaimed ones are this planner's alone (the idle reaper never sees
//! them).

use std::collections::BTreeSet;

use hermes_model::action::{Action, SandboxAction};
use hermes_model::config::Backend;
use hermes_model::desired::{Desired, POOL_TASK};
use hermes_model::observed::{ContainerState, Observed, ObservedContainer};
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{pool_member_name, sanitize};
use hermes_model::settings::{self, LABEL_SETTINGS};

use crate::age;
use crate::persistence::{Planned, STUCK_SECONDS};

/// How long a started member has to answer its first command before it
/// counts as a start that never became ready.
pub const READY_GRACE_SECONDS: i64 = 60;

/// The operations that keep the warm pool of the active profile.
pub fn plan(desired: &Desired, observed: &Observed, now: i64) -> Planned {
    let profile = sanitize(&desired.profile);
    let members: Vec<&ObservedContainer> = observed
        .containers
        .iter()
        .filter(|c| c.profile() == Some(profile.as_str()) && c.is_unclaimed_pool_member())
        .collect();
    let claimed: BTreeSet<String> = members.iter().map(|c| c.id.clone()).collect();
    let target = Target::Pool {
        profile: desired.profile.clone(),
        task: POOL_TASK.to_string(),
    };
    let remove = |c: &ObservedContainer, cause: String| Op {
        changes: Vec::new(),
        target: target.clone(),
        action: Action::Sandbox(SandboxAction::Remove {
            id: c.id.clone(),
            name: c.name.clone(),
            disk: None,
        }),
        cause: format!("{}: {cause}", c.name),
    };
    let size = desired.pool_size();
    let mut ops = Vec::new();
    if size == 0 {
        let docker = desired.config.terminal.backend == Backend::Docker;
        for c in members {
            if docker || desired.config.reconcile.prune {
                let why = if docker {
                    "terminal.warm_pool is 0"
                } else {
                    "the backend is not docker; pruned"
                };
                ops.push(remove(c, why.to_string()));
            } else {
                ops.push(Op {
                    changes: Vec::new(),
                    target: target.clone(),
                    action: Action::Keep {
                        id: c.id.clone(),
                        verb: "kept",
                    },
                    cause: format!(
                        "{}: not desired (the backend is not docker); `hermes reconcile --prune` removes it",
                        c.name
                    ),
                });
            }
        }
        return Planned { ops, claimed };
    }
    let wanted = desired.pool_member(0);
    // (ready, started or made at) of each member kept.
    let mut kept: Vec<(&ObservedContainer, bool, i64)> = Vec::new();
    for c in members {
        if c.spec_hash() != Some(wanted.hash()) {
            ops.push(remove(c, stale_cause(c, &wanted)));
            continue;
        }
        match c.state {
            ContainerState::Running if observed.pool_member_ready(c) => {
                kept.push((c, true, c.started_at.unwrap_or(c.created)));
            }
            ContainerState::Running => {
                let started = c.started_at.unwrap_or(c.created);
                if now - started > READY_GRACE_SECONDS {
                    ops.push(remove(
                        c,
                        format!(
                            "started {} ago and never answered a command (> {}): a start that never became ready",
                            age(now - started),
                            age(READY_GRACE_SECONDS)
                        ),
                    ));
                } else {
                    kept.push((c, false, started));
                }
            }
            ContainerState::Created if now - c.created <= STUCK_SECONDS => {
                kept.push((c, false, c.created));
            }
            ContainerState::Created => ops.push(remove(
                c,
                format!(
                    "stuck in created for {} (> {}): a start that failed",
                    age(now - c.created),
                    age(STUCK_SECONDS)
                ),
            )),
            state => ops.push(remove(
                c,
                format!(
                    "{}: a member that is not running is never claimed",
                    state.as_str()
                ),
            )),
        }
    }
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if kept.len() > size {
        // The ones not ready first, then the newest.
        kept.sort_by_key(|(_, ready, at)| (*ready, std::cmp::Reverse(*at)));
        for (c, _, _) in kept.drain(..kept.len() - size) {
            ops.push(remove(
                c,
                format!("the pool keeps {size} (terminal.warm_pool)"),
            ));
        }
    }
    let ready = kept.iter().filter(|(_, ready, _)| *ready).count();
    let coming = kept.len() - ready;
    let missing = size - kept.len();
    let taken: BTreeSet<&str> = observed
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .chain(observed.pool_names_held.iter().map(String::as_str))
        .collect();
    let mut index = 0u32;
    for _ in 0..missing {
        let (name, at) = loop {
            let name = pool_member_name(&desired.profile, POOL_TASK, index);
            index += 1;
            if !taken.contains(name.as_str()) {
                break (name, index - 1);
            }
        };
        let spec = desired.pool_member(at);
        let cause = if coming > 0 {
            format!(
                "pool of {size}: {ready} ready, {coming} starting, {missing} to make{}",
                crate::persistence::pull_cost(observed, &spec)
            )
        } else {
            format!(
                "pool of {size}: {ready} ready, {missing} to make{}",
                crate::persistence::pull_cost(observed, &spec)
            )
        };
        ops.push(Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Sandbox(SandboxAction::Warm(Box::new(spec))),
            cause: format!("{name}: {cause}"),
        });
    }
    Planned { ops, claimed }
}

/// Why a member's spec is not the pool's, from its settings label.
fn stale_cause(c: &ObservedContainer, wanted: &hermes_model::sandbox::SandboxSpec) -> String {
    let what = c
        .label(LABEL_SETTINGS)
        .and_then(settings::parse_label)
        .map(|old| settings::diff(&old, &wanted.settings()))
        .filter(|changes| !changes.is_empty())
        .map(|changes| {
            changes
                .iter()
                .map(settings::Change::describe)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| {
            format!(
                "spec {} → {}",
                c.spec_hash().unwrap_or("(none)"),
                wanted.hash()
            )
        });
    format!("its spec is stale ({what}): a member is replaced, never claimed")
}

#[cfg(test)]
mod tests;
