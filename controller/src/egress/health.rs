//! The probe of the running proxy's management endpoint: `GET /health`
//! with its bearer token, over hyper's HTTP/1 client on a tokio socket,
//! bounded by [`PROBE_TIMEOUT`] as a whole (connect, request, body).
//!
//! The probe is async so that a proxy that accepts and never answers
//! costs a pass or the controller's health watch nothing but the wait on
//! that one future: the watch, the metrics endpoint and the config watch
//! go on. The command-line callers with no runtime of their own
//! (`hermes egress setup`'s reload wait, `hermes egress status`) run it on
//! a current-thread runtime they make for the command.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, CONNECTION, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

/// How long one probe may take, connect to last byte.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(4);
/// The largest answer read.
const MAX_BODY: usize = 1 << 20;

/// What `/health` answers, as far as hermes reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct Health {
    /// Where the proxy accepts CONNECT.
    #[serde(rename = "tunnel", default)]
    pub tunnel: Vec<String>,
    /// Its counters since it started.
    #[serde(rename = "counters")]
    pub counters: Counters,
    /// The proxy-only network's DNS responder, when it runs.
    #[serde(rename = "dns", default)]
    pub dns: Option<DnsHealth>,
    /// Per provider, whether it holds a real key; `None` from a proxy
    /// that does not say.
    #[serde(rename = "keys", default)]
    pub keys: Option<Vec<KeyHeld>>,
}

/// The DNS responder of transparent egress, as `/health` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsHealth {
    /// Where it listens (UDP).
    #[serde(rename = "listen", default)]
    pub listen: Option<String>,
    /// False once it has stopped while the proxy runs on.
    #[serde(rename = "serving", default)]
    pub serving: Option<bool>,
}

/// How long the DNS responder may take to answer [`dns_problem`]'s query.
pub const DNS_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// With transparent egress (`proxy.enforce_network`), what is wrong with
/// the proxy's DNS responder, as `/health` reports it and as one query to
/// it shows; `None` when it answers. A responder that does not answer
/// leaves the sandboxes unable to resolve their providers: the proxy is
/// then unhealthy like one whose endpoint is silent (fail closed; the
/// next pass restarts it).
pub async fn dns_problem(health: &Health) -> Option<String> {
    let Some(dns) = &health.dns else {
        return Some("its DNS responder (proxy.enforce_network) is not running".to_string());
    };
    let listen = dns.listen.as_deref().unwrap_or("no address");
    if dns.serving == Some(false) {
        return Some(format!("its DNS responder on {listen} has stopped"));
    }
    let Some(addr) = dns.listen.as_deref().and_then(|l| l.parse().ok()) else {
        return Some(format!("its DNS responder listens on {listen}"));
    };
    match hermes_egress::dns::probe(addr, DNS_PROBE_TIMEOUT).await {
        Ok(()) => None,
        Err(e) => Some(format!(
            "its DNS responder on {listen} does not answer: {e}"
        )),
    }
}

/// Whether the running proxy holds a real key for one provider (never
/// the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KeyHeld {
    #[serde(rename = "provider")]
    pub provider: String,
    #[serde(rename = "loaded")]
    pub loaded: bool,
    /// The variable the key came from.
    #[serde(rename = "from", default)]
    pub from: Option<String>,
    /// The key's digest (`hermes_egress::tokens::key_digest`), never the
    /// key; `None` without a key of its own, or from a proxy that does not
    /// say.
    #[serde(rename = "digest", default)]
    pub digest: Option<String>,
}

/// The proxy's counters (`hermes_egress::access::Counters::snapshot`),
/// in its order; a counter this binary does not know is left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    #[serde(rename = "uptime_seconds")]
    pub uptime_seconds: u64,
    #[serde(rename = "connections")]
    pub connections: u64,
    #[serde(rename = "open_connections")]
    pub open_connections: u64,
    #[serde(rename = "tunnels")]
    pub tunnels: u64,
    #[serde(rename = "open_tunnels")]
    pub open_tunnels: u64,
    #[serde(rename = "requests")]
    pub requests: u64,
    #[serde(rename = "allowed")]
    pub allowed: u64,
    #[serde(rename = "denied")]
    pub denied: u64,
    #[serde(rename = "errors")]
    pub errors: u64,
    #[serde(rename = "swapped")]
    pub swapped: u64,
    #[serde(rename = "bytes_to_clients")]
    pub bytes_to_clients: u64,
    #[serde(rename = "log_dropped")]
    pub log_dropped: u64,
    #[serde(rename = "reloads")]
    pub reloads: u64,
}

