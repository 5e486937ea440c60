//! The runner's directory on the host, handled as the container's ground,
//! and the host-only directory beside it that holds what hermes trusts.
//!
//! The container (root inside) can write anything into the mounted
//! directory: so hermes names nothing there by path. It opens the directory
//! once, with `O_NOFOLLOW`, and then works relative to that descriptor with
//! the `*at` calls: every open is `O_NOFOLLOW` (a planted symlink fails, it
//! is never followed), every file hermes writes is created with `O_EXCL`
//! under a fresh name of 128 random bits, and removals (`unlinkat`) remove
//! a name, never what it points to. Hard links and device nodes cannot be
//! planted: links do not cross the bind mount, and the sandbox has no
//! `CAP_MKNOD`.
//!
//! **Only its own channels.** Hermes never opens a pipe through the
//! mounted directory. Every pipe it reads or writes is made in the
//! sandbox's host-only directory (`$HERMES_HOME/run/runner-host/<container>/`,
//! 0700, not mounted): a request pipe is made there and hard-linked into
//! the mount for the runner, and hermes opens it again only through its
//! host-only name, which the container can neither replace nor rename (the
//! host-only link also keeps the inode alive, so its number is never
//! reused for a pipe the container makes). A request's directory is built
//! there whole (its `cmd` and `env` files, its pipes opened for reading)
//! and only then moved into the mount (`renameat2`, `RENAME_NOREPLACE`):
//! nothing of it is in the container's reach before it is complete, and
//! hermes reads the answers from the descriptors it opened before the
//! move. A pipe the container makes, or a name it swaps, is never opened.
//! Both directories must be on one filesystem (links and moves do not
//! cross filesystems); where they are not, the engine's exec runs every
//! command.
//!
//! Layout of the mount (`/run/hermes` inside):
//!
//! - `ctl.<hex>`: a request pipe, read by one runner; a line a request;
//!   `ctl.<hex>.sh`: the runner's script, which its processes run;
//! - `x.<hex>/`: one request: `cmd` and `env` (0600; the runner empties
//!   both once read, hermes then removes them), the pipes `out`, `err` and
//!   `status`, the pipe `life` (hermes holds it open, never writes it: its
//!   end of file tells the runner that hermes is gone), the pipe `in`
//!   when the command gets hermes's standard input (hermes holds its only
//!   write end), and `claim`,
//!   created by whichever side has the request;
//! - `unsupported.<container id>`: the runner cannot run in that container.
//!
//! And of the host-only directory: the `ctl.<hex>` pipes (the same inodes),
//! a request's directory while it is built, and `x.<hex>.lock`, locked
//! (`flock`) by the hermes process of the request for as long as it lives:
//! a request whose lock nobody holds is stale and is swept. No name says
//! anything about the host (no process id).

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, mkfifoat, unlinkat};
use tokio::net::unix::pipe;

/// Entries of the directory looked at, at most: a container that floods it
/// only slows its own commands down, and then not beyond this.
const MAX_ENTRIES: usize = 4096;

/// A request whose lock nobody holds is removed once this old.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Stale request directories removed per scan, at most.
const SWEEP_PER_SCAN: usize = 8;

/// The suffix of a request's lock in the host-only directory.
const LOCK_SUFFIX: &str = ".lock";

/// The suffix of a runner's script beside its request pipe.
const SCRIPT_SUFFIX: &str = ".sh";

/// Why the runner's directory cannot serve a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub String);

fn refused(what: &str, e: impl std::fmt::Display) -> Refused {
    Refused(format!("{what}: {e}"))
}

/// The runner's directory of one sandbox, open, with its host-only twin.
#[derive(Debug)]
pub(crate) struct RunnerDir {
    /// The mounted directory (the container's ground).
    fd: OwnedFd,
    /// The host-only directory.
    host: OwnedFd,
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
    /// Held for as long as the request lives: it is not stale.
    _lock: Flock<OwnedFd>,
}

/// The three pipes hermes reads a request's results from, and the one
/// whose closing tells the runner that hermes is gone.
#[derive(Debug)]
pub(crate) struct Readers {
    pub out: pipe::Receiver,
    pub err: pipe::Receiver,
    pub status: pipe::Receiver,
    /// `life`, open read-write (so the open does not wait for the runner),
    /// never written: the runner reads end of file once every hermes
    /// descriptor of it is closed, however hermes ended.
    pub life: OwnedFd,
    /// The write end of `in`, the command's standard input, when asked
    /// for: hermes's is the only writer, so the command reads end of file
    /// once it is closed.
    pub input: Option<pipe::Sender>,
}

