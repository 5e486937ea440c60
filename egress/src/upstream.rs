//! Connections to upstreams: verified TLS (the system's roots plus
//! `proxy.upstream_ca_file`) with HTTP/2 where the upstream offers it and
//! HTTP/1.1 otherwise, or plain TCP for the plain-HTTP port; every dial
//! goes through [`crate::dial`], so only checked addresses are reached.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio_rustls::TlsConnector;

use crate::body::RequestBody;
use crate::dial::{self, DialError};
use crate::policy::{DenyList, Host};
use crate::target::Target;

/// How long the upstream TLS handshake may take.
pub const TLS_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Dial(#[from] DialError),
    #[error("TLS with {target} failed: {source}")]
    Tls {
        target: String,
        source: std::io::Error,
    },
    #[error("HTTP with the upstream failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("{0} is not a name a certificate can carry")]
    Name(String),
    #[error("no trusted roots: {0}")]
    Roots(String),
}

impl UpstreamError {
    /// The word in the error header and the access log.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Dial(e) => e.reason(),
            UpstreamError::Tls { .. } | UpstreamError::Name(_) | UpstreamError::Roots(_) => {
                "upstream-tls"
            }
            UpstreamError::Http(_) => "upstream-error",
        }
    }

    pub fn is_refusal(&self) -> bool {
        matches!(self, UpstreamError::Dial(DialError::Denied(_)))
    }
}

/// A client connection to one upstream.
#[derive(Debug)]
pub enum Sender {
    H1(http1::SendRequest<RequestBody>),
    H2(http2::SendRequest<RequestBody>),
}

pub type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<Incoming>, hyper::Error>> + Send>>;

/// What [`Sender::try_send`] returns.
pub type TryResponseFuture = Pin<
    Box<dyn Future<Output = Result<Response<Incoming>, TrySendError<Request<RequestBody>>>> + Send>,
>;

impl Sender {
    pub fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    pub fn is_h2(&self) -> bool {
        matches!(self, Sender::H2(_))
    }

    /// Another handle on the same connection, if it multiplexes (HTTP/2).
    pub fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }

    /// Waits until the connection can take a request (HTTP/1.1: the last
    /// response has been read to its end).
    pub async fn ready(&mut self) -> Result<(), hyper::Error> {
        match self {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        }
    }

    /// Sends `req` (origin-form URI, Host header set); HTTP/2 gets the
    /// authority in the URI instead of a Host header. The returned future
    /// does not borrow the sender, which can take the next request once
    /// [`Sender::ready`].
    pub fn send(
        &mut self,
        req: Request<impl Into<RequestBody>>,
        target: &Target,
    ) -> ResponseFuture {
        let sent = self.try_send(req.map(Into::into), target);
        Box::pin(async move { sent.await.map_err(TrySendError::into_error) })
    }

    /// [`Sender::send`], giving the request back when it was not sent at
    /// all (the connection had closed, or was not ready): it can go on
    /// another connection.
    pub fn try_send(
        &mut self,
        mut req: Request<RequestBody>,
        target: &Target,
    ) -> TryResponseFuture {
        match self {
            Sender::H1(s) => Box::pin(s.try_send_request(req)),
            Sender::H2(s) => {
                let path = req
                    .uri()
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str())
                    .to_string();
                let authority = target.https_authority();
                if let Ok(uri) = format!("https://{authority}{path}").parse() {
                    *req.uri_mut() = uri;
                }
                req.headers_mut().remove(hyper::header::HOST);
                *req.version_mut() = hyper::Version::HTTP_2;
                Box::pin(s.try_send_request(req))
            }
        }
    }
}

