//! The DNS responder of the proxy-only network (`proxy.enforce_network`):
//! sandboxes on that network use it as their name server, so that a
//! program that ignores `HTTPS_PROXY` still connects to the proxy.
//!
//! It answers from the allowlist alone and forwards nothing: no query, and
//! so no data hidden in a name, ever leaves the host.
//!
//! - an allowlisted name: `A` is the proxy's address (the network's
//!   gateway), with a short TTL; every other type (`AAAA`, `TXT`, `MX`, …)
//!   is answered with no records (NOERROR), so clients use the IPv4 address;
//! - any other name: NXDOMAIN at once, so a client fails fast and says
//!   which name it could not resolve (`Could not resolve host`,
//!   `ENOTFOUND`); the proxy then never sees the connection;
//! - anything but a standard query: NOTIMP.
//!
//! The wire format is hickory's (`hickory-server`, `hickory-proto`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hickory_server::authority::MessageResponseBuilder;
use hickory_server::proto::op::{Header, MessageType, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::A;
use hickory_server::proto::rr::{RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};

use crate::policy::{Allowlist, Host, parse_host};

/// The TTL of an answer: short, so that a changed allowlist or gateway
/// is seen soon.
const TTL: u32 = 30;

/// What the responder counted, for `/health`.
#[derive(Debug, Default)]
pub struct DnsCounters {
    pub queries: AtomicU64,
    /// Allowlisted names, answered with the proxy's address (or no records).
    pub answered: AtomicU64,
    /// Names not on the allowlist.
    pub nxdomain: AtomicU64,
    /// Whether [`serve`] is serving: false once it has stopped (its
    /// socket failed), while the rest of the proxy may run on.
    pub serving: AtomicBool,
}

impl DnsCounters {
    pub fn snapshot(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "queries": get(&self.queries),
            "answered": get(&self.answered),
            "nxdomain": get(&self.nxdomain),
        })
    }
}

/// Answers allowlisted names with `answer`, every other name NXDOMAIN.
#[derive(Debug, Clone)]
pub struct Responder {
    allow: Arc<Allowlist>,
    answer: Ipv4Addr,
    counters: Arc<DnsCounters>,
}

/// What the responder says about one name and type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The proxy's address.
    Proxy(Ipv4Addr),
    /// The name exists (it is allowlisted), but not with this type.
    NoRecords,
    NxDomain,
}

impl Responder {
    pub fn new(allow: Arc<Allowlist>, answer: Ipv4Addr, counters: Arc<DnsCounters>) -> Responder {
        Responder {
            allow,
            answer,
            counters,
        }
    }

    /// The answer for `name` (with or without its final dot) and `kind`.
    pub fn answer(&self, name: &str, kind: RecordType) -> Answer {
        let name = name.strip_suffix('.').unwrap_or(name);
        match parse_host(name) {
            Ok(host @ Host::Name(_)) if self.allow.allows(&host) => {
                if kind == RecordType::A {
                    Answer::Proxy(self.answer)
                } else {
                    Answer::NoRecords
                }
            }
            _ => Answer::NxDomain,
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Responder {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        self.counters.queries.fetch_add(1, Ordering::Relaxed);
        let builder = MessageResponseBuilder::from_message_request(request);
        let mut header = Header::response_from_request(request.header());
        header.set_authoritative(true);
        header.set_recursion_available(false);
        let query = match request.request_info() {
            Ok(info)
                if request.op_code() == OpCode::Query
                    && request.message_type() == MessageType::Query =>
            {
                info.query
            }
            _ => {
                let response = builder.error_msg(request.header(), ResponseCode::NotImp);
                return sent(response_handle.send_response(response).await, header);
            }
        };
        let mut records = Vec::new();
        match self.answer(&query.name().to_string(), query.query_type()) {
            Answer::Proxy(ip) => {
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
                records.push(Record::from_rdata(
                    query.name().into(),
                    TTL,
                    RData::A(A(ip)),
                ));
            }
            Answer::NoRecords => {
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
            }
            Answer::NxDomain => {
                self.counters.nxdomain.fetch_add(1, Ordering::Relaxed);
                header.set_response_code(ResponseCode::NXDomain);
            }
        }
        let response = builder.build(
            header,
            records.iter(),
            std::iter::empty(),
            std::iter::empty(),
            std::iter::empty(),
        );
        sent(response_handle.send_response(response).await, header)
    }
}

/// What `handle_request` reports: the answer sent, or SERVFAIL when it
/// could not be.
fn sent(result: std::io::Result<ResponseInfo>, header: Header) -> ResponseInfo {
    result.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "DNS answer not sent");
        let mut failed = header;
        failed.set_response_code(ResponseCode::ServFail);
        failed.into()
    })
}

/// Binds the responder's UDP socket at `addr`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
    tokio::net::UdpSocket::bind(addr).await
}

/// Serves `socket` until the task is aborted or the socket fails (for
/// example, destroyed from outside): the counters say whether it serves,
/// and `/health` with them, so that a responder that stopped makes the
/// proxy unhealthy (sandboxes fail closed, the next pass restarts it).
pub async fn serve(socket: tokio::net::UdpSocket, responder: Responder) {
    let serving = Serving(responder.counters.clone());
    serving.0.serving.store(true, Ordering::Relaxed);
    let mut server = hickory_server::ServerFuture::new(responder);
    server.register_socket(socket);
    match server.block_until_done().await {
        Ok(()) => tracing::error!("the DNS responder stopped: its socket failed"),
        Err(e) => tracing::error!(error = %e, "the DNS responder stopped"),
    }
    drop(serving);
}

