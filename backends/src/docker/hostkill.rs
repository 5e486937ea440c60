//! Killing a timed-out command's processes from the host, without a
//! process inside the sandbox.
//!
//! The kill inside the container (an engine exec of [`KILL_SCRIPT`]) needs
//! to start a process there and to fork: a command that filled the pids
//! limit (a fork bomb) leaves no room for either, and would outlive its
//! timeout. So hermes first kills from the host, with `kill(2)`: it finds
//! the container's processes in the host's `/proc` (those in the pid
//! namespace of the container's main process, which must be in the
//! container's cgroup: the engine's host is this host), takes those whose
//! environment holds the exec's marker ([`EXEC_ID_ENV`]) and their
//! descendants, stops them round after round until a round finds nothing
//! new (a stopped process forks no more), then kills them all. Only
//! processes of that container are ever signalled, and only those of the
//! exec (anything in the container may carry the marker: it only gets
//! itself killed).
//!
//! This needs the right to read other users' `/proc/<pid>/environ` and
//! to signal them (hermes running as root, or as the user the container's
//! processes run as on the host). Where it does not have it, or the engine
//! runs on another host, the kill falls back to the engine exec.
//!
//! [`KILL_SCRIPT`]: crate::exec::KILL_SCRIPT

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::exec::EXEC_ID_ENV;

/// Entries of `/proc` looked at in one walk, at most.
const MAX_PROC_ENTRIES: usize = 1 << 16;

/// Rounds of stopping, at most (as the in-container script).
const MAX_ROUNDS: usize = 20;

/// The most of a process's environment that is read.
const ENVIRON_LIMIT: u64 = 1 << 20;

/// Why the kill could not be done from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NotFromHost(pub String);

/// Stops, then kills, every process of the container (`id`, whose main
/// process is `main_pid` on the engine's host) that carries `marker`, and
/// every descendant of those. Returns how many were killed.
pub(super) fn kill_marked(id: &str, main_pid: i64, marker: &str) -> Result<usize, NotFromHost> {
    kill_marked_in(&PathBuf::from("/proc"), id, main_pid, marker)
}

fn kill_marked_in(
    proc: &std::path::Path,
    id: &str,
    main_pid: i64,
    marker: &str,
) -> Result<usize, NotFromHost> {
    let not = |why: String| NotFromHost(why);
    if main_pid <= 0 || id.len() < 12 {
        return Err(not("the container has no main process".to_string()));
    }
    let main = proc.join(main_pid.to_string());
    let cgroup = std::fs::read_to_string(main.join("cgroup"))
        .map_err(|e| not(format!("cannot read the main process's cgroup: {e}")))?;
    if !cgroup.contains(id) {
        return Err(not(
            "the container's main process is not visible here (the engine runs elsewhere?)"
                .to_string(),
        ));
    }
    let ns = std::fs::read_link(main.join("ns/pid"))
        .map_err(|e| not(format!("cannot read the container's pid namespace: {e}")))?;
    let own = std::fs::read_link(proc.join("self/ns/pid"))
        .map_err(|e| not(format!("cannot read hermes's pid namespace: {e}")))?;
    if ns == own {
        return Err(not(
            "the container shares the host's pid namespace".to_string()
        ));
    }
    let wanted = format!("{EXEC_ID_ENV}={marker}");
    let mut all: BTreeSet<i32> = BTreeSet::new();
    for _ in 0..MAX_ROUNDS {
        let mut new: BTreeSet<i32> = BTreeSet::new();
        let mut denied = false;
        let procs = container_processes(proc, &ns)?;
        let mut grew = true;
        while grew {
            grew = false;
            for (pid, ppid) in &procs {
                if all.contains(pid) || new.contains(pid) {
                    continue;
                }
                let hit = all.contains(ppid)
                    || new.contains(ppid)
                    || match carries(proc, *pid, &wanted) {
                        Ok(hit) => hit,
                        Err(e) if is_denied(&e) => {
                            denied = true;
                            false
                        }
                        Err(_) => false, // gone meanwhile
                    };
                if hit {
                    new.insert(*pid);
                    grew = true;
                }
            }
        }
        if denied && all.is_empty() && new.is_empty() {
            return Err(not(
                "not permitted to read the container's processes".to_string()
            ));
        }
        if new.is_empty() {
            break;
        }
        for pid in &new {
            match kill(Pid::from_raw(*pid), Signal::SIGSTOP) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) if all.is_empty() => {
                    return Err(not(format!("cannot signal the container's processes: {e}")));
                }
                Err(_) => {}
            }
        }
        all.extend(new);
    }
    for pid in &all {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    Ok(all.len())
}

