//! The singularity planner: the warm instance of the default task, as
//! Docker's persistent sandbox. Planned from `instance list` and the hash
//! recorded beside each instance when it started:
//!
//! - no instance → start (its image built into the cache first when it is
//!   not there);
//! - an instance started with another spec (or by someone else: no
//!   record) → restart; the overlay, and so every file, is kept;
//! - as wanted → nothing.
//!
//! Without `apptainer` or `singularity` on the PATH the instance is
//! blocked with why. The egress proxy's fail-closed rule applies as on
//! Docker (the instance runs on this host): [`crate::plan_all_with`] blocks a
//! start or restart while the enforced proxy is not ready.

use hermes_model::action::{Action, InstanceAction};
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use std::path::PathBuf;

use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{SandboxKey, sanitize};
use hermes_model::singularity::{SingularityObserved, is_remote_source};

/// The backend's planner ([`crate::Planner`]): [`plan`]'s operations.
pub fn planner(desired: &Desired, observed: &Observed, _now: i64) -> crate::BackendOps {
    crate::BackendOps {
        sandboxes: plan(desired, observed),
        ..crate::BackendOps::default()
    }
}

/// The operations on the singularity instances.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let Some(seen) = &observed.singularity else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    for spec in &desired.instances {
        let target = Target::Instance {
            profile: spec.key.profile.clone(),
            task: spec.key.task.clone(),
            session: spec.key.session.clone(),
        };
        let (instances, cached) = match seen {
            SingularityObserved::Unavailable { reason } => {
                ops.push(Op {
                    changes: Vec::new(),
                    target,
                    action: Action::Blocked,
                    cause: reason.clone(),
                });
                continue;
            }
            SingularityObserved::Seen { instances, cached } => (instances, cached),
        };
        match instances.iter().find(|i| i.name == spec.name) {
            None => {
                let build = if is_remote_source(&spec.source) && !cached.contains(&spec.sif) {
                    format!("; image {} is built into the cache first", spec.source)
                } else {
                    String::new()
                };
                ops.push(Op {
                    changes: Vec::new(),
                    target,
                    action: Action::Instance(InstanceAction::Start(Box::new(spec.clone()))),
                    cause: format!("no instance {}{build}", spec.name),
                });
            }
            Some(found) if found.spec_hash.as_deref() == Some(spec.hash.as_str()) => {}
            Some(found) => ops.push(Op {
                changes: Vec::new(),
                target,
                action: Action::Instance(InstanceAction::Restart(Box::new(spec.clone()))),
                cause: format!(
                    "spec changed: {} -> {}; the overlay (its files) is kept",
                    found.spec_hash.as_deref().unwrap_or("unknown"),
                    spec.hash
                ),
            }),
        }
    }
    ops
}

/// The operations of `hermes session end ID` on singularity: the end of
/// every instance of `profile`'s session `session`, whatever its task,
/// from `known`, the instances hermes made under the home with their
/// directories. Other profiles' and sessions' are not looked at.
pub fn end_session(
    profile: &str,
    session: &str,
    known: &[(SandboxKey, PathBuf)],
) -> Vec<Op<Action>> {
    let profile = sanitize(profile);
    let session = sanitize(session);
    known
        .iter()
        .filter(|(key, _)| {
            key.profile == profile && key.session.as_deref() == Some(session.as_str())
        })
        .map(|(key, dir)| Op {
            changes: Vec::new(),
            target: Target::Instance {
                profile: key.profile.clone(),
                task: key.task.clone(),
                session: key.session.clone(),
            },
            action: Action::Instance(InstanceAction::End {
                name: key.container_name(),
                dir: dir.clone(),
            }),
            cause: format!("session {session} ended by hand; its overlay is removed"),
        })
        .collect()
}

