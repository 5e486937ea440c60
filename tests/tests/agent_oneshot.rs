//! Hermes Agent's own CLI in its one-shot mode (`hermes -z PROMPT`, the
//! real `hermes-agent` in the venv `scripts/test` makes) beside hermes, on
//! one home, against a local OpenAI-compatible model
//! (`tests/fixtures/fake-llm.py` on 127.0.0.1, a custom provider in the
//! agent's config.yaml): the model answers the prompt with a tool call and
//! the tool's result with a final text, and records every request it got.
//!
//! Two ways the agent reaches the sandbox hermes keeps: its own `terminal`
//! tool on its Docker backend, which takes hermes's container for task
//! `default` (the task the agent's top-level turn always runs its
//! terminal in), on a proxy-only network; and `hermesctl mcp` as an MCP
//! server of its `mcp_servers`, whose `terminal` tool the model calls.
//! Either way the command runs in hermes's one container, its file lands
//! in hermes's data directory on the host, and its output comes back
//! through the agent to the model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::agent::agent;
use hermes_tests::cli::{Run, TestHome, hermesctl_bin};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};
use hermes_tests::egress::{bridge_gateway, free_port_pair};
use serde_json::{Value, json};

/// Key-shaped, but no real key of anyone: what the home's `.env` holds
/// for the sandbox's proxy to stand in for.
const OPENAI_KEY: &str = "sk-proj-e2e-REAL-oneshot-0009";

/// How long one run of the agent may take (its start-up is slow on a
/// loaded host; a hung run is killed and fails the test).
const AGENT_DEADLINE: Duration = Duration::from_secs(300);

/// The model's final answer, which the agent prints on stdout.
const FINAL: &str = "fake-llm-final-answer-7d1c";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The local model: `tests/fixtures/fake-llm.py`, run by the agent's
/// venv's Python, killed when dropped.
struct FakeLlm {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl FakeLlm {
    /// Starts the model in `dir`, answering the first request with a call
    /// of `tool` with `arguments`, and the request with the tool's result
    /// with [`FINAL`]; waits (30 s at most) until it listens.
    fn start(dir: &Path, tool: &str, arguments: Value) -> FakeLlm {
        let script = dir.join("fake-llm-script.json");
        let port_file = dir.join("fake-llm.port");
        let log = dir.join("fake-llm-requests.jsonl");
        std::fs::write(
            &script,
            json!({"model": "fake-model", "tool": tool, "arguments": arguments, "final": FINAL})
                .to_string(),
        )
        .unwrap();
        let python = hermes_tests::agent::agent_hermes()
            .parent()
            .unwrap()
            .join("python");
        let stderr = std::fs::File::create(dir.join("fake-llm.stderr")).unwrap();
        let child = Command::new(python)
            .arg(fixture("fake-llm.py"))
            .arg(&script)
            .arg(&port_file)
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut llm = FakeLlm {
            child,
            port: 0,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        llm.port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                break port;
            }
            if let Some(status) = llm.child.try_wait().unwrap() {
                panic!("the fake model exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the fake model did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        llm
    }

    /// The agent's config.yaml section that makes this its model: a
    /// custom OpenAI-compatible endpoint on 127.0.0.1.
    fn model_yaml(&self) -> String {
        format!(
            "model:\n  provider: custom\n  base_url: http://127.0.0.1:{}/v1\n  default: fake-model\n  api_key: fake-llm-key\n  context_length: 128000\n",
            self.port
        )
    }

    /// The bodies of the chat completions requests it got, in order.
    fn chat_requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/chat/completions"))
            })
            .map(|r| r["body"].clone())
            .collect()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the tools a request offered the model.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The contents of a request's tool results (role `tool`), joined.
fn tool_results(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The agent's `hermes -z PROMPT -t TOOLSETS` on `home`, its output in
/// files of the home's root (no pipe to fill), killed after
/// [`AGENT_DEADLINE`]. Nothing of the test's own environment chooses its
/// model or reaches its proxy settings: the config does.
fn oneshot(home: &TestHome, prompt: &str, toolsets: &str) -> Run {
    let out_path = home.root().join("agent.stdout");
    let err_path = home.root().join("agent.stderr");
    let mut cmd = agent(home.path(), ["-z", prompt, "-t", toolsets]);
    for name in [
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENROUTER_API_KEY",
        "ANTHROPIC_API_KEY",
        "HERMES_INFERENCE_MODEL",
        "HERMES_INFERENCE_PROVIDER",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env_remove(name);
    }
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TERMINAL_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + AGENT_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the agent's one-shot run did not end within {AGENT_DEADLINE:?}:\n{}\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// A container's full id.
fn id_of(name: &str) -> String {
    docker(&["inspect", "--format", "{{.Id}}", name])
        .trim()
        .to_string()
}

/// Every container labelled for `profile`, whoever made it: `(name, id,
/// task)`, sorted by name.
fn all_containers_of(profile: &str) -> Vec<(String, String, String)> {
    let mut rows: Vec<(String, String, String)> = docker(&[
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        &format!("label=hermes-profile={profile}"),
        "--format",
        "{{.Names}} {{.ID}} {{.Label \"hermes-task-id\"}}",
    ])
    .lines()
    .filter_map(|l| {
        let mut words = l.split(' ');
        Some((
            words.next()?.to_string(),
            words.next()?.to_string(),
            words.next().unwrap_or_default().to_string(),
        ))
    })
    .collect();
    rows.sort();
    rows
}

/// The name of the proxy-only network hermes makes for `home`:
/// `hermes-egress-` and the first 4 bytes, in hex, of the SHA-256 of the
/// home's path with symlinks resolved (`controller/src/egress/network.rs`).
/// Known before any pass, so that the network goes with the test even
/// when no sandbox was made on it.
fn proxy_network_of(home: &TestHome) -> String {
    let path = std::fs::canonicalize(home.path()).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, path.as_os_str().as_encoded_bytes());
    let h: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("hermes-egress-{h}")
}

/// What a proxy-only network leaves on the host, removed however the test
/// ends: the proxy, the sandbox, the network and hermes's firewall rules.
struct NetworkCleanup<'a> {
    home: &'a TestHome,
    container: String,
    network: String,
}

impl Drop for NetworkCleanup<'_> {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let suffix = self.network.trim_start_matches("hermes-egress-");
        let (bridge, chain) = (format!("hermes-{suffix}"), format!("HERMES-{suffix}"));
        let iptables = |args: &[&str]| {
            // A rule may stand more than once: delete until it is gone.
            for _ in 0..8 {
                let out = Command::new("iptables").arg("-w").args(args).output();
                if !out.is_ok_and(|o| o.status.success()) {
                    break;
                }
            }
        };
        for parent in ["DOCKER-USER", "FORWARD"] {
            iptables(&[
                "-D",
                parent,
                "-i",
                &bridge,
                "-o",
                &bridge,
                "-j",
                "REJECT",
                "--reject-with",
                "icmp-port-unreachable",
            ]);
        }
        iptables(&["-D", "INPUT", "-i", &bridge, "-j", &chain]);
        iptables(&["-F", &chain]);
        iptables(&["-X", &chain]);
        hermes_tests::egress::remove_transparent_rules(&bridge, &chain);
    }
}

