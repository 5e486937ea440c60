//! The runner's directory on the host, handled as the container's ground.
//!
//! The container (root inside) can write anything into the directory: so
//! hermes names nothing there by path. It opens the directory once, with
//! `O_NOFOLLOW`, and then works relative to that descriptor with the `*at`
//! calls: every open is `O_NOFOLLOW` (a planted symlink fails, it is never
//! followed), every file hermes writes is created with `O_EXCL` under a
//! fresh name of 128 random bits, every pipe is opened without blocking
//! and checked to be a pipe, and removals (`unlinkat`) remove a name, never
//! what it points to. Hard links and device nodes cannot be planted: links
//! do not cross the bind mount, and the sandbox has no `CAP_MKNOD`. So what
//! the container can do here is make its own commands fail or fall back to
//! the engine's exec, nothing on the host.
//!
//! Layout (`/run/hermes` inside):
//!
//! - `ctl.<hex>`: a request pipe, read by one runner; a line a request;
//! - `x.<pid>.<hex>/`: one request of the hermes process `<pid>`: `cmd`
//!   and `env` (0600; the runner empties both once read, hermes then
//!   removes them), the pipes `out`, `err` and `status`, and `claim`,
//!   created by whichever side has the request;
//! - `unsupported.<container id>`: the runner cannot run in that container.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, mkfifoat, unlinkat};
use tokio::net::unix::pipe;

/// Entries of the directory looked at, at most: a container that floods it
/// only slows its own commands down, and then not beyond this.
const MAX_ENTRIES: usize = 4096;

/// A request directory whose hermes process is gone is removed after this.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Stale request directories removed per scan, at most.
const SWEEP_PER_SCAN: usize = 8;

/// Why the runner's directory cannot serve a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub String);

fn refused(what: &str, e: impl std::fmt::Display) -> Refused {
    Refused(format!("{what}: {e}"))
}

/// The runner's directory of one sandbox, open.
#[derive(Debug)]
pub(crate) struct RunnerDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A request pipe with a runner reading it, open for writing.
#[derive(Debug)]
pub(crate) struct Pipe {
    name: String,
    file: File,
}

/// One request's directory, removed when dropped.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    root: &'a RunnerDir,
    name: String,
    fd: OwnedFd,
}

/// The three pipes hermes reads a request's results from.
#[derive(Debug)]
pub(crate) struct Readers {
    pub out: pipe::Receiver,
    pub err: pipe::Receiver,
    pub status: pipe::Receiver,
}

/// What a look at the directory found.
#[derive(Debug, Default)]
struct Scan {
    pipes: Vec<String>,
    stale: Vec<String>,
}

