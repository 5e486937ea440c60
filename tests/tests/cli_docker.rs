//! `hermes reconcile` and `hermes exec` on the Docker backend, end to end:
//! the real binary against the real engine and the test image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::TestHome;

/// Removes the test's container however the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

fn docker_home(profile: &str) -> (TestHome, Cleanup) {
    let home = TestHome::new();
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    GREETING: hello\n",
        hermes_tests::test_image()
    ));
    (home, Cleanup(format!("hermes-{profile}-default")))
}

#[test]
fn reconcile_creates_reattaches_and_recreates_keeping_the_workspace() {
    let profile = format!("e2e{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "+ sandbox {profile}/default   create      no container with these labels"
        )),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    // Reattach: a second pass has nothing to do.
    let again = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "No changes. The host is converged.\n")
    );

    let write = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo $GREETING > /workspace/marker",
    ]);
    assert_eq!(write.code, 0, "{write:?}");

    assert_eq!(
        hermes(&["config", "set", "terminal.container_memory", "1024"]).code,
        0
    );
    let dry = hermes(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(plan["operations"][0]["action"], "recreate");
    let cause = plan["operations"][0]["cause"].as_str().unwrap();
    assert!(cause.starts_with("spec changed: "), "{cause}");
    assert!(cause.ends_with("/workspace and /root are kept"), "{cause}");
    assert_eq!(hermes(&["reconcile"]).code, 0);
    assert_eq!(hermes(&["reconcile", "--dry-run"]).code, 0);

    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "hello\n"));
}

#[test]
fn exec_streams_exit_codes_and_recovers_once_from_a_removed_container() {
    let profile = format!("e2x{}", std::process::id());
    let (home, cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let run = hermes(&["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(
        (run.code, run.stdout.as_str(), run.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f", &cleanup.0])
        .output()
        .unwrap();
    assert!(removed.status.success());
    let run = hermes(&["exec", "--", "true"]);
    assert_eq!(run.code, 0, "{run:?}");
    let timed = hermes(&[
        "exec",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        "sleep 1000 & sleep 1000",
    ]);
    assert_eq!(timed.code, 124, "{timed:?}");
    assert!(
        timed.stderr.contains("[Command timed out after 2s]"),
        "{}",
        timed.stderr
    );
    let left = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    ]);
    assert!(!left.stdout.contains("sleep 1000"), "{}", left.stdout);
}
