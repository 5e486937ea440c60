//! The fast exec path: a runner inside the sandbox, so that a command is
//! not an engine exec.
//!
//! An engine exec costs ~55 ms here (containerd and runc set up a process
//! in the container's namespaces), however little the command does. The
//! runner is a small POSIX `sh` script ([`script`]) that runs in the
//! container and starts commands itself: a `fork` and an `exec` there.
//!
//! - **Where they meet.** Each sandbox made by hermes has a host directory
//!   of its own, `$HERMES_HOME/run/sandboxes/<container>/`, mounted at
//!   `/run/hermes` (label `hermes-runner=1`; neither is in the spec hash,
//!   so older sandboxes are not recreated for it: theirs is the engine's
//!   exec). Persistent and session sandboxes alike; it holds no data and
//!   goes when hermes removes the container.
//! - **Start.** The first command that finds no runner makes a request pipe
//!   `ctl.<random>` (in the host-only directory, linked into the mount:
//!   [`files`]) and the runner's script beside it (`ctl.<random>.sh`: the
//!   script is in a file, on no command line), and starts the runner with
//!   one attached engine exec (under a lock: one at a time), which checks
//!   what it needs (`setsid`), detaches the runner and says `ok`; or why
//!   not, which is recorded (`unsupported.<container id>`) so that the
//!   engine's exec runs that container's commands without asking again. A
//!   restarted container has no runner: its pipe has no reader, and the
//!   next command starts one.
//! - **A command.** hermes builds `x.<random>/` in the host-only directory,
//!   with the pipes `out`, `err` and `status` (opened for reading there),
//!   the file `cmd` (mode, cwd, the arguments quoted for sh) and the file
//!   `env` (0600: the values are never on a command line, inside or outside
//!   the container), moves it into the mount whole, and writes its name on
//!   the request pipe. The runner starts
//!   a handler (`setsid setsid`: a session of its own, default signal
//!   dispositions), which claims the request (`claim`, `O_EXCL`), opens the
//!   pipes, answers `s`, loads the request and empties its files before
//!   the command starts (`e`: hermes removes them), and runs the command
//!   through `setsid`, so that, as under the engine,
//!   the command leads its own session; then answers `x <code>`. stdout and
//!   stderr stream through their pipes live and apart; the exec ends when
//!   both are closed and the exit code is in, as an engine exec does.
//! - **hermes killed.** hermes holds the request's pipe `life` open (never
//!   writing it) while it waits for the command; the handler watches it
//!   (one subshell, blocked in a read) and, at its end of file (hermes
//!   gone, `kill -9` included, before the command ended), kills the
//!   command's processes by its marker, descendants included. A command
//!   that ends stops its watch: what it left in the background stays, as
//!   under the engine's exec. `--background` commands have no watch.
//! - **Timeout.** The command carries the exec's marker ([`EXEC_ID_ENV`])
//!   in its environment, so a timeout kills its whole tree as the engine
//!   path does: from the host, without a process in the sandbox (a fork
//!   bomb that fills the pids limit cannot stop it; see `exec.rs`).
//! - **Fallback.** Anything short of a claimed request goes to the engine's
//!   exec, with what is left of the timeout: no directory, a request that
//!   sh cannot take, no runner and none can start, no answer in
//!   [`ACK_TIMEOUT`] (hermes then withdraws the request by creating
//!   `claim` itself: whoever creates it first has it, so a command never
//!   runs twice, and asks that runner to stop). A claimed request is
//!   reported as it ends, an error included, never run again.
//! - **Idleness.** The runner's processes show as `sh -c # hermes-runner …`
//!   ([`is_runner_process`]) and do not make a sandbox busy; the commands
//!   they start do.
//! - **What differs.** The command's stdout and stderr are named pipes
//!   under `/run/hermes` (visible in `/proc/self/fd`), and an executable
//!   without `#!` runs as a shell script (`setsid` uses `execvp`) where
//!   the engine's exec refuses it. The runner needs `setsid` (util-linux
//!   or busybox) and a user that can reach the mount (root, as the
//!   sandboxes run); otherwise the engine's exec runs everything.
//! - **Security.** The container can write the directory: hermes handles
//!   it through descriptors, never following a link, never opening what it
//!   did not make ([`files`]). Every pipe hermes writes a request to or
//!   reads an answer from is one it made in its host-only directory and
//!   opens only there: a pipe the container makes or swaps in is never
//!   opened, so no process of the container is handed a request, nor can
//!   it answer one, through a channel of its own making; a request nothing
//!   genuine claims falls back to the engine's exec.
//!
//!   What this cannot promise: that the process reading hermes's own pipe
//!   is the runner hermes started. The runner is a process of the
//!   container, and root in the container (which every process of the
//!   sandbox is) can do whatever it does: kill it, read its request pipe
//!   through the mount, read a request's `env` before the runner empties
//!   it, and answer on the request's own pipes. That is no more than root
//!   in the container has over any command, through whichever path it
//!   runs: it reads the command's environment in `/proc/<pid>/environ` and
//!   can replace the programs the command runs. So values given with
//!   `--env` reach the container, and must be values the container may
//!   see; the real keys never are (the proxy holds them). Through the
//!   runner the container can only run commands in itself, as it can
//!   anyway.

mod files;
mod script;

