//! The planner of the egress proxy in the cluster: the home's Secret, CA
//! ConfigMap, Service, two NetworkPolicies and proxy Pod as
//! [`ProxyWanted`] says, planned from what a pass found of them.
//!
//! - missing → create (the Pod last: it mounts the Secret);
//! - made with other settings (its hash) → update in place, the Pod
//!   replaced (deleted by uid, made again, waited for until Ready);
//! - an ended Pod → replaced;
//! - an object of a wanted name that hermes did not make → blocked, never
//!   touched; one being deleted → a report: the next pass makes it;
//! - `proxy.enabled` off (or another backend) → every object of the home's
//!   proxy hermes made deleted by uid.
//!
//! Fail closed: unless every object is there on the current settings and
//! the Pod is Ready, no sandbox Pod is made, replaced or resumed; the
//! plan says why ([`sandboxes_wait`]). A stage of the plan that makes the
//! proxy is followed by one that makes the sandboxes ([`predict`]).

use hermes_model::action::{Action, PodAction};
use hermes_model::desired::{Desired, Egress};
use hermes_model::kubernetes::proxy::{ProxyObject, ProxyWanted, SeenObject, SeenProxy};
use hermes_model::plan::{Op, Target};

/// The operations on the home's proxy objects.
pub fn plan(desired: &Desired, seen: &SeenProxy) -> Vec<Op<Action>> {
    let op = |action: Action, cause: String| Op {
        changes: Vec::new(),
        target: Target::Proxy,
        action,
        cause,
    };
    let Some(wanted) = desired.kube_proxy() else {
        if desired.config.proxy.enabled {
            // Not set up yet: the host's proxy planner sets it up.
            return Vec::new();
        }
        return seen
            .objects
            .iter()
            .filter(|(_, s)| s.made_by_hermes && !s.deleting)
            .map(|(object, s)| {
                op(
                    Action::Pod(PodAction::DeleteProxy {
                        object: *object,
                        name: s.name.clone(),
                        uid: s.uid.clone(),
                    }),
                    format!(
                        "the egress proxy is disabled (proxy.enabled: false): its {} {} goes",
                        object.kind(),
                        s.name
                    ),
                )
            })
            .collect();
    };
    let ns = &wanted.namespace;
    if wanted.image.is_none() {
        return vec![op(Action::Blocked, NO_IMAGE.to_string())];
    }
    let mut ops = Vec::new();
    for object in ProxyObject::ALL {
        let name = wanted.object_name(object);
        let kind = object.kind();
        let apply = |existing: Option<String>| {
            Action::Pod(PodAction::ApplyProxy {
                object,
                wanted: Box::new(wanted.clone()),
                existing,
            })
        };
        let hash = wanted.hash(object);
        // What the apply of the Pod does besides the write.
        let waits = if object == ProxyObject::Pod {
            "; waited for until Ready (120 s at most)"
        } else {
            ""
        };
        match seen.get(object, &name) {
            None => ops.push(op(apply(None), format!("no {kind} {ns}/{name}{waits}"))),
            Some(s) if !s.made_by_hermes => ops.push(op(Action::Blocked, not_ours(object, ns, s))),
            Some(s) if s.deleting => ops.push(op(
                Action::Keep {
                    id: s.name.clone(),
                    verb: "deleting",
                },
                format!("{kind} {ns}/{name} is being deleted; the next pass makes it again"),
            )),
            Some(s) if s.hash.as_deref() != Some(hash.as_str()) => ops.push(op(
                apply(Some(s.uid.clone())),
                format!(
                    "{kind} {ns}/{name} was made with other settings ({} -> {hash}){waits}",
                    s.hash.as_deref().unwrap_or("no hash")
                ),
            )),
            Some(s) if object == ProxyObject::Pod && ended(s) => ops.push(op(
                apply(Some(s.uid.clone())),
                format!("Pod {ns}/{name} ended ({}){waits}", s.phase),
            )),
            Some(_) => {}
        }
    }
    ops
}