/// A service of the host on every address, answering `HOST-SERVICE`: what
/// a sandbox must not reach except through the proxy. Its port.
fn host_service() -> u16 {
    let service = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in service.incoming().flatten() {
            let _ = conn.write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 13\r\n\r\nHOST-SERVICE\n");
        }
    });
    port
}

/// `hermes reconcile` makes task `default`'s sandbox on a proxy-only
/// network (`proxy.enforce_network`); then the agent's `hermes -z`, its
/// terminal on the Docker backend, asks the fake model, which calls the
/// agent's own `terminal` tool. The command runs in hermes's container
/// (the same id before and after, its hostname, no other container for
/// task `default`, no change for hermes to make after), writes its file
/// into hermes's data directory on the host, sees the proxy's variables
/// and a proxy token in place of the key, and cannot reach a service of
/// the host directly, which a container on the default bridge reaches;
/// and that output is what the model got in its second request, whose
/// final answer the agent prints.
///
/// The one other container allowed is the agent's own: before the first
/// request its system prompt probes the backend (`uname`, `whoami`, ...)
/// through `DockerEnvironment` with task `prompt-backend-probe`, which
/// makes (and keeps, across processes) a container of the agent's on the
/// default bridge. The model's tool calls never run there; off the
/// enforced proxy-only network, it is hermes's next pass's to remove once
/// idle, and then nothing is left to change.
#[test]
fn the_agents_one_shot_mode_runs_its_tool_call_in_the_sandbox_hermes_keeps_behind_the_proxy() {
    let started = Instant::now();
    let profile = format!("aoz{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let port = free_port_pair(Some(bridge_gateway()));
    let service_port = host_service();
    let docker0 = bridge_gateway();
    let command = format!(
        "echo written-by-the-agent > /workspace/oneshot-marker; \
         env | grep -i proxy | sort; \
         echo \"KEY=$OPENAI_API_KEY\"; \
         echo \"HOSTNAME=$(cat /etc/hostname)\"; \
         curl -sS --noproxy '*' --max-time 5 http://{docker0}:{service_port}/ \
           && echo DIRECT-REACHED || echo DIRECT-FAILED"
    );
    let llm = FakeLlm::start(home.root(), "terminal", json!({ "command": command }));
    home.write_config(format!(
        "{}terminal:\n  backend: docker\n  docker_image: {}\nsecurity:\n  redact_secrets: false\nreconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n",
        llm.model_yaml(),
        hermes_tests::test_image()
    ));
    std::fs::write(
        home.path().join(".env"),
        format!("OPENAI_API_KEY={OPENAI_KEY}\n"),
    )
    .unwrap();

    let name = format!("hermes-{profile}-default");
    let network = proxy_network_of(&home);
    let _network = NetworkCleanup {
        home: &home,
        container: name.clone(),
        network: network.clone(),
    };
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    // The sandbox is on the home's proxy-only network, and on no other.
    let networks = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
        &name,
    ]);
    assert_eq!(networks.trim(), network);
    assert_eq!(
        docker(&["network", "inspect", "--format", "{{.Internal}}", &network]).trim(),
        "true"
    );
    let before = id_of(&name);

    let run = oneshot(
        &home,
        "Write the marker file and show the proxy.",
        "terminal",
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), FINAL, "{run:?}");

    // The same container, still running, and no other for the task. The
    // agent's system prompt probes its backend (OS, user, cwd) in a
    // container of a task of its own, `prompt-backend-probe` (removed by
    // the next pass, below); the tool call never runs there (its hostname
    // below is hermes's container's).
    assert_eq!(id_of(&name), before, "hermes's container was replaced");
    let all = all_containers_of(&profile);
    assert!(
        all.iter().all(|c| if c.0 == name {
            c.1 == before && c.2 == "default"
        } else {
            c.2 == "prompt-backend-probe"
        }),
        "a container besides hermes's and the agent's prompt probe: {all:?}"
    );
    assert!(
        containers_of(&profile).contains(&(name.clone(), "running".to_string())),
        "{:?}",
        containers_of(&profile)
    );
    // The file is in hermes's data directory for the task.
    let marker = home
        .path()
        .join("sandboxes/docker/default/workspace/oneshot-marker");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "written-by-the-agent\n",
        "{}",
        marker.display()
    );

    // What the model got: the terminal tool offered, then its output.
    let requests = llm.chat_requests();
    assert!(requests.len() >= 2, "{requests:#?}");
    assert!(
        offered(&requests[0]).iter().any(|t| t == "terminal"),
        "{:?}",
        offered(&requests[0])
    );
    // The agent's terminal tool gives the model `{output, exit_code, ...}`.
    let result = tool_results(requests.last().unwrap());
    let parsed: Value = serde_json::from_str(&result)
        .unwrap_or_else(|e| panic!("{e}: not the terminal tool's JSON:\n{result}"));
    assert_eq!(parsed["exit_code"], 0, "{result}");
    let output = parsed["output"].as_str().unwrap_or_default().to_string();
    assert!(
        output
            .lines()
            .any(|l| l.starts_with("HTTPS_PROXY=http://") || l.starts_with("https_proxy=http://")),
        "the model did not get the proxy's variables:\n{result}"
    );
    let token = output
        .lines()
        .find_map(|l| l.strip_prefix("KEY="))
        .unwrap_or_else(|| panic!("no KEY= line:\n{result}"));
    assert!(token.starts_with("openai-"), "{result}");
    assert!(!result.contains(OPENAI_KEY), "the key reached the model");
    let hostname = docker(&["inspect", "--format", "{{.Config.Hostname}}", &name]);
    assert!(
        output
            .lines()
            .any(|l| l.strip_prefix("HOSTNAME=") == Some(hostname.trim())),
        "the command ran elsewhere than {name} ({}):\n{result}",
        hostname.trim()
    );
    assert!(
        output.contains("DIRECT-FAILED")
            && !output.contains("DIRECT-REACHED")
            && !output.contains("HOST-SERVICE"),
        "the agent's command reached a service of the host directly:\n{result}"
    );
    // The control: the same service is reachable from the default bridge.
    let control = docker(&[
        "run",
        "--rm",
        &hermes_tests::test_image(),
        "curl",
        "-sS",
        "--max-time",
        "5",
        &format!("http://{docker0}:{service_port}/"),
    ]);
    assert_eq!(control.trim(), "HOST-SERVICE");

    // The agent's probe, idle off the enforced network, is the one thing
    // a pass changes after the agent's run; then nothing is left.
    let probing = all_containers_of(&profile)
        .iter()
        .any(|c| c.2 == "prompt-backend-probe");
    if probing {
        let dry = home.run(["reconcile", "--dry-run"]);
        assert_eq!(dry.code, 2, "{dry:?}");
        assert!(
            dry.stdout.contains(
                "Hermes Agent's backend probe, idle, off the proxy-only network while proxy.enforce_network is on"
            ),
            "{dry:?}"
        );
        let applied = home.run(["reconcile"]);
        assert_eq!(applied.code, 0, "{applied:?}");
    }
    let all = all_containers_of(&profile);
    assert_eq!(
        all.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        [name.as_str()],
        "{all:?}"
    );
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    eprintln!(
        "one-shot through the agent's terminal: {:?}",
        started.elapsed()
    );
}

