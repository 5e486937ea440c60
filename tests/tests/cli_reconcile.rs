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

/// A recreate names the settings that changed, old and new, in the text
/// plan and in the JSON plan's `changes`; an environment variable whose
/// value changed is named, its values never shown.
#[test]
fn a_recreate_plan_names_the_changed_settings_never_an_env_value() {
    use hermes_tests::docker_cli::ProfileCleanup;

    let profile = format!("diff{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let image = hermes_tests::test_image();
    let config = |memory: u32, image: &str, token: &str| {
        format!(
            "terminal:\n  backend: docker\n  container_memory: {memory}\n  docker_image: {image}\n  docker_env:\n    API_TOKEN: {token}\n"
        )
    };
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    home.write_config(config(5120, &image, "first-sekrit-4711"));
    let made = hermes(&["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");

    // Memory and image: both named, old and new, in text and JSON.
    let other = "hermes-test-never-made:1";
    home.write_config(config(2048, other, "first-sekrit-4711"));
    let text = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(text.code, 2, "{text:?}");
    let want = format!(
        "~ sandbox {profile}/default   recreate    container_memory 5120 MB → 2048 MB, docker_image {image} → {other} (forces recreate); pulls image {other} first (not on this engine); no command running; files outside /workspace and /root are lost\n"
    );
    assert!(text.stdout.starts_with(&want), "{}", text.stdout);
    let json = hermes(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(json.code, 2, "{json:?}");
    let plan: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(plan["operations"][0]["action"], "recreate");
    assert_eq!(
        plan["operations"][0]["changes"],
        serde_json::json!([
            {"field": "container_memory", "old": "5120", "new": "2048"},
            {"field": "docker_image", "old": image, "new": other},
        ])
    );

    // A secret's value changed: its name, never either value.
    home.write_config(config(5120, &image, "second-sekrit-0815"));
    let text = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(text.code, 2, "{text:?}");
    assert!(
        text.stdout
            .contains("recreate    docker_env.API_TOKEN changed (forces recreate);"),
        "{}",
        text.stdout
    );
    let json = hermes(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(json.code, 2, "{json:?}");
    let plan: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        plan["operations"][0]["changes"],
        serde_json::json!([
            {"field": "docker_env.API_TOKEN", "old": "(not shown)", "new": "(not shown)"},
        ])
    );
    for out in [&text.stdout, &text.stderr, &json.stdout, &json.stderr] {
        assert!(!out.contains("sekrit"), "{out}");
    }
    // Nor does the container's settings label hold a value.
    let labels = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            &format!("hermes-{profile}-default"),
        ])
        .output()
        .unwrap();
    let labels = String::from_utf8_lossy(&labels.stdout);
    assert!(labels.contains("hermes-settings"), "{labels}");
    assert!(!labels.contains("sekrit"), "{labels}");
}
