//! The kubernetes planner: the warm sandbox of the default task as a Pod
//! and its claim in the configured namespace, planned from what a pass
//! listed there by label:
//!
//! - no claim (a persistent sandbox) → create-claim, then the Pod;
//! - no Pod → create;
//! - a Pod made with another spec, or one that ended (`Succeeded`,
//!   `Failed`) → replace: the Pod deleted by uid and made again, its claim
//!   and so every file kept;
//! - a Pod or a claim of that name that hermes did not make → blocked,
//!   never touched; one being deleted → a report: the next pass makes it.
//!
//! When the API server cannot be asked the sandbox is blocked with why
//! (the verb and resource of a refusal included). A session's end deletes
//! its Pods by uid.

use hermes_model::action::{Action, PodAction};
use hermes_model::desired::Desired;
use hermes_model::kubernetes::{KubeObserved, LABEL_MANAGED_BY, PodWanted, SeenPod, label_value};
use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{
    LABEL_PROFILE, LABEL_SESSION, LABEL_SESSION_TASK, LABEL_TASK, SandboxKey,
};

/// The backend's planner ([`crate::Planner`]).
pub fn planner(desired: &Desired, observed: &Observed) -> crate::BackendOps {
    crate::BackendOps {
        own: plan(desired, observed),
        ..crate::BackendOps::default()
    }
}

/// The target of a key's sandbox.
pub fn target(key: &SandboxKey) -> Target {
    Target::Pod {
        profile: key.profile.clone(),
        task: key.task.clone(),
        session: key.session.clone(),
    }
}

/// The operations on the warm Kubernetes sandboxes.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let Some(seen) = &observed.kubernetes else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    for wanted in &desired.pods {
        plan_one(wanted, seen, &mut ops);
    }
    if desired.config.proxy.enabled {
        // Deny by default: a Pod made now would reach the network without
        // the proxy in its way.
        crate::proxy::block_sandboxes(&mut ops, EGRESS_NOT_WIRED);
    }
    ops
}

/// Why no sandbox Pod is made while `proxy.enabled` is on.
pub const EGRESS_NOT_WIRED: &str = "proxy.enabled is on and the egress proxy is not wired into Kubernetes sandboxes yet (fail closed)";

/// The operations that bring one sandbox's objects where `wanted` says.
pub fn plan_one(wanted: &PodWanted, seen: &KubeObserved, ops: &mut Vec<Op<Action>>) {
    let target = target(&wanted.key);
    let op = |action: Action, cause: String| Op {
        changes: Vec::new(),
        target: target.clone(),
        action,
        cause,
    };
    let (pods, claims) = match seen {
        KubeObserved::Unavailable { reason } => {
            ops.push(op(Action::Blocked, reason.clone()));
            return;
        }
        KubeObserved::Seen { pods, claims, .. } => (pods, claims),
    };
    let ns = &wanted.namespace;
    let mut claim_made_now = false;
    if let Some(claim) = &wanted.claim {
        match claims.iter().find(|c| &c.name == claim) {
            None => {
                claim_made_now = true;
                ops.push(op(
                    Action::Pod(PodAction::CreateClaim(Box::new(wanted.clone()))),
                    format!(
                        "no claim {ns}/{claim}: it keeps /workspace and /root ({} MiB{})",
                        wanted.claim_size_mb(),
                        wanted
                            .storage_class
                            .as_deref()
                            .map(|c| format!(", storage class {c}"))
                            .unwrap_or_default()
                    ),
                ));
            }
            Some(c) if !c.made_by_hermes() => {
                ops.push(op(
                    Action::Blocked,
                    format!(
                        "a claim {ns}/{claim} that hermes did not make (no {LABEL_MANAGED_BY}=hermes) has the sandbox's name; it is left alone"
                    ),
                ));
                return;
            }
            Some(c) if c.deleting => {
                ops.push(op(
                    Action::Keep {
                        id: claim.clone(),
                        verb: "wait",
                    },
                    format!(
                        "claim {ns}/{claim} is being deleted; a later pass makes it and its Pod again"
                    ),
                ));
                return;
            }
            Some(_) => {}
        }
    }
    let claim_note = if claim_made_now {
        "; its claim is made first"
    } else {
        ""
    };
    match pods.iter().find(|p| p.name == wanted.name) {
        None => ops.push(op(
            Action::Pod(PodAction::Create(Box::new(wanted.clone()))),
            format!("no Pod {ns}/{}{claim_note}", wanted.name),
        )),
        Some(p) if !p.made_by_hermes() => ops.push(op(
            Action::Blocked,
            format!(
                "a Pod {ns}/{} that hermes did not make (no {LABEL_MANAGED_BY}=hermes) has the sandbox's name; it is left alone",
                p.name
            ),
        )),
        Some(p) if p.deleting => ops.push(op(
            Action::Keep {
                id: p.name.clone(),
                verb: "wait",
            },
            format!(
                "Pod {ns}/{} is being deleted; a later pass makes it again",
                p.name
            ),
        )),
        Some(p) => {
            if let Some(cause) = replace_cause(wanted, p) {
                ops.push(op(
                    Action::Pod(PodAction::Replace {
                        wanted: Box::new(wanted.clone()),
                        uid: p.uid.clone(),
                    }),
                    cause,
                ));
            }
        }
    }
}

