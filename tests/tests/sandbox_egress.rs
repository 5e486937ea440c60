//! Docker sandboxes wired to the egress proxy, end to end: `hermes
//! reconcile` sets the proxy up, starts it and only then the sandbox; curl,
//! Python and Node inside the sandbox reach an allowlisted name (resolved
//! by `proxy.resolve` to a local TLS upstream of the test's own) and the
//! upstream receives the real key, while the sandbox, its files, `docker
//! inspect`, the host's process list and hermes's logs never hold one. A
//! proxy killed with SIGKILL fails closed. With `proxy.enforce_network`
//! the proxy is the only thing a sandbox reaches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};
use hermes_tests::egress::{NODE_GET, bridge_gateway, free_port_pair};
use hermes_tests::upstream::Upstream;

const OPENROUTER_KEY: &str = "sk-or-v1-e2e-REAL-openrouter-0001";
const ANTHROPIC_KEY: &str = "sk-ant-e2e-REAL-anthropic-0002";
const GEMINI_KEY: &str = "AIza-e2e-REAL-gemini-0003";
const NAMES: &[&str] = &[
    "openrouter.ai",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
];

/// A home on the Docker backend with the proxy enabled and enforced, its
/// provider hosts resolving to `upstream`.
struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    /// `redact`: whether hermes masks keys in what it prints. Off, the
    /// upstream's echo shows the real key arrived, and the absence of keys
    /// elsewhere owes nothing to masking.
    fn new(tag: &str, upstream: &Upstream, redact: bool) -> Host {
        Host::with_proxy(tag, upstream, redact, "")
    }

    /// As [`Host::new`], with `proxy_extra` (indented lines) added to the
    /// proxy section.
    fn with_proxy(tag: &str, upstream: &Upstream, redact: bool, proxy_extra: &str) -> Host {
        Host::with_runtime(tag, upstream, redact, proxy_extra, None)
    }

    /// As [`Host::with_proxy`], the sandbox under the OCI `runtime`
    /// (`terminal.docker_runtime`) when one is given.
    fn with_runtime(
        tag: &str,
        upstream: &Upstream,
        redact: bool,
        proxy_extra: &str,
        runtime: Option<&str>,
    ) -> Host {
        let runtime = runtime
            .map(|r| format!("  docker_runtime: {r}\n"))
            .unwrap_or_default();
        let redaction = if redact {
            String::new()
        } else {
            "security:\n  redact_secrets: false\n".to_string()
        };
        let profile = format!("{tag}{}", std::process::id());
        let home = TestHome::with_profile(&profile);
        let ca = home.path().join("upstream-ca.pem");
        std::fs::write(&ca, &upstream.ca_pem).unwrap();
        let port = free_port_pair(Some(bridge_gateway()));
        let resolve: String = NAMES
            .iter()
            .map(|n| format!("    {n}: 127.0.0.1\n"))
            .collect();
        home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n{runtime}{redaction}reconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n{proxy_extra}  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n{resolve}",
            hermes_tests::test_image(),
            ca.display()
        ));
        // One key from .env, the others from the environment.
        std::fs::write(
            home.path().join(".env"),
            format!("ANTHROPIC_API_KEY={ANTHROPIC_KEY}\n"),
        )
        .unwrap();
        Host {
            home,
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        }
    }

    /// `hermes --profile P ARGS` with the host's keys in its environment
    /// and debug logs on.
    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home
            .command(all)
            .env("OPENROUTER_API_KEY", OPENROUTER_KEY)
            .env("GEMINI_API_KEY", GEMINI_KEY)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap()
            .into()
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    fn workspace(&self) -> std::path::PathBuf {
        self.home.path().join("sandboxes/docker/default/workspace")
    }

    fn proxy_pid(&self) -> i32 {
        std::fs::read_to_string(self.home.path().join("proxy/proxy.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
    }
}

#[test]
fn the_sandbox_reaches_providers_through_the_proxy_and_never_holds_a_key() {
    reaches_providers_through_the_proxy_and_never_holds_a_key("sk", None);
}

#[test]
fn under_gvisor_the_sandbox_reaches_providers_through_the_proxy_and_never_holds_a_key() {
    let runsc = hermes_tests::runsc_runtime();
    reaches_providers_through_the_proxy_and_never_holds_a_key("skg", Some(&runsc));
}

fn reaches_providers_through_the_proxy_and_never_holds_a_key(tag: &str, runtime: Option<&str>) {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::with_runtime(tag, &upstream, false, "", runtime);
    let mut logs = String::new();

    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(dry.stdout.contains("+ proxy "), "{}", dry.stdout);
    assert!(
        dry.stdout.contains("blocked     egress proxy not set up"),
        "{}",
        dry.stdout
    );
    logs.push_str(&dry.stderr);

    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    logs.push_str(&apply.stderr);

    std::fs::write(host.workspace().join("get.js"), NODE_GET).unwrap();
    let port = upstream.addr.port();
    let script = format!(
        r#"echo "== env"
printenv | grep -E '_API_KEY=|_PROXY=' | sort
echo "== curl"
curl -sS --max-time 20 "https://openrouter.ai:{port}/echo" -H "Authorization: Bearer $OPENROUTER_API_KEY"
echo
echo "== python"
python3 - <<'PY'
import os, urllib.request
req = urllib.request.Request("https://api.anthropic.com:{port}/echo",
    headers={{"x-api-key": os.environ["ANTHROPIC_API_KEY"]}})
print(urllib.request.urlopen(req, timeout=20).read().decode())
PY
echo "== node"
node /workspace/get.js generativelanguage.googleapis.com {port} "/echo?key=$GEMINI_API_KEY"
"#
    );
    let run = host.hermes(&["exec", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    logs.push_str(&run.stderr);
    let section = |name: &str| hermes_tests::egress::section(&run.stdout, name);
    let env = section("env");
    assert!(
        env.contains("HTTPS_PROXY=http://host.docker.internal:"),
        "{env}"
    );
    for line in env.lines().filter(|l| l.contains("_API_KEY=")) {
        let (name, value) = line.split_once('=').unwrap();
        let provider = value.split('-').next().unwrap();
        assert!(
            value.len() == provider.len() + 33,
            "{name} holds {value}, not a proxy token"
        );
    }
    let curl: serde_json::Value = serde_json::from_str(section("curl").trim()).unwrap();
    assert_eq!(
        curl["headers"]["authorization"],
        format!("Bearer {OPENROUTER_KEY}")
    );
    let python: serde_json::Value = serde_json::from_str(section("python").trim()).unwrap();
    assert_eq!(python["headers"]["x-api-key"], ANTHROPIC_KEY);
    let node: serde_json::Value = serde_json::from_str(section("node").trim()).unwrap();
    assert_eq!(node["path"], format!("/echo?key={GEMINI_KEY}"));

    // No real key anywhere it must not be.
    let keys = [OPENROUTER_KEY, ANTHROPIC_KEY, GEMINI_KEY];
    let inspect = docker(&["inspect", &host.name()]);
    let processes = String::from_utf8_lossy(
        &std::process::Command::new("ps")
            .args(["-eo", "args"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let search = host.hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        &format!(
            "grep -rlsF -e {} -e {} -e {} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev; \
             cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -cF -e {} -e {} -e {}; true",
            keys[0], keys[1], keys[2], keys[0], keys[1], keys[2]
        ),
    ]);
    // The search's own command line holds the keys: only its count line
    // and no file may come back.
    assert_eq!(search.stdout.trim(), "0", "{search:?}");
    for key in keys {
        assert!(!inspect.contains(key), "docker inspect shows a real key");
        assert!(!logs.contains(key), "a real key in hermes's logs");
        assert!(
            !processes
                .lines()
                .any(|l| l.contains(key) && !l.contains("grep")),
            "a real key on a command line"
        );
        for entry in walk(&host.home.path().join("sandboxes")) {
            let text = std::fs::read(&entry).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&text).contains(key),
                "a real key in {}",
                entry.display()
            );
        }
    }
}

/// The operations of a plan that change the host, `(target, action)`,
/// the first stage's then each later stage's, from its JSON.
fn planned_work(plan: &serde_json::Value) -> Vec<(String, String)> {
    let mut ops: Vec<&serde_json::Value> = plan["operations"].as_array().unwrap().iter().collect();
    for stage in plan["stages"].as_array().into_iter().flatten() {
        ops.extend(stage["operations"].as_array().unwrap());
    }
    ops.into_iter()
        .filter(|op| matches!(op["kind"].as_str(), Some("create" | "change" | "remove")))
        .map(|op| {
            (
                op["target"].as_str().unwrap().to_string(),
                op["action"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The plan is the whole truth: on a fresh host the dry run shows the
/// proxy's setup, its start once set up, and the sandbox once the proxy
/// runs, as three stages; `reconcile` carries out exactly those, in that
/// order, stage by stage, and leaves the host converged.
#[test]
fn reconcile_carries_out_exactly_the_stages_the_dry_run_printed() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("stg", &upstream, true);
    let text = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(text.code, 2, "{text:?}");
    for heading in [
        "Stage 1 of 3:\n",
        "\nStage 2 of 3, once the proxy is set up:\n",
        "\nStage 3 of 3, once the proxy runs, healthy, on the current settings:\n",
    ] {
        assert!(
            text.stdout.contains(heading),
            "{heading:?}: {}",
            text.stdout
        );
    }
    let dry = host.hermes(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    let planned = planned_work(&plan);
    let sandbox = format!("sandbox {}/default", host.profile);
    assert_eq!(
        planned,
        [
            ("proxy".to_string(), "setup".to_string()),
            ("proxy".to_string(), "start".to_string()),
            (sandbox, "create".to_string()),
        ],
        "{plan}"
    );
    assert_eq!(plan["stages"][1]["stage"], 3, "{plan}");

    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(apply.done(), planned, "{}", apply.stdout);
    assert!(apply.stdout.contains("Stage 3 of 3:\n"), "{}", apply.stdout);
    assert!(
        !apply.stdout.contains("not carried out"),
        "{}",
        apply.stdout
    );
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    let again = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "converged: {again:?}");
}

/// A stage the host, observed again, does not plan is not carried out:
/// here the setup cannot give sandboxes an address to reach the proxy on
/// (`proxy.listen` names only loopback), so after it the host plans the
/// setup again, not the start the dry run promised. The pass stops there,
/// says so, and starts nothing.
#[test]
fn a_stage_the_host_no_longer_plans_is_left_to_the_next_pass() {
    let profile = format!("sth{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let _stop = hermes_tests::egress::StopProxy(&home);
    let port = free_port_pair(None);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\nproxy:\n  enabled: true\n  tunnel_port: {port}\n  listen: [127.0.0.1]\n",
        hermes_tests::test_image()
    ));
    let run = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dry = run(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(
        planned_work(&plan)[..2],
        [
            ("proxy".to_string(), "setup".to_string()),
            ("proxy".to_string(), "start".to_string()),
        ],
        "{plan}"
    );
    let apply = run(&["reconcile"]);
    assert_eq!(apply.code, 1, "{apply:?}");
    assert_eq!(
        apply.done(),
        [("proxy".to_string(), "setup".to_string())],
        "{}",
        apply.stdout
    );
    assert!(
        apply.stdout.contains(
            "Stage 2 of 3 not carried out: observed again, the host plans setup proxy where stage 2 said start proxy; the next pass plans again"
        ),
        "{}",
        apply.stdout
    );
    assert!(
        !home.path().join("proxy/proxy.pid").exists(),
        "a proxy was started"
    );
}

#[test]
fn a_killed_proxy_fails_closed_and_reconcile_brings_it_back() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("sf", &upstream, true);
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);

    let pid = host.proxy_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        // Gone, or a zombie: it answers nothing from then on.
        let dead = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(") ").next().is_some_and(|r| r.starts_with('Z'))
        });
        let run = host.hermes(&["exec", "--", "echo", "ran"]);
        // While the killed process is still exiting it can be seen alive
        // but not answering: refused as "not healthy", fail closed too.
        if run.code == 3 && run.stderr.contains("not running") {
            break run;
        }
        assert!(
            run.code == 3 || !dead,
            "an exec started after the proxy died ran: {run:?}"
        );
        assert!(
            Instant::now() < deadline,
            "the killed proxy is still seen running: {run:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(refused.stdout.is_empty(), "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("egress proxy not running (fail closed)"),
        "{}",
        refused.stderr
    );

    // Stop the sandbox too: its start must wait for the proxy.
    docker(&["stop", "-t", "1", &host.name()]);
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(dry.stdout.contains("+ proxy "), "{}", dry.stdout);
    assert!(
        dry.stdout.contains(&format!(
            "! sandbox {}/default   blocked     egress proxy not running (fail closed); wanted: start",
            host.profile
        )),
        "{}",
        dry.stdout
    );

    // `hermes status` says the same, on one screen.
    let status = host.hermes(&["status", "--output", "json"]);
    assert_eq!(status.code, 1, "{status:?}");
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(report["proxy"]["running"], false);
    assert!(
        report["blocked"][0]
            .as_str()
            .unwrap()
            .contains("egress proxy not running (fail closed)"),
        "{report}"
    );

    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let run = host.hermes(&["exec", "--", "echo", "ran"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "ran\n"));
    let status = host.hermes(&["status", "--output", "json"]);
    assert_eq!(status.code, 0, "{status:?}");
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(report["proxy"]["healthy"], true);
    assert_eq!(report["sandboxes"][0]["spec_matches"], true);
    assert_ne!(report["sandboxes"][0]["egress"], "off");
}

/// Every regular file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files
}

#[test]
fn a_running_controller_restarts_a_killed_proxy() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("sc", &upstream, true);
    let _controller = KillOnDrop(
        host.home
            .command(["--profile", &host.profile, "controller"])
            .env("OPENROUTER_API_KEY", OPENROUTER_KEY)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(host.home.path().join("controller.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let ready = |host: &Host| host.hermes(&["exec", "--", "true"]).code == 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(&host) {
        assert!(
            Instant::now() < deadline,
            "the controller did not bring the sandbox up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = host.proxy_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    // Only the proxy's health can wake the controller in time: the resync
    // is 300 s here.
    loop {
        let again = std::fs::read_to_string(host.home.path().join("proxy/proxy.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if again.is_some_and(|p| p != first) && ready(&host) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the proxy was not restarted within 60 s; controller log:\n{}",
            std::fs::read_to_string(host.home.path().join("controller.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed when the test ends, failed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy-only network of one test: the sandbox's container, the
/// network, and the firewall chain go when the test ends.
struct NetworkCleanup {
    container: String,
    network: String,
}

impl Drop for NetworkCleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let suffix = self.network.trim_start_matches("hermes-egress-");
        let (bridge, chain) = (format!("hermes-{suffix}"), format!("HERMES-{suffix}"));
        for args in [
            vec!["-w", "-D", "INPUT", "-i", &bridge, "-j", &chain],
            vec![
                "-w",
                "-D",
                "DOCKER-USER",
                "-i",
                &bridge,
                "-o",
                &bridge,
                "-j",
                "REJECT",
                "--reject-with",
                "icmp-port-unreachable",
            ],
            vec!["-w", "-F", &chain],
            vec!["-w", "-X", &chain],
        ] {
            let _ = std::process::Command::new("iptables").args(args).output();
        }
        hermes_tests::egress::remove_transparent_rules(&bridge, &chain);
    }
}

#[test]
fn with_enforce_network_the_proxy_is_the_only_way_out() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::with_proxy("en", &upstream, false, "  enforce_network: true\n");
    // A service of the host on every address: a sandbox on the default
    // bridge reaches it, a sandbox on the proxy-only network must not.
    let service = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let service_port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in service.incoming().flatten() {
            use std::io::Write;
            let _ = conn.write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 13\r\n\r\nHOST-SERVICE\n");
        }
    });

    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.Gateway}}{{end}}",
        &host.name(),
    ]);
    let (network, gateway) = network.trim().split_once(' ').unwrap();
    let _cleanup = NetworkCleanup {
        container: host.name(),
        network: network.to_string(),
    };
    assert!(network.starts_with("hermes-egress-"), "{network}");
    assert_eq!(
        docker(&["network", "inspect", "--format", "{{.Internal}}", network]).trim(),
        "true"
    );
    let again = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "converged: {again:?}");

    let port = upstream.addr.port();
    let docker0 = bridge_gateway();
    let script = format!(
        r#"echo "== proxy"
curl -sS --max-time 20 "https://openrouter.ai:{port}/echo" -H "Authorization: Bearer $OPENROUTER_API_KEY"
echo
echo "== gateway service"
curl -sS --noproxy '*' --max-time 5 "http://{gateway}:{service_port}/" && echo REACHED
echo "== bridge service"
curl -sS --noproxy '*' --max-time 5 "http://{docker0}:{service_port}/" && echo REACHED
exit 0
"#
    );
    let run = host.hermes(&["exec", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    let (proxied, rest) = run.stdout.split_once("== gateway service").unwrap();
    let echo: serde_json::Value =
        serde_json::from_str(proxied.trim_start_matches("== proxy").trim()).unwrap();
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {OPENROUTER_KEY}"),
        "{}",
        run.stdout
    );
    assert!(
        !rest.contains("REACHED") && !rest.contains("HOST-SERVICE"),
        "a sandbox on the proxy-only network reached something directly:\n{}\n{}",
        run.stdout,
        run.stderr
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

    // Off again: the dry run shows the network's removal; the pass moves
    // the sandbox back to the default bridge (its files kept), then
    // removes the chain and the network, as the dry run said.
    std::fs::write(host.workspace().join("marker"), "kept").unwrap();
    host.home.write_config(
        host.home
            .read_config()
            .replace("  enforce_network: true\n", ""),
    );
    let chain = format!("HERMES-{}", network.trim_start_matches("hermes-egress-"));
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.lines().any(|l| l.starts_with("? proxy")
            && l.contains("network-in-use")
            && l.contains(network)
            && l.contains(&chain)
            && l.contains("removed once they are off it")),
        "the dry run does not show the network's removal:\n{}",
        dry.stdout
    );
    let off = host.hermes(&["reconcile"]);
    assert_eq!(off.code, 0, "{off:?}");
    assert!(
        off.stdout.contains("remove-network done"),
        "the network's removal is not an operation of the pass:\n{}",
        off.stdout
    );
    let networks = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &host.name(),
    ]);
    assert_eq!(networks.trim(), "bridge");
    assert_eq!(
        std::fs::read_to_string(host.workspace().join("marker")).unwrap(),
        "kept"
    );
    let rules = std::process::Command::new("iptables-save")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&rules.stdout).contains(&chain));
    let left = docker(&[
        "network",
        "ls",
        "--quiet",
        "--filter",
        &format!("name={network}"),
    ]);
    assert_eq!(left.trim(), "", "the network is still there");
    let converged = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(converged.code, 0, "{converged:?}");
}

