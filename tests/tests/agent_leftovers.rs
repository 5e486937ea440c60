//! What Hermes Agent leaves on a host that hermes keeps, against the real
//! agent (its package in the venv `scripts/test` makes) and a real engine:
//! the backend probe each start of its CLI leaves running is reaped once
//! idle, never while a command runs in it; its own `docker exec`s count as
//! use of a sandbox; and a session's end waits for the command running in
//! what it removes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// The task of the agent's backend probe (`agent/prompt_builder.py`).
const PROBE_TASK: &str = "prompt-backend-probe";

fn home(tag: &str, extra: &str) -> (TestHome, String, ProfileCleanup) {
    hermes_tests::docker_cli::docker_home(tag, extra)
}

/// Runs the agent's own backend probe, as a start of its CLI does
/// (`_probe_remote_backend("docker")`, with the terminal settings its CLI
/// exports), on `home`; returns the id of the container it left.
fn agent_probes(home: &TestHome, profile: &str) -> String {
    let python = hermes_tests::agent::agent_hermes()
        .parent()
        .unwrap()
        .join("python");
    let out = Command::new(python)
        .args([
            "-c",
            "import sys\n\
             from agent.prompt_builder import _probe_remote_backend\n\
             sys.exit(0 if _probe_remote_backend('docker') else 1)",
        ])
        .env("HERMES_HOME", home.path())
        .env("TERMINAL_ENV", "docker")
        .env("TERMINAL_DOCKER_IMAGE", hermes_tests::test_image())
        .env_remove("TERMINAL_SANDBOX_DIR")
        .env_remove("HERMES_PROFILE")
        .output()
        .unwrap();
    assert!(out.status.success(), "the agent's probe failed: {out:?}");
    let id = probe_of(profile).expect("the agent's probe left no container");
    assert_eq!(
        docker(&["inspect", "--format", "{{.State.Status}}", &id]).trim(),
        "running",
        "the probe is expected to stay running, as the agent leaves it"
    );
    id
}

/// The id of the profile's probe container, if there is one.
fn probe_of(profile: &str) -> Option<String> {
    let out = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=hermes-profile={profile}"),
        "--filter",
        &format!("label=hermes-task-id={PROBE_TASK}"),
    ]);
    out.lines().next().map(str::to_string)
}

/// The plan line of the probe in a run's output.
fn probe_line<'a>(run: &'a Run, profile: &str) -> Option<&'a str> {
    let target = format!("sandbox {profile}/{PROBE_TASK} ");
    run.stdout.lines().find(|l| l.contains(&target))
}

#[test]
fn the_agent_s_backend_probe_goes_once_idle_and_its_docker_exec_counts_as_use() {
    let (home, profile, _cleanup) = home("agp", "  lifetime_seconds: 8\n");
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let probe = agent_probes(&home, &profile);
    let started = Instant::now();
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    let line = probe_line(&dry, &profile).unwrap_or_else(|| panic!("{dry:?}"));
    assert!(
        line.contains("Hermes Agent's backend probe, running; removed once idle for 8s"),
        "{line}"
    );

    // Idle past the limit since its start, then used the agent's way (an
    // engine exec hermes does not record): not idle.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(started.elapsed()));
    docker(&["exec", &probe, "true"]);
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    let line = probe_line(&dry, &profile).unwrap_or_else(|| panic!("{dry:?}"));
    assert!(
        line.starts_with("? ") && line.contains("unmanaged"),
        "the agent's exec a moment ago did not count as use: {line}"
    );

    // Idle past the limit since that exec: the plan removes it, and the
    // pass does.
    let deadline = Instant::now() + Duration::from_secs(40);
    let planned = loop {
        let dry = home.run(["reconcile", "--dry-run"]);
        let line = probe_line(&dry, &profile).unwrap_or_default().to_string();
        if line.starts_with("- ") {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "the idle probe was never planned to go: {dry:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        planned.contains("Hermes Agent's backend probe, idle")
            && planned.contains("(> 8s, terminal.lifetime_seconds)"),
        "{planned}"
    );
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(probe_of(&profile), None, "{applied:?}");
    // hermes's own sandbox for the task it keeps warm is untouched.
    let ours = docker(&[
        "inspect",
        "--format",
        "{{.State.Status}}",
        &format!("hermes-{profile}-default"),
    ]);
    assert_eq!(ours.trim(), "running");
}

#[test]
fn the_agent_s_backend_probe_is_never_removed_while_a_command_runs_in_it() {
    let (home, profile, _cleanup) = home("agb", "  lifetime_seconds: 1\n");
    let probe = agent_probes(&home, &profile);
    docker(&["exec", "-d", &probe, "sleep", "120"]);
    // Past the limit since the command started (its start is use too).
    std::thread::sleep(Duration::from_secs(3));
    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let line = probe_line(&applied, &profile).unwrap_or_else(|| panic!("{applied:?}"));
    assert!(
        line.contains("busy") && line.contains("Hermes Agent's backend probe runs 1 command"),
        "{line}"
    );
    assert_eq!(probe_of(&profile).as_deref(), Some(probe.as_str()));
}

#[test]
fn a_session_s_end_waits_for_the_command_running_in_it() {
    let (home, profile, _cleanup) = home("ags", "");
    let exec = home
        .command([
            "exec",
            "--session",
            "s1",
            "--",
            "sh",
            "-c",
            "sleep 4; echo finished",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The session's container runs the command.
    let name = format!("label=hermes-profile={profile}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = home.run(["session", "list", "--output", "json"]);
        let rows: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap_or_default();
        let busy = rows["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["session"] == "s1" && r["processes"].as_u64().unwrap_or(0) > 0);
        if busy {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session's command never ran: {listed:?} {}",
            docker(&["ps", "-a", "--filter", &name])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ended = home.run(["session", "end", "s1"]);
    assert_eq!(ended.code, 0, "{ended:?}");
    assert!(
        ended
            .stdout
            .contains("session s1 ended by hand; waits up to 10s for the"),
        "{ended:?}"
    );
    let out = exec.wait_with_output().unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "finished\n"),
        "the command was stopped under it: {out:?}"
    );
    let left = docker(&[
        "ps",
        "-aq",
        "--filter",
        &name,
        "--filter",
        "label=hermes-session=s1",
    ]);
    assert_eq!(left.trim(), "", "the session's container is still there");
}
