//! `hermes exec --background` under bwrap: the command's sandbox outlives
//! the exec.
//!
//! The sandbox runs detached from this process (no `--die-with-parent`,
//! a process group of its own), hermes's init as its PID 1 in
//! `--background` mode ([`super::init`]). In order:
//!
//! 1. bwrap starts; on its `--info-fd` it tells the host pid of the
//!    sandbox's PID 1, whose record ([`super::jobs::Record`]) is written
//!    where no sandbox sees it;
//! 2. only then is the init told to go (one byte on the socket that is
//!    its standard input): a hermes that dies before that leaves a
//!    sandbox that runs nothing and ends;
//! 3. the init reports the terminal script's exit code on that socket
//!    once the script started the job; the script's output (a few lines
//!    at most, in memory files: bwrap keeps its standard output open
//!    while the sandbox lives) is passed on, and the exec returns.

use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::LocalError;
use super::bwrap::{Bwrap, Life};
use super::jobs::{Record, job_id};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest, TIMEOUT_EXIT_CODE};

/// How long bwrap has to make the sandbox and say which process it is.
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of the launch's output passed on, per stream.
const MAX_LAUNCH_OUTPUT: u64 = 64 * 1024;

/// Launches `req` (a background start of the terminal script, its job
/// directory under [`super::bwrap::STATE_DIR`]) in a sandbox of its own.
pub(super) async fn launch(
    sandbox: &Bwrap,
    req: &ExecRequest,
    start: Option<&std::path::Path>,
    io: ExecIo<'_>,
) -> Result<ExecOutcome, LocalError> {
    let job = req
        .cmd
        .get(6)
        .and_then(|a| a.strip_prefix("bg="))
        .unwrap_or_default();
    let id = job_id(job)
        .ok_or_else(|| LocalError::Launch(format!("no job directory in {job:?}")))?
        .to_string();
    let jobs = sandbox.jobs();
    let failed = |what: &str, e: std::io::Error| LocalError::Launch(format!("{what}: {e}"));
    // bwrap's info: a pipe whose write end it alone holds (a copy that
    // is not close-on-exec); the init's control: a socket, its stdin.
    let (info_r, info_close_on_exec) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| failed("cannot make a pipe", e.into()))?;
    let info_w = nix::unistd::dup(&info_close_on_exec)
        .map_err(|e| failed("cannot make a pipe", e.into()))?;
    // Else the info would never end.
    drop(info_close_on_exec);
    let (control, init_end) =
        std::os::unix::net::UnixStream::pair().map_err(|e| failed("cannot make a socket", e))?;
    let output = || {
        nix::sys::memfd::memfd_create(c"hermes-launch", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map(std::fs::File::from)
            .map_err(|e| failed("cannot make a memory file", e.into()))
    };
    let (out, err) = (output()?, output()?);
    let info_fd = std::os::fd::AsRawFd::as_raw_fd(&info_w);
    let (parts, kept) =
        super::sandboxed_parts(sandbox, req, start, false, Life::Background { info_fd }).await?;
    let mut cmd = tokio::process::Command::new(&parts.program);
    cmd.args(&parts.args)
        .env_clear()
        .envs(parts.env)
        .process_group(0)
        .kill_on_drop(false)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            init_end,
        )))
        .stdout(
            out.try_clone()
                .map_err(|e| failed("cannot share the output", e))?,
        )
        .stderr(
            err.try_clone()
                .map_err(|e| failed("cannot share the output", e))?,
        );
    let mut child = cmd.spawn().map_err(|source| LocalError::Spawn {
        program: sandbox.program.display().to_string(),
        source,
    })?;
    drop((info_w, kept, cmd));
    let info = tokio::time::timeout(
        INFO_TIMEOUT,
        tokio::task::spawn_blocking(move || read_info(std::fs::File::from(info_r))),
    )
    .await;
    let pid = match info {
        Ok(Ok(Some(pid))) => pid,
        _ => {
            // No sandbox was made (bwrap said why), or it never said
            // which one: nothing of it may run.
            let _ = child.start_kill();
            let status = child.wait().await.map_err(LocalError::Output)?;
            pass_on(&out, &err, io).await?;
            return Ok(ExecOutcome {
                exit_code: i64::from(status.code().unwrap_or(1)),
                timed_out: false,
            });
        }
    };
    let record = Record::of(pid);
    let recorded = record.map(|r| jobs.record(&id, r));
    let Some(Ok(())) = recorded else {
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(LocalError::Launch(match recorded {
            Some(Err(e)) => format!("cannot record the sandbox of process {id}: {e}"),
            _ => format!("the sandbox of process {id} ended before it ran"),
        }));
    };
    let mut control = tokio::net::UnixStream::from_std({
        control
            .set_nonblocking(true)
            .map_err(|e| failed("cannot use the socket", e))?;
        control
    })
    .map_err(|e| failed("cannot use the socket", e))?;
    control
        .write_all(b"g")
        .await
        .map_err(|e| failed("cannot start the sandbox's command", e))?;
    let reported = tokio::time::timeout(req.timeout, read_code(&mut control)).await;
    let outcome = match reported {
        Ok(Some(code)) => ExecOutcome {
            exit_code: code,
            timed_out: false,
        },
        // The init ended without a word: bwrap's exit says how.
        Ok(None) => {
            let status = tokio::time::timeout(INFO_TIMEOUT, child.wait()).await;
            ExecOutcome {
                exit_code: match status {
                    Ok(Ok(s)) => i64::from(s.code().unwrap_or(1)),
                    _ => 1,
                },
                timed_out: false,
            }
        }
        Err(_) => {
            // The whole sandbox goes.
            if let Some(record) = record {
                record.kill();
            }
            ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            }
        }
    };
    pass_on(&out, &err, io).await?;
    // bwrap lives on with the sandbox: not waited for here.
    drop(child);
    Ok(outcome)
}

/// The host pid of the sandbox's PID 1, from bwrap's info (JSON with a
/// `child-pid`), read to its end (bwrap closes it).
fn read_info(file: std::fs::File) -> Option<u32> {
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    let info: serde_json::Value = serde_json::from_str(&text).ok()?;
    info.get("child-pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 1)
}

/// The exit code the init reports, one line; `None` when it closed the
/// socket without one.
async fn read_code(control: &mut tokio::net::UnixStream) -> Option<i64> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 16 {
        match control.read(&mut byte).await {
            Ok(1) if byte[0] == b'\n' => return std::str::from_utf8(&line).ok()?.parse().ok(),
            Ok(1) => line.push(byte[0]),
            _ => return None,
        }
    }
    None
}

/// What the launch wrote (bwrap's own errors, the script's), bounded.
async fn pass_on(
    out: &std::fs::File,
    err: &std::fs::File,
    io: ExecIo<'_>,
) -> Result<(), LocalError> {
    for (file, to) in [(out, io.stdout), (err, io.stderr)] {
        let mut bytes = Vec::new();
        let mut file = file.try_clone().map_err(LocalError::Output)?;
        file.seek(SeekFrom::Start(0)).map_err(LocalError::Output)?;
        file.take(MAX_LAUNCH_OUTPUT)
            .read_to_end(&mut bytes)
            .map_err(LocalError::Output)?;
        to.write_all(&bytes).await.map_err(LocalError::Output)?;
    }
    Ok(())
}
