//! The operator's verbs, through the real binary: shell completions and
//! manual pages made from the command line's definition (under the name
//! the binary was invoked as), `status --watch`, and `sandbox describe` of
//! a real Docker sandbox (its spec going stale, a process in it, its
//! events), each document checked against its schema.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome, hermesctl_bin};
use hermes_tests::docker_cli::docker_home;
use hermes_tests::json_schema::document;

#[test]
fn completions_and_man_pages_come_from_the_command_line_under_its_name() {
    let home = TestHome::new();
    let bash = home.run(["completions", "bash"]);
    assert_eq!(bash.code, 0, "{bash:?}");
    assert!(
        bash.stdout.contains("complete -F _hermes"),
        "{}",
        bash.stdout
    );
    // Every subcommand and a flag of one are offered.
    for word in ["reconcile", "sandbox", "describe", "--dry-run", "--watch"] {
        assert!(bash.stdout.contains(word), "{word} missing");
    }
    let zsh = home.run(["completions", "zsh"]);
    assert!(zsh.stdout.starts_with("#compdef hermes"), "{}", zsh.stdout);
    let fish = home.run(["completions", "fish"]);
    assert!(
        fish.stdout.contains("complete -c hermes"),
        "{}",
        fish.stdout
    );
    assert_eq!(home.run(["completions", "tcsh"]).code, 64);
    // Under hermesctl's name, hermesctl's completions.
    let ctl: Run = std::process::Command::new(hermesctl_bin())
        .args(["completions", "bash"])
        .env("HERMES_HOME", home.path())
        .output()
        .unwrap()
        .into();
    assert!(ctl.stdout.contains("complete -F _hermesctl"), "{ctl:?}");

    let man = home.run(["man"]);
    assert_eq!(man.code, 0, "{man:?}");
    assert!(man.stdout.contains(".TH hermes 1"), "{}", man.stdout);
    assert!(man.stdout.contains("reconcile"), "{}", man.stdout);
    let dir = tempfile::tempdir().unwrap();
    let pages = home.run(["man", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(pages.code, 0, "{pages:?}");
    for page in [
        "hermes.1",
        "hermes-reconcile.1",
        "hermes-sandbox-describe.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
    // No home needed to make them.
    let homeless: Run = std::process::Command::new(hermes_tests::cli::hermes_bin())
        .args(["completions", "bash"])
        .env_remove("HOME")
        .env_remove("HERMES_HOME")
        .output()
        .unwrap()
        .into();
    assert_eq!(homeless.code, 0, "{homeless:?}");
}

#[test]
fn status_watch_reports_again_as_documents_or_text_then_stops_at_its_count() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let json = home.run([
        "status",
        "--watch",
        "--interval",
        "1",
        "--count",
        "2",
        "--output",
        "json",
    ]);
    assert_eq!(json.code, 0, "{json:?}");
    let lines: Vec<&str> = json.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "one document per line: {}", json.stdout);
    for line in lines {
        let run = Run {
            code: 0,
            stdout: line.to_string(),
            stderr: String::new(),
        };
        document(&run, "status");
    }
    let text = home.run(["status", "--watch", "--interval", "1", "--count", "2"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert_eq!(
        text.stdout.matches("Backend:").count(),
        2,
        "{}",
        text.stdout
    );
    assert!(
        !text.stdout.contains('\x1b'),
        "no screen codes off a terminal"
    );
    // --interval and --count belong to --watch.
    assert_eq!(home.run(["status", "--count", "2"]).code, 64);
}

#[test]
fn describe_shows_a_docker_sandbox_its_stale_spec_processes_and_events() {
    let (home, profile, _cleanup) = docker_home("dsc", "");
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let none = hermes(&["sandbox", "describe"]);
    assert_eq!(none.code, 1, "{none:?}");
    assert!(none.stderr.contains("no sandbox"), "{none:?}");
    let started = hermes(&["exec", "--background", "--", "exec sleep 3121"]);
    assert_eq!(started.code, 0, "{started:?}");
    let text = hermes(&["sandbox", "describe"]);
    assert_eq!(text.code, 0, "{text:?}");
    let name = format!("hermes-{profile}-default");
    assert!(
        text.stdout.starts_with(&format!("Sandbox:    {name} (")),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("Spec:       the config's ("),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("  /workspace ← "), "{}", text.stdout);
    assert!(text.stdout.contains("sleep 3121"), "{}", text.stdout);
    assert!(
        text.stdout.contains("  start\n") || text.stdout.contains(" start\n"),
        "{}",
        text.stdout
    );

    let json = document(
        &hermes(&["sandbox", "describe", "--output", "json"]),
        "sandbox-describe",
    );
    assert_eq!(json["name"], name.as_str());
    assert_eq!(json["spec"]["matches"], true);
    assert!(
        json["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "create"),
        "{json}"
    );
    // The config moves on: stale, with the setting that differs.
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_memory: 2048\n",
        hermes_tests::test_image()
    ));
    let stale = hermes(&["sandbox", "describe"]);
    assert!(
        stale.stdout.contains("Spec:       stale (")
            && stale
                .stdout
                .contains("  container_memory 5120 MB → 2048 MB"),
        "{}",
        stale.stdout
    );
    let json = document(
        &hermes(&["sandbox", "describe", "--output", "json"]),
        "sandbox-describe",
    );
    assert_eq!(json["spec"]["matches"], false);
    assert_eq!(json["spec"]["changes"][0]["field"], "container_memory");
    // Another backend: said, not guessed.
    home.write_config("terminal:\n  backend: local\n");
    let local = hermes(&["sandbox", "describe"]);
    assert_eq!(local.code, 1, "{local:?}");
    assert!(
        local.stderr.contains("terminal.backend is local"),
        "{local:?}"
    );
}

#[test]
fn down_takes_every_sandbox_down_by_its_printed_plan_and_reconcile_brings_it_back() {
    let (home, profile, _cleanup) = docker_home("dwn", "");
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let keep = hermes(&["exec", "--", "echo kept > /workspace/marker"]);
    assert_eq!(keep.code, 0, "{keep:?}");
    assert_eq!(hermes(&["exec", "--session", "d1", "--", "true"]).code, 0);
    let names = || hermes_tests::docker_cli::containers_of(&profile);
    assert_eq!(names().len(), 2, "{:?}", names());

    let dry = hermes(&["down", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    for task in ["default", "default@d1"] {
        assert!(
            dry.stdout.contains(&format!("- sandbox {profile}/{task}")),
            "{}",
            dry.stdout
        );
    }
    assert!(dry.stdout.contains("hermes down: "), "{}", dry.stdout);
    let json = document(
        &hermes(&["down", "--dry-run", "--output", "json"]),
        "reconcile",
    );
    assert_eq!(json["summary"]["remove"], 2, "{json}");
    assert_eq!(names().len(), 2, "a dry run removed something");

    // No terminal: no question. Everything goes, the files stay.
    let down = hermes(&["down"]);
    assert_eq!(down.code, 0, "{down:?}");
    assert!(names().is_empty(), "{:?}", names());
    assert!(
        down.stdout.contains("Down: nothing of this home runs"),
        "{down:?}"
    );
    let again = hermes(&["down", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let read = hermes(&["exec", "--", "cat /workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"), "{read:?}");
}
