//! The egress proxy under attack from a sandbox: a doubled `Host` header
//! carrying the real key somewhere else, a flood of idle connections
//! against every other sandbox of the home, an access log grown without
//! bound, and an allowlisted name pointed at the host's own addresses.

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
    assert_eq!(upstream.accepted(), 0, "{}", proxy.log());

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
    assert!(upstream.accepted() >= 1);
    let log = proxy.log();
    assert!(log.contains(r#""reason":"duplicate-host""#), "{log}");
    assert!(!log.contains(OPENAI_KEY) && !log.contains(&token), "{log}");
}
