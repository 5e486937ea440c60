//! Background processes of `hermes exec --background`, the same on every
//! backend: where they keep their state in the sandbox, and the scripts
//! `hermes process list|logs|kill` run there (through the backend's
//! ordinary exec) to read and stop them.
//!
//! [`crate::exec::TERMINAL_SCRIPT`] starts one: in a directory of the
//! task's jobs directory named by its id ([`new_id`]), 0700, it writes
//! `cmd` (the command line, for a listing), `started` (Unix seconds),
//! `pid` (its process group: a session of its own, where the sandbox has
//! `setsid`), `out` (stdout and stderr together) and, once it ended by
//! itself, `exit` (its code; written beside and renamed into place).
//!
//! Whatever these scripts print comes from the sandbox and is hostile:
//! [`parse_list`] takes only fields of the expected shape, bounded, and
//! an id a user gives is checked ([`check_id`]) before it names anything.

/// How the process that waits for a background command and records its
/// exit code shows in a process listing (`/bin/sh -c` of a script that
/// starts with this line): hermes's own, not counted as the sandbox's
/// work (the command it waits for is).
const WAITER_PREFIX: &str = "/bin/sh -c # hermes-background";

/// Whether a process listing's command line is a background command's
/// waiter ([`WAITER_PREFIX`]).
pub fn is_waiter_process(cmd: &str) -> bool {
    cmd.starts_with(WAITER_PREFIX)
}

/// How many processes a listing reads at most.
pub const MAX_LISTED: usize = 256;

/// How many bytes of a process's command line a listing shows.
pub const MAX_COMMAND: usize = 300;

/// A new process id: 8 lowercase hexadecimal digits.
pub fn new_id() -> String {
    let mut id = crate::exec::new_exec_id();
    id.truncate(8);
    id
}

/// Why an id given on the command line names no process.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a process id (8 hexadecimal digits, as `hermes exec --background` prints)")]
pub struct BadId(pub String);

/// `id` when it has the shape [`new_id`] gives, else why not.
pub fn check_id(id: &str) -> Result<&str, BadId> {
    if id.len() == 8
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(id)
    } else {
        Err(BadId(id.to_string()))
    }
}

/// Lists the processes of a jobs directory: `$1` that directory (relative
/// paths are from the home). One line per process, tab-separated: id,
/// state (`running`, `exited CODE` or `killed`: ended without an exit
/// code, by a signal or with its sandbox), process group, start time,
/// size of the output, command line.
///
/// In these scripts a process lives while `kill -0` reaches it and it is
/// no zombie: a process group leader whose parent never reaps it (a PID 1
/// that reaps nothing) is dead all the same.
pub const LIST: &str = r#"live() { kill -0 "$1" 2>/dev/null || return 1; z=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null); case $z in Z*) return 1 ;; esac; }
j=$1
case $j in /*) ;; *) j=$HOME/$j ;; esac
[ -d "$j" ] || exit 0
n=0
for d in "$j"/*; do
	[ -d "$d" ] && [ ! -L "$d" ] || continue
	n=$((n + 1))
	[ "$n" -le 256 ] || break
	p=$(head -c 16 "$d/pid" 2>/dev/null | tr -dc 0-9)
	if [ -f "$d/exit" ]; then s="exited $(head -c 12 "$d/exit" | tr -dc 0-9)"
	elif [ -n "$p" ] && live "$p"; then s=running
	else s=killed; fi
	t=$(head -c 16 "$d/started" 2>/dev/null | tr -dc 0-9)
	z=$(wc -c <"$d/out" 2>/dev/null | tr -dc 0-9)
	c=$(head -c 300 "$d/cmd" 2>/dev/null | tr '\n\t\r' '   ')
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${d##*/}" "$s" "$p" "$t" "${z:-0}" "$c"
done
"#;