/// Marks the responder stopped when [`serve`] ends, however it ends.
struct Serving(Arc<DnsCounters>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.store(false, Ordering::Relaxed);
    }
}

/// The name [`probe`] asks for: under `.invalid`, never anyone's name.
pub const PROBE_NAME: &str = "hermes-health-probe.invalid.";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("its answer is no DNS answer to the query: {0}")]
    Answer(String),
}

/// Asks the responder at `addr` for [`PROBE_NAME`] and waits at most
/// `within` for its answer (any answer code: it answers NXDOMAIN).
pub async fn probe(addr: SocketAddr, within: Duration) -> Result<(), ProbeError> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::Name;
    let ask = async {
        let local: SocketAddr = if addr.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = tokio::net::UdpSocket::bind(local).await?;
        socket.connect(addr).await?;
        // Enough to tell this query's answer from a stray datagram.
        let nanos = std::time::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.subsec_nanos());
        let id = u16::try_from((nanos ^ std::process::id()) & 0xffff).unwrap_or(0x4242);
        let name = Name::from_ascii(PROBE_NAME).map_err(|e| ProbeError::Answer(e.to_string()))?;
        let mut query = Message::new();
        query
            .set_id(id)
            .add_query(Query::query(name, RecordType::A));
        let bytes = query
            .to_vec()
            .map_err(|e| ProbeError::Answer(e.to_string()))?;
        socket.send(&bytes).await?;
        let mut buf = [0u8; 1500];
        loop {
            let n = socket.recv(&mut buf).await?;
            let Ok(answer) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            if answer.id() == id && answer.message_type() == MessageType::Response {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(within, ask)
        .await
        .map_err(|_| ProbeError::Timeout(within))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::Name;

    fn responder() -> Responder {
        let allow = Allowlist::with_defaults(&["*.example.test".to_string()]);
        Responder::new(
            Arc::new(allow),
            Ipv4Addr::new(172, 30, 0, 1),
            Arc::default(),
        )
    }

    #[test]
    fn allowlisted_names_get_the_proxy_and_others_nxdomain() {
        let r = responder();
        let proxy = Answer::Proxy(Ipv4Addr::new(172, 30, 0, 1));
        assert_eq!(r.answer("api.openai.com.", RecordType::A), proxy);
        assert_eq!(r.answer("API.OpenAI.com", RecordType::A), proxy);
        assert_eq!(r.answer("a.example.test.", RecordType::A), proxy);
        assert_eq!(
            r.answer("api.openai.com.", RecordType::AAAA),
            Answer::NoRecords
        );
        assert_eq!(
            r.answer("api.openai.com.", RecordType::TXT),
            Answer::NoRecords
        );
        for other in [
            "evil.test.",
            "x1y2z3.exfil.evil.test.",
            "openai.com.evil.test.",
            "127.0.0.1.",
            "1.0.0.127.in-addr.arpa.",
            ".",
        ] {
            assert_eq!(r.answer(other, RecordType::A), Answer::NxDomain, "{other}");
            assert_eq!(
                r.answer(other, RecordType::TXT),
                Answer::NxDomain,
                "{other}"
            );
        }
    }

    async fn ask(addr: SocketAddr, name: &str, kind: RecordType) -> Message {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut query = Message::new();
        query
            .set_id(4242)
            .set_recursion_desired(true)
            .add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        socket
            .send_to(&query.to_vec().unwrap(), addr)
            .await
            .unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            socket.recv_from(&mut buf),
        )
        .await
        .expect("no answer within 2 s")
        .unwrap();
        Message::from_vec(&buf[..n]).unwrap()
    }

    #[tokio::test]
    async fn it_answers_over_udp_and_counts() {
        let socket = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = socket.local_addr().unwrap();
        let r = responder();
        let counters = r.counters.clone();
        let task = tokio::spawn(serve(socket, r));
        probe(addr, std::time::Duration::from_secs(2))
            .await
            .unwrap();
        assert!(counters.serving.load(Ordering::Relaxed));
        let a = ask(addr, "api.openai.com.", RecordType::A).await;
        assert_eq!(a.id(), 4242);
        assert_eq!(a.response_code(), ResponseCode::NoError);
        assert_eq!(a.answers().len(), 1);
        assert_eq!(
            a.answers()[0].data(),
            &RData::A(A(Ipv4Addr::new(172, 30, 0, 1)))
        );
        let txt = ask(addr, "api.openai.com.", RecordType::TXT).await;
        assert_eq!(txt.response_code(), ResponseCode::NoError);
        assert!(txt.answers().is_empty());
        let nx = ask(addr, "c2VjcmV0.exfil.evil.test.", RecordType::TXT).await;
        assert_eq!(nx.response_code(), ResponseCode::NXDomain);
        assert!(nx.answers().is_empty());
        let snapshot = counters.snapshot();
        assert_eq!(snapshot["queries"], 4);
        assert_eq!(snapshot["answered"], 2);
        assert_eq!(snapshot["nxdomain"], 2);
        // Stopped: it says so, and a probe gets no answer.
        task.abort();
        let _ = task.await;
        assert!(!counters.serving.load(Ordering::Relaxed));
        let err = probe(addr, std::time::Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProbeError::Timeout(_) | ProbeError::Io(_)),
            "{err}"
        );
    }
}