impl Counters {
    /// Each counter's name and value, in order.
    pub fn entries(&self) -> [(&'static str, u64); 13] {
        [
            ("uptime_seconds", self.uptime_seconds),
            ("connections", self.connections),
            ("open_connections", self.open_connections),
            ("tunnels", self.tunnels),
            ("open_tunnels", self.open_tunnels),
            ("requests", self.requests),
            ("allowed", self.allowed),
            ("denied", self.denied),
            ("errors", self.errors),
            ("swapped", self.swapped),
            ("bytes_to_clients", self.bytes_to_clients),
            ("log_dropped", self.log_dropped),
            ("reloads", self.reloads),
        ]
    }
}

/// Why the endpoint gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("no answer within {} s", PROBE_TIMEOUT.as_secs())]
    Timeout,
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("it answered {0}")]
    Status(StatusCode),
    #[error("its answer is not the health report: {0}")]
    Body(String),
}

/// Asks the management endpoint at `addr` for `/health`.
pub async fn probe(addr: SocketAddr, token: &str) -> Result<Health, HealthError> {
    tokio::time::timeout(PROBE_TIMEOUT, ask(addr, token))
        .await
        .map_err(|_| HealthError::Timeout)?
}

async fn ask(addr: SocketAddr, token: &str) -> Result<Health, HealthError> {
    let http = |e: &dyn std::fmt::Display| HealthError::Http(e.to_string());
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(HealthError::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(&e))?;
    // Driven until the answer is read; aborted with the probe.
    let driver = AbortOnDrop(tokio::spawn(connection));
    let request = Request::get("/health")
        .header(HOST, addr.to_string())
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header(CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(&e))?;
    let response = sender.send_request(request).await.map_err(|e| http(&e))?;
    if response.status() != StatusCode::OK {
        return Err(HealthError::Status(response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| HealthError::Body(e.to_string()))?
        .to_bytes();
    drop(driver);
    serde_json::from_slice(&body).map_err(|e| HealthError::Body(e.to_string()))
}

/// Aborts the connection's task when the probe ends, however it ends.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_counters_are_the_proxys_own() {
        // Every counter the proxy reports is read, and nothing else.
        let snapshot = hermes_egress::access::Counters::default().snapshot();
        let theirs: Vec<&String> = snapshot.as_object().unwrap().keys().collect();
        let ours = serde_json::to_value(Counters::default()).unwrap();
        let ours: Vec<&String> = ours.as_object().unwrap().keys().collect();
        assert_eq!(theirs, ours);
        let names: Vec<&str> = Counters::default().entries().iter().map(|e| e.0).collect();
        assert_eq!(theirs, names);
    }

    /// A listener answering each connection with `answer` after `delay`.
    async fn server(answer: String, delay: Duration) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    tokio::time::sleep(delay).await;
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_health_answer_is_read() {
        let body =
            r#"{"status":"ok","tunnel":["127.0.0.1:1"],"counters":{"requests":3,"reloads":1}}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let addr = server(answer, Duration::ZERO).await;
        let health = probe(addr, "t").await.unwrap();
        assert_eq!(health.tunnel, ["127.0.0.1:1"]);
        assert_eq!(health.counters.requests, 3);
        assert_eq!(health.counters.reloads, 1);
    }

    #[tokio::test]
    async fn a_refusal_is_not_health() {
        let addr = server(
            "HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}".to_string(),
            Duration::ZERO,
        )
        .await;
        assert!(matches!(
            probe(addr, "t").await,
            Err(HealthError::Status(StatusCode::UNAUTHORIZED))
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_silent_endpoint_times_out_without_blocking_the_runtime() {
        let addr = server(String::new(), Duration::from_secs(3600)).await;
        // Another task on this single thread goes on while the probe waits.
        let ticks = tokio::spawn(async {
            let mut n = 0u32;
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                n += 1;
            }
            n
        });
        let result = probe(addr, "t").await;
        assert!(matches!(result, Err(HealthError::Timeout)), "{result:?}");
        // The ticks (1 s) ran while the probe waited (4 s): a blocking
        // probe would have held the only thread until it gave up.
        assert!(ticks.is_finished(), "the probe blocked the runtime");
        assert_eq!(ticks.await.unwrap(), 10);
    }
}
