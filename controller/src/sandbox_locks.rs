//! The host-side locks of a Docker sandbox, under `run/locks/` in the
//! home, shared by every hermes process on the host (a controller, a
//! reconcile, execs, `hermes mcp`):
//!
//! - the **gate**, `<name>.lock`, exclusive: held by a replacement for
//!   its whole length, and by an exec only while it finds (or makes) the
//!   container it runs in. An exec started during a replacement waits
//!   for it and runs in the new container, never in the old one stopped
//!   half-way;
//! - the **in-use** lock, `<name>.busy`: shared by each exec for as long
//!   as its command runs (taken under the gate); a replacement, holding
//!   the gate, waits for it exclusively, up to [`IN_FLIGHT_GRACE`], so
//!   that a command already running ends before its container is
//!   stopped. A command still running after the grace is stopped with
//!   its container, as the plan's cost said.
//!
//! `flock` locks: the kernel drops them with the process that held them,
//! so a killed hermes leaves none behind.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hermes_backends::docker::DockerError;
use hermes_model::sandbox::SandboxSpec;
use nix::fcntl::Flock;

/// How long a replacement waits for the commands running in the sandbox
/// before it stops them with their container.
pub const IN_FLIGHT_GRACE: Duration =
    Duration::from_secs(hermes_model::sandbox::DRAIN_GRACE_SECONDS);

/// How often a replacement looks whether the commands ended.
const POLL: Duration = Duration::from_millis(20);

/// A lock held until dropped.
pub type Held = Flock<File>;

/// The gate of `spec`'s sandbox, exclusive; waits while another process
/// holds it.
pub async fn gate(spec: &SandboxSpec) -> Result<Held, DockerError> {
    let path = path_of(spec, "lock")?;
    blocking(spec, path, crate::fsio::lock_exclusive).await
}

/// The in-use lock of `spec`'s sandbox, shared: held by an exec for as
/// long as its command runs. Taken under the gate, so never waits long.
pub async fn in_use(spec: &SandboxSpec) -> Result<Held, DockerError> {
    let path = path_of(spec, "busy")?;
    blocking(spec, path, crate::fsio::lock_shared).await
}

/// Waits, under the gate, until no command runs in `spec`'s sandbox, or
/// `grace` passed: `Some` (held until dropped) when none runs any more,
/// `None` when some still ran at the end of the grace. The wait is said
/// (on stderr, or in the controller's log); an interrupted one-shot
/// command ([`crate::interrupt`]) ends it with [`DockerError::Cancelled`].
pub async fn drain(spec: &SandboxSpec, grace: Duration) -> Result<Option<Held>, DockerError> {
    let path = path_of(spec, "busy")?;
    let started = Instant::now();
    let mut said = false;
    loop {
        let at = path.clone();
        if let Some(held) = blocking(spec, at, crate::fsio::try_lock_exclusive).await? {
            if said {
                crate::notices::progress(format_args!(
                    "{}: the commands ended after {:.1} s; replacing it",
                    spec.name,
                    started.elapsed().as_secs_f64()
                ));
            }
            return Ok(Some(held));
        }
        if crate::interrupt::requested() {
            return Err(DockerError::Cancelled {
                container: spec.name.clone(),
                what: "the replacement".to_string(),
            });
        }
        if started.elapsed() >= grace {
            crate::notices::progress(format_args!(
                "{}: commands still run after {} s; stopping the container ends them",
                spec.name,
                grace.as_secs()
            ));
            return Ok(None);
        }
        if !said {
            crate::notices::progress(format_args!(
                "{}: waiting up to {} s for the commands running in it to end before it is replaced (Ctrl-C: stop here, nothing changed)",
                spec.name,
                grace.as_secs()
            ));
            said = true;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `run/locks/<name>.<ext>` under the home; the directory made 0700.
fn path_of(spec: &SandboxSpec, ext: &str) -> Result<PathBuf, DockerError> {
    let dir = spec.home.join("run").join("locks");
    crate::fsio::ensure_dir(&dir, 0o700).map_err(|e| failed(spec, &dir, e))?;
    Ok(dir.join(format!("{}.{ext}", spec.name)))
}

/// Runs a lock call off the runtime's threads (it may wait).
async fn blocking<T: Send + 'static>(
    spec: &SandboxSpec,
    path: PathBuf,
    call: fn(&Path) -> std::io::Result<T>,
) -> Result<T, DockerError> {
    let at = path.clone();
    tokio::task::spawn_blocking(move || call(&at))
        .await
        .map_err(|e| failed(spec, &path, std::io::Error::other(e)))?
        .map_err(|e| failed(spec, &path, e))
}

fn failed(spec: &SandboxSpec, path: &Path, source: std::io::Error) -> DockerError {
    DockerError::HostDir {
        container: spec.name.clone(),
        path: path.to_path_buf(),
        source: hermes_backends::host_dir::HostDirError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn spec(home: &Path) -> SandboxSpec {
        let config = hermes_model::config::load("terminal:\n  backend: docker\n")
            .unwrap()
            .config;
        let env = hermes_model::desired::HostEnv::default();
        hermes_model::desired::Desired::build(config, "default", home, &env)
            .unwrap()
            .exec_sandbox("default", None)
    }

    #[tokio::test]
    async fn a_replacement_waits_for_a_running_command_and_no_longer() {
        let home = tempfile::tempdir().unwrap();
        let spec = spec(home.path());
        let command = in_use(&spec).await.unwrap();
        // While the command runs: the grace passes, and the caller hears so.
        let started = Instant::now();
        let drained = drain(&spec, Duration::from_millis(200)).await.unwrap();
        assert!(drained.is_none());
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Once it ended: at once.
        drop(command);
        let drained = drain(&spec, Duration::from_secs(5)).await.unwrap();
        assert!(drained.is_some());
        // And while drained, a new command waits (it is taken under the
        // gate in real use; here it must simply not get in).
        let path = path_of(&spec, "busy").unwrap();
        assert!(crate::fsio::try_lock_exclusive(&path).unwrap().is_none());
    }

    #[tokio::test]
    async fn commands_share_the_in_use_lock() {
        let home = tempfile::tempdir().unwrap();
        let spec = spec(home.path());
        let _a = in_use(&spec).await.unwrap();
        let _b = tokio::time::timeout(Duration::from_secs(5), in_use(&spec))
            .await
            .expect("a second command waited for the first")
            .unwrap();
    }
}
