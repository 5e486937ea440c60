//! The forward proxy. On the tunnel port a client asks `CONNECT host:port`:
//! the allowlist and the resolved addresses are checked before the `200`;
//! then TLS is terminated with a leaf for the name (the SNI must be that
//! name), and each request inside the tunnel (its Host header naming the
//! tunnel's target) has its token swapped for the real key (or its AWS
//! signature made again, [`crate::sigv4`]) and goes to the
//! upstream over verified TLS, bodies streaming both ways. On the plain
//! port, absolute-form `http://` requests are forwarded the same way,
//! except that no credential is ever sent in clear text. WebSocket
//! upgrades pass through both. Every request writes one access line.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;

use crate::access::{AccessLog, Counters, Decision, Pending, Via};
use crate::body::{Logged, ProxyBody};
use crate::ca::LeafCache;
use crate::dial::{self, DialError};
use crate::dns::{DnsCounters, Responder};
use crate::limits::{Limits, Slot};
use crate::policy::{Allowlist, DenyList, Host, parse_host};
use crate::pool::Pool;
use crate::rewrite::{inject, path_without_query_values};
use crate::settings::Settings;
use crate::target::{
    Target, TargetError, host_header_matches, parse_absolute, parse_authority, parse_connect,
};
use crate::tokens::Credentials;
use crate::upstream::{self, Sender, UpstreamError, UpstreamTls};

/// How long the client's TLS handshake inside a tunnel may take.
const CLIENT_TLS_TIMEOUT: Duration = Duration::from_secs(15);
/// The header that says why the proxy refused a request.
pub const REFUSED_HEADER: &str = "x-hermes-egress-refused";
/// The header that says why the proxy could not complete a request.
pub const ERROR_HEADER: &str = "x-hermes-egress-error";

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the DNS responder cannot listen on {addr} (udp): {source}")]
    DnsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on the Unix socket {}: {source}", path.display())]
    UnixBind {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("nothing to listen on: the listen list is empty")]
    NoListen,
    #[error("refusing to listen on {0}: name the addresses to listen on")]
    Unspecified(IpAddr),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the access log writer: {0}")]
    Log(std::io::Error),
}

/// Where the proxy listens, once bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub tunnel: Vec<SocketAddr>,
    pub http: Vec<SocketAddr>,
    pub mgmt: SocketAddr,
    /// The DNS responder (UDP), with `proxy.enforce_network`.
    pub dns: Option<SocketAddr>,
}

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Shared {
    allow: Arc<Allowlist>,
    deny: DenyList,
    /// What `deny` refuses besides its ranges: this host's addresses.
    host_addrs: Arc<crate::policy::HostAddrs>,
    resolve: BTreeMap<String, IpAddr>,
    /// Replaced whole when the tokens are reloaded.
    credentials: std::sync::RwLock<Arc<Credentials>>,
    leaves: LeafCache,
    upstream: UpstreamTls,
    /// Upstream connections, reused across tunnels.
    pool: Arc<Pool>,
    header_timeout: Duration,
    /// hyper's header read timeout, which runs from the moment a
    /// connection waits for a request head: before the first request and
    /// while idle between requests (keep-alive).
    client_idle: Duration,
    tunnel_idle: Duration,
    /// The data plane's connections, per client and in all.
    pub(crate) limits: Arc<Limits>,
    /// What signed AWS bodies hold while they are read, per client and in
    /// all.
    pub(crate) signed_bodies: Arc<crate::signed_body::Budget>,
    /// The management endpoint's open connections (its own small budget).
    pub(crate) mgmt_open: std::sync::atomic::AtomicUsize,
    log: AccessLog,
    pub(crate) mgmt_token: String,
    pub(crate) bound: std::sync::OnceLock<Bound>,
    /// The DNS responder's counters, when it runs.
    pub(crate) dns: Option<Arc<DnsCounters>>,
}

impl Shared {
    pub(crate) fn counters(&self) -> &Arc<Counters> {
        self.log.counters()
    }

