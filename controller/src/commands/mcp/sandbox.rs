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
    let args = exec_args(target, argv, timeout);
    run(target, args, capture, capture).await
}

/// Starts `command` (a command line) in the background as `hermes exec
/// --background` does, the same on every backend
/// ([`hermes_backends::background`]), in `cwd` when given: its exit code,
/// what it printed on stdout (the process's id) and on stderr.
pub async fn start(
    target: &Target,
    command: &str,
    cwd: Option<&str>,
    timeout: u64,
) -> Result<(u8, Vec<u8>, Vec<u8>), ExecError> {
    let mut args = exec_args(target, vec![command.to_string()], timeout);
    args.background = true;
    args.cwd = cwd.map(str::to_string);
    let (out, err) = (
        Shared::new(Captured::new(64, 0)),
        Shared::new(Captured::new(4096, 0)),
    );
    let code = run(target, args, &out, &err).await?;
    let (out, err) = (out.lock().bytes(), err.lock().bytes());
    Ok((code, out, err))
}

fn exec_args(target: &Target, command: Vec<String>, timeout: u64) -> ExecArgs {
    ExecArgs {
        task: target.task.clone(),
        timeout: Some(timeout),
        cwd: None,
        env: Vec::new(),
        session: target.session.clone(),
        background: false,
        tty: false,
        command,
    }
}

async fn run(target: &Target, args: ExecArgs, out: &Shared, err: &Shared) -> Result<u8, ExecError> {
    let mut out = out.writer();
    let mut err = err.writer();
    let streams = Streams {
        stdout: &mut out,
        stderr: &mut err,
        stdin: crate::commands::exec::Stdin::Empty,
    };
    match run_with(&target.home, &target.profile, args, streams).await {
        Ok(code) => Ok(code),
        Err(e) => Err(failed(target, &e)),
    }
}

/// An exec's error as the tools tell it, redacted.
pub fn failed(target: &Target, e: &anyhow::Error) -> ExecError {
    match e.downcast_ref::<FailClosed>() {
        Some(refused) => ExecError::Refused(redact(target, &refused.to_string())),
        None => ExecError::Failed(redact(target, &crate::chain::Chain(e).to_string())),
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
