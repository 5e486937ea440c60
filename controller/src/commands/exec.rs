//! `hermes exec -- CMD…`: runs a command in the sandbox of the configured
//! backend, streaming its output, with its exit code as hermes's own.
//!
//! Docker: the task's sandbox, or with `--session` the session's own
//! (tmpfs, shared by every exec that names it). A missing or stopped
//! sandbox is created or started first, through the same planner as
//! `reconcile`; a container that vanished between lookup and exec is
//! recreated and the command retried once. On timeout the whole process
//! tree inside the container is killed, and the exit code is 124. Commands
//! go through the sandbox's runner (no engine exec each); the engine's exec
//! is the fallback (`hermes_backends::docker::runner`).
//! `--background` starts the command detached and returns; it keeps the
//! sandbox busy while it runs. Every exec records the sandbox's activity
//! (for the idle reaper) when it starts and when it ends.
//!
//! Local: the command runs on the host in its own process group, which a
//! timeout kills whole, and which a watch kills when hermes dies before
//! the command ended ([`watch_group`]).
//!
//! SSH: the command runs on the remote host through the connection holder
//! (one login shared by every hermes process), in the task's workspace
//! there unless `--cwd` says otherwise, with this process's standard
//! input; on timeout the whole remote process tree is killed (124).
//! Sessions are a Docker matter: a session id is ignored here.
//!
//! [`run_with`] is the same exec for a caller in this process (`hermes
//! mcp`): the output goes to the caller's writers (redacted the same way),
//! a refusal is a [`FailClosed`] error, and the exit code is returned.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use hermes_backends::docker::{DockerError, Engine, ExecRequest};
use hermes_model::config::{self, Backend};
use hermes_model::desired::Desired;
use hermes_model::observed::{Observed, ObservedContainer};
use hermes_model::plan::{Describe, Kind, Plan, Target};
use hermes_model::redact::Redactor;

use crate::activity::Activity;
use crate::apply::apply_one;
use crate::cli::ExecArgs;
use crate::commands::load_desired;
use crate::home::Home;
use crate::redacting::{RedactingWriter, known_secrets};

/// The exit code of a command that ran out of time, as `timeout(1)`.
const TIMED_OUT: u8 = 124;

/// The exit code of an exec refused because the egress proxy is not ready.
const FAIL_CLOSED: u8 = 3;

pub async fn run(home: &Home, profile: &str, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let streams = Streams {
        stdout: &mut stdout,
        stderr: &mut stderr,
        stdin: Stdin::Process,
    };
    match run_with(home, profile, args, streams).await {
        Ok(code) => Ok(ExitCode::from(code)),
        Err(e) => match e.downcast_ref::<FailClosed>() {
            Some(refused) => {
                eprintln!("error: {refused}");
                Ok(ExitCode::from(FAIL_CLOSED))
            }
            None => Err(e),
        },
    }
}

/// Where a command's output goes (through the redactor), and what its
/// standard input is.
pub struct Streams<'a> {
    pub stdout: &'a mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    pub stdin: Stdin,
}

impl std::fmt::Debug for Streams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("stdin", &self.stdin)
            .finish_non_exhaustive()
    }
}

/// A command's standard input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdin {
    /// This process's own (`hermes exec`).
    Process,
    /// None: an exec run in process by a caller whose standard input is
    /// not the command's (`hermes mcp` speaks on it).
    Empty,
}

/// An exec refused, failing closed: the egress proxy enforced on the
/// backend is not ready.
#[derive(Debug, thiserror::Error)]
#[error("{0}; `hermes reconcile` (or a running controller) brings it back")]
pub struct FailClosed(String);

/// [`run`] with the caller's streams: returns the command's exit code
/// (124 timed out), or [`FailClosed`] as the error of a refused exec.
pub async fn run_with(
    home: &Home,
    profile: &str,
    args: ExecArgs,
    mut io: Streams<'_>,
) -> anyhow::Result<u8> {
    let io = &mut io;
    let mut desired = load_desired(home, profile)?;
    let timeout = Duration::from_secs(
        args.timeout
            .unwrap_or(desired.config.terminal.timeout_seconds),
    );
    let env = parse_env(&args.env)?;
    if desired.config.proxy.enabled {
        // One rule for every backend, before anything runs.
        if let Some(why) = env
            .iter()
            .find_map(|(name, _)| hermes_model::egress::exec_env_refusal(name))
        {
            anyhow::bail!(why);
        }
        bring_the_proxy_up(home, &mut desired).await;
    }
    match desired.backend() {
        Backend::Local => run_local(home, &desired, &args, &env, timeout, io).await,
        Backend::Docker => run_docker(home, &desired, &args, env, timeout, io).await,
        Backend::Ssh => run_ssh(home, &desired, &args, env, timeout, io).await,
        Backend::Singularity => run_singularity(home, &desired, &args, env, timeout, io).await,
        Backend::Modal | Backend::Daytona | Backend::VercelSandbox => {
            run_cloud(home, &desired, &args, env, timeout, io).await
        }
    }
}

