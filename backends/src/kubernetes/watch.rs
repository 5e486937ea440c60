//! Following the sandbox Pods between passes: one watch by hermes's label
//! selector (kube-runtime's watcher, which lists, watches from the list's
//! resource version and, on `410 Gone` or a broken stream, lists again),
//! each change reported to the caller; failures back off exponentially,
//! except a refusal (401, 403, 404), which ends the watch: it is never
//! retried, and the caller's next pass says why.

use futures_util::StreamExt;
use hermes_model::kubernetes::ALL_SELECTOR;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Cluster, KubeError};

/// Follows the namespace's sandbox Pods, calling `changed` on every change
/// (and once after each full list, which may hide changes missed while
/// the watch was down), until the server refuses: that refusal.
pub async fn follow(cluster: &Cluster, mut changed: impl FnMut() + Send) -> KubeError {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let resource = format!("pods in namespace {}", cluster.namespace);
    let config = watcher::Config::default().labels(ALL_SELECTOR);
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                changed();
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
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
