//! `hermes mcp`, driven by the official MCP clients: the Python SDK
//! (`mcp` from PyPI, in a virtualenv cached under the target directory)
//! and the TypeScript SDK (`@modelcontextprotocol/sdk` from npm, cached
//! there too), each spawning `hermes mcp` over stdio against the real
//! Docker engine; the streamable HTTP transport's token, over a raw
//! socket; and, in raw JSON-RPC over stdio on the local backend, what
//! the server itself sends: its name and every tool's schema.
//!
//! The clients run `tests/clients/mcp_client.{py,mjs}`: a list of steps
//! in, one JSON list of results out; the assertions are here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hermes_tests::cli::{TestHome, hermes_bin};
use hermes_tests::docker_cli::ProfileCleanup;
use serde_json::{Value, json};

/// Key-shaped, but no real key of anyone.
const FAKE_ANTHROPIC: &str = "sk-ant-api03-hermesTESTvalueNOTaKEY0123456789abcdef";

/// How long one client run may take.
const CLIENT_DEADLINE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
enum Client {
    Python,
    TypeScript,
}

/// The SDKs' versions, pinned: a new release is taken on purpose.
const PYTHON_SDK_VERSION: &str = "2.3.0";
const TYPESCRIPT_SDK_VERSION: &str = "1.32.2";

fn clients_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("mcp-clients")
}

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients")
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The virtualenv's python, with the SDK installed (once per run; kept
/// under the target directory for the next).
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = clients_dir().join(format!("venv-mcp-{PYTHON_SDK_VERSION}"));
            let python = venv.join("bin/python");
            let ready = Command::new(&python)
                .args(["-c", "import mcp"])
                .output()
                .is_ok_and(|o| o.status.success());
            if !ready {
                std::fs::create_dir_all(clients_dir()).unwrap();
                run_ok(
                    Command::new("python3").args(["-m", "venv"]).arg(&venv),
                    "python3 -m venv",
                );
                run_ok(
                    Command::new(venv.join("bin/pip")).args([
                        "install",
                        "--quiet",
                        &format!("mcp=={PYTHON_SDK_VERSION}"),
                    ]),
                    "pip install mcp",
                );
            }
            python
        })
        .clone()
}

