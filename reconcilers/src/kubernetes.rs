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

pub mod proxy;

use hermes_model::action::{Action, PodAction};
use hermes_model::desired::Desired;
use hermes_model::kubernetes::{
    KubeObserved, LABEL_MANAGED_BY, PodWanted, SandboxKind, SeenPod, SeenSandbox, label_value,
};
use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Target};
use hermes_model::sandbox::{
    LABEL_PROFILE, LABEL_SESSION, LABEL_SESSION_TASK, LABEL_TASK, SandboxKey,
};

/// The backend's planner ([`crate::Planner`]).
pub fn planner(desired: &Desired, observed: &Observed, now: i64) -> crate::BackendOps {
    let mut own = plan(desired, observed);
    own.extend(reap(desired, observed, now));
    crate::BackendOps {
        own,
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
    if let KubeObserved::Seen { proxy: seen, .. } = seen {
        let mut proxy_ops = proxy::plan(desired, seen);
        if let Some(why) = proxy::sandboxes_wait(desired, seen, &proxy_ops) {
            // Deny by default: a Pod made now would run without the proxy
            // in its way.
            crate::proxy::block_sandboxes(&mut ops, &why);
        }
        proxy_ops.append(&mut ops);
        ops = proxy_ops;
    }
    ops
}

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
        KubeObserved::Seen {
            pods,
            claims,
            sandboxes,
            kind,
            ..
        } => {
            if *kind == SandboxKind::AgentSandbox {
                let wanted = wanted.holding(*kind);
                if plan_claim(&wanted, claims, &op, ops).is_some() {
                    sandbox_one(&wanted, pods, sandboxes, &op, ops);
                }
                return;
            }
            (pods, claims)
        }
    };
    let Some(claim_made_now) = plan_claim(wanted, claims, &op, ops) else {
        return;
    };
    let ns = &wanted.namespace;
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
        Some(p) if !p.made_by_hermes() || p.of_sandbox => ops.push(op(
            Action::Blocked,
            format!(
                "a Pod {ns}/{} that hermes did not make (no {LABEL_MANAGED_BY}=hermes, or a Sandbox's) has the sandbox's name; it is left alone",
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

/// The claim of a persistent sandbox: made when missing (`Some(true)`),
/// there (`Some(false)`), or in the way (`None`: the sandbox is blocked or
/// waits, and nothing else is planned for it).
fn plan_claim(
    wanted: &PodWanted,
    claims: &[hermes_model::kubernetes::SeenClaim],
    op: &impl Fn(Action, String) -> Op<Action>,
    ops: &mut Vec<Op<Action>>,
) -> Option<bool> {
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
                return None;
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
                return None;
            }
            Some(_) => {}
        }
    }
    Some(claim_made_now)
}