/// The operations of `hermes down` on singularity: every running
/// instance of `profile` that hermes made (`known`, as for
/// [`end_session`]), stopped with its overlay kept: a session's data goes
/// only with `hermes session end`. Other profiles' are not looked at.
pub fn down(
    profile: &str,
    observed: &Observed,
    known: &[(SandboxKey, PathBuf)],
) -> Vec<Op<Action>> {
    let Some(SingularityObserved::Seen { instances, .. }) = &observed.singularity else {
        return Vec::new();
    };
    let profile = sanitize(profile);
    known
        .iter()
        .filter(|(key, _)| key.profile == profile)
        .filter(|(key, _)| instances.iter().any(|i| i.name == key.container_name()))
        .map(|(key, _)| Op {
            changes: Vec::new(),
            target: Target::Instance {
                profile: key.profile.clone(),
                task: key.task.clone(),
                session: key.session.clone(),
            },
            action: Action::Instance(InstanceAction::Stop {
                name: key.container_name(),
            }),
            cause: format!(
                "hermes down: instance {} is stopped, its overlay (its files) kept",
                key.container_name()
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;
    use std::time::SystemTime;

    use hermes_model::config::load;
    use hermes_model::desired::{Egress, HostEnv};
    use hermes_model::singularity::ObservedInstance;

    use super::*;
    use crate::plan_all;

    fn desired(config: &str) -> Desired {
        Desired::build(
            load(config).unwrap().config,
            "default",
            Path::new("/h"),
            &HostEnv::default(),
        )
        .unwrap()
    }

    const SING: &str = "terminal:\n  backend: singularity\n  docker_image: python:3.12\n";

    fn plan_text(desired: &Desired, seen: Option<SingularityObserved>) -> String {
        let observed = Observed {
            singularity: seen,
            ..Observed::default()
        };
        plan_all(desired, &observed, SystemTime::UNIX_EPOCH).to_string()
    }

    fn instance(hash: Option<&str>) -> ObservedInstance {
        ObservedInstance {
            name: "hermes-default-default".into(),
            pid: 42,
            image: "/h/cache/singularity/x.sif".into(),
            spec_hash: hash.map(str::to_string),
        }
    }

    #[test]
    fn no_instance_is_started_after_building_its_image() {
        let d = desired(SING);
        let sif = d.instances[0].sif.clone();
        let empty = |cached| {
            Some(SingularityObserved::Seen {
                instances: vec![],
                cached,
            })
        };
        assert_eq!(
            plan_text(&d, empty(vec![])),
            "+ singularity default/default   start       no instance hermes-default-default; image docker://python:3.12 is built into the cache first\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
        assert_eq!(
            plan_text(&d, empty(vec![sif])),
            "+ singularity default/default   start       no instance hermes-default-default\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
    }

    #[test]
    fn an_instance_with_another_spec_is_restarted_keeping_its_overlay() {
        let d = desired(SING);
        let hash = d.instances[0].hash.clone();
        let seen = |h: Option<&str>| {
            Some(SingularityObserved::Seen {
                instances: vec![instance(h)],
                cached: vec![],
            })
        };
        assert_eq!(
            plan_text(&d, seen(Some(&hash))),
            "No changes. The host is converged."
        );
        assert_eq!(
            plan_text(&d, seen(Some("0123456789ab"))),
            format!(
                "~ singularity default/default   restart     spec changed: 0123456789ab -> {hash}; the overlay (its files) is kept\n\
                 Plan: 0 to create, 1 to change, 0 to remove."
            )
        );
        assert!(plan_text(&d, seen(None)).contains("spec changed: unknown -> "));
    }

    #[test]
    fn no_apptainer_blocks_the_instance_with_why() {
        let d = desired(SING);
        assert_eq!(
            plan_text(
                &d,
                Some(SingularityObserved::Unavailable {
                    reason: "neither apptainer nor singularity is on the PATH".into()
                })
            ),
            "! singularity default/default   blocked     neither apptainer nor singularity is on the PATH\n\
             Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
        );
    }

    #[test]
    fn an_enforced_proxy_that_is_not_ready_blocks_the_start() {
        let mut d = desired(&format!("{SING}proxy:\n  enabled: true\n"));
        d.set_egress(Egress::NotSetUp {
            missing: "ca.crt".into(),
        });
        let text = plan_text(
            &d,
            Some(SingularityObserved::Seen {
                instances: vec![],
                cached: vec![],
            }),
        );
        assert!(
            text.contains("! singularity default/default   blocked     egress proxy not set up (ca.crt) (fail closed); wanted: start (no instance hermes-default-default;"),
            "{text}"
        );
    }

    #[test]
    fn sessions_only_and_other_backends_want_no_instance() {
        let d = desired("terminal:\n  backend: singularity\n  container_persistent: false\n");
        assert!(d.instances.is_empty());
        let d = desired("terminal:\n  backend: docker\n");
        assert!(d.instances.is_empty());
    }

    #[test]
    fn a_sessions_end_ends_its_instances_of_every_task_and_nothing_else() {
        let dir = |p: &str| std::path::PathBuf::from(format!("/h/sandboxes/singularity/{p}"));
        let known = vec![
            (
                SandboxKey::persistent("default", "default"),
                dir("default/default"),
            ),
            (
                SandboxKey::session("default", "default", "s1"),
                dir("default/default/sessions/s1"),
            ),
            (
                SandboxKey::session("default", "review", "s1"),
                dir("default/review/sessions/s1"),
            ),
            (
                SandboxKey::session("default", "default", "s2"),
                dir("default/default/sessions/s2"),
            ),
            (
                SandboxKey::session("other", "default", "s1"),
                dir("other/default/sessions/s1"),
            ),
        ];
        let plan = hermes_model::plan::Plan::new(end_session("default", "s1", &known));
        assert_eq!(
            plan.to_string(),
            "- singularity default/default@s1   end         session s1 ended by hand; its overlay is removed\n\
             - singularity default/review@s1    end         session s1 ended by hand; its overlay is removed\n\
             Plan: 0 to create, 0 to change, 2 to remove."
        );
        let InstanceAction::End { name, dir: at } = (match &plan.ops[0].action {
            Action::Instance(a) => a.clone(),
            other => panic!("{other:?}"),
        }) else {
            panic!("not an end")
        };
        assert_eq!(
            name,
            SandboxKey::session("default", "default", "s1").container_name()
        );
        assert_eq!(at, dir("default/default/sessions/s1"));
        assert!(end_session("default", "s3", &known).is_empty());
    }

    #[test]
    fn down_stops_the_profile_s_running_instances_and_removes_nothing() {
        let dir = |p: &str| std::path::PathBuf::from(format!("/h/sandboxes/singularity/{p}"));
        let known = vec![
            (
                SandboxKey::persistent("default", "default"),
                dir("default/default"),
            ),
            (
                SandboxKey::persistent("default", "idle"),
                dir("default/idle"),
            ),
            (
                SandboxKey::session("default", "default", "s1"),
                dir("default/default/sessions/s1"),
            ),
            (
                SandboxKey::persistent("other", "default"),
                dir("other/default"),
            ),
        ];
        let running = |key: &SandboxKey| ObservedInstance {
            name: key.container_name(),
            pid: 1,
            image: "i".into(),
            spec_hash: None,
        };
        let observed = Observed {
            singularity: Some(SingularityObserved::Seen {
                instances: [&known[0].0, &known[2].0, &known[3].0]
                    .into_iter()
                    .map(running)
                    .collect(),
                cached: Vec::new(),
            }),
            ..Observed::default()
        };
        let plan = hermes_model::plan::Plan::new(down("default", &observed, &known));
        let name = |key: &SandboxKey| key.container_name();
        assert_eq!(
            plan.to_string(),
            format!(
                "- singularity default/default      stop        hermes down: instance {} is stopped, its overlay (its files) kept\n\
                 - singularity default/default@s1   stop        hermes down: instance {} is stopped, its overlay (its files) kept\n\
                 Plan: 0 to create, 0 to change, 2 to remove.",
                name(&known[0].0),
                name(&known[2].0)
            )
        );
        assert!(down("default", &Observed::default(), &known).is_empty());
    }
}
