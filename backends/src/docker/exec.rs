//! Running a command inside a sandbox.
//!
//! Output streams live, stdout and stderr apart, chunk by chunk as the
//! engine sends it. Every exec carries a unique marker in its environment
//! ([`EXEC_ID_ENV`]); on timeout every process that carries the marker and
//! every descendant of those is stopped and killed, so a timed-out command
//! leaves nothing running inside the container (killing only the client
//! would leave the processes there until the pids limit is exhausted).
//! The kill is done from the host ([`super::hostkill`]: no process in the
//! sandbox, so a command that filled the pids limit cannot stop it); where
//! hermes cannot see or signal the container's processes, a second exec,
//! as root, does it inside.
//!
//! A command ends with the hermes process that runs it, however that
//! process ends (`kill -9` included): beside the command, an engine exec
//! of a small `sh` (the watch, [`watch_script`]) reads its standard input,
//! attached to a connection only hermes holds. The engine closes that
//! input when the connection closes; at its end of file the watch kills
//! the command's processes by marker, descendants included. A command
//! that ends on its own releases its watch with a line first, so what it
//! left in the background stays. Background commands have no watch. An
//! image without `sh` gets none either: the command runs as before.

use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::Engine;
use super::error::{DockerError, exec_error, is_not_found};
use super::hostkill::NotFromHost;
use crate::exec::{
    EXEC_ID_ENV, ExecIo, ExecOutcome, ExecRequest, Executor, KILL_SCRIPT, TIMEOUT_EXIT_CODE,
    new_exec_id,
};

/// How long the kill of a timed-out command may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(15);

impl Engine {
    /// Runs `req` in `container` (id or name), writing its stdout and stderr
    /// to the two writers as they arrive.
    ///
    /// - A container that does not exist or is not running is
    ///   [`DockerError::Gone`]: recreate it and retry once.
    /// - On timeout the whole process tree of the command is killed inside
    ///   the container and the outcome is `timed_out` with exit code 124.
    /// - If a writer fails, the command's processes are killed and the
    ///   error is [`DockerError::Output`].
    /// - If the container goes away while the command runs, the error is
    ///   [`DockerError::Interrupted`] (the command may have run in part).
    pub async fn exec(
        &self,
        container: &str,
        req: &ExecRequest,
        stdout: impl AsyncWrite + Unpin,
        stderr: impl AsyncWrite + Unpin,
    ) -> Result<ExecOutcome, DockerError> {
        self.exec_io(container, req, None, stdout, stderr).await
    }

    /// [`Engine::exec`], the command reading `stdin` (attached to the
    /// engine's exec, closed at its end) when given, else nothing.
    pub async fn exec_io(
        &self,
        container: &str,
        req: &ExecRequest,
        stdin: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        mut stdout: impl AsyncWrite + Unpin,
        mut stderr: impl AsyncWrite + Unpin,
    ) -> Result<ExecOutcome, DockerError> {
        let deadline = Instant::now() + req.timeout;
        let marker = new_exec_id();
        // The watch is up before the command starts: a hermes killed from
        // here on leaves nothing running. Dropped (not released), it kills
        // the command.
        let attach = if stdin.is_some() {
            Attach::All
        } else {
            Attach::Output
        };
        let (exec_id, watch) = tokio::join!(
            self.create_marked_exec(container, req, attach, &marker),
            self.watch(container, &marker)
        );
        let exec_id = exec_id?;
        let start = StartExecOptions {
            detach: false,
            tty: false,
            output_capacity: Some(64 * 1024),
        };
        let started = self
            .docker
            .start_exec(&exec_id, Some(start))
            .await
            .map_err(|e| exec_error(container, "start exec in", e))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(DockerError::Interrupted {
                container: container.to_string(),
                reason: "the engine started the exec detached".to_string(),
            });
        };
        // Without a standard input to give, kept open until the end:
        // closing our half early is not needed and some engines read it as
        // a hang-up. With one, closed at its end: the command reads end of
        // file.
        let mut input = input;
        let feed = async {
            if let Some(from) = stdin {
                let _ = tokio::io::copy(from, &mut input).await;
                let _ = input.shutdown().await;
            }
        };

