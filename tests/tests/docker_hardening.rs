//! Hardening where an image or the config asks otherwise, on a real
//! engine: an s6-overlay image (its `/init` must be PID 1 and exec from
//! `/run`, as Hermes Agent's own image does) starts without the engine's
//! init and with an exec `/run`, whoever makes its container; and
//! `docker_run_as_host_user` starts a sandbox as this process's user
//! without the capabilities a drop from root needs.
//!
//! The s6 image is a stand-in built here from the test image (no registry
//! is reached): its `/init` fails as s6-overlay's stage 0 does when it is
//! not PID 1 (exit 100) or cannot exec from `/run` (exit 126), then execs
//! the command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

/// The stand-in's `/init`.
const S6_INIT: &str = r#"#!/bin/sh
# As s6-overlay's stage 0: PID 1 only, and it execs from /run.
if [ "$$" != 1 ]; then
    echo "s6-overlay-suexec: fatal: can only run as pid 1" >&2
    exit 100
fi
cp /bin/true /run/s6-stage0 && /run/s6-stage0 || {
    echo "s6-overlay: fatal: cannot exec from /run" >&2
    exit 126
}
echo s6-started > /run/s6-ok
exec "$@"
"#;

/// The s6 stand-in's tag, built once per run from the test image.
fn s6_image() -> &'static str {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT.get_or_init(|| {
        let tag = "hermes-test-s6init:1".to_string();
        let ctx = tempfile::tempdir().unwrap();
        std::fs::write(
            ctx.path().join("Dockerfile"),
            format!(
                "FROM {}\nCOPY init /init\nRUN chmod 0755 /init\nENTRYPOINT [\"/init\"]\n",
                hermes_tests::test_image()
            ),
        )
        .unwrap();
        std::fs::write(ctx.path().join("init"), S6_INIT).unwrap();
        let out = Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(ctx.path())
            // The classic builder: the base is local, nothing is pulled.
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .unwrap();
        assert!(out.status.success(), "building the s6 stand-in: {out:?}");
        tag
    })
}

fn home(tag: &str, config: &str) -> (TestHome, String, ProfileCleanup) {
    let profile = format!("{tag}{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    home.write_config(config);
    let cleanup = ProfileCleanup(profile.clone());
    (home, profile, cleanup)
}

fn inspect(name: &str, format: &str) -> String {
    docker(&["inspect", "--format", format, name])
        .trim()
        .to_string()
}

#[test]
fn hermes_starts_an_s6_overlay_image_without_the_engine_s_init_and_with_an_exec_run() {
    let image = s6_image();
    let (home, profile, _cleanup) = home(
        "s6h",
        &format!("terminal:\n  backend: docker\n  docker_image: {image}\n"),
    );
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let name = format!("hermes-{profile}-default");
    assert_eq!(
        inspect(&name, "{{.State.Status}} {{.HostConfig.Init}}"),
        "running false",
        "{}",
        docker(&["logs", &name])
    );
    let run = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "cat /run/s6-ok; echo pid1=$(cat /proc/1/comm)",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "s6-started\npid1=sleep\n");
    // The rest of the hardening stands.
    assert_eq!(
        inspect(&name, "{{index .HostConfig.Tmpfs \"/run\"}}"),
        "rw,exec,nosuid,size=64m"
    );
    assert_eq!(
        inspect(&name, "{{.HostConfig.SecurityOpt}}"),
        "[no-new-privileges]"
    );
    // Converged: the image's init is not a drift.
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    // The plain image keeps the engine's init and a noexec /run.
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n",
        hermes_tests::test_image()
    ));
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(
        inspect(
            &name,
            "{{.HostConfig.Init}} {{index .HostConfig.Tmpfs \"/run\"}}"
        ),
        "true rw,noexec,nosuid,size=64m"
    );
}

#[test]
fn an_s6_overlay_container_of_the_agent_s_is_not_recreated_for_its_init() {
    let image = s6_image();
    let (home, profile, _cleanup) = home(
        "s6a",
        &format!("terminal:\n  backend: docker\n  docker_image: {image}\n"),
    );
    let python = hermes_tests::agent::agent_hermes()
        .parent()
        .unwrap()
        .join("python");
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agent-docker-env.py");
    let out = Command::new(python)
        .arg(driver)
        .args(["default", image, "cat /run/s6-ok"])
        .env("HERMES_HOME", home.path())
        .env_remove("TERMINAL_SANDBOX_DIR")
        .env_remove("HERMES_PROFILE")
        .output()
        .unwrap();
    assert!(out.status.success(), "the agent's process failed: {out:?}");
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(made["results"][0]["output"], "s6-started\n", "{made}");
    let dry = home.run(["reconcile", "--dry-run"]);
    let line = dry
        .stdout
        .lines()
        .find(|l| l.contains("made by Hermes Agent"))
        .unwrap_or_else(|| panic!("{dry:?}"))
        .to_string();
    assert!(
        !line.contains("init") && !line.contains("tmpfs /run"),
        "the image's init counted as a difference: {line}"
    );
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(containers_of(&profile).len(), 1);
    let run = home.run(["exec", "--", "cat", "/run/s6-ok"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "s6-started\n"),
        "{run:?}"
    );
}

#[test]
fn run_as_host_user_starts_the_sandbox_as_this_user_without_the_drop_capabilities() {
    let (home, profile, _cleanup) = home(
        "rhu",
        &format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n  docker_run_as_host_user: true\n",
            hermes_tests::test_image()
        ),
    );
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let name = format!("hermes-{profile}-default");
    let me = format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid());
    assert_eq!(inspect(&name, "{{.Config.User}}"), me);
    let caps = inspect(&name, "{{.HostConfig.CapAdd}}");
    assert!(
        caps.contains("CHOWN") && !caps.contains("SETUID") && !caps.contains("SETGID"),
        "{caps}"
    );
    let run = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "id -u; id -g; touch /workspace/mine",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let (uid, gid) = me.split_once(':').unwrap();
    assert_eq!(run.stdout, format!("{uid}\n{gid}\n"));
    use std::os::unix::fs::MetadataExt;
    let file = home.path().join("sandboxes/docker/default/workspace/mine");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(format!("{}:{}", meta.uid(), meta.gid()), me);
    // Turned off: the sandbox is recreated with the image's user.
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n",
        hermes_tests::test_image()
    ));
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(dry.stdout.contains("recreate"), "{dry:?}");
}
