//! The directories hermes makes on the host for a sandbox: bind sources
//! (a Docker sandbox's `/workspace` and `/root` data, its runner's
//! directory) and singularity overlays, all below the hermes home.
//!
//! Sandboxes write into some of these directories, so a path below the
//! home is never trusted as a string: [`make_below`] opens the home once
//! and walks the rest one component at a time, each made with `mkdirat`
//! and opened with `O_NOFOLLOW | O_DIRECTORY`. A component that is a
//! symlink (or anything but a directory) is refused, never followed, and
//! `.` or `..` in the path is refused before anything is made. So a link
//! that a sandbox planted can never turn another sandbox's bind source
//! into the home, with its `.env` and the proxy's CA key.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, mkdirat};

/// Why a sandbox's directory was not made.
#[derive(Debug, thiserror::Error)]
pub enum HostDirError {
    /// The directory is not below the base it must be made in.
    #[error("{dir} is not below {base}")]
    Outside { dir: PathBuf, base: PathBuf },
    /// The path has a `.` or `..` in it.
    #[error("{dir} has a `.` or `..` component")]
    NotPlain { dir: PathBuf },
    /// A component is a symbolic link: refused, not followed.
    #[error(
        "{path} is a symbolic link; a sandbox's directory must not be or pass through one (refused, nothing made)"
    )]
    Symlink { path: PathBuf },
    /// A component exists and is not a directory.
    #[error("{path} exists and is not a directory")]
    NotDir { path: PathBuf },
    /// Another error of the system.
    #[error("cannot make or open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Makes `dir` (mode 0700 for each new component) below `base`, which is
/// made first when missing and trusted as it is (the hermes home may be a
/// link). Below `base` nothing is followed: see the module doc. Returns
/// the directory open.
pub fn make_below(base: &Path, dir: &Path) -> Result<OwnedFd, HostDirError> {
    let rest = dir.strip_prefix(base).map_err(|_| HostDirError::Outside {
        dir: dir.to_path_buf(),
        base: base.to_path_buf(),
    })?;
    let mut names = Vec::new();
    for component in rest.components() {
        match component {
            Component::Normal(name) => names.push(name),
            _ => {
                return Err(HostDirError::NotPlain {
                    dir: dir.to_path_buf(),
                });
            }
        }
    }
    let io = |path: &Path, e: Errno| HostDirError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    };
    if !base.is_dir() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .map_err(|source| HostDirError::Io {
                path: base.to_path_buf(),
                source,
            })?;
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fd = open(base, flags, Mode::empty()).map_err(|e| io(base, e))?;
    let mut path = base.to_path_buf();
    for name in names {
        path.push(name);
        match mkdirat(&fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io(&path, e)),
        }
        fd = match openat(&fd, name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::ELOOP) => return Err(HostDirError::Symlink { path }),
            Err(Errno::ENOTDIR) => {
                // O_NOFOLLOW with O_DIRECTORY on a link answers ENOTDIR on
                // some kernels: tell the two apart.
                return Err(if is_symlink(&fd, name) {
                    HostDirError::Symlink { path }
                } else {
                    HostDirError::NotDir { path }
                });
            }
            Err(e) => return Err(io(&path, e)),
        };
    }
    Ok(fd)
}

/// Checks, without making anything, that no component of `dir` below
/// `base` is a symbolic link (a missing one is fine: it will be made).
pub fn check_below(base: &Path, dir: &Path) -> Result<(), HostDirError> {
    let rest = dir.strip_prefix(base).map_err(|_| HostDirError::Outside {
        dir: dir.to_path_buf(),
        base: base.to_path_buf(),
    })?;
    let mut path = base.to_path_buf();
    for component in rest.components() {
        let Component::Normal(name) = component else {
            return Err(HostDirError::NotPlain {
                dir: dir.to_path_buf(),
            });
        };
        path.push(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(HostDirError::Symlink { path }),
            Ok(m) if !m.is_dir() => return Err(HostDirError::NotDir { path }),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(HostDirError::Io { path, source }),
        }
    }
    Ok(())
}

fn is_symlink(dir: &OwnedFd, name: &std::ffi::OsStr) -> bool {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT
            == nix::sys::stat::SFlag::S_IFLNK
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    #[test]
    fn makes_every_component_0700() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b/c");
        make_below(base.path(), &dir).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            let m = std::fs::metadata(base.path().join(d)).unwrap();
            assert!(m.is_dir());
            assert_eq!(m.permissions().mode() & 0o777, 0o700, "{d}");
        }
        // Again: already there is fine.
        make_below(base.path(), &dir).unwrap();
        check_below(base.path(), &dir).unwrap();
    }

    #[test]
    fn a_link_anywhere_on_the_way_is_refused_and_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("a")).unwrap();
        symlink(target.path(), base.path().join("a/b")).unwrap();
        for dir in ["a/b", "a/b/c", "a/b/c/d"] {
            let dir = base.path().join(dir);
            let e = make_below(base.path(), &dir).unwrap_err();
            assert!(
                matches!(&e, HostDirError::Symlink { path } if path.ends_with("a/b")),
                "{e}"
            );
            assert!(e.to_string().contains("symbolic link"), "{e}");
            assert!(check_below(base.path(), &dir).is_err());
        }
        // Nothing was made through the link.
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
        // A link as the last component, to a directory, as well.
        symlink(target.path(), base.path().join("last")).unwrap();
        assert!(matches!(
            make_below(base.path(), &base.path().join("last")),
            Err(HostDirError::Symlink { .. })
        ));
    }

    #[test]
    fn dots_files_and_paths_elsewhere_are_refused() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("f"), "").unwrap();
        assert!(matches!(
            make_below(base.path(), &base.path().join("f/x")),
            Err(HostDirError::NotDir { .. })
        ));
        assert!(matches!(
            make_below(base.path(), &base.path().join("a/../b")),
            Err(HostDirError::NotPlain { .. })
        ));
        assert!(matches!(
            make_below(base.path(), Path::new("/elsewhere")),
            Err(HostDirError::Outside { .. })
        ));
        assert!(!base.path().join("a").exists());
    }
}
