//! The sandboxes' disk images (`terminal.container_disk`): an image stays
//! mounted on its data directory while a container of its sandbox exists,
//! running or stopped (a stopped one starts again on it). Once none does
//! (removed by hand, or with the home), it is released: unmounted and its
//! loop device freed. The image file stays, and with it the sandbox's
//! files; the next create mounts it again. A deleted image file is said in
//! the cause: what it holds goes once it is unmounted.
//!
//! - no container uses the image, and no operation of the plan makes one
//!   for its sandbox → `release-disk`;
//! - every container that uses it is removed by the plan, and none is
//!   made → each of those removals releases it too, once its container is
//!   gone (the last one to finish finds it unused);
//! - a container of its sandbox is made by the plan → kept for it, unless
//!   its file was deleted: released first (removals go first), and the
//!   create makes a new image;
//! - a container that the plan keeps uses it → kept.
//!
//! Images are seen only when the containers are: a pass without an engine
//! releases nothing.

use std::collections::BTreeSet;

use hermes_model::action::{Action, SandboxAction};
use hermes_model::observed::{MountedDisk, Observed};
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::sanitize;

/// Adds the releases of `observed`'s disk images to `ops` (the plan's
/// operations on Docker sandboxes): its own operations, and the disk on
/// each removal that releases one.
pub fn plan(observed: &Observed, ops: &mut Vec<Op<Action>>) {
    let removed: BTreeSet<String> = ops
        .iter()
        .filter_map(|op| match &op.action {
            Action::Sandbox(SandboxAction::Remove { id, .. }) => Some(id.clone()),
            _ => None,
        })
        .collect();
    for disk in &observed.disks {
        if disk.users.iter().any(|id| !removed.contains(id)) {
            continue;
        }
        if makes_one(ops, disk) && !disk.deleted {
            continue;
        }
        let mut attached = false;
        if !makes_one(ops, disk) {
            for op in ops.iter_mut() {
                if let Action::Sandbox(SandboxAction::Remove { id, disk: d, .. }) = &mut op.action
                    && disk.users.contains(id)
                {
                    *d = Some(Box::new(disk.clone()));
                    op.cause = format!("{}; then {}", op.cause, released(disk));
                    attached = true;
                }
            }
        }
        if !attached {
            ops.push(Op {
                changes: Vec::new(),
                target: Target::Sandbox {
                    profile: disk.profile.clone(),
                    task: disk.task.clone(),
                    session: None,
                },
                action: Action::Sandbox(SandboxAction::ReleaseDisk(Box::new(disk.clone()))),
                cause: format!("its container is gone; {}", released(disk)),
            });
        }
    }
}

/// Whether `ops` make a container of `disk`'s sandbox (a create or a
/// recreate of a persistent sandbox of its profile and task).
fn makes_one(ops: &[Op<Action>], disk: &MountedDisk) -> bool {
    ops.iter().any(|op| {
        let Some(spec) = (match &op.action {
            Action::Sandbox(a) => a.made(),
            _ => None,
        }) else {
            return false;
        };
        spec.key.session.is_none()
            && sanitize(&spec.key.profile) == disk.profile
            && sanitize(&spec.key.task) == disk.task
    })
}

/// What a release does, for a cause: `the disk image … is unmounted from
/// … (/dev/loop3), the image kept`.
fn released(disk: &MountedDisk) -> String {
    let devices = disk.devices.join(", ");
    if disk.deleted {
        format!(
            "its disk image {} was deleted and is still mounted on {} ({devices}): unmounted, what it holds is lost with it",
            disk.image.display(),
            disk.mount_point.display()
        )
    } else {
        format!(
            "its disk image {} is unmounted from {} ({devices}); the image and its files are kept",
            disk.image.display(),
            disk.mount_point.display()
        )
    }
}

#[cfg(test)]
mod tests;
