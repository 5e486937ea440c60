//! The cloud planner (modal, daytona, vercel_sandbox): one sandbox per
//! (profile, task) on the service, as Docker's persistent sandbox, for the
//! default task. Planned from what the driver's `find` returned and the
//! snapshot recorded for the task:
//!
//! - no sandbox → create, from the task's snapshot when there is one, else
//!   from the base image;
//! - a stopped sandbox (Daytona keeps a stopped sandbox as its snapshot) →
//!   resume;
//! - a dead one (failed, terminated) → recreate (delete, then create as
//!   above);
//! - one the service is busy with → reported, nothing done;
//! - running → nothing.
//!
//! A missing credential blocks the sandbox with the variable's name, and a
//! service that could not be asked blocks it with why. A snapshot that
//! fails to restore is dropped and the sandbox created from the base image
//! ([`without_snapshot`]): the next pass finds no record, so a bad
//! snapshot never makes a loop.

use hermes_model::action::{Action, CloudAction};
use hermes_model::cloud::{CloudObserved, CloudSandboxState};
use hermes_model::desired::{DEFAULT_TASK, Desired};
use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Target};

/// The backend's planner ([`crate::Planner`]): [`plan`]'s operations.
pub fn planner(desired: &Desired, observed: &Observed, _now: i64) -> crate::BackendOps {
    crate::BackendOps {
        own: plan(desired, observed),
        ..crate::BackendOps::default()
    }
}

/// The operations on the cloud backend's sandbox.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let Some(cloud) = &desired.cloud else {
        return Vec::new();
    };
    let target = Target::Cloud {
        service: cloud.backend,
        profile: desired.profile.clone(),
        task: DEFAULT_TASK.to_string(),
    };
    let op = |action: Action, cause: String| {
        vec![Op {
            changes: Vec::new(),
            target: target.clone(),
            action,
            cause,
        }]
    };
    if let Err(missing) = &cloud.credentials {
        return op(Action::Blocked, missing.to_string());
    }
    // Without persistence, each session makes its own sandbox on demand:
    // nothing is kept warm.
    if !desired.config.terminal.container_persistent {
        return Vec::new();
    }
    let (sandbox, snapshot) = match &observed.cloud {
        None => return Vec::new(),
        Some(CloudObserved::Unavailable { reason }) => {
            return op(Action::Blocked, reason.clone());
        }
        Some(CloudObserved::Seen { sandbox, snapshot }) => (sandbox, snapshot),
    };
    let from = match snapshot {
        Some(id) => format!("from snapshot {id}"),
        None => format!("from the base image {}", cloud.image),
    };
    match sandbox {
        None => op(
            Action::Cloud(CloudAction::Create {
                snapshot: snapshot.clone(),
            }),
            match snapshot {
                Some(_) => format!("{from} (no sandbox on {})", cloud.backend),
                None => format!("{from} (no sandbox on {}, no snapshot)", cloud.backend),
            },
        ),
        Some((_, CloudSandboxState::Running)) => Vec::new(),
        Some((id, CloudSandboxState::Stopped)) => op(
            Action::Cloud(CloudAction::Resume { id: id.clone() }),
            format!("sandbox {id} is stopped; its filesystem is kept"),
        ),
        Some((id, CloudSandboxState::Pending)) => op(
            Action::Keep {
                id: id.clone(),
                verb: "pending",
            },
            format!("sandbox {id} is being created, started or stopped by the service"),
        ),
        Some((id, CloudSandboxState::Dead)) => op(
            Action::Cloud(CloudAction::Recreate {
                old_id: id.clone(),
                snapshot: snapshot.clone(),
            }),
            format!("sandbox {id} failed or was terminated; {from}"),
        ),
    }
}

