//! What every backend's exec shares: the request, the outcome, the
//! [`Executor`] trait the backends implement, and the marker and kill
//! script that let a timed-out command's whole process tree be found and
//! killed wherever it runs (inside a container, on a remote host).

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite};

/// The environment variable that marks every process of one exec.
pub const EXEC_ID_ENV: &str = "HERMES_EXEC_ID";

/// The exit code of a command that timed out, as `timeout(1)` reports it.
pub const TIMEOUT_EXIT_CODE: i64 = 124;

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The program and its arguments (no shell unless you give one).
    pub cmd: Vec<String>,
    /// Extra environment values, never passed on a command line.
    pub env: Vec<(String, String)>,
    /// The working directory; the backend's default when `None`.
    pub cwd: Option<String>,
    /// After this long the whole process tree is killed.
    pub timeout: Duration,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecOutcome {
    /// The command's exit code (128 + the signal when a signal ended it);
    /// [`TIMEOUT_EXIT_CODE`] when it timed out.
    pub exit_code: i64,
    pub timed_out: bool,
}

/// Where a command's input comes from and its output goes, as it flows.
pub struct ExecIo<'a> {
    /// What the command reads on its standard input; `None`: nothing (it
    /// reads end of input at once).
    pub stdin: Option<&'a mut (dyn AsyncRead + Unpin + Send)>,
    pub stdout: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn AsyncWrite + Unpin + Send),
}

/// A terminal's size, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtySize {
    pub rows: u16,
    pub cols: u16,
}

/// A command on a terminal of its own (`hermes exec -t`): what it reads
/// (the user's terminal, in raw mode), where its one output stream goes
/// (stdout and stderr are one on a terminal), and the user's terminal's
/// size as it changes.
pub struct TtyIo<'a> {
    pub stdin: &'a mut (dyn AsyncRead + Unpin + Send),
    pub output: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub size: tokio::sync::watch::Receiver<TtySize>,
}