/// The operations that bring one sandbox held by agent-sandbox's
/// `Sandbox` where `wanted` says: the Sandbox made (a Pod hermes made
/// itself under that name, from before the cluster served the kind,
/// deleted first, its claim kept), replaced when its spec changed,
/// resumed when suspended. Its Pod is the controller's.
fn sandbox_one(
    wanted: &PodWanted,
    pods: &[SeenPod],
    sandboxes: &[SeenSandbox],
    op: &impl Fn(Action, String) -> Op<Action>,
    ops: &mut Vec<Op<Action>>,
) {
    let (ns, name) = (&wanted.namespace, &wanted.name);
    let kind = SandboxKind::AgentSandbox.as_str();
    match sandboxes.iter().find(|s| &s.name == name) {
        None => {
            match pods.iter().find(|p| &p.name == name) {
                Some(p) if !p.made_by_hermes() || p.of_sandbox => {
                    ops.push(op(
                        Action::Blocked,
                        format!("a Pod {ns}/{name} that hermes did not make has the sandbox's name; it is left alone"),
                    ));
                    return;
                }
                Some(p) if !p.deleting => ops.push(op(
                    Action::Pod(PodAction::Delete {
                        name: name.clone(),
                        uid: p.uid.clone(),
                        kind: SandboxKind::Pod,
                    }),
                    format!(
                        "the cluster serves {kind} now: the Pod hermes made itself goes first (its claim is kept) and a Sandbox takes its place"
                    ),
                )),
                _ => {}
            }
            ops.push(op(
                Action::Pod(PodAction::Create(Box::new(wanted.clone()))),
                format!(
                    "no Sandbox {ns}/{name}: the cluster serves {kind}, so a Sandbox holds it (its controller makes the Pod)"
                ),
            ));
        }
        Some(sb) if !sb.made_by_hermes() => ops.push(op(
            Action::Blocked,
            format!(
                "a Sandbox {ns}/{name} that hermes did not make (no {LABEL_MANAGED_BY}=hermes) has the sandbox's name; it is left alone"
            ),
        )),
        Some(sb) if sb.deleting => ops.push(op(
            Action::Keep {
                id: name.clone(),
                verb: "wait",
            },
            format!("Sandbox {ns}/{name} is being deleted; a later pass makes it again"),
        )),
        Some(sb) => {
            let keeps = if wanted.claim.is_some() {
                "its claim (its files) is kept"
            } else {
                "a session's files go with it"
            };
            match sb.spec_hash() {
                Some(h) if h == wanted.hash => {
                    if sb.suspended {
                        ops.push(op(
                            Action::Pod(PodAction::Resume {
                                wanted: Box::new(wanted.clone()),
                                uid: sb.uid.clone(),
                            }),
                            format!(
                                "Sandbox {ns}/{name} is suspended; resumed, its controller makes its Pod again ({keeps})"
                            ),
                        ));
                    }
                }
                found => ops.push(op(
                    Action::Pod(PodAction::Replace {
                        wanted: Box::new(wanted.clone()),
                        uid: sb.uid.clone(),
                    }),
                    format!(
                        "spec changed: {} -> {}; the Sandbox is made again, {keeps}",
                        found.unwrap_or("unknown"),
                        wanted.hash
                    ),
                )),
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

/// What holds a sandbox hermes made: a Pod of its own, or agent-sandbox's
/// `Sandbox` (with the Pod its controller made, while there is one).
struct Holder<'a> {
    name: &'a str,
    uid: &'a str,
    kind: SandboxKind,
    labels: &'a std::collections::BTreeMap<String, String>,
    pod: Option<&'a SeenPod>,
}

impl Holder<'_> {
    fn noun(&self) -> &'static str {
        match self.kind {
            SandboxKind::Pod => "Pod",
            SandboxKind::AgentSandbox => "Sandbox",
        }
    }

    fn delete(&self) -> PodAction {
        PodAction::Delete {
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            kind: self.kind,
        }
    }

    /// Its target: a session's, or a task's.
    fn target(&self, profile: &str) -> Target {
        let session = self.labels.get(LABEL_SESSION).cloned();
        let task_label = if session.is_some() {
            LABEL_SESSION_TASK
        } else {
            LABEL_TASK
        };
        Target::Pod {
            profile: profile.to_string(),
            task: self.labels.get(task_label).cloned().unwrap_or_default(),
            session,
        }
    }
}

/// Every sandbox hermes made in what a pass saw, not on its way out.
fn holders(seen: &KubeObserved) -> Vec<Holder<'_>> {
    let KubeObserved::Seen {
        pods, sandboxes, ..
    } = seen
    else {
        return Vec::new();
    };
    let held = sandboxes
        .iter()
        .filter(|s| s.made_by_hermes() && !s.deleting)
        .map(|s| Holder {
            name: &s.name,
            uid: &s.uid,
            kind: SandboxKind::AgentSandbox,
            labels: &s.labels,
            pod: pods.iter().find(|p| p.name == s.name && p.of_sandbox),
        });
    let own = pods
        .iter()
        .filter(|p| p.made_by_hermes() && !p.deleting && !p.of_sandbox)
        .map(|p| Holder {
            name: &p.name,
            uid: &p.uid,
            kind: SandboxKind::Pod,
            labels: &p.labels,
            pod: Some(p),
        });
    held.chain(own).collect()
}

