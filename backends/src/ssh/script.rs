//! What runs on the remote host, and how a command gets there without its
//! environment ever being on a command line.
//!
//! sshd runs the command string of an exec request through the user's
//! login shell, and that string shows in `ps` on the remote; environment
//! requests are refused unless sshd's `AcceptEnv` allows the name. So the
//! command string is always the same small bootstrap (no value in it), and
//! the bootstrap reads a header from the channel's standard input: the
//! environment, the working directory and the arguments, one value a line:
//! as it is (`r…`) when it holds no line break, else escaped for
//! `printf %b` (`e…`). The shell's `read` takes a pipe one byte at a time,
//! so the rest of the input is left, untouched, for the command. A warm
//! exec forks nothing before the command: plain values are read with
//! builtins only, and the workspace is made only when it is missing.

use super::RemoteExec;
use hermes_model::config::is_env_name;

use crate::exec::{EXEC_ID_ENV, ExecRequest, KILL_SCRIPT, header_line};

/// The first line of every header.
const VERSION: &str = "hermes-exec-2";

/// The bootstrap. POSIX sh (dash, bash); no single quote, so it can be
/// quoted for whatever the login shell is. Exit 125 when the header is
/// broken or the directory cannot be made or entered.
const BOOTSTRAP: &str = r#"_h_d() { case $1 in r*) _h_v=${1#r} ;; *) _h_v=$(printf "%bx" "${1#e}"); _h_v=${_h_v%x} ;; esac; }
IFS= read -r _h_e || exit 125
[ "$_h_e" = "hermes-exec-2" ] || { echo "hermes: unexpected exec header" >&2; exit 125; }
IFS= read -r _h_n || exit 125
while [ "$_h_n" -gt 0 ]; do
  IFS= read -r _h_k || exit 125
  IFS= read -r _h_e || exit 125
  _h_d "$_h_e"
  case $_h_k in "~"*) _h_k=${_h_k#"~"}; _h_v=$HOME/$_h_v ;; esac
  export "$_h_k=$_h_v"
  _h_n=$((_h_n - 1))
done
IFS= read -r _h_n || exit 125
while [ "$_h_n" -gt 0 ]; do
  IFS= read -r _h_e || exit 125
  _h_d "$_h_e"; _h_p=$_h_v
  IFS= read -r _h_e || exit 125
  _h_d "$_h_e"
  if ! { [ -f "$_h_p" ] && [ "$(cat -- "$_h_p"; echo x)" = "${_h_v}x" ]; }; then
    case $_h_p in */*) mkdir -p -- "${_h_p%/*}" || exit 125 ;; esac
    printf %s "$_h_v" > "$_h_p.$$" && mv -f -- "$_h_p.$$" "$_h_p" || exit 125
  fi
  _h_n=$((_h_n - 1))
done
IFS= read -r _h_mk || exit 125
IFS= read -r _h_e || exit 125
_h_d "$_h_e"; _h_cwd=$_h_v
IFS= read -r _h_n || exit 125
set --
while [ "$_h_n" -gt 0 ]; do
  IFS= read -r _h_e || exit 125
  _h_d "$_h_e"
  set -- "$@" "$_h_v"
  _h_n=$((_h_n - 1))
done
if [ "$_h_mk" = 1 ] && [ ! -d "$_h_cwd" ]; then mkdir -p -- "$_h_cwd" || exit 125; fi
cd -- "$_h_cwd" || exit 125
unset _h_e _h_n _h_k _h_v _h_p _h_mk _h_cwd
unset -f _h_d
exec "$@"
"#;

/// The exec request's command string: the login shell hands over to
/// `/bin/sh` running the bootstrap.
pub(crate) fn exec_command() -> String {
    format!("exec /bin/sh -c '{BOOTSTRAP}' hermes-exec")
}

/// The command string that kills every process marked `marker` and their
/// descendants.
pub(crate) fn kill_command(marker: &str) -> String {
    // The marker is hex: nothing to quote.
    let marker: String = marker.chars().filter(char::is_ascii_hexdigit).collect();
    format!("exec /bin/sh -c '{KILL_SCRIPT}' hermes-kill {marker}")
}

/// Why a request cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest(pub String);

/// The header the bootstrap reads: the environment (with the marker and
/// the home-relative values of `remote`), the files to write, the
/// directory (`remote.default_cwd`, made if missing, when the request
/// names none) and the arguments.
pub(crate) fn header(
    req: &ExecRequest,
    marker: &str,
    remote: &RemoteExec,
) -> Result<Vec<u8>, BadRequest> {
    if req.cmd.is_empty() {
        return Err(BadRequest("no command given".to_string()));
    }
    let mut out = String::new();
    out.push_str(VERSION);
    out.push('\n');
    // Later values win: the request's, then the home-relative ones, then
    // the marker.
    let home_relative = |name: &str| remote.home_env.iter().any(|(k, _)| k == name);
    let env: Vec<(&str, &str, bool)> = req
        .env
        .iter()
        .filter(|(k, _)| k != EXEC_ID_ENV && !home_relative(k))
        .map(|(k, v)| (k.as_str(), v.as_str(), false))
        .chain(
            remote
                .home_env
                .iter()
                .filter(|(k, _)| k != EXEC_ID_ENV)
                .map(|(k, v)| (k.as_str(), v.as_str(), true)),
        )
        .chain([(EXEC_ID_ENV, marker, false)])
        .collect();
    out.push_str(&format!("{}\n", env.len()));
    for (name, value, relative) in env {
        if !is_env_name(name) {
            return Err(BadRequest(format!(
                "{name:?} is not an environment variable name"
            )));
        }
        if value.contains('\0') {
            return Err(BadRequest(format!("the value of {name} holds a NUL byte")));
        }
        if relative {
            out.push('~');
        }
        out.push_str(name);
        out.push('\n');
        out.push_str(&header_line(value));
        out.push('\n');
    }
    out.push_str(&format!("{}\n", remote.files.len()));
    for file in &remote.files {
        if file.path.is_empty() || file.path.contains('\0') || file.content.contains('\0') {
            return Err(BadRequest(format!(
                "the file {:?} cannot be written",
                file.path
            )));
        }
        out.push_str(&header_line(&file.path));
        out.push('\n');
        out.push_str(&header_line(&file.content));
        out.push('\n');
    }
    let (make, cwd) = match &req.cwd {
        Some(cwd) => ("0", cwd.as_str()),
        None => ("1", remote.default_cwd.as_str()),
    };
    out.push_str(make);
    out.push('\n');
    out.push_str(&header_line(cwd));
    out.push('\n');
    out.push_str(&format!("{}\n", req.cmd.len()));
    for arg in &req.cmd {
        if arg.contains('\0') {
            return Err(BadRequest("an argument holds a NUL byte".to_string()));
        }
        out.push_str(&header_line(arg));
        out.push('\n');
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;
    use crate::ssh::RemoteFile;

    fn request(cmd: &[&str], env: &[(&str, &str)], cwd: Option<&str>) -> ExecRequest {
        ExecRequest {
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: cwd.map(str::to_string),
            timeout: Duration::from_secs(5),
        }
    }

    /// Runs the command string through a local `sh -c`, as a login shell
    /// would, feeding it the header and then `input`.
    fn remote(default_cwd: &str) -> RemoteExec {
        RemoteExec {
            default_cwd: default_cwd.to_string(),
            ..RemoteExec::default()
        }
    }

    fn run_locally(req: &ExecRequest, default_cwd: &str, input: &[u8]) -> (i32, String) {
        run_with(req, &remote(default_cwd), input)
    }

    fn run_with(req: &ExecRequest, remote: &RemoteExec, input: &[u8]) -> (i32, String) {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(exec_command())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(&header(req, "00ff", remote).unwrap())
            .unwrap();
        stdin.write_all(input).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
        )
    }

    #[test]
    fn values_arrive_byte_for_byte_and_the_rest_of_the_input_is_the_commands() {
        let dir = tempfile::tempdir().unwrap();
        let nasty = "a b\n'\"$(x)`y`\\0101 % \u{e9}\t\n\n";
        // No line break: sent as it is.
        let raw = " r\\0101 '\"$(x)`y`\\ %s \u{e9}\t ";
        let req = request(
            &[
                "sh",
                "-c",
                "printf '%s|%s|%s|%s|' \"$V\" \"$RAW\" \"$1\" \"$HERMES_EXEC_ID\"; pwd; cat",
                "arg0",
                nasty,
            ],
            &[("V", nasty), ("RAW", raw), ("EMPTY", "")],
            Some(dir.path().to_str().unwrap()),
        );
        let (code, out) = run_locally(&req, "unused", b"the input\nstays\n");
        assert_eq!(code, 0);
        assert_eq!(
            out,
            format!(
                "{nasty}|{raw}|{nasty}|00ff|{}\nthe input\nstays\n",
                dir.path().canonicalize().unwrap().display()
            )
        );
    }

    #[test]
    fn the_default_directory_is_made_and_a_given_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("a/b/workspace");
        let req = request(&["pwd"], &[], None);
        let (code, out) = run_locally(&req, made.to_str().unwrap(), b"");
        assert_eq!(code, 0);
        assert!(made.is_dir());
        assert_eq!(
            out.trim_end(),
            made.canonicalize().unwrap().to_str().unwrap()
        );

        let missing = dir.path().join("missing");
        let req = request(&["pwd"], &[], Some(missing.to_str().unwrap()));
        let (code, _) = run_locally(&req, "unused", b"");
        assert_eq!(code, 125);
        assert!(!missing.exists());
    }

    #[test]
    fn the_command_string_holds_no_value() {
        let req = request(
            &["echo", "s3cret-arg"],
            &[("K", "s3cret-env")],
            Some("/s3cret-dir"),
        );
        let command = exec_command();
        let head = String::from_utf8(header(&req, "00ff", &remote("w")).unwrap()).unwrap();
        assert!(head.contains("s3cret-env"));
        for secret in ["s3cret-arg", "s3cret-env", "s3cret-dir"] {
            assert!(!command.contains(secret));
        }
        assert!(!BOOTSTRAP.contains('\''));
    }

    #[test]
    fn home_relative_values_are_made_absolute_and_files_are_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let content = "-----BEGIN CERTIFICATE-----\nMIIB+/=\n-----END CERTIFICATE-----\n";
        let remote = RemoteExec {
            default_cwd: "w".into(),
            home_env: vec![("CA".into(), "d/ca.crt".into())],
            files: vec![RemoteFile {
                path: "d/ca.crt".into(),
                content: content.into(),
            }],
            ..RemoteExec::default()
        };
        let req = request(
            &["sh", "-c", "printf '%s\\n' \"$CA\"; cat \"$CA\""],
            &[("CA", "overridden")],
            None,
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(exec_command())
            .env("HOME", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&header(&req, "00ff", &remote).unwrap())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let ca = dir.path().join("d/ca.crt");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{}\n{content}", ca.display())
        );
        // The same content again leaves the file alone.
        let before = std::fs::metadata(&ca).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut again = Command::new("sh")
            .arg("-c")
            .arg(exec_command())
            .env("HOME", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        again
            .stdin
            .take()
            .unwrap()
            .write_all(&header(&request(&["true"], &[], None), "00ff", &remote).unwrap())
            .unwrap();
        assert!(again.wait().unwrap().success());
        assert_eq!(std::fs::metadata(&ca).unwrap().modified().unwrap(), before);
    }

    #[test]
    fn bad_names_and_nul_bytes_are_refused() {
        assert!(header(&request(&["x"], &[("1A", "v")], None), "0", &remote("w")).is_err());
        assert!(header(&request(&["x"], &[("A", "a\0b")], None), "0", &remote("w")).is_err());
        assert!(header(&request(&["a\0b"], &[], None), "0", &remote("w")).is_err());
        assert!(header(&request(&[], &[], None), "0", &remote("w")).is_err());
    }
}