/// Why a Pod hermes made must be replaced, if it must.
fn replace_cause(wanted: &PodWanted, p: &SeenPod) -> Option<String> {
    let keeps = if wanted.claim.is_some() {
        "its claim (its files) is kept"
    } else {
        "a session's files go with it"
    };
    if matches!(p.phase.as_str(), "Succeeded" | "Failed") {
        return Some(format!("Pod {} ended ({}); {keeps}", p.name, p.phase));
    }
    match p.spec_hash() {
        Some(h) if h == wanted.hash => None,
        found => Some(format!(
            "spec changed: {} -> {}; {keeps}",
            found.unwrap_or("unknown"),
            wanted.hash
        )),
    }
}

/// The operations of `hermes session end ID` on kubernetes: every Pod
/// hermes made for `profile`'s session `session`, whatever its task,
/// deleted by uid. Other profiles' and sessions' are not looked at.
pub fn end_session(profile: &str, session: &str, seen: &KubeObserved) -> Vec<Op<Action>> {
    let KubeObserved::Seen { pods, .. } = seen else {
        return Vec::new();
    };
    let (profile, session) = (label_value(profile), label_value(session));
    pods.iter()
        .filter(|p| p.made_by_hermes() && !p.deleting)
        .filter(|p| {
            p.labels.get(LABEL_PROFILE) == Some(&profile)
                && p.labels.get(LABEL_SESSION) == Some(&session)
        })
        .map(|p| Op {
            changes: Vec::new(),
            target: Target::Pod {
                profile: profile.clone(),
                task: p
                    .labels
                    .get(LABEL_SESSION_TASK)
                    .cloned()
                    .unwrap_or_default(),
                session: Some(session.clone()),
            },
            action: Action::Pod(PodAction::Delete {
                name: p.name.clone(),
                uid: p.uid.clone(),
            }),
            cause: format!(
                "session {session} ended by hand; Pod {} and its emptyDir go",
                p.name
            ),
        })
        .collect()
}

