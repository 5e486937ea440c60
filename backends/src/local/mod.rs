//! The `local` backend as an [`Executor`]: commands run on this host, each
//! in a process group of its own, a watch's, which a timeout kills whole,
//! and which the watch kills when the calling process dies before the
//! command ended ([`watch_group`]). Without a sandbox the command is the
//! user's; with one it runs under bubblewrap ([`bwrap`]), its first
//! process hermes's [`init`]; a background command there gets a sandbox
//! of its own ([`launch`]), which `hermes process` reaches from the host
//! ([`jobs`]).

pub mod bwrap;
pub mod init;
pub mod jobs;
mod launch;
pub mod seccomp;

use std::sync::Arc;

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
    #[error(transparent)]
    Refused(#[from] bwrap::Refusal),
    #[error(transparent)]
    Filter(#[from] seccomp::FilterError),
    #[error("cannot hand the sandbox its seccomp filter: {0}")]
    FilterFd(std::io::Error),
    #[error("cannot launch the background command's sandbox: {0}")]
    Launch(String),
}

/// This host. `default_cwd`: where a command runs when the request names
/// no directory (`None`: the caller's own). `sandbox`: the bubblewrap
/// sandbox each command runs in (`terminal.local_sandbox: bwrap`).
#[derive(Debug, Clone, Default)]
pub struct Local {
    pub default_cwd: Option<PathBuf>,
    pub sandbox: Option<Arc<bwrap::Bwrap>>,
}

/// What a sandboxed command needs kept until it has started: its seccomp
/// filters' descriptors.
pub(super) struct Sandboxed {
    _filters: Vec<std::fs::File>,
}

/// The environment a sandboxed command starts with, from the caller's:
/// these names only (no key, no token, nothing the sandbox may not see);
/// the request's own values come on top.
const SANDBOX_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "COLORTERM",
];

