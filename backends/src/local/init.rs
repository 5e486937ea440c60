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
//!
//! Nothing it is handed comes from the sandbox: the sandbox's processes
//! start after it, as its children.

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
    let mut rest = args.iter();
    for arg in rest.by_ref() {
        match arg.to_str() {
            Some("--proxy") => proxy = true,
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
    let status = match std::process::Command::new(program).args(cmd_args).status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("hermes: cannot run {}: {e}", program.to_string_lossy());
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    code_of(status)
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
