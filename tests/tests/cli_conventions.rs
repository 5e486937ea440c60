//! The command-line conventions every `hermes` command keeps, through the
//! real binary: a closed stdout ends the output quietly, a usage error has
//! its own exit code, an error names its cause once, and every command that
//! prints data takes `--output text|json`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;

use hermes_tests::cli::{Run, TestHome};

/// Runs `hermes ARGS` with its stdout a pipe whose reader is already gone,
/// as under `| head` once head has read enough.
fn with_closed_stdout(home: &TestHome, args: &[&str]) -> Run {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    home.command(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
        .into()
}

#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    for (args, code) in [
        (&["sandbox", "list"][..], 0),
        (&["sandbox", "list", "--output", "json"], 0),
        (&["session", "list"], 0),
        (&["config", "show"], 0),
        (&["config", "show", "--json"], 0),
        (&["config", "get", "terminal"], 0),
        (&["config", "path"], 0),
        (&["config", "check"], 0),
        (&["--help"], 0),
        (&["config", "set", "--help"], 0),
        (&["--version"], 0),
    ] {
        let run = with_closed_stdout(&home, args);
        assert_eq!((run.code, run.stderr.as_str()), (code, ""), "{args:?}");
    }
    // The usual code, not 0, where the command fails: stderr says why.
    let run = with_closed_stdout(&home, &["config", "get", "terminal.nothing"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
}

#[test]
fn a_usage_error_exits_64_never_2() {
    let home = TestHome::new();
    for args in [
        &["reconcile", "--dry-run", "--no-such-flag"][..],
        &["reconcile", "--output", "yaml"],
        &["exec", "--session", "a/b", "--", "true"],
        &["config", "get"],
        &["no-such-command"],
        &[],
    ] {
        let run = home.run(args);
        // EX_USAGE: a script that reads 2 as "changes pending" after
        // `reconcile --dry-run` cannot mistake a typo for a plan.
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        assert!(run.stdout.is_empty(), "{args:?}: {run:?}");
        assert!(!run.stderr.is_empty(), "{args:?}: {run:?}");
    }
    let help = home.run(["--help"]);
    assert_eq!(help.code, 0, "{help:?}");
    assert!(help.stdout.contains("64 usage error"), "{}", help.stdout);
    assert_eq!(home.run(["reconcile", "--help"]).code, 0);
}

#[test]
fn a_command_without_the_double_dash_gets_the_line_to_write_instead() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    for (args, hint) in [
        (&["exec", "ls", "/"][..], "exec -- ls /"),
        (
            &["exec", "--task", "t1", "echo", "a b"],
            "exec --task t1 -- echo 'a b'",
        ),
        (
            &["--profile", "exec", "exec", "grep", "-r", "x"],
            "--profile exec exec -- grep -r x",
        ),
    ] {
        let run = home.run(args);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        assert!(run.stdout.is_empty(), "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(&format!(
                "hint: put the command after `--`: hermes --home {} {hint}\n",
                home.path().display()
            )),
            "{args:?}: {}",
            run.stderr
        );
    }
    // With `--` there is nothing to hint at; a usage error elsewhere gets
    // no hint.
    let run = home.run(["exec", "--no-such-flag", "--", "true"]);
    assert_eq!(run.code, 64, "{run:?}");
    assert!(!run.stderr.contains("hint: put the command"), "{run:?}");
    let run = home.run(["sandbox", "lisst"]);
    assert!(!run.stderr.contains("hint: put the command"), "{run:?}");
}

