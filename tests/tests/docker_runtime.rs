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