/// Why the proxy cannot run without `terminal.kubernetes_proxy_image`.
pub const NO_IMAGE: &str = "terminal.kubernetes_proxy_image is not set: with proxy.enabled, the egress proxy runs in the cluster from an image with `hermes` on its PATH (docs/kubernetes.md), and no sandbox Pod is made without it (fail closed)";

fn not_ours(object: ProxyObject, ns: &str, s: &SeenObject) -> String {
    format!(
        "a {} {ns}/{} that hermes did not make has the egress proxy's name; it is left alone",
        object.kind(),
        s.name
    )
}

fn ended(s: &SeenObject) -> bool {
    matches!(s.phase.as_str(), "Succeeded" | "Failed")
}

/// Why no sandbox Pod may be made, replaced or resumed now, given the
/// proxy's own operations `ops` of this plan; `None` when the proxy is
/// off (nothing to wait for) or up on the current settings and Ready.
pub fn sandboxes_wait(desired: &Desired, seen: &SeenProxy, ops: &[Op<Action>]) -> Option<String> {
    if !desired.config.proxy.enabled {
        return None;
    }
    let Some(wanted) = desired.kube_proxy() else {
        let why = match &desired.egress {
            Egress::NotSetUp { missing } => format!("not set up ({missing})"),
            Egress::Off | Egress::On { .. } => "not known yet".to_string(),
        };
        return Some(format!("the egress proxy is {why} (fail closed)"));
    };
    if let Some(blocked) = ops
        .iter()
        .find(|op| op.target == Target::Proxy && op.action == Action::Blocked)
    {
        return Some(format!("egress proxy: {} (fail closed)", blocked.cause));
    }
    let pod = wanted.object_name(ProxyObject::Pod);
    let ns = &wanted.namespace;
    if ops.iter().any(|op| op.target == Target::Proxy) {
        return Some(format!(
            "the egress proxy Pod {ns}/{pod} is not Ready on the current settings until this plan's proxy operations are done (fail closed)"
        ));
    }
    match seen.get(ProxyObject::Pod, &pod) {
        Some(p) if p.ready => None,
        Some(p) => Some(format!(
            "the egress proxy Pod {ns}/{pod} is not Ready ({}{}) (fail closed)",
            p.phase,
            p.waiting
                .as_deref()
                .map(|w| format!(": {w}"))
                .unwrap_or_default()
        )),
        None => Some(format!(
            "the egress proxy Pod {ns}/{pod} is not there (fail closed)"
        )),
    }
}

/// Makes `seen` what the proxy operations of `ops` leave behind: each
/// object applied on its wanted hash (the Pod Ready: its apply waits for
/// that), each deleted one gone. What the next stage waits for, in words;
/// `None` when `ops` touch no proxy object.
pub fn predict(seen: &mut SeenProxy, ops: &[Op<Action>]) -> Option<String> {
    let mut after = None;
    for op in ops {
        match &op.action {
            Action::Pod(PodAction::ApplyProxy { object, wanted, .. }) => {
                let name = wanted.object_name(*object);
                seen.objects
                    .retain(|(o, s)| !(o == object && s.name == name));
                seen.objects.push((*object, made(*object, wanted)));
                if *object == ProxyObject::Pod {
                    after = Some(format!(
                        "the egress proxy Pod {}/{name} is Ready",
                        wanted.namespace
                    ));
                }
            }
            Action::Pod(PodAction::DeleteProxy { object, name, .. }) => {
                seen.objects
                    .retain(|(o, s)| !(o == object && &s.name == name));
                after.get_or_insert_with(|| "the egress proxy's objects are gone".to_string());
            }
            _ => {}
        }
    }
    after
}

/// An object as its apply leaves it.
fn made(object: ProxyObject, wanted: &ProxyWanted) -> SeenObject {
    SeenObject {
        name: wanted.object_name(object),
        uid: format!("{}-to-be-made", wanted.object_name(object)),
        hash: Some(wanted.hash(object)),
        made_by_hermes: true,
        deleting: false,
        phase: "Running".to_string(),
        ready: true,
        waiting: None,
    }
}

#[cfg(test)]
mod tests;
