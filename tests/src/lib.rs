//! End-to-end tests of hermes, and the helpers they share.
//!
//! The tests in `tests/tests/` run against a real Docker engine, a real
//! OpenSSH server ([`sshd`]) and real TLS clients: nothing here is mocked. They never skip
//! silently: when the engine is missing, [`engine`] panics and says how to
//! get one. `scripts/test` is the way to run them: it installs Debian's
//! `docker.io` when needed, starts `dockerd` when none answers, builds the
//! test image ([`DEFAULT_TEST_IMAGE`]) when it is not there yet, and exports
//! `HERMES_TEST_IMAGE`.

use bollard::Docker;

pub mod agent;
pub mod aws;
pub mod cli;
pub mod docker_cli;
pub mod egress;
pub mod fakes;
pub mod json_schema;
pub mod kube_harness;
pub mod python;
pub mod sshd;
pub mod upstream;

/// The environment variable naming the image the tests run containers from.
pub const TEST_IMAGE_ENV: &str = "HERMES_TEST_IMAGE";

/// The tag `scripts/test` gives the image it builds: a Debian bookworm
/// `debootstrap --variant=minbase` root with curl, ca-certificates, python3
/// and nodejs, brought in with `docker import`. Such an image has no `CMD`,
/// so tests always give the command to run.
pub const DEFAULT_TEST_IMAGE: &str = "hermes-test-base:bookworm-1";

/// Connects to the Docker engine the way the controller does: `DOCKER_HOST`
/// when set, the local socket otherwise, with the API version negotiated down
/// to what the engine speaks (Debian's engine speaks 1.41, older than
/// bollard's default), and checks that the engine answers a ping.
///
/// # Panics
///
/// When the engine is missing or does not answer. End-to-end tests need a
/// real engine and must not pass without one.
pub async fn engine() -> Docker {
    // What `connect_with_defaults` falls back to on unix; only used to say
    // where the engine was looked for.
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_owned());
    let docker = match Docker::connect_with_defaults() {
        Ok(docker) => docker,
        Err(error) => unreachable_engine(&host, &error),
    };
    let docker = match docker.negotiate_version().await {
        Ok(docker) => docker,
        Err(error) => unreachable_engine(&host, &error),
    };
    if let Err(error) = docker.ping().await {
        unreachable_engine(&host, &error);
    }
    docker
}

/// The image tests run containers from: `HERMES_TEST_IMAGE` when set,
/// [`DEFAULT_TEST_IMAGE`] otherwise.
pub fn test_image() -> String {
    std::env::var(TEST_IMAGE_ENV)
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| DEFAULT_TEST_IMAGE.to_owned())
}

/// The variable naming the engine's gVisor runtime (`runsc`), which
/// `scripts/test` registers.
pub const RUNSC_ENV: &str = "HERMES_TEST_RUNSC";

/// The name under which the test engine lists gVisor's runsc, from
/// [`RUNSC_ENV`].
///
/// # Panics
///
/// When the variable is not set: the gVisor tests are part of the suite,
/// never skipped.
pub fn runsc_runtime() -> String {
    std::env::var(RUNSC_ENV)
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{RUNSC_ENV} is not set: the gVisor tests need the engine to list runsc; \
                 run scripts/test, which builds and registers it (scripts/runsc-build)"
            )
        })
}

fn unreachable_engine(host: &str, error: &bollard::errors::Error) -> ! {
    panic!(
        "the Docker engine was not reachable at {host}: {error}; \
         the end-to-end tests need a real engine: run scripts/test, which starts dockerd"
    )
}
