//! What can go wrong talking to the engine, and how bollard's errors are
//! classified (404 not found, 409 conflict).

use std::path::PathBuf;

use bollard::errors::Error as BollardError;

/// An error of the Docker backend. Every message names the container,
/// image or host involved.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The engine did not answer at `host` (`DOCKER_HOST`, or the local
    /// socket). The message names the cause once (the innermost of
    /// bollard's chain) and what to check.
    #[error(
        "cannot reach the Docker engine at {host}: {}; {UNREACHABLE_HINT}",
        root_cause(error)
    )]
    Connect { host: String, error: BollardError },

    /// The container does not exist ("No such container") or is not
    /// running: the caller may recreate it and retry once.
    #[error("container {container} is gone: {reason}")]
    Gone { container: String, reason: String },

    /// A container has the name of a sandbox but not the `hermes-agent=1`
    /// label: hermes does not touch it.
    #[error(
        "container {container} exists but is not labelled hermes-agent=1; hermes leaves it alone"
    )]
    Foreign { container: String },

    /// A container has the name of a sandbox but belongs to another hermes
    /// home (its `hermes-home` label, or its bind mounts without one):
    /// hermes neither adopts nor replaces it.
    #[error(
        "container {container} is not this home's: {why}; hermes leaves it alone (use another profile name here, or remove it from its own home)"
    )]
    OtherHome { container: String, why: String },

    /// Creating a sandbox met a container of its name built from another
    /// spec (one another hermes process is replacing, or a stale one):
    /// the create is not done.
    #[error(
        "container {container} exists with spec hash {found}, not {wanted}: another hermes process is replacing it, or made it from another config; try again"
    )]
    NameTaken {
        container: String,
        found: String,
        wanted: String,
    },

    /// Another process's removal of the container did not finish in time.
    #[error(
        "container {container} is being removed by another hermes process and was still there after {}s; try again",
        waited.as_secs()
    )]
    StillRemoving {
        container: String,
        waited: std::time::Duration,
    },

    /// An exec started, but its container went away (or the engine lost the
    /// exec) before it finished: the command may have run in part, so this
    /// is not [`DockerError::Gone`].
    #[error("exec in container {container} was interrupted: {reason}")]
    Interrupted { container: String, reason: String },

    /// The caller asked to stop (an interrupted `hermes reconcile`) while
    /// an operation waited, before it changed anything.
    #[error("{what} of container {container} cancelled before anything changed")]
    Cancelled { container: String, what: String },

    /// A command could not be started (no such program, no such working
    /// directory): nothing ran.
    #[error("cannot start the command in container {container}: {message}")]
    NotStarted { container: String, message: String },

    /// The image is not there and pulling it failed.
    #[error("cannot pull image {image}: {message}")]
    Pull { image: String, message: String },

    /// The spec cannot be expressed to the engine (a bad device mapping,
    /// say).
    #[error("invalid spec for container {container}: {message}")]
    InvalidSpec { container: String, message: String },

    /// A directory a bind mount needs could not be made on the host.
    #[error("cannot create {path} on the host for container {container}: {source}")]
    HostDir {
        container: String,
        path: PathBuf,
        #[source]
        source: crate::host_dir::HostDirError,
    },

    /// Writing an exec's output to the caller's writer failed.
    #[error("cannot write the output of an exec in container {container}: {source}")]
    Output {
        container: String,
        #[source]
        source: std::io::Error,
    },

    /// A network has the name of the proxy's internal network but is not
    /// one hermes made: hermes does not touch it.
    #[error("network {network} exists but {reason}; remove it or turn proxy.enforce_network off")]
    ForeignNetwork { network: String, reason: String },

    /// A step on the host's own files for a sandbox failed (its data
    /// moved to another layout, its adoption recorded): what and why.
    #[error("sandbox {container}: {message}")]
    HostFiles { container: String, message: String },

    /// Any other answer of the engine: `action` on `target` failed (the
    /// engine's own message, or, when it could not be reached, the cause
    /// once and what to check).
    #[error("{action} {target}: {}", engine_cause(error))]
    Engine {
        action: &'static str,
        target: String,
        error: BollardError,
    },
}

/// What to check when the engine cannot be reached.
pub const UNREACHABLE_HINT: &str = "is dockerd running, and is DOCKER_HOST right?";

/// The innermost message of an error's chain: what actually failed
/// (`No such file or directory (os error 2)`), without the layers that
/// repeat it (`error in the hyper legacy client: client error (Connect):
/// …`).
pub fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error;
    while let Some(next) = innermost.source() {
        innermost = next;
    }
    innermost.to_string()
}