impl std::fmt::Debug for TtyIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtyIo")
            .field("size", &*self.size.borrow())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ExecIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecIo")
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// A place commands run: a container, a remote host, a cloud sandbox.
///
/// The contract every backend keeps: output streams live, stdout and
/// stderr apart; the exit code is the command's; on timeout everything the
/// command started is killed where it runs and the outcome is `timed_out`
/// with [`TIMEOUT_EXIT_CODE`]; environment values never appear on a
/// command line.
pub trait Executor {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs `req`, streaming its output to `io` as it comes.
    fn exec(
        &self,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> impl Future<Output = Result<ExecOutcome, Self::Error>>;
}

/// How hermes runs every command, on every backend: the argv each
/// backend executes is [`terminal_argv`] of what the user gave, so the
/// contract below is written once.
///
/// - One argument is a shell command line, run by `bash` where the sandbox
///   has it, else `sh` (`hermes exec -- 'echo x > f'`).
/// - Several arguments are an argv, delivered intact, never re-split.
/// - A command that is not found exits 127 (the shell's own code).
/// - `--cwd DIR` is entered by the script, the same way everywhere: a
///   directory that does not exist (or may not be entered) is one line on
///   stderr and exit 126, as for a program that cannot run.
/// - The working directory carries over: the directory a command line
///   leaves (its shell's `$PWD` when it ends) is written to the task's
///   state file in the sandbox (`cwd_state`; written beside and renamed
///   into place, so a reader never sees half of it), and the next command of the
///   task starts there; the most recently finished command wins when
///   commands of one task run at once. An argv cannot change it (a
///   program's `cd` ends with it, as in a terminal); `--cwd` (a request
///   without a state file) sets the directory for one command and leaves
///   the carried one as it was.
/// - Where the sandbox says so (`HERMES_NPROC_RESERVE`: under a runtime
///   with a kernel of its own, whose processes are bounded by
///   `RLIMIT_NPROC`), the command's process limit is lowered by that many,
///   so that a command filling it leaves room for the exec that kills it.
/// - In the background, the command is started in a session of its own
///   (`setsid` where the sandbox has it), its input `/dev/null`, its
///   output and state in its directory ([`crate::background`]'s layout),
///   and the exec returns at once: exit 0 once started, 127 when the
///   program is not found, 126 when its directory cannot be made. "Started" means in its own session
///   already (the exec waits for the command's copy of its output pipe to
///   close, which it does only after `setsid`): a backend that ends the
///   exec's process group or session as soon as the exec returns (Daytona
///   deletes the session, the runner kills the group) cannot reach it.
pub const TERMINAL_SCRIPT: &str = r#"# hermes-exec
hermes_s=$1 hermes_f=$2 hermes_b=$3 hermes_w=$4
shift 4
if [ -n "${HERMES_NPROC_RESERVE:-}" ] && hermes_n=$(ulimit -u 2>/dev/null || ulimit -p 2>/dev/null) &&
	[ "$hermes_n" -gt $((HERMES_NPROC_RESERVE * 2)) ] 2>/dev/null; then
	ulimit -u $((hermes_n - HERMES_NPROC_RESERVE)) 2>/dev/null || ulimit -p $((hermes_n - HERMES_NPROC_RESERVE)) 2>/dev/null
fi
unset hermes_n
hermes_j= hermes_t=$*
case $hermes_b in bg=*) hermes_j=${hermes_b#bg=} hermes_b=bg ;; esac
if [ -n "$hermes_w" ]; then
	if [ ! -d "$hermes_w" ]; then
		printf 'hermes: --cwd %s: no such directory in the sandbox\n' "$hermes_w" >&2
		exit 126
	fi
	cd -- "$hermes_w" 2>/dev/null || {
		printf 'hermes: --cwd %s: permission denied\n' "$hermes_w" >&2
		exit 126
	}
fi
unset hermes_w
case $hermes_s in '' | /*) ;; *) hermes_s=$HOME/$hermes_s ;; esac
if [ -n "$hermes_s" ] && { IFS= read -r hermes_d <"$hermes_s"; } 2>/dev/null && [ -n "$hermes_d" ] && [ "$hermes_d" != "$PWD" ]; then
	cd -- "$hermes_d" 2>/dev/null || printf 'hermes: the last directory %s is gone; running in %s\n' "$hermes_d" "$PWD" >&2
fi
if [ "$hermes_f" = line ]; then
	if command -v bash >/dev/null 2>&1; then hermes_f=bash; else hermes_f=sh; fi
	if [ "$hermes_b" = bg ]; then
		set -- "$hermes_f" -c "$1"
	else
		set -- "$hermes_f" -c 'hermes_s=$1 hermes_c=$2; shift 2; if [ -n "$hermes_s" ]; then hermes_o=$PWD; trap '"'"'hermes_r=$?; [ "$PWD" = "$hermes_o" ] || { { { printf "%s\n" "$PWD" >"$hermes_s.$$"; } 2>/dev/null || { mkdir -p -- "${hermes_s%/*}" && printf "%s\n" "$PWD" >"$hermes_s.$$"; } 2>/dev/null; } && mv -f -- "$hermes_s.$$" "$hermes_s" 2>/dev/null; }; exit $hermes_r'"'"' EXIT; fi; eval "$hermes_c"' "$hermes_f" "$hermes_s" "$1"
		unset hermes_s hermes_f hermes_b hermes_d
		exec "$@"
	fi
fi
command -v "$1" >/dev/null 2>&1 || {
	printf 'hermes: %s: command not found\n' "$1" >&2
	exit 127
}
if [ "$hermes_b" = bg ]; then
	case $hermes_j in /*) ;; *) hermes_j=$HOME/$hermes_j ;; esac
	{ mkdir -p -- "${hermes_j%/*}" && chmod 700 -- "${hermes_j%/*}" && mkdir -m 700 -- "$hermes_j" &&
		printf '%s\n' "$hermes_t" >"$hermes_j/cmd" && { date +%s >"$hermes_j/started"; :; }; } 2>/dev/null || {
		printf 'hermes: cannot make %s for the background command\n' "$hermes_j" >&2
		exit 126
	}
	set -- "$hermes_j" "$@"
	unset hermes_s hermes_f hermes_b hermes_d hermes_j hermes_t
	hermes_r='# hermes-background
j=$1; shift; echo $$ >"$j/pid"; exec </dev/null >/dev/null 2>&1; "$@" >"$j/out" 2>&1; echo $? >"$j/exit.new"; mv -f "$j/exit.new" "$j/exit"'
	if command -v setsid >/dev/null 2>&1; then
		hermes_x=$(setsid /bin/sh -c "$hermes_r" sh "$@" &)
	else
		/bin/sh -c "$hermes_r" sh "$@" </dev/null >/dev/null 2>&1 &
	fi
	exit 0
fi
unset hermes_s hermes_f hermes_b hermes_d hermes_j hermes_t
exec "$@"
"#;

/// How a command starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start<'a> {
    /// The exec waits for it, its output streamed.
    Foreground,
    /// In a session of its own, its state and output in `job` (relative
    /// paths are from the home in the sandbox), a directory the script
    /// makes ([`crate::background`]); the exec returns once it started.
    Background { job: &'a str },
}

/// Whether `argv` ([`terminal_argv`]'s) starts its command in the
/// background.
pub fn is_background(argv: &[String]) -> bool {
    argv.get(2).is_some_and(|s| s == TERMINAL_SCRIPT)
        && argv.get(6).is_some_and(|s| s.starts_with("bg="))
}

/// The argv that runs `cmd` under [`TERMINAL_SCRIPT`]'s contract:
/// `/bin/sh -c SCRIPT sh STATE line|argv fg|bg=JOB CWD ARGS…`. `cwd_state`: the
/// file in the sandbox that carries the task's working directory (relative
/// paths are from the home there); `None` when `--cwd` set the directory
/// for this command. `cwd`: that directory (relative to where the backend
/// starts commands), entered by the script.
pub fn terminal_argv(
    cmd: &[String],
    cwd_state: Option<&str>,
    cwd: Option<&str>,
    start: Start<'_>,
) -> Vec<String> {
    let form = match cmd {
        [one] if !is_plain_program(one) => "line",
        _ => "argv",
    };
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        TERMINAL_SCRIPT.to_string(),
        "sh".to_string(),
        cwd_state.unwrap_or_default().to_string(),
        form.to_string(),
        match start {
            Start::Foreground => "fg".to_string(),
            Start::Background { job } => format!("bg={job}"),
        },
        cwd.unwrap_or_default().to_string(),
    ];
    argv.extend(cmd.iter().cloned());
    argv
}

/// Whether a one-argument command line is a program name alone (`true`,
/// `/bin/ls`, `node`): run as an argv it does the same, without starting a
/// shell for it. A shell builtin that has no program of its own (`cd`,
/// `exit`, `export`…) is a command line.
fn is_plain_program(word: &str) -> bool {
    const BUILTINS: &[&str] = &[
        ".",
        "alias",
        "bg",
        "bind",
        "builtin",
        "caller",
        "cd",
        "command",
        "compgen",
        "complete",
        "declare",
        "dirs",
        "disown",
        "enable",
        "eval",
        "exec",
        "exit",
        "export",
        "fc",
        "fg",
        "getopts",
        "hash",
        "help",
        "history",
        "jobs",
        "let",
        "local",
        "logout",
        "mapfile",
        "popd",
        "pushd",
        "read",
        "readarray",
        "readonly",
        "return",
        "set",
        "shift",
        "shopt",
        "source",
        "suspend",
        "times",
        "trap",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "wait",
    ];
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./+-".contains(&b))
        && !word.starts_with('-')
        && !BUILTINS.contains(&word)
}

/// A value as one line of the header a remote bootstrap script reads (SSH,
/// Modal): `r` and the value when it holds no line break; else `e` and the
/// value as `printf %b` reads it back, plain characters as they are and
/// every other byte as `\0NNN` (octal).
pub(crate) fn header_line(value: &str) -> String {
    if !value.contains(['\n', '\r']) {
        return format!("r{value}");
    }
    let mut out = String::with_capacity(value.len() * 2);
    out.push('e');
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || b"_./=:,@+-".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\0{b:03o}"));
        }
    }
    out
}

/// Stops (so nothing forks any more) every process whose environment holds
/// the marker `$1`, and every descendant of those (a child that cleared its
/// environment is still caught by its parent pid), round after round until
/// a round finds nothing new; then kills them all. POSIX sh and grep only,
/// and no single quote, so that it can be quoted for a remote shell.
pub(crate) const KILL_SCRIPT: &str = r#"id=$1
all=" "
round=0
while [ "$round" -lt 20 ]; do
  round=$((round + 1))
  new=" "
  grew=1
  while [ "$grew" = 1 ]; do
    grew=0
    for p in /proc/[0-9]*; do
      pid=${p#/proc/}
      case "$all$new" in *" $pid "*) continue ;; esac
      hit=0
      if read -r stat 2>/dev/null < "$p/stat"; then
        rest=${stat##*) }
        ppid=${rest#* }
        ppid=${ppid%% *}
        case "$all$new" in *" $ppid "*) hit=1 ;; esac
      fi
      if [ "$hit" = 0 ] && grep -qsz "^HERMES_EXEC_ID=$id\$" "$p/environ"; then
        hit=1
      fi
      if [ "$hit" = 1 ]; then
        new="$new$pid "
        grew=1
      fi
    done
  done
  [ "$new" = " " ] && break
  kill -STOP $new 2>/dev/null
  all="$all${new# }"
done
[ "$all" = " " ] || kill -KILL $all 2>/dev/null
exit 0
"#;

/// 128 bits of hex, unique per exec: hashed from per-process random keys,
/// a counter, the time and the pid.
pub(crate) fn new_exec_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for half in 0u8..2 {
        let mut h = RandomState::new().build_hasher();
        h.write_u8(half);
        h.write_u64(count);
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn exec_ids_are_unique_hex() {
        let a = new_exec_id();
        let b = new_exec_id();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    /// Runs `cmd` under the terminal contract with this host's `/bin/sh`,
    /// in `dir`: (exit code, stdout, stderr).
    fn terminal(
        cmd: &[&str],
        state: Option<&std::path::Path>,
        background: bool,
        dir: &std::path::Path,
        input: &str,
    ) -> (i32, String, String) {
        terminal_in(cmd, state, None, background, dir, input)
    }

    /// [`terminal`] with `--cwd`.
    fn terminal_in(
        cmd: &[&str],
        state: Option<&std::path::Path>,
        cwd: Option<&str>,
        background: bool,
        dir: &std::path::Path,
        input: &str,
    ) -> (i32, String, String) {
        use std::io::Write;
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let state = state.map(|p| p.display().to_string());
        let job = dir.join(".jobs").join(crate::background::new_id());
        let job = job.display().to_string();
        let start = match background {
            true => Start::Background { job: &job },
            false => Start::Foreground,
        };
        let argv = terminal_argv(&cmd, state.as_deref(), cwd, start);
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn cwd_is_entered_and_a_missing_one_is_126_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        std::fs::create_dir(at.join("sub")).unwrap();
        let entered = terminal_in(&["pwd"], None, Some("sub"), false, at, "");
        assert_eq!(
            entered,
            (0, format!("{}/sub\n", at.display()), String::new())
        );
        for background in [false, true] {
            let missing = terminal_in(&["pwd"], None, Some("gone/x"), background, at, "");
            assert_eq!(
                missing,
                (
                    126,
                    String::new(),
                    "hermes: --cwd gone/x: no such directory in the sandbox\n".to_string()
                ),
                "background: {background}"
            );
        }
        // A file is no directory either.
        std::fs::write(at.join("file"), "").unwrap();
        assert_eq!(
            terminal_in(&["pwd"], None, Some("file"), false, at, "").0,
            126
        );
    }

    #[test]
    fn one_argument_is_a_command_line_several_an_argv_kept_intact() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        let line = terminal(&["echo a  b > f; cat f | tr a x"], None, false, at, "");
        assert_eq!(line, (0, "x b\n".to_string(), String::new()));
        let argv = terminal(
            &[
                "sh",
                "-c",
                "printf '<%s>' \"$@\"",
                "-",
                "a  b",
                "$HOME",
                "*",
            ],
            None,
            false,
            at,
            "",
        );
        assert_eq!(argv, (0, "<a  b><$HOME><*>".to_string(), String::new()));
        // A program name alone runs as an argv; a builtin as a line.
        assert_eq!(terminal(&["pwd"], None, false, at, "").0, 0);
        assert!(!is_plain_program("cd"));
        assert!(is_plain_program("/usr/bin/env"));
        assert!(!is_plain_program("ls -l"));
        // Standard input reaches the command either way.
        assert_eq!(terminal(&["cat"], None, false, at, "in").1, "in");
        assert_eq!(terminal(&["tr a b"], None, false, at, "aa").1, "bb");
        // The exit code is the command's; one not found is 127.
        assert_eq!(terminal(&["exit 7"], None, false, at, "").0, 7);
        let missing = terminal(&["no-such-program-x", "a"], None, false, at, "");
        assert_eq!(missing.0, 127, "{missing:?}");
        assert!(missing.2.contains("no-such-program-x"), "{missing:?}");
        assert_eq!(terminal(&["no-such-program-x"], None, false, at, "").0, 127);
        assert_eq!(
            terminal(&["no-such-program-x; true"], None, false, at, "").0,
            0
        );
    }

    #[test]
    fn the_directory_a_command_line_leaves_is_where_the_next_starts() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        let state = at.join("state").join("cwd");
        let sub = at.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let go = format!("cd {}", sub.display());
        assert_eq!(terminal(&[&go], Some(&state), false, at, "").0, 0);
        let here = terminal(&["pwd"], Some(&state), false, at, "");
        assert_eq!(here.1.trim(), sub.display().to_string());
        // An `exit` still records; an argv cannot move it.
        let back = format!("cd {}; exit 3", at.display());
        assert_eq!(terminal(&[&back], Some(&state), false, at, "").0, 3);
        assert_eq!(
            terminal(&["sh", "-c", "cd /; pwd"], Some(&state), false, at, "").1,
            "/\n"
        );
        let here = terminal(&["pwd"], Some(&state), false, &sub, "");
        assert_eq!(here.1.trim(), at.display().to_string());
        // Without a state file (`--cwd`) nothing is read or recorded.
        assert_eq!(terminal(&["cd /"], None, false, at, "").0, 0);
        let here = terminal(&["pwd"], Some(&state), false, &sub, "");
        assert_eq!(here.1.trim(), at.display().to_string());
        // A directory that is gone: the command runs where it is, and says so.
        std::fs::write(&state, format!("{}/gone\n", at.display())).unwrap();
        let gone = terminal(&["pwd"], Some(&state), false, &sub, "");
        assert_eq!(gone.1.trim(), sub.display().to_string());
        assert!(gone.2.contains("is gone"), "{gone:?}");
    }

    #[test]
    fn a_background_command_starts_and_the_exec_returns() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        // The command waits for the test's go (a minute at most): the exec
        // returns while it waits.
        let line = "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; \
                    i=$((i + 1)); done; echo done > marker";
        let bg = terminal(&[line], None, true, at, "");
        assert_eq!(bg, (0, String::new(), String::new()));
        assert!(
            !at.join("marker").exists(),
            "the exec returned after its command"
        );
        std::fs::write(at.join("go"), "").unwrap();
        // The shell makes the file before it writes to it: wait for the
        // content, not for the file.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let read = || std::fs::read_to_string(at.join("marker")).unwrap_or_default();
        while read() != "done\n" && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(read(), "done\n");
        assert_eq!(
            terminal(&["no-such-program-x", "a"], None, true, at, "").0,
            127
        );
    }

    /// The exec's process group killed the moment the exec returns (as
    /// a Daytona session's deletion does): the background command lives
    /// on, every time.
    #[test]
    fn a_background_command_outlives_the_execs_process_group() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let marker = dir.path().join(format!("marker-{round}"));
            let line = format!("sleep 0.3; echo done > {}", marker.display());
            let job = dir
                .path()
                .join(format!("job-{round}"))
                .display()
                .to_string();
            let argv = terminal_argv(&[line], None, None, Start::Background { job: &job });
            let status = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .process_group(0)
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let pgid = nix::unistd::Pid::from_raw(status.id() as i32);
            let out = status.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while !marker.exists() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                marker.exists(),
                "round {round}: the background command was killed"
            );
        }
    }

    #[test]
    fn the_kill_script_can_be_single_quoted() {
        assert!(!KILL_SCRIPT.contains('\''));
    }
}