/// The directory holding the TypeScript SDK and the client script: made
/// in a temporary directory renamed into place once complete, so that a
/// run never takes a half-made one (an interrupted install, another
/// process's install under way) for the SDK.
fn node_dir() -> PathBuf {
    static NODE: OnceLock<PathBuf> = OnceLock::new();
    NODE.get_or_init(|| {
        let dir = clients_dir().join(format!("node-sdk-{TYPESCRIPT_SDK_VERSION}"));
        if !dir.join(".complete").exists() {
            std::fs::create_dir_all(clients_dir()).unwrap();
            let making = clients_dir().join(format!("node.making-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&making);
            std::fs::create_dir_all(&making).unwrap();
            std::fs::write(making.join("package.json"), "{\"private\": true}\n").unwrap();
            run_ok(
                Command::new("npm")
                    .args([
                        "install",
                        "--silent",
                        "--no-audit",
                        "--no-fund",
                        &format!("@modelcontextprotocol/sdk@{TYPESCRIPT_SDK_VERSION}"),
                    ])
                    .current_dir(&making),
                "npm install @modelcontextprotocol/sdk",
            );
            std::fs::write(making.join(".complete"), "").unwrap();
            // One made before without the marker goes; when another
            // process put its own in place first, that one stands.
            if dir.exists() && !dir.join(".complete").exists() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            if std::fs::rename(&making, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&making);
            }
            assert!(dir.join(".complete").exists(), "no {}", dir.display());
        }
        // Beside node_modules, so that its imports resolve there; renamed
        // into place, so that no run reads it half-copied.
        let script = dir.join(format!("mcp_client.mjs.{}", std::process::id()));
        std::fs::copy(scripts_dir().join("mcp_client.mjs"), &script).unwrap();
        std::fs::rename(&script, dir.join("mcp_client.mjs")).unwrap();
        dir
    })
    .clone()
}

/// Runs `steps` through `client` against `hermes --home HOME --profile
/// PROFILE mcp ARGS…`; the results, one per step.
fn drive(
    client: Client,
    home: &TestHome,
    profile: &str,
    args: &[&str],
    steps: Value,
) -> Vec<Value> {
    let mut hermes_args = vec![
        "--home".to_string(),
        home.path().display().to_string(),
        "--profile".to_string(),
        profile.to_string(),
        "mcp".to_string(),
    ];
    hermes_args.extend(args.iter().map(|a| a.to_string()));
    let spec = json!({
        "command": hermes_bin(),
        "args": hermes_args,
        "steps": steps,
    });
    run_client(client, home, spec)
}

/// Runs `client` on `spec` (see `tests/clients/`); the results, one per
/// step.
fn run_client(client: Client, home: &TestHome, spec: Value) -> Vec<Value> {
    let steps = spec["steps"].clone();
    let spec_path = home.path().join(format!("mcp-spec-{client:?}.json"));
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let mut cmd = match client {
        Client::Python => {
            let mut cmd = Command::new(python());
            cmd.arg(scripts_dir().join("mcp_client.py"));
            cmd
        }
        Client::TypeScript => {
            let dir = node_dir();
            let mut cmd = Command::new("node");
            cmd.arg(dir.join("mcp_client.mjs")).current_dir(dir);
            cmd
        }
    };
    cmd.arg(&spec_path)
        .env_remove("HERMES_HOME")
        .env_remove("HERMES_PROFILE")
        .env_remove("HERMES_SESSION_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CLIENT_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the {client:?} client ran over {CLIENT_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().unwrap();
    let err = err.join().unwrap();
    assert!(
        status.success(),
        "{client:?} client: {status}\n{out}\n{err}"
    );
    let results: Vec<Value> = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("{client:?} client printed no JSON ({e}):\n{out}\n{err}"));
    assert_eq!(
        results.len(),
        steps.as_array().unwrap().len(),
        "{results:?}"
    );
    results
}

fn call(tool: &str, args: Value) -> Value {
    json!({ "op": "call", "tool": tool, "args": args })
}

/// A call's result: not a tool error, its text parsed as JSON.
fn ok(result: &Value) -> Value {
    assert_eq!(result["is_error"], json!(false), "{result}");
    serde_json::from_str(result["text"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {result}"))
}

/// A call's result: a tool error; its text.
fn tool_error(result: &Value) -> String {
    assert_eq!(result["is_error"], json!(true), "{result}");
    result["text"].as_str().unwrap().to_string()
}

/// A call's result: a protocol error, invalid params; its message.
fn protocol_error(result: &Value) -> String {
    assert_eq!(result["protocol_error"]["code"], json!(-32602), "{result}");
    result["protocol_error"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

fn docker_config() -> String {
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    ANTHROPIC_API_KEY: {FAKE_ANTHROPIC}\n",
        hermes_tests::test_image()
    )
}

/// Everything a client does through `hermes mcp`, and what it must see;
/// `extra`: more of `terminal:` (the sandbox's runtime).
fn scenario(client: Client, tag: &str, extra: &str) {
    let profile = format!("{tag}{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!("{}{extra}", docker_config()));
    let procs = r#"for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'echo [t]ick'"#;
    let steps = json!([
        { "op": "list" },
        // 1: exit code, both streams.
        call("terminal", json!({ "command": "echo out; echo err >&2; exit 3" })),
        // 2, 3: the working directory carries over.
        call("terminal", json!({ "command": "mkdir -p /workspace/mcp-sub && cd /workspace/mcp-sub" })),
        call("terminal", json!({ "command": "pwd" })),
        // 4: a timeout.
        call("terminal", json!({ "command": "sleep 60", "timeout": 2 })),
        // 5-9: a background process polled and killed, its tree gone.
        call("terminal", json!({ "command": "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done", "background": true })),
        // Until the background's output holds a second tick (a minute at most).
        call("terminal", json!({ "command": "i=0; until grep -qx 'tick 1' /tmp/.hermes-background/*/out 2>/dev/null || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done" })),
        call("process", json!({ "action": "poll", "process_id": "proc_1" })),
        call("process", json!({ "action": "kill", "process_id": "proc_1" })),
        call("process", json!({ "action": "poll", "process_id": "proc_1" })),
        call("terminal", json!({ "command": procs })),
        // 11-15: files, relative to the working directory.
        call("write_file", json!({ "path": "notes/a.txt", "content": "line one\nline two\n" })),
        call("read_file", json!({ "path": "notes/a.txt" })),
        call("read_file", json!({ "path": "/workspace/mcp-sub/notes/a.txt", "offset": 2 })),
        call("read_file", json!({ "path": "notes/missing.txt" })),
        call("terminal", json!({ "command": "printf 'a\\0b' > bin" })),
        call("read_file", json!({ "path": "bin" })),
        // 17-19: redaction of a planted secret, in output and in a file.
        call("terminal", json!({ "command": "printenv ANTHROPIC_API_KEY; printenv ANTHROPIC_API_KEY > key.txt" })),
        call("read_file", json!({ "path": "key.txt" })),
        // 19: progress before the end.
        { "op": "call", "tool": "terminal", "progress": true,
          "args": { "command": "for i in 1 2 3 4; do echo step $i; sleep 0.6; done" } },
        // 20: truncation.
        call("terminal", json!({ "command": "seq 1 30000" })),
        // 21-26: bad input, then the server still answers.
        call("terminal", json!({ "command": 5 })),
        call("terminal", json!({ "command": "x".repeat(100_000) })),
        call("terminal", json!({})),
        call("no_such_tool", json!({})),
        call("write_file", json!({ "path": "big", "content": "y".repeat(2 * 1024 * 1024) })),
        call("terminal", json!({ "command": "echo alive" })),
    ]);
    let r = drive(client, &home, &profile, &[], steps);

    let tools = r[0]["tools"].as_array().unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["process", "read_file", "terminal", "write_file"]);
    for tool in tools {
        assert!(tool["description"].as_str().unwrap().len() > 40, "{tool}");
        assert_eq!(tool["schema"]["type"], "object", "{tool}");
    }
    let terminal = tools.iter().find(|t| t["name"] == "terminal").unwrap();
    assert_eq!(
        terminal["schema"]["properties"]["command"]["type"],
        "string"
    );
    assert_eq!(terminal["schema"]["required"], json!(["command"]));

    let first = ok(&r[1]);
    assert_eq!(first["exit_code"], 3, "{first}");
    let output = first["output"].as_str().unwrap();
    assert!(
        output.contains("out\n") && output.contains("err\n"),
        "{first}"
    );
    assert_eq!(ok(&r[2])["cwd"], "/workspace/mcp-sub");
    assert_eq!(ok(&r[3])["output"], "/workspace/mcp-sub\n");

    let timed_out = ok(&r[4]);
    assert_eq!(timed_out["exit_code"], 124, "{timed_out}");
    assert!(
        timed_out["output"]
            .as_str()
            .unwrap()
            .contains("timed out after 2s"),
        "{timed_out}"
    );
    let took = r[4]["ended_at"].as_f64().unwrap() - r[4]["started_at"].as_f64().unwrap();
    assert!(took < 20.0, "the timeout took {took}s");

    let started = ok(&r[5]);
    assert_eq!(started["process_id"], "proc_1", "{started}");
    let polled = ok(&r[7]);
    assert_eq!(polled["state"], "running", "{polled}");
    assert!(
        polled["output"]
            .as_str()
            .unwrap()
            .starts_with("tick 0\ntick 1\n"),
        "{polled}"
    );
    assert_eq!(ok(&r[8])["state"], "killed", "{}", r[8]);
    assert_eq!(ok(&r[9])["state"], "killed", "{}", r[9]);
    assert_eq!(ok(&r[10])["output"], "0\n", "{}", r[10]);

    assert_eq!(ok(&r[11])["bytes_written"], 18, "{}", r[11]);
    let read = ok(&r[12]);
    assert_eq!(
        read["content"], "     1|line one\n     2|line two\n",
        "{read}"
    );
    assert_eq!(read["total_lines"], 2, "{read}");
    assert_eq!(ok(&r[13])["content"], "     2|line two\n", "{}", r[13]);
    assert!(tool_error(&r[14]).contains("no such file"), "{}", r[14]);
    assert!(tool_error(&r[16]).contains("binary"), "{}", r[16]);

    let printed = ok(&r[17]);
    let printed = printed["output"].as_str().unwrap();
    assert!(
        printed.contains("[redacted]") && !printed.contains(FAKE_ANTHROPIC),
        "{printed}"
    );
    let file = ok(&r[18]);
    let file = file["content"].as_str().unwrap();
    assert!(
        file.contains("[redacted]") && !file.contains(FAKE_ANTHROPIC),
        "{file}"
    );
    assert!(!r.iter().any(|x| x.to_string().contains(FAKE_ANTHROPIC)));

    let long = &r[19];
    assert_eq!(
        ok(long)["output"],
        "step 1\nstep 2\nstep 3\nstep 4\n",
        "{long}"
    );
    let progress = long["progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "no progress: {long}");
    // The first progress came while the command ran: it has the first
    // step, not the last.
    let first_progress = progress[0]["message"].as_str().unwrap();
    assert!(
        first_progress.contains("step 1") && !first_progress.contains("step 4"),
        "{long}"
    );

    let truncated = ok(&r[20]);
    let truncated = truncated["output"].as_str().unwrap();
    assert!(truncated.starts_with("1\n2\n3\n"), "{}", &truncated[..100]);
    assert!(truncated.ends_with("29999\n30000\n"));
    assert!(
        truncated.contains("... [OUTPUT TRUNCATED - "),
        "{truncated}"
    );
    assert!(truncated.len() < 51_000, "{}", truncated.len());

    assert!(protocol_error(&r[21]).contains("invalid type"), "{}", r[21]);
    assert!(
        protocol_error(&r[22]).contains("over the limit"),
        "{}",
        r[22]
    );
    assert!(protocol_error(&r[23]).contains("command"), "{}", r[23]);
    protocol_error(&r[24]);
    assert!(
        protocol_error(&r[25]).contains("over the limit"),
        "{}",
        r[25]
    );
    assert_eq!(ok(&r[26])["output"], "alive\n");
}

#[test]
fn python_sdk_drives_the_docker_sandbox() {
    scenario(Client::Python, "mcpy", "");
}

/// The same under gVisor: its processes are listed from the guest's
/// `/proc` (the engine's `top` shows the sandbox's VM), the kill is the
/// inside one.
#[test]
fn python_sdk_drives_the_docker_sandbox_under_gvisor() {
    scenario(
        Client::Python,
        "mcpg",
        &format!("  docker_runtime: {}\n", hermes_tests::runsc_runtime()),
    );
}

/// On the local backend under bubblewrap a background process gets a
/// sandbox of its own, which outlives the command that started it: the
/// process tool polls it and kills it (nothing of it left on the host).
#[test]
fn a_background_process_under_bwrap_is_polled_and_killed() {
    let profile = format!("mcpb{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    home.write_config("terminal:\n  backend: local\n  local_sandbox: bwrap\n");
    let tag = format!("tick-{}", std::process::id());
    let steps = json!([
        call("terminal", json!({ "command": "cd /tmp" })),
        call(
            "terminal",
            json!({ "command": format!("i=0; while true; do echo {tag} $i; i=$((i+1)); sleep 0.2; done"), "background": true })
        ),
        call(
            "terminal",
            json!({ "command": format!("i=0; until grep -qx '{tag} 1' /run/hermes/state/jobs/*/out 2>/dev/null || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; pwd") })
        ),
        call(
            "process",
            json!({ "action": "poll", "process_id": "proc_1" })
        ),
        call(
            "process",
            json!({ "action": "kill", "process_id": "proc_1" })
        ),
        call(
            "process",
            json!({ "action": "poll", "process_id": "proc_1" })
        ),
    ]);
    let r = drive(Client::Python, &home, &profile, &[], steps);
    assert_eq!(ok(&r[1])["process_id"], "proc_1", "{}", r[1]);
    assert_eq!(ok(&r[2])["output"], "/tmp\n", "{}", r[2]);
    let polled = ok(&r[3]);
    assert_eq!(polled["state"], "running", "{polled}");
    assert!(
        polled["output"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{tag} 0\n{tag} 1\n")),
        "{polled}"
    );
    assert_eq!(ok(&r[4])["state"], "killed", "{}", r[4]);
    assert_eq!(ok(&r[5])["state"], "killed", "{}", r[5]);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        let ps = String::from_utf8_lossy(&ps.stdout).into_owned();
        if !ps.lines().any(|l| l.contains(&tag)) {
            break;
        }
        assert!(Instant::now() < until, "left on the host:\n{ps}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn typescript_sdk_drives_the_docker_sandbox() {
    scenario(Client::TypeScript, "mcts", "");
}

#[test]
fn a_command_refused_while_the_egress_proxy_is_down_is_a_tool_error() {
    let profile = format!("mcfc{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let port = hermes_tests::egress::free_port_pair(None);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\nproxy:\n  enabled: true\n  tunnel_port: {port}\n",
        hermes_tests::test_image()
    ));
    let setup = home.run(["--profile", &profile, "egress", "setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let steps = json!([
        call("terminal", json!({ "command": "echo ran" })),
        call(
            "write_file",
            json!({ "path": "/workspace/x", "content": "x" })
        ),
        call(
            "terminal",
            json!({ "command": "echo ran", "background": true })
        ),
    ]);
    let r = drive(Client::Python, &home, &profile, &[], steps);
    for result in &r {
        let text = tool_error(result);
        assert!(
            text.contains("refused, failing closed") && text.contains("egress proxy"),
            "{text}"
        );
        assert!(!text.contains("ran"), "{text}");
    }
    // Nothing was made for a refused command.
    let made = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=hermes-profile={profile}"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&made.stdout).trim(), "");
}

#[test]
fn a_connection_of_its_own_gets_a_sandbox_removed_at_its_end() {
    let profile = format!("mcown{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "{}  container_persistent: false\n",
        docker_config()
    ));
    let r = drive(Client::Python, &home, &profile, &[], hostname_step());
    container_hostname(&r[0]);
    sandboxes_gone(&profile);
}

/// Over HTTP each MCP session is a connection: two sessions one after
/// the other get two sandboxes, each removed when its client ends the
/// session (the SDK's DELETE), while the server goes on serving.
#[test]
fn an_http_session_of_its_own_gets_a_sandbox_removed_when_the_client_ends_it() {
    let profile = format!("mchttp{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "{}  container_persistent: false\n",
        docker_config()
    ));
    let (_server, addr) = serve_http(&home, &["--profile", &profile]);
    let token = std::fs::read_to_string(home.path().join("mcp/token")).unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let spec = json!({
            "url": format!("http://{addr}/mcp"),
            "token": token.trim(),
            "steps": hostname_step(),
        });
        let r = run_client(Client::Python, &home, spec);
        seen.push(container_hostname(&r[0]));
        sandboxes_gone(&profile);
    }
    assert_ne!(seen[0], seen[1], "two sessions shared a sandbox");
}

/// One step: `hostname` in the sandbox.
fn hostname_step() -> Value {
    json!([call("terminal", json!({ "command": "hostname" }))])
}

/// The hostname a `hostname` step printed: a container's (its id's first
/// 12 hex digits).
fn container_hostname(result: &Value) -> String {
    let ran = ok(result);
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let hostname = ran["output"].as_str().unwrap().trim().to_string();
    assert!(
        hostname.len() == 12 && hostname.bytes().all(|b| b.is_ascii_hexdigit()),
        "{ran}"
    );
    hostname
}

/// Waits (bounded: the client may exit before hermes is done) until no
/// container of `profile` is left.
fn sandboxes_gone(profile: &str) {
    let filter = format!("label=hermes-profile={profile}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&left.stdout).trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session's sandbox is still there"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A `hermes mcp --http` server, stopped when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `hermes [GLOBAL…] mcp --http` on a free loopback port of `home`, once it
/// says where it serves; and that address.
fn serve_http(home: &TestHome, global: &[&str]) -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut args: Vec<&str> = global.to_vec();
    args.extend(["mcp", "--http", &addr]);
    let mut child = home
        .command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(line.contains(&format!("http://{addr}/mcp")), "{line}");
    (server, addr)
}

/// Sends one HTTP request on a fresh connection; the status code and
/// what came back within a few seconds.
fn http(addr: &str, authorization: Option<&str>, body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&got).contains("protocolVersion") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[test]
fn the_http_transport_serves_only_requests_with_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let home = TestHome::new();
    let refused = home.run(["mcp", "--http", "0.0.0.0:0"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("loopback"), "{refused:?}");

    let (server, addr) = serve_http(&home, &[]);

    let token_path = home.path().join("mcp/token");
    let token = std::fs::read_to_string(&token_path).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&token_path), 0o600);
    assert_eq!(mode(&home.path().join("mcp")), 0o700);
    assert_eq!(token.trim().len(), 64);

    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "raw", "version": "1" }
        }
    })
    .to_string();
    let (code, text) = http(&addr, None, &initialize);
    assert_eq!(code, 401, "{text}");
    assert!(!text.contains("protocolVersion"), "{text}");
    let wrong = format!("Bearer {}", "0".repeat(64));
    let (code, text) = http(&addr, Some(&wrong), &initialize);
    assert_eq!(code, 401, "{text}");
    let (code, text) = http(
        &addr,
        Some(&format!("Bearer {}", token.trim())),
        &initialize,
    );
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"protocolVersion\""), "{text}");
    assert!(text.contains("hermes"), "{text}");
    assert!(!text.contains(token.trim()));
    drop(server);
}