    pub(crate) fn credentials(&self) -> Arc<Credentials> {
        match self.credentials.read() {
            Ok(c) => c.clone(),
            // A writer that panicked left a whole value: keep serving it.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// A handle that replaces the credentials of a running server.
#[derive(Debug, Clone)]
pub struct Reloader(Arc<Shared>);

impl Reloader {
    /// From now on requests are checked against `credentials`; requests
    /// already sent are not touched.
    pub fn reload(&self, credentials: Credentials) {
        let new = Arc::new(credentials);
        match self.0.credentials.write() {
            Ok(mut c) => *c = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
        self.0.counters().reloads.fetch_add(1, Ordering::Relaxed);
    }
}

/// A bound proxy, ready to run.
#[derive(Debug)]
pub struct Server {
    tunnel: Vec<TcpListener>,
    http: Vec<TcpListener>,
    mgmt: TcpListener,
    dns: Option<(tokio::net::UdpSocket, Responder)>,
    unix: Option<tokio::net::UnixListener>,
    shared: Arc<Shared>,
}

/// Binds every listener: the tunnel and plain ports on each listen
/// address, and the management endpoint. Access lines go to `log_out`.
pub async fn bind(
    settings: Settings,
    log_out: Box<dyn std::io::Write + Send>,
) -> Result<Server, ServerError> {
    if settings.listen.is_empty() {
        return Err(ServerError::NoListen);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let upstream = UpstreamTls::new(settings.upstream_ca_pem.as_deref(), provider.clone())?;
    let mut tunnel = Vec::new();
    let mut http = Vec::new();
    for ip in &settings.listen {
        if ip.is_unspecified() {
            return Err(ServerError::Unspecified(*ip));
        }
        tunnel.push(listen(SocketAddr::new(*ip, settings.tunnel_port)).await?);
        http.push(listen(SocketAddr::new(*ip, settings.http_port)).await?);
    }
    let mgmt = listen(settings.mgmt_addr).await?;
    let unix = match &settings.unix_listen {
        Some(path) => Some(listen_unix(path)?),
        None => None,
    };
    let dns_socket = match settings.dns {
        Some(dns) => Some((
            crate::dns::bind(dns.listen)
                .await
                .map_err(|source| ServerError::DnsBind {
                    addr: dns.listen,
                    source,
                })?,
            dns.answer,
        )),
        None => None,
    };
    let addrs = |ls: &[TcpListener]| ls.iter().filter_map(|l| l.local_addr().ok()).collect();
    let bound = Bound {
        tunnel: addrs(&tunnel),
        http: addrs(&http),
        mgmt: mgmt.local_addr().map_err(|source| ServerError::Bind {
            addr: settings.mgmt_addr,
            source,
        })?,
        dns: dns_socket
            .as_ref()
            .and_then(|(socket, _)| socket.local_addr().ok()),
    };
    let counters = Arc::new(Counters::default());
    let log = AccessLog::spawn(log_out, counters).map_err(ServerError::Log)?;
    // The data plane's budget stays below the descriptor limit, so that
    // the management endpoint always has descriptors to answer with.
    let total = crate::limits::budget(
        crate::limits::descriptor_limit().unwrap_or(1024),
        settings.max_connections,
    );
    let limits = Limits::new(settings.max_connections_per_client, total);
    // This host's own addresses are refused like the deny list's ranges,
    // read now and kept current by `run`.
    let host_addrs = Arc::new(crate::policy::HostAddrs::default());
    host_addrs.set(dial::host_addrs());
    let allow = Arc::new(settings.allow);
    let dns_counters = dns_socket
        .as_ref()
        .map(|_| Arc::new(DnsCounters::default()));
    let dns = dns_socket
        .zip(dns_counters.clone())
        .map(|((socket, answer), counters)| {
            (socket, Responder::new(allow.clone(), answer, counters))
        });
    let shared = Arc::new(Shared {
        allow,
        deny: settings.deny.with_host_addrs(host_addrs.clone()),
        host_addrs,
        resolve: settings.resolve,
        credentials: std::sync::RwLock::new(Arc::new(settings.credentials)),
        leaves: LeafCache::new(settings.ca, provider),
        upstream,
        pool: Pool::new(),
        header_timeout: settings.upstream_header_timeout,
        client_idle: settings.client_idle_timeout,
        tunnel_idle: settings.tunnel_idle_timeout,
        limits,
        signed_bodies: crate::signed_body::Budget::new(settings.signed_bodies),
        mgmt_open: std::sync::atomic::AtomicUsize::new(0),
        log,
        mgmt_token: settings.mgmt_token,
        bound: std::sync::OnceLock::new(),
        dns: dns_counters,
    });
    let _ = shared.bound.set(bound);
    Ok(Server {
        tunnel,
        http,
        mgmt,
        dns,
        unix,
        shared,
    })
}

/// A Unix listener at `path`, made anew (a socket left there by a proxy
/// that died is replaced; anything else there is an error), mode 0600.
fn listen_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener, ServerError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let failed = |source: std::io::Error| ServerError::UnixBind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(failed)?,
        Ok(_) => {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "something other than a socket is there",
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(failed)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    Ok(listener)
}

async fn listen(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

impl Server {
    pub fn bound(&self) -> &Bound {
        // Set in `bind`, before the server exists.
        self.shared.bound.get().unwrap_or_else(|| unreachable!())
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters().clone()
    }

    pub fn reloader(&self) -> Reloader {
        Reloader(self.shared.clone())
    }

    /// Serves until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tasks = tokio::task::JoinSet::new();
        // TLS arriving on the tunnel port without a CONNECT is the
        // transparent path (the proxy-only network redirects port 443 here).
        for listener in self.tunnel {
            tasks.spawn(accept_loop(listener, self.shared.clone(), true));
        }
        for listener in self.http {
            tasks.spawn(accept_loop(listener, self.shared.clone(), false));
        }
        if let Some(listener) = self.unix {
            tasks.spawn(accept_unix_loop(listener, self.shared.clone()));
        }
        if let Some((socket, responder)) = self.dns {
            tasks.spawn(crate::dns::serve(socket, responder));
        }
        tasks.spawn(crate::mgmt::serve(self.mgmt, self.shared.clone()));
        tasks.spawn(dial::watch_host_addrs(self.shared.host_addrs.clone()));
        tasks.spawn(self.shared.pool.clone().sweep_every());
        shutdown.await;
        tasks.abort_all();
    }
}

/// Accepts client connections; with `sniff_tls`, one that opens with a
/// TLS handshake (no CONNECT before it) goes the transparent way.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, sniff_tls: bool) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, most likely: wait, do not spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over a limit: closed at once (counted, logged at a bounded rate).
        let Ok(slot) = shared.limits.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let counters = shared.counters().clone();
            counters.connections.fetch_add(1, Ordering::Relaxed);
            counters.open_connections.fetch_add(1, Ordering::Relaxed);
            let slot = Arc::new(slot);
            if sniff_tls && opens_with_tls(&stream, shared.client_idle).await {
                transparent_tls(shared, stream, peer, slot).await;
            } else {
                serve_client(shared, stream, peer, slot).await;
            }
            counters.open_connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Where a client on the Unix socket is counted and logged from: it is
/// this host's, as a loopback client is.
const UNIX_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Accepts clients on the Unix socket: CONNECT and plain HTTP, as on the
/// tunnel port (no transparent TLS: nothing redirects to it).
async fn accept_unix_loop(listener: tokio::net::UnixListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed on the Unix socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = shared.limits.admit(UNIX_PEER.ip()) else {
            drop(stream);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let counters = shared.counters().clone();
            counters.connections.fetch_add(1, Ordering::Relaxed);
            counters.open_connections.fetch_add(1, Ordering::Relaxed);
            serve_client(shared, stream, UNIX_PEER, Arc::new(slot)).await;
            counters.open_connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Serves one client connection; `slot` (its place in the limits) is held
/// until the connection and whatever it was upgraded to (a tunnel, a
/// WebSocket) have ended.
async fn serve_client<S>(shared: Arc<Shared>, stream: S, peer: SocketAddr, slot: Arc<Slot>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let idle = shared.client_idle;
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let slot = slot.clone();
        async move { Ok::<_, Infallible>(proxy_request(shared, peer, req, slot).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(idle)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "client connection ended");
    }
}

async fn proxy_request(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        connect(shared, peer, req, slot).await
    } else {
        plain(shared, peer, req, slot).await
    }
}

/// `CONNECT host:port`: checks, `200`, then the tunnel in a task of its own.
async fn connect(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let pending = Pending::new(peer, authority.clone(), "CONNECT", String::new());
    let target = match parse_connect(&authority) {
        Ok(t) => t,
        Err(e) => return refuse(&shared, pending, StatusCode::BAD_REQUEST, "bad-target", &e),
    };
    if !shared.allow.allows(&target.host) {
        let why = format!("{} is not on the allowlist", target.host);
        return refuse(&shared, pending, StatusCode::FORBIDDEN, "not-allowed", &why);
    }
    let addrs = match dial::resolve(&target, &shared.resolve, &shared.deny).await {
        Ok(addrs) => addrs,
        Err(e) => return dial_refusal(&shared, pending, &e),
    };
    shared.counters().tunnels.fetch_add(1, Ordering::Relaxed);
    let tunnel_shared = shared.clone();
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => tunnel(tunnel_shared, peer, target, addrs, upgraded, slot).await,
            Err(e) => tracing::debug!(%peer, error = %e, "CONNECT upgrade failed"),
        }
    });
    shared
        .log
        .write(pending.finish(200, 0, Decision::Allow, "tunnel", None));
    Response::new(ProxyBody::empty())
}

/// A refusal decided before the tunnel's TLS was up (the connect-time
/// deny check of the transparent path): every request inside gets it.
#[derive(Debug)]
struct Refused {
    status: StatusCode,
    reason: &'static str,
    why: String,
}

/// The state of one tunnel: its target and the addresses checked for it
/// (its requests take upstream connections to those from the pool).
#[derive(Debug)]
struct Tunnel {
    peer: SocketAddr,
    target: Target,
    addrs: Vec<SocketAddr>,
    /// The client connection's place in the limits.
    slot: Arc<Slot>,
    via: Via,
    refused: Option<Refused>,
}

async fn tunnel(
    shared: Arc<Shared>,
    peer: SocketAddr,
    target: Target,
    addrs: Vec<SocketAddr>,
    upgraded: hyper::upgrade::Upgraded,
    slot: Arc<Slot>,
) {
    let acceptor =
        LazyConfigAcceptor::new(rustls::server::Acceptor::default(), TokioIo::new(upgraded));
    let start = match tokio::time::timeout(CLIENT_TLS_TIMEOUT, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "client TLS hello failed"),
        Err(_) => return tracing::debug!(%peer, "client TLS hello timed out"),
    };
    let sni = start.client_hello().server_name().map(str::to_string);
    let sni_ok = match &sni {
        Some(name) => parse_host(name).is_ok_and(|h| h == target.host),
        // Clients send no SNI for IP literals.
        None => matches!(target.host, Host::Ip(_)),
    };
    if !sni_ok {
        let pending = Pending::new(peer, target.host.to_string(), "TLS", String::new());
        let record = pending.finish(403, 0, Decision::Deny, "sni-mismatch", None);
        return shared.log.write(record);
    }
    let tunnel = Tunnel {
        peer,
        target,
        addrs,
        slot,
        via: Via::Connect,
        refused: None,
    };
    serve_tls(shared, start, tunnel).await;
}

/// Whether a client connection opens with a TLS handshake record (rather
/// than an HTTP request line), waiting at most `idle` for its first byte.
async fn opens_with_tls(stream: &TcpStream, idle: Duration) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(idle, stream.peek(&mut first)).await,
        Ok(Ok(1)) if first[0] == 0x16
    )
}

