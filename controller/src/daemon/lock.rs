//! One controller per `$HERMES_HOME`: an exclusive `flock` on
//! `run/controller.lock`, which also holds the owner's pid so that a second
//! controller can say who holds it. The lock dies with its process, however
//! it ends: there is no stale lock to clean up after `kill -9`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another controller (pid {pid}) holds {path}")]
    Held { pid: String, path: PathBuf },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct ControllerLock {
    _lock: Flock<File>,
}

impl ControllerLock {
    /// Takes the lock at `path` without waiting, and writes our pid in it.
    pub fn acquire(path: &Path) -> Result<ControllerLock, LockError> {
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                // Never through a symlink planted at the lock's path.
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(path)
                .map_err(|source| LockError::Open {
                    path: path.to_path_buf(),
                    source,
                })
        };
        let file = open(path)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    pid: if pid.is_empty() { "unknown" } else { pid }.to_string(),
                    path: path.to_path_buf(),
                });
            }
            Err((_, source)) => {
                return Err(LockError::Lock {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let written = lock
            .set_len(0)
            .and_then(|()| lock.rewind())
            .and_then(|()| writeln!(lock, "{}", std::process::id()))
            .and_then(|()| lock.flush());
        if let Err(source) = written {
            return Err(LockError::Open {
                path: path.to_path_buf(),
                source,
            });
        }
        Ok(ControllerLock { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_a_dropped_lock_is_free_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.lock");
        let held = ControllerLock::acquire(&path).unwrap();
        let second = ControllerLock::acquire(&path).unwrap_err();
        assert_eq!(
            second.to_string(),
            format!(
                "another controller (pid {}) holds {}",
                std::process::id(),
                path.display()
            )
        );
        drop(held);
        ControllerLock::acquire(&path).unwrap();
    }

    #[test]
    fn a_symlink_at_the_lock_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let path = dir.path().join("controller.lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(matches!(
            ControllerLock::acquire(&path),
            Err(LockError::Open { .. })
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