/// The processes (pid, parent pid) of the pid namespace `ns`, as the host
/// numbers them.
fn container_processes(
    proc: &std::path::Path,
    ns: &std::path::Path,
) -> Result<Vec<(i32, i32)>, NotFromHost> {
    let entries = std::fs::read_dir(proc)
        .map_err(|e| NotFromHost(format!("cannot list {}: {e}", proc.display())))?;
    let mut out = Vec::new();
    for entry in entries.take(MAX_PROC_ENTRIES).flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        if std::fs::read_link(dir.join("ns/pid")).ok().as_deref() != Some(ns) {
            continue;
        }
        if let Some(ppid) = parent_of(&dir) {
            out.push((pid, ppid));
        }
    }
    Ok(out)
}

/// The parent pid in `<dir>/stat` (after the command's closing paren).
fn parent_of(dir: &std::path::Path) -> Option<i32> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let rest = &stat[stat.rfind(") ")? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// Whether the environment of `pid` holds the entry `wanted`.
fn carries(proc: &std::path::Path, pid: i32, wanted: &str) -> io::Result<bool> {
    let mut environ = Vec::new();
    File::open(proc.join(pid.to_string()).join("environ"))?
        .take(ENVIRON_LIMIT)
        .read_to_end(&mut environ)?;
    Ok(environ.split(|&b| b == 0).any(|e| e == wanted.as_bytes()))
}

fn is_denied(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::PermissionDenied)
        || e.raw_os_error() == Some(nix::libc::EPERM)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_parent_is_read_past_a_command_with_parens_and_spaces() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stat"), "42 (a) b (c) S 7 42 42 0").unwrap();
        assert_eq!(parent_of(dir.path()), Some(7));
        std::fs::write(dir.path().join("stat"), "garbage").unwrap();
        assert_eq!(parent_of(dir.path()), None);
    }

    #[test]
    fn a_process_this_host_does_not_show_is_not_killed_from_here() {
        let dir = tempfile::tempdir().unwrap();
        // No such main process.
        assert!(kill_marked_in(dir.path(), "0123456789abcdef", 1, "m").is_err());
        // A main process of another container.
        let main = dir.path().join("1");
        std::fs::create_dir(&main).unwrap();
        std::fs::write(main.join("cgroup"), "0::/docker/ffffffffffffffff\n").unwrap();
        let e = kill_marked_in(dir.path(), "0123456789abcdef", 1, "m").unwrap_err();
        assert!(e.0.contains("not visible"), "{e:?}");
        assert!(kill_marked_in(dir.path(), "0123456789abcdef", 0, "m").is_err());
    }

    #[test]
    fn the_marker_is_a_whole_entry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("5");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(
            p.join("environ"),
            b"A=1\0HERMES_EXEC_ID=abc\0XHERMES_EXEC_ID=def\0",
        )
        .unwrap();
        assert!(carries(dir.path(), 5, "HERMES_EXEC_ID=abc").unwrap());
        assert!(!carries(dir.path(), 5, "HERMES_EXEC_ID=ab").unwrap());
        assert!(!carries(dir.path(), 5, "HERMES_EXEC_ID=def").unwrap());
    }
}