/// TLS straight to the proxy, without CONNECT (a sandbox on the proxy-only
/// network whose program ignores `HTTPS_PROXY`: its DNS gave the proxy's
/// address for the name). The target is the SNI name on port 443; from
/// there everything is as for a tunnel: the allowlist, the connect-time
/// deny check, the Host header naming the SNI, the token swap.
async fn transparent_tls(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
) {
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = match tokio::time::timeout(CLIENT_TLS_TIMEOUT, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "client TLS hello failed"),
        Err(_) => return tracing::debug!(%peer, "client TLS hello timed out"),
    };
    let sni = start.client_hello().server_name().map(str::to_string);
    let deny = |host: String, reason: &'static str| {
        let pending = Pending::new(peer, host, "TLS", String::new()).via(Via::Transparent);
        shared
            .log
            .write(pending.finish(403, 0, Decision::Deny, reason, None));
    };
    // Without a name the proxy cannot know where the client meant to go;
    // a name not on the allowlist gets no certificate minted for it. The
    // handshake is dropped (the DNS answers such names NXDOMAIN, so only a
    // client that dials the proxy's address by hand gets here).
    let host = match sni.as_deref().map(parse_host) {
        Some(Ok(host @ Host::Name(_))) => host,
        _ => return deny(sni.unwrap_or_default(), "no-sni"),
    };
    if !shared.allow.allows(&host) {
        return deny(host.to_string(), "not-allowed");
    }
    let target = Target { host, port: 443 };
    let (addrs, refused) = match dial::resolve(&target, &shared.resolve, &shared.deny).await {
        Ok(addrs) => (addrs, None),
        Err(e) => {
            let status = match e {
                DialError::Denied(_) => StatusCode::FORBIDDEN,
                _ => StatusCode::BAD_GATEWAY,
            };
            let refused = Refused {
                status,
                reason: e.reason(),
                why: e.to_string(),
            };
            (Vec::new(), Some(refused))
        }
    };
    shared.counters().tunnels.fetch_add(1, Ordering::Relaxed);
    let tunnel = Tunnel {
        peer,
        target,
        addrs,
        slot,
        via: Via::Transparent,
        refused,
    };
    serve_tls(shared, start, tunnel).await;
}

