//! `hermes exec -- CMD…`: runs a command in the sandbox of the configured
//! backend, streaming its output, with its exit code as hermes's own.
//!
//! The set-up every backend shares is here, once: the `--env` values
//! parsed (and refused where the egress proxy owns the name), the proxy
//! brought to its current settings or the command refused while it is
//! down (fail closed, exit 3), the output redacted, the command shaped by
//! the terminal contract ([`hermes_backends::exec::terminal_argv`]: a
//! single argument is a shell command line, several an argv; 127 for a
//! command not found; the working directory carried over; `--background`),
//! this process's standard input forwarded, and the exit code mapped (124
//! after `[Command timed out after Ns]`). Where it runs is chosen once,
//! by the backend seam ([`crate::seam::Backend::exec_target`]): this host, the task's (or the session's)
//! Docker sandbox, the SSH host, the singularity instance or the cloud
//! sandbox, made ready (created or started, never recreated) first.
//!
//! A Docker sandbox that vanished between lookup and exec is created
//! again and the command retried once. Every Docker exec records the
//! sandbox's activity (for the idle reaper) when it starts and when it
//! ends.
//!
//! [`run_with`] is the same exec for a caller in this process (`hermes
//! mcp`): the output goes to the caller's writers (redacted the same way),
//! a refusal is a [`FailClosed`] error, and the exit code is returned.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hermes_backends::exec::{ExecIo, ExecRequest, Start, terminal_argv};
use hermes_model::config;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use hermes_model::redact::Redactor;
use tokio::io::AsyncWriteExt;

use crate::cli::ExecArgs;
use crate::exec_target::Which;
use crate::home::Home;
use crate::load::load_desired;
use crate::redacting::{RedactingWriter, known_secrets};

/// The exit code of a command that ran out of time, as `timeout(1)`.
const TIMED_OUT: u8 = 124;

/// The exit code of an exec refused because the egress proxy is not ready.
const FAIL_CLOSED: u8 = 3;

/// The exit code of a command whose output had no reader any more (`|
/// head` done reading): 128 + SIGPIPE, as the shell reports a command a
/// closed pipe ended.
const CLOSED_PIPE: u8 = 141;

/// The limit of a command on a terminal (`-t`) without `--timeout`: none
/// in practice.
const INTERACTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a `--background` command may take to start.
const BACKGROUND_START: Duration = Duration::from_secs(30);

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

pub use crate::exec_target::FailClosed;