impl RunnerDir {
    /// Opens the directory at `path`, which must be a directory of this
    /// user that nobody else may write to (hermes made it; the container's
    /// root writes through the mount).
    pub(crate) fn open(path: &Path) -> Result<RunnerDir, Refused> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused(&format!("cannot open {}", path.display()), e))?;
        let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
        if !is(&st, SFlag::S_IFDIR)
            || st.st_uid != nix::unistd::geteuid().as_raw()
            || st.st_mode & 0o022 != 0
        {
            return Err(Refused(format!(
                "{} is not a directory of this user that only it may write",
                path.display()
            )));
        }
        Ok(RunnerDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// A request pipe some runner reads, if there is one. Stale request
    /// directories found on the way are removed. With `retire`, pipes no
    /// runner reads any more are removed too (only under [`RunnerDir::lock`]:
    /// a runner being started has not opened its pipe yet).
    pub(crate) fn live_pipe(&self, retire: bool) -> Result<Option<Pipe>, Refused> {
        let scan = self.scan()?;
        for name in scan.stale.iter().take(SWEEP_PER_SCAN) {
            self.sweep(name);
        }
        for name in scan.pipes {
            match self.open_pipe(&name) {
                Ok(Some(pipe)) => return Ok(Some(pipe)),
                Ok(None) | Err(_) if retire => self.remove(&name),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Opens the request pipe `name` for writing, without blocking: `None`
    /// when no runner reads it.
    pub(crate) fn open_pipe(&self, name: &str) -> Result<Option<Pipe>, Refused> {
        let fd = match openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENXIO) => return Ok(None),
            Err(e) => return Err(refused(&format!("cannot open {name}"), e)),
        };
        let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
        if !is(&st, SFlag::S_IFIFO) {
            return Err(Refused(format!("{name} is not a pipe")));
        }
        Ok(Some(Pipe {
            name: name.to_string(),
            file: File::from(fd),
        }))
    }

    /// Makes a new request pipe for a runner to come; returns its name.
    pub(crate) fn new_pipe(&self) -> Result<String, Refused> {
        let name = format!("ctl.{}", random_hex()?);
        mkfifoat(&self.fd, name.as_str(), Mode::from_bits_truncate(0o600))
            .map_err(|e| refused(&format!("cannot make {name}"), e))?;
        Ok(name)
    }

    /// Withdraws a pipe whose runner did not answer: asks the runner to
    /// stop (when it reads again) and removes the pipe.
    pub(crate) fn retire(&self, pipe: Pipe) {
        let mut file = &pipe.file;
        let _ = file.write(b"q\n");
        self.remove(&pipe.name);
    }

    /// Whether a runner was found not to work in `container` before.
    pub(crate) fn is_unsupported(&self, container: &str) -> bool {
        let Some(name) = marker_name(container) else {
            return true;
        };
        fstatat(
            &self.fd,
            name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| is(&st, SFlag::S_IFREG))
    }

    /// Records that the runner does not work in `container`, and why.
    pub(crate) fn mark_unsupported(&self, container: &str, why: &str) {
        if let Some(name) = marker_name(container) {
            if let Err(e) = self.write_new(&self.fd, &name, why.as_bytes()) {
                tracing::debug!(container, error = %e.0, "cannot record that the runner is unsupported");
            }
        }
    }

    /// Removes what concerns other containers than `container` (marks of
    /// containers that were replaced).
    pub(crate) fn forget_others(&self, container: &str) {
        let mine = marker_name(container);
        let Ok(names) = self.names() else { return };
        for name in names {
            if name.starts_with("unsupported.") && Some(&name) != mine.as_ref() {
                self.remove(&name);
            }
        }
    }

    /// Takes the directory's lock, waiting up to `wait`: one hermes process
    /// at a time starts a runner.
    pub(crate) async fn lock(&self, wait: Duration) -> Result<Flock<OwnedFd>, Refused> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // A descriptor of its own: the lock belongs to it.
            let fd = openat(
                &self.fd,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| refused("cannot reopen the runner's directory", e))?;
            match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(lock),
                Err((_, Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((_, e)) => return Err(refused("cannot lock the runner's directory", e)),
            }
        }
    }

    /// Makes a request's directory with its pipes and files, and opens the
    /// pipes for reading (without blocking: no writer is there yet).
    pub(crate) fn new_request(
        &self,
        cmd: &str,
        env: &str,
    ) -> Result<(Request<'_>, Readers), Refused> {
        let name = format!("x.{}.{}", std::process::id(), random_hex()?);
        mkdirat(&self.fd, name.as_str(), Mode::from_bits_truncate(0o700))
            .map_err(|e| refused(&format!("cannot make {name}"), e))?;
        let fd = openat(
            &self.fd,
            name.as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused(&format!("cannot open {name}"), e))?;
        let request = Request {
            root: self,
            name,
            fd,
        };
        let st = fstat(&request.fd).map_err(|e| refused("fstat", e))?;
        if !is(&st, SFlag::S_IFDIR) {
            return Err(Refused(format!("{} is not a directory", request.name)));
        }
        self.write_new(&request.fd, "cmd", cmd.as_bytes())?;
        self.write_new(&request.fd, "env", env.as_bytes())?;
        let readers = Readers {
            out: request.reader("out")?,
            err: request.reader("err")?,
            status: request.reader("status")?,
        };
        Ok((request, readers))
    }

    /// The names in the directory, up to [`MAX_ENTRIES`] (more is refused).
    fn names(&self) -> Result<Vec<String>, Refused> {
        let mut dir = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused("cannot read the runner's directory", e))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| refused("cannot read the runner's directory", e))?;
            if names.len() >= MAX_ENTRIES {
                return Err(Refused(format!(
                    "more than {MAX_ENTRIES} entries in the runner's directory"
                )));
            }
            if let Some(name) = plain(entry.file_name()) {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn scan(&self) -> Result<Scan, Refused> {
        let mut scan = Scan::default();
        let me = std::process::id();
        for name in self.names()? {
            if name.strip_prefix("ctl.").is_some_and(is_hex) {
                scan.pipes.push(name);
            } else if let Some(pid) = request_pid(&name) {
                if pid != me && !is_alive(pid) && self.older_than(&name, STALE_AFTER) {
                    scan.stale.push(name);
                }
            }
        }
        scan.pipes.sort();
        Ok(scan)
    }

    fn older_than(&self, name: &str, age: Duration) -> bool {
        let Ok(st) = fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) else {
            return false;
        };
        let Ok(mtime) = u64::try_from(st.st_mtime) else {
            return false;
        };
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(mtime);
        SystemTime::now()
            .duration_since(mtime)
            .is_ok_and(|elapsed| elapsed > age)
    }

    /// Removes a request directory whose hermes process is gone (it may
    /// hold an environment file).
    fn sweep(&self, name: &str) {
        tracing::debug!(dir = %self.path.display(), name, "removing a stale request");
        if let Ok(fd) = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            empty_dir(&fd);
        }
        let _ = unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir);
    }

    /// Removes the name `name` (not a directory, never what it points to).
    pub(crate) fn remove(&self, name: &str) {
        let _ = unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir);
    }

    /// Creates `name` in `dir` (never through a symlink, never an existing
    /// file), mode 0600, with `bytes`.
    fn write_new(&self, dir: &OwnedFd, name: &str, bytes: &[u8]) -> Result<(), Refused> {
        let fd = openat(
            dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| refused(&format!("cannot create {name}"), e))?;
        File::from(fd)
            .write_all(bytes)
            .map_err(|e| refused(&format!("cannot write {name}"), e))
    }
}

