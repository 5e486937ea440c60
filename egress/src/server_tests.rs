//! The proxy in-process, against a TLS upstream on loopback
//! ([`crate::test_upstream`]),
//! with a client that speaks CONNECT, TLS and HTTP/1.1 itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::ca::{Ca, generate};
use crate::test_upstream::Upstream;
use crate::tokens::{MappingsFile, TokensFile};

const KEY: &str = "sk-inprocess-REAL";

/// Access lines, captured.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

struct Fixture {
    proxy: SocketAddr,
    plain: SocketAddr,
    mgmt: SocketAddr,
    ca_pem: String,
    token: String,
    upstream: Upstream,
    lines: Lines,
    /// The proxy's pool of upstream connections.
    pool: Arc<Pool>,
    /// Its Unix socket (in `_dir`).
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn fixture() -> Fixture {
    fixture_with(crate::settings::Limits::default()).await
}

async fn fixture_with(limits: crate::settings::Limits) -> Fixture {
    fixture_full(limits, true).await
}

/// A fixture whose upstream offers HTTP/2 or not (`h2`).
async fn fixture_full(limits: crate::settings::Limits, h2: bool) -> Fixture {
    let upstream = Upstream::start_with("127.0.0.1:0".parse().unwrap(), &["api.openai.com"], h2);
    let new = generate().unwrap();
    let ca = Ca::load(&new.cert_pem, &new.key_pem).unwrap();
    let tokens = TokensFile::updated(None, false).unwrap();
    let credentials = Credentials::build(&MappingsFile::builtin(), &tokens, |name| {
        (name == "OPENAI_API_KEY").then(|| KEY.to_string())
    });
    let file = crate::settings::ProxyConfigFile {
        version: 1,
        tunnel_port: 1,
        listen: None,
        upstream_deny_cidrs: Some(vec!["169.254.0.0/16".parse().unwrap()]),
        extra_allowed_hosts: vec![],
        google_oauth_hosts: vec![],
        resolve: [("api.openai.com".to_string(), "127.0.0.1".parse().unwrap())].into(),
        upstream_ca_file: None,
        upstream_header_timeout_seconds: 10,
        credential_source: "env".into(),
        aws_region: "us-east-1".into(),
        aws_hosts: vec![],
        bitwarden_project_id: None,
        enforce_network: false,
        mgmt_token: "m".repeat(32),
        limits,
    };
    let mut settings = Settings::new(
        &file,
        vec!["127.0.0.1".parse().unwrap()],
        credentials,
        ca,
        Some(upstream.ca_pem.clone().into_bytes()),
    );
    settings.tunnel_port = 0;
    settings.http_port = 0;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    settings.unix_listen = Some(socket.clone());
    let lines = Lines::default();
    let server = bind(settings, Box::new(lines.clone())).await.unwrap();
    let bound = server.bound().clone();
    let pool = server.shared.pool.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Fixture {
        proxy: bound.tunnel[0],
        plain: bound.http[0],
        mgmt: bound.mgmt,
        ca_pem: new.cert_pem,
        token: tokens.tokens["openai"].clone(),
        upstream,
        lines,
        pool,
        socket,
        _dir: dir,
        _stop: stop,
    }
}

/// How long a test waits for what the proxy does after its answer.
const WAIT: Duration = Duration::from_secs(10);

impl Fixture {
    /// The access log once it holds every one of `parts` (the proxy logs a
    /// request after its answer), or after [`WAIT`].
    async fn logged(&self, parts: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let log = self.lines.text();
            if parts.iter().all(|p| log.contains(p)) || tokio::time::Instant::now() > deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most [`WAIT`]) until the pool keeps `n` connections: an
    /// HTTP/1.1 one goes back once its response was read to its end.
    async fn pool_keeps(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.pool.len() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the pool keeps {} connections, not {n}",
                self.pool.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Sends CONNECT for `authority`; the status line and headers.
async fn connect(proxy: SocketAddr, authority: &str) -> (TcpStream, String) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        let mut byte = [0u8; 1];
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    (tcp, String::from_utf8_lossy(&head).into_owned())
}

/// TLS with `sni` over `tcp`, trusting the proxy's CA, then one request.
async fn request(
    tcp: TcpStream,
    ca_pem: &str,
    sni: &str,
    req: Request<Empty<Bytes>>,
) -> Result<(StatusCode, HeaderMap, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

fn get(authority: &str, path: &str, auth: Option<&str>) -> Request<Empty<Bytes>> {
    let mut builder = Request::get(path).header("host", authority);
    if let Some(auth) = auth {
        builder = builder.header("authorization", auth);
    }
    builder.body(Empty::new()).unwrap()
}

#[tokio::test]
async fn the_token_is_swapped_for_the_key_and_the_log_names_only_the_provider() {
    let f = fixture().await;
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, head) = connect(f.proxy, &authority).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let auth = format!("Bearer {}", f.token);
    let req = get(&authority, "/echo?q=1", Some(&auth));
    let (status, _, body) = request(tcp, &f.ca_pem, "api.openai.com", req)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["headers"]["authorization"], format!("Bearer {KEY}"));
    assert_eq!(echo["headers"].get("proxy-authorization"), None);
    let log = f
        .logged(&[r#""token":"openai""#, r#""path":"/echo?q=""#])
        .await;
    assert!(log.contains(r#""token":"openai""#), "{log}");
    assert!(log.contains(r#""path":"/echo?q=""#), "{log}");
    assert!(!log.contains(KEY) && !log.contains(&f.token), "{log}");
}

#[tokio::test]
async fn a_host_off_the_allowlist_is_refused_before_the_tunnel_opens() {
    let f = fixture().await;
    let (_, head) = connect(f.proxy, "example.com:443").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.contains("x-hermes-egress-refused: not-allowed"),
        "{head}"
    );
    let (_, head) = connect(f.proxy, "not a target").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
}

#[tokio::test]
async fn the_sni_must_name_the_connect_host() {
    let f = fixture().await;
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, _) = connect(f.proxy, &authority).await;
    let req = get(&authority, "/echo", None);
    let err = request(tcp, &f.ca_pem, "api.anthropic.com", req)
        .await
        .unwrap_err();
    assert!(err.starts_with("tls"), "{err}");
    let log = f.logged(&[r#""reason":"sni-mismatch""#]).await;
    assert!(log.contains(r#""reason":"sni-mismatch""#), "{log}");
    assert_eq!(f.upstream.accepted_before_a_probe().await, 0);
}

#[tokio::test]
async fn the_host_header_must_name_the_tunnel() {
    let f = fixture().await;
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, _) = connect(f.proxy, &authority).await;
    let auth = format!("Bearer {}", f.token);
    let req = get("evil.test", "/echo", Some(&auth));
    let (status, headers, _) = request(tcp, &f.ca_pem, "api.openai.com", req)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(headers[REFUSED_HEADER], "host-mismatch");
    assert_eq!(f.upstream.accepted(), 0);
}

#[tokio::test]
async fn keys_never_travel_over_the_plain_port() {
    let f = fixture().await;
    let mut tcp = TcpStream::connect(f.plain).await.unwrap();
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    tcp.write_all(
        format!(
            "GET http://{authority}/echo HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            f.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("x-hermes-egress-refused: tls-required"),
        "{response}"
    );
    assert_eq!(f.upstream.accepted(), 0);
}

#[test]
fn hop_by_hop_headers_and_proxy_credentials_are_stripped() {
    let mut headers = HeaderMap::new();
    headers.insert(
        "connection",
        HeaderValue::from_static("keep-alive, x-secret-hop"),
    );
    headers.insert("x-secret-hop", HeaderValue::from_static("1"));
    headers.insert("proxy-authorization", HeaderValue::from_static("Basic abc"));
    headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    headers.insert("x-kept", HeaderValue::from_static("1"));
    strip_hop_by_hop(&mut headers, false);
    assert_eq!(headers.len(), 1, "{headers:?}");
    assert!(headers.contains_key("x-kept"));

    let mut upgrade = HeaderMap::new();
    upgrade.insert("connection", HeaderValue::from_static("Upgrade"));
    upgrade.insert("upgrade", HeaderValue::from_static("websocket"));
    assert!(is_upgrade(&upgrade));
    strip_hop_by_hop(&mut upgrade, true);
    assert_eq!(upgrade["upgrade"], "websocket");
    assert_eq!(upgrade["connection"], "upgrade");
}

#[tokio::test]
async fn a_doubled_host_header_is_refused_on_the_plain_port_too() {
    let f = fixture().await;
    let mut tcp = TcpStream::connect(f.plain).await.unwrap();
    let authority = format!("example.org:{}", f.upstream.addr.port());
    tcp.write_all(
        format!(
            "GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(
        response.contains("x-hermes-egress-refused: duplicate-host"),
        "{response}"
    );
    assert_eq!(f.upstream.accepted(), 0);
}

/// Whether the proxy closes `tcp` within `within` (reads end-of-file).
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

async fn health(mgmt: SocketAddr) -> String {
    let mut tcp = TcpStream::connect(mgmt).await.unwrap();
    let token = "m".repeat(32);
    tcp.write_all(
        format!("GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    response
}

/// Waits (at most [`WAIT`]) until health counts `n` open connections.
async fn open_within(mgmt: SocketAddr, n: usize) {
    let open = format!(r#""open":{n}"#);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = health(mgmt).await;
        if response.contains(&open) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {open}: {response}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_client_over_its_connection_limit_is_closed_at_once_and_health_answers() {
    let f = fixture_with(crate::settings::Limits {
        max_connections_per_client: Some(3),
        ..Default::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(f.proxy).await.unwrap());
    }
    // The three are admitted (a CONNECT on one still gets its answer)...
    open_within(f.mgmt, 3).await;
    // ...the fourth and fifth, on either port, are closed at once.
    for addr in [f.proxy, f.plain] {
        let mut over = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut over, Duration::from_secs(2)).await);
    }
    let response = health(f.mgmt).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""refused":2"#), "{response}");
    assert!(response.contains(r#""open":3"#), "{response}");
    // A place freed is a place taken again.
    drop(held.pop());
    open_within(f.mgmt, 2).await;
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, head) = connect(f.proxy, &authority).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let auth = format!("Bearer {}", f.token);
    let (status, _, _) = request(
        tcp,
        &f.ca_pem,
        "api.openai.com",
        get(&authority, "/echo", Some(&auth)),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn idle_connections_are_closed_before_the_first_request_and_between_requests() {
    let f = fixture_with(crate::settings::Limits {
        client_idle_timeout_seconds: Some(1),
        tunnel_idle_timeout_seconds: Some(1),
        ..Default::default()
    })
    .await;
    // Nothing sent at all.
    let mut idle = TcpStream::connect(f.proxy).await.unwrap();
    let started = std::time::Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Half a request head, then nothing.
    let mut slow = TcpStream::connect(f.plain).await.unwrap();
    slow.write_all(b"GET http://example.org/ HTTP/1.1\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await);

    // A tunnel left idle after one request (kept alive) is closed too.
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, _) = connect(f.proxy, &authority).await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(f.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("api.openai.com").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let auth = format!("Bearer {}", f.token);
    let response = sender
        .send_request(get(&authority, "/echo", Some(&auth)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle tunnel was not closed")
        .unwrap()
        .ok();
    assert!(started.elapsed() >= Duration::from_millis(900));
}

/// The body of a refusal, as JSON.
fn refusal_json(response: &str) -> serde_json::Value {
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {response}"))
}

#[tokio::test]
async fn refusals_carry_an_sdk_shaped_json_error() {
    let f = fixture().await;
    let mut tcp = TcpStream::connect(f.plain).await.unwrap();
    tcp.write_all(
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("content-type: application/json"),
        "{response}"
    );
    assert!(
        response.contains("x-hermes-egress-refused: not-allowed"),
        "{response}"
    );
    let body = refusal_json(&response);
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "hermes_egress_refused");
    assert_eq!(body["error"]["code"], "not-allowed");
    assert_eq!(
        body["error"]["message"],
        "hermes egress refused: example.com is not on the allowlist"
    );
}

#[test]
fn a_no_key_refusal_says_the_host_has_no_key() {
    let tokens = TokensFile::updated(None, false).unwrap();
    let credentials = Credentials::build(&MappingsFile::builtin(), &tokens, |_| None);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {}", tokens.tokens["openai"])).unwrap(),
    );
    let (reason, why) = swap_with(
        &credentials,
        &Host::Name("api.openai.com".into()),
        &mut headers,
        "/".into(),
    )
    .unwrap_err();
    assert_eq!(reason, "no-key");
    assert!(
        why.starts_with("the host has no real key for openai"),
        "{why}"
    );
    assert!(!why.contains("token"), "{why}");
}

#[tokio::test]
async fn plain_http_without_a_proxy_url_takes_its_target_from_the_host_header() {
    let f = fixture().await;
    let mut tcp = TcpStream::connect(f.plain).await.unwrap();
    tcp.write_all(
        format!(
            "GET /v1/models?x=1 HTTP/1.1\r\nHost: api.openai.com\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            f.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(
        response.contains("x-hermes-egress-refused: tls-required"),
        "{response}"
    );
    // A Host naming another port than 80 is no transparent request.
    let mut tcp = TcpStream::connect(f.plain).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: example.org:8080\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(
        response.contains("x-hermes-egress-refused: bad-target"),
        "{response}"
    );
    assert_eq!(f.upstream.accepted(), 0);
    let log = f
        .logged(&[
            r#""host":"api.openai.com","method":"GET","path":"/v1/models?x=""#,
            r#""reason":"tls-required","via":"transparent""#,
        ])
        .await;
    assert!(
        log.contains(r#""host":"api.openai.com","method":"GET","path":"/v1/models?x=""#)
            && log.contains(r#""reason":"tls-required","via":"transparent""#),
        "{log}"
    );
}

#[tokio::test]
async fn tls_without_connect_takes_its_target_from_the_sni() {
    let f = fixture().await;
    // Not on the allowlist: no certificate, the handshake fails.
    let tcp = TcpStream::connect(f.proxy).await.unwrap();
    let err = request(tcp, &f.ca_pem, "evil.test", get("evil.test", "/", None))
        .await
        .unwrap_err();
    assert!(err.starts_with("tls"), "{err}");
    // Allowlisted: the handshake completes with a leaf for the name and
    // the request goes the tunnel's way, to the name on port 443 (where
    // the fixture's upstream is not: the proxy says so).
    let tcp = TcpStream::connect(f.proxy).await.unwrap();
    let auth = format!("Bearer {}", f.token);
    let (status, headers, body) = request(
        tcp,
        &f.ca_pem,
        "api.openai.com",
        get("api.openai.com", "/echo", Some(&auth)),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(headers.contains_key(ERROR_HEADER), "{headers:?}");
    let body: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(body["error"]["type"], "hermes_egress_error");
    // The Host header must name the SNI, as in a tunnel.
    let tcp = TcpStream::connect(f.proxy).await.unwrap();
    let (status, headers, _) = request(
        tcp,
        &f.ca_pem,
        "api.openai.com",
        get("evil.test", "/echo", Some(&auth)),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(headers[REFUSED_HEADER], "host-mismatch");
    let log = f
        .logged(&[
            r#""host":"evil.test","method":"TLS","path":"","status":403"#,
            r#""reason":"not-allowed","via":"transparent""#,
            r#""reason":"host-mismatch","via":"transparent""#,
        ])
        .await;
    assert!(
        log.contains(r#""host":"evil.test","method":"TLS","path":"","status":403"#)
            && log.contains(r#""reason":"not-allowed","via":"transparent""#),
        "{log}"
    );
    assert!(
        log.contains(r#""reason":"host-mismatch","via":"transparent""#),
        "{log}"
    );
    assert_eq!(f.upstream.accepted_before_a_probe().await, 0);
}

/// One tunnel, one request with the token: the upstream's echo.
async fn one_tunnel(f: &Fixture, path: &str) -> serde_json::Value {
    let authority = format!("api.openai.com:{}", f.upstream.addr.port());
    let (tcp, head) = connect(f.proxy, &authority).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let auth = format!("Bearer {}", f.token);
    let (status, _, body) = request(
        tcp,
        &f.ca_pem,
        "api.openai.com",
        get(&authority, path, Some(&auth)),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["headers"]["authorization"], format!("Bearer {KEY}"));
    echo
}

#[tokio::test]
async fn sequential_tunnels_share_one_upstream_connection() {
    for h2 in [false, true] {
        let f = fixture_full(crate::settings::Limits::default(), h2).await;
        for _ in 0..5 {
            let echo = one_tunnel(&f, "/echo").await;
            assert_eq!(echo["connection"], 1, "h2 {h2}: {echo}");
            // The response read, the HTTP/1.1 connection goes back to
            // the pool a moment later (the HTTP/2 one stays in it).
            f.pool_keeps(1).await;
        }
        assert_eq!(f.upstream.accepted(), 1, "h2 {h2}: one TLS handshake");
    }
}

#[tokio::test]
async fn an_http1_upstream_connection_carries_one_request_at_a_time() {
    let f = fixture_full(crate::settings::Limits::default(), false).await;
    let (a, b, c) = tokio::join!(
        one_tunnel(&f, "/slow"),
        one_tunnel(&f, "/slow"),
        one_tunnel(&f, "/slow")
    );
    // Three at once: three connections.
    let mut seen = [&a, &b, &c].map(|e| e["connection"].as_u64().unwrap());
    seen.sort_unstable();
    assert_eq!(seen, [1, 2, 3]);
    assert_eq!(f.upstream.accepted(), 3);
    // Then, one after another, they are reused, once back in the pool.
    f.pool_keeps(3).await;
    for _ in 0..3 {
        let echo = one_tunnel(&f, "/echo").await;
        assert!(
            (1..=3).contains(&echo["connection"].as_u64().unwrap()),
            "{echo}"
        );
    }
    assert_eq!(f.upstream.accepted(), 3);
}

#[tokio::test]
async fn an_http2_upstream_connection_is_shared_by_concurrent_tunnels() {
    let f = fixture_full(crate::settings::Limits::default(), true).await;
    // The first request makes the connection; then three at once share it.
    one_tunnel(&f, "/echo").await;
    let (a, b, c) = tokio::join!(
        one_tunnel(&f, "/slow"),
        one_tunnel(&f, "/slow"),
        one_tunnel(&f, "/slow")
    );
    for echo in [a, b, c] {
        assert_eq!(echo["connection"], 1, "{echo}");
    }
    assert_eq!(f.upstream.accepted(), 1);
}

/// The Unix socket (bwrap sandboxes' way to the proxy): mode 0600, CONNECT
/// decided as on the tunnel port (an allowed host tunnelled, another
/// refused), a socket left by a dead proxy replaced, anything else there
/// refused.
#[tokio::test]
async fn the_unix_socket_serves_connect_as_the_tunnel_port_does() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture().await;
    let mode = std::fs::metadata(&f.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let ask = |target: String| {
        let socket = f.socket.clone();
        async move {
            let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut head = vec![0u8; 12];
            s.read_exact(&mut head).await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        }
    };
    let allowed = ask(format!("api.openai.com:{}", f.upstream.addr.port())).await;
    assert_eq!(allowed, "HTTP/1.1 200", "{allowed}");
    let refused = ask("evil.example:443".to_string()).await;
    assert_eq!(refused, "HTTP/1.1 403", "{refused}");

    // A socket left behind is replaced; a file in its place is refused.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(listen_unix(&stale).is_ok());
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "x").unwrap();
    let err = listen_unix(&file).unwrap_err().to_string();
    assert!(
        err.contains("something other than a socket is there"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
}
