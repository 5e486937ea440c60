//! One host, two programs: Hermes Agent's own Docker backend (its
//! `DockerEnvironment`, from the real `hermes-agent` package in the venv
//! `scripts/test` makes) and hermes, on one home, in both orders. Either
//! finds the other's sandbox for the task: one container at the end of
//! every pass, the files of `/workspace` and `/root` seen by both, no
//! flapping when the two alternate; and the agent's own commands go
//! through the egress proxy hermes keeps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};
use hermes_tests::egress::{bridge_gateway, free_port_pair};
use hermes_tests::upstream::Upstream;

const OPENAI_KEY: &str = "sk-proj-e2e-REAL-openai-0007";

/// The driver of the agent's `DockerEnvironment` (tests/fixtures).
fn driver() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agent-docker-env.py")
}

/// The agent's venv's Python.
fn agent_python() -> PathBuf {
    let hermes = hermes_tests::agent::agent_hermes();
    hermes.parent().unwrap().join("python")
}

/// What one process of the agent did: the container it ran in, and each
/// command's output and exit code.
struct AgentRun {
    container: String,
    results: Vec<(String, i64)>,
}

/// One process of Hermes Agent on `home` (as its `HERMES_HOME`), running
/// `cmds` in task `default`'s sandbox through its own Docker backend.
fn agent_runs(home: &TestHome, cmds: &[&str]) -> AgentRun {
    let out = Command::new(agent_python())
        .arg(driver())
        .arg("default")
        .arg(hermes_tests::test_image())
        .args(cmds)
        .env("HERMES_HOME", home.path())
        .env_remove("TERMINAL_SANDBOX_DIR")
        .env_remove("HERMES_PROFILE")
        .output()
        .unwrap();
    assert!(out.status.success(), "the agent's process failed: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    AgentRun {
        // The agent keeps a reused container's short id, a made one's long.
        container: v["container"].as_str().unwrap()[..12].to_string(),
        results: v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["output"].as_str().unwrap_or_default().to_string(),
                    r["code"].as_i64().unwrap_or(-1),
                )
            })
            .collect(),
    }
}

fn home(tag: &str, extra: &str) -> (TestHome, String, ProfileCleanup) {
    hermes_tests::docker_cli::docker_home(tag, extra)
}

/// A container's short id (12 hex digits).
fn id_of(name: &str) -> String {
    docker(&["inspect", "--format", "{{.Id}}", name]).trim()[..12].to_string()
}

fn hermes(home: &TestHome, args: &[&str]) -> Run {
    home.run(args)
}

/// The first line of the kernel's log inside the sandbox: gVisor's own
/// ("Starting gVisor...") under runsc, nothing under runc (denied).
const KERNEL_LOG: &str = "dmesg 2>/dev/null | head -n 1; true";

#[test]
fn hermes_first_the_agent_reuses_its_sandbox_and_both_see_the_files() {
    hermes_first("agh", "");
}

#[test]
fn hermes_first_under_gvisor_the_agent_s_commands_run_in_its_gvisor_sandbox() {
    hermes_first(
        "agg",
        &format!("  docker_runtime: {}\n", hermes_tests::runsc_runtime()),
    );
}

