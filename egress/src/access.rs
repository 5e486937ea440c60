//! The access log and the counters: one JSON line per request (time,
//! client, host, method, path without query values, status, bytes,
//! duration, decision and reason, the provider whose token was swapped,
//! by name, and the path it came by, `via`), written by a thread of its own so that a slow disk
//! never holds a request; and the counters the management endpoint shows.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use serde::Serialize;

/// How many lines may wait for the writer before new ones are dropped
/// (and counted as dropped).
const QUEUE: usize = 16 * 1024;

/// What was decided about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    Error,
}

/// How a request came to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// The client knew it spoke to a proxy: `CONNECT`, or an absolute URL
    /// on the plain port.
    Connect,
    /// The client connected to the name's address, which the proxy-only
    /// network's DNS gave as the proxy's: the target from the TLS SNI, or
    /// from the `Host` header of plain HTTP.
    Transparent,
}

/// One line of the access log. The time is formatted, and the line
/// serialized, by the writer thread, off the request's path.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    #[serde(serialize_with = "rfc3339")]
    pub time: SystemTime,
    pub client: SocketAddr,
    pub host: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Response body bytes sent to the client.
    pub bytes: u64,
    pub duration_ms: f64,
    pub decision: Decision,
    pub reason: &'static str,
    /// The provider whose token was swapped for its key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    pub via: Via,
}

/// A request whose line is not written yet.
#[derive(Debug)]
pub struct Pending {
    pub started: Instant,
    pub time: SystemTime,
    pub client: SocketAddr,
    pub host: String,
    pub method: String,
    pub path: String,
    pub via: Via,
}

impl Pending {
    /// Each field is cut to its bound ([`MAX_HOST`], [`MAX_METHOD`],
    /// [`MAX_PATH`]) and anything shaped like a proxy token is masked.
    pub fn new(client: SocketAddr, host: String, method: &str, path: String) -> Pending {
        Pending {
            started: Instant::now(),
            time: SystemTime::now(),
            client,
            host: field(host, MAX_HOST),
            method: field(method.to_string(), MAX_METHOD),
            path: field(path, MAX_PATH),
            via: Via::Connect,
        }
    }

    /// The same, come by `via`.
    #[must_use]
    pub fn via(mut self, via: Via) -> Pending {
        self.via = via;
        self
    }

    pub fn finish(
        self,
        status: u16,
        bytes: u64,
        decision: Decision,
        reason: &'static str,
        token: Option<String>,
    ) -> Record {
        Record {
            time: self.time,
            client: self.client,
            host: self.host,
            method: self.method,
            path: self.path,
            status,
            bytes,
            duration_ms: (self.started.elapsed().as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
            decision,
            reason,
            token,
            via: self.via,
        }
    }
}

/// The longest host written to the log, in bytes.
pub const MAX_HOST: usize = 256;
/// The longest method written to the log.
pub const MAX_METHOD: usize = 32;
/// The longest path written to the log.
pub const MAX_PATH: usize = 1024;

/// `text` cut to `max` bytes (at a character boundary, ending with `…`),
/// with every proxy token in it masked.
fn field(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(3);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    mask_tokens(&mut text);
    text
}

/// Masks what looks like a proxy token (`<provider>-<32 hex>`): the 32 hex
/// digits after a `-`, standing alone, become `…`.
fn mask_tokens(text: &mut String) {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'-' {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && bytes[end].is_ascii_hexdigit() {
                end += 1;
            }
            let alone = end == bytes.len() || !bytes[end].is_ascii_alphanumeric();
            if end - start == 32 && alone {
                spans.push((start, end));
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    for (start, end) in spans.into_iter().rev() {
        text.replace_range(start..end, "…");
    }
}

/// `time` as RFC 3339, in UTC.
fn rfc3339<S: serde::Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let text = time::OffsetDateTime::from(*time)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    s.serialize_str(&text)
}

/// What the management endpoint reports.
#[derive(Debug)]
pub struct Counters {
    pub started: Instant,
    pub connections: AtomicU64,
    pub open_connections: AtomicU64,
    pub tunnels: AtomicU64,
    pub open_tunnels: AtomicU64,
    pub requests: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub errors: AtomicU64,
    pub swapped: AtomicU64,
    pub bytes_to_clients: AtomicU64,
    pub log_dropped: AtomicU64,
    /// How often the tokens were reloaded.
    pub reloads: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            started: Instant::now(),
            connections: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            tunnels: AtomicU64::new(0),
            open_tunnels: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            swapped: AtomicU64::new(0),
            bytes_to_clients: AtomicU64::new(0),
            log_dropped: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "uptime_seconds": self.started.elapsed().as_secs(),
            "connections": get(&self.connections),
            "open_connections": get(&self.open_connections),
            "tunnels": get(&self.tunnels),
            "open_tunnels": get(&self.open_tunnels),
            "requests": get(&self.requests),
            "allowed": get(&self.allowed),
            "denied": get(&self.denied),
            "errors": get(&self.errors),
            "swapped": get(&self.swapped),
            "bytes_to_clients": get(&self.bytes_to_clients),
            "log_dropped": get(&self.log_dropped),
            "reloads": get(&self.reloads),
        })
    }
}

