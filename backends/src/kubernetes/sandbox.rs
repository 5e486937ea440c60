//! agent-sandbox's `Sandbox` (`agents.x-k8s.io/v1beta1`), where the
//! cluster serves it: whether it does (API discovery), the Sandbox objects
//! hermes labelled, the Sandbox of a wanted sandbox (its Pod template
//! the very Pod hermes would make itself, its claim hermes's own, so that
//! data outlives any Sandbox), and its writes: server-side apply, deletes
//! by uid in the foreground (the Sandbox stays until its Pod is gone, so
//! the next one made under the name never meets the old Pod), and the
//! suspension (`operatingMode: Suspended`: its controller deletes the Pod
//! and keeps the claims).

use hermes_model::kubernetes::{
    FIELD_MANAGER, GRACE_SECONDS, PodWanted, SANDBOX_GROUP, SANDBOX_VERSION, SeenSandbox,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::{Cluster, KubeError, call, objects};

/// The API resource of the `Sandbox` kind.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(SANDBOX_GROUP, SANDBOX_VERSION, "Sandbox"),
        "sandboxes",
    )
}

fn api(cluster: &Cluster) -> Api<DynamicObject> {
    Api::namespaced_with(cluster.client.clone(), &cluster.namespace, &resource())
}

/// Whether the server serves `agents.x-k8s.io/v1beta1` `sandboxes`: a
/// 404 of the group version is no; another failure is an error (a pass
/// never guesses the kind).
pub async fn served(cluster: &Cluster) -> Result<bool, KubeError> {
    let gv = format!("{SANDBOX_GROUP}/{SANDBOX_VERSION}");
    match call(
        "discover",
        format!("API group version {gv}"),
        cluster.client.list_api_group_resources(&gv),
    )
    .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "sandboxes")),
        Err(e) if e.code() == Some(404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The Sandboxes of `selector` in the namespace.
pub async fn list(cluster: &Cluster, selector: &str) -> Result<Vec<SeenSandbox>, KubeError> {
    let ns = &cluster.namespace;
    let lp = kube::api::ListParams::default().labels(selector);
    let got = call(
        "list",
        format!("sandboxes.{SANDBOX_GROUP} in namespace {ns}"),
        api(cluster).list(&lp),
    )
    .await?;
    Ok(got.items.iter().map(seen).collect())
}

/// The Sandbox `name`, if there is one.
pub async fn get(cluster: &Cluster, name: &str) -> Result<Option<SeenSandbox>, KubeError> {
    let ns = &cluster.namespace;
    let got = call(
        "get",
        format!("sandbox.{SANDBOX_GROUP} {ns}/{name}"),
        api(cluster).get_opt(name),
    )
    .await?;
    Ok(got.as_ref().map(seen))
}

fn seen(o: &DynamicObject) -> SeenSandbox {
    SeenSandbox {
        name: o.metadata.name.clone().unwrap_or_default(),
        uid: o.metadata.uid.clone().unwrap_or_default(),
        labels: o.metadata.labels.clone().unwrap_or_default(),
        suspended: o.data["spec"]["operatingMode"].as_str() == Some("Suspended"),
        deleting: o.metadata.deletion_timestamp.is_some(),
    }
}

/// The Sandbox of `wanted`, running: its labels hermes's, its Pod
/// template the Pod hermes would make (same labels, same hardened spec).
pub fn object(wanted: &PodWanted) -> serde_json::Value {
    let pod = objects::pod(wanted);
    json!({
        "apiVersion": format!("{SANDBOX_GROUP}/{SANDBOX_VERSION}"),
        "kind": "Sandbox",
        "metadata": {
            "name": wanted.name,
            "namespace": wanted.namespace,
            "labels": wanted.labels,
        },
        "spec": {
            "operatingMode": "Running",
            "podTemplate": {
                "metadata": { "labels": wanted.labels },
                "spec": pod.spec,
            },
        },
    })
}

/// Makes the Sandbox of `wanted` (server-side apply of the whole object,
/// running). Only a new Sandbox is applied: a replacement deletes first.
pub async fn apply(cluster: &Cluster, wanted: &PodWanted) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    call(
        "apply",
        format!("sandbox.{SANDBOX_GROUP} {ns}/{}", wanted.name),
        api(cluster).patch(
            &wanted.name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&object(wanted)),
        ),
    )
    .await
    .map(drop)
}

/// Deletes the Sandbox `name` if it is still the one with `uid`, in the
/// foreground (it stays, deleting, until its Pod is gone); one already
/// gone is no error.
pub async fn delete(cluster: &Cluster, name: &str, uid: &str) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let dp = DeleteParams {
        grace_period_seconds: u32::try_from(GRACE_SECONDS).ok(),
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match call(
        "delete",
        format!("sandbox.{SANDBOX_GROUP} {ns}/{name}"),
        api(cluster).delete(name, &dp),
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(404) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Waits until the Sandbox `name` with `uid` is gone (with its Pod, as
/// the foreground delete holds it until then).
pub async fn wait_gone(cluster: &Cluster, name: &str, uid: &str) -> Result<(), KubeError> {
    let limit = std::time::Duration::from_secs(u64::try_from(GRACE_SECONDS).unwrap_or(10))
        + 2 * super::CALL_TIMEOUT;
    let start = std::time::Instant::now();
    loop {
        match get(cluster, name).await? {
            None => return Ok(()),
            Some(s) if s.uid != uid => return Ok(()),
            Some(_) => {}
        }
        if start.elapsed() > limit {
            return Err(KubeError::Pod {
                pod: format!("{}/{name}", cluster.namespace),
                message: format!(
                    "its Sandbox is still there {} s after its delete",
                    start.elapsed().as_secs()
                ),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Sets the `operatingMode` of the Sandbox `name` (`Suspended`: its
/// controller deletes the Pod, the claims stay; `Running`: it makes the
/// Pod again), if it is still the one with `uid` (the uid in the patch is
/// the server's precondition). A merge patch of that one field, so the
/// rest of what hermes applied stays as it was.
pub async fn set_mode(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    mode: &str,
) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let patch = json!({
        "metadata": { "uid": uid },
        "spec": { "operatingMode": mode },
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    call(
        "patch",
        format!("sandbox.{SANDBOX_GROUP} {ns}/{name}"),
        api(cluster).patch(name, &params, &Patch::Merge(&patch)),
    )
    .await
    .map(drop)
}