/// Completes the client's TLS handshake with a leaf for the tunnel's
/// name and serves the requests inside.
async fn serve_tls<IO>(shared: Arc<Shared>, start: tokio_rustls::StartHandshake<IO>, tunnel: Tunnel)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = tunnel.peer;
    let config = match shared.leaves.server_config(&tunnel.target.host).await {
        Ok(config) => config,
        Err(e) => {
            return tracing::error!(host = %tunnel.target.host, error = %e, "minting a leaf failed");
        }
    };
    let tls = match tokio::time::timeout(CLIENT_TLS_TIMEOUT, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "client TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "client TLS handshake timed out"),
    };
    let counters = shared.counters().clone();
    counters.open_tunnels.fetch_add(1, Ordering::Relaxed);
    let tunnel = Arc::new(tunnel);
    let idle = shared.tunnel_idle;
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let tunnel = tunnel.clone();
        async move { Ok::<_, Infallible>(tunnel_request(shared, tunnel, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(idle)
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "tunnel ended");
    }
    counters.open_tunnels.fetch_sub(1, Ordering::Relaxed);
}

/// One request inside a tunnel.
async fn tunnel_request(
    shared: Arc<Shared>,
    tunnel: Arc<Tunnel>,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    let pending = Pending::new(
        tunnel.peer,
        tunnel.target.host.to_string(),
        req.method().as_str(),
        path_without_query_values(&path),
    )
    .via(tunnel.via);
    if let Some(refused) = &tunnel.refused {
        return refuse(
            &shared,
            pending,
            refused.status,
            refused.reason,
            &refused.why,
        );
    }
    // One Host header, naming the tunnel: a second copy (which an upstream
    // might read instead of the first) is refused before any key goes in.
    if req.headers().get_all(header::HOST).iter().nth(1).is_some() {
        let why = format!(
            "more than one Host header; send one naming {}",
            tunnel.target
        );
        return refuse(
            &shared,
            pending,
            StatusCode::BAD_REQUEST,
            "duplicate-host",
            &why,
        );
    }
    let host_ok = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| host_header_matches(v, &tunnel.target));
    let uri_ok = req
        .uri()
        .authority()
        .is_none_or(|a| host_header_matches(a.as_str(), &tunnel.target));
    if !host_ok || !uri_ok {
        let why = format!("the request must name {}", tunnel.target);
        return refuse(
            &shared,
            pending,
            StatusCode::FORBIDDEN,
            "host-mismatch",
            &why,
        );
    }
    let upgrade = is_upgrade(req.headers());
    strip_hop_by_hop(req.headers_mut(), upgrade);
    let host = &tunnel.target.host;
    let credentials = shared.credentials();
    if let Some(aws) = credentials.for_host(host).filter(|c| c.is_sigv4()) {
        let origin = crate::sigv4::Origin {
            host,
            client: tunnel.peer.ip(),
            budget: &shared.signed_bodies,
        };
        let req = match crate::sigv4::resign(aws, req, upgrade, origin).await {
            Ok(req) => req,
            Err(r) => return refuse_sigv4(&shared, pending, r),
        };
        let provider = Some(aws.provider.clone());
        return forward_in_tunnel(&shared, pending, &tunnel, req, provider).await;
    }
    let swapped = match crate::google::minter_for(&credentials, host) {
        Some(minter) => {
            let exchange = crate::google::Upstream {
                tls: &shared.upstream,
                deny: &shared.deny,
                resolve: &shared.resolve,
            };
            (minter.swap(&exchange, req.headers_mut(), path, host)).await
        }
        None => swap(&shared, host, req.headers_mut(), path)
            .map_err(|(reason, why)| (StatusCode::FORBIDDEN, reason, why)),
    };
    let (path, token) = match swapped {
        Ok(swapped) => swapped,
        Err((status, reason, why)) => return refuse(&shared, pending, status, reason, &why),
    };
    // Origin-form, and the path as the client sent it unless the swap
    // changed it (a key in the query): parsed again only then.
    let as_sent = req.uri().authority().is_none()
        && req.uri().path_and_query().map_or("/", |pq| pq.as_str()) == path;
    if !as_sent && let Ok(uri) = path.parse() {
        *req.uri_mut() = uri;
    }
    if upgrade {
        let sender = shared
            .upstream
            .connect(&tunnel.target, &tunnel.addrs, &shared.deny, true)
            .await
            .map(|(sender, _)| sender);
        let slot = tunnel.slot.clone();
        return forward_upgrade(&shared, pending, token, sender, req, &tunnel.target, slot).await;
    }
    forward_in_tunnel(&shared, pending, &tunnel, req, token).await
}