/// The host-only directory of the runner directory `dir`
/// (`$HERMES_HOME/run/sandboxes/<container>` gives
/// `$HERMES_HOME/run/runner-host/<container>`).
pub(crate) fn host_dir(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?;
    Some(dir.parent()?.parent()?.join("runner-host").join(name))
}

/// Opens the directory at `path`, which must be a directory of this user
/// that nobody else may write to (`mask`: the mode bits that must be 0).
fn open_private(path: &Path, mask: u32) -> Result<OwnedFd, Refused> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| refused(&format!("cannot open {}", path.display()), e))?;
    let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
    if !is(&st, SFlag::S_IFDIR)
        || st.st_uid != nix::unistd::geteuid().as_raw()
        || st.st_mode & mask != 0
    {
        return Err(Refused(format!(
            "{} is not a directory of this user that only it may write",
            path.display()
        )));
    }
    Ok(fd)
}

impl RunnerDir {
    /// Opens the directory at `path`, which must be a directory of this
    /// user that nobody else may write to (hermes made it; the container's
    /// root writes through the mount), and its host-only directory, made
    /// (0700) when missing.
    pub(crate) fn open(path: &Path) -> Result<RunnerDir, Refused> {
        let fd = open_private(path, 0o022)?;
        let host_path = host_dir(path)
            .ok_or_else(|| Refused(format!("{} has no host-only directory", path.display())))?;
        let host = match open_private(&host_path, 0o077) {
            Ok(host) => host,
            Err(_) if !host_path.exists() => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&host_path)
                    .map_err(|e| refused(&format!("cannot make {}", host_path.display()), e))?;
                open_private(&host_path, 0o077)?
            }
            Err(e) => return Err(e),
        };
        Ok(RunnerDir {
            fd,
            host,
            path: path.to_path_buf(),
        })
    }

    /// A request pipe some runner reads, if there is one. Stale requests
    /// found on the way are removed. With `retire`, pipes no runner reads
    /// any more are removed too, and what the container put in the place
    /// of pipes (only under [`RunnerDir::lock`]: a runner being started has
    /// not opened its pipe yet).
    pub(crate) fn live_pipe(&self, retire: bool) -> Result<Option<Pipe>, Refused> {
        let pipes = self.sweep_and_list(retire)?;
        for name in &pipes {
            match self.open_pipe(name) {
                Ok(Some(pipe)) => return Ok(Some(pipe)),
                Ok(None) | Err(_) if retire => self.remove_runner(name),
                _ => {}
            }
        }
        if retire {
            // Request pipes and scripts in the mount that no pipe of
            // hermes's stands behind: planted, or left over.
            for name in self.names(&self.fd)? {
                let Some(pipe) = pipe_of(&name) else { continue };
                if fstatat(&self.host, pipe, AtFlags::AT_SYMLINK_NOFOLLOW).is_err() {
                    self.remove(&name);
                }
            }
        }
        Ok(None)
    }

    /// Opens the request pipe `name` for writing, without blocking, through
    /// its host-only name: `None` when no runner reads it.
    pub(crate) fn open_pipe(&self, name: &str) -> Result<Option<Pipe>, Refused> {
        if pipe_of(name) != Some(name) {
            return Err(Refused(format!("{name} is not a request pipe's name")));
        }
        let fd = match openat(
            &self.host,
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

    /// Makes a new request pipe for a runner to come, and the script the
    /// runner runs beside it; returns the pipe's name (the script's is it
    /// and `.sh`).
    pub(crate) fn new_runner(&self, script: &str) -> Result<String, Refused> {
        let name = format!("ctl.{}", random_hex()?);
        mkfifoat(&self.host, name.as_str(), Mode::from_bits_truncate(0o600))
            .map_err(|e| refused(&format!("cannot make {name}"), e))?;
        if let Err(e) = linkat(
            &self.host,
            name.as_str(),
            &self.fd,
            name.as_str(),
            AtFlags::empty(),
        ) {
            let _ = unlinkat(&self.host, name.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(refused(
                &format!("cannot link {name} into the runner's directory"),
                e,
            ));
        }
        let script_name = format!("{name}{SCRIPT_SUFFIX}");
        if let Err(e) = self.write_new(&self.fd, &script_name, script.as_bytes()) {
            self.remove_runner(&name);
            return Err(e);
        }
        Ok(name)
    }

    /// Removes a runner's request pipe (both its names) and its script.
    pub(crate) fn remove_runner(&self, name: &str) {
        let _ = unlinkat(&self.host, name, UnlinkatFlags::NoRemoveDir);
        self.remove(name);
        self.remove(&format!("{name}{SCRIPT_SUFFIX}"));
    }

    /// Withdraws a pipe whose runner did not answer: asks the runner to
    /// stop (when it reads again) and removes the pipe.
    pub(crate) fn retire(&self, pipe: Pipe) {
        let mut file = &pipe.file;
        let _ = file.write(b"q\n");
        self.remove_runner(&pipe.name);
    }

    /// Whether a runner was found not to work in `container` before.
    pub(crate) fn is_unsupported(&self, container: &str) -> bool {
        let Some(name) = marker_name(container) else {
            return true;
        };
        fstatat(&self.fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
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
        let Ok(names) = self.names(&self.fd) else {
            return;
        };
        for name in names {
            if name.starts_with("unsupported.") && Some(&name) != mine.as_ref() {
                self.remove(&name);
            }
        }
    }

    /// Takes the directory's lock (on the host-only directory), waiting up
    /// to `wait`: one hermes process at a time starts a runner.
    pub(crate) async fn lock(&self, wait: Duration) -> Result<Flock<OwnedFd>, Refused> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // A descriptor of its own: the lock belongs to it.
            let fd = openat(
                &self.host,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| refused("cannot reopen the runner's host directory", e))?;
            match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(lock),
                Err((_, Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((_, e)) => return Err(refused("cannot lock the runner's directory", e)),
            }
        }
    }

    /// Makes a request's directory with its files and pipes in the
    /// host-only directory, opens the pipes for reading (without blocking:
    /// no writer is there yet), and only then moves it into the mount.
    pub(crate) fn new_request(
        &self,
        cmd: &str,
        env: &str,
        input: bool,
    ) -> Result<(Request<'_>, Readers), Refused> {
        let name = format!("x.{}", random_hex()?);
        let lock_name = format!("{name}{LOCK_SUFFIX}");
        let lock = openat(
            &self.host,
            lock_name.as_str(),
            OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| refused(&format!("cannot create {lock_name}"), e))?;
        let lock = Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            let _ = unlinkat(&self.host, lock_name.as_str(), UnlinkatFlags::NoRemoveDir);
            refused(&format!("cannot lock {lock_name}"), e)
        })?;
        let built = self.build_request(&name, cmd, env, input);
        let (fd, readers) = match built {
            Ok(built) => built,
            Err(e) => {
                self.remove_staged(&name);
                let _ = unlinkat(&self.host, lock_name.as_str(), UnlinkatFlags::NoRemoveDir);
                return Err(e);
            }
        };
        let request = Request {
            root: self,
            name,
            fd,
            _lock: lock,
        };
        if let Err(e) = renameat2(
            &self.host,
            request.name.as_str(),
            &self.fd,
            request.name.as_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            self.remove_staged(&request.name);
            return Err(refused(
                &format!("cannot move {} into the runner's directory", request.name),
                e,
            ));
        }
        Ok((request, readers))
    }

    /// Builds the request `name` in the host-only directory: its
    /// directory's descriptor and its pipes, open for reading.
    fn build_request(
        &self,
        name: &str,
        cmd: &str,
        env: &str,
        input: bool,
    ) -> Result<(OwnedFd, Readers), Refused> {
        mkdirat(&self.host, name, Mode::from_bits_truncate(0o700))
            .map_err(|e| refused(&format!("cannot make {name}"), e))?;
        let fd = openat(
            &self.host,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused(&format!("cannot open {name}"), e))?;
        self.write_new(&fd, "cmd", cmd.as_bytes())?;
        self.write_new(&fd, "env", env.as_bytes())?;
        let readers = Readers {
            out: reader(&fd, "out")?,
            err: reader(&fd, "err")?,
            status: reader(&fd, "status")?,
            life: holder(&fd, "life")?,
            input: if input {
                Some(writer(&fd, "in")?)
            } else {
                None
            },
        };
        Ok((fd, readers))
    }

    /// Removes a request's directory from the host-only directory.
    fn remove_staged(&self, name: &str) {
        if let Ok(fd) = openat(
            &self.host,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            empty_dir(&fd);
        }
        let _ = unlinkat(&self.host, name, UnlinkatFlags::RemoveDir);
    }

    /// The names in the directory `dir`, up to [`MAX_ENTRIES`] (more is
    /// refused).
    fn names(&self, dir: &OwnedFd) -> Result<Vec<String>, Refused> {
        let mut dir = nix::dir::Dir::openat(
            dir,
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

    /// Sweeps stale requests (a few a call) and lists the request pipes of
    /// the host-only directory, in order. A request hermes made leaves its
    /// lock behind when its process dies, so it is found on the host side;
    /// the mount is looked through too (for what has no lock there) when
    /// `whole`.
    fn sweep_and_list(&self, whole: bool) -> Result<Vec<String>, Refused> {
        let mut pipes = Vec::new();
        let mut swept = 0;
        for name in self.names(&self.host)? {
            if pipe_of(&name) == Some(name.as_str()) {
                pipes.push(name);
            } else if swept < SWEEP_PER_SCAN {
                // A lock nobody holds, or a request left half built.
                let request = name.strip_suffix(LOCK_SUFFIX).unwrap_or(&name);
                if request.starts_with("x.")
                    && older_than(&self.host, &name, STALE_AFTER)
                    && !self.is_held(request)
                {
                    swept += 1;
                    self.remove_staged(request);
                    self.sweep(request);
                    let lock = format!("{request}{LOCK_SUFFIX}");
                    let _ = unlinkat(&self.host, lock.as_str(), UnlinkatFlags::NoRemoveDir);
                }
            }
        }
        let mount = if whole {
            self.names(&self.fd)?
        } else {
            Vec::new()
        };
        for name in mount {
            if swept >= SWEEP_PER_SCAN {
                break;
            }
            if name.starts_with("x.")
                && older_than(&self.fd, &name, STALE_AFTER)
                && !self.is_held(&name)
            {
                swept += 1;
                self.sweep(&name);
            }
        }
        pipes.sort();
        Ok(pipes)
    }

    /// Whether a hermes process holds the lock of the request `name`.
    fn is_held(&self, name: &str) -> bool {
        let lock = format!("{name}{LOCK_SUFFIX}");
        let Ok(fd) = openat(
            &self.host,
            lock.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        match Flock::lock(fd, FlockArg::LockSharedNonblock) {
            Ok(_free) => false,
            Err((_, Errno::EWOULDBLOCK)) => true,
            // Unknown: kept.
            Err(_) => true,
        }
    }

    /// Removes a request directory from the mount whose hermes process is
    /// gone (it may hold an environment file).
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

    /// Removes the name `name` from the mount (not a directory, never what
    /// it points to).
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
}

/// Makes the pipe `name` in `dir` (a directory the container cannot reach
/// yet) and opens it for reading, checking that what is opened is the
/// pipe just made.
fn reader(dir: &OwnedFd, name: &str) -> Result<pipe::Receiver, Refused> {
    let fd = make_pipe(dir, name, OFlag::O_RDONLY)?;
    pipe::Receiver::from_owned_fd(fd).map_err(|e| refused(&format!("cannot read {name}"), e))
}

/// As [`reader`], opened read-write: held open, never read, so that its
/// other end sees the end of the file only when this process is gone.
fn holder(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Refused> {
    make_pipe(dir, name, OFlag::O_RDWR)
}

/// Makes the pipe `name` in `dir` (a directory the container cannot reach
/// yet) and opens its write end, without blocking: through a read-write
/// descriptor held only for the open (a write end opens without blocking
/// only where a reader is), checked as [`make_pipe`] checks.
fn writer(dir: &OwnedFd, name: &str) -> Result<pipe::Sender, Refused> {
    let both = make_pipe(dir, name, OFlag::O_RDWR)?;
    let made = fstat(&both).map_err(|e| refused("fstat", e))?;
    let fd = openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| refused(&format!("cannot open {name}"), e))?;
    let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
    if !is(&st, SFlag::S_IFIFO) || (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino) {
        return Err(Refused(format!("{name} is not the pipe hermes made")));
    }
    drop(both);
    pipe::Sender::from_owned_fd(fd).map_err(|e| refused(&format!("cannot write {name}"), e))
}

/// Makes the pipe `name` in `dir` and opens it with `access`, without
/// blocking or following a link, checking that what is opened is the pipe
/// just made.
fn make_pipe(dir: &OwnedFd, name: &str, access: OFlag) -> Result<OwnedFd, Refused> {
    mkfifoat(dir, name, Mode::from_bits_truncate(0o600))
        .map_err(|e| refused(&format!("cannot make {name}"), e))?;
    let made =
        fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| refused("fstatat", e))?;
    let fd = openat(
        dir,
        name,
        access | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| refused(&format!("cannot open {name}"), e))?;
    let st = fstat(&fd).map_err(|e| refused("fstat", e))?;
    if !is(&st, SFlag::S_IFIFO) || (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino) {
        return Err(Refused(format!("{name} is not the pipe hermes made")));
    }
    Ok(fd)
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        empty_dir(&self.fd);
        let _ = unlinkat(&self.root.fd, self.name.as_str(), UnlinkatFlags::RemoveDir);
        let lock = format!("{}{LOCK_SUFFIX}", self.name);
        let _ = unlinkat(&self.root.host, lock.as_str(), UnlinkatFlags::NoRemoveDir);
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

/// Whether `name` in `dir` was last changed more than `age` ago.
fn older_than(dir: &OwnedFd, name: &str, age: Duration) -> bool {
    let Ok(st) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
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

/// The name of the script of the runner of the request pipe `pipe`.
pub(crate) fn script_of(pipe: &str) -> String {
    format!("{pipe}{SCRIPT_SUFFIX}")
}

/// The request pipe a name of the mount belongs to: `ctl.<hex>` itself, or
/// its script `ctl.<hex>.sh`.
fn pipe_of(name: &str) -> Option<&str> {
    let pipe = name.strip_suffix(SCRIPT_SUFFIX).unwrap_or(name);
    pipe.strip_prefix("ctl.")
        .is_some_and(is_hex)
        .then_some(pipe)
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
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::PermissionsExt;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// A runner directory laid out as hermes's: `<base>/sandboxes/r`, its
    /// host-only twin `<base>/runner-host/r`.
    pub(crate) fn runner_dir() -> (tempfile::TempDir, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("sandboxes/r");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .unwrap();
        (base, dir)
    }

    fn host_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(host_dir(dir).unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn only_a_private_directory_of_this_user_is_taken() {
        let (base, dir) = runner_dir();
        assert!(RunnerDir::open(&dir).is_ok());
        let host = host_dir(&dir).unwrap();
        assert_eq!(host, base.path().join("runner-host/r"));
        let mode = std::fs::symlink_metadata(&host)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A host-only directory others may read is refused.
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(RunnerDir::open(&dir).is_err());
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(RunnerDir::open(&dir).is_err());
        let link = base.path().join("sandboxes/link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(RunnerDir::open(&link).is_err());
        assert!(RunnerDir::open(&base.path().join("sandboxes/missing")).is_err());
    }

    #[tokio::test]
    async fn a_reader_opened_before_its_writer_waits_for_it() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let (request, mut readers) = root.new_request("", "", false).unwrap();
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
        let (request, _readers) = root.new_request("cmd text", "env text", false).unwrap();
        // Named after nothing of the host: random hex only.
        let hex = request.name().strip_prefix("x.").unwrap();
        assert!(hex.len() == 32 && is_hex(hex), "{}", request.name());
        assert!(!request.name().contains(&std::process::id().to_string()));
        let at = dir.join(request.name());
        assert_eq!(std::fs::read_to_string(at.join("env")).unwrap(), "env text");
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&at), 0o700);
        assert_eq!(mode(&at.join("env")), 0o600);
        assert_eq!(mode(&at.join("cmd")), 0o600);
        assert_eq!(mode(&at.join("out")), 0o600);
        // Moved whole into the mount; only its lock stays on the host side.
        assert_eq!(
            host_names(&dir),
            vec![format!("{}{LOCK_SUFFIX}", request.name())]
        );
        assert!(root.is_held(request.name()));
        request.remove_files();
        assert!(!at.join("env").exists());
        assert!(!at.join("cmd").exists());
        assert!(request.withdraw().unwrap());
        assert!(!request.withdraw().unwrap());
        drop(request);
        assert!(!at.exists());
        assert!(host_names(&dir).is_empty());
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
        assert!(std::fs::symlink_metadata(dir.join("ctl.bb")).is_err());
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

    /// Opens a pipe for reading as a runner does (read-write: it never
    /// blocks, and the pipe has a reader from then on).
    fn read_end(path: &Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_pipe_the_container_makes_or_swaps_in_is_never_opened() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        // The container's own request pipe, with a reader: not a runner.
        nix::unistd::mkfifo(&dir.join("ctl.0"), Mode::from_bits_truncate(0o600)).unwrap();
        let mut planted = read_end(&dir.join("ctl.0"));
        assert!(root.live_pipe(false).unwrap().is_none());
        assert!(root.open_pipe("ctl.0").is_err());
        // Hermes's pipe, swapped in the mount for the container's own.
        let name = root.new_runner("# script\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(script_of(&name))).unwrap(),
            "# script\n"
        );
        let genuine = read_end(&dir.join(&name));
        std::fs::remove_file(dir.join(&name)).unwrap();
        nix::unistd::mkfifo(&dir.join(&name), Mode::from_bits_truncate(0o600)).unwrap();
        let mut swapped = read_end(&dir.join(&name));
        let pipe = root.live_pipe(false).unwrap().unwrap();
        pipe.ring("x.ab").unwrap();
        // The line went to the genuine pipe, to no pipe of the container.
        let mut line = [0u8; 5];
        (&genuine).read_exact(&mut line).unwrap();
        assert_eq!(&line, b"x.ab\n");
        for fake in [&mut planted, &mut swapped] {
            let fd = std::os::fd::AsFd::as_fd(fake);
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
            assert_eq!(
                fake.read(&mut [0u8; 16]).map_err(|e| e.kind()),
                Err(io::ErrorKind::WouldBlock)
            );
        }
        // Without its reader the genuine pipe is no runner, whatever reads
        // the name in the mount; retired, both names and the script go, and
        // so does what the container planted.
        drop(genuine);
        assert!(root.live_pipe(false).unwrap().is_none());
        assert!(root.live_pipe(true).unwrap().is_none());
        assert!(host_names(&dir).is_empty());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn a_dead_pipe_is_no_runner_and_a_live_one_is() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let name = root.new_runner("").unwrap();
        assert!(root.open_pipe(&name).unwrap().is_none());
        assert!(root.live_pipe(false).unwrap().is_none());
        assert!(dir.join(&name).exists(), "kept without the lock");
        let _reader = read_end(&dir.join(&name));
        let pipe = root.live_pipe(true).unwrap().unwrap();
        assert_eq!(pipe.name(), name);
        pipe.ring("x.ab").unwrap();
    }

    #[tokio::test]
    async fn stale_requests_are_swept_and_live_ones_kept() {
        let (_base, dir) = runner_dir();
        let root = RunnerDir::open(&dir).unwrap();
        let host = host_dir(&dir).unwrap();
        // Left by a hermes process that is gone: no lock held.
        let gone = dir.join("x.00ff");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("env"), "export K='secret'").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", gone.join("out")).unwrap();
        std::fs::write(host.join("x.00ff.lock"), "").unwrap();
        let half = host.join("x.00ee");
        std::fs::create_dir(&half).unwrap();
        std::fs::write(half.join("env"), "export K='secret'").unwrap();
        // A request that lives (its lock is held), however old.
        let (request, _readers) = root.new_request("", "", false).unwrap();
        let alive = dir.join(request.name());
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        for p in [
            &gone,
            &half,
            &alive,
            &host.join("x.00ff.lock"),
            &host.join(format!("{}{LOCK_SUFFIX}", request.name())),
        ] {
            std::fs::File::open(p).unwrap().set_modified(old).unwrap();
        }
        root.live_pipe(true).unwrap();
        assert!(!gone.exists());
        assert!(!half.exists());
        assert!(!host.join("x.00ff.lock").exists());
        assert!(alive.exists());
        assert!(std::fs::metadata("/etc/passwd").is_ok());
    }

    #[test]
    fn names_hermes_reads_are_checked() {
        assert_eq!(pipe_of("ctl.abc"), Some("ctl.abc"));
        assert_eq!(pipe_of("ctl.abc.sh"), Some("ctl.abc"));
        assert_eq!(pipe_of("ctl."), None);
        assert_eq!(pipe_of("ctl.xyz"), None);
        assert_eq!(pipe_of("x.abc"), None);
        assert_eq!(
            marker_name("abc123"),
            Some("unsupported.abc123".to_string())
        );
        assert_eq!(marker_name("../x"), None);
        assert_eq!(marker_name(""), None);
    }
}
