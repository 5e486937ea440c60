//! The unit tests' TLS upstream, standing in for a provider's API on
//! loopback: its own CA (the proxy is told to trust it), HTTP/2 and
//! HTTP/1.1 (or HTTP/1.1 alone), and one answer: what it received (method,
//! path, headers, body) and on which of its connections, as JSON; `/slow`
//! answers after [`SLOW`]. It counts every TCP connection it accepts (each
//! one TLS handshake), so a test can show that a refused request never
//! reached it, or that connections were reused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How long `/slow` waits before it answers.
pub const SLOW: std::time::Duration = std::time::Duration::from_millis(400);

/// A running upstream; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    /// The PEM of the CA that signed the upstream's certificate.
    pub ca_pem: String,
    accepted: Arc<AtomicUsize>,
    /// The peers of the connections accepted, in the order accepted.
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Upstream {
    /// Serves on `bind` (port 0 picks one) with a certificate for `names`,
    /// on a runtime of its own (the tests' runtimes are single-threaded).
    /// HTTP/2 is offered in ALPN, or not (`h2`).
    pub fn start_with(bind: SocketAddr, names: &[&str], h2: bool) -> Upstream {
        let (ca_pem, chain, key) = certificates(names);
        let std_listener = std::net::TcpListener::bind(bind).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let peers = Arc::new(Mutex::new(Vec::new()));
        let seen = peers.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
                .unwrap();
                config.alpn_protocols = if h2 {
                    vec![b"h2".to_vec(), b"http/1.1".to_vec()]
                } else {
                    vec![b"http/1.1".to_vec()]
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                let serve = async {
                    loop {
                        let Ok((tcp, peer)) = listener.accept().await else {
                            continue;
                        };
                        seen.lock().unwrap().push(peer);
                        let connection = count.fetch_add(1, Ordering::SeqCst) + 1;
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            let service =
                                hyper::service::service_fn(move |req| echo(req, connection));
                            let io = TokioIo::new(tls);
                            if h2 {
                                let _ =
                                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                        .serve_connection(io, service)
                                        .await;
                            } else {
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(io, service)
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
            accepted,
            peers,
            _stop: stop,
        }
    }

    /// How many TCP connections the upstream has accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// How many TCP connections the upstream accepted before one of the
    /// caller's own, made now: the upstream accepts connections in the
    /// order they were made, so every one made before this call is counted
    /// once it accepted the probe (waited for, 10 s at most), a count no
    /// sleep can take too early.
    pub async fn accepted_before_a_probe(&self) -> usize {
        let probe = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let mine = probe.local_addr().unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let seen = self.peers.lock().unwrap().iter().position(|p| *p == mine);
            if let Some(before) = seen {
                return before;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the upstream never accepted its probe"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// A CA, and a leaf for `names` signed by it.
fn certificates(names: &[&str]) -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hermes unit-test upstream CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    (
        ca_cert.pem(),
        vec![leaf.der().clone(), ca_cert.der().clone()],
        PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
}

/// Answers what it received, and on which connection (counted from 1), as
/// JSON.
async fn echo(
    req: Request<Incoming>,
    connection: usize,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/slow" {
        tokio::time::sleep(SLOW).await;
    }
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(ToString::to_string)
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
            )
        })
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let echo = serde_json::json!({
        "method": method,
        "path": path,
        "headers": headers,
        "body": body,
        "connection": connection,
    });
    let mut response = Response::new(Full::new(Bytes::from(echo.to_string())));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