        let run = async {
            while let Some(item) = output.next().await {
                // Each stream written in its own arm: no `dyn` writer held
                // across an await, so the future stays `Send` when the
                // writers are.
                match item {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                        stdout.write_all(&message).await.map_err(RunError::Output)?;
                        stdout.flush().await.map_err(RunError::Output)?;
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        stderr.write_all(&message).await.map_err(RunError::Output)?;
                        stderr.flush().await.map_err(RunError::Output)?;
                    }
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(e) => {
                        return Err(RunError::Stream(e.to_string()));
                    }
                }
            }
            // The output is closed; the process may outlive it (it can
            // close its stdout), so wait for its exit code.
            self.wait_exit(&exec_id).await
        };
        let run = async {
            tokio::pin!(feed);
            tokio::pin!(run);
            let mut fed = false;
            loop {
                tokio::select! {
                    r = &mut run => break r,
                    () = &mut feed, if !fed => fed = true,
                }
            }
        };
        let result = tokio::time::timeout_at(deadline, run).await;
        let error = match result {
            Ok(Ok(exit_code)) => {
                if let Some(watch) = watch {
                    watch.release().await;
                }
                return Ok(ExecOutcome {
                    exit_code,
                    timed_out: false,
                });
            }
            Err(_elapsed) => {
                // The connection closed whole (both halves) before the
                // kill: a process blocked writing to it is woken (under
                // gVisor it takes no signal while blocked so, and its
                // `/proc` cannot be read).
                drop(output);
                drop(input);
                self.kill_marked(container, &marker).await;
                return Ok(ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                });
            }
            Ok(Err(error)) => error,
        };
        drop(output);
        drop(input);
        match error {
            RunError::Output(source) => {
                self.kill_marked(container, &marker).await;
                Err(DockerError::Output {
                    container: container.to_string(),
                    source,
                })
            }
            RunError::Stream(reason) => {
                self.kill_marked(container, &marker).await;
                Err(DockerError::Interrupted {
                    container: container.to_string(),
                    reason,
                })
            }
            RunError::Lost => Err(DockerError::Interrupted {
                container: container.to_string(),
                reason: "the engine no longer knows the exec (container removed?)".to_string(),
            }),
            RunError::Engine(e) => Err(DockerError::engine("inspect exec in", container, e)),
        }
    }

    /// Creates the engine exec of `req`, its environment in the body and
    /// marked with `marker` ([`EXEC_ID_ENV`], fresh for each exec);
    /// `attach`: whether its output is read. Returns the exec id.
    pub(super) async fn create_marked_exec(
        &self,
        container: &str,
        req: &ExecRequest,
        attach: Attach,
        marker: &str,
    ) -> Result<String, DockerError> {
        let mut env: Vec<String> = req
            .env
            .iter()
            .filter(|(k, _)| k != EXEC_ID_ENV)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{EXEC_ID_ENV}={marker}"));
        let options = CreateExecOptions::<String> {
            cmd: Some(req.cmd.clone()),
            env: Some(env),
            working_dir: req.cwd.clone(),
            attach_stdin: Some(matches!(attach, Attach::All | Attach::Terminal)),
            attach_stdout: Some(attach != Attach::Nothing),
            attach_stderr: Some(attach != Attach::Nothing),
            tty: Some(attach == Attach::Terminal),
            ..Default::default()
        };
        let exec_id = self
            .docker
            .create_exec(container, options)
            .await
            .map_err(|e| exec_error(container, "create exec in", e))?
            .id;
        Ok(exec_id)
    }

    /// Starts `req` in `container` detached and returns at once with the
    /// marker its processes carry ([`EXEC_ID_ENV`]). Its output is not
    /// kept; it runs until it ends or the container stops, and while it
    /// runs the sandbox counts as busy. `req.timeout` does not apply.
    pub async fn exec_background(
        &self,
        container: &str,
        req: &ExecRequest,
    ) -> Result<String, DockerError> {
        let marker = new_exec_id();
        let exec_id = self
            .create_marked_exec(container, req, Attach::Nothing, &marker)
            .await?;
        let start = StartExecOptions {
            detach: true,
            tty: false,
            output_capacity: None,
        };
        self.docker
            .start_exec(&exec_id, Some(start))
            .await
            .map_err(|e| exec_error(container, "start exec in", e))?;
        Ok(marker)
    }

    /// Starts the watch over the command marked `marker`: an engine exec
    /// of [`watch_script`] as the command's user (who may read its
    /// processes' environment and signal them, with no capability), its
    /// standard input attached. `None` when it cannot be started (the
    /// command then runs unwatched, as before).
    pub(super) async fn watch(&self, container: &str, marker: &str) -> Option<Watch> {
        let options = CreateExecOptions::<String> {
            cmd: Some(vec![
                "sh".to_string(),
                "-c".to_string(),
                watch_script(),
                "hermes-watch".to_string(),
                marker.to_string(),
            ]),
            working_dir: Some("/".to_string()),
            attach_stdin: Some(true),
            // Attached, so that its output ends when the watch does.
            attach_stdout: Some(true),
            attach_stderr: Some(false),
            tty: Some(false),
            ..Default::default()
        };
        let started = async {
            let id = self.docker.create_exec(container, options).await?.id;
            self.docker.start_exec(&id, None).await
        };
        match started.await {
            Ok(StartExecResults::Attached { output, input }) => Some(Watch { input, output }),
            Ok(StartExecResults::Detached) => None,
            Err(e) => {
                tracing::debug!(container, error = %e, "cannot start the watch over a command; it runs unwatched");
                None
            }
        }
    }

    /// Polls the exec until it has exited and returns its exit code.
    pub(super) async fn wait_exit(&self, exec_id: &str) -> Result<i64, RunError> {
        let mut pause = Duration::from_millis(5);
        loop {
            match self.docker.inspect_exec(exec_id).await {
                Ok(info) if info.running != Some(true) => {
                    if let Some(code) = info.exit_code {
                        return Ok(code);
                    }
                }
                Ok(_) => {}
                Err(e) if is_not_found(&e) => return Err(RunError::Lost),
                Err(e) => return Err(RunError::Engine(e)),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Stops and kills every process of `container` that carries `marker`,
    /// and their descendants: from the host when it can, as root inside
    /// the container otherwise. Best effort: failures are logged.
    pub(super) async fn kill_marked(&self, container: &str, marker: &str) {
        match self.kill_marked_from_host(container, marker).await {
            Ok(killed) => {
                tracing::debug!(container, killed, "timed-out command killed from the host");
                return;
            }
            Err(why) => {
                tracing::debug!(container, why = %why.0, "cannot kill from the host; killing from inside the container");
            }
        }
        self.kill_marked_inside(container, marker).await;
    }

    /// [`super::hostkill::kill_marked`] for `container`.
    async fn kill_marked_from_host(
        &self,
        container: &str,
        marker: &str,
    ) -> Result<usize, NotFromHost> {
        let info = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(|e| NotFromHost(format!("cannot inspect the container: {e}")))?;
        let pid = match super::top::Seen::of(&info) {
            super::top::Seen::Host { main_pid } => main_pid.unwrap_or(0),
            super::top::Seen::Guest => {
                return Err(NotFromHost(
                    "its runtime runs a kernel of its own: its processes are not the host's"
                        .to_string(),
                ));
            }
        };
        let id = info.id.unwrap_or_default();
        let marker = marker.to_string();
        tokio::task::spawn_blocking(move || super::hostkill::kill_marked(&id, pid, &marker))
            .await
            .map_err(|e| NotFromHost(format!("the kill did not finish: {e}")))?
    }

    /// The kill of [`Engine::kill_marked`] by an engine exec of
    /// [`KILL_SCRIPT`], as root inside the container.
    async fn kill_marked_inside(&self, container: &str, marker: &str) {
        let options = CreateExecOptions::<String> {
            cmd: Some(vec![
                "sh".to_string(),
                "-c".to_string(),
                KILL_SCRIPT.to_string(),
                "hermes-kill".to_string(),
                marker.to_string(),
            ]),
            user: Some("root".to_string()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let kill = async {
            let id = self.docker.create_exec(container, options).await?.id;
            if let StartExecResults::Attached { mut output, .. } =
                self.docker.start_exec(&id, None).await?
            {
                let mut said = Vec::new();
                while let Some(item) = output.next().await {
                    if let Ok(item) = item {
                        said.extend_from_slice(&item.into_bytes());
                    }
                }
                let info = self.docker.inspect_exec(&id).await?;
                if info.exit_code != Some(0) {
                    tracing::warn!(
                        container,
                        exit_code = ?info.exit_code,
                        output = %String::from_utf8_lossy(&said),
                        "the kill of a timed-out command failed"
                    );
                }
            }
            Ok::<(), bollard::errors::Error>(())
        };
        match tokio::time::timeout(KILL_TIMEOUT, kill).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if is_not_found(&e) => {
                tracing::debug!(container, "container gone: nothing left to kill");
            }
            Ok(Err(e)) => {
                tracing::warn!(container, error = %e, "cannot kill a timed-out command");
            }
            Err(_) => {
                tracing::warn!(container, "the kill of a timed-out command did not finish");
            }
        }
    }
}

/// What the watch of a command runs (`sh -c SCRIPT hermes-watch MARKER`):
/// a line on its input is the command's own end (it goes, killing
/// nothing); end of file without one is hermes gone, and the command's
/// processes are killed ([`KILL_SCRIPT`]).
pub(crate) fn watch_script() -> String {
    format!("# hermes-watch\nread -r hermes_l && exit 0\n{KILL_SCRIPT}")
}

/// The watch over one command run by an engine exec: the write half of
/// its attached input, and its output (nothing is written; it ends once
/// the watch ended and its input is closed), held together so that dropping both closes the connection, which
/// the watch reads as hermes gone.
pub(super) struct Watch {
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

/// How long a released watch may take to end: a safety net for an engine
/// that never ends the exec, not a wait (the release waits for the end of
/// the watch's output), so long enough for a loaded engine: one returning
/// before the watch ended would leave it seen after its command.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

impl Watch {
    /// The command ended on its own: its watch goes, killing nothing.
    /// Returns once it ended (so that the sandbox is not seen busy
    /// after the command), or after [`RELEASE_TIMEOUT`].
    pub(super) async fn release(mut self) {
        let ended = async {
            self.input.write_all(b"\n").await?;
            self.input.shutdown().await?;
            while self.output.next().await.is_some() {}
            Ok::<(), std::io::Error>(())
        };
        match tokio::time::timeout(RELEASE_TIMEOUT, ended).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "the watch did not take its release"),
            Err(_) => tracing::debug!("the released watch did not end in time"),
        }
    }
}

/// Which streams of an engine exec hermes attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attach {
    /// None (a detached background command).
    Nothing,
    /// stdout and stderr.
    Output,
    /// stdin too.
    All,
    /// stdin and one output, on a terminal of the engine's (`tty`).
    Terminal,
}

/// Why the streaming part of an exec stopped early.
pub(super) enum RunError {
    Output(std::io::Error),
    Stream(String),
    Lost,
    Engine(bollard::errors::Error),
}

/// One container as an [`Executor`]: commands run in it through its
/// runner when `runner` is given ([`Engine::exec_with_runner`]), through
/// [`Engine::exec_io`] otherwise, with the standard input given.
#[derive(Debug, Clone)]
pub struct Container {
    pub engine: Engine,
    /// The container's id or name.
    pub id: String,
    /// The host directory of its runner ([`super::runner_dir`]).
    pub runner: Option<std::path::PathBuf>,
}

impl Executor for Container {
    type Error = DockerError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, DockerError> {
        self.engine
            .exec_with_runner(
                &self.id,
                self.runner.as_deref(),
                req,
                io.stdin,
                io.stdout,
                io.stderr,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::Write;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    /// A `sleep` of this host carrying `marker`, and the watch over it.
    fn watched(marker: &str) -> (Child, Child) {
        let command = Command::new("sleep")
            .arg("60")
            .env(EXEC_ID_ENV, marker)
            .spawn()
            .unwrap();
        let watch = Command::new("sh")
            .args(["-c", &watch_script(), "hermes-watch", marker])
            .env_remove(EXEC_ID_ENV)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        (command, watch)
    }

    /// Whether `child` ended within a few seconds.
    fn ends(child: &mut Child) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn the_watch_kills_the_command_at_the_end_of_its_input() {
        let marker = new_exec_id();
        let (mut command, mut watch) = watched(&marker);
        drop(watch.stdin.take());
        assert!(ends(&mut watch));
        assert!(ends(&mut command), "the command outlived its watch");
    }

    #[test]
    fn a_released_watch_kills_nothing() {
        let marker = new_exec_id();
        let (mut command, mut watch) = watched(&marker);
        let mut input = watch.stdin.take().unwrap();
        input.write_all(b"\n").unwrap();
        drop(input);
        assert!(ends(&mut watch));
        assert!(
            command.try_wait().unwrap().is_none(),
            "the command was killed"
        );
        command.kill().unwrap();
        command.wait().unwrap();
    }
}