/// The TLS client side: two configurations over one root store.
#[derive(Clone)]
pub struct UpstreamTls {
    /// ALPN h2 and http/1.1.
    any: TlsConnector,
    /// ALPN http/1.1 only, for upgrades.
    h1: TlsConnector,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls").finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// The system's roots plus `extra_pem` (certificates in PEM).
    pub fn new(
        extra_pem: Option<&[u8]>,
        provider: Arc<CryptoProvider>,
    ) -> Result<UpstreamTls, UpstreamError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(pem) = extra_pem {
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert =
                    cert.map_err(|e| UpstreamError::Roots(format!("upstream CA file: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| UpstreamError::Roots(format!("upstream CA file: {e}")))?;
                added += 1;
            }
            if added == 0 {
                return Err(UpstreamError::Roots(
                    "the upstream CA file holds no certificate".into(),
                ));
            }
        }
        if roots.is_empty() {
            return Err(UpstreamError::Roots(
                "no system CA certificates found (install ca-certificates)".into(),
            ));
        }
        let roots = Arc::new(roots);
        let config = |alpn: Vec<Vec<u8>>| -> Result<TlsConnector, UpstreamError> {
            let mut c = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| UpstreamError::Roots(e.to_string()))?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            c.alpn_protocols = alpn;
            Ok(TlsConnector::from(Arc::new(c)))
        };
        Ok(UpstreamTls {
            any: config(vec![b"h2".to_vec(), b"http/1.1".to_vec()])?,
            h1: config(vec![b"http/1.1".to_vec()])?,
        })
    }

    /// A verified TLS connection to `target` at one of `addrs`, and the
    /// address it reached; HTTP/2 unless `h1_only` or the upstream does
    /// not offer it.
    pub async fn connect(
        &self,
        target: &Target,
        addrs: &[SocketAddr],
        deny: &DenyList,
        h1_only: bool,
    ) -> Result<(Sender, SocketAddr), UpstreamError> {
        let (tcp, addr) = dial::connect(addrs, deny).await?;
        let name = match &target.host {
            Host::Name(n) => {
                ServerName::try_from(n.clone()).map_err(|_| UpstreamError::Name(n.clone()))?
            }
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let connector = if h1_only { &self.h1 } else { &self.any };
        let tls = match tokio::time::timeout(TLS_TIMEOUT, connector.connect(name, tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(source)) => {
                return Err(UpstreamError::Tls {
                    target: target.to_string(),
                    source,
                });
            }
            Err(_) => {
                return Err(UpstreamError::Tls {
                    target: target.to_string(),
                    source: std::io::ErrorKind::TimedOut.into(),
                });
            }
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(Duration::from_secs(30))
                .handshake(io)
                .await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2 connection ended");
                }
            });
            Ok((Sender::H2(sender), addr))
        } else {
            Ok((handshake_h1(io).await?, addr))
        }
    }
}

impl UpstreamTls {
    /// A verified TLS stream (ALPN http/1.1) to `target` at one of
    /// `addrs`, for the proxy's own requests (the Google token exchange).
    pub async fn connect_stream(
        &self,
        target: &Target,
        addrs: &[SocketAddr],
        deny: &DenyList,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, UpstreamError> {
        let (tcp, _) = dial::connect(addrs, deny).await?;
        let name = match &target.host {
            Host::Name(n) => {
                ServerName::try_from(n.clone()).map_err(|_| UpstreamError::Name(n.clone()))?
            }
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        match tokio::time::timeout(TLS_TIMEOUT, self.h1.connect(name, tcp)).await {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(source)) => Err(UpstreamError::Tls {
                target: target.to_string(),
                source,
            }),
            Err(_) => Err(UpstreamError::Tls {
                target: target.to_string(),
                source: std::io::ErrorKind::TimedOut.into(),
            }),
        }
    }
}

/// A plain TCP connection (the plain-HTTP port), HTTP/1.1, and the
/// address it reached.
pub async fn connect_plain(
    addrs: &[SocketAddr],
    deny: &DenyList,
) -> Result<(Sender, SocketAddr), UpstreamError> {
    let (tcp, addr) = dial::connect(addrs, deny).await?;
    Ok((handshake_h1(TokioIo::new(tcp)).await?, addr))
}

async fn handshake_h1<T>(io: T) -> Result<Sender, UpstreamError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new().handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream h1 connection ended");
        }
    });
    Ok(Sender::H1(sender))
}
