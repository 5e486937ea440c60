//! `hermes mcp`: the sandbox as a Model Context Protocol server, over
//! stdio (the transport an agent spawns) or, with `--http ADDR`, the
//! streamable HTTP transport on a loopback address behind a bearer token
//! ([`http`]). Built on the official Rust SDK (`rmcp`).
//!
//! **One exec path.** Every tool runs plain execs through `hermes exec`'s
//! own code, in this process ([`crate::commands::exec::run_with`]): the
//! configured backend, failing closed while the egress proxy is down (a
//! tool error saying why), the redactor over everything a command prints,
//! a missing sandbox created by the plan's rules and nothing else
//! recreated. No `hermes` process is started per call.
//!
//! **The rule for everything beyond a command.** Background processes and
//! files are plain execs of small `sh` scripts ([`sandbox`]), so they work
//! on every backend that runs a POSIX shell, and nothing of hermes lives
//! in the sandbox:
//! - a background command runs in a session of its own (`setsid`), its
//!   output to a fresh directory made by `mktemp -d` (`$TMPDIR` or
//!   `/tmp`); it is polled with `tail -c` (bounded) and killed by its
//!   process group. The connection keeps only its directory's path;
//! - files are read with `tail`/`head` (bounded lines and bytes; a NUL
//!   byte in the first 8 KiB is a binary file, refused), and written in
//!   parts passed as arguments to a temporary file beside the target,
//!   moved into place at the end.
//!
//! What comes back from the sandbox is hostile: read through a bounded
//! capture ([`capture`]), parsed strictly, paths and ids checked, escapes
//! removed. Arguments from the client are bounded before anything runs
//! ([`tools`]).
//!
//! **Sessions.** One connection is one hermes session: `--session` and
//! `--task` choose its sandbox as for `hermes exec`. Without `--session`,
//! where `terminal.container_persistent` is false (Docker, singularity),
//! each connection gets a session of its own, `mcp-<random>`, whose
//! sandbox is removed when the connection ends (or by the idle reaper
//! after `terminal.lifetime_seconds`). A persistent sandbox outlives the
//! connection, and so do the background processes in it.

pub(crate) mod capture;
pub mod http;
mod sandbox;
mod schema;
mod tools;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use hermes_model::config::Backend;
use rmcp::ServiceExt;

use crate::cli::McpArgs;
use crate::home::Home;

pub use tools::Hermes;
use tools::Session;

/// What every connection of one `hermes mcp` shares.
#[derive(Debug, Clone)]
pub struct Base {
    home: Home,
    profile: String,
    task: String,
    session: Option<String>,
    /// Whether a connection without `--session` gets a sandbox of its own.
    own_sessions: bool,
    default_timeout: u64,
}

impl Base {
    /// The state of a new connection.
    fn connect(&self) -> Arc<Session> {
        let (session, owned) = match &self.session {
            Some(s) => (Some(s.clone()), false),
            None if self.own_sessions => (Some(format!("mcp-{}", random_hex())), true),
            None => (None, false),
        };
        let target = sandbox::Target {
            home: self.home.clone(),
            profile: self.profile.clone(),
            task: self.task.clone(),
            session,
        };
        Arc::new(Session::new(target, self.default_timeout, owned))
    }
}

pub async fn run(home: &Home, profile: &str, args: McpArgs) -> anyhow::Result<ExitCode> {
    if let Some(session) = &args.session {
        hermes_model::desired::check_session(session)?;
    }
    let desired = crate::load::load_desired(home, profile)?;
    let terminal = &desired.config.terminal;
    let backend = desired.backend();
    let base = Base {
        home: home.clone(),
        profile: profile.to_string(),
        task: args.task.clone(),
        session: args.session.clone(),
        own_sessions: !terminal.container_persistent
            && matches!(backend, Backend::Docker | Backend::Singularity),
        default_timeout: terminal.timeout_seconds,
    };
    match args.http {
        Some(addr) => http::serve(base, addr).await,
        None => stdio(base).await,
    }
}

/// Serves one connection on this process's standard input and output.
/// Standard output is the protocol's alone: fd 1 is pointed at stderr
/// first, so that nothing else printed can corrupt it.
async fn stdio(base: Base) -> anyhow::Result<ExitCode> {
    let protocol = nix::unistd::dup(std::io::stdout()).context("duplicating stdout")?;
    nix::unistd::dup2_stdout(std::io::stderr()).context("pointing stdout at stderr")?;
    let output = tokio::fs::File::from_std(std::fs::File::from(protocol));
    let session = base.connect();
    let server = Hermes::new(session.clone());
    let running = server
        .serve((tokio::io::stdin(), output))
        .await
        .context("starting the MCP session")?;
    let quit = running.waiting().await;
    end(&base, &session).await;
    if let Err(e) = quit {
        tracing::debug!(error = %e, "the MCP session ended");
    }
    Ok(ExitCode::SUCCESS)
}

/// The end of a connection: its own session's sandbox goes.
async fn end(base: &Base, session: &Session) {
    if !session.owned || session.ended.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(id) = session.target.session.as_deref() else {
        return;
    };
    if let Err(e) = end_session(base, id).await {
        eprintln!(
            "warning: cannot remove session {id}'s sandbox: {}; the idle reaper removes it",
            crate::chain::Chain(&e)
        );
    }
}

/// Ends a session as `hermes session end` does: the backend seam plans
/// it, the plan is printed (on stderr: stdout is the protocol's), and the
/// same appliers carry it out.
async fn end_session(base: &Base, id: &str) -> anyhow::Result<()> {
    let desired = crate::load::load_desired(&base.home, &base.profile)?;
    let backend = crate::backend::of(&desired);
    let ending = backend.end_session(&base.home, &desired, id).await?;
    if ending.plan.ops.is_empty() {
        return Ok(());
    }
    eprintln!("{}", ending.plan);
    let options = crate::apply::ApplyOptions {
        verbose: false,
        stop: None,
        home: Some(&base.home),
    };
    let applied = crate::pass::apply_plan(
        backend,
        ending.engine.as_ref(),
        &base.home,
        &desired,
        &ending.plan,
        options,
    )
    .await;
    anyhow::ensure!(applied.failed == 0, "{} operations failed", applied.failed);
    Ok(())
}

/// 48 random bits in hex.
fn random_hex() -> String {
    let mut buf = [0u8; 6];
    if getrandom::fill(&mut buf).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        buf[..4].copy_from_slice(&t.to_le_bytes());
        buf[4..].copy_from_slice(&(std::process::id() as u16).to_le_bytes());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}
