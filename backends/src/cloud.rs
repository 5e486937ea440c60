//! What the remote sandbox services (modal, daytona, vercel_sandbox) share:
//! the life cycle a driver offers, the sandbox it hands back, and the retry
//! rule for their HTTP and gRPC calls.
//!
//! Persistence on these services means "the filesystem survives, processes
//! do not": when a session ends, [`CloudDriver::suspend`] keeps the
//! filesystem (Modal: a filesystem snapshot, then terminate; Vercel: a
//! snapshot, which stops the sandbox; Daytona: stop, the stopped sandbox is
//! the snapshot) and the next session restores from it. The snapshot ids
//! are kept by the caller (`$HERMES_HOME/<backend>_snapshots.json`), not
//! here, with the id of the sandbox left running for each task, which the
//! caller hands back to [`CloudDriver::find`]: a driver only talks to its
//! service.

use std::future::Future;
use std::time::Duration;

use crate::exec::{ExecIo, ExecOutcome, ExecRequest, Executor};

/// The sandbox hermes wants on a service, in that service's terms after
/// validation by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudSpec {
    /// The task the sandbox serves (`default`); the service-side name is
    /// derived from it (`hermes-<task>`).
    pub task: String,
    /// The hermes profile, recorded as a label where the service has labels.
    pub profile: String,
    /// Image (modal, daytona) or runtime (vercel: `node24`, `node22`,
    /// `python3.13`).
    pub image: String,
    pub cpu: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    /// How long the service keeps the sandbox alive on its own.
    pub lifetime: Duration,
    /// Environment for every command: only what `forward_env` names, never
    /// a key the proxy would cover (a provider key the service sets as a
    /// header is the proxy's token here).
    pub env: Vec<(String, String)>,
    /// The headers the service sets on the sandbox's outbound requests to
    /// a provider's hosts (Vercel, Modal): the real keys, sent only in the
    /// create request's policy.
    pub transforms: Vec<hermes_model::cloud::HeaderTransform>,
}

/// Where a sandbox is on its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudState {
    /// Commands can run now.
    Running,
    /// It exists and can be resumed (Daytona's stopped sandbox).
    Stopped,
    /// Being created, started or stopped by the service.
    Pending,
    /// Failed or terminated; it can only be deleted.
    Dead,
}

/// One sandbox as the service reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudSandbox {
    /// The service's id for it.
    pub id: String,
    pub state: CloudState,
}

/// One remote sandbox service.
///
/// Every call is one request or a short idempotent sequence, so a pass cut
/// short is finished by the next; "not found" on delete counts as done.
/// Credentials are read when the driver is built and never appear in an
/// error or a log line.
pub trait CloudDriver {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The backend's name in `terminal.backend`.
    fn backend(&self) -> &'static str;

    /// The sandbox serving `task`, if the service has one (running or
    /// resumable). Never mutates anything: `--dry-run` calls only this.
    ///
    /// `known` is the id of the sandbox the caller recorded as serving the
    /// task (the one it last created or resumed and left running). A
    /// service that names or labels its sandboxes finds them by that and
    /// may ignore it; one that cannot (Vercel) finds nothing else, and an
    /// id the service no longer knows is `None`.
    fn find(
        &self,
        profile: &str,
        task: &str,
        known: Option<&str>,
    ) -> impl Future<Output = Result<Option<CloudSandbox>, Self::Error>>;

    /// Creates and starts a sandbox for `spec`, from `snapshot` when given
    /// (a snapshot id [`CloudDriver::suspend`] returned earlier), and waits
    /// until commands can run.
    fn create(
        &self,
        spec: &CloudSpec,
        snapshot: Option<&str>,
    ) -> impl Future<Output = Result<CloudSandbox, Self::Error>>;

    /// Starts a stopped sandbox again and waits until commands can run.
    fn resume(&self, id: &str) -> impl Future<Output = Result<CloudSandbox, Self::Error>>;

    /// Ends a session keeping the filesystem: returns the snapshot id to
    /// restore from next time, or `None` when the stopped sandbox itself is
    /// what [`CloudDriver::resume`] brings back.
    fn suspend(&self, id: &str) -> impl Future<Output = Result<Option<String>, Self::Error>>;

    /// Deletes the sandbox; an unknown id is success.
    fn destroy(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>>;

    /// Runs a command in a running sandbox, output streamed as the service
    /// delivers it; on timeout the command is killed there and the outcome
    /// is `timed_out` with exit code 124.
    fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> impl Future<Output = Result<ExecOutcome, Self::Error>>;

    /// Writes one file (parents created) in the sandbox.
    fn write_file(
        &self,
        id: &str,
        path: &str,
        contents: &[u8],
    ) -> impl Future<Output = Result<(), Self::Error>>;

    /// Reads one file from the sandbox.
    fn read_file(&self, id: &str, path: &str)
    -> impl Future<Output = Result<Vec<u8>, Self::Error>>;
}

/// One running sandbox of a service, as an [`Executor`]: its commands run
/// through the driver's [`CloudDriver::exec`].
#[derive(Debug)]
pub struct InSandbox<C> {
    pub driver: C,
    /// The service's id of the sandbox.
    pub id: String,
}

impl<C: CloudDriver> Executor for InSandbox<C> {
    type Error = C::Error;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, C::Error> {
        self.driver.exec(&self.id, req, io).await
    }
}

/// Whether an HTTP status is worth a retry, as the reference retries:
/// request timeout, too early, too many requests and server errors.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429) || (500..=599).contains(&status)
}

/// How many times a retryable call is tried in all.
pub const RETRY_ATTEMPTS: u32 = 4;

/// The wait before retry `attempt` (1-based): 250 ms doubling, capped at
/// 4 s, or the service's `Retry-After` when it gave one (capped the same).
pub fn retry_delay(attempt: u32, retry_after: Option<Duration>) -> Duration {
    let cap = Duration::from_secs(4);
    if let Some(after) = retry_after {
        return after.min(cap);
    }
    let shift = attempt.saturating_sub(1).min(4);
    (Duration::from_millis(250) * (1u32 << shift)).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_the_statuses_the_reference_retries() {
        for s in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [200, 201, 400, 401, 403, 404, 409, 422, 600] {
            assert!(!retryable_status(s), "{s}");
        }
    }

    #[test]
    fn retry_delay_doubles_and_is_capped() {
        assert_eq!(retry_delay(1, None), Duration::from_millis(250));
        assert_eq!(retry_delay(2, None), Duration::from_millis(500));
        assert_eq!(retry_delay(3, None), Duration::from_secs(1));
        assert_eq!(retry_delay(9, None), Duration::from_secs(4));
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(4)
        );
    }
}
