//! Driving the egress proxy end to end: a home with the proxy set up and
//! started through the real binary (stopped when dropped), free port pairs,
//! the Docker bridge gateway, and running scripts inside a container of the
//! test image that trusts the proxy's CA the way a sandbox does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::{Run, TestHome};

/// A Node script that GETs `https://HOST:PORT/PATH` through `HTTPS_PROXY`
/// with a CONNECT of its own (Node's `https` ignores the proxy variables)
/// and prints the body: `node get.js HOST PORT PATH`.
pub const NODE_GET: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls');
const [host, port, path] = process.argv.slice(2);
const proxy = new URL(process.env.HTTPS_PROXY);
setTimeout(() => { console.log('TIMEOUT'); process.exit(1); }, 20000);
const connect = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: host + ':' + port });
connect.on('error', e => { console.log('ERR ' + e.message); process.exit(1); });
connect.on('connect', (res, socket) => {
  if (res.statusCode !== 200) { console.log('CONNECT ' + res.statusCode); process.exit(1); }
  const req = https.request({ host, port, path, method: 'GET',
      createConnection: () => tls.connect({ socket, servername: host }) }, resp => {
    let body = '';
    resp.on('data', d => body += d);
    resp.on('end', () => { console.log(body); process.exit(0); });
  });
  req.on('error', e => { console.log('ERR ' + e.message); process.exit(1); });
  req.end();
});
connect.end();
"#;

/// Where a sandbox finds the proxy's CA.
pub const CA_IN_CONTAINER: &str = "/etc/ssl/certs/hermes-egress-ca.crt";

/// A home whose proxy is set up (and started by [`Proxy::start`]).
#[derive(Debug)]
pub struct Proxy {
    pub home: TestHome,
    pub port: u16,
    started: bool,
    netns: Option<String>,
}

/// Stops a home's proxy when dropped (a pass the test ran may have
/// started it).
#[derive(Debug)]
pub struct StopProxy<'a>(pub &'a TestHome);

impl Drop for StopProxy<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(["egress", "stop"]);
    }
}

/// A port `p` such that `p` and `p + 1` are free on 127.0.0.1 and, when
/// given, on `also`.
pub fn free_port_pair(also: Option<std::net::IpAddr>) -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = first.local_addr() else {
            continue;
        };
        let p = addr.port();
        if p >= 65000 {
            continue;
        }
        let free =
            |ip: std::net::IpAddr, port: u16| std::net::TcpListener::bind((ip, port)).is_ok();
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        drop(first);
        if free(lo, p) && free(lo, p + 1) && also.is_none_or(|ip| free(ip, p) && free(ip, p + 1)) {
            return p;
        }
    }
    panic!("no free port pair found in 100 tries")
}

/// The gateway address of Docker's default bridge, where containers reach
/// the host.
pub fn bridge_gateway() -> std::net::IpAddr {
    network_gateway("bridge")
}

/// The host's address on the bridge of the Docker network `network`, read
/// the way the product reads it (`controller/src/egress/network.rs`): the
/// IPv4 address of the bridge's interface. The engine's own view of it,
/// `IPAM.Config[0].Gateway`, is empty on some engines (Debian's 20.10
/// reports only the subnet of its default bridge).
pub fn network_gateway(network: &str) -> std::net::IpAddr {
    let out = Command::new("docker")
        .args([
            "network",
            "inspect",
            network,
            "--format",
            "{{.Id}} {{index .Options \"com.docker.network.bridge.name\"}}",
        ])
        .output()
        .unwrap_or_else(|e| panic!("docker network inspect {network}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "docker network inspect {network}: {out:?}"
    );
    let mut words = text.split_whitespace();
    let id = words.next().unwrap_or_default();
    // The engine names a bridge `br-<first 12 of the id>` unless the
    // network's options name it.
    let bridge = match words.next().filter(|w| *w != "<no" && !w.is_empty()) {
        Some(name) => name.to_string(),
        None => format!("br-{}", id.get(..12).unwrap_or(id)),
    };
    interface_ipv4(&bridge)
        .unwrap_or_else(|| panic!("the bridge {bridge} of network {network} has no IPv4 address"))
}

/// The first IPv4 address of the host's interface `name`.
pub fn interface_ipv4(name: &str) -> Option<std::net::IpAddr> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
        (ifa.interface_name == name)
            .then(|| {
                ifa.address
                    .as_ref()?
                    .as_sockaddr_in()
                    .map(|v4| v4.ip().into())
            })
            .flatten()
    })
}