/// How many bytes of access lines the writer thread gathers into one
/// write.
const BATCH: usize = 64 * 1024;

/// Where access lines go: a bounded queue drained by a writer thread.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: std::sync::mpsc::SyncSender<Record>,
    counters: Arc<Counters>,
}

impl AccessLog {
    /// Starts the writer thread; it ends when every `AccessLog` is dropped.
    pub fn spawn(
        mut out: Box<dyn Write + Send>,
        counters: Arc<Counters>,
    ) -> std::io::Result<AccessLog> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Record>(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                let mut lines = Vec::with_capacity(BATCH);
                while let Ok(first) = rx.recv() {
                    let mut next = Some(first);
                    // What is queued, in writes of up to BATCH bytes of
                    // whole lines, then one flush.
                    while let Some(record) = next {
                        let start = lines.len();
                        if serde_json::to_writer(&mut lines, &record).is_ok() {
                            lines.push(b'\n');
                        } else {
                            lines.truncate(start);
                        }
                        next = rx.try_recv().ok();
                        if lines.len() >= BATCH || next.is_none() {
                            let _ = out.write_all(&lines);
                            lines.clear();
                        }
                    }
                    let _ = out.flush();
                    // Lines come in bursts: gather them for a moment
                    // rather than waking this thread for each one.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            })?;
        Ok(AccessLog { tx, counters })
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Counts the request and queues its line.
    pub fn write(&self, record: Record) {
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes_to_clients
            .fetch_add(record.bytes, Ordering::Relaxed);
        match record.decision {
            Decision::Allow => c.allowed.fetch_add(1, Ordering::Relaxed),
            Decision::Deny => c.denied.fetch_add(1, Ordering::Relaxed),
            Decision::Error => c.errors.fetch_add(1, Ordering::Relaxed),
        };
        if record.token.is_some() {
            c.swapped.fetch_add(1, Ordering::Relaxed);
        }
        if self.tx.try_send(record).is_err() {
            c.log_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn fields_are_bounded_and_tokens_masked() {
        let token = format!("openai-{}", "ab12".repeat(8));
        let client = "10.0.0.2:5000".parse().unwrap();
        let p = Pending::new(
            client,
            format!("{token}@api.openai.com:443"),
            &"M".repeat(100),
            format!("/v1/{token}/x?k=&{}", "é".repeat(4000)),
        );
        assert!(!p.host.contains(&token) && p.host.starts_with("openai-…@"));
        assert_eq!(p.method.len(), MAX_METHOD - 3 + "…".len());
        assert!(p.path.len() <= MAX_PATH && p.path.starts_with("/v1/openai-…/x"));
        // The line as written: the time in RFC 3339 (UTC), the client as
        // address:port.
        let line =
            serde_json::to_value(p.finish(200, 0, Decision::Allow, "forwarded", None)).unwrap();
        let time = line["time"].as_str().unwrap();
        assert!(
            time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339)
                .is_ok_and(|t| t.offset().is_utc()),
            "{line}"
        );
        assert_eq!(line["client"], "10.0.0.2:5000");
        // Hex runs of other lengths, or inside words, are kept.
        let mut other = format!("/sha-{} /x-{}y", "a".repeat(40), "b".repeat(32));
        let before = other.clone();
        mask_tokens(&mut other);
        assert_eq!(other, before);
    }
}