/// Sends a request of the tunnel upstream (on a pooled connection) within
/// the header timeout, and answers the client with what came back.
async fn forward_in_tunnel(
    shared: &Shared,
    pending: Pending,
    tunnel: &Tunnel,
    req: Request<impl Into<crate::body::RequestBody>>,
    token: Option<String>,
) -> Response<ProxyBody> {
    let sent = tokio::time::timeout(
        shared.header_timeout,
        send_pooled(
            shared,
            &tunnel.target,
            &tunnel.addrs,
            true,
            req.map(Into::into),
        ),
    )
    .await;
    respond(shared, pending, token, sent)
}

/// Swaps the token of the credential serving `host`, if any: the new path
/// and the provider's name, or the refusal's reason and sentence.
fn swap(
    shared: &Shared,
    host: &Host,
    headers: &mut HeaderMap,
    path: String,
) -> Result<(String, Option<String>), (&'static str, String)> {
    swap_with(&shared.credentials(), host, headers, path)
}

fn swap_with(
    credentials: &Credentials,
    host: &Host,
    headers: &mut HeaderMap,
    path: String,
) -> Result<(String, Option<String>), (&'static str, String)> {
    let Some(cred) = credentials.for_host(host) else {
        return Ok((path, None));
    };
    match inject(cred, headers, &path) {
        Ok(new_path) => Ok((new_path.unwrap_or(path), Some(cred.provider.clone()))),
        Err(crate::rewrite::Refusal::NoKey) => {
            // The sandbox did its part: the host holds no key to swap in.
            let what = match cred.provider.as_str() {
                crate::google::PROVIDER => {
                    "no Google service account (GOOGLE_APPLICATION_CREDENTIALS)"
                }
                _ => "no real key",
            };
            let why = format!(
                "the host has {what} for {}: set it in the environment of `hermes egress start` or in the hermes home's .env, then restart the proxy",
                cred.provider
            );
            Err((crate::rewrite::Refusal::NoKey.reason(), why))
        }
        Err(refusal) => {
            let places: Vec<String> = cred.places.iter().map(ToString::to_string).collect();
            let why = format!(
                "requests to {host} must carry the {} proxy token in {}",
                cred.provider,
                places.join(" or ")
            );
            Err((refusal.reason(), why))
        }
    }
}

