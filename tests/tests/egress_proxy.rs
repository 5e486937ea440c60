//! The egress proxy end to end: the real `hermes` binary as the daemon, a
//! local TLS upstream of the test's own reached through `proxy.resolve`,
//! and real clients (curl, Python `urllib`, Node `https`) inside a
//! container of the test image that trusts the proxy's CA through the
//! environment, as a sandbox does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hermes_tests::egress::{NODE_GET, Proxy, in_container};
use hermes_tests::upstream::Upstream;

const OPENAI_KEY: &str = "sk-e2e-openai-REAL-0001";
const ANTHROPIC_KEY: &str = "sk-ant-e2e-REAL-0002";
const GOOGLE_KEY: &str = "AIza-e2e-REAL-0003";
const NAMES: &[&str] = &[
    "api.openai.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
];

/// A proxy whose provider hosts resolve to `upstream` on loopback, under
/// a deny list without 127/8, trusting the upstream's CA.
fn proxy_for(upstream: &Upstream) -> Proxy {
    let dir = tempfile::tempdir().unwrap().keep();
    let ca = dir.join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let resolve: String = NAMES
        .iter()
        .map(|n| format!("    {n}: 127.0.0.1\n"))
        .collect();
    let proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n{resolve}",
        ca.display()
    ));
    // The Anthropic key comes from .env, the others from the environment.
    std::fs::write(
        proxy.home.path().join(".env"),
        format!("ANTHROPIC_API_KEY={ANTHROPIC_KEY}\n"),
    )
    .unwrap();
    proxy
}

fn start(proxy: &mut Proxy) {
    proxy.start(&[
        ("OPENAI_API_KEY", OPENAI_KEY),
        ("GEMINI_API_KEY", GOOGLE_KEY),
    ]);
}

fn tokens(proxy: &Proxy) -> Vec<(&'static str, String)> {
    vec![
        ("OPENAI_API_KEY", proxy.token("openai")),
        ("ANTHROPIC_API_KEY", proxy.token("anthropic")),
        ("GEMINI_API_KEY", proxy.token("google")),
    ]
}

fn upstream() -> Upstream {
    Upstream::start("127.0.0.1:0".parse().unwrap(), NAMES)
}

