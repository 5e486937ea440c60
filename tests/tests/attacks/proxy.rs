//! The egress proxy under attack from a sandbox: a doubled `Host` header
//! carrying the real key somewhere else, a flood of idle connections
//! against every other sandbox of the home, an access log grown without
//! bound, and an allowlisted name pointed at the host's own addresses.

use std::time::Duration;

use hermes_tests::egress::{Proxy, in_container};
use hermes_tests::upstream::Upstream;

const OPENAI_KEY: &str = "sk-attacks-proxy-REAL-openai-0001";

/// A proxy whose `api.openai.com` resolves to `upstream` on loopback
/// (under a deny list without 127/8), trusting the upstream's CA, with
/// `extra` (indented lines) added to the proxy section.
fn proxy_to(upstream: &Upstream, extra: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap().keep();
    let ca = dir.join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16]\n  upstream_ca_file: {}\n  resolve:\n    api.openai.com: 127.0.0.1\n{extra}",
        ca.display()
    ));
    proxy.start(&[("OPENAI_API_KEY", OPENAI_KEY)]);
    proxy
}

/// A raw HTTP/1.1 client in Python: CONNECT to `host:port` through
/// `HTTPS_PROXY`, TLS with the proxy's CA, then one GET of `/echo` with
/// the `Host` lines given as arguments (in order) and the token as a
/// bearer; prints the response's status line and body.
const RAW_CLIENT: &str = r#"
import os, socket, ssl, sys
host, port, hosts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ph, pp = os.environ["HTTPS_PROXY"].split("//")[1].rsplit(":", 1)
s = socket.create_connection((ph, int(pp)), timeout=20)
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c:
        break
    head += c
if not head.startswith(b"HTTP/1.1 200"):
    print("CONNECT", head.decode(errors="replace"))
    sys.exit(1)
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
t = ctx.wrap_socket(s, server_hostname=host)
lines = ["GET /echo HTTP/1.1"] + [f"Host: {h}" for h in hosts]
lines += [f"Authorization: Bearer {os.environ['OPENAI_API_KEY']}", "Connection: close", "", ""]
t.sendall("\r\n".join(lines).encode())
data = b""
while True:
    c = t.recv(65536)
    if not c:
        break
    data += c
head, _, body = data.partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode())
print(body.decode(errors="replace"))
"#;

