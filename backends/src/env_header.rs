//! A command's environment carried on its standard input, for the
//! services whose exec takes no environment (a Modal sandbox, a Kubernetes
//! Pod's `exec` subresource): the command runs as `/bin/sh -c BOOTSTRAP
//! hermes-exec CMD…`, the bootstrap reads [`header`] first, exports what
//! it names (the exec marker among them), and `exec`s the command, which
//! reads the rest of the input. No value is ever on a command line.

use hermes_model::config::is_env_name;

use crate::exec::{EXEC_ID_ENV, header_line};

/// The first line of the header the bootstrap reads.
pub const VERSION: &str = "hermes-exec-env-1";

/// Reads `VERSION`, a count, then that many name and value lines (a value
/// `r…` as it is, `e…` escaped for `printf %b`), exports them and runs the
/// arguments. The shell reads a pipe a byte at a time, so the rest of the
/// input is left for the command. Exit 125 on a broken header.
pub const BOOTSTRAP: &str = r#"_h_d() { case $1 in r*) _h_v=${1#r} ;; *) _h_v=$(printf "%bx" "${1#e}"); _h_v=${_h_v%x} ;; esac; }
IFS= read -r _h_e || exit 125
[ "$_h_e" = "hermes-exec-env-1" ] || { echo "hermes: unexpected exec header" >&2; exit 125; }
IFS= read -r _h_n || exit 125
while [ "$_h_n" -gt 0 ]; do
  IFS= read -r _h_k || exit 125
  IFS= read -r _h_e || exit 125
  _h_d "$_h_e"
  export "$_h_k=$_h_v"
  _h_n=$((_h_n - 1))
done
unset _h_e _h_n _h_k _h_v
unset -f _h_d
exec "$@"
"#;

/// The bootstrap's header: the request's environment, then the marker.
pub fn header(env: &[(String, String)], marker: &str) -> Result<Vec<u8>, String> {
    let vars: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k != EXEC_ID_ENV)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([(EXEC_ID_ENV, marker)])
        .collect();
    let mut out = format!("{VERSION}\n{}\n", vars.len());
    for (name, value) in vars {
        if !is_env_name(name) {
            return Err(format!("{name:?} is not an environment variable name"));
        }
        if value.contains('\0') {
            return Err(format!("the value of {name} holds a NUL byte"));
        }
        out.push_str(name);
        out.push('\n');
        out.push_str(&header_line(value));
        out.push('\n');
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    /// Runs the bootstrap locally with `header` + `rest` as its input.
    fn bootstrap(header: &[u8], rest: &[u8], cmd: &[&str]) -> (i32, String) {
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(BOOTSTRAP)
            .arg("hermes-exec")
            .args(cmd)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(header).unwrap();
        stdin.write_all(rest).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
        )
    }

    #[test]
    fn the_bootstrap_exports_the_environment_and_leaves_the_input() {
        let env = vec![
            ("PLAIN".to_string(), "a b 'c' $HOME".to_string()),
            ("MULTI".to_string(), "line1\nline2\n".to_string()),
            (EXEC_ID_ENV.to_string(), "spoofed".to_string()),
        ];
        let h = header(&env, "abc123").unwrap();
        let (code, out) = bootstrap(
            &h,
            b"rest of input\n",
            &[
                "/bin/sh",
                "-c",
                "printf '%s|%s|%s|' \"$PLAIN\" \"$MULTI\" \"$HERMES_EXEC_ID\"; cat",
            ],
        );
        assert_eq!(code, 0);
        assert_eq!(out, "a b 'c' $HOME|line1\nline2\n|abc123|rest of input\n");
    }

    #[test]
    fn bad_names_and_nul_values_are_refused() {
        let bad = |k: &str, v: &str| header(&[(k.to_string(), v.to_string())], "m").is_err();
        assert!(bad("1X", "v"));
        assert!(bad("A-B", "v"));
        assert!(bad("A;B", "v"));
        assert!(bad("OK", "nul\0"));
        assert!(!bad("_OK1", "fine"));
    }

    #[test]
    fn a_broken_header_exits_125() {
        let (code, _) = bootstrap(b"something else\n", b"", &["true"]);
        assert_eq!(code, 125);
    }
}