/// [`run`] with the caller's streams: returns the command's exit code
/// (124 timed out), or [`FailClosed`] as the error of a refused exec.
pub async fn run_with(
    home: &Home,
    profile: &str,
    args: ExecArgs,
    streams: Streams<'_>,
) -> anyhow::Result<u8> {
    let mut desired = load_desired(home, profile)?;
    anyhow::ensure!(
        !args.command.is_empty(),
        "no command given: hermes exec -- CMD…"
    );
    if let Some(session) = &args.session {
        hermes_model::desired::check_session(session)?;
    }
    if args.tty {
        use std::io::IsTerminal;
        anyhow::ensure!(
            streams.stdin == Stdin::Process && std::io::stdin().is_terminal(),
            "-t gives the command a terminal, and needs one: this standard input is not a terminal (run without -t)"
        );
        // Said before any sandbox is made or started for it.
        anyhow::ensure!(
            crate::backend::of(&desired).gives_terminals(),
            crate::exec_target::ExecError::NoTerminal(desired.backend().to_string())
        );
    }
    // On a terminal, no limit unless one is asked for: an interactive
    // shell lives as long as its user wants.
    let timeout = match (args.timeout, args.tty) {
        (Some(seconds), _) => Duration::from_secs(seconds),
        (None, true) => INTERACTIVE_TIMEOUT,
        (None, false) => Duration::from_secs(desired.config.terminal.timeout_seconds),
    };
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
    // Fail closed: no command runs where the enforced egress proxy is not
    // ready.
    refuse_while_proxy_down(home, &desired).await?;
    let which = Which {
        task: &args.task,
        session: args.session.as_deref(),
    };
    let forward = streams.stdin == Stdin::Process;
    let (mut out, mut err) = output_writers(home, &desired, streams, args.tty);
    // A background command reads /dev/null; so does one whose hermes
    // reads it (nothing to forward, no pipe to make), or whose caller
    // gives it no input.
    let mut stdin = (forward && !args.background && !stdin_is_null()).then(stdin_pipe);
    // A background command's id, the name of its directory in the sandbox.
    let id = hermes_backends::background::new_id();
    for attempt in 0..2 {
        let (target, values) = crate::backend::of(&desired)
            .exec_target(home, &desired, &which)
            .await?;
        let state = args
            .cwd
            .is_none()
            .then(|| target.cwd_state(home, &desired, &which));
        let job = format!("{}/{id}", target.jobs_dir(home, &desired, &which));
        let start = match args.background {
            true => Start::Background { job: &job },
            false => Start::Foreground,
        };
        let request = ExecRequest {
            // --cwd is entered by the terminal script, so a missing
            // directory is the same one line and 126 on every backend.
            cmd: terminal_argv(&args.command, state.as_deref(), args.cwd.as_deref(), start),
            env: values.with(env.clone()),
            cwd: None,
            timeout: if args.background {
                BACKGROUND_START
            } else {
                timeout
            },
        };
        let outcome = if args.tty {
            let mut keys = stdin.take().unwrap_or_else(stdin_pipe);
            let io = hermes_backends::exec::TtyIo {
                stdin: &mut keys,
                output: &mut out,
                size: crate::terminal::follow_size(),
            };
            // Raw from here to the command's end: every key is the
            // command's, Ctrl-C included.
            let raw = crate::terminal::Raw::enter()
                .map_err(|e| anyhow::anyhow!("cannot put the terminal in raw mode: {e}"))?;
            let outcome = target.exec_tty(&desired, &request, io).await;
            drop(raw);
            outcome
        } else {
            let io = ExecIo {
                stdin: stdin
                    .as_mut()
                    .map(|s| s as &mut (dyn tokio::io::AsyncRead + Unpin + Send)),
                stdout: &mut out,
                stderr: &mut err,
            };
            target.exec(&request, io).await
        };
        let finished = (out.finish().await, err.finish().await);
        // A reader gone away ends the command (the backend kills it on the
        // failed write) and hermes, quietly, as SIGPIPE ends a command in
        // a pipeline: no message, whatever error the backend made of it.
        if out.closed() || err.closed() {
            tracing::debug!("the output's reader went away; the command was ended");
            return Ok(CLOSED_PIPE);
        }
        finished.0?;
        finished.1?;
        let outcome = match outcome {
            Err(e) if e.is_gone() && attempt == 0 => {
                tracing::warn!(error = %e, "the sandbox vanished; making it again once");
                eprintln!("hermes: {e}; making the sandbox again and retrying once");
                continue;
            }
            other => other?,
        };
        if args.background && !outcome.timed_out && outcome.exit_code == 0 {
            // The id alone on stdout, for `id=$(hermes exec --background …)`.
            let wrote = out.write_all(format!("{id}\n").as_bytes()).await;
            let flushed = out.finish().await;
            if out.closed() {
                return Ok(CLOSED_PIPE);
            }
            wrote?;
            flushed?;
            let flags = which_flags(&which);
            eprintln!(
                "started in the background in {} as process {id}: \
                 `hermes process logs{flags} {id}` reads its output, \
                 `hermes process kill{flags} {id}` stops it",
                target.describe(&desired)
            );
        }
        return Ok(ended(&outcome, timeout));
    }
    anyhow::bail!("the sandbox vanished twice; not retrying")
}

/// Runs one of hermes's own scripts (`argv`) in `target`: none of the
/// task's values, no input, its output redacted into `streams` as a
/// command's. Returns its exit code: 124 when it ran out of `timeout`,
/// 141 when the reader of its output went away.
pub(crate) async fn run_own(
    home: &Home,
    desired: &Desired,
    target: &crate::exec_target::ExecTarget,
    argv: Vec<String>,
    timeout: Duration,
    streams: Streams<'_>,
) -> anyhow::Result<u8> {
    let (mut out, mut err) = output_writers(home, desired, streams, false);
    let request = ExecRequest {
        cmd: argv,
        env: Vec::new(),
        cwd: None,
        timeout,
    };
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = target.exec(&request, io).await;
    let finished = (out.finish().await, err.finish().await);
    if out.closed() || err.closed() {
        return Ok(CLOSED_PIPE);
    }
    finished.0?;
    finished.1?;
    let outcome = outcome?;
    Ok(if outcome.timed_out {
        TIMED_OUT
    } else {
        exit_code(outcome.exit_code)
    })
}