use std::path::Path;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt;
use hermes_model::observed::ObservedContainer;
use hermes_model::sandbox::{LABEL_RUNNER, RUNNER_MOUNT, SandboxSpec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::time::Instant;

pub use script::is_runner_process;

/// The host-only directory beside the runner directory `dir` (not mounted
/// in the sandbox): removed with it when the container goes.
pub fn runner_host_dir(dir: &Path) -> Option<std::path::PathBuf> {
    files::host_dir(dir)
}

use self::files::{Pipe, Readers, Refused, Request, RunnerDir};
use self::script::{Mode, Status, Unwritable};
use super::Engine;
use super::error::{DockerError, exec_error};
use crate::exec::{EXEC_ID_ENV, ExecOutcome, ExecRequest, TIMEOUT_EXIT_CODE, new_exec_id};

/// How long the runner has to claim a request before hermes withdraws it
/// and runs the command through the engine's exec.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the engine exec that starts a runner may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a started runner has to open its pipe.
const READY_WAIT: Duration = Duration::from_secs(2);

/// How long a command waits for another hermes process starting a runner.
const LOCK_WAIT: Duration = Duration::from_secs(25);

/// How long a background command may take to start.
const BACKGROUND_WAIT: Duration = Duration::from_secs(30);

/// The most a status pipe or a start answer may say, in bytes.
const ANSWER_LIMIT: usize = 4096;

/// The most of a failed background start's message that is kept.
const MESSAGE_LIMIT: usize = 64 * 1024;

/// The runner's directory of a sandbox, when its container was made with
/// it (label `hermes-runner=1`): the fast path's `runner` argument. None
/// under a runtime with a kernel of its own (gVisor): its sandbox cannot
/// open the host's pipes (runsc's `--host-fifo` is off by default), and
/// where it can, through its file proxy, a command is slower (87 ms for
/// `true`, measured here) than the engine's exec there (42 ms).
pub fn runner_dir<'a>(container: &ObservedContainer, spec: &'a SandboxSpec) -> Option<&'a Path> {
    if container.label(LABEL_RUNNER) == Some("1")
        && super::top::host_visible(container.runtime().as_deref())
    {
        spec.runner_dir.as_deref()
    } else {
        None
    }
}

/// Why the fast path did not give the result.
#[derive(Debug)]
enum Failure {
    /// The runner cannot take the command, and nothing of it ran.
    Unavailable(String),
    /// The runner took the command: this is how it ended.
    Failed(DockerError),
}

impl From<Refused> for Failure {
    fn from(r: Refused) -> Failure {
        Failure::Unavailable(r.0)
    }
}

impl From<Unwritable> for Failure {
    fn from(u: Unwritable) -> Failure {
        Failure::Unavailable(u.0.to_string())
    }
}

/// Why streaming a claimed request stopped early.
#[derive(Debug)]
enum RunError {
    /// The caller's writer failed.
    Output(std::io::Error),
    /// The runner misbehaved or its pipes failed.
    Runner(String),
}

/// How waiting for the runner's claim ended.
enum Claim {
    Started,
    /// The deadline passed; `ran` when the runner had claimed it.
    TimedOut {
        ran: bool,
    },
}