/// The operations of `hermes session end ID` on a cloud service. Every
/// session of the profile shares the default task's sandbox there (as the
/// reference shares its persistent sandbox), so ending one suspends that
/// sandbox, keeping its filesystem. Nothing when there is none, when it is
/// stopped already (Daytona keeps a suspended sandbox stopped), or dead
/// (nothing left to keep).
pub fn end_session(desired: &Desired, observed: &Observed, session: &str) -> Vec<Op<Action>> {
    suspend(desired, observed, |id| {
        format!(
            "session {session} ended by hand; sandbox {id} is suspended, its filesystem kept for the next session"
        )
    })
    .into_iter()
    .collect()
}

/// The operations of `hermes down` on a cloud service: the task's
/// sandbox suspended as a session's end suspends it, its filesystem kept
/// for the next pass (which resumes or restores it).
pub fn down(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    suspend(desired, observed, |id| {
        format!(
            "hermes down: sandbox {id} is suspended, its filesystem kept (`hermes reconcile` brings it back)"
        )
    })
    .into_iter()
    .collect()
}

/// The suspend of the default task's sandbox when it runs (or is on its
/// way): none when there is none, or it is stopped or dead.
fn suspend(
    desired: &Desired,
    observed: &Observed,
    cause: impl FnOnce(&str) -> String,
) -> Option<Op<Action>> {
    let cloud = desired.cloud.as_ref()?;
    let Some(CloudObserved::Seen {
        sandbox: Some((id, state)),
        ..
    }) = &observed.cloud
    else {
        return None;
    };
    if matches!(state, CloudSandboxState::Stopped | CloudSandboxState::Dead) {
        return None;
    }
    Some(Op {
        changes: Vec::new(),
        target: Target::Cloud {
            service: cloud.backend,
            profile: desired.profile.clone(),
            task: DEFAULT_TASK.to_string(),
        },
        action: Action::Cloud(CloudAction::Suspend { id: id.clone() }),
        cause: cause(id),
    })
}

