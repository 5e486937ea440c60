//! The Docker engine, through bollard.
//!
//! [`Engine`] is a cheap-to-clone handle on one engine. It reads the Docker
//! world ([`Engine::observe`], [`Engine::find`]), carries out the operations
//! of a plan, each idempotent so that a pass interrupted by `kill -9` is
//! finished by the next one ([`Engine::create`] answers
//! [`CreateOutcome::AlreadyExists`] on a name conflict, [`Engine::remove`]
//! counts a missing container as removed, [`Engine::start`] an already
//! running one as started), and runs commands inside sandboxes
//! ([`Engine::exec`]), streaming their output live and killing their whole
//! process tree on timeout.
//!
//! Nothing without the `hermes-agent=1` label is ever read into the
//! observed world. An engine scoped to a home ([`Engine::for_home`]) also
//! leaves out every container of another home ([`hermes_model::homes`]),
//! and [`Engine::find`] refuses one.

mod apply;
mod binds;
mod describe;
mod error;
mod events;
mod exec;
mod hostkill;
mod network;
mod observe;
mod runner;
mod top;
mod tty;
mod version;

use std::sync::Arc;

use bollard::{API_DEFAULT_VERSION, Docker};
use hermes_model::homes::HomeScope;

pub use crate::exec::{EXEC_ID_ENV, ExecOutcome, ExecRequest, TIMEOUT_EXIT_CODE};
pub use apply::{CreateOutcome, DeviceMapping, ImageOutcome, RemoveOutcome, parse_device};
pub use describe::Described;
pub use error::{
    DockerError, is_conflict, is_not_found, is_not_modified, is_not_running, server_message,
    status_code,
};
pub use events::ContainerEvent;
pub use exec::Container;
/// The watch over a command (`exec.rs`), which the kubernetes backend's
/// exec runs the same way.
#[cfg(feature = "kubernetes")]
pub(crate) use exec::watch_script;
pub use network::InternalNetwork;
pub use observe::parse_engine_time;
pub use runner::{is_runner_process, runner_dir, runner_host_dir};

/// Where `connect_with_defaults` looks when `DOCKER_HOST` is not set.
const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// bollard's request timeout, which `connect_with_defaults` sets.
const REQUEST_TIMEOUT_SECS: u64 = 120;

/// A handle on one Docker engine. Cloning is cheap: clones share the
/// connection pool.
#[derive(Debug, Clone)]
pub struct Engine {
    docker: Docker,
    host: Arc<str>,
    /// The home whose containers this handle sees; `None`: every labelled
    /// container.
    scope: Option<Arc<HomeScope>>,
}

impl Engine {
    /// Connects the way the Docker CLI does: `DOCKER_HOST` when set, the
    /// local socket otherwise, and negotiates the API version down to what
    /// the engine speaks (Debian's engine speaks 1.41, older than bollard's
    /// default). Negotiating is a request, so an engine that does not
    /// answer is an error here, naming the host that was tried.
    ///
    /// On a Unix socket the version comes from one `HEAD /_ping`, as the
    /// CLI reads it (well under a millisecond); elsewhere, or when the ping
    /// names no version, from bollard's `GET /version`, which costs the
    /// engine several milliseconds.
    pub async fn connect() -> Result<Engine, DockerError> {
        let host = docker_host();
        let connect_error = |error| DockerError::Connect {
            host: host.clone(),
            error,
        };
        let pinged = match host.strip_prefix("unix://") {
            Some(path) => version::ping_unix(path).await.map_err(connect_error)?,
            None => None,
        };
        let docker = match pinged {
            Some(server) => {
                let version = if server < *API_DEFAULT_VERSION {
                    server
                } else {
                    *API_DEFAULT_VERSION
                };
                Docker::connect_with_unix(&host, REQUEST_TIMEOUT_SECS, &version)
                    .map_err(connect_error)?
            }
            None => Docker::connect_with_defaults()
                .map_err(connect_error)?
                .negotiate_version()
                .await
                .map_err(connect_error)?,
        };
        Ok(Engine {
            docker,
            host: host.into(),
            scope: None,
        })
    }

    /// Wraps a client made elsewhere (with a request modifier, say). The
    /// host named in errors is `DOCKER_HOST`'s value or the local socket.
    pub fn from_docker(docker: Docker) -> Engine {
        Engine {
            docker,
            host: docker_host().into(),
            scope: None,
        }
    }

    /// This handle, seeing only the containers of `scope`'s home: the
    /// others are left out of every observation, and [`Engine::find`]
    /// refuses them ([`DockerError::OtherHome`]).
    pub fn for_home(mut self, scope: HomeScope) -> Engine {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// The home this handle is scoped to, if any.
    pub fn scope(&self) -> Option<&HomeScope> {
        self.scope.as_deref()
    }

    /// The bollard client underneath.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The address of the engine (`DOCKER_HOST` or the local socket).
    pub fn host(&self) -> &str {
        &self.host
    }
}

fn docker_host() -> String {
    // The same lookup as bollard's `connect_with_defaults`.
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| DEFAULT_HOST.to_string())
}
