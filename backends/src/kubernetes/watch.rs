//! Following the Pods hermes made between passes (the sandboxes' and the
//! egress proxy's): one watch by hermes's managed-by label (kube-runtime's
//! watcher, which lists, watches from the list's
//! resource version and, on `410 Gone` or a broken stream, lists again),
//! each change a planner would see reported to the caller (a command's
//! last-used mark is not one); failures back off exponentially,
//! except a refusal (401, 403, 404), which ends the watch: it is never
//! retried, and the caller's next pass says why.

use std::collections::HashMap;

use futures_util::StreamExt;
use hermes_model::kubernetes::{LABEL_MANAGED_BY, MANAGED_BY, SeenPod};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::observe::seen_pod;
use super::{Cluster, KubeError};

/// Follows the namespace's Pods hermes made, calling `changed` on every change
/// (and once after each full list, which may hide changes missed while
/// the watch was down), until the server refuses: that refusal.
pub async fn follow(cluster: &Cluster, mut changed: impl FnMut() + Send) -> KubeError {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let resource = format!("pods in namespace {}", cluster.namespace);
    let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    // What a planner sees of each Pod, by name: a write that leaves it as
    // it was (a command's last-used mark) wakes nothing.
    let mut known: HashMap<String, SeenPod> = HashMap::new();
    let mut listing: HashMap<String, SeenPod> = HashMap::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(p)) => {
                let seen = planned_view(&p);
                if known.get(&seen.name) != Some(&seen) {
                    known.insert(seen.name.clone(), seen);
                    changed();
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                known.remove(&p.metadata.name.clone().unwrap_or_default());
                changed();
            }
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(p)) => {
                let seen = planned_view(&p);
                listing.insert(seen.name.clone(), seen);
            }
            Ok(watcher::Event::InitDone) => {
                known = std::mem::take(&mut listing);
                changed();
            }
            Err(e) => {
                if let Some(refusal) = refusal(&e, &resource) {
                    return refusal;
                }
                // 410 Gone included: the watcher lists again after its
                // backoff.
                tracing::debug!(error = %e, "the pod watch failed; it resumes after a backoff");
            }
        }
    }
    KubeError::Unreachable {
        verb: "watch",
        resource,
        message: "the watch ended".to_string(),
    }
}

/// The Pod as a pass plans from it, less its last use (which the idle
/// reaper reads anew at each pass and at its delete).
fn planned_view(p: &Pod) -> SeenPod {
    SeenPod {
        last_used: None,
        ..seen_pod(p)
    }
}

/// A failure that asking again will not mend: the server said no.
fn refusal(e: &watcher::Error, resource: &str) -> Option<KubeError> {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    let verb = match e {
        watcher::Error::InitialListFailed(_) => "list",
        _ => "watch",
    };
    matches!(status.code, 401 | 403 | 404).then(|| KubeError::Refused {
        verb,
        resource: resource.to_string(),
        code: status.code,
        reason: status.reason.clone(),
        message: status.message.clone(),
    })
}