/// The operation to carry out instead of `op` when its snapshot failed to
/// restore (`error`): the same, from the base image `image`, saying that
/// the snapshot is dropped. `None` when `op` restores no snapshot.
pub fn without_snapshot(op: &Op<Action>, image: &str, error: &str) -> Option<Op<Action>> {
    let Action::Cloud(cloud) = &op.action else {
        return None;
    };
    let (action, dropped) = match cloud {
        CloudAction::Create { snapshot: Some(id) } => (CloudAction::Create { snapshot: None }, id),
        CloudAction::Recreate {
            old_id,
            snapshot: Some(id),
        } => (
            CloudAction::Recreate {
                old_id: old_id.clone(),
                snapshot: None,
            },
            id,
        ),
        CloudAction::Create { snapshot: None }
        | CloudAction::Recreate { snapshot: None, .. }
        | CloudAction::Resume { .. }
        | CloudAction::Suspend { .. } => return None,
    };
    Some(Op {
        changes: Vec::new(),
        target: op.target.clone(),
        action: Action::Cloud(action),
        cause: format!(
            "snapshot {dropped} failed to restore ({error}); dropped, from the base image {image}"
        ),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;
    use std::time::SystemTime;

    use hermes_model::config::load;
    use hermes_model::desired::HostEnv;
    use hermes_model::plan::Plan;

    use super::*;
    use crate::plan_all;

    fn desired(config: &str, env: &[(&str, &str)]) -> Desired {
        let env = HostEnv {
            process: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..HostEnv::default()
        };
        Desired::build(
            load(config).unwrap().config,
            "default",
            Path::new("/h"),
            &env,
        )
        .unwrap()
    }

    const MODAL: &str = "terminal:\n  backend: modal\n  modal_image: python:3.12\n";
    const MODAL_KEYS: &[(&str, &str)] =
        &[("MODAL_TOKEN_ID", "ak-1"), ("MODAL_TOKEN_SECRET", "as-1")];
    const DAYTONA: &str = "terminal:\n  backend: daytona\n  container_disk: 4096\n";
    const DAYTONA_KEY: &[(&str, &str)] = &[("DAYTONA_API_KEY", "dtn")];

    fn plan_text(desired: &Desired, cloud: Option<CloudObserved>) -> String {
        let observed = Observed {
            cloud,
            ..Observed::default()
        };
        plan_all(desired, &observed, SystemTime::UNIX_EPOCH).to_string()
    }

    fn seen(
        sandbox: Option<(&str, CloudSandboxState)>,
        snapshot: Option<&str>,
    ) -> Option<CloudObserved> {
        Some(CloudObserved::Seen {
            sandbox: sandbox.map(|(id, s)| (id.to_string(), s)),
            snapshot: snapshot.map(str::to_string),
        })
    }

    #[test]
    fn no_sandbox_is_created_from_the_tasks_snapshot() {
        let d = desired(MODAL, MODAL_KEYS);
        assert_eq!(
            plan_text(&d, seen(None, Some("im-0123abcd"))),
            "+ modal default/default   create      from snapshot im-0123abcd (no sandbox on modal)\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
    }

    #[test]
    fn no_sandbox_and_no_snapshot_is_created_from_the_base_image() {
        let d = desired(MODAL, MODAL_KEYS);
        assert_eq!(
            plan_text(&d, seen(None, None)),
            "+ modal default/default   create      from the base image python:3.12 (no sandbox on modal, no snapshot)\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
    }

    #[test]
    fn a_stopped_sandbox_is_resumed_and_a_running_one_left_alone() {
        let d = desired(DAYTONA, DAYTONA_KEY);
        assert_eq!(
            plan_text(&d, seen(Some(("sb-7", CloudSandboxState::Stopped)), None)),
            "~ daytona default/default   resume      sandbox sb-7 is stopped; its filesystem is kept\n\
             Plan: 0 to create, 1 to change, 0 to remove."
        );
        assert_eq!(
            plan_text(&d, seen(Some(("sb-7", CloudSandboxState::Running)), None)),
            "No changes. The host is converged."
        );
    }

    #[test]
    fn a_dead_sandbox_is_recreated_and_a_busy_one_reported() {
        let d = desired(DAYTONA, DAYTONA_KEY);
        assert_eq!(
            plan_text(&d, seen(Some(("sb-7", CloudSandboxState::Dead)), None)),
            "~ daytona default/default   recreate    sandbox sb-7 failed or was terminated; from the base image nikolaik/python-nodejs:python3.11-nodejs20\n\
             Plan: 0 to create, 1 to change, 0 to remove."
        );
        assert_eq!(
            plan_text(&d, seen(Some(("sb-7", CloudSandboxState::Pending)), None)),
            "? daytona default/default   pending     sandbox sb-7 is being created, started or stopped by the service\n\
             No changes. The host is converged."
        );
    }

    #[test]
    fn a_missing_credential_blocks_with_the_variables_name_before_anything_is_asked() {
        let d = desired(DAYTONA, &[]);
        let text = plan_text(&d, None);
        assert_eq!(
            text,
            "! daytona default/default   blocked     DAYTONA_API_KEY is not set\n\
             Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
        );
        let d = desired(
            "terminal:\n  backend: vercel_sandbox\n",
            &[("VERCEL_TOKEN", "t")],
        );
        assert_eq!(
            plan_text(&d, None),
            "! vercel_sandbox default/default   blocked     VERCEL_PROJECT_ID and VERCEL_TEAM_ID are not set (nor is VERCEL_OIDC_TOKEN, which would do alone)\n\
             Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
        );
    }

    #[test]
    fn a_service_that_cannot_be_asked_blocks_with_why() {
        let d = desired(MODAL, MODAL_KEYS);
        let text = plan_text(
            &d,
            Some(CloudObserved::Unavailable {
                reason: "backend modal is not built in this binary".into(),
            }),
        );
        assert_eq!(
            text,
            "! modal default/default   blocked     backend modal is not built in this binary\n\
             Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
        );
    }

    #[test]
    fn without_persistence_nothing_is_kept_warm() {
        let d = desired(
            "terminal:\n  backend: modal\n  container_persistent: false\n",
            MODAL_KEYS,
        );
        assert_eq!(
            plan_text(&d, seen(None, Some("im-1"))),
            "No changes. The host is converged."
        );
    }

    #[test]
    fn a_snapshot_that_fails_to_restore_is_dropped_for_the_base_image() {
        let d = desired(MODAL, MODAL_KEYS);
        let observed = Observed {
            cloud: seen(None, Some("im-bad")),
            ..Observed::default()
        };
        let ops = plan(&d, &observed);
        let fallback = without_snapshot(&ops[0], "python:3.12", "image not found").unwrap();
        assert_eq!(
            fallback.action,
            Action::Cloud(CloudAction::Create { snapshot: None })
        );
        assert_eq!(
            Plan::new(vec![fallback.clone()]).to_string(),
            "+ modal default/default   create      snapshot im-bad failed to restore (image not found); dropped, from the base image python:3.12\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
        // Nothing to fall back from when no snapshot was used: no loop.
        assert_eq!(without_snapshot(&fallback, "python:3.12", "x"), None);
        let recreate = Op {
            changes: Vec::new(),
            target: fallback.target.clone(),
            action: Action::Cloud(CloudAction::Recreate {
                old_id: "sb-1".into(),
                snapshot: Some("im-bad".into()),
            }),
            cause: String::new(),
        };
        assert_eq!(
            without_snapshot(&recreate, "i", "e").unwrap().action,
            Action::Cloud(CloudAction::Recreate {
                old_id: "sb-1".into(),
                snapshot: None
            })
        );
    }

    #[test]
    fn down_suspends_a_running_sandbox_and_leaves_a_stopped_one() {
        let d = desired(MODAL, MODAL_KEYS);
        let with = |cloud| Observed {
            cloud,
            ..Observed::default()
        };
        let down = |o: &Observed| crate::down::plan(o, down(&d, o));
        let running = down(&with(seen(
            Some(("sb-1", CloudSandboxState::Running)),
            None,
        )));
        assert_eq!(
            running.first.to_string(),
            "~ modal default/default   suspend     hermes down: sandbox sb-1 is suspended, its filesystem kept (`hermes reconcile` brings it back)\n\
             Plan: 0 to create, 1 to change, 0 to remove."
        );
        for state in [CloudSandboxState::Stopped, CloudSandboxState::Dead] {
            let idle = down(&with(seen(Some(("sb-1", state)), None)));
            assert!(!idle.is_pending(), "{state:?}");
        }
        assert!(!down(&with(seen(None, Some("im-1")))).is_pending());
    }

    #[test]
    fn a_sessions_end_suspends_the_shared_sandbox_unless_there_is_none_left() {
        let d = desired(MODAL, MODAL_KEYS);
        let end = |cloud: Option<CloudObserved>| {
            let observed = Observed {
                cloud,
                ..Observed::default()
            };
            Plan::new(end_session(&d, &observed, "s1"))
        };
        assert_eq!(
            end(seen(Some(("sb-1", CloudSandboxState::Running)), None)).to_string(),
            "~ modal default/default   suspend     session s1 ended by hand; sandbox sb-1 is suspended, its filesystem kept for the next session\n\
             Plan: 0 to create, 1 to change, 0 to remove."
        );
        assert_eq!(
            end(seen(Some(("sb-1", CloudSandboxState::Pending)), None)).ops[0].action,
            Action::Cloud(CloudAction::Suspend { id: "sb-1".into() })
        );
        assert!(
            end(seen(Some(("sb-1", CloudSandboxState::Stopped)), None))
                .ops
                .is_empty()
        );
        assert!(
            end(seen(Some(("sb-1", CloudSandboxState::Dead)), None))
                .ops
                .is_empty()
        );
        assert!(end(seen(None, Some("im-1"))).ops.is_empty());
        assert!(end(None).ops.is_empty());
    }
}