/// The operations of `hermes session end ID` on kubernetes: every Pod (or
/// Sandbox) hermes made for `profile`'s session `session`, whatever its
/// task, deleted by uid. Other profiles' and sessions' are not looked at.
pub fn end_session(profile: &str, session: &str, seen: &KubeObserved) -> Vec<Op<Action>> {
    let (profile, session) = (label_value(profile), label_value(session));
    holders(seen)
        .into_iter()
        .filter(|h| {
            h.labels.get(LABEL_PROFILE) == Some(&profile)
                && h.labels.get(LABEL_SESSION) == Some(&session)
        })
        .map(|h| Op {
            changes: Vec::new(),
            target: h.target(&profile),
            action: Action::Pod(h.delete()),
            cause: format!(
                "session {session} ended by hand; {} {} and its emptyDir go",
                h.noun(),
                h.name
            ),
        })
        .collect()
}

/// Whether the idle reaper would remove `p` at `now` if nothing ran in it:
/// one of ours, of `desired`'s profile, that no wanted sandbox is (a
/// session's, another task's, the default task's when it is not kept
/// warm), running, unused for longer than `terminal.lifetime_seconds`.
/// The controller counts the processes of these only.
pub fn idle_candidate(desired: &Desired, p: &SeenPod, now: i64) -> bool {
    on_demand(desired, p)
        && p.phase == "Running"
        && p.unused_since()
            .is_some_and(|t| now.saturating_sub(t) > lifetime(desired))
}

fn lifetime(desired: &Desired) -> i64 {
    i64::try_from(desired.config.terminal.lifetime_seconds).unwrap_or(i64::MAX)
}

/// One of ours, of this profile, not a wanted sandbox, not on its way out.
fn on_demand(desired: &Desired, p: &SeenPod) -> bool {
    p.made_by_hermes()
        && !p.deleting
        && p.labels.get(LABEL_PROFILE) == Some(&label_value(&desired.profile))
        && !desired.pods.iter().any(|w| w.name == p.name)
}

/// The reapers, as planned operations, over the sandboxes made on demand
/// ([`idle_candidate`]'s): one whose Pod ended (`Succeeded`, `Failed`) is
/// deleted; one idle past `terminal.lifetime_seconds` with nothing
/// running in it (no exec, no background process) is deleted, or, held by
/// a `Sandbox` with a claim, suspended (its controller deletes the Pod
/// and keeps the claim); busy, or of unknown processes, it is kept. A
/// task's claim stays: its next command brings its Pod back with its
/// files.
pub fn reap(desired: &Desired, observed: &Observed, now: i64) -> Vec<Op<Action>> {
    let Some(seen) = &observed.kubernetes else {
        return Vec::new();
    };
    let limit = lifetime(desired);
    let profile = label_value(&desired.profile);
    holders(seen)
        .into_iter()
        .filter(|h| {
            h.labels.get(LABEL_PROFILE) == Some(&profile)
                && !desired.pods.iter().any(|w| w.name == h.name)
        })
        .filter_map(|h| {
            let p = h.pod?;
            let session = h.labels.contains_key(LABEL_SESSION);
            let keeps = if session {
                "a session's files go with it"
            } else {
                "its claim (its files) is kept"
            };
            let (action, cause) = if matches!(p.phase.as_str(), "Succeeded" | "Failed") {
                (
                    h.delete(),
                    format!(
                        "Pod {} ended ({}) and no sandbox wants it; {keeps}",
                        p.name, p.phase
                    ),
                )
            } else if idle_candidate(desired, p, now) && p.processes == Some(0) {
                let idle = now.saturating_sub(p.unused_since().unwrap_or(now));
                let idle_cause = format!(
                    "{} {} idle for {idle}s (terminal.lifetime_seconds: {limit}), nothing runs in it",
                    h.noun(),
                    h.name
                );
                // Looked at again when applied: a command started since
                // keeps it.
                if h.kind == SandboxKind::AgentSandbox && !session {
                    (
                        PodAction::Suspend {
                            name: h.name.to_string(),
                            uid: h.uid.to_string(),
                            lifetime: limit,
                        },
                        format!("{idle_cause}; suspended, {keeps}"),
                    )
                } else {
                    (
                        PodAction::DeleteIdle {
                            name: h.name.to_string(),
                            uid: h.uid.to_string(),
                            lifetime: limit,
                            kind: h.kind,
                        },
                        format!("{idle_cause}; {keeps}"),
                    )
                }
            } else {
                return None;
            };
            Some(Op {
                changes: Vec::new(),
                target: h.target(&profile),
                action: Action::Pod(action),
                cause,
            })
        })
        .collect()
}

