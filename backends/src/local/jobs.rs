//! The background sandboxes of `terminal.local_sandbox: bwrap`, seen and
//! stopped from the host.
//!
//! Each `hermes exec --background` command there has a sandbox of its own
//! ([`super::launch`]), which no later command's sandbox can see into: so
//! hermes's own scripts of [`crate::background`] (`hermes process
//! list|logs|kill`) are answered here, on the host, with the output and
//! exit codes those scripts give.
//!
//! - What is trusted is hermes's record of each launch, in a directory
//!   of the host no sandbox sees: the host pid of the sandbox's PID 1
//!   (hermes's init) and the kernel's start time of that process, so a pid
//!   used again by another process is never taken for it. A launch is
//!   running while that process lives; it is stopped through a pidfd
//!   opened on it and checked again.
//! - What the job itself wrote (its command line, output and exit code,
//!   under the task's state directory) is the sandbox's and hostile: each
//!   file is opened below directories opened without following a link,
//!   itself without following one, without blocking, and only when it is
//!   a regular file; what is read of it is bounded.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::background::{self, MAX_COMMAND, MAX_LISTED, NO_SUCH_PROCESS, check_id};
use crate::exec::{ExecIo, ExecOutcome, TIMEOUT_EXIT_CODE};

/// How long a SIGTERM has before SIGKILL, as [`background::KILL`] gives.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// How often a followed output is read again.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The background sandboxes of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jobs {
    /// hermes's records, one file per launch named by its id.
    pub launched: PathBuf,
    /// The task's exec state on the host (its `jobs/ID/` the jobs' own
    /// files).
    pub state: PathBuf,
}

/// hermes's record of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The host pid of the sandbox's PID 1.
    pub pid: u32,
    /// That process's start time, in clock ticks since boot.
    pub start: u64,
    /// When it was launched, in Unix seconds.
    pub launched: i64,
}

impl Record {
    /// The record of the process `pid` as it is now; `None` when it is
    /// gone.
    pub fn of(pid: u32) -> Option<Record> {
        let (_, start) = stat_of(pid)?;
        let launched = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Some(Record {
            pid,
            start,
            launched,
        })
    }

    /// Whether the recorded process still runs (the same process: its
    /// start time unchanged, not a zombie).
    pub fn alive(&self) -> bool {
        stat_of(self.pid).is_some_and(|(state, start)| start == self.start && state != 'Z')
    }

    /// A pidfd on the recorded process, checked after it was opened to be
    /// that process (a pidfd names one process from then on); `None` once
    /// it is gone.
    pub fn pidfd(&self) -> Option<OwnedFd> {
        use rustix::process::{Pid, PidfdFlags, pidfd_open};
        let pid = i32::try_from(self.pid).ok().and_then(Pid::from_raw)?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty()).ok()?;
        self.alive().then_some(pidfd)
    }

    /// Ends the recorded process's sandbox at once (SIGKILL to its PID 1
    /// ends every process of its pid namespace).
    pub fn kill(&self) {
        if let Some(pidfd) = self.pidfd() {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
        }
    }

    fn parse(text: &str) -> Option<Record> {
        let mut words = text.split_ascii_whitespace();
        let record = Record {
            pid: words.next()?.parse().ok()?,
            start: words.next()?.parse().ok()?,
            launched: words.next()?.parse().ok()?,
        };
        (record.pid > 1).then_some(record)
    }
}

