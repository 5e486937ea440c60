//! Hermes Agent's own CLI (the real `hermes-agent` from PyPI, in the venv
//! `scripts/test` makes) with the plugin of
//! `integrations/hermes-agent-plugin`: `hermes reconcile`, `sandbox`,
//! `session`, `controller` and `egress` of the agent run hermesctl with the
//! same words, on the home the agent resolved, with hermesctl's output and
//! exit code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::agent::{
    HERMESCTL_ENV, agent, path_without_hermesctl, run_agent, run_hermesctl, with_plugin,
};
use hermes_tests::cli::{Run, TestHome, hermesctl_bin};

/// Sandboxes on the host itself: nothing to make, so converged.
const LOCAL: &str = "terminal:\n  backend: local\n";

/// The same with the egress proxy wanted: its set-up is pending.
const LOCAL_WITH_PROXY: &str = "terminal:\n  backend: local\nproxy:\n  enabled: true\n";

/// A home whose config.yaml is `config` with the plugin enabled.
fn home_with(config: &str) -> TestHome {
    let home = TestHome::new();
    home.write_config(with_plugin(config));
    home
}

#[test]
fn the_agents_reconcile_dry_run_prints_our_plan_and_exits_0_when_converged() {
    let home = home_with(LOCAL);
    let run = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "No changes. The host is converged.\n"),
        "{run:?}"
    );
    // Word for word what hermesctl says itself, stderr included: the agent
    // adds nothing.
    let ours = run_hermesctl(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!((&run.stdout, &run.stderr), (&ours.stdout, &ours.stderr));
}

