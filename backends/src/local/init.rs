//! The first process of a bwrap sandbox ([`super::bwrap`]): hermes's own
//! binary, run as `hermes sandbox-init [--proxy] -- CMD…`.
//!
//! - With `--proxy` it listens on `127.0.0.1:`[`PROXY_PORT`] and
//!   `127.0.0.1:PROXY_PORT+1` (the sandbox's own loopback: its only
//!   network) and carries each connection, byte for byte, to the proxy's
//!   Unix socket at [`PROXY_SOCKET`]; the proxy decides everything.
//! - It runs the command and exits with its code (128 + the signal that
//!   ended it); bwrap then ends the sandbox, and whatever the command left
//!   running with it.
//! - With `--background` (a `hermes exec --background` launch, the
//!   sandbox's PID 1: bwrap's `--as-pid-1`) its standard input is a
//!   socket to the hermes that launched it ([`super::launch`]): it waits
//!   for one byte there before anything runs (the end of that socket,
//!   hermes gone before it recorded the sandbox, ends it with nothing
//!   run), writes the command's exit code there once the command (the
//!   terminal script, which starts the job and returns) ended, and then
//!   lives on, reaping, while any process of the sandbox does: the
//!   sandbox ends with its last process. A SIGTERM it gets (from `hermes
//!   process kill`) goes on to every process of the sandbox.
//!
//! Nothing it is handed comes from the sandbox: the sandbox's processes
//! start after it, as its children. They cannot reach into it: it makes
//! itself non-dumpable first (its `/proc` entries, descriptors included,
//! closed to them).

use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;

use super::bwrap::{PROXY_PORT, PROXY_SOCKET};

/// Connections carried at once, at most; one past them is closed at once.
const MAX_CONNECTIONS: usize = 512;

/// Runs the init with its arguments (after the subcommand's name);
/// returns the exit code.
pub fn run(args: &[OsString]) -> i32 {
    let mut proxy = false;
    let mut background = false;
    let mut rest = args.iter();
    for arg in rest.by_ref() {
        match arg.to_str() {
            Some("--proxy") => proxy = true,
            Some("--background") => background = true,
            Some("--") => break,
            _ => {
                eprintln!("hermes sandbox-init: unexpected argument {arg:?}");
                return 64;
            }
        }
    }
    let cmd: Vec<&OsString> = rest.collect();
    let Some((program, cmd_args)) = cmd.split_first() else {
        eprintln!("hermes sandbox-init: no command");
        return 64;
    };
    // Before any process of the sandbox exists: nothing its caller left
    // open reaches it (a directory's descriptor would lead out of every
    // mount of the sandbox), and it cannot reach into the init.
    close_inherited();
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("hermes sandbox-init: cannot close itself to the sandbox: {e}");
        return 126;
    }
    let control = if background {
        match Control::take() {
            Ok(Some(control)) => Some(control),
            // Its launcher went away: nothing runs.
            Ok(None) => return 125,
            Err(e) => {
                eprintln!("hermes sandbox-init: its launcher's socket: {e}");
                return 126;
            }
        }
    } else {
        None
    };
    if proxy {
        for port in [PROXY_PORT, PROXY_PORT + 1] {
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) => {
                    std::thread::spawn(move || bridge(&listener));
                }
                Err(e) => {
                    eprintln!(
                        "hermes: the sandbox cannot listen for the egress proxy on 127.0.0.1:{port}: {e}"
                    );
                    return 126;
                }
            }
        }
    }
    let mut command = std::process::Command::new(program);
    command.args(cmd_args);
    let Some(mut control) = control else {
        return match command.status() {
            Ok(status) => code_of(status),
            Err(e) => cannot_run(program, &e),
        };
    };
    if let Err(e) = forward_term() {
        eprintln!("hermes sandbox-init: cannot take SIGTERM: {e}");
        return 126;
    }
    // Its standard input is the launcher's socket: the command's is none.
    command.stdin(std::process::Stdio::null());
    let code = match command.spawn() {
        Ok(child) => reap_until(child.id()),
        Err(e) => cannot_run(program, &e),
    };
    control.report(code);
    // What the command left running keeps the sandbox.
    reap_until(0);
    0
}

/// Closes every descriptor past the standard three: all this process has
/// there came from whoever ran hermes, through bwrap.
fn close_inherited() {
    let open: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The listing's own descriptor is among them, closed already: EBADF.
    for fd in open {
        let _ = nix::unistd::close(fd);
    }
}

fn cannot_run(program: &OsString, e: &std::io::Error) -> i32 {
    eprintln!("hermes: cannot run {}: {e}", program.to_string_lossy());
    if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Reaps every child that ends (as PID 1 it is every orphan's parent)
/// until `pid` ended, then returns its exit code; `0`: until none is left
/// (then 0).
fn reap_until(pid: u32) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw().unsigned_abs() == pid => return code,
            Ok(WaitStatus::Signaled(p, signal, _)) if p.as_raw().unsigned_abs() == pid => {
                return 128 + signal as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // No child left (ECHILD): the command is long gone too.
            Err(_) => return 0,
        }
    }
}

/// A SIGTERM to the init goes on to every other process of the sandbox
/// (`kill(-1)` from its PID 1), from a thread of its own.
fn forward_term() -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM])?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-1),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    });
    Ok(())
}

/// The socket to the launcher, the init's standard input.
struct Control(std::os::unix::net::UnixStream);

impl Control {
    /// The socket, once the launcher said to go; `None` when it closed
    /// its end first.
    fn take() -> std::io::Result<Option<Control>> {
        use std::io::Read;
        use std::os::fd::AsFd;
        let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
        let mut socket = std::os::unix::net::UnixStream::from(fd);
        let mut go = [0u8; 1];
        loop {
            match socket.read(&mut go) {
                Ok(0) => return Ok(None),
                Ok(_) => return Ok(Some(Control(socket))),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Tells the launcher the command's exit code; nothing else is ever
    /// written there.
    fn report(&mut self, code: i32) {
        use std::io::Write;
        let _ = writeln!(self.0, "{code}");
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Carries each connection of `listener` to the proxy's socket.
fn bridge(listener: &TcpListener) {
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        if open.load(std::sync::atomic::Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue; // dropped: closed at once
        }
        let open = open.clone();
        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::spawn(move || {
            if let Ok(proxy) = UnixStream::connect(PROXY_SOCKET) {
                carry(client, proxy);
            }
            open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// Copies both ways until each side has ended.
fn carry(client: TcpStream, proxy: UnixStream) {
    let _ = client.set_nodelay(true);
    let (Ok(mut client_r), Ok(mut proxy_w)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_r, &mut proxy_w);
        let _ = proxy_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut proxy_r, mut client_w) = (proxy, client);
    let _ = std::io::copy(&mut proxy_r, &mut client_w);
    let _ = client_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
