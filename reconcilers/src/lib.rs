//! The pure planners: given what the config wants ([`Desired`]), what
//! exists ([`Observed`]) and the time, decide what one pass does. No IO, no
//! async runtime, no clock of their own: the same inputs always give the
//! same [`HostPlan`], which is what makes `--dry-run` trustworthy and the
//! rules testable in milliseconds.
//!
//! - [`persistence`]: the warm Docker sandboxes (one persistent sandbox of
//!   the default task per profile).
//! - [`reaping`]: everything else of the active profile — sandboxes made on
//!   demand, sessions, orphans, stuck creations, what is no longer desired.
//! - [`proxy`]: the egress proxy daemon, and the fail-closed rule that
//!   blocks Docker sandboxes while it is not ready.
//! - [`ssh`]: the SSH backend's host: reachable over a trusted key, with the
//!   workspace made.
//! - [`singularity`]: the warm Apptainer instance (started, restarted on a
//!   changed spec, its overlay kept).
//! - [`cloud`]: the sandbox on a cloud service (modal, daytona,
//!   vercel_sandbox): created from the task's snapshot, resumed, recreated
//!   when dead, blocked without credentials.
//! - [`disks`]: the sandboxes' disk images, released once no container
//!   uses them.
//!
//! [`plan_stages`] is the plan a pass prints and carries out: the plan of
//! now, then, while a stage changes the egress proxy, the stages that
//! follow once it has ([`proxy::predict`]), so that the dry run shows
//! every operation a pass will carry out.
//!
//! A plan made in doubt (the config is invalid, unreadable or empty, and
//! the last good one stands in) removes nothing: each removal becomes a
//! report that says why it is held back.

mod adoption;
pub mod cloud;
pub mod disks;
pub mod down;
pub mod kubernetes;
pub mod persistence;
pub mod pool;
pub mod proxy;
pub mod reaping;
pub mod singularity;
pub mod ssh;

#[cfg(test)]
mod golden_tests;

use std::time::SystemTime;

use hermes_model::action::{Action, SandboxAction};
#[cfg(test)]
use hermes_model::config::Backend;
use hermes_model::desired::Desired;
use hermes_model::observed::{ContainerState, Observed, ObservedContainer};
use hermes_model::plan::{Describe, Kind, Op, Plan, Stage, Staged};
use hermes_model::sandbox::sanitize;

/// The plan of a whole host.
pub type HostPlan = Plan<Action>;

/// The plan of a whole host in stages.
pub type StagedPlan = Staged<Action>;

/// A backend's own part of a pass's plan, made by its pure planner.
#[derive(Debug, Default)]
pub struct BackendOps {
    /// The backend's own operations (the SSH host's, the cloud
    /// sandbox's), planned before the proxy's.
    pub own: Vec<Op<Action>>,
    /// Sandboxes that run on this host as Docker's do (singularity
    /// instances): they wait on the egress proxy the same way.
    pub sandboxes: Vec<Op<Action>>,
}

/// A backend's pure planner ([`BackendOps`]) of what a pass observed at
/// `now` (Unix seconds); the controller picks it with the backend.
pub type Planner = fn(&Desired, &Observed, i64) -> BackendOps;

/// The planner of a backend with nothing of its own to converge (local,
/// and docker, whose sandboxes are the host's part of every plan).
pub fn host_only(_desired: &Desired, _observed: &Observed, _now: i64) -> BackendOps {
    BackendOps::default()
}

/// [`plan_all_with`] of the configured backend's planner: the tests'
/// shorthand (the controller passes its backend's planner).
#[cfg(test)]
pub(crate) fn plan_all(desired: &Desired, observed: &Observed, now: SystemTime) -> HostPlan {
    plan_all_with(desired, observed, now, planner_of(desired))
}

/// [`plan_stages_with`] of the configured backend's planner, for tests.
#[cfg(test)]
pub(crate) fn plan_stages(desired: &Desired, observed: &Observed, now: SystemTime) -> StagedPlan {
    plan_stages_with(desired, observed, now, planner_of(desired))
}

