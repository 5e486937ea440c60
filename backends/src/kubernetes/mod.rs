//! The kubernetes backend: hermes's sandboxes as objects of one namespace
//! of an API server, through kube-rs.
//!
//! - [`Cluster::connect`]: a kubeconfig (its context) or the Pod's own
//!   service account; every call is bounded ([`CALL_TIMEOUT`]), and the
//!   client retries 429, 503 and 504 honouring `Retry-After` (kube-rs's
//!   default policy) within that bound. A refusal (403) is an error naming
//!   the verb and the resource, never retried.
//! - `observe.rs`: the sandbox Pods and claims, listed by label.
//! - `apply.rs`: server-side apply with the field manager `hermes`;
//!   deletes with a uid precondition.
//! - `objects.rs`: the Pod and claim of a wanted sandbox.
//! - `exec.rs`: a command in a Pod through its `exec` subresource
//!   (WebSocket), with the terminal contract of every backend.
//! - `sandbox.rs`: agent-sandbox's `Sandbox`, where the cluster serves it.
//! - `proxy.rs`: the egress proxy's objects (Secret, CA ConfigMap,
//!   Service, NetworkPolicies, Pod).
//! - `watch.rs`: the Pods followed between a controller's passes.

mod apply;
mod exec;
pub mod objects;
mod observe;
pub mod proxy;
pub mod sandbox;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use apply::{
    Reaped, apply, delete_if_idle, delete_pod, ensure_running, mark_used, suspend_if_idle,
    wait_gone,
};
pub use exec::PodExec;
pub use observe::{observe, observe_key};
pub use watch::follow;

/// The longest one API call (a list, an apply, a delete) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a Pod hermes made may take to run before an exec gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the client's settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A kubeconfig file and, optionally, one of its contexts.
    Kubeconfig {
        path: PathBuf,
        context: Option<String>,
    },
    /// The service account of the Pod this process runs in.
    InCluster,
}

/// What went wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    /// The server answered with a failure status.
    #[error("the API server refused to {verb} {resource}: {message} ({code} {reason})")]
    Refused {
        verb: &'static str,
        resource: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("cannot {verb} {resource}: {message}")]
    Unreachable {
        verb: &'static str,
        resource: String,
        message: String,
    },
    #[error("{verb} {resource} took longer than {} s", .after.as_secs())]
    Timeout {
        verb: &'static str,
        resource: String,
        after: Duration,
    },
    #[error("Pod {pod}: {message}")]
    Pod { pod: String, message: String },
    #[error("exec in Pod {pod}: {message}")]
    Exec { pod: String, message: String },
    #[error("exec in Pod {pod}: {source}")]
    Io {
        pod: String,
        #[source]
        source: std::io::Error,
    },
}

impl KubeError {
    /// The HTTP status of a refusal.
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn of(verb: &'static str, resource: impl Into<String>, e: kube::Error) -> KubeError {
        let resource = resource.into();
        match e {
            kube::Error::Api(status) => KubeError::Refused {
                verb,
                resource,
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
            },
            other => KubeError::Unreachable {
                verb,
                resource,
                message: other.to_string(),
            },
        }
    }
}

/// Runs one API call within [`CALL_TIMEOUT`], its error named by `verb`
/// and `resource`.
pub(crate) async fn call<T>(
    verb: &'static str,
    resource: impl Into<String>,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    let resource = resource.into();
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeError::of(verb, resource, e)),
        Err(_) => Err(KubeError::Timeout {
            verb,
            resource,
            after: CALL_TIMEOUT,
        }),
    }
}

/// A client of one namespace.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    pub namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A client of `namespace` from `source`. Reads files only; nothing
    /// is asked of the server yet.
    pub async fn connect(source: &Source, namespace: &str) -> Result<Cluster, KubeError> {
        let config = match source {
            Source::Kubeconfig { path, context } => {
                let shown = path.display().to_string();
                let kubeconfig =
                    Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig {
                        path: shown.clone(),
                        message: e.to_string(),
                    })?;
                let options = KubeConfigOptions {
                    context: context.clone(),
                    ..KubeConfigOptions::default()
                };
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| KubeError::Kubeconfig {
                        path: shown,
                        message: e.to_string(),
                    })?
            }
            Source::InCluster => {
                kube::Config::incluster().map_err(|e| KubeError::InCluster(e.to_string()))?
            }
        };
        let client = Client::try_from(config).map_err(|e| KubeError::Unreachable {
            verb: "connect to",
            resource: "the API server".to_string(),
            message: e.to_string(),
        })?;
        Ok(Cluster {
            client,
            namespace: namespace.to_string(),
        })
    }
}