/// A `hermes mcp` over stdio spoken to in raw JSON-RPC, one message a
/// line, with no SDK in between: what the server sends is what is
/// checked. `initialize`, then each of `requests` (methods and params);
/// the results, the initialize result first.
fn raw_stdio(home: &TestHome, requests: &[(&str, Value)]) -> Vec<Value> {
    let mut child = home
        .command(["mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut send = |message: Value| writeln!(stdin, "{message}").unwrap();
    let answer = |id: u64| -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer to request {id}: {e}"));
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON-RPC ({e}): {line}"));
            if message["id"] == json!(id) {
                assert!(message.get("error").is_none(), "{message}");
                return message["result"].clone();
            }
        }
    };
    send(json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "raw", "version": "1" }
        }
    }));
    let mut results = vec![answer(0)];
    send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
    for (id, (method, params)) in (1..).zip(requests) {
        send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        results.push(answer(id));
    }
    drop(server);
    results
}

/// The keywords a strict tool-call backend refuses or cannot build a
/// grammar from: references (llama.cpp, draft-07 validators), unions and
/// combinators (Anthropic and OpenAI's Codex endpoint refuse them at the
/// top of a schema), `const` (a one-value `enum` says the same) and
/// OpenAPI's `nullable`.
const UNFLAT: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "oneOf",
    "anyOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "const",
    "nullable",
];

