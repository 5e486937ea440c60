//! Where `hermes exec` runs a command: a [`Target`], which a backend's
//! [`crate::seam::Backend::exec_target`] makes ready (its sandbox created
//! or started when needed, never recreated or removed: a running sandbox
//! whose spec is stale runs the command, and stderr gets one line naming
//! what differs and `hermes reconcile`, which applies it). Each target
//! also says where the task's working directory and background processes
//! are kept in the sandbox; the [`Values`] every command gets there (the
//! per-command environment: forwarded variables, the egress proxy's
//! variables and tokens) come with it, so that none of them is fixed in a
//! sandbox's spec.

use async_trait::async_trait;
use hermes_backends::docker::DockerError;
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest, TtyIo};
use hermes_model::action::Action;
use hermes_model::desired::Desired;
use hermes_model::observed::ObservedContainer;
use hermes_model::plan::{Describe, Op};
use hermes_model::sandbox::SandboxSpec;

use crate::home::Home;

/// Where a command runs, ready to run it.
pub type ExecTarget = Box<dyn Target>;

/// A sandbox (or this host) that runs commands, as `hermes exec`,
/// `hermes process` and `hermes mcp` use it.
#[async_trait]
pub trait Target: Send + Sync {
    /// The file, in the sandbox, that carries the working directory of
    /// `which` from one command to the next
    /// ([`hermes_backends::exec::TERMINAL_SCRIPT`]); a relative path is
    /// from the home there.
    fn cwd_state(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String;

    /// The directory, in the sandbox, where the background processes of
    /// `which` keep their state and output, one directory each
    /// ([`hermes_backends::background`]); a relative path is from the
    /// home there.
    fn jobs_dir(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String;

    /// Where the command ran, for a message.
    fn describe(&self, desired: &Desired) -> String {
        format!("the {} sandbox", desired.backend())
    }

    /// Runs `req`, streaming its output to `io` as it comes.
    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, ExecError>;

    /// Runs `req` on a terminal of its own (`hermes exec -t`); a backend
    /// with no terminal to give says so before anything runs.
    async fn exec_tty(
        &self,
        desired: &Desired,
        _req: &ExecRequest,
        _io: TtyIo<'_>,
    ) -> Result<ExecOutcome, ExecError> {
        Err(ExecError::NoTerminal(desired.backend().to_string()))
    }
}

/// Which command: its task and session.
#[derive(Debug, Clone)]
pub struct Which<'a> {
    pub task: &'a str,
    pub session: Option<&'a str>,
}

impl Which<'_> {
    /// `profile.task` or `profile.task.session`: what names the files of
    /// `which` where several tasks share one place.
    pub fn key(&self, desired: &Desired) -> String {
        match self.session {
            Some(s) => format!("{}.{}.{s}", desired.profile, self.task),
            None => format!("{}.{}", desired.profile, self.task),
        }
    }
}

/// Why a command did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    /// Another backend's executor, as it reported it.
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    #[error(
        "the {0} backend gives a command no terminal: `hermes exec -t` works on the local, docker and singularity backends; run the command without -t"
    )]
    NoTerminal(String),
}

impl ExecError {
    /// An executor's error.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> ExecError {
        ExecError::Backend(Box::new(e))
    }

    /// The sandbox vanished before the command started: made again and
    /// the command retried once.
    pub fn is_gone(&self) -> bool {
        matches!(self, ExecError::Docker(DockerError::Gone { .. }))
    }
}

/// The values every command of a target gets, besides its own `--env`.
#[derive(Debug, Clone, Default)]
pub struct Values {
    /// Under the command's own (forwarded variables).
    pub base: Vec<(String, String)>,
    /// Over the command's own (the egress proxy's variables and tokens:
    /// `--env` is refused for those names while the proxy is enabled).
    pub pinned: Vec<(String, String)>,
}

impl Values {
    /// The environment of one command whose own values are `own`.
    pub fn with(self, own: Vec<(String, String)>) -> Vec<(String, String)> {
        let Values { mut base, pinned } = self;
        base.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
        base.extend(own);
        base.retain(|(k, _)| !pinned.iter().any(|(p, _)| p == k));
        base.extend(pinned);
        base
    }
}

/// Where a sandbox of its own per task and session (a Docker container, a
/// Pod) keeps the carried directory: its /tmp.
pub const OWN_CWD_STATE: &str = "/tmp/.hermes-cwd";

/// Where such a sandbox keeps its background processes.
pub const OWN_JOBS_DIR: &str = "/tmp/.hermes-background";

/// Prints an operation on stderr as the plan prints it.
pub fn say(op: &Op<Action>) {
    eprintln!(
        "{} {}   {:<10}  {}",
        op.action.kind().symbol(),
        op.target,
        op.action.verb(),
        op.cause
    );
}

/// An exec refused, failing closed: the egress proxy enforced on the
/// backend is not ready, or the sandbox is not wired to it as it is now.
#[derive(Debug, thiserror::Error)]
#[error("{0}; `hermes reconcile` (or a running controller) brings it back")]
pub struct FailClosed(pub String);

/// Whether `c` was made with other egress wiring than `spec` has (the
/// proxy turned on, off, or set up anew since): its route, CA and
/// variables are not the proxy's of now.
pub fn egress_stale(spec: &SandboxSpec, c: &ObservedContainer) -> bool {
    let label = hermes_model::sandbox::LABEL_EGRESS;
    c.label(label).unwrap_or("off") != spec.labels.get(label).map_or("off", String::as_str)
}