/// Prints a process's output: `$1` the jobs directory, `$2` the id, `$3`
/// the last lines only (empty: all), `$4` `follow` to keep printing what
/// it writes until it ends, `$5` the last bytes only (empty: as `$3`
/// says). Exits 3 when there is no such process; at its end prints, on
/// stderr, `hermes-process-bytes: SIZE` (the whole output's size) and
/// `hermes-process: STATE`.
pub const LOGS: &str = r#"live() { kill -0 "$1" 2>/dev/null || return 1; z=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null); case $z in Z*) return 1 ;; esac; }
j=$1
case $j in /*) ;; *) j=$HOME/$j ;; esac
d=$j/$2
[ -d "$d" ] && [ ! -L "$d" ] || exit 3
size() { wc -c <"$d/out" 2>/dev/null | tr -dc 0-9; }
z=$(size); z=${z:-0}
if [ -n "$5" ]; then head -c "$z" "$d/out" 2>/dev/null | tail -c "$5"
elif [ -n "$3" ]; then head -c "$z" "$d/out" 2>/dev/null | tail -n "$3"
else head -c "$z" "$d/out" 2>/dev/null; fi
o=$z
p=$(head -c 16 "$d/pid" 2>/dev/null | tr -dc 0-9)
alive() { [ ! -f "$d/exit" ] && [ -n "$p" ] && live "$p"; }
if [ "$4" = follow ]; then
	while alive; do
		sleep 0.2
		z=$(size); z=${z:-0}
		if [ "$z" -gt "$o" ]; then tail -c "+$((o + 1))" "$d/out" | head -c "$((z - o))"; o=$z; fi
	done
	z=$(size); z=${z:-0}
	if [ "$z" -gt "$o" ]; then tail -c "+$((o + 1))" "$d/out" | head -c "$((z - o))"; fi
fi
if [ -f "$d/exit" ]; then s="exited $(head -c 12 "$d/exit" | tr -dc 0-9)"
elif alive; then s=running
else s=killed; fi
printf 'hermes-process-bytes: %s\nhermes-process: %s\n' "$z" "$s" >&2
"#;

/// Stops a process and everything it started: `$1` the jobs directory,
/// `$2` the id. SIGTERM to its process group (or the process alone where
/// it has none), SIGKILL after up to 2 s. Prints `killed` or `not
/// running`; exits 3 when there is no such process.
pub const KILL: &str = r#"live() { kill -0 "$1" 2>/dev/null || return 1; z=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null); case $z in Z*) return 1 ;; esac; }
j=$1
case $j in /*) ;; *) j=$HOME/$j ;; esac
d=$j/$2
[ -d "$d" ] && [ ! -L "$d" ] || exit 3
p=$(head -c 16 "$d/pid" 2>/dev/null | tr -dc 0-9)
if [ -f "$d/exit" ] || [ -z "$p" ] || [ "$p" -le 1 ] || ! live "$p"; then echo 'not running'; exit 0; fi
if kill -TERM "-$p" 2>/dev/null; then g="-$p"
elif kill -TERM "$p" 2>/dev/null; then g=$p
else echo 'not running'; exit 0; fi
i=0
while live "$p" && [ "$i" -lt 20 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$g" 2>/dev/null
echo killed
"#;

/// The exit code of [`LOGS`] and [`KILL`] for an id with no process.
pub const NO_SUCH_PROCESS: i32 = 3;

/// A process's state, as a listing reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// Ended by itself, with this exit code.
    Exited(u8),
    /// Ended without an exit code: by a signal, or with its sandbox.
    Killed,
}

impl State {
    /// `running`, `exited` or `killed`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Exited(_) => "exited",
            State::Killed => "killed",
        }
    }

    /// Its exit code, once it exited by itself.
    pub fn exit_code(self) -> Option<u8> {
        match self {
            State::Exited(code) => Some(code),
            _ => None,
        }
    }

    /// What [`LIST`] and [`LOGS`] print: `running`, `exited CODE`,
    /// `killed`.
    pub fn parse(text: &str) -> Option<State> {
        match text {
            "running" => Some(State::Running),
            "killed" => Some(State::Killed),
            _ => text
                .strip_prefix("exited ")
                .and_then(|code| code.parse().ok())
                .map(State::Exited),
        }
    }
}

/// One background process a listing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: String,
    pub state: State,
    /// Its process group (or process), as it wrote it.
    pub pid: Option<u32>,
    /// When it started, in Unix seconds.
    pub started: Option<i64>,
    /// How many bytes of output it wrote.
    pub output_bytes: u64,
    /// Its command line, control characters replaced.
    pub command: String,
}

/// The processes of [`LIST`]'s output, sorted by start time: a line of
/// another shape, or an id that [`check_id`] refuses, is left out.
pub fn parse_list(text: &str) -> Vec<Job> {
    let mut jobs: Vec<Job> = text
        .lines()
        .take(MAX_LISTED)
        .filter_map(|line| {
            let mut fields = line.splitn(6, '\t');
            let id = check_id(fields.next()?).ok()?.to_string();
            let state = State::parse(fields.next()?)?;
            let pid = fields.next()?.parse().ok();
            let started = fields.next()?.parse().ok();
            let output_bytes = fields.next()?.parse().ok()?;
            let command: String = fields
                .next()
                .unwrap_or_default()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .take(MAX_COMMAND)
                .collect();
            Some(Job {
                id,
                state,
                pid,
                started,
                output_bytes,
                command: command.trim_end().to_string(),
            })
        })
        .collect();
    jobs.sort_by(|a, b| (a.started, &a.id).cmp(&(b.started, &b.id)));
    jobs
}

/// The argv that runs `script` with `args` under `/bin/sh`.
pub fn script_argv(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "sh".to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::exec::{Start, terminal_argv};
    use std::time::{Duration, Instant};

    /// Runs `argv` here: (exit code, stdout, stderr).
    fn run(argv: &[String], dir: &std::path::Path) -> (i32, String, String) {
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            .env("HOME", dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn start(line: &str, jobs: &str, dir: &std::path::Path) -> String {
        let id = new_id();
        let job = format!("{jobs}/{id}");
        let argv = terminal_argv(
            &[line.to_string()],
            None,
            None,
            Start::Background { job: &job },
        );
        assert_eq!(run(&argv, dir), (0, String::new(), String::new()));
        id
    }

    fn list(jobs: &str, dir: &std::path::Path) -> Vec<Job> {
        let (code, out, err) = run(&script_argv(LIST, &[jobs]), dir);
        assert_eq!((code, err.as_str()), (0, ""), "{out}");
        parse_list(&out)
    }

    /// Waits, boundedly, until the listing says `want` of `id`.
    fn until_state(jobs: &str, dir: &std::path::Path, id: &str, want: State) -> Job {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let found = list(jobs, dir).into_iter().find(|j| j.id == id);
            match found {
                Some(job) if job.state == want => return job,
                other if Instant::now() > until => panic!("{id}: {other:?}, not {want:?}"),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    #[test]
    fn the_waiter_of_a_started_process_is_known_by_its_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        let id = start("sleep 30", "jobs", at);
        let job = until_state("jobs", at, &id, State::Running);
        let pid = job.pid.unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        // As `ps` shows it: arguments joined by spaces, a newline as `?`.
        let shown: String = String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .replace('\n', "?");
        assert!(is_waiter_process(&shown), "{shown}");
        assert!(!is_waiter_process("/bin/sh -c sleep 30"));
        run(&script_argv(KILL, &["jobs", &id]), at);
    }

    #[test]
    fn ids_are_eight_hex_digits_and_nothing_else_is_one() {
        let id = new_id();
        assert_eq!(check_id(&id), Ok(id.as_str()));
        for bad in [
            "",
            "abc",
            "ABCDEF12",
            "../../x",
            "0123456g",
            "012345678",
            "0123 567",
        ] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_started_process_is_listed_read_and_its_exit_code_kept() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        // Relative to the home, as the Docker and cloud jobs directories.
        let id = start("echo one; echo two >&2; exit 7", ".jobs", at);
        let job = until_state(".jobs", at, &id, State::Exited(7));
        assert_eq!(job.command, "echo one; echo two >&2; exit 7");
        assert_eq!(job.output_bytes, 8);
        assert!(job.started.is_some() && job.pid.is_some(), "{job:?}");
        let (code, out, err) = run(&script_argv(LOGS, &[".jobs", &id, "", ""]), at);
        assert_eq!((code, out.as_str()), (0, "one\ntwo\n"));
        assert_eq!(err, "hermes-process-bytes: 8\nhermes-process: exited 7\n");
        let (_, last, _) = run(&script_argv(LOGS, &[".jobs", &id, "1", ""]), at);
        assert_eq!(last, "two\n");
        let (_, bytes, err) = run(&script_argv(LOGS, &[".jobs", &id, "", "", "3"]), at);
        assert_eq!(bytes, "wo\n");
        assert!(err.starts_with("hermes-process-bytes: 8\n"), "{err}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(at.join(".jobs").join(&id))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn kill_ends_the_process_and_everything_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        let jobs = at.join("jobs").display().to_string();
        // A child that ignores nothing and a grandchild in the background.
        let id = start("sleep 300 & echo $! > child; sleep 300", &jobs, at);
        until_state(&jobs, at, &id, State::Running);
        let (code, out, _) = run(&script_argv(KILL, &[&jobs, &id]), at);
        assert_eq!((code, out.as_str()), (0, "killed\n"));
        until_state(&jobs, at, &id, State::Killed);
        let until = Instant::now() + Duration::from_secs(10);
        let child: i32 = loop {
            if let Ok(pid) = std::fs::read_to_string(at.join("child"))
                && let Ok(pid) = pid.trim().parse()
            {
                break pid;
            }
            assert!(Instant::now() < until, "no child pid written");
            std::thread::sleep(Duration::from_millis(20));
        };
        let gone = || nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_err();
        let until = Instant::now() + Duration::from_secs(10);
        while !gone() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "the background command's child outlived the kill");
        let (_, again, _) = run(&script_argv(KILL, &[&jobs, &id]), at);
        assert_eq!(again, "not running\n");
        let none = run(&script_argv(KILL, &[&jobs, "00000000"]), at);
        assert_eq!(none.0, NO_SUCH_PROCESS);
    }

    #[test]
    fn follow_prints_what_is_written_until_the_process_ends() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        let id = start(
            "echo a; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo b",
            "jobs",
            at,
        );
        let argv = script_argv(LOGS, &["jobs", &id, "", "follow"]);
        let follower = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(at)
            .env("HOME", at)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::fs::write(at.join("go"), "").unwrap();
        let out = follower.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nb\n");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "hermes-process-bytes: 4\nhermes-process: exited 0\n"
        );
    }

    #[test]
    fn a_listing_from_a_hostile_sandbox_keeps_only_well_formed_lines() {
        let text = "0123abcd\trunning\t42\t1700000000\t12\tsleep 9\n\
                    ../../../x\trunning\t1\t1\t1\tevil\n\
                    0123abce\tpwned\t1\t1\t1\tx\n\
                    0123abcf\texited 300\t1\t1\t1\tx\n\
                    0123abc0\tkilled\t\t\tnope\tx\n\
                    0123abc1\tkilled\t\t\t0\t\x1b[31mred\x07\n";
        let jobs = parse_list(text);
        let ids: Vec<_> = jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, ["0123abc1", "0123abcd"]);
        assert_eq!(jobs[0].command, " [31mred");
        assert_eq!(jobs[0].pid, None);
    }

    #[test]
    fn a_symlink_in_the_jobs_directory_is_no_process() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        std::fs::create_dir_all(at.join("jobs")).unwrap();
        std::fs::create_dir_all(at.join("elsewhere")).unwrap();
        std::fs::write(at.join("elsewhere/cmd"), "x").unwrap();
        std::os::unix::fs::symlink(at.join("elsewhere"), at.join("jobs/0123abcd")).unwrap();
        assert_eq!(list("jobs", at), []);
        let (code, _, _) = run(&script_argv(LOGS, &["jobs", "0123abcd", "", ""]), at);
        assert_eq!(code, NO_SUCH_PROCESS);
    }
}
