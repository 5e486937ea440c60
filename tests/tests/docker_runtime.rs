//! `terminal.docker_runtime` against the real engine: a runtime the
//! engine does not list blocks the sandbox at plan time (and `hermes
//! exec`), naming the runtimes it has and how to register one, and makes
//! nothing; `runc`
//! named explicitly is the sandbox of before the key (the container the
//! default made is kept, not recreated).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::docker_cli::docker_home;

#[test]
fn a_runtime_the_engine_lacks_blocks_the_sandbox_and_runc_changes_nothing() {
    let (home, profile, _cleanup) =
        docker_home("rt", "  docker_runtime: hermes-test-no-such-runtime\n");
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(
            "blocked     the Docker engine has no runtime hermes-test-no-such-runtime (it has: "
        ) && dry.stdout.contains("runc")
            && dry.stdout.contains("/etc/docker/daemon.json"),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_ne!(apply.code, 0, "{apply:?}");
    // `hermes exec` refuses the same way, before making anything.
    let exec = hermes(&["exec", "--", "true"]);
    assert_ne!(exec.code, 0, "{exec:?}");
    assert!(
        exec.stderr
            .contains("the Docker engine has no runtime hermes-test-no-such-runtime"),
        "{exec:?}"
    );
    let made = hermes_tests::docker_cli::docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=hermes-profile={profile}"),
    ]);
    assert!(made.trim().is_empty(), "nothing made: {made}");

    // The default, then runc by name: one container, never recreated.
    let default = format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n",
        hermes_tests::test_image()
    );
    home.write_config(&default);
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    home.write_config(format!("{default}  docker_runtime: runc\n"));
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "runc is the default's spec: {dry:?}");
}

/// runc to gVisor and back: each a planned recreate that says so, the
/// sandbox's files kept; the runtime shown by `sandbox list` and `status`
/// (text and JSON), and the kernel inside the one the runtime gives.
#[test]
fn a_runtime_change_is_a_planned_recreate_that_keeps_the_files() {
    let runsc = hermes_tests::runsc_runtime();
    let (home, profile, _cleanup) = docker_home("rtc", "");
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let base = home.read_config();
    let host_kernel = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap()
        .stdout;
    let host_kernel = String::from_utf8(host_kernel).unwrap().trim().to_string();
    // The files are there, and the kernel is the host's unless gVisor's.
    let kernel = |gvisor: bool| {
        let run = hermes(&[
            "exec",
            "--",
            "sh",
            "-c",
            "cat /workspace/kept /root/kept; uname -r",
        ]);
        assert_eq!(run.code, 0, "{run:?}");
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines[..2], ["w", "r"], "{run:?}");
        assert_eq!(lines[2] == host_kernel, !gvisor, "{run:?}");
    };
    let made = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo w > /workspace/kept; echo r > /root/kept",
    ]);
    assert_eq!(made.code, 0, "{made:?}");
    kernel(false);

    home.write_config(format!("{base}  docker_runtime: {runsc}\n"));
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "recreate    docker_runtime the engine's default (runc) → {runsc} (forces recreate)"
        )),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    kernel(true);
    let list = hermes(&["sandbox", "list"]);
    let name = format!("hermes-{profile}-default");
    let row = list.stdout.lines().find(|l| l.starts_with(&name)).unwrap();
    assert!(
        row.split_whitespace().any(|c| c == runsc),
        "{}",
        list.stdout
    );
    let list = hermes(&["sandbox", "list", "--output", "json"]);
    let json: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(json["sandboxes"][0]["runtime"], runsc.as_str(), "{json}");
    let status = hermes(&["status", "--output", "json"]);
    let json: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(json["sandboxes"][0]["runtime"], runsc.as_str(), "{json}");
    let status = hermes(&["status"]);
    assert!(
        status
            .stdout
            .contains(&format!("{name}  running  runtime {runsc}  spec current")),
        "{}",
        status.stdout
    );

    home.write_config(&base);
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert!(
        dry.stdout.contains(&format!(
            "recreate    docker_runtime {runsc} → the engine's default (runc) (forces recreate)"
        )),
        "{}",
        dry.stdout
    );
    assert_eq!(hermes(&["reconcile"]).code, 0);
    kernel(false);
    let list = hermes(&["sandbox", "list", "--output", "json"]);
    let json: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(json["sandboxes"][0]["runtime"], "runc", "{json}");
}
