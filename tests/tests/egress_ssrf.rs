//! The proxy's address checks end to end, with the default deny list:
//! names that resolve to loopback are refused on this machine's loopback;
//! addresses outside 127/8 (cloud metadata, private, unique-local) are
//! tested inside a network namespace of the test's own whose loopback
//! holds them, with the proxy, the client and counting listeners all in
//! it, so that even a wrong connection never leaves it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use hermes_tests::egress::Proxy;
use hermes_tests::upstream::{Counter, Upstream};

/// curl through the proxy at 127.0.0.1:`port`, inside `netns` if given:
/// (the CONNECT status, curl's verbose output).
fn curl_connect(netns: Option<&str>, port: u16, url: &str) -> (String, String) {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let out = cmd
        .args([
            "-sv",
            "-k",
            "--max-time",
            "15",
            "-o",
            "/dev/null",
            "-w",
            "%{http_connect}",
        ])
        .arg("-x")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(url)
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).to_ascii_lowercase(),
    )
}

#[test]
fn names_resolving_to_loopback_are_refused_and_the_upstream_sees_no_connection() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["api.openai.com"]);
    let mut proxy = Proxy::setup(
        "  extra_allowed_hosts: [localhost, loop.test]\n  resolve:\n    api.openai.com: 127.0.0.1\n    loop.test: 127.3.4.5\n",
    );
    proxy.start(&[]);
    let port = upstream.addr.port();
    for url in [
        format!("https://api.openai.com:{port}/"),
        format!("https://loop.test:{port}/"),
        format!("https://localhost:{port}/"),
    ] {
        let (code, verbose) = curl_connect(None, proxy.port, &url);
        assert_eq!(code, "403", "{url}: {verbose}");
        assert!(
            verbose.contains("x-hermes-egress-refused: denied-address"),
            "{url}: {verbose}"
        );
    }
    // Literals are no way around it: not on the allowlist, in any spelling.
    for url in [
        format!("https://127.0.0.1:{port}/"),
        format!("https://2130706433:{port}/"),
        format!("https://[::ffff:127.0.0.1]:{port}/"),
    ] {
        let (code, verbose) = curl_connect(None, proxy.port, &url);
        assert_eq!(code, "403", "{url}: {verbose}");
    }
    assert_eq!(upstream.accepted_before_a_probe(), 0);
    let log = proxy.log();
    assert!(log.contains(r#""reason":"denied-address""#), "{log}");
}

/// A network namespace of the test's own, removed when dropped.
struct Netns(String);

impl Netns {
    fn new(addrs: &[&str]) -> Netns {
        let name = format!("hermes-e2e-{}", std::process::id());
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        for addr in addrs {
            // An IPv6 address is tentative until duplicate address
            // detection ran, even on lo (asynchronously, after the add):
            // a bind in that window fails with EADDRNOTAVAIL. `nodad`
            // makes it usable at once.
            let mut args = vec!["-n", &ns.0, "addr", "add", addr, "dev", "lo"];
            if addr.contains(':') {
                args.push("nodad");
            }
            ip(&args);
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn addresses_outside_loopback_are_refused_inside_a_namespace_of_the_tests_own() {
    let ns = Netns::new(&["169.254.169.254/32", "10.0.0.1/32", "fc00::1/128"]);
    let targets = [
        ("metadata.test", "169.254.169.254"),
        ("private.test", "10.0.0.1"),
        ("ula.test", "fc00::1"),
    ];
    let counters: Vec<Counter> = targets
        .iter()
        .map(|(_, ip)| {
            let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 0);
            Counter::start(addr, Some(&ns.0))
        })
        .collect();
    let yaml = |deny: &str| {
        let mut y = format!(
            "  listen: [127.0.0.1]\n{deny}  extra_allowed_hosts: [metadata.test, private.test, ula.test]\n  resolve:\n"
        );
        for (name, ip) in targets {
            y.push_str(&format!("    {name}: \"{ip}\"\n"));
        }
        y
    };

    // The default deny list: every name refused, no connection made.
    let mut proxy = Proxy::setup_in(&yaml(""), Some(&ns.0));
    proxy.start(&[]);
    for ((name, _), counter) in targets.iter().zip(&counters) {
        let url = format!("https://{name}:{}/", counter.addr.port());
        let (code, verbose) = curl_connect(Some(&ns.0), proxy.port, &url);
        assert_eq!(code, "403", "{url}: {verbose}");
        assert!(
            verbose.contains("x-hermes-egress-refused: denied-address"),
            "{verbose}"
        );
    }
    drop(proxy);
    // Nothing the proxy dialled was accepted before a connection of the
    // test's own.
    assert_eq!(
        counters
            .iter()
            .map(Counter::accepted_before_a_probe)
            .collect::<Vec<_>>(),
        [0, 0, 0]
    );

    // The control: with a deny list that misses these ranges the proxy
    // does connect, and the counters see it. The check above could fail.
    let mut open = Proxy::setup_in(
        &yaml("  upstream_deny_cidrs: [192.0.2.0/24]\n"),
        Some(&ns.0),
    );
    open.start(&[]);
    for ((name, _), counter) in targets.iter().zip(&counters) {
        let url = format!("https://{name}:{}/", counter.addr.port());
        let (code, verbose) = curl_connect(Some(&ns.0), open.port, &url);
        assert_eq!(code, "200", "{url}: {verbose}");
    }
    // The first probe, then the proxy's connection, came before a second
    // probe.
    let before: Vec<usize> = counters
        .iter()
        .map(Counter::accepted_before_a_probe)
        .collect();
    assert!(before.iter().all(|n| *n >= 2), "{before:?}");
}