/// Sends `req` to `target` at one of `addrs` (checked when they were
/// resolved), over TLS or not: on a connection from the pool, or on a new
/// one (dialled with the connect-time checks). A request that a pooled
/// connection could not take at all (the upstream had just closed it) goes
/// once more on a new connection.
async fn send_pooled(
    shared: &Shared,
    target: &Target,
    addrs: &[SocketAddr],
    tls: bool,
    mut req: Request<crate::body::RequestBody>,
) -> Result<Response<Incoming>, UpstreamError> {
    let (mut addr, mut sender, mut pooled) =
        match shared.pool.take(target, tls, addrs, &shared.deny) {
            Some((addr, sender)) => (addr, sender, true),
            None => {
                let (sender, addr) = dial_new(shared, target, addrs, tls).await?;
                (addr, sender, false)
            }
        };
    loop {
        match sender.try_send(req, target).await {
            Ok(response) => {
                if let Sender::H1(h1) = sender {
                    shared.pool.release(target.clone(), addr, tls, h1);
                }
                return Ok(response);
            }
            Err(mut e) => match e.take_message() {
                Some(unsent) if pooled => {
                    req = unsent;
                    pooled = false;
                    (sender, addr) = dial_new(shared, target, addrs, tls).await?;
                }
                _ => return Err(e.into_error().into()),
            },
        }
    }
}

/// A new upstream connection; an HTTP/2 one is shared through the pool.
async fn dial_new(
    shared: &Shared,
    target: &Target,
    addrs: &[SocketAddr],
    tls: bool,
) -> Result<(Sender, SocketAddr), UpstreamError> {
    let (sender, addr) = if tls {
        shared
            .upstream
            .connect(target, addrs, &shared.deny, false)
            .await?
    } else {
        upstream::connect_plain(addrs, &shared.deny).await?
    };
    shared.pool.offer(target, addr, tls, &sender);
    Ok((sender, addr))
}