/// A `proxy:` edit under a running proxy: `hermes exec` carries out the
/// proxy's part of the plan itself (the op printed on stderr, in the plan's
/// words) and runs its command, instead of failing closed until someone
/// runs `hermes reconcile`.
#[test]
fn exec_applies_the_proxys_part_of_the_plan_after_a_proxy_edit_and_runs() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("se", &upstream, true);
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);

    let text = host.home.read_config();
    let edited = text.replace(
        "upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]",
        "upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8, 192.0.2.0/24]",
    );
    assert_ne!(edited, text);
    host.home.write_config(edited);

    let run = host.hermes(&["exec", "--", "echo", "ran"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "ran\n");
    // The proxy set up again on the new settings (its daemon follows),
    // said in the plan's words.
    assert!(
        run.stderr.contains(
            "+ proxy   setup       not set up: config.json is older than config.yaml's proxy section"
        ),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("fail closed"), "{}", run.stderr);
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
}

/// A session sandbox made while the proxy was off: once the proxy is on,
/// its commands are refused (exit 3, failing closed) rather than run with
/// variables naming a proxy it has no route or CA for; the next pass plans
/// and carries out its recreate, wired, saying its files are lost; then
/// its commands run behind the proxy and the host is converged.
#[test]
fn a_session_sandbox_made_before_the_proxy_fails_closed_until_a_pass_recreates_it_wired() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("ses", &upstream, true);
    let on = host.home.read_config();
    host.home
        .write_config(on.replace("proxy:\n  enabled: true\n", "proxy:\n  enabled: false\n"));
    let made = host.hermes(&["exec", "--session", "s1", "--", "true"]);
    assert_eq!(made.code, 0, "{made:?}");

    host.home.write_config(&on);
    let setup = host.hermes(&["egress", "setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let started = host.hermes(&["egress", "start"]);
    assert_eq!(started.code, 0, "{started:?}");
    let refused = host.hermes(&["exec", "--session", "s1", "--", "echo", "ran"]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(!refused.stdout.contains("ran"), "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("was made without the egress proxy's current wiring"),
        "{refused:?}"
    );

    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let line = dry
        .stdout
        .lines()
        .find(|l| l.contains("@s1"))
        .unwrap_or_else(|| panic!("{dry:?}"));
    assert!(
        line.contains("recreate")
            && line.contains("egress wiring changed: made before the egress proxy was on")
            && line.contains("every file in it is lost"),
        "{line}"
    );
    let applied = host.hermes(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let wired = host.hermes(&[
        "exec",
        "--session",
        "s1",
        "--",
        "sh",
        "-c",
        "test -s \"$SSL_CERT_FILE\" && echo \"wired $HTTPS_PROXY\"",
    ]);
    assert_eq!(wired.code, 0, "{wired:?}");
    assert!(wired.stdout.starts_with("wired http://"), "{wired:?}");
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
}

/// An edit of the proxy's allowlist (or of its host overrides) changes
/// the proxy, not the sandboxes' wiring: the dry run plans the proxy's
/// setup and restart and no recreate, showing no placeholder, and the
/// pass carries out every stage it printed.
#[test]
fn an_allowlist_edit_plans_the_proxy_only_and_every_stage_is_carried_out() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("alw", &upstream, true);
    let first = host.hermes(&["reconcile"]);
    assert_eq!(first.code, 0, "{first:?}");
    let before =
        hermes_tests::docker_cli::docker(&["inspect", "--format", "{{.Id}}", &host.name()]);
    for edit in [
        "  extra_allowed_hosts: [api.example.org]\n",
        "  extra_allowed_hosts: [api.example.org]\n  resolve:\n    api.example.org: 127.0.0.1\n",
    ] {
        let config = host.home.read_config();
        let edited = match config.find("  extra_allowed_hosts:") {
            Some(_) => config,
            None => config.replace(
                "proxy:\n  enabled: true\n",
                &format!("proxy:\n  enabled: true\n{edit}"),
            ),
        };
        let edited = if edit.contains("api.example.org: 127.0.0.1") {
            edited.replace(
                "  resolve:\n",
                "  resolve:\n    api.example.org: 127.0.0.1\n",
            )
        } else {
            edited
        };
        host.home.write_config(&edited);
        let dry = host.hermes(&["reconcile", "--dry-run"]);
        assert_eq!(dry.code, 2, "{dry:?}");
        assert!(dry.stdout.contains("proxy "), "{}", dry.stdout);
        for wrong in [
            "recreate",
            "known after setup",
            "made-by-the-setup",
            "0.0.0.0",
        ] {
            assert!(!dry.stdout.contains(wrong), "{wrong}: {}", dry.stdout);
        }
        let apply = host.hermes(&["reconcile"]);
        assert_eq!(apply.code, 0, "{apply:?}");
        assert!(
            !apply.stdout.contains("not carried out"),
            "{}",
            apply.stdout
        );
        let again = host.hermes(&["reconcile", "--dry-run"]);
        assert_eq!(again.code, 0, "converged: {again:?}");
    }
    let after = hermes_tests::docker_cli::docker(&["inspect", "--format", "{{.Id}}", &host.name()]);
    assert_eq!(before, after, "the sandbox was recreated");
}

/// A key added to `.env` (`hermes config set` puts one there) or changed
/// there reaches the running proxy by the pass that plans it: `~ proxy
/// reload` naming the providers, carried out without a restart (the same
/// pid), and converged after; the keys of the proxy's own environment
/// are not taken as removed by a pass whose environment lacks them.
#[test]
fn a_key_added_or_changed_in_dotenv_reaches_the_running_proxy_by_a_planned_reload() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES);
    let host = Host::new("key", &upstream, true);
    let first = host.hermes(&["reconcile"]);
    assert_eq!(first.code, 0, "{first:?}");
    let pid = host.proxy_pid();
    // A pass without the keys the proxy got from its environment.
    let bare = host
        .home
        .run(["--profile", &host.profile, "reconcile", "--dry-run"]);
    assert_eq!(bare.code, 0, "{bare:?}");

    let set = host.hermes(&[
        "config",
        "set",
        "OPENAI_API_KEY",
        "sk-proj-e2e-REAL-openai-0042",
    ]);
    assert_eq!(set.code, 0, "{set:?}");
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("~ proxy") && dry.stdout.contains("reload      keys: 1 added (openai"),
        "{}",
        dry.stdout
    );
    let applied = host.hermes(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(host.proxy_pid(), pid, "the proxy was restarted");
    let status = host.hermes(&["status", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(status["proxy"]["keys_loaded"], 4, "{status}");
    let again = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");

    let env = std::fs::read_to_string(host.home.path().join(".env")).unwrap();
    std::fs::write(
        host.home.path().join(".env"),
        env.replace(ANTHROPIC_KEY, "sk-ant-e2e-REAL-anthropic-0099"),
    )
    .unwrap();
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("keys: 1 changed (anthropic)"),
        "{}",
        dry.stdout
    );
    for secret in [
        ANTHROPIC_KEY,
        "sk-ant-e2e-REAL-anthropic-0099",
        "sk-proj-e2e-REAL-openai-0042",
    ] {
        assert!(!dry.stdout.contains(secret) && !dry.stderr.contains(secret));
    }
    let applied = host.hermes(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let again = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
}
