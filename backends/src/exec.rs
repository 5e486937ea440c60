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
    /// reads end of input at once). Backends that cannot attach an input
    /// (Docker) give the command none.
    pub stdin: Option<&'a mut (dyn AsyncRead + Unpin + Send)>,
    pub stdout: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn AsyncWrite + Unpin + Send),
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
    use super::*;

    #[test]
    fn exec_ids_are_unique_hex() {
        let a = new_exec_id();
        let b = new_exec_id();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn the_kill_script_can_be_single_quoted() {
        assert!(!KILL_SCRIPT.contains('\''));
    }
}
