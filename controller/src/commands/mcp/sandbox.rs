//! What the tools run in the sandbox: every one a plain exec through
//! `hermes exec`'s own path ([`crate::commands::exec::run_with`]), so it
//! works the same on every backend, and the small POSIX `sh` scripts they
//! run (no tool of hermes's is installed in the sandbox).
//!
//! Arguments go to the scripts as positional parameters, never spliced
//! into script text. What the scripts print comes from the sandbox and is
//! hostile: it is read through a bounded capture and parsed strictly.

use crate::cli::ExecArgs;
use crate::commands::exec::{FailClosed, Streams, run_with};
use crate::home::Home;

use super::capture::{Captured, Shared};

/// Where the tools run: the hermes home, profile, task and session (as
/// `hermes exec --task --session`).
#[derive(Debug, Clone)]
pub struct Target {
    pub home: Home,
    pub profile: String,
    pub task: String,
    pub session: Option<String>,
}

/// Why an exec did not run to its end.
#[derive(Debug)]
pub enum ExecError {
    /// Refused, failing closed: the egress proxy is not ready.
    Refused(String),
    /// Any other failure (no engine, a sandbox that cannot start, …).
    Failed(String),
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::Refused(why) => write!(f, "refused, failing closed: {why}"),
            ExecError::Failed(why) => write!(f, "{why}"),
        }
    }
}

/// Runs `argv` in the target's sandbox with its output (redacted) into
/// `capture`; returns the exit code (124 timed out).
pub async fn exec(
    target: &Target,
    argv: Vec<String>,
    timeout: u64,
    capture: &Shared,
) -> Result<u8, ExecError> {
    let args = ExecArgs {
        task: target.task.clone(),
        timeout: Some(timeout),
        cwd: None,
        env: Vec::new(),
        session: target.session.clone(),
        background: false,
        tty: false,
        command: argv,
    };
    let mut out = capture.writer();
    let mut err = capture.writer();
    let streams = Streams {
        stdout: &mut out,
        stderr: &mut err,
        stdin: crate::commands::exec::Stdin::Empty,
    };
    match run_with(&target.home, &target.profile, args, streams).await {
        Ok(code) => Ok(code),
        Err(e) => {
            let text = match e.downcast_ref::<FailClosed>() {
                Some(refused) => {
                    return Err(ExecError::Refused(redact(target, &refused.to_string())));
                }
                None => crate::chain::Chain(&e).to_string(),
            };
            Err(ExecError::Failed(redact(target, &text)))
        }
    }
}

/// Runs one of this module's scripts with `args`: its exit code and what
/// it printed (at most `limit` bytes from the start).
pub async fn script(
    target: &Target,
    script: &str,
    args: &[&str],
    timeout: u64,
    limit: usize,
) -> Result<(u8, Vec<u8>, bool), ExecError> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "hermes-mcp".to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let capture = Shared::new(Captured::new(limit, 0));
    let code = exec(target, argv, timeout, &capture).await?;
    let captured = capture.lock();
    Ok((code, captured.bytes(), captured.truncated()))
}

/// `text` with the secrets this home knows masked (an error message may
/// quote a command's words).
fn redact(target: &Target, text: &str) -> String {
    hermes_model::redact::Redactor::new(crate::redacting::known_secrets(&target.home))
        .redact_str(text)
        .into_owned()
}

/// Starts `/bin/sh`, which runs the rest in bash where the sandbox has it
/// (the shell an agent expects), else in itself: `$1` the script, then
/// its arguments.
pub const BOOT: &str = r#"w=$1; shift
if command -v bash >/dev/null 2>&1; then exec bash -c "$w" hermes-mcp "$@"; fi
eval "$w""#;

/// The terminal tool's command: `$1` the command line, `$2` the working
/// directory to start in (empty: the exec's default), `$3` the marker
/// before the directory it ended in, printed at its exit whatever the
/// command did, on a line of its own: newline, marker, directory and
/// newline go out in one write (one `%s`: bash's `printf` flushes a
/// line-buffered stdout at each newline of its format), so that the
/// command's stderr, which reaches the capture by another pipe, never
/// lands between the newline and the marker.
pub const TERMINAL: &str = r#"if [ -n "$2" ]; then
  cd -- "$2" 2>/dev/null || printf 'hermes: the working directory %s is gone; running in %s\n' "$2" "$PWD" >&2
fi
__hermes_c=$1; __hermes_m=$3
set --
trap 'printf %s "
$__hermes_m$PWD
"' EXIT
eval "$__hermes_c""#;