/// The operations of `hermes down` on kubernetes: every Pod hermes made
/// for `profile` (its tasks' and its sessions'), deleted by uid; the
/// claims stay, so `hermes reconcile` brings each task back with its
/// files.
pub fn down(profile: &str, observed: &Observed) -> Vec<Op<Action>> {
    let Some(KubeObserved::Seen { pods, .. }) = &observed.kubernetes else {
        return Vec::new();
    };
    let profile = label_value(profile);
    pods.iter()
        .filter(|p| p.made_by_hermes() && !p.deleting)
        .filter(|p| p.labels.get(LABEL_PROFILE) == Some(&profile))
        .map(|p| {
            let session = p.labels.get(LABEL_SESSION).cloned();
            let task_label = if session.is_some() {
                LABEL_SESSION_TASK
            } else {
                LABEL_TASK
            };
            let keeps = if session.is_some() {
                "its emptyDir goes (a session's)"
            } else {
                "its claim (its files) is kept"
            };
            Op {
                changes: Vec::new(),
                target: Target::Pod {
                    profile: profile.clone(),
                    task: p.labels.get(task_label).cloned().unwrap_or_default(),
                    session,
                },
                action: Action::Pod(PodAction::Delete {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                }),
                cause: format!("hermes down: Pod {} ({}), {keeps}", p.name, p.phase),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_model::kubernetes::{KubeSettings, SandboxKind, SeenClaim};
    use hermes_model::plan::Describe;
    use std::collections::BTreeMap;

    fn settings() -> KubeSettings {
        KubeSettings {
            namespace: "hermes".into(),
            image: "debian:bookworm".into(),
            cpu: 1.0,
            memory_mb: 512,
            disk_mb: 2048,
            ..KubeSettings::default()
        }
    }

    fn wanted() -> PodWanted {
        PodWanted::new(
            &settings(),
            SandboxKey::persistent("default", "default"),
            Some("h1"),
            None,
        )
    }

    fn pod_of(w: &PodWanted, phase: &str) -> SeenPod {
        SeenPod {
            name: w.name.clone(),
            uid: "uid-1".into(),
            labels: w.labels.clone(),
            phase: phase.into(),
            ready: phase == "Running",
            deleting: false,
            waiting: None,
        }
    }

    fn claim_of(w: &PodWanted) -> SeenClaim {
        SeenClaim {
            name: w.claim.clone().unwrap(),
            uid: "c-1".into(),
            labels: w.labels.clone(),
            phase: "Bound".into(),
            deleting: false,
        }
    }

    fn seen(pods: Vec<SeenPod>, claims: Vec<SeenClaim>) -> KubeObserved {
        KubeObserved::Seen {
            kind: SandboxKind::Pod,
            pods,
            claims,
        }
    }

    fn verbs(ops: &[Op<Action>]) -> Vec<&'static str> {
        ops.iter().map(|o| o.action.verb()).collect()
    }

    #[test]
    fn an_empty_namespace_gets_the_claim_then_the_pod() {
        let w = wanted();
        let mut ops = Vec::new();
        plan_one(&w, &seen(vec![], vec![]), &mut ops);
        assert_eq!(verbs(&ops), ["create-claim", "create"]);
        assert!(
            ops[1].cause.contains("claim is made first"),
            "{}",
            ops[1].cause
        );
        assert_eq!(ops[0].target.to_string(), "kubernetes default/default");
    }

    #[test]
    fn a_pod_as_wanted_plans_nothing_and_a_changed_spec_replaces_it_keeping_the_claim() {
        let w = wanted();
        let mut ops = Vec::new();
        plan_one(
            &w,
            &seen(vec![pod_of(&w, "Running")], vec![claim_of(&w)]),
            &mut ops,
        );
        assert!(ops.is_empty(), "{ops:?}");
        let mut old = pod_of(&w, "Running");
        old.labels
            .insert(hermes_model::sandbox::LABEL_SPEC_HASH.into(), "0ld".into());
        plan_one(&w, &seen(vec![old], vec![claim_of(&w)]), &mut ops);
        assert_eq!(verbs(&ops), ["replace"]);
        assert!(ops[0].cause.contains("0ld ->"), "{}", ops[0].cause);
        assert!(ops[0].cause.contains("claim (its files) is kept"));
        assert!(
            matches!(&ops[0].action, Action::Pod(PodAction::Replace { uid, .. }) if uid == "uid-1")
        );
    }

    #[test]
    fn an_ended_pod_is_replaced() {
        let w = wanted();
        let mut ops = Vec::new();
        plan_one(
            &w,
            &seen(vec![pod_of(&w, "Failed")], vec![claim_of(&w)]),
            &mut ops,
        );
        assert_eq!(verbs(&ops), ["replace"]);
        assert!(ops[0].cause.contains("ended (Failed)"));
    }

    #[test]
    fn objects_hermes_did_not_make_are_never_touched() {
        let w = wanted();
        let mut foreign = pod_of(&w, "Running");
        foreign.labels = BTreeMap::new();
        let mut ops = Vec::new();
        plan_one(&w, &seen(vec![foreign], vec![claim_of(&w)]), &mut ops);
        assert_eq!(verbs(&ops), ["blocked"]);
        let mut foreign_claim = claim_of(&w);
        foreign_claim.labels = BTreeMap::new();
        ops.clear();
        plan_one(&w, &seen(vec![], vec![foreign_claim]), &mut ops);
        assert_eq!(verbs(&ops), ["blocked"]);
        assert!(ops[0].cause.contains("did not make"));
    }

    #[test]
    fn an_unreachable_server_blocks_with_its_reason() {
        let w = wanted();
        let mut ops = Vec::new();
        let reason = "the API server refused list pods in namespace hermes (403)".to_string();
        plan_one(
            &w,
            &KubeObserved::Unavailable {
                reason: reason.clone(),
            },
            &mut ops,
        );
        assert_eq!(verbs(&ops), ["blocked"]);
        assert_eq!(ops[0].cause, reason);
    }

    #[test]
    fn a_session_end_deletes_only_that_sessions_pods_by_uid() {
        let s = |profile: &str, session: &str, uid: &str| {
            let w = PodWanted::new(
                &settings(),
                SandboxKey::session(profile, "t", session),
                None,
                None,
            );
            SeenPod {
                uid: uid.into(),
                ..pod_of(&w, "Running")
            }
        };
        let observed = seen(
            vec![
                s("default", "s1", "a"),
                s("default", "s2", "b"),
                s("other", "s1", "c"),
            ],
            vec![],
        );
        let ops = end_session("default", "s1", &observed);
        assert_eq!(verbs(&ops), ["delete"]);
        assert!(matches!(&ops[0].action, Action::Pod(PodAction::Delete { uid, .. }) if uid == "a"));
        assert_eq!(ops[0].target.to_string(), "kubernetes default/t@s1");
    }
}
