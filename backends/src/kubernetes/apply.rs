//! Carrying out the planner's operations on the API server. Writes are
//! server-side applies with the field manager `hermes` (never forced: a
//! field another manager owns is a conflict, reported); deletes carry the
//! uid the pass saw as a precondition, so an object made again since is
//! never the one deleted.

use std::time::{Duration, Instant};

use hermes_model::action::PodAction;
use hermes_model::kubernetes::{
    ANNOTATION_LAST_USED, FIELD_MANAGER, GRACE_SECONDS, PodWanted, SandboxKind,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};

use super::observe::seen_pod;
use super::{CALL_TIMEOUT, Cluster, KubeError, PodExec, START_TIMEOUT, call, objects, sandbox};

/// How often a wait for a Pod looks again.
const POLL: Duration = Duration::from_millis(200);

/// Carries out one operation; `files` are what the proxy's Secret and CA
/// ConfigMap hold (needed only to apply those).
pub async fn apply(
    cluster: &Cluster,
    action: &PodAction,
    files: Option<&super::proxy::ProxyFiles>,
) -> Result<(), KubeError> {
    match action {
        PodAction::CreateClaim(wanted) => apply_claim(cluster, wanted).await,
        PodAction::Create(wanted) => match wanted.kind {
            SandboxKind::Pod => apply_pod(cluster, wanted).await,
            SandboxKind::AgentSandbox => sandbox::apply(cluster, wanted).await,
        },
        PodAction::Replace { wanted, uid } => {
            remove(cluster, &wanted.name, uid, wanted.kind).await?;
            match wanted.kind {
                SandboxKind::Pod => apply_pod(cluster, wanted).await,
                SandboxKind::AgentSandbox => sandbox::apply(cluster, wanted).await,
            }
        }
        // Gone when done: `hermes down` says nothing runs any more, and a
        // session's name may be used again at once.
        PodAction::Delete { name, uid, kind } => remove(cluster, name, uid, *kind).await,
        PodAction::DeleteIdle {
            name,
            uid,
            lifetime,
            kind,
        } => delete_if_idle(cluster, name, uid, *lifetime, *kind, None)
            .await
            .map(drop),
        PodAction::Suspend {
            name,
            uid,
            lifetime,
        } => suspend_if_idle(cluster, name, uid, *lifetime, None)
            .await
            .map(drop),
        PodAction::Resume { wanted, uid } => {
            sandbox::set_mode(cluster, &wanted.name, uid, "Running").await
        }
        PodAction::ApplyProxy {
            object,
            wanted,
            existing,
        } => super::proxy::apply(cluster, *object, wanted, existing.as_deref(), files).await,
        PodAction::DeleteProxy { object, name, uid } => {
            super::proxy::delete(cluster, *object, name, uid).await
        }
    }
}

/// Deletes the Pod, or the Sandbox, `name` of `uid` and waits until it is
/// gone (a Sandbox with its Pod).
async fn remove(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    kind: SandboxKind,
) -> Result<(), KubeError> {
    match kind {
        SandboxKind::Pod => {
            delete_pod(cluster, name, uid).await?;
            wait_gone(cluster, name, uid).await
        }
        SandboxKind::AgentSandbox => {
            sandbox::delete(cluster, name, uid).await?;
            sandbox::wait_gone(cluster, name, uid).await
        }
    }
}

/// What became of an idle reaper's delete or suspension
/// ([`delete_if_idle`], [`suspend_if_idle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reaped {
    /// Carried out: deleted (and gone), or suspended.
    Done,
    /// Gone already, or made again since (another uid): nothing done.
    Gone,
    /// Not idle any more: why it was kept.
    Kept(String),
}

/// The idle reaper's delete, decided again at the moment it is carried
/// out: the Pod read anew, its last use (its [`ANNOTATION_LAST_USED`], or
/// `recorded`, this host's record, when later) and what runs in it looked
/// at, and the delete sent with that read's uid *and* resource version
/// as its precondition. A command marks the Pod (a write, so a new
/// resource version) before it starts, so one that started after that
/// read makes the delete fail with a conflict: the Pod is kept.
///
/// A `Sandbox` (`kind`) is looked at through its Pod the same way and
/// deleted by its own uid: a command marks the Pod, not the Sandbox, so
/// there the guard is the look itself, a moment before the delete.
pub async fn delete_if_idle(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    lifetime: i64,
    kind: SandboxKind,
    recorded: Option<i64>,
) -> Result<Reaped, KubeError> {
    let p = match still_idle(cluster, name, uid, lifetime, kind, recorded).await? {
        Ok(p) => p,
        Err(other) => return Ok(other),
    };
    if kind == SandboxKind::AgentSandbox {
        remove(cluster, name, uid, kind).await?;
        return Ok(Reaped::Done);
    }
    match send_delete(cluster, name, uid, p.metadata.resource_version.clone()).await {
        Ok(()) => {}
        Err(e) if e.code() == Some(404) => return Ok(Reaped::Gone),
        Err(e) if e.code() == Some(409) => {
            return Ok(Reaped::Kept(
                "it changed since it was looked at (a command marked it in use)".to_string(),
            ));
        }
        Err(e) => return Err(e),
    }
    wait_gone(cluster, name, uid).await?;
    Ok(Reaped::Done)
}