impl Pipe {
    /// Hands the runner the request `name`: one line, written whole or not
    /// at all (shorter than `PIPE_BUF`), never blocking.
    pub(crate) fn ring(&self, name: &str) -> io::Result<()> {
        let line = format!("{name}\n");
        let mut file = &self.file;
        let n = file.write(line.as_bytes())?;
        if n != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "a partial request",
            ));
        }
        Ok(())
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Request<'_> {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Withdraws the request unless the runner claimed it first: `true`
    /// when withdrawn (nothing ran, nothing will). An error is a request
    /// whose fate is unknown.
    pub(crate) fn withdraw(&self) -> io::Result<bool> {
        match openat(
            &self.fd,
            "claim",
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(_) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the request's files once the runner has read them.
    pub(crate) fn remove_files(&self) {
        for name in ["env", "cmd"] {
            let _ = unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir);
        }
    }

    /// Makes the pipe `name` and opens it for reading, checking that what
    /// is opened is the pipe just made.
    fn reader(&self, name: &str) -> Result<pipe::Receiver, Refused> {
        mkfifoat(&self.fd, name, Mode::from_bits_truncate(0o600))
            .map_err(|e| refused(&format!("cannot make {name}"), e))?;
        let made = fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| refused("fstatat", e))?;
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused(&format!("cannot open {name}"), e))?;
        let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
        if !is(&st, SFlag::S_IFIFO) || (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino) {
            return Err(Refused(format!("{name} is not the pipe hermes made")));
        }
        pipe::Receiver::from_owned_fd(fd).map_err(|e| refused(&format!("cannot read {name}"), e))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        empty_dir(&self.fd);
        let _ = unlinkat(&self.root.fd, self.name.as_str(), UnlinkatFlags::RemoveDir);
    }
}

/// Removes what a request directory holds (a few entries; a subdirectory
/// only when empty: the container put it there).
fn empty_dir(fd: &OwnedFd) {
    let Ok(mut dir) = nix::dir::Dir::openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let names: Vec<String> = dir
        .iter()
        .take(64)
        .filter_map(|e| e.ok().and_then(|e| plain(e.file_name())))
        .collect();
    for name in names {
        if unlinkat(fd, name.as_str(), UnlinkatFlags::NoRemoveDir) == Err(Errno::EISDIR) {
            let _ = unlinkat(fd, name.as_str(), UnlinkatFlags::RemoveDir);
        }
    }
}

/// A directory entry's name when it is plain UTF-8 and not `.` or `..`.
fn plain(name: &CStr) -> Option<String> {
    let name = name.to_str().ok()?;
    (name != "." && name != "..").then(|| name.to_string())
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The hermes process of a request directory `x.<pid>.<hex>`.
fn request_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("x.")?;
    let (pid, hex) = rest.split_once('.')?;
    if !is_hex(hex) || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether a process `pid` exists on this host (`kill(pid, 0)`).
fn is_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
}

/// The mark of a container the runner does not work in.
fn marker_name(container: &str) -> Option<String> {
    let plain = !container.is_empty()
        && container.len() <= 128
        && container
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    plain.then(|| format!("unsupported.{container}"))
}