impl Proxy {
    /// A home with `proxy.tunnel_port` on a free pair and `proxy_yaml`
    /// (lines indented under `proxy:`), set up with `hermes egress setup`.
    pub fn setup(proxy_yaml: &str) -> Proxy {
        Proxy::setup_in(proxy_yaml, None)
    }

    /// Like [`Proxy::setup`], `egress setup` run with `env` added (where
    /// a credential source is found).
    pub fn setup_with(proxy_yaml: &str, env: &[(&str, &str)]) -> Proxy {
        Proxy::setup_with_in(proxy_yaml, env, None)
    }

    /// Like [`Proxy::setup`]; the proxy will run inside `netns`, where
    /// every port is free.
    pub fn setup_in(proxy_yaml: &str, netns: Option<&str>) -> Proxy {
        Proxy::setup_with_in(proxy_yaml, &[], netns)
    }

    fn setup_with_in(proxy_yaml: &str, env: &[(&str, &str)], netns: Option<&str>) -> Proxy {
        let home = TestHome::new();
        let port = match netns {
            Some(_) => 19090,
            None => free_port_pair(Some(bridge_gateway())),
        };
        home.write_config(format!("proxy:\n  tunnel_port: {port}\n{proxy_yaml}"));
        let proxy = Proxy {
            home,
            port,
            started: false,
            netns: netns.map(str::to_string),
        };
        let run = proxy.hermes(&["egress", "setup"], env);
        assert_eq!(run.code, 0, "egress setup: {run:?}");
        proxy
    }

    /// Runs `hermes --home H ARGS` (inside the namespace, if any) with
    /// `env` added to the environment.
    pub fn hermes(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "timeout", "60"])
                    .arg(crate::cli::hermes_bin())
                    .arg("--home")
                    .arg(self.home.path());
                c
            }
            None => self.home.command(Vec::<&str>::new()),
        };
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("running hermes: {e}"))
            .into()
    }

    /// `hermes egress start` with `env` (where the real keys come from).
    pub fn start(&mut self, env: &[(&str, &str)]) {
        let run = self.hermes(&["egress", "start"], env);
        assert_eq!(run.code, 0, "egress start: {run:?}\nlog:\n{}", self.log());
        self.started = true;
    }

    /// `hermes egress start` with `env`, its output returned (the proxy
    /// is stopped when dropped, whether it started or not).
    pub fn start_run(&mut self, env: &[(&str, &str)]) -> Run {
        self.started = true;
        self.hermes(&["egress", "start"], env)
    }

    pub fn dir(&self) -> PathBuf {
        self.home.path().join("proxy")
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir().join("ca.crt")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("proxy.log")).unwrap_or_default()
    }

    /// The access log once `done` holds of it, or as it is after 10 s: the
    /// proxy writes a request's line once its answer is on the way (a
    /// tunnel's once it closed), so a client may be done before the line is
    /// there.
    pub fn log_when(&self, done: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let log = self.log();
            if done(&log) || std::time::Instant::now() >= deadline {
                return log;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The proxy token of `provider`, from `tokens.json`.
    pub fn token(&self, provider: &str) -> String {
        let text = std::fs::read_to_string(self.dir().join("tokens.json"))
            .unwrap_or_else(|e| panic!("tokens.json: {e}"));
        let json: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("tokens.json: {e}"));
        json["tokens"][provider]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {provider}"))
            .to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if self.started {
            let _ = self.hermes(&["egress", "stop"], &[]);
        }
    }
}

