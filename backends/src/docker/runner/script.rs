//! What runs inside the container, and the words hermes and it exchange:
//! the runner's script, the request files hermes writes (shell code the
//! runner sources, every value single-quoted), and the status lines the
//! runner answers with.

/// The runner's script, POSIX sh (`runner.sh` beside this file).
pub(crate) const RUNNER_SCRIPT: &str = include_str!("runner.sh");

/// The runner's script as its file holds it: [`RUNNER_SCRIPT`], after
/// `hermes_reap`, the function that kills a command's processes by marker
/// (the kill script of the engine's exec, [`crate::exec::KILL_SCRIPT`]).
pub(crate) fn runner_file() -> String {
    format!(
        "hermes_reap() (\n{}\n)\n{RUNNER_SCRIPT}",
        crate::exec::KILL_SCRIPT
    )
}

/// The request's `cmd` file with the exec's marker, which the runner's
/// watch kills by when hermes goes away during the command.
pub(crate) fn with_marker(mut cmd: String, marker: &str) -> String {
    cmd.push_str("hermes_id=");
    cmd.push_str(&quote(marker));
    cmd.push('\n');
    cmd
}

/// What `sh -c` runs: a tag for the process list, then the script's file,
/// whose path comes as `$1` (the script itself is on no command line).
/// Every process of the runner shows as `sh -c # hermes-runner …`
/// ([`is_runner_process`]).
pub(crate) const BOOT: &str = "# hermes-runner\n. \"$1\"";

/// How `ps` (and so the engine's `top`) shows a process of the runner.
const PROCESS_PREFIX: &str = "sh -c # hermes-runner";