/// 128 random bits in hex, from the kernel.
fn random_hex() -> Result<String, Refused> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| refused("cannot read /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    use tokio::io::AsyncReadExt;

    use super::*;

    fn runner_dir() -> (tempfile::TempDir, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("r");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        (base, dir)
    }

    #[test]
    fn only_a_private_directory_of_this_user_is_taken() {
        let (base, dir) = runner_dir();
        assert!(RunnerDir::open(&dir).is_ok());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(RunnerDir::open(&dir).is_err());
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(RunnerDir::open(&link).is_err());
        assert!(RunnerDir::open(&base.path().join("missing")).is_err());
    }

    #[tokio::test]
    async fn a_reader_opened_before_its_writer_waits_for_it() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let (request, mut readers) = root.new_request("", "").unwrap();
        let path = dir.join(request.name()).join("out");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(path, "late").unwrap();
        });
        let mut got = String::new();
        readers.out.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "late");
        writer.join().unwrap();
    }

    #[tokio::test]
    async fn a_request_is_private_and_gone_when_dropped() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let (request, _readers) = root.new_request("cmd text", "env text").unwrap();
        let at = dir.join(request.name());
        assert_eq!(std::fs::read_to_string(at.join("env")).unwrap(), "env text");
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&at), 0o700);
        assert_eq!(mode(&at.join("env")), 0o600);
        assert_eq!(mode(&at.join("cmd")), 0o600);
        assert_eq!(mode(&at.join("out")), 0o600);
        request.remove_files();
        assert!(!at.join("env").exists());
        assert!(!at.join("cmd").exists());
        assert!(request.withdraw().unwrap());
        assert!(!request.withdraw().unwrap());
        drop(request);
        assert!(!at.exists());
    }

    #[test]
    fn planted_things_are_neither_followed_nor_written_through() {
        let (base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let victim = base.path().join("victim");
        std::fs::write(&victim, "host file").unwrap();
        // A symlink, a regular file and a directory where pipes should be.
        std::os::unix::fs::symlink(&victim, dir.join("ctl.aa")).unwrap();
        std::fs::write(dir.join("ctl.bb"), "").unwrap();
        std::fs::create_dir(dir.join("ctl.cc")).unwrap();
        assert!(root.open_pipe("ctl.aa").is_err());
        assert!(root.open_pipe("ctl.bb").is_err());
        assert!(root.open_pipe("ctl.cc").is_err());
        assert!(root.live_pipe(false).unwrap().is_none());
        // Retiring removes the names, never what they point to.
        assert!(root.live_pipe(true).unwrap().is_none());
        assert!(
            !dir.join("ctl.aa").exists() && std::fs::symlink_metadata(dir.join("ctl.aa")).is_err()
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");
        // A symlinked marker is no marker, and marking does not write
        // through it.
        std::os::unix::fs::symlink(&victim, dir.join("unsupported.abc")).unwrap();
        assert!(!root.is_unsupported("abc"));
        root.mark_unsupported("abc", "why");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");
        root.mark_unsupported("def", "why");
        assert!(root.is_unsupported("def"));
        root.forget_others("def");
        assert!(root.is_unsupported("def"));
        assert!(std::fs::symlink_metadata(dir.join("unsupported.abc")).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");
    }

    #[test]
    fn a_dead_pipe_is_no_runner_and_a_live_one_is() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let name = root.new_pipe().unwrap();
        assert!(root.open_pipe(&name).unwrap().is_none());
        assert!(root.live_pipe(false).unwrap().is_none());
        assert!(dir.join(&name).exists(), "kept without the lock");
        // A reader (read-write, as the runner opens it).
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(&name))
            .unwrap();
        let pipe = root.live_pipe(true).unwrap().unwrap();
        assert_eq!(pipe.name(), name);
        pipe.ring("x.1.ab").unwrap();
    }

    #[test]
    fn stale_requests_of_gone_processes_are_swept_and_others_kept() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        // A pid that does not exist: above the kernel's maximum.
        let gone = dir.join("x.4194305.00ff");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("env"), "export K='secret'").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", gone.join("out")).unwrap();
        let alive = dir.join(format!("x.{}.00ff", std::process::id()));
        std::fs::create_dir(&alive).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        for d in [&gone, &alive] {
            std::fs::File::open(d).unwrap().set_modified(old).unwrap();
        }
        root.live_pipe(false).unwrap();
        assert!(!gone.exists());
        assert!(alive.exists());
        assert!(std::fs::metadata("/etc/passwd").is_ok());
    }

    #[test]
    fn names_hermes_reads_are_checked() {
        assert_eq!(request_pid("x.123.abc"), Some(123));
        assert_eq!(request_pid("x.123."), None);
        assert_eq!(request_pid("x..abc"), None);
        assert_eq!(request_pid("x.12a.abc"), None);
        assert_eq!(request_pid("y.1.a"), None);
        assert_eq!(
            marker_name("abc123"),
            Some("unsupported.abc123".to_string())
        );
        assert_eq!(marker_name("../x"), None);
        assert_eq!(marker_name(""), None);
    }
}