#[test]
fn the_agents_reconcile_dry_run_exits_2_with_our_plan_when_changes_are_pending() {
    let home = home_with(LOCAL_WITH_PROXY);
    let run = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.contains("+ proxy   setup"), "{}", run.stdout);
    let ours = run_hermesctl(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!((&run.stdout, &run.stderr), (&ours.stdout, &ours.stderr));
    // The dry run wrote nothing: the proxy is still not set up.
    assert!(!home.path().join("proxy").join("ca.crt").exists());

    let json = run_agent(home.path(), ["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(json.code, 2, "{json:?}");
    let plan: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(plan["converged"], false, "{plan}");
}

#[test]
fn the_agents_reconcile_dry_run_on_docker_plans_the_sandbox_as_hermesctl_does() {
    let image = hermes_tests::test_image();
    let home = home_with(&format!(
        "terminal:\n  backend: docker\n  docker_image: {image}\n"
    ));
    let run = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.contains("create"), "{}", run.stdout);
    let ours = run_hermesctl(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!((&run.stdout, &run.stderr), (&ours.stdout, &ours.stderr));
}

#[test]
fn the_agents_sandbox_and_session_lists_are_our_json() {
    let home = home_with(LOCAL);
    for command in ["sandbox", "session"] {
        let run = run_agent(home.path(), [command, "list", "--output", "json"]);
        assert_eq!(run.code, 0, "{command}: {run:?}");
        // Our JSON, not the text table: `--output json` reached hermesctl.
        let listed: serde_json::Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{command}: not JSON ({e}): {run:?}"));
        assert_eq!(listed["schema_version"], 1, "{command}: {listed}");
        let rows = if command == "sandbox" {
            "sandboxes"
        } else {
            "sessions"
        };
        assert_eq!(listed[rows], serde_json::json!([]), "{command}");
        let ours = run_hermesctl(home.path(), [command, "list", "--output", "json"]);
        assert_eq!(run.stdout, ours.stdout, "{command}");
    }
}

#[test]
fn the_agents_egress_and_controller_commands_are_run_by_hermesctl() {
    let home = home_with(LOCAL);
    let run = run_agent(home.path(), ["egress", "status", "--output", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let status: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    // The process the agent started became hermesctl.
    let binary = std::fs::canonicalize(status["binary"].as_str().unwrap()).unwrap();
    assert_eq!(binary, std::fs::canonicalize(hermesctl_bin()).unwrap());
    assert_eq!(status["enabled"], false, "{status}");

    let run = run_agent(home.path(), ["controller", "--once"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("controller stopped"), "{run:?}");
}

#[test]
fn the_agents_command_hands_every_word_to_hermesctl_and_exits_with_its_code() {
    let home = home_with(LOCAL);
    // Help is ours, under the name the user typed.
    let help = run_agent(home.path(), ["reconcile", "--help"]);
    assert_eq!(help.code, 0, "{help:?}");
    assert!(
        help.stdout.contains("Usage: hermes reconcile [OPTIONS]"),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("--dry-run"), "{}", help.stdout);
    // A usage error is ours (64), never the agent's argparse (2, which
    // would read as "changes pending").
    let bad = run_agent(home.path(), ["reconcile", "--dry-run", "--no-such-flag"]);
    assert_eq!(bad.code, 64, "{bad:?}");
    assert!(bad.stderr.contains("'--no-such-flag'"), "{bad:?}");
    assert!(bad.stderr.contains("Usage: hermes reconcile"), "{bad:?}");
    assert!(bad.stdout.is_empty(), "{bad:?}");
    // An error is ours too: exit 1, its cause on stderr.
    home.write_config(with_plugin("terminal:\n  backend: dockr\n"));
    let invalid = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(invalid.code, 1, "{invalid:?}");
    assert!(
        invalid
            .stderr
            .contains("terminal.backend: unknown value `dockr`"),
        "{invalid:?}"
    );
}

#[test]
fn the_agents_profile_flag_runs_hermesctl_on_that_profiles_home() {
    let home = home_with(LOCAL);
    let made = run_agent(
        home.path(),
        ["profile", "create", "coder", "--no-alias", "--no-skills"],
    );
    assert_eq!(made.code, 0, "{made:?}");
    let profile = home.path().join("profiles").join("coder");
    assert!(profile.is_dir(), "{made:?}");
    // Each profile's config enables the plugin for itself.
    std::fs::write(profile.join("config.yaml"), with_plugin(LOCAL_WITH_PROXY)).unwrap();
    let runs: Vec<_> = [
        &["-p", "coder", "reconcile", "--dry-run"][..],
        &["--profile", "coder", "reconcile", "--dry-run"],
        // The agent takes its flag wherever it is on the line.
        &["reconcile", "--dry-run", "-p", "coder"],
    ]
    .into_iter()
    .map(|args| (args, run_agent(home.path(), args)))
    .collect();
    // hermesctl on the profile's home itself, after the agent (which makes
    // a profile's directory 0700 when it first runs in it).
    let ours = run_hermesctl(&profile, ["reconcile", "--dry-run"]);
    assert_eq!(ours.code, 2, "{ours:?}");
    for (args, run) in runs {
        assert_eq!(
            (run.code, &run.stdout, &run.stderr),
            (2, &ours.stdout, &ours.stderr),
            "{args:?}"
        );
    }
    // Without it: the root's own config, converged.
    let root = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(root.code, 0, "{root:?}");
    // The agent's sticky profile is the home too.
    let used = run_agent(home.path(), ["profile", "use", "coder"]);
    assert_eq!(used.code, 0, "{used:?}");
    let sticky = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(
        (sticky.code, &sticky.stdout),
        (2, &ours.stdout),
        "{sticky:?}"
    );
}

#[test]
fn a_home_without_the_plugin_enabled_has_no_such_command_in_the_agent() {
    // Pip-installed plugins are opt-in, per home: installed is not enough.
    let home = TestHome::new();
    home.write_config(LOCAL);
    let run = run_agent(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("invalid choice: 'reconcile'"),
        "{run:?}"
    );
}

#[test]
fn without_hermesctl_the_agents_command_says_on_one_line_what_to_install_and_exits_1() {
    let home = home_with(LOCAL);
    let missing: Run = agent(home.path(), ["reconcile", "--dry-run"])
        .env("PATH", path_without_hermesctl())
        .output()
        .unwrap()
        .into();
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stdout.is_empty(), "{missing:?}");
    assert_eq!(missing.stderr.lines().count(), 1, "{missing:?}");
    assert!(
        missing
            .stderr
            .starts_with("error: hermesctl is not on PATH; install "),
        "{missing:?}"
    );
    assert!(missing.stderr.contains(HERMESCTL_ENV), "{missing:?}");

    // $HERMESCTL naming no executable: the same, naming the variable.
    let nowhere = home.path().join("no-such-hermesctl");
    let named: Run = agent(home.path(), ["reconcile", "--dry-run"])
        .env("PATH", path_without_hermesctl())
        .env(HERMESCTL_ENV, &nowhere)
        .output()
        .unwrap()
        .into();
    assert_eq!(named.code, 1, "{named:?}");
    assert_eq!(named.stderr.lines().count(), 1, "{named:?}");
    assert!(
        named
            .stderr
            .starts_with(&format!("error: HERMESCTL={} is not", nowhere.display())),
        "{named:?}"
    );
}

#[test]
fn hermesctl_named_by_the_hermesctl_variable_runs_when_path_has_none() {
    let home = home_with(LOCAL_WITH_PROXY);
    let run: Run = agent(home.path(), ["reconcile", "--dry-run"])
        .env("PATH", path_without_hermesctl())
        .env(HERMESCTL_ENV, hermesctl_bin())
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 2, "{run:?}");
    let ours = run_hermesctl(home.path(), ["reconcile", "--dry-run"]);
    assert_eq!(run.stdout, ours.stdout);
}