#[test]
fn an_error_names_its_cause_once() {
    // The tunnel port held by this test: the proxy cannot listen there.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let home = TestHome::new();
    home.write_config(format!(
        "proxy:\n  enabled: true\n  tunnel_port: {port}\n  listen: [127.0.0.1]\n"
    ));
    let setup = home.run(["egress", "setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    // EADDRINUSE as the OS says it.
    let cause = "Address already in use";
    for args in [&["egress", "serve"][..], &["egress", "start"]] {
        let run = home.run(args);
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(&format!("127.0.0.1:{port}")),
            "{args:?}: {}",
            run.stderr
        );
        // `start` shows the log of the proxy it started: one line there.
        for line in run.stderr.lines().filter(|l| l.contains(cause)) {
            assert_eq!(line.matches(cause).count(), 1, "{args:?}: {line}");
        }
        assert!(run.stderr.contains(cause), "{args:?}: {}", run.stderr);
    }
    let stop = home.run(["egress", "stop"]);
    assert!(!stop.stderr.contains("panicked"), "{stop:?}");

    // The controller's metrics address, taken.
    let run = home.run([
        "controller",
        "--once",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr.matches(cause).count(), 1, "{}", run.stderr);
    drop(held);
}

/// `hermes ARGS` as the binary `bin`, on `home`'s home.
fn run_as(bin: &std::path::Path, home: &TestHome, args: &[&str]) -> Run {
    std::process::Command::new(bin)
        .arg("--home")
        .arg(home.path())
        .args(args)
        .env_remove("HERMES_HOME")
        .env_remove("HERMES_PROFILE")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
        .into()
}

#[test]
fn hermesctl_is_the_same_command_and_names_itself_as_invoked() {
    let home = TestHome::new();
    let hermesctl = hermes_tests::cli::hermesctl_bin();
    let version = env!("CARGO_PKG_VERSION");
    let run = run_as(&hermesctl, &home, &["--version"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, format!("hermesctl {version}\n").as_str()),
        "{run:?}"
    );
    let help = run_as(&hermesctl, &home, &["--help"]);
    assert_eq!(help.code, 0, "{help:?}");
    assert!(
        help.stdout.contains("Usage: hermesctl [OPTIONS] <COMMAND>"),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("64 usage error"), "{}", help.stdout);
    let help = run_as(&hermesctl, &home, &["reconcile", "--help"]);
    assert!(
        help.stdout.contains("Usage: hermesctl reconcile [OPTIONS]"),
        "{}",
        help.stdout
    );
    let bad = run_as(&hermesctl, &home, &["reconcile", "--no-such-flag"]);
    assert_eq!(bad.code, 64, "{bad:?}");
    assert!(bad.stderr.contains("Usage: hermesctl reconcile"), "{bad:?}");
    // The other name says its own.
    let run = home.run(["--version"]);
    assert_eq!(run.stdout, format!("hermes {version}\n"));
    // One program: the same plan under either name.
    home.write_config("terminal:\n  backend: local\nproxy:\n  enabled: true\n");
    let ctl = run_as(&hermesctl, &home, &["reconcile", "--dry-run"]);
    let plain = home.run(["reconcile", "--dry-run"]);
    assert_eq!(ctl.code, 2, "{ctl:?}");
    assert_eq!((ctl.code, &ctl.stdout), (plain.code, &plain.stdout));
    // Any name it is linked as: argv[0]'s file name.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("sandboxctl");
    std::os::unix::fs::symlink(&hermesctl, &link).unwrap();
    let run = run_as(&link, &home, &["--version"]);
    assert_eq!(run.stdout, format!("sandboxctl {version}\n"));
}

/// On a terminal a plan's long causes wrap to its width, each under its
/// own start; piped (a script, a log) every operation stays one line.
#[test]
fn a_plan_wraps_to_the_terminal_and_stays_one_line_per_operation_in_a_pipe() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: docker\n  docker_image: hermes-never-pulled:1\n");
    let line = format!(
        "stty rows 40 cols 72; {} --home {} reconcile --dry-run",
        hermes_tests::cli::hermes_bin().display(),
        home.path().display()
    );
    // The real engine: the plan is the create (and the image's pull).
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let lines: Vec<&str> = shown.lines().collect();
    assert!(lines.len() > 2, "{shown}");
    for l in &lines {
        assert!(l.chars().count() <= 72, "{l:?} in\n{shown}");
    }
    let indent = lines[0].find("no container").unwrap();
    assert!(lines[1].starts_with(&" ".repeat(indent)), "{shown}");
    let piped = home.command(["reconcile", "--dry-run"]).output().unwrap();
    let piped = String::from_utf8_lossy(&piped.stdout).into_owned();
    assert!(
        piped
            .lines()
            .next()
            .unwrap()
            .starts_with("+ sandbox default/default   create      no container with these labels"),
        "{piped}"
    );
    assert_eq!(piped.lines().count(), 2, "{piped}");
}

/// A word that is not UTF-8 (a file name an agent passes) is a usage
/// error that says so; hermes never panics reading its own command line,
/// JSON asked for or not.
#[test]
fn a_word_that_is_not_utf8_is_a_usage_error_never_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let word = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let run: Run = home
        .command(["exec", "--", "printf", "%s"])
        .arg(word)
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 64, "{run:?}");
    assert!(run.stderr.contains("invalid UTF-8"), "{run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    let usage: Run = home
        .command(["exec", "--output", "json"])
        .arg(word)
        .output()
        .unwrap()
        .into();
    assert_eq!(usage.code, 64, "{usage:?}");
    assert!(!usage.stderr.contains("panicked"), "{usage:?}");
    let doc: serde_json::Value = serde_json::from_str(&usage.stdout).unwrap();
    assert_eq!(doc["error"]["exit_code"], 64, "{doc}");
}