fn hermes_first(tag: &str, extra: &str) {
    let (home, profile, _cleanup) = home(tag, extra);
    let apply = hermes(&home, &["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let ours = id_of(&format!("hermes-{profile}-default"));
    let run = agent_runs(
        &home,
        &["echo from-agent > /workspace/a; echo ok", KERNEL_LOG],
    );
    assert_eq!(run.container, ours, "the agent made a container of its own");
    assert_eq!(run.results[0], ("ok\n".to_string(), 0));
    let gvisor = run.results[1].0.contains("gVisor");
    assert_eq!(gvisor, !extra.is_empty(), "{:?}", run.results[1]);
    let read = hermes(&home, &["exec", "--", "cat", "/workspace/a"]);
    assert_eq!(
        (read.code, read.stdout.as_str()),
        (0, "from-agent\n"),
        "{read:?}"
    );
    // The data is where the agent keeps it.
    let file = home.path().join("sandboxes/docker/default/workspace/a");
    assert_eq!(std::fs::read_to_string(file).unwrap(), "from-agent\n");
    assert_eq!(containers_of(&profile).len(), 1);
    let dry = hermes(&home, &["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
}

#[test]
fn the_agent_first_hermes_adopts_its_sandbox_with_its_files_and_the_two_alternate_without_flapping()
{
    let (home, profile, _cleanup) = home("aga", "");
    let first = agent_runs(
        &home,
        &["echo in-workspace > /workspace/w; echo in-home > /root/h; echo ok"],
    );
    assert_eq!(first.results[0].1, 0);
    let dry = hermes(&home, &["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("recreate    container hermes-")
            && dry.stdout.contains("made by Hermes Agent")
            && dry.stdout.contains("are the task's data and are kept"),
        "{}",
        dry.stdout
    );
    let apply = hermes(&home, &["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let now = containers_of(&profile);
    assert_eq!(now.len(), 1, "{now:?}");
    let ours = id_of(&format!("hermes-{profile}-default"));
    assert_ne!(
        ours, first.container,
        "the agent's container is still there"
    );
    let read = hermes(
        &home,
        &["exec", "--", "sh", "-c", "cat /workspace/w /root/h"],
    );
    assert_eq!(read.stdout, "in-workspace\nin-home\n", "{read:?}");
    // Alternating: the agent's next processes take hermes's container,
    // and hermes has nothing to do after either.
    for round in 0..2 {
        let again = agent_runs(&home, &["cat /workspace/w"]);
        assert_eq!(again.container, ours, "round {round}");
        assert_eq!(again.results[0], ("in-workspace\n".to_string(), 0));
        let dry = hermes(&home, &["reconcile", "--dry-run"]);
        assert_eq!(dry.code, 0, "round {round}: {dry:?}");
        assert_eq!(containers_of(&profile).len(), 1, "round {round}");
    }
}

#[test]
fn the_agent_s_own_commands_go_through_the_proxy_with_a_token_never_the_key() {
    through_the_proxy("age", None);
}

#[test]
fn under_gvisor_the_agent_s_own_commands_go_through_the_proxy_with_a_token_never_the_key() {
    through_the_proxy("agv", Some(&hermes_tests::runsc_runtime()));
}

fn through_the_proxy(tag: &str, runtime: Option<&str>) {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["api.openai.com"]);
    let port = free_port_pair(Some(bridge_gateway()));
    let profile = format!("{tag}{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let ca = home.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let runtime_line = runtime
        .map(|r| format!("  docker_runtime: {r}\n"))
        .unwrap_or_default();
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n{runtime_line}security:\n  redact_secrets: false\nproxy:\n  enabled: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    api.openai.com: 127.0.0.1\n",
        hermes_tests::test_image(),
        ca.display()
    ));
    std::fs::write(
        home.path().join(".env"),
        format!("OPENAI_API_KEY={OPENAI_KEY}\n"),
    )
    .unwrap();
    let apply = hermes(&home, &["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let upstream_port = upstream.addr.port();
    // An SDK-shaped call, as the agent's terminal tool runs it: the
    // OpenAI chat completions endpoint with the key from the environment.
    let call = format!(
        "python3 - <<'PY'\n\
import json, os, urllib.request\n\
body = json.dumps({{'model': 'm', 'messages': [{{'role': 'user', 'content': 'hi'}}]}}).encode()\n\
req = urllib.request.Request('https://api.openai.com:{upstream_port}/echo/v1/chat/completions', data=body,\n\
    headers={{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'}})\n\
print(urllib.request.urlopen(req, timeout=20).read().decode())\n\
PY"
    );
    let run = agent_runs(
        &home,
        &[
            "printenv HTTPS_PROXY https_proxy SSL_CERT_FILE REQUESTS_CA_BUNDLE NODE_EXTRA_CA_CERTS",
            "printenv OPENAI_API_KEY",
            &call,
            KERNEL_LOG,
        ],
    );
    assert_eq!(
        run.results[3].0.contains("gVisor"),
        runtime.is_some(),
        "{:?}",
        run.results[3]
    );
    let _stop = StopProxy(&home);
    let (env, code) = &run.results[0];
    assert_eq!(*code, 0, "{env}");
    let lines: Vec<&str> = env.lines().collect();
    assert_eq!(lines.len(), 5, "{env}");
    assert!(
        lines[0].starts_with("http://host.docker.internal:"),
        "{env}"
    );
    assert_eq!(lines[0], lines[1]);
    assert!(
        lines[2..]
            .iter()
            .all(|l| l.ends_with("hermes-egress-ca.crt")),
        "{env}"
    );
    let (token, _) = &run.results[1];
    assert!(token.trim().starts_with("openai-"), "{token}");
    assert!(!token.contains(OPENAI_KEY));
    let (answer, code) = &run.results[2];
    assert_eq!(*code, 0, "{answer}");
    let echo: serde_json::Value = serde_json::from_str(answer.trim()).unwrap();
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {OPENAI_KEY}")
    );
    // Neither the container nor its files hold the key.
    let inspect = docker(&["inspect", &format!("hermes-{profile}-default")]);
    assert!(!inspect.contains(OPENAI_KEY));
    assert!(
        inspect.contains("BASH_ENV=/etc/hermes-egress/env/tokens.sh"),
        "{inspect}"
    );
}

/// Stops the home's proxy when dropped.
struct StopProxy<'a>(&'a TestHome);

impl Drop for StopProxy<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(["egress", "stop"]);
    }
}
