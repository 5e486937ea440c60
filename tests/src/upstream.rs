//! A TLS upstream of the tests' own, standing in for a provider's API: its
//! own CA (handed to the proxy through `proxy.upstream_ca_file`), HTTP/2
//! and HTTP/1.1, and four endpoints: `/echo` answers what it received
//! (method, path, headers, body) as JSON, `/sse` streams three server-sent
//! events 400 ms apart, `/ws` is a WebSocket echo, `/slow?ms=N` answers after N ms. It counts every TCP
//! connection it accepts, so a test can show that a refused request never
//! reached it. Also [`Counter`]: a plain listener that only counts, inside
//! a network namespace when asked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, channel::Channel, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

type Body = BoxBody<Bytes, Infallible>;

/// A running upstream; stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    /// The PEM of the CA that signed the upstream's certificate.
    pub ca_pem: String,
    peers: Peers,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Upstream {
    /// Serves on `bind` (port 0 picks one) with a certificate for `names`.
    pub fn start(bind: SocketAddr, names: &[&str]) -> Upstream {
        let (ca_pem, chain, key) = certificates(names);
        let std_listener =
            std::net::TcpListener::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
        std_listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = std_listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let peers = Peers::default();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let seen = peers.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"));
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener)
                    .unwrap_or_else(|e| panic!("{e}"));
                let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
                .unwrap_or_else(|e| panic!("tls: {e}"));
                config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                let serve = async {
                    loop {
                        let Ok((tcp, peer)) = listener.accept().await else {
                            continue;
                        };
                        seen.push(peer);
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            let service = hyper::service::service_fn(handle);
                            let io = TokioIo::new(tls);
                            if h2 {
                                let _ =
                                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                        .serve_connection(io, service)
                                        .await;
                            } else {
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(io, service)
                                    .with_upgrades()
                                    .await;
                            }
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        Upstream {
            addr,
            ca_pem,
            peers,
            _stop: stop,
        }
    }

    /// How many TCP connections the upstream has accepted.
    pub fn accepted(&self) -> usize {
        self.peers.len()
    }

    /// How many connections the upstream accepted before one of the
    /// caller's own, made now ([`Peers::before_a_probe`]).
    pub fn accepted_before_a_probe(&self) -> usize {
        self.peers.before_a_probe(self.addr, None)
    }
}

/// A CA (its PEM), and a leaf for `names` signed by it (the chain and
/// the leaf's key), for the tests' own TLS servers.
pub fn certificates(
    names: &[&str],
) -> (
    String,
    Vec<rustls_pki_types::CertificateDer<'static>>,
    rustls_pki_types::PrivateKeyDer<'static>,
) {
    let fail = |e: rcgen::Error| -> ! { panic!("rcgen: {e}") };
    let ca_key = KeyPair::generate().unwrap_or_else(|e| fail(e));
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hermes test upstream CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap_or_else(|e| fail(e));
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap_or_else(|e| fail(e));
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    let leaf_params = CertificateParams::new(names).unwrap_or_else(|e| fail(e));
    let leaf = leaf_params
        .signed_by(&leaf_key, &issuer)
        .unwrap_or_else(|e| fail(e));
    (
        ca_cert.pem(),
        vec![leaf.der().clone(), ca_cert.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

async fn handle(mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    if path == "/ws" {
        return Ok(websocket(&mut req));
    }
    if path == "/slow" {
        let ms: u64 = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            .min(30_000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Ok(full(StatusCode::OK, "text/plain", "slow"));
    }
    if path == "/sse" {
        let (mut tx, body) = Channel::<Bytes, Infallible>::new(4);
        tokio::spawn(async move {
            for i in 1..=3 {
                if tx
                    .send_data(Bytes::from(format!("data: chunk {i}\n\n")))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        });
        let mut response = Response::new(body.boxed());
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/event-stream"),
        );
        return Ok(response);
    }
    let method = req.method().to_string();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(ToString::to_string)
        .unwrap_or_default();
    let version = format!("{:?}", req.version());
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let echo = serde_json::json!({
        "method": method,
        "path": path_and_query,
        "version": version,
        "headers": headers,
        "body": body,
    });
    Ok(full(StatusCode::OK, "application/json", echo.to_string()))
}

/// Answers a WebSocket handshake and echoes every text or binary frame.
fn websocket(req: &mut Request<Incoming>) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return full(StatusCode::BAD_REQUEST, "text/plain", "not a websocket");
    };
    let accept = derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut io = TokioIo::new(upgraded);
        // Bounded: a test sends a few frames.
        for _ in 0..16 {
            let mut head = [0u8; 2];
            if io.read_exact(&mut head).await.is_err() {
                return;
            }
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let mut len = u64::from(head[1] & 0x7f);
            if len == 126 {
                let mut ext = [0u8; 2];
                if io.read_exact(&mut ext).await.is_err() {
                    return;
                }
                len = u64::from(u16::from_be_bytes(ext));
            } else if len == 127 {
                let mut ext = [0u8; 8];
                if io.read_exact(&mut ext).await.is_err() {
                    return;
                }
                len = u64::from_be_bytes(ext);
            }
            if len > 1 << 20 {
                return;
            }
            let mut mask = [0u8; 4];
            if masked && io.read_exact(&mut mask).await.is_err() {
                return;
            }
            let mut payload = vec![0u8; usize::try_from(len).unwrap_or(0)];
            if io.read_exact(&mut payload).await.is_err() {
                return;
            }
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            if opcode == 0x8 {
                let _ = io.write_all(&[0x88, 0]).await;
                return;
            }
            let mut frame = vec![0x80 | opcode];
            if payload.len() < 126 {
                frame.push(u8::try_from(payload.len()).unwrap_or(0));
            } else {
                frame.push(126);
                frame.extend_from_slice(&u16::try_from(payload.len()).unwrap_or(0).to_be_bytes());
            }
            frame.extend_from_slice(&payload);
            if io.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    let mut response = full(StatusCode::SWITCHING_PROTOCOLS, "text/plain", Bytes::new());
    let headers = response.headers_mut();
    headers.remove(hyper::header::CONTENT_TYPE);
    headers.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(value) = accept.parse() {
        headers.insert("sec-websocket-accept", value);
    }
    response
}

/// A TCP listener that accepts, counts and closes; stops when dropped.
#[derive(Debug)]
pub struct Counter {
    pub addr: SocketAddr,
    peers: Peers,
    netns: Option<String>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Counter {
    /// Listens on `bind`, inside the network namespace `netns` (made with
    /// `ip netns add`) when given.
    pub fn start(bind: SocketAddr, netns: Option<&str>) -> Counter {
        let peers = Peers::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let netns = netns.map(|n| format!("/run/netns/{n}"));
        let (seen, stopping, inside) = (peers.clone(), stop.clone(), netns.clone());
        std::thread::spawn(move || {
            if let Some(path) = inside {
                enter_netns(&path);
            }
            let listener =
                std::net::TcpListener::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
            listener
                .set_nonblocking(true)
                .unwrap_or_else(|e| panic!("{e}"));
            let _ = tx.send(listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((_, peer)) => seen.push(peer),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("counter did not start: {e}"));
        Counter {
            addr,
            peers,
            netns,
            stop,
        }
    }

    pub fn accepted(&self) -> usize {
        self.peers.len()
    }

    /// How many connections the counter accepted before one of the
    /// caller's own, made now from the counter's namespace
    /// ([`Peers::before_a_probe`]).
    pub fn accepted_before_a_probe(&self) -> usize {
        self.peers.before_a_probe(self.addr, self.netns.as_deref())
    }
}

/// The peers of the connections a listener accepted, in the order it
/// accepted them.
#[derive(Debug, Clone, Default)]
pub struct Peers(Arc<Mutex<Vec<SocketAddr>>>);

impl Peers {
    fn push(&self, peer: SocketAddr) {
        self.lock().push(peer);
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SocketAddr>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connects to the listener at `addr` (from the network namespace at
    /// the path `netns`, when given), waits (at most 30 s) until it has
    /// accepted that connection, and returns how many it accepted before.
    /// A listener accepts connections in the order they were made, so
    /// every connection made before this call is counted by then: a count
    /// that no sleep can take too early.
    fn before_a_probe(&self, addr: SocketAddr, netns: Option<&str>) -> usize {
        let netns = netns.map(str::to_string);
        let probe = std::thread::spawn(move || {
            if let Some(path) = netns {
                enter_netns(&path);
            }
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("probe of {addr}: {e}"))
        })
        .join()
        .unwrap_or_else(|_| panic!("the probe of {addr} failed"));
        let mine = probe.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self
                .lock()
                .iter()
                .position(|p| (p.ip(), p.port()) == (mine.ip(), mine.port()));
            if let Some(before) = seen {
                return before;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the listener on {addr} never accepted its probe"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Moves this thread (only) into the network namespace at `path`.
fn enter_netns(path: &str) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