#[test]
fn curl_python_and_node_in_a_container_reach_the_upstream_with_the_real_key() {
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    start(&mut proxy);
    let port = upstream.addr.port();
    let script = format!(
        r#"
echo "== curl"
curl -sS --max-time 20 "https://api.openai.com:{port}/echo?x=1" -H "Authorization: Bearer $OPENAI_API_KEY"
echo
echo "== python"
python3 - <<'PY'
import os, urllib.request
req = urllib.request.Request("https://api.anthropic.com:{port}/echo", data=b'{{"m": 1}}',
    headers={{"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json"}})
print(urllib.request.urlopen(req, timeout=20).read().decode())
PY
echo "== node"
node /t/get.js generativelanguage.googleapis.com {port} "/echo?alt=sse&key=$GEMINI_API_KEY&z=1"
"#
    );
    let out = in_container(&proxy, &tokens(&proxy), &[("get.js", NODE_GET)], &script);
    assert_eq!(out.code, 0, "{out:?}\nproxy log:\n{}", proxy.log());

    let curl: serde_json::Value = serde_json::from_str(&out.section("curl")).expect("curl echo");
    assert_eq!(
        curl["headers"]["authorization"],
        format!("Bearer {OPENAI_KEY}")
    );
    assert_eq!(curl["path"], "/echo?x=1");
    assert_eq!(curl["version"], "HTTP/2.0", "h2 upstream where offered");

    let python: serde_json::Value =
        serde_json::from_str(&out.section("python")).expect("python echo");
    assert_eq!(python["headers"]["x-api-key"], ANTHROPIC_KEY);
    assert_eq!(python["method"], "POST");
    assert_eq!(python["body"], r#"{"m": 1}"#);

    let node: serde_json::Value = serde_json::from_str(&out.section("node")).expect("node echo");
    assert_eq!(node["path"], format!("/echo?alt=sse&key={GOOGLE_KEY}&z=1"));

    // The log names the providers whose tokens were swapped, never a key.
    let log = proxy.log();
    for provider in ["openai", "anthropic", "google"] {
        assert!(log.contains(&format!(r#""token":"{provider}""#)), "{log}");
    }
    for key in [OPENAI_KEY, ANTHROPIC_KEY, GOOGLE_KEY] {
        assert!(!log.contains(key), "a real key in the log:\n{log}");
        // Every file the proxy keeps, those of its subdirectories too.
        let mut dirs = vec![proxy.dir()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                let path = entry.path();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    dirs.push(path);
                    continue;
                }
                // The proxy's Unix socket holds nothing to read.
                if !kind.is_file() {
                    continue;
                }
                let text = std::fs::read(&path).unwrap();
                assert!(
                    !String::from_utf8_lossy(&text).contains(key),
                    "{}",
                    path.display()
                );
            }
        }
    }
    assert!(log.contains(r#""path":"/echo?alt=&key=&z=""#), "{log}");
}

#[test]
fn requests_without_a_token_or_with_a_wrong_one_are_refused_before_the_upstream() {
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    start(&mut proxy);
    let port = upstream.addr.port();
    let wrong = "openai-0123456789abcdef0123456789abcdef";
    let script = format!(
        r#"
echo "== none"
curl -sS --max-time 20 -o /dev/null -D - "https://api.openai.com:{port}/echo"
echo "== wrong"
curl -sS --max-time 20 -o /dev/null -D - "https://api.openai.com:{port}/echo" -H "Authorization: Bearer {wrong}"
echo "== real-key"
curl -sS --max-time 20 -o /dev/null -D - "https://api.openai.com:{port}/echo" -H "Authorization: Bearer sk-a-real-key-the-sandbox-should-not-have"
echo "== other-provider"
curl -sS --max-time 20 -o /dev/null -D - "https://api.openai.com:{port}/echo" -H "Authorization: Bearer $ANTHROPIC_API_KEY"
echo "== python"
python3 - <<'PY'
import urllib.request, urllib.error
try:
    urllib.request.urlopen("https://api.anthropic.com:{port}/echo", timeout=20)
    print("ALLOWED")
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("x-hermes-egress-refused"))
PY
"#
    );
    let out = in_container(&proxy, &tokens(&proxy), &[], &script);
    assert_eq!(out.code, 0, "{out:?}");
    for (section, reason) in [
        ("none", "no-token"),
        ("wrong", "bad-token"),
        ("real-key", "bad-token"),
        ("other-provider", "bad-token"),
    ] {
        let heads = out.section(section).to_ascii_lowercase();
        // curl shows the CONNECT answer (200: the host is allowed), then the request's.
        assert!(heads.starts_with("http/1.1 200"), "{section}: {heads}");
        let head = heads.rsplit("http/1.1 ").next().unwrap();
        assert!(head.starts_with("403"), "{section}: {heads}");
        assert!(
            head.contains(&format!("x-hermes-egress-refused: {reason}")),
            "{section}: {head}"
        );
    }
    assert_eq!(out.section("python"), "403 no-token");
    assert_eq!(
        upstream.accepted_before_a_probe(),
        0,
        "a refused request reached the upstream"
    );
}

#[test]
fn server_sent_events_arrive_one_at_a_time_before_the_stream_ends() {
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    start(&mut proxy);
    let port = upstream.addr.port();
    let script = format!(
        r#"
echo "== sse"
python3 - <<'PY'
import os, time, urllib.request
req = urllib.request.Request("https://api.openai.com:{port}/sse",
    headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
t0 = time.monotonic()
with urllib.request.urlopen(req, timeout=20) as r:
    for line in r:
        if line.strip():
            print("%.3f %s" % (time.monotonic() - t0, line.decode().strip()), flush=True)
PY
"#
    );
    let out = in_container(&proxy, &tokens(&proxy), &[], &script);
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<(f64, String)> = out
        .section("sse")
        .lines()
        .map(|l| {
            let (t, rest) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), rest.to_string())
        })
        .collect();
    let texts: Vec<&str> = lines.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["data: chunk 1", "data: chunk 2", "data: chunk 3"]);
    // The upstream sends them 400 ms apart: buffered, they would arrive together.
    assert!(lines[1].0 - lines[0].0 > 0.25, "{lines:?}");
    assert!(lines[2].0 - lines[0].0 > 0.6, "{lines:?}");
}

#[test]
fn a_websocket_echo_round_trips_through_the_proxy() {
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    start(&mut proxy);
    let port = upstream.addr.port();
    let script = format!(
        r#"
echo "== ws"
python3 - <<'PY'
import base64, os, socket, ssl, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=20)
s.sendall(b"CONNECT api.openai.com:{port} HTTP/1.1\r\nHost: api.openai.com:{port}\r\n\r\n")
def head(sock):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 8192:
        data += sock.recv(1)
    return data
print(head(s).split(b"\r\n")[0].decode())
t = ssl.create_default_context().wrap_socket(s, server_hostname="api.openai.com")
key = base64.b64encode(os.urandom(16)).decode()
t.sendall(("GET /ws HTTP/1.1\r\nHost: api.openai.com:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
           "Authorization: Bearer %s\r\n\r\n" % (key, os.environ["OPENAI_API_KEY"])).encode())
print(head(t).split(b"\r\n")[0].decode())
for msg in (b"hello through hermes", b"second frame"):
    mask = os.urandom(4)
    t.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
    h = t.recv(2)
    n = h[1] & 0x7f
    payload = b""
    while len(payload) < n:
        payload += t.recv(n - len(payload))
    print("ECHO", payload.decode())
PY
"#
    );
    let out = in_container(&proxy, &tokens(&proxy), &[], &script);
    assert_eq!(out.code, 0, "{out:?}\n{}", proxy.log());
    assert_eq!(
        out.section("ws"),
        "HTTP/1.1 200 OK\nHTTP/1.1 101 Switching Protocols\nECHO hello through hermes\nECHO second frame"
    );
    let log = proxy.log_when(|l| l.contains(r#""status":101"#));
    assert!(log.contains(r#""status":101"#), "{log}");
}

/// curl on the host through the proxy on 127.0.0.1; the status code.
fn host_curl(proxy: &Proxy, url: &str, token: &str) -> String {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("-x")
        .arg(format!("http://127.0.0.1:{}", proxy.port))
        .arg("--cacert")
        .arg(proxy.ca_path())
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(url)
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn setup_keeps_tokens_and_rotation_retires_the_old_ones() {
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    let before = std::fs::read_to_string(proxy.dir().join("tokens.json")).unwrap();
    let again = proxy.hermes(&["egress", "setup"], &[]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("kept"), "{}", again.stdout);
    assert_eq!(
        std::fs::read_to_string(proxy.dir().join("tokens.json")).unwrap(),
        before
    );
    start(&mut proxy);
    let url = format!("https://api.openai.com:{}/echo", upstream.addr.port());
    let old = proxy.token("openai");
    assert_eq!(host_curl(&proxy, &url, &old), "200");

    let pid = std::fs::read_to_string(proxy.dir().join("proxy.pid")).unwrap();
    // Without the key in this environment: the daemon keeps its own.
    let rotate = proxy.hermes(&["egress", "setup", "--rotate-tokens"], &[]);
    assert_eq!(rotate.code, 0, "{rotate:?}");
    assert!(rotate.stdout.contains("rotated"), "{}", rotate.stdout);
    assert!(
        rotate.stdout.contains("reloaded its tokens"),
        "{}",
        rotate.stdout
    );
    assert_eq!(
        std::fs::read_to_string(proxy.dir().join("proxy.pid")).unwrap(),
        pid,
        "reloaded in place, not restarted"
    );
    let new = proxy.token("openai");
    assert_ne!(new, old);
    assert_eq!(
        host_curl(&proxy, &url, &old),
        "403",
        "the old token still works"
    );
    assert_eq!(host_curl(&proxy, &url, &new), "200");
}

#[test]
fn the_upstream_header_timeout_is_the_configured_one() {
    let upstream = upstream();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16]\n  upstream_ca_file: {}\n  upstream_header_timeout_seconds: 3\n  resolve:\n    api.openai.com: 127.0.0.1\n",
        ca.display()
    ));
    proxy.start(&[("OPENAI_API_KEY", OPENAI_KEY)]);
    let token = proxy.token("openai");
    let base = format!("https://api.openai.com:{}", upstream.addr.port());
    // Headers after 1 s: within the limit.
    assert_eq!(
        host_curl(&proxy, &format!("{base}/slow?ms=1000"), &token),
        "200"
    );
    // Headers after 30 s: the proxy gives up at 3 s (the default is
    // 300 s). Not sooner; and later only by what a loaded machine adds.
    let started = std::time::Instant::now();
    assert_eq!(
        host_curl(&proxy, &format!("{base}/slow?ms=30000"), &token),
        "504"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

/// The real `openai` Python SDK (from PyPI, in a venv kept under the
/// target directory), on the host through the proxy, calls a host not on
/// the allowlist (over https and plain http) and a provider whose real key
/// the host lacks: each error it raises carries the proxy's reason,
/// "hermes egress refused: …". A refused tunnel is a connection error to
/// the SDK, whatever the proxy says (its message is always "Connection
/// error."): the reason is on its cause, the status line of the refused
/// CONNECT, which a traceback prints.
#[test]
fn the_openai_sdk_shows_the_proxys_refusal() {
    let Some(python) = hermes_tests::python::venv(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "openai-sdk-venv",
        &["openai"],
    ) else {
        return;
    };
    let upstream = upstream();
    let mut proxy = proxy_for(&upstream);
    // No OpenAI key on the host (the Anthropic one comes from .env).
    proxy.start(&[]);
    let port = upstream.addr.port();
    let script = r#"
import json, sys
import openai
port, token = sys.argv[1], sys.argv[2]
def call(base):
    client = openai.OpenAI(api_key=token, base_url=base, max_retries=0, timeout=20)
    try:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
        return {"error": None}
    except openai.APIStatusError as e:
        return {"error": type(e).__name__, "status": e.status_code, "message": str(e), "body": e.body}
    except openai.APIConnectionError as e:
        return {"error": type(e).__name__, "message": str(e), "cause": str(e.__cause__)}
print(json.dumps({
    "https_not_allowed": call("https://not-allowed.example.org:%s/v1" % port),
    "http_not_allowed": call("http://not-allowed.example.org:%s/v1" % port),
    "no_key": call("https://api.openai.com:%s/v1" % port),
}))
"#;
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(port.to_string())
        .arg(proxy.token("openai"))
        .env("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .env("HTTP_PROXY", format!("http://127.0.0.1:{}", proxy.port + 1))
        .env("SSL_CERT_FILE", proxy.ca_path())
        .env_remove("https_proxy")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let not_allowed = "hermes egress refused: not-allowed.example.org is not on the allowlist";
    let tunnel = &result["https_not_allowed"];
    assert_eq!(tunnel["error"], "APIConnectionError", "{tunnel}");
    assert_eq!(tunnel["cause"], format!("403 {not_allowed}"), "{tunnel}");
    let plain = &result["http_not_allowed"];
    assert_eq!(plain["error"], "PermissionDeniedError", "{plain}");
    assert_eq!(
        plain["message"],
        format!("Error code: 403 - {not_allowed}"),
        "{plain}"
    );
    assert_eq!(plain["body"]["code"], "not-allowed", "{plain}");
    let no_key = &result["no_key"];
    assert_eq!(no_key["error"], "PermissionDeniedError", "{no_key}");
    assert!(
        no_key["message"].as_str().unwrap().starts_with(
            "Error code: 403 - hermes egress refused: the host has no real key for openai"
        ),
        "{no_key}"
    );
    assert_eq!(no_key["body"]["code"], "no-key", "{no_key}");
    assert_eq!(
        upstream.accepted_before_a_probe(),
        0,
        "a refused request reached the upstream"
    );
}

/// The machine account's access token the stand-in `bws` accepts.
const BWS_TOKEN: &str = "0.e2e-machine-account-token";
const BWS_PROJECT: &str = "e325ea69-a3ab-4dff-836f-b02e013fe530";

/// A stand-in for Bitwarden's `bws` in `dir`: `bws secret list PROJECT
/// --output json` with the right access token prints `dir/secrets.json`;
/// with a `dir/fail` file it fails as the service's errors do.
fn stand_in_bws(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        r#"#!/bin/sh
d=$(dirname "$0")
[ "$BWS_ACCESS_TOKEN" = "{BWS_TOKEN}" ] || {{ echo "Error: [400 Bad Request] invalid_client" >&2; exit 1; }}
[ -e "$d/fail" ] && {{ echo "Error: [503 Service Unavailable] try again later" >&2; exit 1; }}
[ "$*" = "secret list {BWS_PROJECT} --output json" ] || {{ echo "unexpected arguments: $*" >&2; exit 2; }}
cat "$d/secrets.json"
"#
    );
    let path = dir.join("bws");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `bws secret list`'s JSON as Bitwarden publishes it, holding `openai`.
fn bws_list(openai: &str) -> String {
    serde_json::json!([
        {
            "object": "secret",
            "id": "be8e0ad8-d545-4017-a55a-b02f014d4158",
            "organizationId": "10e8cbfa-7bd2-4361-bd6f-b02e013f9c41",
            "projectId": BWS_PROJECT,
            "key": "OPENAI_API_KEY",
            "value": openai,
            "note": "",
            "creationDate": "2026-11-28T20:13:20.643567Z",
            "revisionDate": "2026-11-28T20:13:20.643567Z"
        },
        {
            "object": "secret",
            "id": "0b8e0ad8-d545-4017-a55a-b02f014d4159",
            "organizationId": "10e8cbfa-7bd2-4361-bd6f-b02e013f9c41",
            "projectId": BWS_PROJECT,
            "key": "SOME_OTHER_SETTING",
            "value": "not a provider key",
            "note": "",
            "creationDate": "2026-11-28T20:13:20.643567Z",
            "revisionDate": "2026-11-28T20:13:20.643567Z"
        }
    ])
    .to_string()
}

/// The `Authorization` header the upstream's `/echo` received through
/// the proxy on 127.0.0.1.
fn upstream_saw(proxy: &Proxy, url: &str, token: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-x"])
        .arg(format!("http://127.0.0.1:{}", proxy.port))
        .arg("--cacert")
        .arg(proxy.ca_path())
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(url)
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    json["headers"]["authorization"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `proxy.credential_source: bitwarden`: the real keys come from `bws
/// secret list` (a stand-in printing the published JSON), at `egress
/// setup`, at start and on each reload; a rotation in Bitwarden reaches
/// the running proxy with `egress setup`; a failed or impossible read is a
/// clear error and the proxy keeps the keys it holds; no key is written to
/// disk.
#[test]
fn bitwarden_keys_reach_the_upstream_and_a_rotation_reaches_the_running_proxy() {
    let upstream = upstream();
    let bws = tempfile::tempdir().unwrap();
    stand_in_bws(bws.path());
    let (first, second, third) = (
        "sk-bw-e2e-first-0001",
        "sk-bw-e2e-second-0002",
        "sk-bw-e2e-third-0003",
    );
    std::fs::write(bws.path().join("secrets.json"), bws_list(first)).unwrap();
    let system_path = std::env::var("PATH").unwrap_or_default();
    let path = format!("{}:{system_path}", bws.path().display());
    let env = [("PATH", path.as_str()), ("BWS_ACCESS_TOKEN", BWS_TOKEN)];
    let ca = bws.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let mut proxy = Proxy::setup_with(
        &format!(
            "  credential_source: bitwarden\n  bitwarden_project_id: {BWS_PROJECT}\n  upstream_deny_cidrs: [169.254.0.0/16]\n  upstream_ca_file: {}\n  resolve:\n    api.openai.com: 127.0.0.1\n",
            ca.display()
        ),
        &env,
    );
    // An OpenAI key in .env is not the source any more.
    std::fs::write(
        proxy.home.path().join(".env"),
        "OPENAI_API_KEY=sk-dotenv-not-used\n",
    )
    .unwrap();
    proxy.start(&env);
    let url = format!("https://api.openai.com:{}/echo", upstream.addr.port());
    let token = proxy.token("openai");
    assert_eq!(
        upstream_saw(&proxy, &url, &token),
        format!("Bearer {first}")
    );

    // Rotated in Bitwarden: `egress setup` reads it and the proxy reloads.
    std::fs::write(bws.path().join("secrets.json"), bws_list(second)).unwrap();
    let pid = std::fs::read_to_string(proxy.dir().join("proxy.pid")).unwrap();
    let setup = proxy.hermes(&["egress", "setup"], &env);
    assert_eq!(setup.code, 0, "{setup:?}");
    assert!(
        setup
            .stdout
            .contains("Keys:     from Bitwarden Secrets Manager (OPENAI_API_KEY)"),
        "{setup:?}"
    );
    assert!(setup.stdout.contains("reloaded"), "{setup:?}");
    assert_eq!(
        std::fs::read_to_string(proxy.dir().join("proxy.pid")).unwrap(),
        pid
    );
    assert_eq!(
        upstream_saw(&proxy, &url, &token),
        format!("Bearer {second}")
    );

    // Bitwarden fails: setup says why and exits 1; a reload signalled
    // anyway keeps the last good key.
    std::fs::write(bws.path().join("secrets.json"), bws_list(third)).unwrap();
    std::fs::write(bws.path().join("fail"), "").unwrap();
    let failed = proxy.hermes(&["egress", "setup"], &env);
    assert_eq!(failed.code, 1, "{failed:?}");
    assert!(
        failed.stderr.contains("bws secret list failed")
            && failed
                .stderr
                .contains("[503 Service Unavailable] try again later"),
        "{failed:?}"
    );
    let pid: i32 = pid.trim().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !proxy
        .log()
        .contains("reload failed, keeping the old tokens")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed reload in the log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        proxy.log().contains("[503 Service Unavailable]"),
        "{}",
        proxy.log()
    );
    assert_eq!(
        upstream_saw(&proxy, &url, &token),
        format!("Bearer {second}")
    );

    // No bws on PATH, no access token: each a clear error.
    let no_bws = proxy.hermes(
        &["egress", "setup"],
        &[
            ("PATH", system_path.as_str()),
            ("BWS_ACCESS_TOKEN", BWS_TOKEN),
        ],
    );
    assert_eq!(no_bws.code, 1, "{no_bws:?}");
    assert!(
        no_bws.stderr.contains("the `bws` command") && no_bws.stderr.contains("not on PATH"),
        "{no_bws:?}"
    );
    let no_token = proxy.hermes(&["egress", "setup"], &[("PATH", path.as_str())]);
    assert_eq!(no_token.code, 1, "{no_token:?}");
    assert!(
        no_token.stderr.contains("BWS_ACCESS_TOKEN is not set"),
        "{no_token:?}"
    );
    // `config check` says so too, without asking Bitwarden.
    for (env, says) in [
        (
            &[
                ("PATH", system_path.as_str()),
                ("BWS_ACCESS_TOKEN", BWS_TOKEN),
            ][..],
            "not on PATH",
        ),
        (
            &[("PATH", path.as_str())][..],
            "BWS_ACCESS_TOKEN is not set",
        ),
    ] {
        let check = proxy.hermes(&["config", "check"], env);
        assert_eq!(check.code, 0, "{check:?}");
        assert!(check.stderr.contains(says), "{says}: {check:?}");
    }
    let check = proxy.hermes(&["config", "check"], &env);
    assert!(!check.stderr.contains("bws"), "{check:?}");

    // The keys were never written to disk.
    let mut stack = vec![proxy.home.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let text = String::from_utf8_lossy(&bytes);
                for key in [first, second, third, BWS_TOKEN] {
                    assert!(!text.contains(key), "{key} in {}", path.display());
                }
            }
        }
    }
}
