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