/// The `--task`/`--session` options that name `which` again, for a hint
/// (none for the default task).
pub(crate) fn which_flags(which: &Which<'_>) -> String {
    let mut flags = String::new();
    if which.task != "default" {
        flags.push_str(&format!(" --task {}", which.task));
    }
    if let Some(session) = which.session {
        flags.push_str(&format!(" --session {session}"));
    }
    flags
}

/// Whether this process's standard input is `/dev/null` (or closed).
fn stdin_is_null() -> bool {
    use nix::sys::stat::{SFlag, fstat, stat};
    let Ok(ours) = fstat(std::io::stdin()) else {
        return true;
    };
    let Ok(null) = stat("/dev/null") else {
        return false;
    };
    SFlag::from_bits_truncate(ours.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFCHR
        && ours.st_rdev == null.st_rdev
}

/// This process's standard input as an async reader. A thread of its own
/// reads it: a read blocked on a terminal must not keep the process from
/// exiting when the command is done.
fn stdin_pipe() -> tokio::io::DuplexStream {
    use std::io::Read;
    let (mut writer, reader) = tokio::io::duplex(64 * 1024);
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if runtime.block_on(writer.write_all(&buf[..n])).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = runtime.block_on(writer.shutdown());
    });
    reader
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
    use hermes_model::plan::Describe;
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
            crate::exec_target::say(op);
            if let Err(e) = crate::proxy_ops::apply(home, None, action).await {
                eprintln!("error: {} {}: {e}", op.target, action.verb());
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

/// Where a command's output goes: the caller's stdout and stderr, through
/// the redactor unless `security.redact_secrets` is false (then with a
/// warning).
type Writer<'a> = &'a mut (dyn tokio::io::AsyncWrite + Unpin + Send);

fn output_writers<'a>(
    home: &Home,
    desired: &Desired,
    streams: Streams<'a>,
    terminal: bool,
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
        Output::new(streams.stdout, redactor.clone(), terminal),
        Output::new(streams.stderr, redactor, terminal),
    )
}

/// A command's output stream, redacted or not, that remembers whether its
/// reader went away (a write failed with a broken pipe).
#[derive(Debug)]
struct Output<W> {
    stream: Stream<W>,
    closed: bool,
}

#[derive(Debug)]
enum Stream<W> {
    Redacted(RedactingWriter<W>),
    Plain(W),
}

impl<W: tokio::io::AsyncWrite + Unpin> Output<W> {
    /// `terminal`: each flush lets out what the redactor held back.
    fn new(inner: W, redactor: Option<Arc<Redactor>>, terminal: bool) -> Output<W> {
        let stream = match redactor {
            Some(r) => Stream::Redacted(RedactingWriter::new(inner, r).eager(terminal)),
            None => Stream::Plain(inner),
        };
        Output {
            stream,
            closed: false,
        }
    }

    /// Writes out what the redactor held back, and flushes.
    async fn finish(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let result = match &mut self.stream {
            Stream::Redacted(w) => w.finish().await,
            Stream::Plain(w) => w.flush().await,
        };
        self.note(result)
    }

    /// Whether the reader went away.
    fn closed(&self) -> bool {
        self.closed
    }

    fn note<T>(&mut self, result: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &result {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                self.closed = true;
            }
        }
        result
    }

    fn poll_note<T>(
        &mut self,
        poll: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        poll.map(|result| self.note(result))
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Output<W> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = match &mut this.stream {
            Stream::Redacted(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            Stream::Plain(w) => std::pin::Pin::new(w).poll_write(cx, buf),
        };
        this.poll_note(poll)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = match &mut this.stream {
            Stream::Redacted(w) => std::pin::Pin::new(w).poll_flush(cx),
            Stream::Plain(w) => std::pin::Pin::new(w).poll_flush(cx),
        };
        this.poll_note(poll)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = match &mut this.stream {
            Stream::Redacted(w) => std::pin::Pin::new(w).poll_shutdown(cx),
            Stream::Plain(w) => std::pin::Pin::new(w).poll_shutdown(cx),
        };
        this.poll_note(poll)
    }
}