/// What in the schema at `path` a strict backend would refuse, added to
/// `problems`: a keyword of [`UNFLAT`], a node without exactly one
/// non-null type, a `null` default or choice, a `format` off a string, an
/// object without `properties` or open to other properties, a `required`
/// name with no property, an array without one schema for its items, a
/// property without a description for the model to read.
fn unflat(path: &str, schema: &Value, problems: &mut Vec<String>) {
    let Some(node) = schema.as_object() else {
        problems.push(format!("{path}: {schema}, not a schema object"));
        return;
    };
    for key in UNFLAT {
        if node.contains_key(*key) {
            problems.push(format!("{path}: {key}"));
        }
    }
    let ty = match node.get("type") {
        Some(Value::String(t)) if t != "null" => t.as_str(),
        other => {
            problems.push(format!("{path}: type {other:?}, not one non-null type"));
            return;
        }
    };
    if node.get("default") == Some(&Value::Null) {
        problems.push(format!("{path}: a null default"));
    }
    if node.contains_key("format") && ty != "string" {
        problems.push(format!("{path}: a format on a {ty}"));
    }
    if let Some(choices) = node.get("enum") {
        let fits = |v: &Value| match ty {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            _ => false,
        };
        match choices.as_array() {
            Some(values) if !values.is_empty() && values.iter().all(fits) => {}
            _ => problems.push(format!("{path}: enum {choices}, not values of its {ty}")),
        }
    }
    match ty {
        "object" => {
            let Some(properties) = node.get("properties").and_then(Value::as_object) else {
                problems.push(format!("{path}: an object without properties"));
                return;
            };
            match node.get("additionalProperties") {
                Some(Value::Bool(false)) => {}
                Some(Value::Object(_)) => unflat(
                    &format!("{path}.additionalProperties"),
                    &node["additionalProperties"],
                    problems,
                ),
                other => {
                    problems.push(format!("{path}: additionalProperties {other:?}, not false"))
                }
            }
            match node.get("required") {
                Some(Value::Array(names)) => {
                    for name in names {
                        if !name.as_str().is_some_and(|n| properties.contains_key(n)) {
                            problems.push(format!("{path}: required {name}, no such property"));
                        }
                    }
                }
                other => problems.push(format!("{path}: required {other:?}, not a list")),
            }
            for (name, property) in properties {
                let at = format!("{path}.{name}");
                if property["description"].as_str().is_none_or(str::is_empty) {
                    problems.push(format!("{at}: no description"));
                }
                unflat(&at, property, problems);
            }
        }
        "array" => match node.get("items") {
            Some(items @ Value::Object(_)) => unflat(&format!("{path}[]"), items, problems),
            other => problems.push(format!("{path}: items {other:?}, not one schema")),
        },
        "string" | "integer" | "number" | "boolean" => {}
        other => problems.push(format!("{path}: type {other}")),
    }
}

