//! A command on a pseudo-terminal of this host (`hermes exec -t` on the
//! local and singularity backends): the command a session leader with the
//! terminal as its controlling one (job control works; when hermes dies,
//! the terminal hangs up: SIGHUP to its foreground group), the user's keys
//! written to it, what it shows copied out as it comes, its size following
//! the user's terminal.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::exec::TtyIo;

/// Why a command could not run on a terminal.
#[derive(Debug)]
pub enum PtyError {
    /// No terminal could be made.
    Open(std::io::Error),
    /// The program did not start.
    Spawn(std::io::Error),
    /// What it showed could not be written out.
    Output(std::io::Error),
}

/// How a command on a terminal ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    /// It ran out of time; its process group was killed.
    TimedOut,
}

/// Runs `cmd` on a new terminal of `io.size` until it ends or `timeout`.
pub async fn run(
    cmd: pty_process::Command,
    io: TtyIo<'_>,
    timeout: Duration,
) -> Result<Ended, PtyError> {
    let TtyIo {
        stdin,
        output,
        mut size,
    } = io;
    let (pty, pts) = pty_process::open().map_err(|e| PtyError::Open(io_error(e)))?;
    let first = *size.borrow_and_update();
    pty.resize(pty_process::Size::new(first.rows, first.cols))
        .map_err(|e| PtyError::Open(io_error(e)))?;
    let mut child = cmd
        .kill_on_drop(true)
        .spawn(pts)
        .map_err(|e| PtyError::Spawn(io_error(e)))?;
    // A session leader: its process group is its pid.
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    let (mut from_pty, mut to_pty) = pty.into_split();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut keys = vec![0u8; 8 * 1024];
    let mut shown = vec![0u8; 32 * 1024];
    let mut keys_open = true;
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status.map_err(PtyError::Output)?),
            read = from_pty.read(&mut shown) => match read {
                // EIO once no process holds the terminal any more.
                Ok(0) | Err(_) => break Some(child.wait().await.map_err(PtyError::Output)?),
                Ok(n) => {
                    output.write_all(&shown[..n]).await.map_err(PtyError::Output)?;
                    output.flush().await.map_err(PtyError::Output)?;
                }
            },
            read = stdin.read(&mut keys), if keys_open => match read {
                Ok(0) | Err(_) => keys_open = false,
                // A command that stopped reading: its keys are dropped,
                // as a terminal's would be.
                Ok(n) => drop(to_pty.write_all(&keys[..n]).await),
            },
            changed = size.changed() => {
                if changed.is_ok() {
                    let now = *size.borrow_and_update();
                    let _ = to_pty.resize(pty_process::Size::new(now.rows, now.cols));
                }
            },
            () = tokio::time::sleep_until(deadline) => break None,
        }
    };
    let Some(status) = status else {
        if let Some(group) = group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.wait().await;
        return Ok(Ended::TimedOut);
    };
    // What it wrote just before it ended, as far as it comes at once (a
    // process it left running may keep the terminal open).
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(50), from_pty.read(&mut shown)).await
    {
        if n == 0 {
            break;
        }
        output
            .write_all(&shown[..n])
            .await
            .map_err(PtyError::Output)?;
    }
    output.flush().await.map_err(PtyError::Output)?;
    Ok(Ended::Exited(status))
}

fn io_error(e: pty_process::Error) -> std::io::Error {
    match e {
        pty_process::Error::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}