/// The state letter and start time of process `pid`, from its
/// `/proc/PID/stat` (after the command name, which may hold anything).
fn stat_of(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 of the whole line: the 20th after the name.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// What a background process is, from the host.
enum Seen {
    /// No record of it: no such process.
    Unknown,
    Known {
        record: Record,
        exit: Option<u8>,
    },
}

impl Jobs {
    /// Records a launch (a new file, 0600, never one that exists).
    pub fn record(&self, id: &str, record: Record) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let id = check_id(id).map_err(std::io::Error::other)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(self.launched.join(id))?;
        writeln!(file, "{} {} {}", record.pid, record.start, record.launched)
    }

    fn seen(&self, id: &str) -> Seen {
        let Ok(id) = check_id(id) else {
            return Seen::Unknown;
        };
        let Some(record) = std::fs::read_to_string(self.launched.join(id))
            .ok()
            .and_then(|t| Record::parse(&t))
        else {
            return Seen::Unknown;
        };
        Seen::Known {
            record,
            exit: self.exit_code(id),
        }
    }

    /// The exit code the job wrote, once it ended by itself.
    fn exit_code(&self, id: &str) -> Option<u8> {
        let text = self.read_small(id, "exit", 12)?;
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// The first `max` bytes of the job's file `name`, as text.
    fn read_small(&self, id: &str, name: &str, max: u64) -> Option<String> {
        let mut bytes = Vec::new();
        self.open(id, name)?
            .take(max)
            .read_to_end(&mut bytes)
            .ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The job's file `name` (`state/jobs/ID/NAME`), when it is a regular
    /// file reached without following any link.
    fn open(&self, id: &str, name: &str) -> Option<File> {
        let dir = |flags: OFlag| flags | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let state = nix::fcntl::open(&self.state, dir(OFlag::O_RDONLY), Mode::empty()).ok()?;
        let jobs = nix::fcntl::openat(&state, "jobs", dir(OFlag::O_RDONLY), Mode::empty()).ok()?;
        let job = nix::fcntl::openat(&jobs, id, dir(OFlag::O_RDONLY), Mode::empty()).ok()?;
        let file: OwnedFd = nix::fcntl::openat(
            &job,
            name,
            OFlag::O_RDONLY
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let file = File::from(file);
        file.metadata().ok()?.is_file().then_some(file)
    }

    /// The listing of [`background::LIST`]: one line per recorded launch.
    fn list(&self) -> String {
        let Ok(entries) = std::fs::read_dir(&self.launched) else {
            return String::new();
        };
        let mut out = String::new();
        for entry in entries.flatten().take(MAX_LISTED) {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| check_id(n).ok()) else {
                continue;
            };
            let Seen::Known { record, exit } = self.seen(id) else {
                continue;
            };
            let state = match exit {
                Some(code) => format!("exited {code}"),
                None if record.alive() => "running".to_string(),
                None => "killed".to_string(),
            };
            let size = self
                .open(id, "out")
                .and_then(|f| f.metadata().ok())
                .map_or(0, |m| m.len());
            let command: String = self
                .read_small(id, "cmd", MAX_COMMAND as u64)
                .unwrap_or_default()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            out.push_str(&format!(
                "{id}\t{state}\t{}\t{}\t{size}\t{command}\n",
                record.pid, record.launched
            ));
        }
        out
    }

    /// Stops the sandbox of `record`: SIGTERM to its init (which passes it
    /// on to each of its processes), SIGKILL, which ends every process of
    /// the sandbox, after [`TERM_GRACE`]. Whether it was running.
    async fn stop(record: Record) -> bool {
        use rustix::process::{Signal, pidfd_send_signal};
        let Some(pidfd) = record.pidfd() else {
            return false;
        };
        if pidfd_send_signal(&pidfd, Signal::TERM).is_err() {
            return false;
        }
        let until = tokio::time::Instant::now() + TERM_GRACE;
        while record.alive() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = pidfd_send_signal(&pidfd, Signal::KILL);
        true
    }
}

/// One of hermes's scripts of [`crate::background`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    List,
    Logs,
    Kill,
}

/// The script `argv` runs ([`background::script_argv`]'s), and its
/// arguments; `None` for any other command.
pub fn script_of(argv: &[String]) -> Option<(Script, &[String])> {
    let [sh, c, script, _name, args @ ..] = argv else {
        return None;
    };
    if sh != "/bin/sh" || c != "-c" {
        return None;
    }
    let which = match script.as_str() {
        s if s == background::LIST => Script::List,
        s if s == background::LOGS => Script::Logs,
        s if s == background::KILL => Script::Kill,
        _ => return None,
    };
    Some((which, args))
}

/// Answers `script` with `args` as the script would in the sandbox: its
/// output on `io`, its exit code; `timeout` bounds a followed output.
pub async fn answer(
    jobs: &Jobs,
    script: Script,
    args: &[String],
    io: ExecIo<'_>,
    timeout: Duration,
) -> std::io::Result<ExecOutcome> {
    let arg = |n: usize| args.get(n).map(String::as_str).unwrap_or_default();
    let code = match script {
        Script::List => {
            io.stdout.write_all(jobs.list().as_bytes()).await?;
            0
        }
        Script::Kill => match jobs.seen(arg(1)) {
            Seen::Unknown => NO_SUCH_PROCESS,
            Seen::Known { record, exit } => {
                // Whatever it left running goes with its sandbox too.
                let stopped = Jobs::stop(record).await;
                let said = if stopped && exit.is_none() {
                    "killed\n"
                } else {
                    "not running\n"
                };
                io.stdout.write_all(said.as_bytes()).await?;
                0
            }
        },
        Script::Logs => {
            let id = arg(1);
            if matches!(jobs.seen(id), Seen::Unknown) {
                NO_SUCH_PROCESS
            } else {
                let tail = match arg(4).parse::<u64>() {
                    Ok(bytes) => Some(Tail::Bytes(bytes)),
                    Err(_) => arg(2).parse::<u64>().ok().map(Tail::Lines),
                };
                let follow = arg(3) == "follow";
                match tokio::time::timeout(
                    timeout,
                    logs(jobs, id, tail, follow, io.stdout, io.stderr),
                )
                .await
                {
                    Ok(done) => {
                        done?;
                        0
                    }
                    Err(_) => {
                        return Ok(ExecOutcome {
                            exit_code: TIMEOUT_EXIT_CODE,
                            timed_out: true,
                        });
                    }
                }
            }
        }
    };
    Ok(ExecOutcome {
        exit_code: i64::from(code),
        timed_out: false,
    })
}

/// How much of the output's end [`logs`] starts with.
#[derive(Debug, Clone, Copy)]
enum Tail {
    Lines(u64),
    Bytes(u64),
}

/// [`background::LOGS`] from the host: the output (its last `tail`
/// lines or bytes), then, with `follow`, what the job writes until it
/// ends; its size and state last, on `stderr`.
async fn logs(
    jobs: &Jobs,
    id: &str,
    tail: Option<Tail>,
    follow: bool,
    stdout: &mut (dyn AsyncWrite + Unpin + Send),
    stderr: &mut (dyn AsyncWrite + Unpin + Send),
) -> std::io::Result<()> {
    let mut out = jobs.open(id, "out");
    let mut at = match (&mut out, tail) {
        (Some(file), Some(Tail::Lines(lines))) => start_of_last_lines(file, lines)?,
        (Some(file), Some(Tail::Bytes(bytes))) => file.metadata()?.len().saturating_sub(bytes),
        _ => 0,
    };
    let running = |jobs: &Jobs| match jobs.seen(id) {
        Seen::Known { record, exit } => exit.is_none() && record.alive(),
        Seen::Unknown => false,
    };
    loop {
        // Before the read: what it wrote before it ended is all read.
        let more = follow && running(jobs);
        if out.is_none() {
            out = jobs.open(id, "out");
        }
        if let Some(file) = &mut out {
            at = copy_from(file, at, stdout).await?;
        }
        if !more {
            break;
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
    stdout.flush().await?;
    let state = match jobs.seen(id) {
        Seen::Known {
            exit: Some(code), ..
        } => format!("exited {code}"),
        Seen::Known { record, .. } if record.alive() => "running".to_string(),
        _ => "killed".to_string(),
    };
    stderr
        .write_all(format!("hermes-process-bytes: {at}\nhermes-process: {state}\n").as_bytes())
        .await
}

/// Writes what `file` holds from byte `at` up to its size now; the new
/// offset. A file cut shorter is read again from its new end.
async fn copy_from(
    file: &mut File,
    at: u64,
    to: &mut (dyn AsyncWrite + Unpin + Send),
) -> std::io::Result<u64> {
    let size = file.metadata()?.len();
    if size < at {
        return Ok(size);
    }
    file.seek(SeekFrom::Start(at))?;
    let mut left = size - at;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    Ok(size - left)
}

/// Where the last `lines` lines of `file` start (a last line without its
/// newline counts), read backwards in blocks.
fn start_of_last_lines(file: &mut File, lines: u64) -> std::io::Result<u64> {
    let size = file.metadata()?.len();
    if lines == 0 {
        return Ok(size);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = size;
    let mut seen = 0u64;
    // A newline that ends the file ends the last line, not one more.
    let mut skip_last = true;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let len = usize::try_from(end - start).unwrap_or(buf.len());
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..len])?;
        for i in (0..len).rev() {
            if buf[i] != b'\n' {
                skip_last = false;
                continue;
            }
            if skip_last {
                skip_last = false;
                continue;
            }
            seen += 1;
            if seen == lines {
                return Ok(start + i as u64 + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

/// The task's directory of a job, `STATE/jobs/ID`, from its path in the
/// sandbox (`/run/hermes/state/jobs/ID`): its id, when the path has that
/// shape.
pub fn job_id(job: &str) -> Option<&str> {
    let rest = job.strip_prefix(super::bwrap::STATE_DIR)?;
    let id = rest.strip_prefix("/jobs/")?;
    check_id(id).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    fn jobs(dir: &Path) -> Jobs {
        let jobs = Jobs {
            launched: dir.join("launched"),
            state: dir.join("state"),
        };
        std::fs::create_dir_all(&jobs.launched).unwrap();
        std::fs::create_dir_all(jobs.state.join("jobs")).unwrap();
        jobs
    }

    #[test]
    fn the_last_lines_start_where_tail_would_start_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        for (text, n, want) in [
            ("a\nb\nc\n", 1, "c\n"),
            ("a\nb\nc\n", 2, "b\nc\n"),
            ("a\nb\nc", 1, "c"),
            ("a\nb\nc", 5, "a\nb\nc"),
            ("", 3, ""),
            ("a\n", 0, ""),
        ] {
            std::fs::write(&path, text).unwrap();
            let mut f = File::open(&path).unwrap();
            let at = start_of_last_lines(&mut f, n).unwrap();
            assert_eq!(&text[usize::try_from(at).unwrap()..], want, "{text:?} {n}");
        }
        let long: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &long).unwrap();
        let mut f = File::open(&path).unwrap();
        let at = start_of_last_lines(&mut f, 2).unwrap();
        assert_eq!(
            &long[usize::try_from(at).unwrap()..],
            "line 99998\nline 99999\n"
        );
    }

    #[test]
    fn a_job_s_files_are_read_only_when_regular_and_reached_without_links() {
        let dir = tempfile::tempdir().unwrap();
        let j = jobs(dir.path());
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "sk-real").unwrap();
        let job = j.state.join("jobs/0000000a");
        std::fs::create_dir_all(&job).unwrap();
        std::os::unix::fs::symlink(&secret, job.join("out")).unwrap();
        nix::unistd::mkfifo(&job.join("cmd"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(job.join("exit"), "7\n").unwrap();
        assert!(j.open("0000000a", "out").is_none());
        // A FIFO is neither read nor waited on.
        assert!(j.open("0000000a", "cmd").is_none());
        assert_eq!(j.exit_code("0000000a"), Some(7));
        // A job directory that is a link leads nowhere either.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("exit"), "9\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, j.state.join("jobs/0000000b")).unwrap();
        assert_eq!(j.exit_code("0000000b"), None);
    }

    #[test]
    fn only_recorded_launches_are_listed_and_a_reused_pid_is_not_alive() {
        let dir = tempfile::tempdir().unwrap();
        let j = jobs(dir.path());
        // A job directory the sandbox made itself, with no record: unseen.
        std::fs::create_dir_all(j.state.join("jobs/0000000c")).unwrap();
        let me = Record::of(std::process::id()).unwrap();
        assert!(me.alive());
        j.record("0000000d", me).unwrap();
        // The same pid with another start time is another process.
        let other = Record {
            start: me.start + 1,
            ..me
        };
        assert!(!other.alive());
        j.record("0000000e", other).unwrap();
        assert!(
            j.record("0000000e", other).is_err(),
            "a record is never replaced"
        );
        let list = j.list();
        let jobs = background::parse_list(&list);
        let states: Vec<(&str, &str)> = jobs
            .iter()
            .map(|job| (job.id.as_str(), job.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [("0000000d", "running"), ("0000000e", "killed")],
            "{list}"
        );
    }

    #[test]
    fn the_scripts_are_told_apart_from_any_other_command() {
        let argv =
            background::script_argv(background::KILL, &["/run/hermes/state/jobs", "0000000a"]);
        let (script, args) = script_of(&argv).unwrap();
        assert_eq!(script, Script::Kill);
        assert_eq!(args[1], "0000000a");
        let other = background::script_argv("echo hi", &[]);
        assert!(script_of(&other).is_none());
        assert_eq!(job_id("/run/hermes/state/jobs/0000000a"), Some("0000000a"));
        assert_eq!(job_id("/run/hermes/state/jobs/../x"), None);
    }
}
