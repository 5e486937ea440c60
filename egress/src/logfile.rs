//! The daemon's log file (`proxy/proxy.log`), rotated by size: when a line
//! would take it past its size it becomes `proxy.log.1` (`.1` becomes
//! `.2`, and so on), and past the number of files kept the oldest goes.
//! Every file is 0600, opened without following a symlink. Lines are
//! written whole, each at most [`MAX_LINE`] bytes. The process's own
//! stdout and stderr can be pointed at the current file and kept there
//! across rotations ([`own_stdio`]): they write to it directly, so nothing
//! is lost when the process exits.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The longest line written; longer ones are cut (and end with `…`).
pub const MAX_LINE: usize = 16 * 1024;

/// A log file rotated by size.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    /// Whether stdout and stderr follow the current file.
    stdio: bool,
}

fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

impl RotatingLog {
    /// Opens `path` for appending; rotates once it would pass `max_bytes`,
    /// keeping `keep` old files.
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<RotatingLog> {
        Ok(RotatingLog {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep: keep.max(1),
            file: open_append(path)?,
            stdio: false,
        })
    }

    fn numbered(&self, n: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        let _ = std::fs::remove_file(self.numbered(self.keep));
        for n in (1..self.keep).rev() {
            match std::fs::rename(self.numbered(n), self.numbered(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, self.numbered(1))?;
        self.file = open_append(&self.path)?;
        if self.stdio {
            self.point_stdio()?;
        }
        Ok(())
    }

    fn point_stdio(&self) -> io::Result<()> {
        nix::unistd::dup2_stdout(&self.file).map_err(io::Error::from)?;
        nix::unistd::dup2_stderr(&self.file).map_err(io::Error::from)?;
        Ok(())
    }

    /// The current file's size, with what stdout and stderr wrote to it.
    fn size(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }

    /// Rotates when the current file has reached its size.
    pub fn rotate_if_full(&mut self) -> io::Result<()> {
        if self.size() >= self.max_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Writes one line (`line` should end with a newline), cut to
    /// [`MAX_LINE`], rotating first when it would not fit.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let cut;
        let line = if line.len() > MAX_LINE {
            let mut short = line[..MAX_LINE - 4].to_vec();
            short.extend_from_slice("…\n".as_bytes());
            cut = short;
            &cut[..]
        } else {
            line
        };
        let size = self.size();
        if size > 0 && size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)
    }

    /// Writes whole lines (each ending with a newline) as [`write_line`]
    /// would one by one, in one write when they all fit in the current
    /// file and none needs cutting: what a busy writer queued costs one
    /// system call, not one per line.
    ///
    /// [`write_line`]: RotatingLog::write_line
    pub fn write_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        let fits = self.size() + lines.len() as u64 <= self.max_bytes;
        let short = lines
            .split_inclusive(|b| *b == b'\n')
            .all(|line| line.len() <= MAX_LINE);
        if fits && short {
            return self.file.write_all(lines);
        }
        for line in lines.split_inclusive(|b| *b == b'\n') {
            self.write_line(line)?;
        }
        Ok(())
    }
}

/// A [`RotatingLog`] shared by writers: each `write` call is written as
/// whole lines (callers hand it whole lines, one or several).
#[derive(Debug, Clone)]
pub struct SharedLog(Arc<Mutex<RotatingLog>>);

impl SharedLog {
    pub fn new(log: RotatingLog) -> SharedLog {
        SharedLog(Arc::new(Mutex::new(log)))
    }
}

impl Write for SharedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write_lines(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How often the file is checked for what stdout and stderr wrote.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl SharedLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, RotatingLog> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Points this process's stdout and stderr (what `eprintln!`, the logs
/// and a panic print) at `log`'s current file and keeps them there across
/// rotations; a thread of its own rotates the file once a second when
/// they filled it.
pub fn own_stdio(log: &SharedLog) -> io::Result<()> {
    {
        let mut inner = log.lock();
        inner.point_stdio()?;
        inner.stdio = true;
    }
    let log = log.clone();
    std::thread::Builder::new()
        .name("log-rotate".into())
        .spawn(move || {
            loop {
                std::thread::sleep(CHECK_EVERY);
                let _ = log.lock().rotate_if_full();
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_log_rotates_by_size_and_keeps_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.log");
        let mut log = RotatingLog::open(&path, 1000, 2).unwrap();
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..100 {
            log.write_line(line.as_bytes()).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["proxy.log", "proxy.log.1", "proxy.log.2"]);
        for name in &names {
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            assert!(meta.len() <= 1000, "{name}: {}", meta.len());
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        }
        // A line longer than the limit is cut.
        log.write_line(&vec![b'y'; MAX_LINE * 2]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().all(|l| l.len() <= MAX_LINE));
    }

    /// Lines handed over together end up as they would one by one: the
    /// same bytes in the same files, every file within its size, a long
    /// line cut.
    #[test]
    fn lines_written_together_land_as_lines_written_one_by_one() {
        let files = |dir: &Path| {
            let mut found: Vec<(String, String)> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().into_string().unwrap(),
                        std::fs::read_to_string(e.path()).unwrap(),
                    )
                })
                .collect();
            found.sort();
            found
        };
        let lines: Vec<String> = (0..60)
            .map(|i| match i {
                17 => format!("{}\n", "L".repeat(MAX_LINE * 2)),
                _ => format!("{i:03}{}\n", "x".repeat(i * 3)),
            })
            .collect();
        let (one, many) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut by_one = RotatingLog::open(&one.path().join("proxy.log"), 20_000, 3).unwrap();
        for line in &lines {
            by_one.write_line(line.as_bytes()).unwrap();
        }
        let mut together = RotatingLog::open(&many.path().join("proxy.log"), 20_000, 3).unwrap();
        for chunk in lines.chunks(7) {
            together.write_lines(chunk.concat().as_bytes()).unwrap();
        }
        let (a, b) = (files(one.path()), files(many.path()));
        assert_eq!(
            a.len(),
            2,
            "{:?}",
            a.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        assert_eq!(
            a.iter().map(|f| f.1.lines().count()).sum::<usize>(),
            b.iter().map(|f| f.1.lines().count()).sum::<usize>()
        );
        for (_, text) in a.iter().chain(&b) {
            assert!(text.len() <= 20_000);
            assert!(text.lines().all(|l| l.len() <= MAX_LINE));
        }
        // The same lines, in order, across the files.
        let all = |f: &[(String, String)]| {
            let mut f = f.to_vec();
            f.reverse();
            f.into_iter().map(|(_, t)| t).collect::<String>()
        };
        assert_eq!(all(&a), all(&b));
    }

    #[test]
    fn a_symlink_in_place_of_the_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let path = dir.path().join("proxy.log");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(RotatingLog::open(&path, 1000, 2).is_err());
    }
}