/// The planner of the configured backend, for tests.
#[cfg(test)]
fn planner_of(desired: &Desired) -> Planner {
    match desired.backend() {
        Backend::Local | Backend::Docker => host_only,
        Backend::Ssh => ssh::planner,
        Backend::Singularity => singularity::planner,
        Backend::Kubernetes => kubernetes::planner,
        Backend::Modal | Backend::Daytona | Backend::VercelSandbox => cloud::planner,
    }
}

/// The most stages a pass plans: the proxy set up, then started, then the
/// sandboxes that waited on it, then a proxy-only network they left.
pub const MAX_STAGES: usize = 4;

/// Plans one pass in stages: [`plan_all_with`] of now, then, while the last
/// stage changes the egress proxy, the plan against what it leaves behind
/// ([`proxy::predict`], and its sandboxes' operations done), without what an earlier stage already does or
/// refuses; a stage that would change nothing ends the list. A pass
/// carries out the first stage, then each later one once the host,
/// observed again, plans the same work ([`Plan::work`]).
pub fn plan_stages_with(
    desired: &Desired,
    observed: &Observed,
    now: SystemTime,
    planner: Planner,
) -> StagedPlan {
    let first = plan_all_with(desired, observed, now, planner);
    let mut staged = Staged::single(first);
    let (mut desired, mut observed) = (desired.clone(), observed.clone());
    let mut seen: Vec<(String, &'static str)> = rows(&staged.first);
    while staged.later.len() + 1 < MAX_STAGES {
        let last = staged.later.last().map_or(&staged.first, |s| &s.plan);
        if !proxy::has_proxy_work(&last.ops) {
            break;
        }
        let Some(after) = proxy::predict(&mut desired, &mut observed, &last.ops) else {
            break;
        };
        after_sandboxes(&mut observed, &last.ops, unix_seconds(now));
        let next = plan_all_with(&desired, &observed, now, planner);
        let ops: Vec<_> = next
            .ops
            .into_iter()
            .filter(|op| op.action.kind() != Kind::Report || is_network_wait(op))
            .filter(|op| !seen.contains(&(op.target.to_string(), op.action.verb())))
            .collect();
        let plan = Plan::new(ops);
        if !plan.is_pending() {
            break;
        }
        seen.extend(rows(&plan));
        staged.later.push(Stage { after, plan });
    }
    staged
}

/// Makes `observed` what a stage's operations on Docker sandboxes leave
/// behind, for the plan of the stage after it: a create or a recreate
/// leaves a running container of its spec (on its disk image, when one is
/// mounted), a start a running container, a removal none (and its image
/// released with it, when it releases one), a release no image.
fn after_sandboxes(observed: &mut Observed, ops: &[hermes_model::plan::Op<Action>], now: i64) {
    let made = |spec: &hermes_model::sandbox::SandboxSpec| ObservedContainer {
        id: format!("{}-to-be-made", spec.name),
        name: spec.name.clone(),
        labels: spec.labels.clone(),
        state: ContainerState::Running,
        created: now,
        started_at: Some(now),
        finished_at: None,
        processes: Some(0),
        made_by_agent: None,
        adopted_hash: None,
    };
    for op in ops {
        let Action::Sandbox(action) = &op.action else {
            continue;
        };
        match action {
            SandboxAction::Create(spec) => {
                let c = made(spec);
                uses_its_disk(observed, spec, &c.id);
                observed.containers.push(c);
            }
            // Made and answering, as its apply leaves it.
            SandboxAction::Warm(spec) => {
                let c = made(spec);
                observed.pool_ready.insert(
                    c.name.clone(),
                    hermes_model::observed::PoolReady {
                        id: c.id.clone(),
                        started_at: now,
                    },
                );
                observed.containers.push(c);
            }
            SandboxAction::Stop { id } => {
                for c in observed.containers.iter_mut().filter(|c| &c.id == id) {
                    c.state = ContainerState::Exited;
                    c.finished_at = Some(now);
                }
            }
            SandboxAction::Recreate { old_id, spec } => {
                observed.containers.retain(|c| &c.id != old_id);
                for disk in &mut observed.disks {
                    disk.users.retain(|u| u != old_id);
                }
                let c = made(spec);
                uses_its_disk(observed, spec, &c.id);
                observed.containers.push(c);
            }
            SandboxAction::Migrate { old_id, spec, .. } => {
                if let Some(old_id) = old_id {
                    observed.containers.retain(|c| &c.id != old_id);
                }
                observed.legacy.retain(|l| l.data.task != spec.key.task);
                let c = made(spec);
                uses_its_disk(observed, spec, &c.id);
                observed.containers.push(c);
            }
            SandboxAction::Adopt { id, spec } => {
                for c in observed.containers.iter_mut().filter(|c| &c.id == id) {
                    c.adopted_hash = Some(spec.hash().to_string());
                }
            }
            SandboxAction::Start { id } => {
                for c in observed.containers.iter_mut().filter(|c| &c.id == id) {
                    c.state = ContainerState::Running;
                    c.started_at = Some(now);
                }
            }
            SandboxAction::Remove { id, disk, .. } => {
                observed.containers.retain(|c| &c.id != id);
                for d in &mut observed.disks {
                    d.users.retain(|u| u != id);
                }
                if let Some(disk) = disk {
                    observed.disks.retain(|d| d.mount_point != disk.mount_point);
                }
            }
            SandboxAction::ReleaseDisk(disk) => {
                observed.disks.retain(|d| d.mount_point != disk.mount_point);
            }
        }
    }
}

/// The container `id`, made of `spec`, uses the disk image mounted for its
/// sandbox, if one is.
fn uses_its_disk(observed: &mut Observed, spec: &hermes_model::sandbox::SandboxSpec, id: &str) {
    if spec.key.session.is_some() {
        return;
    }
    let (profile, task) = (sanitize(&spec.key.profile), sanitize(&spec.key.task));
    for disk in &mut observed.disks {
        if disk.profile == profile && disk.task == task {
            disk.users.push(id.to_string());
        }
    }
}

/// A network kept while containers are attached: a report that makes a
/// stage follow.
fn is_network_wait(op: &hermes_model::plan::Op<Action>) -> bool {
    matches!(op.action, Action::Keep { verb, .. } if verb == proxy::NETWORK_IN_USE)
}

/// (target, verb) of a plan's operations that are not reports.
fn rows(plan: &HostPlan) -> Vec<(String, &'static str)> {
    plan.ops
        .iter()
        .filter(|op| op.action.kind() != Kind::Report)
        .map(|op| (op.target.to_string(), op.action.verb()))
        .collect()
}

/// Plans one pass over every part of the host: the backend's own part by
/// its `planner`, then the proxy and the Docker sandboxes.
pub fn plan_all_with(
    desired: &Desired,
    observed: &Observed,
    now: SystemTime,
    planner: Planner,
) -> HostPlan {
    let now = unix_seconds(now);
    let BackendOps {
        own: mut ops,
        sandboxes: instance_ops,
    } = planner(desired, observed, now);
    // Containers are planned whatever the backend: switching away from
    // docker leaves them to be reported, never silently forgotten.
    ops.extend(proxy::plan(desired, observed));
    let warm = persistence::plan(desired, observed, now);
    let pool = pool::plan(desired, observed, now);
    let mut sandbox_ops = warm.ops;
    sandbox_ops.extend(pool.ops);
    let mut claimed = warm.claimed;
    claimed.extend(pool.claimed);
    sandbox_ops.extend(reaping::plan(desired, observed, now, &claimed));
    disks::plan(observed, &mut sandbox_ops);
    sandbox_ops.extend(instance_ops);
    if let Some(reason) = &desired.docker_blocked {
        block_refused(&mut sandbox_ops, desired, reason);
    }
    if let Some(runtimes) = &observed.runtimes {
        block_missing_runtime(&mut sandbox_ops, runtimes);
    }
    if let Some(reason) = proxy::fail_closed_reason(desired, &observed.proxy) {
        proxy::block_sandboxes(&mut sandbox_ops, &reason);
    }
    ops.extend(sandbox_ops);
    if let Some(doubt) = &desired.doubt {
        for op in &mut ops {
            let (id, verb) = match &op.action {
                Action::Sandbox(SandboxAction::Remove { id, .. }) => (id.clone(), "remove"),
                Action::Sandbox(SandboxAction::ReleaseDisk(disk)) => {
                    (disk.mount_point.display().to_string(), "release-disk")
                }
                _ => continue,
            };
            op.action = Action::Keep { id, verb: "kept" };
            op.cause = format!("would {verb} ({}), but {doubt}", op.cause);
        }
    }
    Plan::new(ops)
}

/// Blocks the Docker sandboxes of a config whose `docker_extra_args`
/// hermes will not honour ([`Desired::docker_blocked`]): every operation
/// that would make, start or adopt one is refused with `reason`, and a warm
/// sandbox that has none (it runs as it was made) gets a refusal too, so
/// the plan and `hermes status` say it is not as the config says. Its
/// container is left as it is; removals and everything else go on.
fn block_refused(ops: &mut Vec<hermes_model::plan::Op<Action>>, desired: &Desired, reason: &str) {
    for op in ops.iter_mut() {
        // Whatever makes, starts or takes on a sandbox of the spec; a
        // removal or a disk's release goes on.
        if let Action::Sandbox(
            SandboxAction::Create(_)
            | SandboxAction::Warm(_)
            | SandboxAction::Start { .. }
            | SandboxAction::Recreate { .. }
            | SandboxAction::Migrate { .. }
            | SandboxAction::Adopt { .. },
        ) = &op.action
        {
            op.cause = format!("{reason}; wanted: {} ({})", op.action.verb(), op.cause);
            op.action = Action::Blocked;
        }
    }
    for spec in &desired.sandboxes {
        let target = hermes_model::plan::Target::Sandbox {
            profile: spec.key.profile.clone(),
            task: spec.key.task.clone(),
            session: spec.key.session.clone(),
        };
        if !ops
            .iter()
            .any(|op| op.target == target && op.action == Action::Blocked)
        {
            ops.push(hermes_model::plan::Op {
                target,
                action: Action::Blocked,
                cause: format!("{reason}; the sandbox is left as it was made"),
                changes: Vec::new(),
            });
        }
    }
}

/// Refuses every make of a Docker sandbox whose runtime
/// (`terminal.docker_runtime`) the engine does not list, with the
/// runtimes it has and how to register one.
pub fn block_missing_runtime(
    ops: &mut [hermes_model::plan::Op<Action>],
    runtimes: &std::collections::BTreeSet<String>,
) {
    for op in ops.iter_mut() {
        let Some(spec) = (match &op.action {
            Action::Sandbox(a) => a.made(),
            _ => None,
        }) else {
            continue;
        };
        let Some(runtime) = spec.runtime.as_ref().filter(|r| !runtimes.contains(*r)) else {
            continue;
        };
        let has: Vec<&str> = runtimes.iter().map(String::as_str).collect();
        op.cause = format!(
            "the Docker engine has no runtime {runtime} (it has: {}); register it in /etc/docker/daemon.json (\"runtimes\": {{\"{runtime}\": {{\"path\": \"/usr/bin/{runtime}\"}}}}) and reload dockerd (SIGHUP), or set terminal.docker_runtime to one it has; wanted: {} ({})",
            has.join(", "),
            op.action.verb(),
            op.cause
        );
        op.action = Action::Blocked;
    }
}

/// The running containers (by id) whose process count a plan reads: those
/// of the active profile, except each warm sandbox that is exactly as
/// desired (its name and spec hash), which is neither recreated (the count
/// phrases what a recreate stops) nor reaped (the count says whether it is
/// idle). Reading a count costs a `top`, the engine's slowest read, so a
/// pass asks for these only.
pub fn processes_needed(desired: &Desired, observed: &Observed) -> Vec<String> {
    let profile = sanitize(&desired.profile);
    observed
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running && c.profile() == Some(profile.as_str()))
        // A pool member's count decides nothing.
        .filter(|c| !c.is_unclaimed_pool_member())
        // A warm sandbox exactly as desired: only when it may be stopped
        // for idleness (`terminal.idle_action: stop`).
        .filter(|c| {
            desired.idle_stop_after().is_some()
                || !desired
                    .sandboxes
                    .iter()
                    .any(|spec| spec.name == c.name && c.spec_hash() == Some(spec.hash()))
        })
        .map(|c| c.id.clone())
        .collect()
}