#[test]
fn a_doubled_host_header_is_refused_before_any_key_goes_in() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["api.openai.com"]);
    let proxy = proxy_to(&upstream, "");
    let port = upstream.addr.port();
    let token = proxy.token("openai");
    let target = format!("api.openai.com:{port}");
    let script = format!(
        r#"
echo "== evil-second"
python3 /t/raw.py api.openai.com {port} {target} evil.test
echo "== evil-first"
python3 /t/raw.py api.openai.com {port} evil.test {target}
echo "== same-twice"
python3 /t/raw.py api.openai.com {port} {target} {target}
"#
    );
    let env = [("OPENAI_API_KEY", token.clone())];
    let out = in_container(&proxy, &env, &[("raw.py", RAW_CLIENT)], &script);
    assert_eq!(out.code, 0, "{out:?}\nproxy log:\n{}", proxy.log());
    for section in ["evil-second", "evil-first", "same-twice"] {
        let text = out.section(section);
        assert!(text.starts_with("HTTP/1.1 400"), "{section}: {text}");
        assert!(text.contains("duplicate-host"), "{section}: {text}");
        assert!(!text.contains(OPENAI_KEY), "{section}: {text}");
    }
    // Nothing reached the upstream, with or without the key.
    assert_eq!(upstream.accepted_before_a_probe(), 0, "{}", proxy.log());

    // The control: the same client with one Host header gets through, the
    // key swapped in; the refusals above could have failed.
    let control = in_container(
        &proxy,
        &env,
        &[("raw.py", RAW_CLIENT)],
        &format!("python3 /t/raw.py api.openai.com {port} {target}"),
    );
    assert!(control.stdout.starts_with("HTTP/1.1 200"), "{control:?}");
    assert!(control.stdout.contains(OPENAI_KEY), "{control:?}");
    // The first probe, then the control's connection, before a second.
    assert!(upstream.accepted_before_a_probe() >= 2);
    let log = proxy.log();
    assert!(log.contains(r#""reason":"duplicate-host""#), "{log}");
    assert!(!log.contains(OPENAI_KEY) && !log.contains(&token), "{log}");
}

/// Opens up to `argv[1]` idle connections to the proxy (`HTTPS_PROXY`),
/// prints how many, then holds them `argv[2]` seconds. Bounded: at most
/// 40 s of connecting, and it stops after a few failed connects.
const FLOOD: &str = r#"
import os, resource, socket, sys, time
n, hold = int(sys.argv[1]), float(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ph, pp = os.environ["HTTPS_PROXY"].split("//")[1].rsplit(":", 1)
socks, failed = [], 0
deadline = time.time() + 40
while len(socks) < n and failed < 5 and time.time() < deadline:
    try:
        socks.append(socket.create_connection((ph, int(pp)), timeout=2))
    except OSError:
        failed += 1
print("OPEN", len(socks), "FAILED", failed, flush=True)
time.sleep(hold)
"#;

/// A home on the Docker backend with the proxy enabled, `api.openai.com`
/// resolving to `upstream`; stops its proxy when dropped.
struct DockerHome {
    home: hermes_tests::cli::TestHome,
    profile: String,
    _cleanup: hermes_tests::docker_cli::ProfileCleanup,
}

impl DockerHome {
    fn new(tag: &str, upstream: &Upstream) -> DockerHome {
        let profile = format!("{tag}{}", std::process::id());
        let home = hermes_tests::cli::TestHome::with_profile(&profile);
        let ca = home.path().join("upstream-ca.pem");
        std::fs::write(&ca, &upstream.ca_pem).unwrap();
        let port =
            hermes_tests::egress::free_port_pair(Some(hermes_tests::egress::bridge_gateway()));
        home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\nsecurity:\n  redact_secrets: false\nreconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16]\n  upstream_ca_file: {}\n  resolve:\n    api.openai.com: 127.0.0.1\n",
            hermes_tests::test_image(),
            ca.display()
        ));
        DockerHome {
            home,
            _cleanup: hermes_tests::docker_cli::ProfileCleanup(profile.clone()),
            profile,
        }
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        let mut cmd = self.home.command(all);
        cmd.env("OPENAI_API_KEY", OPENAI_KEY);
        cmd
    }

    fn hermes(&self, args: &[&str]) -> hermes_tests::cli::Run {
        self.command(args).output().unwrap().into()
    }

    fn workspace(&self, task: &str) -> std::path::PathBuf {
        self.home
            .path()
            .join(format!("sandboxes/docker/{task}/workspace"))
    }
}

impl Drop for DockerHome {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
    }
}