/// The idle reaper's suspension of a Sandbox, decided again as
/// [`delete_if_idle`] decides a Sandbox's delete.
pub async fn suspend_if_idle(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    lifetime: i64,
    recorded: Option<i64>,
) -> Result<Reaped, KubeError> {
    match still_idle(
        cluster,
        name,
        uid,
        lifetime,
        SandboxKind::AgentSandbox,
        recorded,
    )
    .await?
    {
        Ok(_) => {
            sandbox::set_mode(cluster, name, uid, "Suspended").await?;
            Ok(Reaped::Done)
        }
        Err(other) => Ok(other),
    }
}

/// The Pod `name` read anew, if the sandbox (`uid`: the Pod's, or its
/// Sandbox's) is still there and still idle: nothing used it for
/// `lifetime` seconds (its annotation, or `recorded` when later) and
/// nothing runs in it. Else what to say instead.
async fn still_idle(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    lifetime: i64,
    kind: SandboxKind,
    recorded: Option<i64>,
) -> Result<Result<Pod, Reaped>, KubeError> {
    let ns = &cluster.namespace;
    if kind == SandboxKind::AgentSandbox {
        match sandbox::get(cluster, name).await? {
            Some(s) if s.uid == uid && !s.deleting => {}
            _ => return Ok(Err(Reaped::Gone)),
        }
    }
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let Some(p) = call("get", format!("pod {ns}/{name}"), api.get_opt(name)).await? else {
        return Ok(Err(Reaped::Gone));
    };
    let mut seen = seen_pod(&p);
    if (kind == SandboxKind::Pod && seen.uid != uid) || seen.deleting {
        return Ok(Err(Reaped::Gone));
    }
    seen.last_used = seen.last_used.max(recorded);
    let now = hermes_model::unix_seconds(std::time::SystemTime::now());
    if let Some(t) = seen.unused_since() {
        let idle = now.saturating_sub(t);
        if idle <= lifetime {
            return Ok(Err(Reaped::Kept(format!(
                "used {idle} s ago, since the plan looked (terminal.lifetime_seconds: {lifetime})"
            ))));
        }
    }
    let kept = match PodExec::new(cluster.clone(), name, Vec::new())
        .count_processes()
        .await
    {
        Some(0) => return Ok(Ok(p)),
        Some(n) => format!("{n} process(es) run in it now, since the plan looked"),
        None => "what runs in it cannot be told now".to_string(),
    };
    Ok(Err(Reaped::Kept(kept)))
}

/// Marks the Pod `name` in use now ([`ANNOTATION_LAST_USED`]), as a
/// command starts and ends in it: an error when it is gone or on its way
/// out (its delete already sent), so that no command starts in a Pod
/// that is going.
pub async fn mark_used(cluster: &Cluster, name: &str) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let now = hermes_model::unix_seconds(std::time::SystemTime::now()).to_string();
    let patch = serde_json::json!({
        "metadata": { "annotations": { ANNOTATION_LAST_USED: now } }
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let p = match call(
        "patch",
        format!("pod {ns}/{name}"),
        api.patch(name, &params, &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(p) => p,
        Err(e) if e.code() == Some(404) => {
            return Err(KubeError::Pod {
                pod: format!("{ns}/{name}"),
                message: "is gone; run the command again to get a new one".to_string(),
            });
        }
        Err(e) => return Err(e),
    };
    if p.metadata.deletion_timestamp.is_some() {
        return Err(KubeError::Pod {
            pod: format!("{ns}/{name}"),
            message: "is being deleted; run the command again to get a new one".to_string(),
        });
    }
    Ok(())
}

fn params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER)
}

async fn apply_claim(cluster: &Cluster, wanted: &PodWanted) -> Result<(), KubeError> {
    let Some(claim) = objects::claim(wanted) else {
        return Ok(());
    };
    let ns = &cluster.namespace;
    let name = wanted.claim.as_deref().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    call(
        "apply",
        format!("persistentvolumeclaim {ns}/{name}"),
        api.patch(name, &params(), &Patch::Apply(&claim)),
    )
    .await
    .map(drop)
}