/// The operations of `hermes down` on kubernetes: every Pod (or Sandbox)
/// hermes made for `profile` (its tasks' and its sessions'), deleted by
/// uid; the claims stay, so `hermes reconcile` brings each task back with
/// its files.
pub fn down(profile: &str, observed: &Observed) -> Vec<Op<Action>> {
    let Some(seen) = &observed.kubernetes else {
        return Vec::new();
    };
    let profile = label_value(profile);
    holders(seen)
        .into_iter()
        .filter(|h| h.labels.get(LABEL_PROFILE) == Some(&profile))
        .map(|h| {
            let keeps = if h.labels.contains_key(LABEL_SESSION) {
                "its emptyDir goes (a session's)"
            } else {
                "its claim (its files) is kept"
            };
            let state = h
                .pod
                .map_or_else(|| "suspended".to_string(), |p| p.phase.clone());
            Op {
                changes: Vec::new(),
                target: h.target(&profile),
                action: Action::Pod(h.delete()),
                cause: format!("hermes down: {} {} ({state}), {keeps}", h.noun(), h.name),
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
            ..SeenPod::default()
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
            sandboxes: vec![],
            proxy: Default::default(),
        }
    }

    fn sandbox_of(w: &PodWanted, suspended: bool) -> SeenSandbox {
        SeenSandbox {
            name: w.name.clone(),
            uid: "sb-1".into(),
            labels: w.labels.clone(),
            suspended,
            deleting: false,
        }
    }

    fn served(
        pods: Vec<SeenPod>,
        claims: Vec<SeenClaim>,
        sandboxes: Vec<SeenSandbox>,
    ) -> KubeObserved {
        KubeObserved::Seen {
            kind: SandboxKind::AgentSandbox,
            pods,
            claims,
            sandboxes,
            proxy: Default::default(),
        }
    }

    fn planned(w: &PodWanted, seen: &KubeObserved) -> Vec<(&'static str, String)> {
        let mut ops = Vec::new();
        plan_one(w, seen, &mut ops);
        ops.iter()
            .map(|o| (o.action.verb(), o.cause.clone()))
            .collect()
    }

    #[test]
    fn where_agent_sandbox_is_served_a_sandbox_holds_it_and_says_so() {
        let w = wanted();
        // Nothing there: the claim, then the Sandbox, the kind named.
        let ops = planned(&w, &served(vec![], vec![], vec![]));
        assert_eq!(
            ops.iter().map(|o| o.0).collect::<Vec<_>>(),
            ["create-claim", "create"]
        );
        assert!(ops[1].1.contains("Sandbox (agents.x-k8s.io)"), "{ops:?}");
        let mut all = Vec::new();
        plan_one(&w, &served(vec![], vec![], vec![]), &mut all);
        assert!(
            matches!(&all[1].action, Action::Pod(PodAction::Create(x)) if x.kind == SandboxKind::AgentSandbox)
        );
        // A Pod hermes made itself before: it goes first, its claim kept.
        let ops = planned(
            &w,
            &served(vec![pod_of(&w, "Running")], vec![claim_of(&w)], vec![]),
        );
        assert_eq!(
            ops.iter().map(|o| o.0).collect::<Vec<_>>(),
            ["delete", "create"],
            "{ops:?}"
        );
        assert!(ops[0].1.contains("its claim is kept"), "{ops:?}");
        // As wanted: nothing; its controller's Pod is not looked at.
        let mut controllers = pod_of(&w, "Running");
        controllers.of_sandbox = true;
        let as_wanted = served(
            vec![controllers.clone()],
            vec![claim_of(&w)],
            vec![sandbox_of(&w, false)],
        );
        assert!(planned(&w, &as_wanted).is_empty());
        // Suspended: resumed.
        let ops = planned(
            &w,
            &served(vec![], vec![claim_of(&w)], vec![sandbox_of(&w, true)]),
        );
        assert_eq!(
            ops.iter().map(|o| o.0).collect::<Vec<_>>(),
            ["resume"],
            "{ops:?}"
        );
        // Another spec: replaced, the claim kept.
        let mut old = sandbox_of(&w, false);
        old.labels
            .insert(hermes_model::sandbox::LABEL_SPEC_HASH.into(), "old".into());
        let ops = planned(
            &w,
            &served(vec![controllers], vec![claim_of(&w)], vec![old]),
        );
        assert_eq!(
            ops.iter().map(|o| o.0).collect::<Vec<_>>(),
            ["replace"],
            "{ops:?}"
        );
        assert!(ops[0].1.contains("claim (its files) is kept"), "{ops:?}");
        // Someone else's Sandbox of that name: never touched.
        let mut foreign = sandbox_of(&w, false);
        foreign.labels.remove(LABEL_MANAGED_BY);
        let ops = planned(&w, &served(vec![], vec![claim_of(&w)], vec![foreign]));
        assert_eq!(
            ops.iter().map(|o| o.0).collect::<Vec<_>>(),
            ["blocked"],
            "{ops:?}"
        );
    }

    #[test]
    fn an_idle_sandbox_is_suspended_a_session_s_deleted_and_down_deletes_sandboxes() {
        let d = on_demand_host();
        let task_w = d.pod(SandboxKey::persistent("default", "t1"));
        let mut task_pod = pod_of(&task_w, "Running");
        task_pod.of_sandbox = true;
        task_pod.started_at = Some(1_000);
        task_pod.processes = Some(0);
        let mut session_pod = session_pod("s1", "Running", Some(0));
        session_pod.of_sandbox = true;
        let session_sb = SeenSandbox {
            name: session_pod.name.clone(),
            uid: "sb-s1".into(),
            labels: session_pod.labels.clone(),
            suspended: false,
            deleting: false,
        };
        let observed = Observed {
            kubernetes: Some(served(
                vec![task_pod, session_pod],
                vec![],
                vec![sandbox_of(&task_w, false), session_sb],
            )),
            ..Observed::default()
        };
        let ops = reap(&d, &observed, 9_999);
        let actions: Vec<&Action> = ops.iter().map(|o| &o.action).collect();
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Pod(PodAction::Suspend { uid, .. }) if uid == "sb-1")),
            "{ops:?}"
        );
        assert!(
            actions.iter().any(|a| matches!(a, Action::Pod(PodAction::DeleteIdle { uid, kind: SandboxKind::AgentSandbox, .. }) if uid == "sb-s1")),
            "{ops:?}"
        );
        // A suspended one holds no Pod: nothing to reap; down deletes
        // every Sandbox of the profile, suspended or not.
        let observed = Observed {
            kubernetes: Some(served(vec![], vec![], vec![sandbox_of(&task_w, true)])),
            ..Observed::default()
        };
        assert!(reap(&d, &observed, 9_999).is_empty());
        let ops = down("default", &observed);
        assert!(
            matches!(
                &ops[0].action,
                Action::Pod(PodAction::Delete {
                    kind: SandboxKind::AgentSandbox,
                    ..
                })
            ),
            "{ops:?}"
        );
        assert!(ops[0].cause.contains("suspended"), "{ops:?}");
    }

    /// A host on kubernetes whose sandboxes are made on demand (no warm
    /// Pod), idle after 300 s.
    fn on_demand_host() -> Desired {
        Desired::build(
            hermes_model::config::load(
                "terminal:\n  backend: kubernetes\n  container_persistent: false\n  lifetime_seconds: 300\n",
            )
            .unwrap()
            .config,
            "default",
            std::path::Path::new("/h"),
            &hermes_model::desired::HostEnv::default(),
        )
        .unwrap()
    }

    /// A session's Pod made by hermes, started at 1000 and last used at 1100.
    fn session_pod(session: &str, phase: &str, processes: Option<u32>) -> SeenPod {
        let w = PodWanted::new(
            &settings(),
            SandboxKey::session("default", "default", session),
            Some("h1"),
            None,
        );
        SeenPod {
            started_at: Some(1_000),
            last_used: Some(1_100),
            processes,
            ..pod_of(&w, phase)
        }
    }

    fn reaped(d: &Desired, pods: Vec<SeenPod>, now: i64) -> Vec<String> {
        let observed = Observed {
            kubernetes: Some(seen(pods, vec![])),
            ..Observed::default()
        };
        reap(d, &observed, now)
            .iter()
            .map(|o| format!("{} {} {}", o.target, o.action.verb(), o.cause))
            .collect()
    }

    #[test]
    fn the_reaper_deletes_an_idle_or_ended_pod_and_keeps_a_busy_or_unknown_one() {
        let d = on_demand_host();
        assert!(d.pods.is_empty(), "nothing is kept warm");
        // Idle, nothing inside, past the limit (1100 + 300 < 1401).
        let idle = reaped(&d, vec![session_pod("s1", "Running", Some(0))], 1_401);
        assert_eq!(idle.len(), 1, "{idle:?}");
        assert!(
            idle[0].starts_with("kubernetes default/default@s1 delete"),
            "{idle:?}"
        );
        assert!(idle[0].contains("idle for 301s"), "{idle:?}");
        // Looked at again when applied, with the limit it was planned by.
        let observed = Observed {
            kubernetes: Some(seen(vec![session_pod("s1", "Running", Some(0))], vec![])),
            ..Observed::default()
        };
        assert!(matches!(
            &reap(&d, &observed, 1_401)[0].action,
            Action::Pod(PodAction::DeleteIdle { lifetime: 300, .. })
        ));
        // Not yet past the limit, busy, or not counted: kept.
        assert!(reaped(&d, vec![session_pod("s1", "Running", Some(0))], 1_400).is_empty());
        assert!(reaped(&d, vec![session_pod("s1", "Running", Some(2))], 9_999).is_empty());
        assert!(reaped(&d, vec![session_pod("s1", "Running", None)], 9_999).is_empty());
        // Ended: deleted whatever its idleness.
        let ended = reaped(&d, vec![session_pod("s2", "Failed", None)], 1_101);
        assert!(ended[0].contains("ended (Failed)"), "{ended:?}");
        let observed = Observed {
            kubernetes: Some(seen(vec![session_pod("s2", "Failed", None)], vec![])),
            ..Observed::default()
        };
        assert!(matches!(
            &reap(&d, &observed, 1_101)[0].action,
            Action::Pod(PodAction::Delete { .. })
        ));
        // Another profile's, or one hermes did not make: never looked at.
        let mut other = session_pod("s3", "Failed", None);
        other.labels.insert(LABEL_PROFILE.into(), "other".into());
        let mut foreign = session_pod("s4", "Failed", None);
        foreign.labels.remove(LABEL_MANAGED_BY);
        assert!(reaped(&d, vec![other, foreign], 9_999).is_empty());
    }

    #[test]
    fn the_warm_pod_is_never_reaped() {
        let d = Desired::build(
            hermes_model::config::load(
                "terminal:\n  backend: kubernetes\n  lifetime_seconds: 300\n",
            )
            .unwrap()
            .config,
            "default",
            std::path::Path::new("/h"),
            &hermes_model::desired::HostEnv::default(),
        )
        .unwrap();
        let warm = d.pods[0].clone();
        let pod = SeenPod {
            started_at: Some(0),
            processes: Some(0),
            ..pod_of(&warm, "Running")
        };
        assert!(!idle_candidate(&d, &pod, 99_999));
        assert!(reaped(&d, vec![pod], 99_999).is_empty());
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