/// A request on a proxy port that is no CONNECT: absolute-form
/// (`GET http://host/path`, a client that knows it speaks to a proxy), or
/// origin-form (`GET /path` with a `Host` header: plain HTTP that the
/// proxy-only network redirected here from port 80, the transparent path).
async fn plain(
    shared: Arc<Shared>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    let uri = req.uri().clone();
    let shown_path = path_without_query_values(uri.path_and_query().map_or("/", |pq| pq.as_str()));
    let origin_form = uri.scheme().is_none() && uri.authority().is_none();
    let host_header = req
        .headers()
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let (host_text, via) = if origin_form {
        (host_header.clone().unwrap_or_default(), Via::Transparent)
    } else {
        (uri.host().unwrap_or_default().to_string(), Via::Connect)
    };
    let pending = Pending::new(peer, host_text, req.method().as_str(), shown_path).via(via);
    // The URL names the target; one Host header at most (it is replaced
    // by the URL's authority below). In origin-form, the one Host header
    // names the target, on port 80.
    if req.headers().get_all(header::HOST).iter().nth(1).is_some() {
        let why = "more than one Host header";
        return refuse(
            &shared,
            pending,
            StatusCode::BAD_REQUEST,
            "duplicate-host",
            &why,
        );
    }
    let parsed = if origin_form {
        origin_target(host_header.as_deref(), &uri)
    } else {
        parse_absolute(&uri)
    };
    let (target, path) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return refuse(&shared, pending, StatusCode::BAD_REQUEST, "bad-target", &e),
    };
    if !shared.allow.allows(&target.host) {
        let why = format!("{} is not on the allowlist", target.host);
        return refuse(&shared, pending, StatusCode::FORBIDDEN, "not-allowed", &why);
    }
    if shared.credentials().for_host(&target.host).is_some() {
        let why = format!(
            "keys for {} only travel over TLS: use https://",
            target.host
        );
        return refuse(
            &shared,
            pending,
            StatusCode::FORBIDDEN,
            "tls-required",
            &why,
        );
    }
    let addrs = match dial::resolve(&target, &shared.resolve, &shared.deny).await {
        Ok(addrs) => addrs,
        Err(e) => return dial_refusal(&shared, pending, &e),
    };
    let upgrade = is_upgrade(req.headers());
    strip_hop_by_hop(req.headers_mut(), upgrade);
    if let Some(authority) = uri.authority()
        && let Ok(value) = HeaderValue::from_str(authority.as_str())
    {
        req.headers_mut().insert(header::HOST, value);
    }
    if let Ok(uri) = path.parse() {
        *req.uri_mut() = uri;
    }
    if upgrade {
        let sender = upstream::connect_plain(&addrs, &shared.deny)
            .await
            .map(|(sender, _)| sender);
        return forward_upgrade(&shared, pending, None, sender, req, &target, slot).await;
    }
    let sent = tokio::time::timeout(
        shared.header_timeout,
        send_pooled(&shared, &target, &addrs, false, req.map(Into::into)),
    )
    .await;
    respond(&shared, pending, None, sent)
}

/// The target of an origin-form request: its Host header's name, on
/// port 80 (the only port the proxy-only network redirects to the plain
/// port), and the path.
fn origin_target(host: Option<&str>, uri: &http::Uri) -> Result<(Target, String), TargetError> {
    let target = parse_authority(host.ok_or(TargetError::Form)?, Some(80))?;
    if target.port != 80 {
        return Err(TargetError::Port);
    }
    let path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string());
    Ok((target, path))
}

/// Sends an upgrade request (WebSocket) on a connection of its own and,
/// when the upstream switches protocols, joins the two upgraded streams,
/// holding the client connection's `slot` until they end.
async fn forward_upgrade(
    shared: &Shared,
    pending: Pending,
    token: Option<String>,
    sender: Result<Sender, UpstreamError>,
    mut req: Request<Incoming>,
    target: &Target,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    let client_upgrade = hyper::upgrade::on(&mut req);
    let sent = tokio::time::timeout(shared.header_timeout, async {
        let mut sender = sender?;
        Ok(sender.send(req, target).await?)
    })
    .await;
    let sent = match sent {
        Ok(Ok(mut response)) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::join!(client_upgrade, upstream_upgrade) {
                    (Ok(client), Ok(upstream)) => {
                        let mut client = TokioIo::new(client);
                        let mut upstream = TokioIo::new(upstream);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    (c, u) => tracing::debug!(
                        client = ?c.err(), upstream = ?u.err(), "upgrade did not complete"
                    ),
                }
            });
            Ok(Ok(response))
        }
        other => other,
    };
    respond(shared, pending, token, sent)
}

/// The client's response from what the upstream answered (or did not).
fn respond(
    shared: &Shared,
    pending: Pending,
    token: Option<String>,
    sent: Result<Result<Response<Incoming>, UpstreamError>, tokio::time::error::Elapsed>,
) -> Response<ProxyBody> {
    match sent {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            let upgrade = parts.status == StatusCode::SWITCHING_PROTOCOLS;
            strip_hop_by_hop(&mut parts.headers, upgrade);
            let status = parts.status.as_u16();
            let body = Logged::new(body, shared.log.clone(), pending, status, token);
            Response::from_parts(parts, ProxyBody::Stream(Box::new(body)))
        }
        Ok(Err(e)) if e.is_refusal() => {
            refuse(shared, pending, StatusCode::FORBIDDEN, e.reason(), &e)
        }
        Ok(Err(e)) => {
            tracing::debug!(host = %pending.host, error = %e, "upstream failed");
            refuse(shared, pending, StatusCode::BAD_GATEWAY, e.reason(), &e)
        }
        Err(_) => {
            let why = format!(
                "no response head within {} s (proxy.upstream_header_timeout_seconds)",
                shared.header_timeout.as_secs()
            );
            refuse(
                shared,
                pending,
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                &why,
            )
        }
    }
}