/// Singularity: the task's instance (or the session's), started first when
/// needed; fail closed as on Docker.
async fn run_singularity(
    home: &Home,
    desired: &Desired,
    args: &ExecArgs,
    env: Vec<(String, String)>,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> anyhow::Result<u8> {
    anyhow::ensure!(
        !args.background,
        "--background is not available on the singularity backend"
    );
    if let Some(session) = &args.session {
        hermes_model::desired::check_session(session)?;
    }
    refuse_while_proxy_down(home, desired).await?;
    let request = ExecRequest {
        cmd: args.command.clone(),
        env,
        cwd: args.cwd.clone(),
        timeout,
    };
    let (mut out, mut err) = output_writers(home, desired, io);
    let mut stdin = tokio::io::empty();
    let io = hermes_backends::exec::ExecIo {
        stdin: Some(&mut stdin),
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome =
        crate::singularity::exec(desired, &args.task, args.session.as_deref(), &request, io).await;
    out.finish().await?;
    err.finish().await?;
    let outcome = outcome?;
    Ok(ended(&outcome, timeout))
}

/// A cloud service: the task's sandbox there, created (from its snapshot),
/// resumed or recreated first when needed. Only the variables named in
/// `terminal.<backend>_forward_env` go there.
async fn run_cloud(
    home: &Home,
    desired: &Desired,
    args: &ExecArgs,
    env: Vec<(String, String)>,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> anyhow::Result<u8> {
    anyhow::ensure!(
        !args.background,
        "--background is not available on the {} backend",
        desired.backend()
    );
    let Some(cloud) = &desired.cloud else {
        anyhow::bail!("the {} backend has no cloud settings", desired.backend());
    };
    if let Err(missing) = &cloud.credentials {
        anyhow::bail!(
            "{missing}: the {} backend needs it, in the environment or in .env",
            cloud.backend
        );
    }
    let request = ExecRequest {
        cmd: args.command.clone(),
        env,
        cwd: args.cwd.clone(),
        timeout,
    };
    let host = crate::commands::host_env(home)?;
    let home_dir = crate::cloud::home_dir(&host);
    let driver = crate::cloud::Driver::new(cloud.backend, &host, home_dir.as_deref())?;
    let book = crate::snapshots::SnapshotBook::new(home.root(), cloud.backend);
    let (mut out, mut err) = output_writers(home, desired, io);
    let io = hermes_backends::exec::ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = crate::cloud::exec_cloud(&driver, desired, &book, &args.task, &request, io).await;
    out.finish().await?;
    err.finish().await?;
    let outcome = outcome?;
    Ok(ended(&outcome, timeout))
}

/// How many rounds of the proxy's own plan an exec carries out before it
/// runs its command or refuses.
const PROXY_ROUNDS: usize = 3;

/// Where a `proxy:` edit changed what the running, healthy proxy the
/// command needs should be, carries out the proxy's part of the plan (its
/// files written again, its restart on the new settings) first, as a
/// missing sandbox is created: each op printed on stderr in the plan's
/// words. A proxy that is down or unhealthy (never started, killed,
/// crashed) is not brought up here: the command is refused below, failing
/// closed, until `hermes reconcile` or the controller brings it up.
async fn bring_the_proxy_up(home: &Home, desired: &mut Desired) {
    use hermes_model::action::{Action, ProxyAction};
    for _ in 0..PROXY_ROUNDS {
        let proxy = crate::egress::pass::observe(home).await;
        if hermes_reconcilers::proxy::fail_closed_reason(desired, &proxy).is_none() {
            return;
        }
        let edited = proxy.running
            && proxy.healthy
            && match &desired.egress {
                hermes_model::desired::Egress::NotSetUp { .. } => true,
                hermes_model::desired::Egress::On { settings, .. } => {
                    proxy.settings.as_deref() != Some(settings.as_str())
                }
                hermes_model::desired::Egress::Off => false,
            };
        let observed = Observed {
            proxy,
            ..Observed::default()
        };
        let ops: Vec<_> = hermes_reconcilers::proxy::plan(desired, &observed)
            .into_iter()
            .filter(|op| {
                edited
                    && matches!(
                        op.action,
                        Action::Proxy(ProxyAction::Setup | ProxyAction::Restart)
                    )
            })
            .collect();
        if ops.is_empty() {
            return;
        }
        for op in &ops {
            let Action::Proxy(action) = op.action else {
                continue;
            };
            eprintln!(
                "{} {}   {:<10}  {}",
                op.action.kind().symbol(),
                op.target,
                op.action.verb(),
                op.cause
            );
            if let Err(e) = crate::proxy_ops::apply(home, None, action).await {
                eprintln!("error: {} {}: {e}", op.target, op.action.verb());
                return;
            }
            if action == ProxyAction::Setup {
                // The files are new: the next round compares against them.
                let egress = crate::egress::pass::desired(home, &desired.config);
                desired.set_egress(egress);
            }
        }
    }
}

/// Fail closed: a refusal, saying why, while the egress proxy enforced on
/// the backend (`proxy.enforce_on_docker` for Docker and singularity,
/// `proxy.enforce_on_ssh`) is not ready.
async fn refuse_while_proxy_down(home: &Home, desired: &Desired) -> Result<(), FailClosed> {
    if !desired.config.proxy.enabled {
        return Ok(());
    }
    let proxy = crate::egress::pass::observe(home).await;
    match hermes_reconcilers::proxy::fail_closed_reason(desired, &proxy) {
        Some(reason) => Err(FailClosed(reason.to_string())),
        None => Ok(()),
    }
}

fn parse_env(pairs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if config::is_env_name(k) => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!(
                "--env {:?}: expected NAME=value",
                pair.split('=').next().unwrap_or("")
            ),
        })
        .collect()
}

async fn run_ssh(
    home: &Home,
    desired: &Desired,
    args: &ExecArgs,
    env: Vec<(String, String)>,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> anyhow::Result<u8> {
    anyhow::ensure!(
        !args.background,
        "--background is not available on the ssh backend"
    );
    // Fail closed: no command runs on the SSH host while the egress proxy
    // enforced there (`proxy.enforce_on_ssh`) is not ready.
    refuse_while_proxy_down(home, desired).await?;
    let request = ExecRequest {
        cmd: args.command.clone(),
        env,
        cwd: args.cwd.clone(),
        timeout,
    };
    let process_stdin = io.stdin == Stdin::Process;
    let (mut out, mut err) = output_writers(home, desired, io);
    let outcome = crate::ssh::exec(
        home,
        desired,
        &args.task,
        &request,
        process_stdin,
        &mut out,
        &mut err,
    )
    .await;
    out.finish().await?;
    err.finish().await?;
    let outcome = outcome?;
    Ok(ended(&outcome, timeout))
}

/// hermes's exit code for how a command ended: its own, or 124 after
/// saying that it timed out.
fn ended(outcome: &hermes_backends::exec::ExecOutcome, timeout: Duration) -> u8 {
    if outcome.timed_out {
        timed_out(timeout)
    } else {
        exit_code(outcome.exit_code)
    }
}

fn timed_out(timeout: Duration) -> u8 {
    eprintln!("[Command timed out after {}s]", timeout.as_secs());
    TIMED_OUT
}

fn exit_code(code: i64) -> u8 {
    u8::try_from(code).unwrap_or(if code < 0 { 1 } else { 255 })
}

async fn run_local(
    home: &Home,
    desired: &Desired,
    args: &ExecArgs,
    env: &[(String, String)],
    timeout: Duration,
    io: &mut Streams<'_>,
) -> anyhow::Result<u8> {
    let (program, rest) = args
        .command
        .split_first()
        .context("no command given: hermes exec -- CMD…")?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &args.cwd {
        cmd.current_dir(cwd);
    }
    if io.stdin == Stdin::Empty {
        cmd.stdin(std::process::Stdio::null());
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let mut watch = match child.id() {
        Some(pid) => Some(watch_group(pid)?),
        None => None,
    };
    let (mut out, mut err) = output_writers(home, desired, io);
    let mut child_out = child.stdout.take().context("the command's stdout")?;
    let mut child_err = child.stderr.take().context("the command's stderr")?;
    let copy = async {
        let (a, b) = tokio::join!(
            tokio::io::copy(&mut child_out, &mut out),
            tokio::io::copy(&mut child_err, &mut err)
        );
        a.and(b)
    };
    let run = async {
        copy.await?;
        child.wait().await
    };
    let result = tokio::time::timeout(timeout, run).await;
    if let Some(watch) = watch.as_mut() {
        // The command ended (or is killed below): what it left in the
        // background stays.
        let _ = watch.kill().await;
    }
    out.finish().await?;
    err.finish().await?;
    match result {
        Ok(status) => {
            let status = status?;
            Ok(exit_code(i64::from(
                status.code().unwrap_or(128 + status_signal(&status)),
            )))
        }
        Err(_) => {
            if let Some(pid) = child.id() {
                // The whole process group, children included.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.wait().await;
            Ok(timed_out(timeout))
        }
    }
}

/// A watch over the process group `pgid` (a local command's): a small `sh`
/// in a group of its own (no terminal signal reaches it) that reads its
/// standard input, a pipe only this process writes, and kills the group at
/// its end: when hermes dies, however (`kill -9` included), before the
/// command ended. Killed once the command ended.
fn watch_group(pgid: u32) -> anyhow::Result<tokio::process::Child> {
    tokio::process::Command::new("/bin/sh")
        .args(["-c", "read -r _; kill -KILL -\"$1\"", "hermes-watch"])
        .arg(pgid.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the watch over the command")
}

fn status_signal(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

async fn run_docker(
    home: &Home,
    desired: &Desired,
    args: &ExecArgs,
    env: Vec<(String, String)>,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> anyhow::Result<u8> {
    anyhow::ensure!(
        !args.command.is_empty(),
        "no command given: hermes exec -- CMD…"
    );
    if let Some(session) = &args.session {
        hermes_model::desired::check_session(session)?;
    }
    // Fail closed: no Docker sandbox runs a command while the enforced
    // egress proxy is not ready.
    refuse_while_proxy_down(home, desired).await?;
    let spec = desired.exec_sandbox(&args.task, args.session.as_deref());
    let engine = Engine::connect().await?.for_home(home.scope());
    let request = ExecRequest {
        cmd: args.command.clone(),
        env,
        cwd: args.cwd.clone(),
        timeout,
    };
    for attempt in 0..2 {
        let container = ensure_sandbox(&engine, desired, &spec)
            .await
            .map_err(|e| racing(e, &spec.name))?;
        let id = container.id.as_str();
        // The sandbox's runner, when its container has one: no engine exec
        // per command (the engine's exec is the fallback).
        let runner = hermes_backends::docker::runner_dir(&container, &spec);
        // Activity is recorded when the exec starts and when it ends, so an
        // exec cut short by a crash still counts as use.
        let activity = Activity::new(home);
        record(&activity, &spec.name);
        if args.background {
            match engine
                .exec_background_with_runner(id, runner, &request)
                .await
            {
                Ok(marker) => {
                    eprintln!(
                        "started in the background in {} ({}={marker})",
                        spec.name,
                        hermes_backends::docker::EXEC_ID_ENV
                    );
                    return Ok(0);
                }
                Err(e @ DockerError::Gone { .. }) if attempt == 0 => {
                    eprintln!("hermes: {e}; recreating the sandbox and retrying once");
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let (mut out, mut err) = output_writers(home, desired, io);
        let outcome = engine
            .exec_with_runner(id, runner, &request, &mut out, &mut err)
            .await;
        out.finish().await?;
        err.finish().await?;
        record(&activity, &spec.name);
        match outcome {
            Ok(outcome) if outcome.timed_out => return Ok(timed_out(timeout)),
            Ok(outcome) => return Ok(exit_code(outcome.exit_code)),
            Err(e @ DockerError::Gone { .. }) if attempt == 0 => {
                tracing::warn!(error = %e, "the sandbox vanished; recreating it once");
                eprintln!("hermes: {e}; recreating the sandbox and retrying once");
            }
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("sandbox {} vanished twice; not retrying", spec.name)
}

/// A writer of a command's output.
type Writer<'a> = &'a mut (dyn tokio::io::AsyncWrite + Unpin + Send);

/// Where a command's output goes: the streams' stdout and stderr, through
/// the redactor unless `security.redact_secrets` is false (then with a
/// warning).
fn output_writers<'a>(
    home: &Home,
    desired: &Desired,
    io: &'a mut Streams<'_>,
) -> (Output<Writer<'a>>, Output<Writer<'a>>) {
    let redactor = if desired.config.security.redact_secrets {
        let tokens: Vec<String> = match &desired.egress {
            hermes_model::desired::Egress::On { wiring, .. } => {
                wiring.tokens.iter().map(|(_, t)| t.clone()).collect()
            }
            _ => Vec::new(),
        };
        Some(Arc::new(Redactor::new(known_secrets(home)).exempt(tokens)))
    } else {
        eprintln!(
            "warning: security.redact_secrets is false: secrets in the output are shown in clear"
        );
        None
    };
    (
        Output::new(&mut *io.stdout, redactor.clone()),
        Output::new(&mut *io.stderr, redactor),
    )
}

/// Records use of a sandbox; a failure costs the idle reaper's precision,
/// not the command, so it is a warning.
fn record(activity: &Activity, container: &str) {
    if let Err(e) = activity.touch(container) {
        tracing::warn!(container, error = %e, "cannot record the sandbox's activity");
    }
}

/// The error of a sandbox that another hermes process is recreating (a
/// recreate waited for, in vain), in a user's words.
fn racing(e: anyhow::Error, name: &str) -> anyhow::Error {
    match e.downcast_ref::<DockerError>() {
        Some(DockerError::NameTaken { .. } | DockerError::StillRemoving { .. }) => e.context(
            format!("the sandbox {name} is being recreated by another hermes process; try again"),
        ),
        _ => e,
    }
}

/// Finds the sandbox by its name; creates or starts it through the
/// persistence planner when needed. Returns the container.
async fn ensure_sandbox(
    engine: &Engine,
    desired: &Desired,
    spec: &hermes_model::sandbox::SandboxSpec,
) -> anyhow::Result<ObservedContainer> {
    let found = engine.find(&spec.key).await?;
    if let Some(c) = found.as_ref().filter(|c| {
        c.state == hermes_model::observed::ContainerState::Running
            && c.spec_hash() == Some(spec.hash())
    }) {
        return Ok(c.clone());
    }
    let mut only = desired.clone();
    only.sandboxes = vec![spec.clone()];
    let observed = Observed {
        containers: found.into_iter().collect(),
        ..Observed::default()
    };
    let plan = Plan::new(
        hermes_reconcilers::persistence::plan(
            &only,
            &observed,
            hermes_reconcilers::unix_seconds(SystemTime::now()),
        )
        .ops
        .into_iter()
        .filter(|op| matches!(op.target, Target::Sandbox { .. }))
        .collect(),
    );
    if let Some(op) = plan.ops.iter().find(|op| op.action.kind() == Kind::Blocked) {
        anyhow::bail!("sandbox {} is blocked: {}", spec.name, op.cause);
    }
    // Removals first, as in a pass: a holder of the name goes before the
    // create.
    let (removals, others): (Vec<_>, Vec<_>) = plan
        .ops
        .iter()
        .partition(|op| op.action.kind() == Kind::Remove);
    for op in removals.into_iter().chain(others) {
        apply_one(engine, op).await?;
    }
    match engine.find(&spec.key).await? {
        Some(c) => Ok(c),
        None => anyhow::bail!("sandbox {} was not created", spec.name),
    }
}

/// A command's output stream, redacted or not.
#[derive(Debug)]
enum Output<W> {
    Redacted(RedactingWriter<W>),
    Plain(W),
}

impl<W: tokio::io::AsyncWrite + Unpin> Output<W> {
    fn new(inner: W, redactor: Option<Arc<Redactor>>) -> Output<W> {
        match redactor {
            Some(r) => Output::Redacted(RedactingWriter::new(inner, r)),
            None => Output::Plain(inner),
        }
    }

    /// Writes out what the redactor held back, and flushes.
    async fn finish(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Output::Redacted(w) => w.finish().await,
            Output::Plain(w) => w.flush().await,
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Output<W> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Output::Redacted(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            Output::Plain(w) => std::pin::Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Output::Redacted(w) => std::pin::Pin::new(w).poll_flush(cx),
            Output::Plain(w) => std::pin::Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Output::Redacted(w) => std::pin::Pin::new(w).poll_shutdown(cx),
            Output::Plain(w) => std::pin::Pin::new(w).poll_shutdown(cx),
        }
    }
}