impl Engine {
    /// Runs `req` in `container` as [`Engine::exec`] does (same output,
    /// exit code, timeout and errors), through the sandbox's runner when
    /// `runner` (its host directory, [`runner_dir`]) is given and the
    /// runner can take it, through [`Engine::exec`] otherwise.
    pub async fn exec_with_runner(
        &self,
        container: &str,
        runner: Option<&Path>,
        req: &ExecRequest,
        mut stdin: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        mut stdout: impl AsyncWrite + Unpin,
        mut stderr: impl AsyncWrite + Unpin,
    ) -> Result<ExecOutcome, DockerError> {
        let Some(dir) = runner else {
            return self.exec_io(container, req, stdin, stdout, stderr).await;
        };
        let started = Instant::now();
        match self
            .run_through(
                container,
                dir,
                req,
                match stdin {
                    Some(ref mut s) => Some(&mut **s as &mut (dyn AsyncRead + Unpin + Send)),
                    None => None,
                },
                &mut stdout,
                &mut stderr,
            )
            .await
        {
            Ok(outcome) => return Ok(outcome),
            Err(Failure::Failed(e)) => return Err(e),
            Err(Failure::Unavailable(why)) => {
                tracing::debug!(container, %why, "the runner cannot take the command; the engine's exec runs it");
            }
        }
        let left = req.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            });
        }
        let req = ExecRequest {
            timeout: left,
            ..req.clone()
        };
        self.exec_io(container, &req, stdin, stdout, stderr).await
    }

    /// Starts `req` in `container` detached, as [`Engine::exec_background`]
    /// does, through the sandbox's runner when it can take it. Returns the
    /// marker the command's processes carry.
    pub async fn exec_background_with_runner(
        &self,
        container: &str,
        runner: Option<&Path>,
        req: &ExecRequest,
    ) -> Result<String, DockerError> {
        if let Some(dir) = runner {
            match self.start_through(container, dir, req).await {
                Ok(marker) => return Ok(marker),
                Err(Failure::Failed(e)) => return Err(e),
                Err(Failure::Unavailable(why)) => {
                    tracing::debug!(container, %why, "the runner cannot take the command; the engine's exec starts it");
                }
            }
        }
        self.exec_background(container, req).await
    }

    async fn run_through(
        &self,
        container: &str,
        dir: &Path,
        req: &ExecRequest,
        stdin: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        stdout: &mut (impl AsyncWrite + Unpin),
        stderr: &mut (impl AsyncWrite + Unpin),
    ) -> Result<ExecOutcome, Failure> {
        let deadline = Instant::now() + req.timeout;
        let marker = new_exec_id();
        let cmd = script::with_marker(
            script::command_file(Mode::Run, req.cwd.as_deref(), &req.cmd)?,
            &marker,
        );
        let env = script::env_file(&marked(&req.env, &marker))?;
        let root = RunnerDir::open(dir)?;
        let pipe = self.runner_pipe(container, &root).await?;
        let ended = run(
            container,
            &root,
            pipe,
            (&cmd, &env),
            (stdin, stdout, stderr),
            deadline,
            ACK_TIMEOUT,
        )
        .await?;
        let error = match ended {
            Ended::Exit(exit_code) => {
                return Ok(ExecOutcome {
                    exit_code,
                    timed_out: false,
                });
            }
            Ended::TimedOut { ran } => {
                if ran {
                    self.kill_marked(container, &marker).await;
                }
                return Ok(timed_out());
            }
            Ended::Broken(error) => error,
        };
        self.kill_marked(container, &marker).await;
        Err(Failure::Failed(match error {
            RunError::Output(source) => DockerError::Output {
                container: container.to_string(),
                source,
            },
            RunError::Runner(reason) => DockerError::Interrupted {
                container: container.to_string(),
                reason,
            },
        }))
    }

    async fn start_through(
        &self,
        container: &str,
        dir: &Path,
        req: &ExecRequest,
    ) -> Result<String, Failure> {
        let deadline = Instant::now() + BACKGROUND_WAIT;
        let marker = new_exec_id();
        let cmd = script::command_file(Mode::Background, req.cwd.as_deref(), &req.cmd)?;
        let env = script::env_file(&marked(&req.env, &marker))?;
        let root = RunnerDir::open(dir)?;
        let pipe = self.runner_pipe(container, &root).await?;
        start(container, &root, pipe, (&cmd, &env), deadline, ACK_TIMEOUT).await?;
        Ok(marker)
    }

    /// The request pipe of a running runner in `root`; starts one if there
    /// is none.
    async fn runner_pipe(&self, container: &str, root: &RunnerDir) -> Result<Pipe, Failure> {
        if let Some(pipe) = root.live_pipe(false)? {
            return Ok(pipe);
        }
        if root.is_unsupported(container) {
            return Err(Failure::Unavailable(
                "the runner does not work in this container".to_string(),
            ));
        }
        let _lock = root.lock(LOCK_WAIT).await?;
        // Another process may have started one meanwhile; pipes no runner
        // reads are left over from a runner that is gone.
        if let Some(pipe) = root.live_pipe(true)? {
            return Ok(pipe);
        }
        if root.is_unsupported(container) {
            return Err(Failure::Unavailable(
                "the runner does not work in this container".to_string(),
            ));
        }
        root.forget_others(container);
        let name = root.new_runner(&script::runner_file())?;
        let answer = tokio::time::timeout(START_TIMEOUT, self.start_runner(container, &name)).await;
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                root.remove_runner(&name);
                return Err(if e.is_gone() {
                    Failure::Failed(e)
                } else {
                    Failure::Unavailable(format!("cannot start the runner: {e}"))
                });
            }
            Err(_) => {
                root.remove_runner(&name);
                return Err(Failure::Unavailable(format!(
                    "the runner did not start in {}s",
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        if answer.trim_end() != "ok" {
            let why: String = answer.trim().chars().take(500).collect();
            let why = if why.is_empty() {
                "the runner's start said nothing".to_string()
            } else {
                why
            };
            tracing::info!(container, %why, "the runner does not work in this sandbox; its commands run through the engine's exec");
            root.mark_unsupported(container, &why);
            root.remove_runner(&name);
            return Err(Failure::Unavailable(why));
        }
        let ready_by = Instant::now() + READY_WAIT;
        loop {
            if let Some(pipe) = root.open_pipe(&name)? {
                tracing::debug!(container, pipe = %name, "runner started");
                return Ok(pipe);
            }
            if Instant::now() >= ready_by {
                return Err(Failure::Unavailable(
                    "the runner did not open its pipe in time".to_string(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Starts the runner for the pipe `name` with one attached engine exec;
    /// returns what it said (`ok`, or why not).
    async fn start_runner(&self, container: &str, name: &str) -> Result<String, DockerError> {
        let options = CreateExecOptions::<String> {
            cmd: Some(script::start_command(
                RUNNER_MOUNT,
                name,
                &files::script_of(name),
            )),
            attach_stdin: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let id = self
            .docker
            .create_exec(container, options)
            .await
            .map_err(|e| exec_error(container, "create exec in", e))?
            .id;
        let started = self
            .docker
            .start_exec(&id, None)
            .await
            .map_err(|e| exec_error(container, "start exec in", e))?;
        let StartExecResults::Attached { mut output, .. } = started else {
            return Ok(String::new());
        };
        let mut said = Vec::new();
        while let Some(item) = output.next().await {
            let bytes = item
                .map_err(|e| DockerError::engine("read the runner's start in", container, e))?
                .into_bytes();
            let room = ANSWER_LIMIT.saturating_sub(said.len());
            said.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        Ok(String::from_utf8_lossy(&said).into_owned())
    }
}

/// How a request the runner took ended.
#[derive(Debug)]
enum Ended {
    Exit(i64),
    /// The deadline passed; `ran` when the runner had claimed the request
    /// (its processes are to be killed).
    TimedOut {
        ran: bool,
    },
    /// Streaming failed after the command started: it is to be killed.
    Broken(RunError),
}

/// Runs a request (its `cmd` and `env` files) through the runner of
/// `pipe`, streaming its output to the two writers.
async fn run(
    container: &str,
    root: &RunnerDir,
    pipe: Pipe,
    (cmd, env): (&str, &str),
    (stdin, stdout, stderr): (
        Option<&mut (dyn AsyncRead + Unpin + Send)>,
        &mut (impl AsyncWrite + Unpin),
        &mut (impl AsyncWrite + Unpin),
    ),
    deadline: Instant,
    ack: Duration,
) -> Result<Ended, Failure> {
    let (request, readers) = root.new_request(cmd, env, stdin.is_some())?;
    // `_life` is held until this returns: the runner's watch kills the
    // command when it closes before the command ended (hermes killed).
    let Readers {
        mut out,
        mut err,
        status,
        life: _life,
        input,
    } = readers;
    let mut status = StatusReader::new(status);
    match claimed(container, root, pipe, &request, &mut status, deadline, ack).await? {
        Claim::Started => {}
        Claim::TimedOut { ran } => return Ok(Ended::TimedOut { ran }),
    }
    let finish = async {
        let mut code = None;
        while let Some(line) = status.next().await.map_err(RunError::Runner)? {
            match line {
                Status::EnvRead => request.remove_files(),
                Status::Exit(c) if code.is_none() => code = Some(c),
                other => {
                    return Err(RunError::Runner(format!(
                        "the runner answered {other:?} out of turn"
                    )));
                }
            }
        }
        Ok(code)
    };
    let all = async { tokio::try_join!(pump(&mut out, stdout), pump(&mut err, stderr), finish) };
    // The input is fed while the command runs, and dropped (closed) when
    // it ends or hermes's own input does.
    let feed = feed(stdin, input);
    let all = async {
        tokio::pin!(feed);
        tokio::pin!(all);
        let mut fed = false;
        loop {
            tokio::select! {
                r = &mut all => break r,
                () = &mut feed, if !fed => fed = true,
            }
        }
    };
    let result = tokio::time::timeout_at(deadline, all).await;
    match result {
        Ok(Ok((_, _, Some(code)))) => Ok(Ended::Exit(code)),
        Ok(Ok((_, _, None))) => Err(Failure::Failed(DockerError::Interrupted {
            container: container.to_string(),
            reason: "the runner ended without an exit code (the container stopped?)".to_string(),
        })),
        Ok(Err(error)) => Ok(Ended::Broken(error)),
        Err(_elapsed) => Ok(Ended::TimedOut { ran: true }),
    }
}

/// Starts a request detached through the runner of `pipe`; returns once
/// the runner says it started.
async fn start(
    container: &str,
    root: &RunnerDir,
    pipe: Pipe,
    (cmd, env): (&str, &str),
    deadline: Instant,
    ack: Duration,
) -> Result<(), Failure> {
    let (request, readers) = root.new_request(cmd, env, false)?;
    let Readers {
        mut out,
        mut err,
        status,
        life: _,
        input: _,
    } = readers;
    let mut status = StatusReader::new(status);
    let interrupted = |reason: &str| {
        Failure::Failed(DockerError::Interrupted {
            container: container.to_string(),
            reason: reason.to_string(),
        })
    };
    match claimed(container, root, pipe, &request, &mut status, deadline, ack).await? {
        Claim::Started => {}
        Claim::TimedOut { .. } => {
            return Err(interrupted("the runner did not start the command in time"));
        }
    }
    let mut message = Vec::new();
    let mut ignored = Vec::new();
    let finish = async {
        let mut code = None;
        while let Some(line) = status.next().await? {
            match line {
                Status::EnvRead => request.remove_files(),
                Status::Exit(c) if code.is_none() => code = Some(c),
                other => return Err(format!("the runner answered {other:?} out of turn")),
            }
        }
        Ok(code)
    };
    let all = async {
        tokio::try_join!(
            read_some(&mut out, &mut message, MESSAGE_LIMIT),
            read_some(&mut err, &mut ignored, 0),
            finish
        )
    };
    let result = tokio::time::timeout_at(deadline, all).await;
    match result {
        Ok(Ok((_, _, Some(0)))) => Ok(()),
        Ok(Ok((_, _, Some(code)))) => {
            let text = String::from_utf8_lossy(&message).trim().to_string();
            Err(Failure::Failed(DockerError::NotStarted {
                container: container.to_string(),
                message: if text.is_empty() {
                    format!("exit code {code}")
                } else {
                    text
                },
            }))
        }
        Ok(Ok((_, _, None))) => Err(interrupted(
            "the runner ended without saying whether the command started",
        )),
        Ok(Err(reason)) => Err(interrupted(&reason)),
        Err(_) => Err(interrupted("the runner did not start the command in time")),
    }
}

/// Hands `request` to the runner of `pipe` and waits until the runner
/// claims it. Not claimed in [`ACK_TIMEOUT`] (or by the deadline): the
/// request is withdrawn if it still can be.
async fn claimed(
    container: &str,
    root: &RunnerDir,
    pipe: Pipe,
    request: &Request<'_>,
    status: &mut StatusReader,
    deadline: Instant,
    ack: Duration,
) -> Result<Claim, Failure> {
    pipe.ring(request.name())
        .map_err(|e| Failure::Unavailable(format!("cannot hand the runner a request: {e}")))?;
    let interrupted = |reason: String| {
        Failure::Failed(DockerError::Interrupted {
            container: container.to_string(),
            reason,
        })
    };
    let mut wait_until = deadline.min(Instant::now() + ack);
    loop {
        let why = match tokio::time::timeout_at(wait_until, status.next()).await {
            Ok(Ok(Some(Status::Started))) => return Ok(Claim::Started),
            Ok(Ok(Some(other))) => format!("the runner answered {other:?} out of turn"),
            Ok(Ok(None)) => "the runner stopped before it started the command".to_string(),
            Ok(Err(e)) => e,
            Err(_elapsed) => {
                let waited = if wait_until >= deadline {
                    "the deadline passed"
                } else {
                    "the runner did not answer"
                };
                match request.withdraw() {
                    Ok(true) if wait_until >= deadline => {
                        return Ok(Claim::TimedOut { ran: false });
                    }
                    Ok(true) => {
                        tracing::warn!(
                            container,
                            pipe = pipe.name(),
                            "the runner did not answer in {ack:?}; asking it to stop"
                        );
                        root.retire(pipe);
                        return Err(Failure::Unavailable(format!("{waited} in {ack:?}")));
                    }
                    // Claimed meanwhile: it is the runner's now.
                    Ok(false) if wait_until >= deadline => {
                        return Ok(Claim::TimedOut { ran: true });
                    }
                    Ok(false) => {
                        wait_until = deadline;
                        continue;
                    }
                    Err(e) => {
                        return Err(interrupted(format!(
                            "{waited}, and the request could not be withdrawn: {e}"
                        )));
                    }
                }
            }
        };
        // An answer that is not a claim: withdrawn, it never ran;
        // otherwise its fate is unknown, which is an error.
        return match request.withdraw() {
            Ok(true) => {
                root.retire(pipe);
                Err(Failure::Unavailable(why))
            }
            _ => Err(interrupted(why)),
        };
    }
}

/// The request's environment: the caller's, and the exec's marker.
fn marked(env: &[(String, String)], marker: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| k != EXEC_ID_ENV)
        .cloned()
        .collect();
    out.push((EXEC_ID_ENV.to_string(), marker.to_string()));
    out
}

fn timed_out() -> ExecOutcome {
    ExecOutcome {
        exit_code: TIMEOUT_EXIT_CODE,
        timed_out: true,
    }
}

/// Copies hermes's standard input to the command's pipe `in`, and closes
/// it at the end: the command reads end of file. A command that does not
/// read it all is no error.
async fn feed(from: Option<&mut (dyn AsyncRead + Unpin + Send)>, to: Option<pipe::Sender>) {
    if let (Some(from), Some(mut to)) = (from, to) {
        let _ = tokio::io::copy(from, &mut to).await;
    }
}

/// Copies a pipe to a writer as it comes, flushing each piece (live).
async fn pump(
    from: &mut pipe::Receiver,
    to: &mut (impl AsyncWrite + Unpin),
) -> Result<(), RunError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from
            .read(&mut buf)
            .await
            .map_err(|e| RunError::Runner(format!("cannot read the command's output: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await.map_err(RunError::Output)?;
        to.flush().await.map_err(RunError::Output)?;
    }
}

/// Reads a pipe to its end, keeping the first `limit` bytes.
async fn read_some(
    from: &mut (impl AsyncRead + Unpin),
    into: &mut Vec<u8>,
    limit: usize,
) -> Result<(), String> {
    let mut buf = [0u8; 8192];
    loop {
        let n = from
            .read(&mut buf)
            .await
            .map_err(|e| format!("cannot read the runner's answer: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        let room = limit.saturating_sub(into.len());
        into.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// The lines of a status pipe, read strictly and within bounds.
struct StatusReader {
    pipe: pipe::Receiver,
    buf: Vec<u8>,
    read: usize,
}

impl StatusReader {
    fn new(pipe: pipe::Receiver) -> StatusReader {
        StatusReader {
            pipe,
            buf: Vec::new(),
            read: 0,
        }
    }

    /// The next line; `None` at the end. Anything but a status line, or
    /// more than [`ANSWER_LIMIT`] bytes in all, is an error.
    async fn next(&mut self) -> Result<Option<Status>, String> {
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                let line = &line[..line.len() - 1];
                return Status::parse(line).map(Some).ok_or_else(|| {
                    format!(
                        "the runner answered {:?}",
                        String::from_utf8_lossy(line)
                            .chars()
                            .take(80)
                            .collect::<String>()
                    )
                });
            }
            let mut chunk = [0u8; 256];
            let n = self
                .pipe
                .read(&mut chunk)
                .await
                .map_err(|e| format!("cannot read the runner's status: {e}"))?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err("the runner's status ended in the middle of a line".to_string())
                };
            }
            self.read += n;
            if self.read > ANSWER_LIMIT {
                return Err("the runner said too much on its status pipe".to_string());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The exchange with a real runner, run on the host against a
    //! directory of the test's own (the engine is not needed: the runner
    //! is sh; `tests/tests/` runs it in real sandboxes).

    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::PathBuf;

    use super::*;

    /// A runner on the host, asked to stop when dropped.
    struct LocalRunner {
        _base: tempfile::TempDir,
        dir: PathBuf,
        root: RunnerDir,
        pipe: String,
    }

    impl LocalRunner {
        fn start() -> LocalRunner {
            let (base, dir) = files::tests::runner_dir();
            let root = RunnerDir::open(&dir).unwrap();
            let pipe = root.new_runner(&script::runner_file()).unwrap();
            // The engine starts `docker exec` processes with every signal at
            // its default; a test run launched under nohup or from a
            // non-interactive shell may ignore SIGINT and SIGQUIT, which a
            // shell cannot undo, so the stand-in resets them as the engine
            // would (GNU env's --default-signal).
            let out = std::process::Command::new("env")
                .arg("--default-signal=INT,QUIT,HUP")
                .arg("sh")
                .args(
                    script::start_command(dir.to_str().unwrap(), &pipe, &files::script_of(&pipe))
                        .iter()
                        .skip(1),
                )
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{out:?}");
            let runner = LocalRunner {
                _base: base,
                dir,
                root,
                pipe,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if runner.root.open_pipe(&runner.pipe).unwrap().is_some() {
                    return runner;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            panic!("the runner did not open its pipe");
        }

        fn pipe(&self) -> Pipe {
            self.root.open_pipe(&self.pipe).unwrap().unwrap()
        }

        /// Runs `argv` with `env` in `cwd`: the result, stdout, stderr.
        async fn run(
            &self,
            argv: &[&str],
            env: &[(&str, &str)],
            cwd: Option<&str>,
        ) -> (Result<Ended, Failure>, String, String) {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let cmd = script::command_file(Mode::Run, cwd, &argv).unwrap();
            let env = script::env_file(&marked(&env, "m")).unwrap();
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let ended = run(
                "c",
                &self.root,
                self.pipe(),
                (&cmd, &env),
                (None, &mut out, &mut err),
                Instant::now() + Duration::from_secs(30),
                Duration::from_secs(10),
            )
            .await;
            (
                ended,
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
            )
        }

        /// The names in the runner's directory besides its pipe.
        fn leftovers(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| *n != self.pipe && *n != files::script_of(&self.pipe))
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for LocalRunner {
        fn drop(&mut self) {
            if let Ok(Some(pipe)) = self.root.open_pipe(&self.pipe) {
                self.root.retire(pipe);
            }
        }
    }

    fn exit(ended: &Result<Ended, Failure>) -> Option<i64> {
        match ended {
            Ok(Ended::Exit(code)) => Some(*code),
            _ => None,
        }
    }

    #[tokio::test]
    async fn output_streams_apart_with_the_exit_code_environment_and_directory() {
        let runner = LocalRunner::start();
        let (ended, out, err) = runner
            .run(
                &[
                    "sh",
                    "-c",
                    "echo out; echo err >&2; printf '%s|%s|' \"$SECRET\" \"$1\"; pwd; exit 7",
                    "zero",
                    "it's \"one\" $HOME",
                ],
                &[("SECRET", "s3cr3t 'quoted'\nvalue")],
                Some("/tmp"),
            )
            .await;
        assert_eq!(exit(&ended), Some(7), "{ended:?}");
        assert_eq!(out, "out\ns3cr3t 'quoted'\nvalue|it's \"one\" $HOME|/tmp\n");
        assert_eq!(err, "err\n");
        assert!(runner.leftovers().is_empty(), "{:?}", runner.leftovers());
    }

    #[tokio::test]
    async fn the_environment_is_the_runners_plus_the_request_and_no_more() {
        let runner = LocalRunner::start();
        let (ended, out, _) = runner
            .run(&["env"], &[("HERMES_EXEC_ID", "forged"), ("A", "1")], None)
            .await;
        assert_eq!(exit(&ended), Some(0), "{ended:?}");
        assert!(out.contains("\nA=1\n"), "{out}");
        assert!(out.contains("HERMES_EXEC_ID=m\n"), "{out}");
        assert!(!out.contains("forged"), "{out}");
        assert!(!out.contains("hermes_"), "{out}");
        for added in ["OLDPWD=", "SHLVL="] {
            assert_eq!(
                out.lines().any(|l| l.starts_with(added)),
                std::env::var_os(added.trim_end_matches('=')).is_some(),
                "{added} in {out}"
            );
        }
    }

    #[tokio::test]
    async fn the_request_files_are_empty_or_gone_before_the_command_starts() {
        let runner = LocalRunner::start();
        let (ended, out, _) = runner
            .run(
                &[
                    "sh",
                    "-c",
                    "d=$(dirname \"$(readlink /proc/$$/fd/1)\"); \
                     for f in cmd env; do if [ -e \"$d/$f\" ]; then wc -c < \"$d/$f\"; else echo gone; fi; done",
                ],
                &[("SECRET", "s3cr3t")],
                None,
            )
            .await;
        assert_eq!(exit(&ended), Some(0), "{ended:?}");
        for line in out.lines() {
            assert!(line == "0" || line == "gone", "{out}");
        }
        assert_eq!(out.lines().count(), 2, "{out}");
    }

    #[tokio::test]
    async fn a_missing_program_or_directory_is_126_in_the_engines_words() {
        let runner = LocalRunner::start();
        let (ended, out, _) = runner.run(&["no-such-program"], &[], None).await;
        assert_eq!(exit(&ended), Some(126));
        assert_eq!(
            out,
            "exec failed: unable to start container process: exec: \"no-such-program\": executable file not found in $PATH\n"
        );
        let (ended, out, _) = runner.run(&["/no/such"], &[], None).await;
        assert_eq!(exit(&ended), Some(126));
        assert!(
            out.contains("stat /no/such: no such file or directory"),
            "{out}"
        );
        let (ended, out, _) = runner.run(&["true"], &[], Some("/no/such/dir")).await;
        assert_eq!(exit(&ended), Some(126));
        assert_eq!(
            out,
            "exec failed: unable to start container process: chdir to cwd (\"/no/such/dir\") failed: no such file or directory\n"
        );
        let (ended, out, _) = runner.run(&["true"], &[], Some("relative")).await;
        assert_eq!(exit(&ended), Some(126));
        assert_eq!(out, "exec failed: Cwd must be an absolute path\n");
        // The command's own PATH is searched.
        let (ended, out, _) = runner
            .run(&["ls", "/"], &[("PATH", "/nowhere")], None)
            .await;
        assert_eq!(exit(&ended), Some(126), "{out}");
    }

    #[tokio::test]
    async fn the_command_leads_its_own_session_with_default_signals() {
        let runner = LocalRunner::start();
        let (ended, out, _) = runner
            .run(
                &[
                    "sh",
                    "-c",
                    "read -r s < /proc/$$/stat; echo \"$s\"; \
                     while read -r k v; do [ \"$k\" = SigIgn: ] && echo \"$v\"; done < /proc/$$/status; \
                     for f in /proc/$$/fd/*; do echo \"${f##*/} $(readlink $f)\"; done",
                ],
                &[],
                None,
            )
            .await;
        assert_eq!(exit(&ended), Some(0), "{ended:?}");
        let mut lines = out.lines();
        let stat = lines.next().unwrap();
        let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split(' ').collect();
        let pid = stat.split(' ').next().unwrap();
        assert_eq!(
            (fields[2], fields[3]),
            (pid, pid),
            "pgrp and session of {stat}"
        );
        let ignored = u64::from_str_radix(lines.next().unwrap(), 16).unwrap();
        assert_eq!(ignored & 0b110, 0, "SIGINT or SIGQUIT ignored: {ignored:x}");
        // stdin from /dev/null, stdout and stderr the request's pipes, and
        // nothing else of the runner's.
        let fds: Vec<&str> = lines.collect();
        let dir = runner.dir.display().to_string();
        assert!(fds.contains(&"0 /dev/null"), "{fds:?}");
        assert!(
            fds.iter()
                .any(|f| f.starts_with("1 ") && f.ends_with("/out")),
            "{fds:?}"
        );
        assert!(
            fds.iter()
                .any(|f| f.starts_with("2 ") && f.ends_with("/err")),
            "{fds:?}"
        );
        assert_eq!(
            fds.iter().filter(|f| f.contains(&dir)).count(),
            2,
            "{fds:?}"
        );
    }

    #[tokio::test]
    async fn a_command_killing_its_process_group_leaves_the_runner_serving() {
        let runner = LocalRunner::start();
        let (ended, out, err) = runner
            .run(&["sh", "-c", "echo a; kill 0; echo b"], &[], None)
            .await;
        assert_eq!(exit(&ended), Some(143), "{ended:?}");
        assert_eq!((out.as_str(), err.as_str()), ("a\n", ""));
        let (ended, out, _) = runner.run(&["echo", "still here"], &[], None).await;
        assert_eq!((exit(&ended), out.as_str()), (Some(0), "still here\n"));
    }

    #[tokio::test]
    async fn ten_megabytes_pass_intact() {
        let runner = LocalRunner::start();
        let (ended, out, err) = runner
            .run(
                &[
                    "sh",
                    "-c",
                    "seq 1 1500000 | head -c 10485760; echo done >&2",
                ],
                &[],
                None,
            )
            .await;
        assert_eq!(exit(&ended), Some(0), "{ended:?}");
        assert_eq!(out.len(), 10 * 1024 * 1024);
        for (i, line) in out.lines().take(1_000_000).enumerate() {
            assert_eq!(line, (i + 1).to_string());
        }
        assert_eq!(err, "done\n");
    }

    #[tokio::test]
    async fn concurrent_requests_through_one_runner_get_their_own_output() {
        let runner = LocalRunner::start();
        let runs = (0..16).map(|i| {
            let runner = &runner;
            async move {
                let n = i.to_string();
                let (ended, out, err) = runner
                    .run(
                        &[
                            "sh",
                            "-c",
                            "sleep 0.$1; echo out $1; echo err $1 >&2; exit $1",
                            "-",
                            &n,
                        ],
                        &[],
                        None,
                    )
                    .await;
                assert_eq!(exit(&ended), Some(i), "{ended:?}");
                assert_eq!(out, format!("out {i}\n"));
                assert_eq!(err, format!("err {i}\n"));
            }
        });
        futures_util::future::join_all(runs).await;
        assert!(runner.leftovers().is_empty(), "{:?}", runner.leftovers());
    }

    #[tokio::test]
    async fn a_timeout_before_the_end_says_the_command_ran() {
        let runner = LocalRunner::start();
        let cmd = script::command_file(Mode::Run, None, &["sleep".into(), "30".into()]).unwrap();
        let env = script::env_file(&marked(&[], "m")).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let started = Instant::now();
        let ended = run(
            "c",
            &runner.root,
            runner.pipe(),
            (&cmd, &env),
            (None, &mut out, &mut err),
            Instant::now() + Duration::from_millis(500),
            Duration::from_secs(10),
        )
        .await;
        assert!(
            matches!(ended, Ok(Ended::TimedOut { ran: true })),
            "{ended:?}"
        );
        // Long before the command's end.
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    /// A "runner" that is only a reader of the pipe: it takes lines, and
    /// claims requests when told to.
    fn fake_runner() -> (tempfile::TempDir, PathBuf, RunnerDir, String, File) {
        let (base, dir) = files::tests::runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let pipe = root.new_runner("").unwrap();
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(&pipe))
            .unwrap();
        (base, dir, root, pipe, reader)
    }

    use std::fs::File;
    use std::io::Read;

    #[tokio::test]
    async fn a_request_nobody_claims_is_withdrawn_and_its_pipe_retired() {
        let (_base, dir, root, pipe, mut reader) = fake_runner();
        let cmd = script::command_file(Mode::Run, None, &["true".into()]).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ended = run(
            "c",
            &root,
            root.open_pipe(&pipe).unwrap().unwrap(),
            (&cmd, "export SECRET='x'\n"),
            (None, &mut out, &mut err),
            Instant::now() + Duration::from_secs(30),
            Duration::from_millis(200),
        )
        .await;
        assert!(matches!(ended, Err(Failure::Unavailable(_))), "{ended:?}");
        let mut said = [0u8; 256];
        let n = reader.read(&mut said).unwrap();
        let said = String::from_utf8_lossy(&said[..n]).into_owned();
        assert!(
            said.starts_with("x.") && said.ends_with("\nq\n"),
            "{said:?}"
        );
        // Nothing left: no request (and no secret), no pipe.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_request_claimed_late_is_never_withdrawn() {
        let (_base, dir, root, pipe, mut reader) = fake_runner();
        // Claimed as soon as it is read (well inside the second hermes
        // waits for an answer), and never answered.
        let claim = std::thread::spawn(move || {
            let mut line = [0u8; 128];
            let n = reader.read(&mut line).unwrap();
            let name = String::from_utf8_lossy(&line[..n]).trim().to_string();
            std::fs::write(dir.join(name).join("claim"), "").unwrap();
        });
        let cmd = script::command_file(Mode::Run, None, &["true".into()]).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ended = run(
            "c",
            &root,
            root.open_pipe(&pipe).unwrap().unwrap(),
            (&cmd, ""),
            (None, &mut out, &mut err),
            Instant::now() + Duration::from_secs(2),
            Duration::from_secs(1),
        )
        .await;
        claim.join().unwrap();
        // Claimed, never started: at the deadline it counts as run (its
        // processes get killed), and it is not handed to the engine.
        assert!(
            matches!(ended, Ok(Ended::TimedOut { ran: true })),
            "{ended:?}"
        );
    }

    #[tokio::test]
    async fn background_commands_start_detached_or_say_why_not() {
        let runner = LocalRunner::start();
        // The command waits (at most a minute) until the test lets it go,
        // then writes its pid: start returns while it waits.
        let (marker, go) = (runner.dir.join("started"), runner.dir.join("go"));
        let line = "i=0; while [ ! -e \"$2\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
                      echo $$ > \"$1\"";
        let argv: Vec<String> = ["sh", "-c", line, "-"]
            .iter()
            .map(|s| s.to_string())
            .chain([marker.display().to_string(), go.display().to_string()])
            .collect();
        let cmd = script::command_file(Mode::Background, None, &argv).unwrap();
        start(
            "c",
            &runner.root,
            runner.pipe(),
            (&cmd, ""),
            Instant::now() + Duration::from_secs(10),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert!(!marker.exists(), "start waited for the command's end");
        std::fs::write(&go, "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid = || std::fs::read_to_string(&marker).unwrap_or_default();
        while !pid().ends_with('\n') && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(pid().trim().parse::<u32>().is_ok(), "{:?}", pid());

        let cmd =
            script::command_file(Mode::Background, None, &["no-such-program".into()]).unwrap();
        let failed = start(
            "c",
            &runner.root,
            runner.pipe(),
            (&cmd, ""),
            Instant::now() + Duration::from_secs(10),
            Duration::from_secs(5),
        )
        .await;
        match failed {
            Err(Failure::Failed(DockerError::NotStarted { message, .. })) => {
                assert!(
                    message.contains("\"no-such-program\": executable file not found"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