/// `hermes reconcile` makes task `default`'s sandbox; the agent's config
/// lists `hermesctl mcp --task default` as its MCP server `sandbox`, and
/// its `hermes -z` with only that server's tools (`-t sandbox`) asks the
/// fake model, which calls `mcp__sandbox__terminal`, our MCP server's
/// `terminal`. The agent's MCP client (the `mcp` package of
/// `hermes-agent[mcp]`) spawns our server over stdio as the user's config
/// says and calls the tool; the command runs in hermes's container (the
/// same id, the only container of the profile), its file lands in
/// hermes's data directory, and its output and exit code reach the model
/// in its second request. The CLI is driven as a user runs it, nothing of
/// the agent's MCP client is called directly.
#[test]
fn the_agents_one_shot_mode_calls_hermesctl_mcp_from_its_mcp_servers() {
    let started = Instant::now();
    let python = hermes_tests::agent::agent_hermes()
        .parent()
        .unwrap()
        .join("python");
    let has_mcp = Command::new(&python)
        .args(["-c", "import mcp"])
        .output()
        .unwrap();
    assert!(
        has_mcp.status.success(),
        "the agent's venv has no `mcp` package (the `hermes-agent[mcp]` extra): run \
         scripts/test, which makes the venv with it"
    );
    let profile = format!("aom{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let command =
        "echo through-mcp > /workspace/mcp-marker; echo \"MCP-SUM-$((6 * 7))\"; cat /etc/hostname";
    let llm = FakeLlm::start(
        home.root(),
        "mcp__sandbox__terminal",
        json!({ "command": command }),
    );
    home.write_config(format!(
        "{}terminal:\n  backend: docker\n  docker_image: {}\nmcp_servers:\n  sandbox:\n    command: {}\n    args: [mcp, --task, default]\n    env:\n      HERMES_HOME: {}\n    connect_timeout: 120\n    timeout: 240\n",
        llm.model_yaml(),
        hermes_tests::test_image(),
        hermesctl_bin().display(),
        home.path().display()
    ));
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let name = format!("hermes-{profile}-default");
    let before = id_of(&name);

    let run = oneshot(
        &home,
        "Write the marker file through the sandbox.",
        "sandbox",
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), FINAL, "{run:?}");

    let requests = llm.chat_requests();
    assert!(requests.len() >= 2, "{requests:#?}");
    let tools = offered(&requests[0]);
    assert!(
        tools.iter().any(|t| t == "mcp__sandbox__terminal"),
        "our MCP server's terminal was not offered: {tools:?}"
    );
    assert!(
        !tools.iter().any(|t| t == "terminal"),
        "the agent's own terminal was offered too: {tools:?}"
    );
    let result = tool_results(requests.last().unwrap());
    assert!(
        result.contains("MCP-SUM-42"),
        "the tool's output did not reach the model:\n{result}"
    );
    // Our server's result, `{output, exit_code, cwd}`, as the model got
    // it: the agent wraps an MCP tool's text as `{"result": TEXT}` inside
    // its `<untrusted_tool_result>` block.
    let wrapped = result
        .find("{\"result\"")
        .map(|at| &result[at..])
        .map(|rest| {
            rest.split("\n</untrusted_tool_result>")
                .next()
                .unwrap_or(rest)
        })
        .unwrap_or_else(|| panic!("no {{\"result\": ...}} in the tool's result:\n{result}"));
    let text: Value =
        serde_json::from_str(wrapped.trim()).unwrap_or_else(|e| panic!("{e}: {wrapped}\n{result}"));
    let ours: Value = serde_json::from_str(text["result"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: not our terminal's JSON:\n{result}"));
    assert_eq!(ours["exit_code"], 0, "{result}");
    let hostname = docker(&["inspect", "--format", "{{.Config.Hostname}}", &name]);
    assert!(
        ours["output"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .any(|l| l == hostname.trim()),
        "the command ran elsewhere than {name} ({}):\n{result}",
        hostname.trim()
    );

    assert_eq!(id_of(&name), before, "hermes's container was replaced");
    assert_eq!(
        all_containers_of(&profile),
        vec![(name.clone(), before.clone(), "default".to_string())],
        "a container besides hermes's"
    );
    let marker = home
        .path()
        .join("sandboxes/docker/default/workspace/mcp-marker");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "through-mcp\n",
        "{}",
        marker.display()
    );
    eprintln!("one-shot through hermesctl mcp: {:?}", started.elapsed());
}