impl Executor for Local {
    type Error = LocalError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, LocalError> {
        let (program, rest) = req.cmd.split_first().ok_or(LocalError::NoCommand)?;
        let start = self.start_dir(req);
        if let Some(sandbox) = &self.sandbox {
            // hermes's own scripts for `hermes process`: answered on the
            // host, where the background sandboxes are seen.
            if let Some((script, args)) = jobs::script_of(&req.cmd) {
                return jobs::answer(&sandbox.jobs(), script, args, io, req.timeout)
                    .await
                    .map_err(LocalError::Output);
            }
            if crate::exec::is_background(&req.cmd) {
                return launch::launch(sandbox, req, start.as_deref(), io).await;
            }
        }
        // Made (and refused) before anything starts.
        let (mut cmd, sandboxed) = match &self.sandbox {
            None => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(rest).envs(req.env.iter().map(|(k, v)| (k, v)));
                if let Some(cwd) = &start {
                    cmd.current_dir(cwd);
                }
                (cmd, None)
            }
            Some(sandbox) => {
                let (cmd, kept) = sandboxed_command(sandbox, req, start.as_deref()).await?;
                (cmd, Some(kept))
            }
        };
        // The watch first, the command then in its group: no moment exists
        // where this process can die with the command started and unwatched.
        let mut watch = watch_group().map_err(LocalError::Watch)?;
        let group = watch
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| {
                LocalError::Watch(std::io::Error::other("the watch has no process id"))
            })?;
        cmd.process_group(group)
            .kill_on_drop(true)
            .stdin(if io.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                let _ = watch.kill().await;
                // What failed to start: bwrap itself, for a sandboxed one.
                let program = match &self.sandbox {
                    Some(sandbox) => sandbox.program.display().to_string(),
                    None => program.clone(),
                };
                return Err(LocalError::Spawn { program, source });
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
        // The filters were read when bwrap started.
        drop(sandboxed);
        let run = async {
            copy.await.map_err(LocalError::Output)?;
            child
                .wait()
                .await
                .map(|status| i64::from(status.code().unwrap_or(128 + signal_of(&status))))
                .map_err(LocalError::Output)
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
            Ok(Ok(exit_code)) => Ok(ExecOutcome {
                exit_code,
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
    /// Where `req` starts: its directory, else the default (`None`: the
    /// caller's own).
    fn start_dir(&self, req: &ExecRequest) -> Option<PathBuf> {
        req.cwd
            .as_ref()
            .map(PathBuf::from)
            .or(self.default_cwd.clone())
    }

    /// Runs `req` on a terminal of its own ([`crate::pty`]); on timeout
    /// the command's process group is killed.
    pub async fn exec_tty(
        &self,
        req: &ExecRequest,
        io: TtyIo<'_>,
    ) -> Result<ExecOutcome, LocalError> {
        let (program, rest) = req.cmd.split_first().ok_or(LocalError::NoCommand)?;
        let start = self.start_dir(req);
        let mut _kept = None;
        let cmd = match &self.sandbox {
            None => {
                let mut cmd = pty_process::Command::new(program)
                    .args(rest)
                    .envs(req.env.iter().map(|(k, v)| (k, v)));
                if let Some(cwd) = start {
                    cmd = cmd.current_dir(cwd);
                }
                cmd
            }
            Some(sandbox) => {
                let (parts, kept) = sandboxed_parts(
                    sandbox,
                    req,
                    start.as_deref(),
                    true,
                    bwrap::Life::WithItsExec,
                )
                .await?;
                _kept = Some(kept);
                pty_process::Command::new(&parts.program)
                    .args(&parts.args)
                    .env_clear()
                    .envs(parts.env)
            }
        };
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

/// The command of `req` in its bubblewrap sandbox: `bwrap ARGS -- hermes
/// sandbox-init … -- CMD…`, with the environment of [`SANDBOX_ENV`] and
/// the request's values. Refused (nothing started) when bwrap cannot make
/// a sandbox here, or the sandbox would expose what it hides.
async fn sandboxed_command(
    sandbox: &bwrap::Bwrap,
    req: &ExecRequest,
    start: Option<&std::path::Path>,
) -> Result<(tokio::process::Command, Sandboxed), LocalError> {
    let (parts, kept) =
        sandboxed_parts(sandbox, req, start, false, bwrap::Life::WithItsExec).await?;
    let mut cmd = tokio::process::Command::new(&parts.program);
    cmd.args(&parts.args).env_clear().envs(parts.env);
    Ok((cmd, kept))
}

/// A sandboxed command's program, arguments and whole environment.
pub(super) struct Parts {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

/// [`sandboxed_command`]'s parts; `tty`: on a terminal of its own (which
/// a new session would take from it: `TIOCSTI` is refused by the filter
/// instead); `life`: how long its sandbox lives.
pub(super) async fn sandboxed_parts(
    sandbox: &bwrap::Bwrap,
    req: &ExecRequest,
    start: Option<&std::path::Path>,
    tty: bool,
    life: bwrap::Life,
) -> Result<(Parts, Sandboxed), LocalError> {
    use std::io::{Seek, Write};
    let start = match start {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(LocalError::Output)?,
    };
    let start = std::fs::canonicalize(&start).unwrap_or(start);
    sandbox.check(&start)?;
    let program = sandbox.program.clone();
    tokio::task::spawn_blocking(move || bwrap::probe(&program))
        .await
        .map_err(|e| LocalError::Watch(std::io::Error::other(e)))?
        .map_err(bwrap::Refusal::Unavailable)?;
    let mut filters = Vec::new();
    for program in seccomp::programs()? {
        // Not close-on-exec: bwrap reads it.
        let fd =
            nix::sys::memfd::memfd_create(c"hermes-seccomp", nix::sys::memfd::MFdFlags::empty())
                .map_err(|e| LocalError::FilterFd(e.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&program).map_err(LocalError::FilterFd)?;
        file.rewind().map_err(LocalError::FilterFd)?;
        filters.push(file);
    }
    let fds: Vec<i32> = filters
        .iter()
        .map(std::os::fd::AsRawFd::as_raw_fd)
        .collect();
    let mut args = sandbox.args(&start, &fds, life);
    if tty {
        args.retain(|a| a != "--new-session");
    }
    args.push("--".into());
    args.push(sandbox.init.clone().into_os_string());
    args.push("sandbox-init".into());
    if sandbox.proxy.is_some() {
        args.push("--proxy".into());
    }
    if matches!(life, bwrap::Life::Background { .. }) {
        args.push("--background".into());
    }
    args.push("--".into());
    args.extend(req.cmd.iter().map(Into::into));
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = Vec::new();
    for name in SANDBOX_ENV {
        if let Some(value) = std::env::var_os(name) {
            env.push((name.into(), value));
        }
    }
    env.extend(
        std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(|k| k.starts_with("LC_"))),
    );
    env.push(("TMPDIR".into(), "/tmp".into()));
    env.extend(req.env.iter().map(|(k, v)| (k.into(), v.into())));
    Ok((
        Parts {
            program: sandbox.program.clone(),
            args,
            env,
        },
        Sandboxed { _filters: filters },
    ))
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