async fn apply_pod(cluster: &Cluster, wanted: &PodWanted) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    call(
        "apply",
        format!("pod {ns}/{}", wanted.name),
        api.patch(
            &wanted.name,
            &params(),
            &Patch::Apply(&objects::pod(wanted)),
        ),
    )
    .await
    .map(drop)
}

/// Deletes the Pod `name` if it is still the one with `uid`; one already
/// gone is no error.
pub async fn delete_pod(cluster: &Cluster, name: &str, uid: &str) -> Result<(), KubeError> {
    match send_delete(cluster, name, uid, None).await {
        Err(e) if e.code() == Some(404) => Ok(()),
        other => other,
    }
}

/// Deletes the Pod `name` with its grace, on the precondition that it is
/// the one of `uid` (and, given, of `resource_version`): a 404 or 409 is
/// the caller's to read.
async fn send_delete(
    cluster: &Cluster,
    name: &str,
    uid: &str,
    resource_version: Option<String>,
) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: u32::try_from(GRACE_SECONDS).ok(),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version,
        }),
        ..DeleteParams::default()
    };
    call("delete", format!("pod {ns}/{name}"), api.delete(name, &dp))
        .await
        .map(drop)
}

/// Waits until the Pod `name` with `uid` is gone (its grace and a little
/// more), so that the one made next takes the name.
pub async fn wait_gone(cluster: &Cluster, name: &str, uid: &str) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let limit = Duration::from_secs(u64::try_from(GRACE_SECONDS).unwrap_or(10)) + CALL_TIMEOUT;
    let start = Instant::now();
    loop {
        let got = call("get", format!("pod {ns}/{name}"), api.get_opt(name)).await?;
        match got {
            None => return Ok(()),
            Some(p) if p.metadata.uid.as_deref() != Some(uid) => return Ok(()),
            Some(_) => {}
        }
        if start.elapsed() > limit {
            return Err(KubeError::Pod {
                pod: format!("{ns}/{name}"),
                message: format!(
                    "still there {} s after its delete",
                    start.elapsed().as_secs()
                ),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the Pod of `wanted` runs and is ready, within
/// [`START_TIMEOUT`] (a Sandbox's Pod until its controller made it); a container that cannot start (its image missing,
/// say) or a Pod that ended is an error at once.
pub async fn ensure_running(cluster: &Cluster, wanted: &PodWanted) -> Result<(), KubeError> {
    wait_ready(cluster, &wanted.name, wanted.kind).await
}

/// Waits until the Pod `name` runs and is ready, as [`ensure_running`]
/// says; `kind` says who makes it (a Sandbox's controller may not have
/// yet).
pub(super) async fn wait_ready(
    cluster: &Cluster,
    name: &str,
    kind: SandboxKind,
) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let start = Instant::now();
    let pod = format!("{ns}/{name}");
    loop {
        let got = call("get", format!("pod {pod}"), api.get_opt(name)).await?;
        let Some(p) = got else {
            // A Sandbox's Pod is its controller's to make.
            if kind == SandboxKind::AgentSandbox && start.elapsed() <= START_TIMEOUT {
                tokio::time::sleep(POLL).await;
                continue;
            }
            return Err(KubeError::Pod {
                pod,
                message: if kind == SandboxKind::AgentSandbox {
                    format!(
                        "not made by agent-sandbox's controller within {} s (is the controller running?)",
                        START_TIMEOUT.as_secs()
                    )
                } else {
                    "is gone".to_string()
                },
            });
        };
        let seen = seen_pod(&p);
        if seen.phase == "Running" && seen.ready {
            return Ok(());
        }
        if matches!(seen.phase.as_str(), "Succeeded" | "Failed") || seen.deleting {
            return Err(KubeError::Pod {
                pod,
                message: format!(
                    "{}; `hermes reconcile` makes it again",
                    if seen.deleting {
                        "is being deleted".to_string()
                    } else {
                        format!("ended ({})", seen.phase)
                    }
                ),
            });
        }
        if let Some(why) = seen.waiting.as_deref().filter(|w| {
            w.contains("ErrImagePull")
                || w.contains("ImagePullBackOff")
                || w.contains("InvalidImageName")
                || w.contains("CreateContainerConfigError")
                || w.contains("CrashLoopBackOff")
        }) {
            return Err(KubeError::Pod {
                pod,
                message: format!("its container cannot start: {why}"),
            });
        }
        if start.elapsed() > START_TIMEOUT {
            return Err(KubeError::Pod {
                pod,
                message: format!(
                    "not running after {} s (phase {}{})",
                    START_TIMEOUT.as_secs(),
                    seen.phase,
                    seen.waiting.map(|w| format!(", {w}")).unwrap_or_default()
                ),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