/// Every tool's input schema (and output schema, where it has one) as
/// `tools/list` sends it holds only what every model's tool calling
/// accepts: one flat object of typed properties, a choice as an `enum`,
/// an optional argument simply not required.
#[test]
fn every_tool_schema_is_flat_enough_for_every_model() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let r = raw_stdio(&home, &[("tools/list", json!({}))]);
    let tools = r[1]["tools"].as_array().unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["process", "read_file", "terminal", "write_file"]);
    let mut problems = Vec::new();
    for tool in tools {
        let name = tool["name"].as_str().unwrap();
        let input = &tool["inputSchema"];
        assert_eq!(input["type"], "object", "{name}: {input}");
        unflat(name, input, &mut problems);
        if let Some(output) = tool.get("outputSchema") {
            unflat(&format!("{name} (output)"), output, &mut problems);
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        serde_json::to_string_pretty(tools).unwrap()
    );
    // A choice is an enum of its values; an optional argument is typed
    // as itself and not required.
    let process = tools.iter().find(|t| t["name"] == "process").unwrap();
    let action = &process["inputSchema"]["properties"]["action"];
    assert_eq!(action["enum"], json!(["list", "poll", "kill"]), "{action}");
    assert_eq!(process["inputSchema"]["required"], json!(["action"]));
    let terminal = tools.iter().find(|t| t["name"] == "terminal").unwrap();
    assert_eq!(
        terminal["inputSchema"]["properties"]["timeout"]["type"],
        "integer"
    );
    assert_eq!(terminal["inputSchema"]["required"], json!(["command"]));
}

/// `initialize` names the server: hermes at its own version (the one
/// `hermes --version` prints), not the MCP library it is built on.
#[test]
fn the_initialize_result_names_hermes_at_its_version() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let r = raw_stdio(&home, &[]);
    let info = &r[0]["serverInfo"];
    assert_eq!(info["name"], "hermes", "{info}");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"), "{info}");
    let version = home.run(["--version"]);
    assert_eq!(version.code, 0, "{version:?}");
    assert_eq!(
        version.stdout.trim(),
        format!("hermes {}", env!("CARGO_PKG_VERSION"))
    );
}
