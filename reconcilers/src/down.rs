//! `hermes down`: the plan that takes down everything hermes keeps
//! running for this home, in two stages. First every labelled container
//! of the profile (hermes's, Hermes Agent's, the sessions'), with the disk
//! images mounted for them; then, once no sandbox is attached, the
//! proxy-only network with its firewall chain, and the proxy daemon (on
//! kubernetes, the proxy's Pod).
//! Files stay: the data directories, the disk image files, `proxy/` and
//! config.yaml, so `hermes reconcile` brings it all back as it was.

use hermes_model::action::{Action, PodAction, ProxyAction, SandboxAction};
use hermes_model::kubernetes::KubeObserved;
use hermes_model::kubernetes::proxy::ProxyObject;

use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Plan, Stage, Staged, Target};

use crate::{HostPlan, StagedPlan, disks, reaping};

/// What the second stage waits for.
pub const AFTER: &str = "the sandboxes are gone";

/// The plan of `hermes down` for what `observed` holds; `backend`: the
/// operations on the backend's own world that its part of `down` planned
/// (a cloud sandbox suspended, a singularity instance stopped, a Pod
/// deleted: `crate::cloud::down`, `crate::singularity::down`,
/// `crate::kubernetes::down`), which go with the first stage.
pub fn plan(observed: &Observed, backend: Vec<Op<Action>>) -> StagedPlan {
    let mut sandboxes: Vec<Op<Action>> = observed
        .containers
        .iter()
        .map(|c| Op {
            changes: Vec::new(),
            target: reaping::target(c),
            action: Action::Sandbox(SandboxAction::Remove {
                id: c.id.clone(),
                name: c.name.clone(),
                disk: None,
            }),
            cause: if c.is_unclaimed_pool_member() {
                format!(
                    "hermes down: {} ({}), a warm-pool member no session claimed",
                    c.name,
                    c.state.as_str()
                )
            } else {
                format!(
                    "hermes down: {} ({}), its data kept{}",
                    c.name,
                    c.state.as_str(),
                    reaping::removal_cost(c)
                )
            },
        })
        .collect();
    disks::plan(observed, &mut sandboxes);
    sandboxes.extend(backend);
    let mut proxy = Vec::new();
    if let Some(net) = observed
        .proxy
        .network
        .as_ref()
        .filter(|n| n.exists || n.chain_exists)
    {
        proxy.push(Op {
            changes: Vec::new(),
            target: Target::Proxy,
            action: Action::Proxy(ProxyAction::RemoveNetwork),
            cause: format!(
                "hermes down: the proxy-only network {} and its firewall chain {}",
                net.name, net.chain
            ),
        });
    }
    if observed.proxy.running {
        proxy.push(Op {
            changes: Vec::new(),
            target: Target::Proxy,
            action: Action::Proxy(ProxyAction::Stop),
            cause: "hermes down: the proxy daemon (its files kept)".to_string(),
        });
    }
    // The kubernetes backend's proxy: its Pod (its Secret and the rest
    // kept, as the daemon's files are).
    if let Some(KubeObserved::Seen { proxy: seen, .. }) = &observed.kubernetes {
        for (object, s) in &seen.objects {
            if *object == ProxyObject::Pod && s.made_by_hermes && !s.deleting {
                proxy.push(Op {
                    changes: Vec::new(),
                    target: Target::Proxy,
                    action: Action::Pod(PodAction::DeleteProxy {
                        object: *object,
                        name: s.name.clone(),
                        uid: s.uid.clone(),
                    }),
                    cause: format!(
                        "hermes down: the egress proxy Pod {} (its Secret and the rest kept)",
                        s.name
                    ),
                });
            }
        }
    }
    let first: HostPlan = Plan::new(sandboxes);
    let mut later = Vec::new();
    if !proxy.is_empty() {
        later.push(Stage {
            after: AFTER.to_string(),
            plan: Plan::new(proxy),
        });
    }
    Staged { first, later }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use hermes_model::observed::{ContainerState, ObservedContainer, ProxyNetworkObserved};
    use hermes_model::plan::Describe;
    use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_TASK};

    use super::*;

    fn container(name: &str, state: ContainerState) -> ObservedContainer {
        let labels = BTreeMap::from([
            (LABEL_AGENT.to_string(), "1".to_string()),
            (LABEL_PROFILE.to_string(), "default".to_string()),
            (LABEL_TASK.to_string(), name.to_string()),
        ]);
        ObservedContainer {
            id: format!("id-{name}"),
            name: format!("hermes-default-{name}"),
            labels,
            state,
            created: 0,
            started_at: None,
            finished_at: None,
            processes: (state == ContainerState::Running).then_some(1),
            made_by_agent: None,
            adopted_hash: None,
        }
    }

    #[test]
    fn down_removes_every_sandbox_then_the_network_and_the_proxy() {
        let mut observed = Observed {
            containers: vec![
                container("a", ContainerState::Running),
                container("b", ContainerState::Exited),
            ],
            ..Observed::default()
        };
        observed.proxy.running = true;
        observed.proxy.network = Some(ProxyNetworkObserved {
            name: "hermes-egress-x".to_string(),
            exists: true,
            attached: vec!["id-a".to_string()],
            chain: "HERMES-x".to_string(),
            chain_exists: true,
        });
        let plan = plan(&observed, Vec::new());
        let text = plan.to_string();
        assert!(
            text.contains("- sandbox default/a   remove      hermes down: hermes-default-a (running), its data kept; waits up to 10s for the 1 process running in it, then stops it"),
            "{text}"
        );
        assert!(text.contains("- sandbox default/b   remove"), "{text}");
        assert_eq!(plan.later.len(), 1, "{text}");
        let second: Vec<&str> = plan.later[0]
            .plan
            .ops
            .iter()
            .map(|o| o.action.verb())
            .collect();
        assert_eq!(second.len(), 2, "{text}");
        // Nothing up: nothing to do.
        assert!(!super::plan(&Observed::default(), Vec::new()).is_pending());
    }
}