/// Whether the engine was never reached: the request did not get an
/// answer (no socket, connection refused or reset, a timeout), as opposed
/// to an answer that is an error.
pub fn is_unreachable(error: &BollardError) -> bool {
    matches!(
        error,
        BollardError::HyperResponseError { .. }
            | BollardError::HyperLegacyError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError
            | BollardError::SocketNotFoundError(_)
    )
}

fn engine_cause(error: &BollardError) -> String {
    if is_unreachable(error) {
        format!(
            "cannot reach the Docker engine: {}; {UNREACHABLE_HINT}",
            root_cause(error)
        )
    } else {
        error.to_string()
    }
}

impl DockerError {
    /// Wraps an engine error of `action` on `target`.
    pub(crate) fn engine(action: &'static str, target: &str, source: BollardError) -> DockerError {
        DockerError::Engine {
            action,
            target: target.to_string(),
            error: source,
        }
    }

    /// Whether the container was gone, so that recreating it and retrying
    /// once is the right answer.
    pub fn is_gone(&self) -> bool {
        matches!(self, DockerError::Gone { .. })
    }

    /// The engine's HTTP status, when the engine answered with an error.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            DockerError::Connect { error, .. } | DockerError::Engine { error, .. } => {
                status_code(error)
            }
            _ => None,
        }
    }
}

/// The HTTP status of an error answer of the engine.
pub fn status_code(error: &BollardError) -> Option<u16> {
    match error {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The message of an error answer of the engine.
pub fn server_message(error: &BollardError) -> Option<&str> {
    match error {
        BollardError::DockerResponseServerError { message, .. } => Some(message),
        _ => None,
    }
}

/// 404: no such container, image or exec.
pub fn is_not_found(error: &BollardError) -> bool {
    status_code(error) == Some(404)
}

/// 409: a name already in use, a container not running, a removal already
/// in progress.
pub fn is_conflict(error: &BollardError) -> bool {
    status_code(error) == Some(409)
}

/// 304: already started, already stopped.
pub fn is_not_modified(error: &BollardError) -> bool {
    status_code(error) == Some(304)
}

/// A 409 that says the container is not running ("Container … is not
/// running"), as opposed to paused or restarting.
pub fn is_not_running(error: &BollardError) -> bool {
    is_conflict(error) && server_message(error).is_some_and(|m| m.contains("is not running"))
}

/// Classifies an error of creating or starting an exec: a missing or
/// stopped container is [`DockerError::Gone`].
pub(crate) fn exec_error(
    container: &str,
    action: &'static str,
    error: BollardError,
) -> DockerError {
    if is_not_found(&error) {
        DockerError::Gone {
            container: container.to_string(),
            reason: "no such container".to_string(),
        }
    } else if is_not_running(&error) {
        DockerError::Gone {
            container: container.to_string(),
            reason: "it is not running".to_string(),
        }
    } else {
        DockerError::engine(action, container, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status_code: u16, message: &str) -> BollardError {
        BollardError::DockerResponseServerError {
            status_code,
            message: message.to_string(),
        }
    }

    #[test]
    fn engine_answers_are_classified_by_status() {
        assert!(is_not_found(&server(404, "No such container: x")));
        assert!(!is_not_found(&server(409, "Conflict")));
        assert!(is_conflict(&server(
            409,
            "Conflict. The container name is in use"
        )));
        assert!(is_not_modified(&server(304, "")));
        assert!(!is_conflict(&BollardError::RequestTimeoutError));
        assert_eq!(status_code(&BollardError::RequestTimeoutError), None);
    }

    #[test]
    fn a_missing_or_stopped_container_is_gone_but_a_paused_one_is_not() {
        let gone = exec_error("c1", "exec in", server(404, "No such container: c1"));
        assert!(gone.is_gone(), "{gone}");
        assert_eq!(gone.to_string(), "container c1 is gone: no such container");
        let stopped = exec_error("c1", "exec in", server(409, "Container abc is not running"));
        assert!(stopped.is_gone(), "{stopped}");
        let paused = exec_error(
            "c1",
            "exec in",
            server(
                409,
                "Container abc is paused, unpause the container before exec",
            ),
        );
        assert!(!paused.is_gone(), "{paused}");
        assert_eq!(paused.status_code(), Some(409));
        assert!(paused.to_string().contains("c1"), "{paused}");
    }
}