#[test]
fn one_sandbox_flooding_the_proxy_leaves_the_others_and_the_health_check_alone() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["api.openai.com"]);
    let host = DockerHome::new("atkflood", &upstream);
    let setup = host.hermes(&["egress", "setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    // The proxy under a descriptor limit of 2048 (soft and hard), which the
    // flood below goes well past.
    let mut start = std::process::Command::new("prlimit");
    start
        .arg("--nofile=2048:2048")
        .arg(hermes_tests::cli::hermes_bin())
        .arg("--home")
        .arg(host.home.path())
        .args(["egress", "start"])
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env_remove("RUST_LOG");
    let started: hermes_tests::cli::Run = start.output().unwrap().into();
    assert_eq!(started.code, 0, "{started:?}");
    for task in ["flood", "other"] {
        let run = host.hermes(&["exec", "--task", task, "--", "true"]);
        assert_eq!(run.code, 0, "{task}: {run:?}");
    }
    std::fs::write(host.workspace("flood").join("flood.py"), FLOOD).unwrap();

    let mut flood = host
        .command(&[
            "exec",
            "--task",
            "flood",
            "--",
            "python3",
            "/workspace/flood.py",
            "3000",
            "40",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = flood.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let opened = rx
        .recv_timeout(Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("the flood did not report: {e}"));
    assert!(opened.starts_with("OPEN "), "{opened}");
    let count: usize = opened.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(count > 2048, "the flood opened only {count}: {opened}");

    // While the flood holds its connections: the other sandbox's request
    // goes through, and the proxy answers its health check.
    let port = upstream.addr.port();
    let other = host.hermes(&[
        "exec",
        "--task",
        "other",
        "--",
        "sh",
        "-c",
        &format!(
            "curl -sS --max-time 20 https://api.openai.com:{port}/echo -H \"Authorization: Bearer $OPENAI_API_KEY\""
        ),
    ]);
    let status = host.hermes(&["status", "--output", "json"]);
    let egress = host.hermes(&["egress", "status", "--output", "json"]);
    let _ = flood.kill();
    let _ = flood.wait();
    assert_eq!(other.code, 0, "{other:?}");
    let echo: serde_json::Value = serde_json::from_str(other.stdout.trim()).unwrap();
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {OPENAI_KEY}")
    );
    let status: serde_json::Value =
        serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("{e}: {status:?}"));
    assert_eq!(status["proxy"]["healthy"], true, "{status:#}");
    let egress: serde_json::Value =
        serde_json::from_str(&egress.stdout).unwrap_or_else(|e| panic!("{e}: {egress:?}"));
    assert!(egress["counters"].is_object(), "{egress:#}");
    // The flood was held to its share and the rest closed at once, with
    // a bounded number of log lines saying so.
    let log = std::fs::read_to_string(host.home.path().join("proxy/proxy.log")).unwrap();
    let warnings = log.lines().filter(|l| l.contains("over the limit")).count();
    assert!((1..=10).contains(&warnings), "{warnings} warnings:\n{log}");
}

#[test]
fn huge_paths_leave_the_log_bounded_in_size_files_and_lines() {
    let mut proxy = Proxy::setup("");
    // Small files, to see the rotation at work: set by hand in
    // config.json, as an operator would.
    let config = proxy.dir().join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    json["limits"] = serde_json::json!({"log_max_bytes": 65536, "log_files": 2});
    std::fs::write(&config, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    proxy.start(&[]);
    let token = proxy.token("openai");
    let plain = ("127.0.0.1", proxy.port + 1);
    let send = |path: &str, host: &str| {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(plain).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            tcp,
            "GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {}\r\nConnection: close\r\n\r\n",
            "u".repeat(8000)
        )
        .unwrap();
        let mut response = Vec::new();
        let _ = tcp.read_to_end(&mut response);
        String::from_utf8_lossy(&response).into_owned()
    };
    let long_host = format!("{}.test", "h".repeat(60).repeat(50).replace("hh", "h."));
    let huge = format!("/v1/{token}/{}", "p".repeat(30_000));
    for i in 0..300 {
        let host = if i % 2 == 0 {
            "elsewhere.test"
        } else {
            long_host.as_str()
        };
        let response = send(&huge, host);
        assert!(response.starts_with("HTTP/1.1 4"), "{response:.200}");
    }
    let response = send("/the-last-request", "elsewhere.test");
    assert!(response.starts_with("HTTP/1.1 403"), "{response:.200}");
    // The log is written in order, after the answers: once the last
    // request's line is in, every rotation before it is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !proxy.log().contains("/the-last-request") {
        assert!(
            std::time::Instant::now() < deadline,
            "the last request is not in the log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut files: Vec<(String, u64)> = std::fs::read_dir(proxy.dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("proxy.log"))
        .map(|e| {
            let meta = e.metadata().unwrap();
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{e:?}");
            (e.file_name().into_string().unwrap(), meta.len())
        })
        .collect();
    files.sort();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["proxy.log", "proxy.log.1", "proxy.log.2"],
        "{files:?}"
    );
    for (name, size) in &files {
        assert!(*size <= 65536, "{name} holds {size} bytes");
        let text = std::fs::read_to_string(proxy.dir().join(name)).unwrap();
        assert!(!text.contains(&token), "a proxy token in {name}");
        for line in text.lines() {
            assert!(
                line.len() <= 4096,
                "a line of {} bytes in {name}",
                line.len()
            );
        }
    }
    // The log goes on after its rotations.
    let log = proxy.log_when(|l| l.contains("/the-last-request"));
    assert!(log.contains("/the-last-request"), "{log}");
}

/// A network namespace of the test's own with a veth pair inside it (both
/// ends), `addrs` on one end: addresses of an interface of the "host" the
/// proxy runs on, which is not a loopback interface. Removed when dropped.
struct Netns(String);

impl Netns {
    fn with_interface(addrs: &[&str]) -> Netns {
        let name = format!("hermes-atk-hostaddr-{}", std::process::id());
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .output();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        let n = ns.0.as_str();
        ip(&["-n", n, "link", "set", "lo", "up"]);
        ip(&[
            "-n", n, "link", "add", "hx0", "type", "veth", "peer", "name", "hx1",
        ]);
        for addr in addrs {
            let mut args = vec!["-n", n, "addr", "add", addr, "dev", "hx0"];
            if addr.contains(':') {
                args.push("nodad");
            }
            ip(&args);
        }
        ip(&["-n", n, "link", "set", "hx0", "up"]);
        ip(&["-n", n, "link", "set", "hx1", "up"]);
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output();
    }
}

#[test]
fn an_allowlisted_name_resolved_to_the_hosts_own_address_is_refused() {
    use hermes_tests::upstream::Counter;
    // Addresses no default deny range covers, as a host's public ones.
    let ns = Netns::with_interface(&["198.51.100.7/24", "2001:db8:7::7/64"]);
    let targets = [
        ("self4.test", "198.51.100.7"),
        ("self6.test", "2001:db8:7::7"),
    ];
    let counters: Vec<Counter> = targets
        .iter()
        .map(|(_, ip)| {
            Counter::start(
                std::net::SocketAddr::new(ip.parse().unwrap(), 0),
                Some(&ns.0),
            )
        })
        .collect();
    let mut yaml = String::from(
        "  listen: [127.0.0.1]\n  extra_allowed_hosts: [self4.test, self6.test]\n  resolve:\n",
    );
    for (name, ip) in targets {
        yaml.push_str(&format!("    {name}: \"{ip}\"\n"));
    }
    let mut proxy = Proxy::setup_in(&yaml, Some(&ns.0));
    proxy.start(&[]);
    for ((name, _), counter) in targets.iter().zip(&counters) {
        for port in [proxy.port, proxy.port + 1] {
            let (scheme, proxied) = if port == proxy.port {
                ("https", "%{http_connect}")
            } else {
                ("http", "%{http_code}")
            };
            let url = format!("{scheme}://{name}:{}/", counter.addr.port());
            let out = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns.0,
                    "curl",
                    "-sv",
                    "-k",
                    "--max-time",
                    "15",
                ])
                .args(["-o", "/dev/null", "-w", proxied, "-x"])
                .arg(format!("http://127.0.0.1:{port}"))
                .arg(&url)
                .env_remove("https_proxy")
                .env_remove("HTTPS_PROXY")
                .env_remove("http_proxy")
                .env_remove("HTTP_PROXY")
                .output()
                .unwrap();
            let code = String::from_utf8_lossy(&out.stdout).into_owned();
            let verbose = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
            assert_eq!(code, "403", "{url} via {port}: {verbose}");
            assert!(
                verbose.contains("x-hermes-egress-refused: denied-address"),
                "{verbose}"
            );
        }
    }
    // Nothing the proxy dialled was accepted before a connection of the
    // test's own.
    assert_eq!(
        counters
            .iter()
            .map(Counter::accepted_before_a_probe)
            .collect::<Vec<_>>(),
        [0, 0]
    );
    let log = proxy.log();
    assert!(
        log.contains("is an address of this host") || log.contains("denied-address"),
        "{log}"
    );
}