fn dial_refusal(shared: &Shared, pending: Pending, e: &DialError) -> Response<ProxyBody> {
    let status = match e {
        DialError::Denied(_) => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_GATEWAY,
    };
    refuse(shared, pending, status, e.reason(), e)
}

/// A refused SigV4 request: the proxy's own refusal, or one whose body is
/// an AWS error (with [`REFUSED_HEADER`] all the same).
fn refuse_sigv4(
    shared: &Shared,
    pending: Pending,
    refusal: crate::sigv4::Refusal,
) -> Response<ProxyBody> {
    let Some(aws) = &refusal.aws else {
        return refuse(
            shared,
            pending,
            refusal.status,
            refusal.reason,
            &refusal.why,
        );
    };
    let body = Made {
        text: aws.body.clone(),
        content_type: aws.content_type,
        error_type: aws.error_type,
    };
    respond_made(
        shared,
        pending,
        refusal.status,
        refusal.reason,
        &refusal.why,
        body,
    )
}

/// The body of a response the proxy makes itself.
struct Made {
    text: String,
    content_type: &'static str,
    /// `x-amzn-ErrorType`, for an AWS error of the JSON protocols.
    error_type: Option<&'static str>,
}

/// A response the proxy makes itself: 403 with [`REFUSED_HEADER`], or an
/// error status with [`ERROR_HEADER`]; the reason word and a sentence.
fn refuse(
    shared: &Shared,
    pending: Pending,
    status: StatusCode,
    reason: &'static str,
    why: &dyn std::fmt::Display,
) -> Response<ProxyBody> {
    let decision = if status.is_server_error() {
        Decision::Error
    } else {
        Decision::Deny
    };
    let body = Made {
        text: refusal_body(decision, reason, why),
        content_type: "application/json",
        error_type: None,
    };
    respond_made(shared, pending, status, reason, why, body)
}

/// [`refuse`] with `body`.
fn respond_made(
    shared: &Shared,
    pending: Pending,
    status: StatusCode,
    reason: &'static str,
    why: &dyn std::fmt::Display,
    body: Made,
) -> Response<ProxyBody> {
    let (decision, header_name) = if status.is_server_error() {
        (Decision::Error, ERROR_HEADER)
    } else {
        (Decision::Deny, REFUSED_HEADER)
    };
    shared.log.write(pending.finish(
        status.as_u16(),
        body.text.len() as u64,
        decision,
        reason,
        None,
    ));
    let mut response = Response::new(ProxyBody::text(body.text));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header_name, HeaderValue::from_static(reason));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(body.content_type),
    );
    if let Some(kind) = body.error_type {
        headers.insert("x-amzn-errortype", HeaderValue::from_static(kind));
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    // An HTTP/1 client that reads no body of a refused CONNECT (httpx,
    // under the Python SDKs of OpenAI and Anthropic) shows the status line.
    if let Some(phrase) = status_reason(decision, why) {
        response.extensions_mut().insert(phrase);
    }
    response
}

/// The reason phrase of a response the proxy makes itself: the message of
/// its body ([`refusal_message`]), when that is one line of printable
/// ASCII, cut at 200 bytes.
fn status_reason(
    decision: Decision,
    why: &dyn std::fmt::Display,
) -> Option<hyper::ext::ReasonPhrase> {
    let mut text = refusal_message(decision, why);
    if !text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return None;
    }
    text.truncate(200);
    hyper::ext::ReasonPhrase::try_from(text).ok()
}

/// "hermes egress refused: WHY", or "hermes egress failed: WHY" for an
/// error of the proxy's own.
fn refusal_message(decision: Decision, why: &dyn std::fmt::Display) -> String {
    let word = match decision {
        Decision::Error => "failed",
        _ => "refused",
    };
    format!("hermes egress {word}: {why}")
}

/// The body of a response the proxy makes itself, in the shape the
/// providers' SDKs read an error from (`error.message`, `error.type`,
/// `error.code`): `{"type":"error","error":{"type":"hermes_egress_refused",
/// "code":"<reason>","message":"hermes egress refused: <why>"}}`; an error
/// of the proxy's own (5xx) says `hermes_egress_error`.
pub fn refusal_body(decision: Decision, reason: &str, why: &dyn std::fmt::Display) -> String {
    let kind = match decision {
        Decision::Error => "hermes_egress_error",
        _ => "hermes_egress_refused",
    };
    let mut body = serde_json::json!({
        "type": "error",
        "error": {
            "type": kind,
            "code": reason,
            "message": refusal_message(decision, why),
        },
    })
    .to_string();
    body.push('\n');
    body
}

/// Whether a request asks to switch protocols (`Connection: upgrade` and
/// an `Upgrade` header).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes the headers that concern one hop only, and the proxy's own
/// credentials; an upgrade keeps `Upgrade` and `Connection: upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