/// The command line that starts the runner for the request pipe `pipe` in
/// `dir` (the directory as the runner sees it), whose script
/// ([`RUNNER_SCRIPT`]) is the file `script` there: it prints `ok`, or
/// `unsupported: why`.
pub(crate) fn start_command(dir: &str, pipe: &str, script: &str) -> Vec<String> {
    let script = format!("{dir}/{script}");
    [
        "sh",
        "-c",
        BOOT,
        "hermes-runner",
        &script,
        "start",
        dir,
        pipe,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Whether a command line (as `top` shows it: the arguments joined by
/// spaces) is one of the runner's own processes, which do not make a
/// sandbox busy. The commands it runs are not.
pub fn is_runner_process(cmd: &str) -> bool {
    cmd.starts_with(PROCESS_PREFIX)
}

/// How a request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Output streamed, exit code reported.
    Run,
    /// Started detached; the runner reports once it started.
    Background,
}

/// Why a request cannot be written for the runner (the engine's exec
/// takes it instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unwritable(pub &'static str);

/// A word for sh, single-quoted: taken literally whatever it holds.
pub(crate) fn quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The request's `cmd` file: the mode, the working directory (empty: the
/// container's) and the arguments. No secret is in it.
pub(crate) fn command_file(
    mode: Mode,
    cwd: Option<&str>,
    argv: &[String],
) -> Result<String, Unwritable> {
    if argv.is_empty() {
        return Err(Unwritable("no command"));
    }
    if argv
        .iter()
        .map(String::as_str)
        .chain(cwd)
        .any(|w| w.contains('\0'))
    {
        return Err(Unwritable("a NUL byte in the command"));
    }
    let mut out = String::new();
    out.push_str(match mode {
        Mode::Run => "hermes_mode=run\n",
        Mode::Background => "hermes_mode=bg\n",
    });
    out.push_str("hermes_cwd=");
    out.push_str(&quote(cwd.unwrap_or("")));
    out.push_str("\nset --");
    for word in argv {
        out.push(' ');
        out.push_str(&quote(word));
    }
    out.push('\n');
    Ok(out)
}

/// The request's `env` file (mode 0600, removed once the runner has read
/// it): one `export NAME='value'` a variable.
pub(crate) fn env_file(env: &[(String, String)]) -> Result<String, Unwritable> {
    let mut out = String::new();
    for (name, value) in env {
        if !is_name(name) {
            return Err(Unwritable("an environment name sh cannot export"));
        }
        if value.contains('\0') {
            return Err(Unwritable("a NUL byte in an environment value"));
        }
        out.push_str("export ");
        out.push_str(name);
        out.push('=');
        out.push_str(&quote(value));
        out.push('\n');
    }
    Ok(out)
}

/// A name sh can export, and that is none of the runner's own.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One line the runner writes on a request's status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// `s`: the runner claimed the request and its output pipes are open.
    Started,
    /// `e`: the request's files are read (and emptied); hermes removes them.
    EnvRead,
    /// `x N`: the command ended with exit code N (126: it could not start).
    Exit(i64),
}

impl Status {
    /// A line without its newline; `None` for anything else.
    pub(crate) fn parse(line: &[u8]) -> Option<Status> {
        match line {
            b"s" => Some(Status::Started),
            b"e" => Some(Status::EnvRead),
            [b'x', b' ', code @ ..] if (1..=3).contains(&code.len()) => {
                let code = std::str::from_utf8(code).ok()?;
                if !code.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let code: i64 = code.parse().ok()?;
                (code <= 255).then_some(Status::Exit(code))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::process::Command;

    use super::*;

    /// Runs `sh` on `script` with the files given, returning stdout.
    fn sh(script: &str) -> String {
        let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn the_script_is_valid_sh() {
        let out = Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(runner_file())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    #[test]
    fn words_reach_sh_literally() {
        let dir = tempfile::tempdir().unwrap();
        let words: Vec<String> = [
            "plain",
            "",
            "it's",
            "'",
            "''",
            "$HOME `id` $(id) \\ \" *",
            "two\nlines",
            "-n",
            "ünïcode",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let file = dir.path().join("cmd");
        std::fs::write(
            &file,
            command_file(Mode::Run, Some("/some where"), &words).unwrap(),
        )
        .unwrap();
        let got = sh(&format!(
            ". {}; printf '%s\\0' \"$hermes_mode\" \"$hermes_cwd\" \"$@\"",
            file.display()
        ));
        let mut want = vec!["run".to_string(), "/some where".to_string()];
        want.extend(words);
        let got: Vec<&str> = got.split_terminator('\0').collect();
        assert_eq!(got, want);
    }

    #[test]
    fn environment_values_reach_sh_literally() {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            ("A".to_string(), "it's $HOME\nand `more`".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let file = dir.path().join("env");
        std::fs::write(&file, env_file(&env).unwrap()).unwrap();
        let got = sh(&format!(
            ". {}; printf '%s|' \"$A\" \"${{EMPTY-unset}}\"; sh -c 'printf %s \"$A\"'",
            file.display()
        ));
        assert_eq!(got, "it's $HOME\nand `more`||it's $HOME\nand `more`");
    }

    #[test]
    fn what_sh_cannot_take_is_refused() {
        assert!(command_file(Mode::Run, None, &[]).is_err());
        assert!(command_file(Mode::Run, None, &["a\0b".to_string()]).is_err());
        assert!(command_file(Mode::Run, Some("/a\0"), &["true".to_string()]).is_err());
        assert!(env_file(&[("A-B".to_string(), "v".to_string())]).is_err());
        assert!(env_file(&[("1A".to_string(), "v".to_string())]).is_err());
        assert!(env_file(&[("A".to_string(), "\0".to_string())]).is_err());
        assert!(command_file(Mode::Background, None, &["true".to_string()]).is_ok());
    }

    #[test]
    fn status_lines_are_read_strictly() {
        assert_eq!(Status::parse(b"s"), Some(Status::Started));
        assert_eq!(Status::parse(b"e"), Some(Status::EnvRead));
        assert_eq!(Status::parse(b"x 0"), Some(Status::Exit(0)));
        assert_eq!(Status::parse(b"x 255"), Some(Status::Exit(255)));
        for bad in [
            &b"x 256"[..],
            b"x -1",
            b"x",
            b"x ",
            b"x 1 ",
            b"x 0001",
            b"x +1",
            b"s ",
            b"",
            b"ok",
        ] {
            assert_eq!(
                Status::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn runner_processes_are_told_from_commands() {
        let start = start_command("/run/hermes", "ctl.0", "ctl.0.sh");
        let shown = start.join(" ").replace('\n', " ");
        assert!(is_runner_process(&shown), "{shown}");
        // The script is in its file, not on the command line.
        assert!(!shown.contains("setsid"), "{shown}");
        assert!(shown.contains("/run/hermes/ctl.0.sh start"), "{shown}");
        assert!(!is_runner_process("sh -c sleep 30"));
        assert!(!is_runner_process("sleep infinity"));
    }
}
