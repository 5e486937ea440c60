//! A persistent sandbox on a host that Hermes Agent shares: the
//! containers the agent made for the same task (its labels, no spec
//! hash) and the task's data still in hermes's earlier layout.
//!
//! - With a container of hermes's own for the task, each of the agent's
//!   is a duplicate: removed once nothing runs in it (both bind the same
//!   data directories, so its files in `/workspace` and `/root` are the
//!   task's either way), reported as busy while something does.
//! - Without one, the agent's container (the running one started last)
//!   is adopted: as it is when its settings are the config's
//!   ([`hermes_model::adoption`]), else by a recreate that keeps its bind
//!   mounts, the task's data. One whose `/workspace` is bound from
//!   somewhere else is not hermes's to replace: the sandbox is blocked,
//!   never given an empty directory.
//! - Data in the earlier layout is moved by the sandbox's migrate
//!   operation; data in both layouts blocks the sandbox (never merged).

use hermes_model::action::{Action, SandboxAction};
use hermes_model::adoption::differences;
use hermes_model::migration::LegacyData;
use hermes_model::observed::{ContainerState, ObservedContainer};
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::SandboxSpec;

/// What becomes of the agent's containers `made` of the sandbox of
/// `spec`, when hermes has `keeper` for it (or none). The returned op for
/// the adopted container, when there is one, is last.
pub(crate) fn plan_agent_made(
    spec: &SandboxSpec,
    target: &Target,
    made: &[&ObservedContainer],
    keeper: Option<&ObservedContainer>,
    recreate_cost: impl Fn(&ObservedContainer) -> String,
) -> Vec<Op<Action>> {
    let mut ops = Vec::new();
    let adopted = match keeper {
        Some(_) => None,
        None => made.iter().copied().max_by_key(|c| {
            (
                c.state == ContainerState::Running,
                c.started_at.unwrap_or(i64::MIN),
                c.created,
                c.id.clone(),
            )
        }),
    };
    for c in made {
        if adopted.is_some_and(|a| a.id == c.id) {
            continue;
        }
        let kept = keeper.or(adopted).map_or("", |k| k.name.as_str());
        ops.push(duplicate_op(c, target, kept));
    }
    if let Some(c) = adopted {
        ops.push(adopt_op(spec, target, c, recreate_cost(c)));
    }
    ops
}

/// A duplicate the agent made: removed unless a command runs in it.
fn duplicate_op(c: &ObservedContainer, target: &Target, kept: &str) -> Op<Action> {
    let busy = c.state == ContainerState::Running && c.processes != Some(0);
    if busy {
        return Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Keep {
                id: c.id.clone(),
                verb: "busy",
            },
            cause: format!(
                "duplicate {} made by Hermes Agent runs a command; removed once it is idle ({kept} is kept)",
                c.name
            ),
        };
    }
    Op {
        changes: Vec::new(),
        target: target.clone(),
        action: Action::Sandbox(SandboxAction::Remove {
            id: c.id.clone(),
            name: c.name.clone(),
            disk: None,
        }),
        cause: format!(
            "duplicate {} ({}) made by Hermes Agent; {kept} is kept, on the same data",
            c.name,
            c.state.as_str()
        ),
    }
}

/// The agent's container for the task, adopted.
fn adopt_op(
    spec: &SandboxSpec,
    target: &Target,
    c: &ObservedContainer,
    cost: String,
) -> Op<Action> {
    let data = spec.data_dir();
    let workspace = data
        .as_ref()
        .map(|d| d.join("workspace").display().to_string());
    let bound_from = c.made_by_agent.as_ref().and_then(|m| {
        m.binds.iter().find_map(|b| {
            let mut parts = b.split(':');
            let (host, container) = (parts.next()?, parts.next()?);
            (container == "/workspace").then(|| host.to_string())
        })
    });
    if let (Some(from), Some(ours)) = (&bound_from, &workspace)
        && from != ours
    {
        return Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Blocked,
            cause: format!(
                "container {} made by Hermes Agent binds /workspace from {from}, not from {ours}: \
                 give both programs the same sandbox directory (terminal.sandbox_dir or \
                 TERMINAL_SANDBOX_DIR)",
                c.name
            ),
        };
    }
    match differences(spec, c) {
        Some(changes) if changes.is_empty() => Op {
            changes,
            target: target.clone(),
            action: Action::Sandbox(SandboxAction::Adopt {
                id: c.id.clone(),
                spec: Box::new(spec.clone()),
            }),
            cause: format!(
                "container {} made by Hermes Agent has the config's settings: managed as it is",
                c.name
            ),
        },
        known => {
            let what = match &known {
                Some(changes) => changes
                    .iter()
                    .map(|c| c.describe())
                    .collect::<Vec<_>>()
                    .join(", "),
                None if c.state == ContainerState::Created => {
                    "created, never started: its settings are not known".to_string()
                }
                None => "its settings could not be read".to_string(),
            };
            Op {
                changes: known.unwrap_or_default(),
                target: target.clone(),
                action: Action::Sandbox(SandboxAction::Recreate {
                    old_id: c.id.clone(),
                    spec: Box::new(spec.clone()),
                }),
                cause: format!(
                    "container {} made by Hermes Agent: {what} (forces recreate; its binds of \
                     /workspace and /root are the task's data and are kept){cost}",
                    c.name
                ),
            }
        }
    }
}

/// The sandbox's data found in the earlier layout: the migrate operation
/// that replaces (or creates) it, or a refusal when the shared layout
/// holds files too.
pub(crate) fn plan_legacy(
    spec: &SandboxSpec,
    target: &Target,
    legacy: &LegacyData,
    old: Option<&ObservedContainer>,
    cost: &str,
) -> Op<Action> {
    let (from, to) = (&legacy.data.from, &legacy.data.to);
    if legacy.new_has_files {
        return Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Blocked,
            cause: format!(
                "the task's files are in {} (hermes's earlier layout) and in {} (the one Hermes \
                 Agent shares): move or remove one of them by hand",
                from.display(),
                to.display()
            ),
        };
    }
    if legacy.has_image && legacy.data.emptied.is_some() {
        return Op {
            changes: Vec::new(),
            target: target.clone(),
            action: Action::Blocked,
            cause: format!(
                "the task's files are on a disk image ({}) mounted where the two layouts nest; \
                 stop the sandbox, move {} to {} and its files out of it by hand",
                legacy.data.image.0.display(),
                legacy.data.image.0.display(),
                legacy.data.image.1.display()
            ),
        };
    }
    Op {
        changes: Vec::new(),
        target: target.clone(),
        action: Action::Sandbox(SandboxAction::Migrate {
            old_id: old.map(|c| c.id.clone()),
            spec: Box::new(spec.clone()),
            data: Box::new(legacy.data.clone()),
        }),
        cause: format!(
            "its files move (renamed, never copied) from {} to {}, the layout Hermes Agent \
             shares{cost}",
            from.display(),
            to.display()
        ),
    }
}
