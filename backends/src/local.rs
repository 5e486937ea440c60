//! The `local` backend as an [`Executor`]: commands run on this host, each
//! in a process group of its own, a watch's, which a timeout kills whole,
//! and which the watch kills when the calling process dies before the
//! command ended ([`watch_group`]). No isolation: the command is the user's.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::exec::{ExecIo, ExecOutcome, ExecRequest, Executor, TIMEOUT_EXIT_CODE, TtyIo};

/// Why a local command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("no command given")]
    NoCommand,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot start the watch over the command: {0}")]
    Watch(std::io::Error),
    #[error("the command's output: {0}")]
    Output(std::io::Error),
    #[error("cannot open a terminal for the command: {0}")]
    Pty(std::io::Error),
}

/// This host. `default_cwd`: where a command runs when the request names
/// no directory (`None`: the caller's own).
#[derive(Debug, Clone, Default)]
pub struct Local {
    pub default_cwd: Option<PathBuf>,
}

impl Executor for Local {
    type Error = LocalError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, LocalError> {
        let (program, rest) = req.cmd.split_first().ok_or(LocalError::NoCommand)?;
        // The watch first, the command then in its group: no moment exists
        // where this process can die with the command started and unwatched.
        let mut watch = watch_group().map_err(LocalError::Watch)?;
        let group = watch
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| {
                LocalError::Watch(std::io::Error::other("the watch has no process id"))
            })?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(rest)
            .envs(req.env.iter().map(|(k, v)| (k, v)))
            .process_group(group)
            .kill_on_drop(true)
            .stdin(if io.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(cwd) = req
            .cwd
            .as_ref()
            .map(PathBuf::from)
            .or(self.default_cwd.clone())
        {
            cmd.current_dir(cwd);
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                let _ = watch.kill().await;
                return Err(LocalError::Spawn {
                    program: program.clone(),
                    source,
                });
            }
        };
        let mut child_out = child.stdout.take();
        let mut child_err = child.stderr.take();
        let child_in = child.stdin.take();
        let ExecIo {
            stdin,
            stdout,
            stderr,
        } = io;
        let feed = async move {
            if let (Some(from), Some(mut to)) = (stdin, child_in) {
                // The command may end without reading it all: not an error.
                let _ = tokio::io::copy(from, &mut to).await;
                let _ = to.shutdown().await;
            }
        };
        let copy = async {
            let out = async {
                match child_out.as_mut() {
                    Some(o) => tokio::io::copy(o, stdout).await.map(|_| ()),
                    None => Ok(()),
                }
            };
            let err = async {
                match child_err.as_mut() {
                    Some(e) => tokio::io::copy(e, stderr).await.map(|_| ()),
                    None => Ok(()),
                }
            };
            // The first failed write ends both: a closed stdout must not
            // wait for the end of a stderr the command keeps open.
            tokio::try_join!(out, err).map(|_| ())
        };
        let run = async {
            copy.await.map_err(LocalError::Output)?;
            child.wait().await.map_err(LocalError::Output)
        };
        let result = {
            tokio::pin!(feed);
            let run = tokio::time::timeout(req.timeout, run);
            tokio::pin!(run);
            let mut fed = false;
            loop {
                tokio::select! {
                    r = &mut run => break r,
                    () = &mut feed, if !fed => fed = true,
                }
            }
        };
        // The command ended (or is killed below): what it left in the
        // background stays.
        let _ = watch.kill().await;
        match result {
            Ok(Err(e)) => {
                // The output had nowhere to go (its reader gone): the
                // command's whole group ends, as SIGPIPE would end it.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait().await;
                Err(e)
            }
            Ok(Ok(status)) => Ok(ExecOutcome {
                exit_code: i64::from(status.code().unwrap_or(128 + signal_of(&status))),
                timed_out: false,
            }),
            Err(_) => {
                // The whole process group, children included.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait().await;
                Ok(ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                })
            }
        }
    }
}

impl Local {
    /// Runs `req` on a terminal of its own ([`crate::pty`]); on timeout
    /// the command's process group is killed.
    pub async fn exec_tty(
        &self,
        req: &ExecRequest,
        io: TtyIo<'_>,
    ) -> Result<ExecOutcome, LocalError> {
        let (program, rest) = req.cmd.split_first().ok_or(LocalError::NoCommand)?;
        let mut cmd = pty_process::Command::new(program)
            .args(rest)
            .envs(req.env.iter().map(|(k, v)| (k, v)));
        if let Some(cwd) = req
            .cwd
            .as_ref()
            .map(PathBuf::from)
            .or(self.default_cwd.clone())
        {
            cmd = cmd.current_dir(cwd);
        }
        match crate::pty::run(cmd, io, req.timeout).await {
            Ok(crate::pty::Ended::Exited(status)) => Ok(ExecOutcome {
                exit_code: i64::from(status.code().unwrap_or(128 + signal_of(&status))),
                timed_out: false,
            }),
            Ok(crate::pty::Ended::TimedOut) => Ok(ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            }),
            Err(crate::pty::PtyError::Open(e)) => Err(LocalError::Pty(e)),
            Err(crate::pty::PtyError::Spawn(source)) => Err(LocalError::Spawn {
                program: program.clone(),
                source,
            }),
            Err(crate::pty::PtyError::Output(e)) => Err(LocalError::Output(e)),
        }
    }
}

/// A watch over a local command: a small `sh` in a process group of its
/// own (no terminal signal reaches it), which the command then joins. It
/// reads its standard input, a pipe only this process writes, and kills its
/// group, the command's, at its end: when the caller dies, however (`kill
/// -9` included), before the command ended. Started before the command: a
/// caller dying before the command's start takes only the watch; a caller
/// dying while the command is being started leaves the pipe open in the
/// starting command until its `exec`, by when it is in the group. Killed
/// (alone) once the command ended.
fn watch_group() -> std::io::Result<tokio::process::Child> {
    tokio::process::Command::new("/bin/sh")
        .args(["-c", "read -r _; kill -KILL 0", "hermes-watch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

fn signal_of(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}