/// What a script printed in a container, by section: `== name` lines open
/// a section.
#[derive(Debug)]
pub struct Sections {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Sections {
    /// The lines of section `name`, trimmed, without the marker.
    pub fn section(&self, name: &str) -> String {
        let marker = format!("== {name}");
        let mut out = String::new();
        let mut inside = false;
        for line in self.stdout.lines() {
            if line.starts_with("== ") {
                inside = line == marker;
                continue;
            }
            if inside {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.trim().to_string()
    }
}

/// Runs `script` (sh) in a container of the test image that reaches the
/// proxy as a sandbox does: `HTTPS_PROXY`/`HTTP_PROXY` on the bridge
/// gateway, the CA at [`CA_IN_CONTAINER`] with the trust variables of
/// curl, Python and Node, and `env` (the tokens). Files in `files` are
/// placed under `/t`.
pub fn in_container(
    proxy: &Proxy,
    env: &[(&str, String)],
    files: &[(&str, &str)],
    script: &str,
) -> Sections {
    in_container_with(proxy, env, files, &[], script)
}

/// Like [`in_container`], with `mounts` (host path, container path)
/// added read-only.
pub fn in_container_with(
    proxy: &Proxy,
    env: &[(&str, String)],
    files: &[(&str, &str)],
    mounts: &[(&Path, &str)],
    script: &str,
) -> Sections {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    std::fs::write(dir.path().join("run.sh"), script).unwrap_or_else(|e| panic!("run.sh: {e}"));
    let gateway = bridge_gateway();
    let https_proxy = format!("http://{gateway}:{}", proxy.port);
    let http_proxy = format!("http://{gateway}:{}", proxy.port + 1);
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "docker", "run", "--rm", "--network", "bridge"]);
    let mount = |src: &Path, dst: &str| format!("{}:{dst}:ro", src.display());
    cmd.arg("-v").arg(mount(&proxy.ca_path(), CA_IN_CONTAINER));
    cmd.arg("-v").arg(mount(dir.path(), "/t"));
    for (src, dst) in mounts {
        cmd.arg("-v").arg(mount(src, dst));
    }
    let mut vars: Vec<(String, String)> = vec![
        ("HTTPS_PROXY".into(), https_proxy.clone()),
        ("https_proxy".into(), https_proxy),
        ("HTTP_PROXY".into(), http_proxy.clone()),
        ("http_proxy".into(), http_proxy),
        ("NO_PROXY".into(), "127.0.0.1,localhost,::1".into()),
        ("SSL_CERT_FILE".into(), CA_IN_CONTAINER.into()),
        ("REQUESTS_CA_BUNDLE".into(), CA_IN_CONTAINER.into()),
        ("CURL_CA_BUNDLE".into(), CA_IN_CONTAINER.into()),
        ("NODE_EXTRA_CA_CERTS".into(), CA_IN_CONTAINER.into()),
        ("HERMES_EGRESS_PROXY".into(), "1".into()),
    ];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    for (k, v) in &vars {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    cmd.arg(crate::test_image()).args(["sh", "/t/run.sh"]);
    let out = cmd.output().unwrap_or_else(|e| panic!("docker run: {e}"));
    Sections {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Removes what transparent egress adds to a proxy-only network's
/// firewall (its `nat` chain and jump, the `DOCKER-USER`/`FORWARD` rules
/// that refuse a bypass at once), for tests that clean up by hand.
pub fn remove_transparent_rules(bridge: &str, chain: &str) {
    let iptables = |args: &[&str]| {
        // A rule may stand more than once: delete until it is gone.
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
        iptables(&[
            "-D",
            parent,
            "-i",
            bridge,
            "-p",
            "tcp",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ]);
        iptables(&[
            "-D",
            parent,
            "-i",
            bridge,
            "-j",
            "REJECT",
            "--reject-with",
            "icmp-port-unreachable",
        ]);
    }
    iptables(&["-t", "nat", "-D", "PREROUTING", "-i", bridge, "-j", chain]);
    iptables(&["-t", "nat", "-F", chain]);
    iptables(&["-t", "nat", "-X", chain]);
}

/// The lines of `stdout` under the marker line `== NAME` (up to the next
/// `== ` line): one part of a script that prints several.
pub fn section(stdout: &str, name: &str) -> String {
    let marker = format!("== {name}");
    let mut out = String::new();
    let mut inside = false;
    for line in stdout.lines() {
        if line.starts_with("== ") {
            inside = line == marker;
        } else if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
