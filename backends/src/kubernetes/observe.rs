//! What a pass sees in the namespace: the Pods and claims hermes labelled
//! (one list each, by label selector), which kind holds a sandbox (API
//! discovery: agent-sandbox's `Sandbox` where served, with those of its
//! objects hermes labelled), and any object holding a wanted
//! sandbox's name without hermes's labels (a get by name), so that the
//! planner can leave it alone by name. Only reads.

use std::collections::BTreeMap;

use hermes_model::kubernetes::proxy::{ProxyWanted, SeenProxy};
use hermes_model::kubernetes::{
    ALL_SELECTOR, ANNOTATION_LAST_USED, CONTAINER, KubeObserved, PodWanted, SANDBOX_GROUP,
    SandboxKind, SeenClaim, SeenPod,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};

use super::{Cluster, KubeError, call};

/// The namespace's sandbox objects, with those named like `wanted`, and
/// the objects of the egress proxy of the home `home` (with those named
/// like `proxy`'s).
pub async fn observe(
    cluster: &Cluster,
    wanted: &[PodWanted],
    home: Option<&str>,
    proxy: Option<&ProxyWanted>,
) -> KubeObserved {
    let seen = async {
        let (mut seen, found) = tokio::try_join!(look(cluster, ALL_SELECTOR, wanted), async {
            match (home, proxy) {
                (Some(home), Some(_)) => super::proxy::observe(cluster, home, proxy).await,
                // Not wanted: only looked for to remove what is left, and a
                // service account without the proxy's verbs (the proxy
                // never on) loses nothing by not seeing it.
                (Some(home), None) => match super::proxy::observe(cluster, home, None).await {
                    Err(e @ KubeError::Refused { .. }) => {
                        tracing::debug!(error = %e, "the egress proxy's objects cannot be listed");
                        Ok(SeenProxy::default())
                    }
                    other => other,
                },
                (None, _) => Ok(SeenProxy::default()),
            }
        })?;
        if let KubeObserved::Seen { proxy, .. } = &mut seen {
            *proxy = found;
        }
        Ok::<_, KubeError>(seen)
    };
    match seen.await {
        Ok(seen) => seen,
        Err(e) => KubeObserved::Unavailable {
            reason: e.to_string(),
        },
    }
}

/// The objects of one sandbox key (and those named like it).
pub async fn observe_key(cluster: &Cluster, wanted: &PodWanted) -> Result<KubeObserved, KubeError> {
    look(
        cluster,
        &hermes_model::kubernetes::selector_of(&wanted.key),
        std::slice::from_ref(wanted),
    )
    .await
}

async fn look(
    cluster: &Cluster,
    selector: &str,
    wanted: &[PodWanted],
) -> Result<KubeObserved, KubeError> {
    let ns = &cluster.namespace;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let lp = ListParams::default().labels(selector);
    // The kind asked at once with the lists: one round trip, not two.
    let (pod_list, claim_list, served) = tokio::try_join!(
        call("list", format!("pods in namespace {ns}"), pods.list(&lp)),
        call(
            "list",
            format!("persistentvolumeclaims in namespace {ns}"),
            claims.list(&lp)
        ),
        super::sandbox::served(cluster),
    )?;
    let kind = if served {
        SandboxKind::AgentSandbox
    } else {
        SandboxKind::Pod
    };
    let mut sandboxes = match kind {
        SandboxKind::AgentSandbox => super::sandbox::list(cluster, selector).await?,
        SandboxKind::Pod => Vec::new(),
    };
    let mut seen_pods: Vec<SeenPod> = pod_list.items.iter().map(seen_pod).collect();
    let mut seen_claims: Vec<SeenClaim> = claim_list.items.iter().map(seen_claim).collect();
    for w in wanted {
        if kind == SandboxKind::AgentSandbox && !sandboxes.iter().any(|s| s.name == w.name) {
            sandboxes.extend(super::sandbox::get(cluster, &w.name).await?);
        }
        if !seen_pods.iter().any(|p| p.name == w.name) {
            let got = call("get", format!("pod {ns}/{}", w.name), pods.get_opt(&w.name)).await?;
            seen_pods.extend(got.as_ref().map(seen_pod));
        }
        if let Some(c) = &w.claim
            && !seen_claims.iter().any(|s| &s.name == c)
        {
            let got = call(
                "get",
                format!("persistentvolumeclaim {ns}/{c}"),
                claims.get_opt(c),
            )
            .await?;
            seen_claims.extend(got.as_ref().map(seen_claim));
        }
    }
    Ok(KubeObserved::Seen {
        kind,
        pods: seen_pods,
        claims: seen_claims,
        sandboxes,
        proxy: SeenProxy::default(),
    })
}

fn labels(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// A Pod as the planner sees it.
pub fn seen_pod(p: &Pod) -> SeenPod {
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        // The sandbox's container; a Pod of one other container (the
        // egress proxy's), that one.
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.name == CONTAINER)
                .or_else(|| cs.first().filter(|_| cs.len() == 1))
        })
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .map(|w| match &w.message {
            Some(m) => format!("{}: {m}", w.reason.as_deref().unwrap_or("waiting")),
            None => w.reason.clone().unwrap_or_else(|| "waiting".to_string()),
        });
    SeenPod {
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        labels: labels(&p.metadata),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_string()),
        ready,
        deleting: p.metadata.deletion_timestamp.is_some(),
        waiting,
        started_at: status
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0.as_second()),
        // Written by hermes's own commands (a sandbox holds no token that
        // could write it); nonsense reads as no use.
        last_used: p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_LAST_USED))
            .and_then(|v| v.parse::<i64>().ok()),
        processes: None,
        of_sandbox: p.metadata.owner_references.as_ref().is_some_and(|refs| {
            refs.iter().any(|r| {
                r.controller == Some(true)
                    && r.kind == "Sandbox"
                    && r.api_version.starts_with(&format!("{SANDBOX_GROUP}/"))
            })
        }),
    }
}

fn seen_claim(c: &PersistentVolumeClaim) -> SeenClaim {
    SeenClaim {
        name: c.metadata.name.clone().unwrap_or_default(),
        uid: c.metadata.uid.clone().unwrap_or_default(),
        labels: labels(&c.metadata),
        phase: c
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_string()),
        deleting: c.metadata.deletion_timestamp.is_some(),
    }
}
