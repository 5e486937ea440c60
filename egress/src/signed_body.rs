//! Signed AWS request bodies, read whole so that their payload hash can be
//! computed before the request is signed again, and what they may hold of
//! the proxy's memory meanwhile. A body holds the bytes that have arrived,
//! never what its `Content-Length` declares, against a share per client
//! (its address, which a sandbox cannot choose: the peer of its TCP
//! connection) and a total over all clients; and it must keep arriving:
//! it gets a grace period, and one more second for every so many bytes
//! that arrive (a minimum rate), [`BODY_TIMEOUT`] at most. A body that would go
//! over a share is refused at once, a slow one is cut, and what either
//! held is given back the moment its request ends.
//!
//! So one client flooding the proxy with large declared bodies that never
//! arrive holds nothing, one that sends them holds at most its share, and
//! the other clients keep theirs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http::header::{CONTENT_LENGTH, HeaderMap};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::time::Instant;

use crate::sigv4::{Refusal, refusal};

/// The largest signed body the proxy reads to hash it.
pub const MAX_BODY: usize = 32 * 1024 * 1024;
/// How long reading a signed body may take, however fast it arrives.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default bytes of signed bodies all clients together may hold.
pub const DEFAULT_TOTAL: usize = 256 * 1024 * 1024;
/// Default bytes of signed bodies one client may hold: two of the
/// largest, a quarter of the total.
pub const DEFAULT_PER_CLIENT: usize = 2 * MAX_BODY;
/// Default time a body may take before the minimum rate applies.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// Default bytes that earn a body one more second after the grace.
pub const DEFAULT_MIN_RATE: u64 = 64 * 1024;

/// How much of the proxy's memory signed bodies may hold, and how fast
/// they must arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Bytes all clients together may hold.
    pub total: usize,
    /// Bytes one client (address) may hold.
    pub per_client: usize,
    /// How long a body may take before `min_rate` applies.
    pub grace: Duration,
    /// The bytes that earn a body one more second after `grace`: a body
    /// is cut once it has taken `grace + received / min_rate`.
    pub min_rate: u64,
}

impl Default for BodyLimits {
    fn default() -> BodyLimits {
        BodyLimits {
            total: DEFAULT_TOTAL,
            per_client: DEFAULT_PER_CLIENT,
            grace: DEFAULT_GRACE,
            min_rate: DEFAULT_MIN_RATE,
        }
    }
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// What signed bodies hold, per client and in all, against [`BodyLimits`].
#[derive(Debug)]
pub struct Budget {
    limits: BodyLimits,
    held: Mutex<Held>,
}

/// Which share a body would have gone over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Client,
    Total,
}

impl Budget {
    pub fn new(limits: BodyLimits) -> Arc<Budget> {
        Arc::new(Budget {
            limits: BodyLimits {
                total: limits.total.max(1),
                per_client: limits.per_client.max(1),
                grace: limits.grace,
                min_rate: limits.min_rate.max(1),
            },
            held: Mutex::new(Held::default()),
        })
    }

    pub fn limits(&self) -> BodyLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // The counts are updated whole under the lock: a panic elsewhere
        // cannot leave them half-written.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes held by all clients.
    pub fn held(&self) -> usize {
        self.lock().total
    }

    /// Bytes held by `client`.
    pub fn held_by(&self, client: IpAddr) -> usize {
        self.lock()
            .by_client
            .get(&client.to_canonical())
            .copied()
            .unwrap_or(0)
    }

    /// An empty hold for one body of `client`.
    pub fn hold(self: &Arc<Self>, client: IpAddr) -> Hold {
        Hold {
            budget: self.clone(),
            client: client.to_canonical(),
            bytes: 0,
        }
    }
}

/// What one body holds; given back when dropped (once the body has been
/// sent upstream, or its request refused or gone).
#[derive(Debug)]
pub struct Hold {
    budget: Arc<Budget>,
    client: IpAddr,
    bytes: usize,
}

impl Hold {
    /// `more` bytes on top, unless the client's share or the total would
    /// be exceeded (then nothing changes).
    fn grow(&mut self, more: usize) -> Result<(), Over> {
        let limits = self.budget.limits;
        let mut held = self.budget.lock();
        let client = held.by_client.get(&self.client).copied().unwrap_or(0);
        if client.saturating_add(more) > limits.per_client {
            return Err(Over::Client);
        }
        if held.total.saturating_add(more) > limits.total {
            return Err(Over::Total);
        }
        held.total += more;
        *held.by_client.entry(self.client).or_insert(0) += more;
        self.bytes += more;
        Ok(())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.budget.lock();
        held.total = held.total.saturating_sub(self.bytes);
        if let Some(count) = held.by_client.get_mut(&self.client) {
            *count = count.saturating_sub(self.bytes);
            if *count == 0 {
                held.by_client.remove(&self.client);
            }
        }
    }
}

