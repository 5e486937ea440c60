//! `hermes process list|logs|kill`: the background processes `hermes exec
//! --background` started, on every backend.
//!
//! Their state lives in the sandbox ([`hermes_backends::background`]), so
//! these verbs run hermes's own scripts there through the backend's
//! ordinary exec, with none of the task's values. They look inside a
//! sandbox that is running and never make, start or resume one: a sandbox
//! that is not running has no background process. What the sandbox
//! answers is parsed as hostile (ids checked, fields bounded), and the
//! output a process wrote is redacted as a command's.

use std::fmt;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use hermes_backends::background::{self, Job, check_id, script_argv};
use hermes_model::desired::Desired;
use serde::Serialize;

use crate::cli::{Output, ProcessCommand, ProcessWhere};
use crate::commands::exec::{Stdin, Streams, run_own, which_flags};
use crate::commands::mcp::capture::{Captured, Shared};
use crate::exec_target::{ExecTarget, Which};
use crate::home::Home;

/// How long a listing or a kill may take in the sandbox.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `logs --follow` may follow one process.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most bytes of a listing read from the sandbox.
const MAX_LISTING: usize = 256 * 1024;

pub async fn run(home: &Home, profile: &str, command: ProcessCommand) -> anyhow::Result<ExitCode> {
    hermes_model::desired::check_profile(profile)?;
    let desired = crate::load::load_desired(home, profile)?;
    match command {
        ProcessCommand::List { at, output } => {
            let list = list(home, &desired, &at).await?;
            match output {
                Output::Json => crate::json::print(&list)?,
                Output::Text => print!("{list}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Logs {
            id,
            at,
            follow,
            tail,
        } => logs(home, &desired, &at, &id, follow, tail).await,
        ProcessCommand::Kill { id, at, output } => {
            let killed = kill(home, &desired, &at, &id).await?;
            match output {
                Output::Json => crate::json::print(&killed)?,
                Output::Text => println!("{killed}"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn which(at: &ProcessWhere) -> anyhow::Result<Which<'_>> {
    if let Some(session) = &at.session {
        hermes_model::desired::check_session(session)?;
    }
    Ok(Which {
        task: &at.task,
        session: at.session.as_deref(),
    })
}

/// The sandbox of `which` as it is now, and its jobs directory; `None`
/// when it is not running.
async fn target(
    home: &Home,
    desired: &Desired,
    which: &Which<'_>,
) -> anyhow::Result<Option<(ExecTarget, String)>> {
    let found = crate::backend::of(desired)
        .find(home, desired, which)
        .await?;
    Ok(found.map(|target| {
        let jobs = target.jobs_dir(home, desired, which);
        (target, jobs)
    }))
}

/// The running sandbox of one process, for `logs` and `kill`.
struct Found {
    target: ExecTarget,
    jobs: String,
    /// Its name, for a message.
    sandbox: String,
    /// The options that name it again, for a hint.
    flags: String,
}

/// The running sandbox of `at` for process `id`; an error naming it when
/// it is not running.
async fn found(
    home: &Home,
    desired: &Desired,
    at: &ProcessWhere,
    id: &str,
) -> anyhow::Result<Found> {
    let which = which(at)?;
    let sandbox = sandbox_name(desired, &which);
    let flags = which_flags(&which);
    let Some((target, jobs)) = target(home, desired, &which).await? else {
        anyhow::bail!("{sandbox} is not running: no background process {id}");
    };
    Ok(Found {
        target,
        jobs,
        sandbox,
        flags,
    })
}

/// The sandbox's name for a message: the Docker container, or the backend.
fn sandbox_name(desired: &Desired, which: &Which<'_>) -> String {
    crate::backend::of(desired).place(desired, which)
}

/// Runs `argv` in `target`, its stdout kept (its first [`MAX_LISTING`]
/// bytes: a hostile sandbox's `sh` may print without end; the rest is
/// dropped, and the timeout ends it), its stderr passed on: (exit code,
/// stdout).
async fn capture(
    home: &Home,
    desired: &Desired,
    target: &ExecTarget,
    argv: Vec<String>,
) -> anyhow::Result<(u8, Vec<u8>)> {
    let kept = listing();
    let mut out = kept.writer();
    let mut err = tokio::io::stderr();
    let streams = Streams {
        stdout: &mut out,
        stderr: &mut err,
        stdin: Stdin::Empty,
    };
    let code = run_own(home, desired, target, argv, SCRIPT_TIMEOUT, streams).await?;
    let bytes = kept.lock().bytes();
    Ok((code, bytes))
}

/// A capture of a listing: its first [`MAX_LISTING`] bytes.
fn listing() -> Shared {
    Shared::new(Captured::new(MAX_LISTING, 0))
}

/// `hermes process list`.
#[derive(Debug, Serialize)]
struct ProcessList {
    task: String,
    session: Option<String>,
    /// The sandbox looked in.
    sandbox: String,
    /// Whether that sandbox is running (one that is not has none).
    running: bool,
    processes: Vec<ProcessJson>,
    #[serde(skip)]
    flags: String,
}

#[derive(Debug, Serialize)]
struct ProcessJson {
    id: String,
    state: &'static str,
    exit_code: Option<u8>,
    pid: Option<u32>,
    /// When it started, in Unix seconds.
    started_at: Option<i64>,
    age_seconds: Option<i64>,
    output_bytes: u64,
    command: String,
}

impl ProcessJson {
    fn of(job: Job, now: i64) -> ProcessJson {
        ProcessJson {
            id: job.id,
            state: job.state.as_str(),
            exit_code: job.state.exit_code(),
            pid: job.pid,
            started_at: job.started,
            age_seconds: job.started.map(|t| (now - t).max(0)),
            output_bytes: job.output_bytes,
            command: job.command,
        }
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

async fn list(home: &Home, desired: &Desired, at: &ProcessWhere) -> anyhow::Result<ProcessList> {
    let which = which(at)?;
    let mut list = ProcessList {
        task: at.task.clone(),
        session: at.session.clone(),
        sandbox: sandbox_name(desired, &which),
        running: false,
        processes: Vec::new(),
        flags: which_flags(&which),
    };
    let Some((target, jobs)) = target(home, desired, &which).await? else {
        return Ok(list);
    };
    list.running = true;
    let (code, out) = capture(
        home,
        desired,
        &target,
        script_argv(background::LIST, &[&jobs]),
    )
    .await?;
    anyhow::ensure!(
        code == 0,
        "cannot list the background processes in {}: the listing exited {code}",
        list.sandbox
    );
    let now = now();
    list.processes = background::parse_list(&String::from_utf8_lossy(&out))
        .into_iter()
        .map(|job| ProcessJson::of(job, now))
        .collect();
    Ok(list)
}

impl fmt::Display for ProcessList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.running {
            return writeln!(
                f,
                "{} is not running: no background processes.",
                self.sandbox
            );
        }
        if self.processes.is_empty() {
            return writeln!(
                f,
                "No background processes in {} (`hermes exec{} --background -- CMD` starts one).",
                self.sandbox, self.flags
            );
        }
        let rows: Vec<[String; 5]> = self
            .processes
            .iter()
            .map(|p| {
                let state = match p.exit_code {
                    Some(code) => format!("exited {code}"),
                    None => p.state.to_string(),
                };
                [
                    p.id.clone(),
                    state,
                    p.age_seconds
                        .map_or_else(|| "-".to_string(), hermes_reconcilers::age),
                    bytes(p.output_bytes),
                    p.command.clone(),
                ]
            })
            .collect();
        let rows: Vec<[&str; 5]> = rows
            .iter()
            .map(|r| [&*r[0], &*r[1], &*r[2], &*r[3], &*r[4]])
            .collect();
        crate::listing::table(f, ["ID", "STATE", "AGE", "OUTPUT", "COMMAND"], &rows)
    }
}

/// A size for a person: `512 B`, `1.5 KiB`, `3.2 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The error for an id the sandbox has no process of.
fn no_such(id: &str, sandbox: &str, flags: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "no background process {id} in {sandbox} (`hermes process list{flags}` shows them)"
    )
}

async fn logs(
    home: &Home,
    desired: &Desired,
    at: &ProcessWhere,
    id: &str,
    follow: bool,
    tail: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let id = check_id(id)?;
    let Found {
        target,
        jobs,
        sandbox,
        flags,
    } = found(home, desired, at, id).await?;
    let tail = tail.map(|n| n.to_string()).unwrap_or_default();
    let argv = script_argv(
        background::LOGS,
        &[&jobs, id, &tail, if follow { "follow" } else { "" }],
    );
    // The state line the script ends with goes to a buffer; the output
    // goes straight to stdout, redacted.
    let mut stdout = tokio::io::stdout();
    let mut said = Vec::new();
    let streams = Streams {
        stdout: &mut stdout,
        stderr: &mut said,
        stdin: Stdin::Empty,
    };
    let timeout = if follow {
        FOLLOW_TIMEOUT
    } else {
        SCRIPT_TIMEOUT
    };
    let code = run_own(home, desired, &target, argv, timeout, streams).await?;
    match i32::from(code) {
        0 => {}
        background::NO_SUCH_PROCESS => return Err(no_such(id, &sandbox, &flags)),
        141 => return Ok(ExitCode::from(141)),
        other => anyhow::bail!("cannot read the output of process {id}: exit {other}"),
    }
    let said = String::from_utf8_lossy(&said);
    let state = said
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("hermes-process: "))
        .and_then(background::State::parse);
    match state {
        Some(background::State::Exited(code)) => eprintln!("process {id} exited {code}"),
        Some(background::State::Killed) => eprintln!("process {id} was killed"),
        Some(background::State::Running) => eprintln!("process {id} is running"),
        None => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `hermes process kill`'s result.
#[derive(Debug, Serialize)]
struct Killed {
    id: String,
    sandbox: String,
    /// `killed`, or `not running` (it had ended already).
    result: &'static str,
}

impl fmt::Display for Killed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.result {
            "killed" => write!(f, "Killed process {} in {}.", self.id, self.sandbox),
            _ => write!(
                f,
                "Process {} in {} is not running; nothing to kill.",
                self.id, self.sandbox
            ),
        }
    }
}

async fn kill(
    home: &Home,
    desired: &Desired,
    at: &ProcessWhere,
    id: &str,
) -> anyhow::Result<Killed> {
    let id = check_id(id)?;
    let Found {
        target,
        jobs,
        sandbox,
        flags,
    } = found(home, desired, at, id).await?;
    let result = kill_in(home, desired, &target, &jobs, id)
        .await
        .map_err(|e| e.context(format!("cannot kill process {id} in {sandbox}")))?
        .ok_or_else(|| no_such(id, &sandbox, &flags))?;
    Ok(Killed {
        id: id.to_string(),
        sandbox,
        result,
    })
}

/// A background process as `hermes mcp`'s process tool reads it.
pub(crate) struct Polled {
    pub state: background::State,
    /// The size of its whole output.
    pub output_bytes: u64,
    /// Its output's last bytes (as many as asked for), redacted.
    pub tail: Vec<u8>,
}

/// Process `id` of `which`, with the last `keep` bytes of its output;
/// `None` when the sandbox is not running or has no such process.
pub(crate) async fn poll(
    home: &Home,
    desired: &Desired,
    which: &Which<'_>,
    id: &str,
    keep: usize,
) -> anyhow::Result<Option<Polled>> {
    let id = check_id(id)?;
    let Some((target, jobs)) = target(home, desired, which).await? else {
        return Ok(None);
    };
    let out = Shared::new(Captured::new(0, keep));
    let said = Shared::new(Captured::new(4096, 0));
    let (mut o, mut e) = (out.writer(), said.writer());
    let streams = Streams {
        stdout: &mut o,
        stderr: &mut e,
        stdin: Stdin::Empty,
    };
    let keep = keep.to_string();
    let argv = script_argv(background::LOGS, &[&jobs, id, "", "", &keep]);
    let code = run_own(home, desired, &target, argv, SCRIPT_TIMEOUT, streams).await?;
    match i32::from(code) {
        0 => {}
        background::NO_SUCH_PROCESS => return Ok(None),
        other => anyhow::bail!("cannot read the output of process {id}: exit {other}"),
    }
    let said = String::from_utf8_lossy(&said.lock().bytes()).into_owned();
    let field = |prefix: &str| {
        said.lines()
            .rev()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    let state = field("hermes-process: ")
        .and_then(|s| background::State::parse(&s))
        .ok_or_else(|| anyhow::anyhow!("cannot read the state of process {id}"))?;
    let output_bytes = field("hermes-process-bytes: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let tail = out.lock().bytes();
    Ok(Some(Polled {
        state,
        output_bytes,
        tail,
    }))
}

/// Stops process `id` of `which` as `hermes process kill` does:
/// `killed`, `not running`, or `None` when there is no such process.
pub(crate) async fn stop(
    home: &Home,
    desired: &Desired,
    which: &Which<'_>,
    id: &str,
) -> anyhow::Result<Option<&'static str>> {
    let id = check_id(id)?;
    let Some((target, jobs)) = target(home, desired, which).await? else {
        return Ok(None);
    };
    kill_in(home, desired, &target, &jobs, id)
        .await
        .map_err(|e| e.context(format!("cannot kill process {id}")))
}

/// Runs [`background::KILL`] for `id` in `target`: `killed`, `not
/// running`, or `None` when it has no such process.
async fn kill_in(
    home: &Home,
    desired: &Desired,
    target: &ExecTarget,
    jobs: &str,
    id: &str,
) -> anyhow::Result<Option<&'static str>> {
    let (code, out) = capture(
        home,
        desired,
        target,
        script_argv(background::KILL, &[jobs, id]),
    )
    .await?;
    match (i32::from(code), String::from_utf8_lossy(&out).trim_end()) {
        (0, "killed") => Ok(Some("killed")),
        (0, "not running") => Ok(Some("not running")),
        (background::NO_SUCH_PROCESS, _) => Ok(None),
        (code, _) => anyhow::bail!("the kill exited {code}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_listing_without_end_is_kept_to_its_first_bytes() {
        let kept = listing();
        let mut out = kept.writer();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            out.write_all(&chunk).await.unwrap();
        }
        assert_eq!(kept.lock().bytes().len(), MAX_LISTING);
    }

    #[test]
    fn sizes_read_for_a_person() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 + 200 * 1024), "3.2 MiB");
    }
}
