//! `hermes status` tells the truth, through the real binary: what fails
//! closed at that moment, a failed create with its reason, config validity
//! as `hermes config check` has it, and an engine that does not answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::ProfileCleanup;

fn run(home: &TestHome, profile: &str, args: &[&str]) -> Run {
    let mut all = vec!["--profile", profile];
    all.extend_from_slice(args);
    home.run(all)
}

#[test]
fn blocked_names_the_proxy_exec_fails_closed_on_while_a_sandbox_runs() {
    let profile = format!("stfc{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let port = hermes_tests::egress::free_port_pair(None);
    let config = |enforce: bool| {
        format!(
            "terminal:\n  backend: docker\n  docker_image: {}\nproxy:\n  enabled: true\n  \
             enforce_on_docker: {enforce}\n  tunnel_port: {port}\n",
            hermes_tests::test_image()
        )
    };
    home.write_config(config(false));
    let setup = run(&home, &profile, &["egress", "setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    // Not enforced: exec makes the sandbox while the proxy is down.
    let made = run(&home, &profile, &["exec", "--", "true"]);
    assert_eq!(made.code, 0, "{made:?}");
    // Enforced now: the sandbox runs, the plan only starts the proxy, and
    // exec fails closed.
    home.write_config(config(true));
    let exec = run(&home, &profile, &["exec", "--", "true"]);
    assert_eq!(exec.code, 3, "{exec:?}");
    let status = run(&home, &profile, &["status"]);
    assert_eq!(status.code, 1, "{status:?}");
    assert!(
        status.stdout.contains(
            "Blocked:\n  exec on the docker backend: egress proxy not running (fail closed)\n"
        ),
        "{}",
        status.stdout
    );
    assert!(!status.stdout.contains("Blocked:     none"), "{status:?}");
    let json = run(&home, &profile, &["status", "--output", "json"]);
    assert_eq!(json.code, 1, "{json:?}");
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["healthy"], false);
    assert_eq!(
        report["blocked"],
        serde_json::json!(["exec on the docker backend: egress proxy not running (fail closed)"])
    );
}

#[test]
fn a_failed_create_shows_as_an_error_with_its_reason() {
    let profile = format!("stcr{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    // An image no registry serves: the create fails at once.
    home.write_config(
        "terminal:\n  backend: docker\n  docker_image: 127.0.0.1:1/hermes-missing:1\n",
    );
    let pass = run(&home, &profile, &["reconcile"]);
    assert_eq!(pass.code, 1, "{pass:?}");
    let status = run(&home, &profile, &["status"]);
    assert_eq!(status.code, 1, "{status:?}");
    let line = status
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("  sandbox {profile}/default: failed ")))
        .unwrap_or_else(|| panic!("no error line: {}", status.stdout));
    assert!(line.contains("127.0.0.1:1/hermes-missing:1"), "{line}");
    let json = run(&home, &profile, &["status", "--output", "json"]);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["errors"].as_array().unwrap().len(), 1, "{report}");
    // Once the config no longer wants it, the old failure is not shown.
    home.write_config("terminal:\n  backend: local\n");
    let status = run(&home, &profile, &["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(!status.stdout.contains("Errors:"), "{status:?}");
}

#[test]
fn config_validity_agrees_with_config_check_on_credentials() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: daytona\n");
    let check = home.run(["config", "check"]);
    assert_eq!(check.code, 1, "{check:?}");
    let status = home.run(["status"]);
    assert_eq!(status.code, 1, "{status:?}");
    assert!(
        status.stdout.starts_with("Config:      invalid: ")
            && status.stdout.contains("DAYTONA_API_KEY"),
        "{status:?}"
    );
    let json = home.run(["status", "--output", "json"]);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["config"]["valid"], false, "{report}");
}

#[test]
fn an_engine_that_does_not_answer_is_an_error() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: docker\n");
    let status = home
        .command(["status"])
        .env("DOCKER_HOST", "unix:///nonexistent/hermes-test.sock")
        .output()
        .unwrap();
    let status = Run::from(status);
    assert_eq!(status.code, 1, "{status:?}");
    assert!(
        status
            .stdout
            .contains("Errors:\n  the Docker engine does not answer: "),
        "{status:?}"
    );
}

#[test]
fn an_unreachable_ssh_host_is_blocked() {
    let home = TestHome::new();
    // Port 1 on loopback: nothing listens, the connection is refused.
    home.write_config(
        "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_user: nobody\n  ssh_port: 1\n",
    );
    let status = home.run(["status"]);
    assert_eq!(status.code, 1, "{status:?}");
    assert!(
        status
            .stdout
            .contains("Blocked:\n  ssh nobody@127.0.0.1:1: unreachable: "),
        "{status:?}"
    );
    // The JSON report from the same pass.
    let json = home.run(["status", "--output", "json"]);
    assert_eq!(json.code, 1, "{json:?}");
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["healthy"], false);
    let first = report["blocked"][0].as_str().unwrap_or_default();
    assert!(
        first.starts_with("ssh nobody@127.0.0.1:1: unreachable: "),
        "{report}"
    );
}