/// Starts a background command: `$1` the command line, `$2` the working
/// directory. Its output goes to a fresh directory (`mktemp -d`, 0700)
/// whose path is printed: `out` (stdout and stderr), `pid` (its process
/// group, a session of its own), `exit` (its exit code, once it ended).
pub const START: &str = r#"command -v setsid >/dev/null 2>&1 || { echo 'no setsid in the sandbox'; exit 90; }
d=$(mktemp -d "${TMPDIR:-/tmp}/hermes-bg.XXXXXXXXXX") || { echo 'cannot make a directory for the output'; exit 90; }
if [ -n "$2" ]; then cd -- "$2" 2>/dev/null || cd /; fi
s=sh; command -v bash >/dev/null 2>&1 && s=bash
setsid "$s" -c 'echo $$ > "$0/pid"; "$1" -c "$2" > "$0/out" 2>&1 < /dev/null; echo $? > "$0/exit.new"; mv -f "$0/exit.new" "$0/exit"' "$d" "$s" "$1" > /dev/null 2>&1 < /dev/null &
i=0; while [ ! -s "$d/pid" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
printf 'dir %s\n' "$d""#;

/// A background command's state and the tail of its output: `$1` its
/// directory, `$2` how many bytes of output. Prints `running`,
/// `exited CODE`, `ended` (killed: no exit code) or `gone`, then the size
/// of the output, then its last bytes.
pub const POLL: &str = r#"d=$1
[ -d "$d" ] || { echo gone; exit 0; }
p=$(head -c 16 "$d/pid" 2>/dev/null | tr -dc 0-9)
if [ -f "$d/exit" ]; then printf 'exited %s\n' "$(head -c 12 "$d/exit" | tr -dc 0-9)"
elif [ -n "$p" ] && kill -0 "-$p" 2>/dev/null; then echo running
else echo ended; fi
wc -c < "$d/out" 2>/dev/null || echo 0
tail -c "$2" "$d/out" 2>/dev/null"#;

/// Kills a background command's process group: `$1` its directory.
/// SIGTERM, then SIGKILL after up to 2 s. Prints `killed` or
/// `not running`.
pub const KILL: &str = r#"d=$1
p=$(head -c 16 "$d/pid" 2>/dev/null | tr -dc 0-9)
if [ -z "$p" ] || [ "$p" -le 1 ] || ! kill -TERM "-$p" 2>/dev/null; then echo 'not running'; exit 0; fi
i=0; while kill -0 "-$p" 2>/dev/null && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL "-$p" 2>/dev/null
echo killed"#;

/// Reads a text file: `$1` its path, `$2` the first line (1-based), `$3`
/// how many lines, `$4` how many bytes at most, `$5` the working
/// directory a relative path is from. Prints `missing`, `directory`,
/// `special` (not a regular file), `unreadable` or `binary`; else
/// `ok SIZE LINES` and the lines.
pub const READ: &str = r#"[ -z "$5" ] || cd -- "$5" 2>/dev/null
f=$1
if [ ! -e "$f" ]; then echo missing; exit 0; fi
if [ -d "$f" ]; then echo directory; exit 0; fi
if [ ! -f "$f" ]; then echo special; exit 0; fi
if [ ! -r "$f" ]; then echo unreadable; exit 0; fi
n=$(head -c 8192 "$f" | tr -dc '\000' | wc -c)
if [ "$n" -gt 0 ]; then echo binary; exit 0; fi
printf 'ok %s %s\n' "$(wc -c < "$f" | tr -dc 0-9)" "$(wc -l < "$f" | tr -dc 0-9)"
tail -n "+$2" "$f" | head -n "$3" | head -c "$4""#;

/// Writes a text file, in parts: `$1` its path, `$2` this part, `$3`
/// `first`, `more` or `last` (or `only`), `$4` the temporary file (from
/// the first part), `$5` the working directory a relative path is from.
/// The first part makes the parent directories and a temporary file
/// beside the target (`tmp PATH`); the last moves it into place
/// (`wrote`). Errors: `directory`, `nodir`, `notmp`.
pub const WRITE: &str = r#"[ -z "$5" ] || cd -- "$5" 2>/dev/null
f=$1; t=$4
case "$3" in first|only)
  case "$f" in */) echo directory; exit 0;; esac
  [ -d "$f" ] && { echo directory; exit 0; }
  dir=$(dirname -- "$f")
  mkdir -p -- "$dir" 2>/dev/null || { echo nodir; exit 0; }
  t=$(mktemp "$dir/.hermes-write.XXXXXXXXXX") || { echo notmp; exit 0; }
  chmod 644 "$t"
  printf '%s' "$2" > "$t" || { rm -f -- "$t"; echo nowrite; exit 0; }
  [ "$3" = only ] || { printf 'tmp %s\n' "$t"; exit 0; };;
*) printf '%s' "$2" >> "$t" || { rm -f -- "$t"; echo nowrite; exit 0; };;
esac
case "$3" in only|last) mv -f -- "$t" "$f" || { rm -f -- "$t"; echo nowrite; exit 0; }; echo wrote;; esac"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The marker line leaves bash in one write, its newline included:
    /// stderr, on another pipe, can then never split it from the marker
    /// (it did, with the newline flushed alone). Seen with strace, which
    /// `scripts/test` installs.
    #[test]
    fn the_marker_line_is_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace");
        let out = std::process::Command::new("strace")
            .args(["-f", "-e", "trace=write", "-o"])
            .arg(&trace)
            .args(["bash", "-c", TERMINAL, "hermes-mcp"])
            .args(["printf out; echo err >&2", "/", "@@M@@="])
            .output()
            .expect("strace (installed by scripts/test)");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n@@M@@=/\n");
        let trace = std::fs::read_to_string(&trace).unwrap();
        let writes: Vec<&str> = trace.lines().filter(|l| l.contains("write(1,")).collect();
        assert!(
            writes.iter().any(|w| w.contains(r#""\n@@M@@=/\n""#)),
            "{writes:#?}"
        );
    }
}
