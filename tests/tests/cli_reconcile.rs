//! `hermes reconcile` end to end on the built-in defaults.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::TestHome;

#[test]
fn reconcile_on_the_defaults_says_converged_and_exits_0() {
    let home = TestHome::new();
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "No changes. The host is converged.\n");
}

#[test]
fn dry_run_on_the_defaults_exits_0_in_text_and_json() {
    let home = TestHome::new();
    let text = home.run(["reconcile", "--dry-run"]);
    assert_eq!(
        (text.code, text.stdout.as_str()),
        (0, "No changes. The host is converged.\n")
    );
    let json = home.run(["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(json.code, 0);
    let plan: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(plan["converged"], true);
    assert_eq!(plan["operations"], serde_json::json!([]));
}

#[test]
fn an_invalid_config_is_an_error_exit_1_naming_key_and_line() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: dockr\n");
    let run = home.run(["reconcile", "--dry-run"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("config.yaml:2:12: terminal.backend: unknown value `dockr`"),
        "{}",
        run.stderr
    );
}

#[test]
fn log_format_json_is_accepted() {
    let home = TestHome::new();
    let run = home
        .command(["--log-format", "json", "reconcile"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(run.status.success());
}
