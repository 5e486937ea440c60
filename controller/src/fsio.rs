//! File IO with the guarantees hermes promises: a reader never sees half a
//! file (write to a temporary file in the same directory, fsync, rename,
//! fsync the directory), modes are kept, secrets are 0600 in 0700
//! directories, and reads are bounded.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Reads a file of at most `limit` bytes. `Ok(None)` if it does not exist.
/// A larger file is an error naming its size, read no further than the limit.
pub fn read_bounded(path: &Path, limit: usize) -> io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// An exclusive `flock` on `path` (a 0600 file, made if missing, never
/// opened through a symbolic link), held until the guard drops or the
/// process dies. Blocks while another process holds it.
pub fn lock_exclusive(path: &Path) -> io::Result<nix::fcntl::Flock<File>> {
    lock(path, nix::fcntl::FlockArg::LockExclusive)
}

/// A shared `flock` on `path`, as [`lock_exclusive`]: any number of
/// holders at once, none while an exclusive one is held.
pub fn lock_shared(path: &Path) -> io::Result<nix::fcntl::Flock<File>> {
    lock(path, nix::fcntl::FlockArg::LockShared)
}

/// An exclusive `flock` on `path` if no one holds any lock on it now;
/// `Ok(None)` if someone does. Never blocks.
pub fn try_lock_exclusive(path: &Path) -> io::Result<Option<nix::fcntl::Flock<File>>> {
    match lock(path, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

fn lock(path: &Path, how: nix::fcntl::FlockArg) -> io::Result<nix::fcntl::Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    nix::fcntl::Flock::lock(file, how).map_err(|(_, e)| io::Error::from(e))
}

/// Creates `dir` (and parents) if missing, with `mode` on the directories
/// it creates.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir)
}

/// Replaces `path` with `bytes` atomically. The file keeps its mode if it
/// exists, else gets `new_mode`; `force_mode` sets the mode either way.
pub fn write_atomic(path: &Path, bytes: &[u8], new_mode: u32, force_mode: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path without a file name"))?;
    let mode = match fs::metadata(path) {
        Ok(meta) if !force_mode => meta.permissions().mode() & 0o7777,
        _ => new_mode,
    };
    let mut attempt = 0u32;
    // `create_new` is O_CREAT|O_EXCL: it never follows a symlink planted at
    // the temporary path, and never reuses someone else's file.
    let (tmp_path, mut tmp) = loop {
        let tmp_path = dir.join(format!(
            ".{}.tmp-{}-{attempt}",
            name.to_string_lossy(),
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp_path)
        {
            Ok(f) => break (tmp_path, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let result = (|| {
        tmp.write_all(bytes)?;
        // The umask may have narrowed the mode given at creation.
        tmp.set_permissions(fs::Permissions::from_mode(mode))?;
        tmp.sync_all()?;
        drop(tmp);
        fs::rename(&tmp_path, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp_path);
    }
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn atomic_writes_keep_the_mode_of_the_file_they_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&path, b"new", 0o600, false).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1);
    }

    #[test]
    fn secret_files_are_written_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        fs::write(&path, "").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"K=v\n", 0o600, true).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn bounded_reads_stop_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        fs::write(&path, vec![b'x'; 100]).unwrap();
        assert_eq!(read_bounded(&path, 10).unwrap().unwrap().len(), 11);
        assert_eq!(read_bounded(&dir.path().join("none"), 10).unwrap(), None);
    }
}