/// `n` bytes as people read them: `64 MiB`, `512 KiB`, `100 bytes`.
fn size(n: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if n >= MIB && n % MIB == 0 {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n % KIB == 0 {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

/// When a body that began at `start` and has `received` bytes so far must
/// have more: the grace, then one second per `min_rate` bytes received,
/// and never after [`BODY_TIMEOUT`].
fn due(limits: &BodyLimits, start: Instant, received: usize) -> Instant {
    let earned_ms = (received as u64)
        .saturating_mul(1000)
        .checked_div(limits.min_rate)
        .unwrap_or(u64::MAX);
    let by_rate = limits
        .grace
        .saturating_add(Duration::from_millis(earned_ms));
    start + by_rate.min(BODY_TIMEOUT)
}

/// The body of `client`'s request, read whole: at most [`MAX_BODY`]
/// bytes, within [`BODY_TIMEOUT`] and at the minimum rate, each frame
/// counted against the client's share and the total as it arrives. The
/// hold is the caller's until the body has been sent.
pub async fn read_whole<B>(
    budget: &Arc<Budget>,
    client: IpAddr,
    headers: &HeaderMap,
    mut body: B,
) -> Result<(Bytes, Hold), Refusal>
where
    B: Body<Data = Bytes> + Unpin,
{
    let too_large = || {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            format!(
                "a signed AWS request body is read whole to check its hash, and this one is over {MAX_BODY} bytes: use UNSIGNED-PAYLOAD"
            ),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let limits = budget.limits();
    let start = Instant::now();
    let mut hold = budget.hold(client);
    let mut bytes = BytesMut::new();
    // Each turn takes one frame or ends the body; the deadline never
    // passes `start + BODY_TIMEOUT`, so the loop ends by then at the
    // latest.
    loop {
        let due = due(&limits, start, bytes.len());
        let frame = match tokio::time::timeout_at(due, body.frame()).await {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(_))) => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    "body-error",
                    "the request body ended early",
                ));
            }
            Err(_) if due >= start + BODY_TIMEOUT => {
                return Err(refusal(
                    StatusCode::REQUEST_TIMEOUT,
                    "body-timeout",
                    format!(
                        "the signed request body did not arrive within {} s",
                        BODY_TIMEOUT.as_secs()
                    ),
                ));
            }
            Err(_) => {
                return Err(refusal(
                    StatusCode::REQUEST_TIMEOUT,
                    "body-too-slow",
                    format!(
                        "the signed request body arrived too slowly: {} of {} in {} s; a body gets {} s, and one more for every {} that arrives: send the body as fast as it can go",
                        size(bytes.len()),
                        declared.map_or_else(
                            || "a body of undeclared length".to_string(),
                            |n| usize::try_from(n).map_or_else(|_| format!("{n} bytes"), size)
                        ),
                        start.elapsed().as_secs(),
                        limits.grace.as_secs(),
                        size(usize::try_from(limits.min_rate).unwrap_or(usize::MAX)),
                    ),
                ));
            }
        };
        let Ok(data) = frame.into_data() else {
            // Trailers: nothing to hash.
            continue;
        };
        if bytes.len().saturating_add(data.len()) > MAX_BODY {
            return Err(too_large());
        }
        hold.grow(data.len())
            .map_err(|over| busy(budget, client, over))?;
        bytes.extend_from_slice(&data);
    }
    Ok((bytes.freeze(), hold))
}

/// The refusal of a body that would go over a share.
fn busy(budget: &Budget, client: IpAddr, over: Over) -> Refusal {
    let limits = budget.limits();
    match over {
        Over::Client => refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "sigv4-busy",
            format!(
                "this client ({}) holds {} of signed AWS bodies being read, and this body would take it over the most one client may hold ({}, of the proxy's {} in all): send fewer at once, or retry shortly",
                client.to_canonical(),
                size(budget.held_by(client)),
                size(limits.per_client),
                size(limits.total),
            ),
        ),
        Over::Total => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "sigv4-busy",
            format!(
                "the proxy already holds {} of signed AWS bodies being read, from all its clients: retry shortly",
                size(limits.total)
            ),
        ),
    }
}

#[cfg(test)]
#[path = "signed_body_tests.rs"]
mod tests;