/// `target: cause` of every refused operation of a plan.
pub fn blocked(plan: &HostPlan) -> Vec<String> {
    plan.ops
        .iter()
        .filter(|op| op.action.kind() == hermes_model::plan::Kind::Blocked)
        .map(|op| format!("{}: {}", op.target, op.cause))
        .collect()
}

pub use hermes_model::unix_seconds;

/// `45s`, `14m`, `1m1s`, `3h20m`, `2d`: a short age for causes, in two
/// units at most, so that a value just past a limit never reads as equal
/// to it.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    let two = |big: i64, big_unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit}{small}{small_unit}")
        }
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => two(s / 60, "m", s % 60, "s"),
        3600..86400 => two(s / 3600, "h", s % 3600 / 60, "m"),
        _ => two(s / 86400, "d", s % 86400 / 3600, "h"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use super::*;
    use hermes_model::config::load;
    use hermes_model::desired::HostEnv;

    #[test]
    fn the_local_backend_has_nothing_to_converge() {
        let desired = Desired::build(
            load("").unwrap().config,
            "default",
            Path::new("/h"),
            &HostEnv::default(),
        )
        .unwrap();
        let plan = plan_all(&desired, &Observed::default(), SystemTime::UNIX_EPOCH);
        assert!(!plan.is_pending());
        assert_eq!(plan.to_string(), "No changes. The host is converged.");
    }

    #[test]
    fn process_counts_are_read_only_where_the_plan_reads_them() {
        use std::collections::BTreeMap;

        use hermes_model::observed::ObservedContainer;
        use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_SPEC_HASH, LABEL_TASK};

        let desired = Desired::build(
            load("terminal:\n  backend: docker\n").unwrap().config,
            "default",
            Path::new("/h"),
            &HostEnv::default(),
        )
        .unwrap();
        let warm = &desired.sandboxes[0];
        let c = |id: &str, name: &str, profile: &str, hash: &str, state| {
            let task = name.rsplit('-').next().unwrap();
            let labels: BTreeMap<String, String> = [
                (LABEL_AGENT, "1"),
                (LABEL_PROFILE, profile),
                (LABEL_TASK, task),
                (LABEL_SPEC_HASH, hash),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            ObservedContainer {
                id: id.to_string(),
                name: name.to_string(),
                labels,
                state,
                created: 0,
                started_at: None,
                finished_at: None,
                processes: None,
                made_by_agent: None,
                adopted_hash: None,
            }
        };
        let observed = Observed {
            containers: vec![
                // The warm sandbox as desired: neither recreated nor reaped.
                c(
                    "current",
                    &warm.name,
                    "default",
                    warm.hash(),
                    ContainerState::Running,
                ),
                // Drifted: a recreate says what it stops.
                c(
                    "drifted",
                    &warm.name,
                    "default",
                    "0123456789ab",
                    ContainerState::Running,
                ),
                // Another task's, made on demand: may be reaped when idle.
                c(
                    "other-task",
                    "hermes-default-t1",
                    "default",
                    warm.hash(),
                    ContainerState::Running,
                ),
                // Not running, or another profile's: never read.
                c(
                    "created",
                    "hermes-default-t2",
                    "default",
                    warm.hash(),
                    ContainerState::Created,
                ),
                c(
                    "other-profile",
                    "hermes-p-default",
                    "p",
                    warm.hash(),
                    ContainerState::Running,
                ),
            ],
            ..Observed::default()
        };
        assert_eq!(
            processes_needed(&desired, &observed),
            ["drifted", "other-task"]
        );
    }

    #[test]
    fn a_warm_sandbox_whose_extra_args_hermes_cannot_honour_is_blocked_and_left_as_it_was_made() {
        let build = |text: &str| {
            Desired::build(
                load(text).unwrap().config,
                "default",
                Path::new("/h"),
                &HostEnv::default(),
            )
            .unwrap()
        };
        let docker = "terminal:\n  backend: docker\n  docker_extra_args: ";
        let good = build(&format!("{docker}[--shm-size=2g]\n"));
        let mut observed = Observed::default();
        let made = plan_all(&good, &observed, SystemTime::UNIX_EPOCH);
        after_sandboxes(&mut observed, &made.ops, 0);
        assert!(!plan_all(&good, &observed, SystemTime::UNIX_EPOCH).is_pending());
        // The same, with a flag hermes will not map: nothing to do to the
        // container, and still not as the config says.
        let refused = build(&format!("{docker}[--shm-size=2g, --privileged]\n"));
        let plan = plan_all(&refused, &observed, SystemTime::UNIX_EPOCH);
        let rows: Vec<(String, &str, &str)> = plan
            .ops
            .iter()
            .map(|op| (op.target.to_string(), op.action.verb(), op.cause.as_str()))
            .collect();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(
            (rows[0].0.as_str(), rows[0].1),
            ("sandbox default/default", "blocked")
        );
        assert!(
            rows[0]
                .2
                .starts_with("terminal.docker_extra_args[1]: `--privileged`")
                && rows[0].2.ends_with("; the sandbox is left as it was made"),
            "{rows:?}"
        );
        // Changed besides: the recreate is what is blocked.
        let drifted = build(&format!("{docker}[--shm-size=4g, --privileged]\n"));
        let plan = plan_all(&drifted, &observed, SystemTime::UNIX_EPOCH);
        assert_eq!(plan.ops.len(), 1);
        assert_eq!(plan.ops[0].action, Action::Blocked);
        assert!(
            plan.ops[0].cause.contains("; wanted: recreate ("),
            "{}",
            plan.ops[0].cause
        );
        assert_eq!(blocked(&plan).len(), 1);
    }

    #[test]
    fn a_migrate_or_an_adopt_of_a_sandbox_hermes_cannot_honour_is_blocked_too() {
        use hermes_model::plan::{Op, Target};

        let desired = Desired::build(
            load("terminal:\n  backend: docker\n  docker_extra_args: [--privileged]\n")
                .unwrap()
                .config,
            "p",
            Path::new("/h"),
            &HostEnv::default(),
        )
        .unwrap();
        let spec = Box::new(desired.sandboxes[0].clone());
        let target = Target::Sandbox {
            profile: "p".into(),
            task: "default".into(),
            session: None,
        };
        let data = hermes_model::migration::DataMove::of(
            Path::new("/h"),
            Path::new("/h/sandboxes"),
            "p",
            "default",
        )
        .unwrap();
        let op = |action: SandboxAction| Op {
            target: target.clone(),
            action: Action::Sandbox(action),
            cause: "was".to_string(),
            changes: Vec::new(),
        };
        let mut ops = vec![
            op(SandboxAction::Migrate {
                old_id: None,
                spec: spec.clone(),
                data: Box::new(data),
            }),
            op(SandboxAction::Adopt {
                id: "c1".to_string(),
                spec,
            }),
        ];
        block_refused(&mut ops, &desired, "why");
        let rows: Vec<(&Action, &str)> =
            ops.iter().map(|o| (&o.action, o.cause.as_str())).collect();
        assert_eq!(
            rows,
            [
                (&Action::Blocked, "why; wanted: migrate (was)"),
                (&Action::Blocked, "why; wanted: adopt (was)")
            ]
        );
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(age(59), "59s");
        assert_eq!(age(60 * 14), "14m");
        assert_eq!(age(61), "1m1s");
        assert_eq!(age(3600 * 5 + 1), "5h");
        assert_eq!(age(3600 * 5 + 60 * 20), "5h20m");
        assert_eq!(age(86400 * 2), "2d");
        assert_eq!(age(86400 * 2 + 3600 * 3 + 5), "2d3h");
        assert_eq!(age(-5), "0s");
    }
}
