//! The singularity and cloud backends through the real binary, where no
//! runtime and no cloud service answers: what the plan, exec and egress
//! status say, and that nothing is attempted without a credential.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};

/// Runs hermes with `vars` set and a PATH holding no container runtime.
fn run(home: &TestHome, args: &[&str], vars: &[(&str, &str)]) -> Run {
    let mut cmd = home.command(args);
    cmd.env("PATH", "/nonexistent-bin");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap().into()
}

#[test]
fn a_cloud_backend_without_its_key_is_blocked_naming_the_variable() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: daytona\n  container_disk: 8192\n");
    let plan = run(&home, &["reconcile", "--dry-run"], &[]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout
            .contains("! daytona default/default   blocked     DAYTONA_API_KEY is not set\n"),
        "{}",
        plan.stdout
    );
    let json = run(&home, &["reconcile", "--dry-run", "--output", "json"], &[]);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["operations"][0]["target"], "daytona default/default");
    assert_eq!(
        value["operations"][0]["cause"],
        "DAYTONA_API_KEY is not set"
    );
    let exec = run(&home, &["exec", "--", "true"], &[]);
    assert_eq!(exec.code, 1, "{exec:?}");
    assert!(
        exec.stderr.contains("DAYTONA_API_KEY is not set"),
        "{}",
        exec.stderr
    );
}

#[test]
fn a_cloud_service_that_does_not_answer_is_an_error_and_blocked() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: daytona\n  container_disk: 8192\n");
    // A loopback port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let vars = [
        ("DAYTONA_API_KEY", "dtn-test-secret-key"),
        ("DAYTONA_API_URL", url.as_str()),
    ];
    let plan = run(&home, &["reconcile", "--dry-run"], &vars);
    assert_eq!(plan.code, 1, "{plan:?}");
    assert!(
        plan.stdout.contains(
            "! daytona default/default   blocked     cannot ask daytona: could not reach Daytona"
        ),
        "{}",
        plan.stdout
    );
    let exec = run(&home, &["exec", "--", "true"], &vars);
    assert_eq!(exec.code, 1, "{exec:?}");
    assert!(
        exec.stderr.contains("could not reach Daytona"),
        "{}",
        exec.stderr
    );
    // The key is never printed.
    for out in [&plan.stdout, &plan.stderr, &exec.stdout, &exec.stderr] {
        assert!(!out.contains("dtn-test-secret-key"));
    }
    // Nothing was recorded.
    assert!(!home.path().join("daytona_snapshots.json").exists());
}

#[test]
fn singularity_without_a_runtime_is_blocked_and_exec_says_why() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: singularity\n");
    let plan = run(&home, &["reconcile", "--dry-run"], &[]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.contains(
            "! singularity default/default   blocked     neither apptainer nor singularity is on the PATH\n"
        ),
        "{}",
        plan.stdout
    );
    let exec = run(&home, &["exec", "--", "true"], &[]);
    assert_eq!(exec.code, 1, "{exec:?}");
    assert!(
        exec.stderr.contains("neither apptainer nor singularity"),
        "{}",
        exec.stderr
    );
    let status = run(&home, &["status"], &[]);
    assert_eq!(status.code, 1, "{status:?}");
    assert!(
        status.stdout.contains(
            "singularity default/default: neither apptainer nor singularity is on the PATH"
        ),
        "{}",
        status.stdout
    );
}

#[test]
fn egress_status_names_the_backends_the_proxy_cannot_cover() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: modal\n  modal_forward_env: [OPENAI_API_KEY]\n");
    let status = run(&home, &["egress", "status"], &[]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status
            .stdout
            .contains("Uncovered:       modal, daytona, vercel_sandbox"),
        "{}",
        status.stdout
    );
    // A provider key forwarded to Modal is a token there; Modal's outbound
    // policy sets the real key's header, so no warning of a real key.
    assert!(
        status.stdout.lines().any(
            |l| l.starts_with("OPENAI_API_KEY") && l.contains("service-side transform (modal)")
        ),
        "{}",
        status.stdout
    );
    assert!(
        !status
            .stdout
            .contains("the real key goes into modal sandboxes"),
        "{}",
        status.stdout
    );
    // Daytona has no such transform: the real key goes there, said so.
    home.write_config("terminal:\n  backend: daytona\n  daytona_forward_env: [OPENAI_API_KEY]\n");
    let daytona = run(&home, &["egress", "status"], &[]);
    assert_eq!(daytona.code, 0, "{daytona:?}");
    assert!(
        daytona.stdout.contains(
            "terminal.daytona_forward_env names OPENAI_API_KEY: the real key goes into daytona sandboxes"
        ),
        "{}",
        daytona.stdout
    );
    assert!(
        status.stdout.contains("terminal.backend is modal"),
        "{}",
        status.stdout
    );
}
