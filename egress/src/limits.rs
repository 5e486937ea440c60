//! How many client connections the proxy holds at once, so that one
//! sandbox cannot use up the descriptors every other sandbox, and the
//! health check, need: a limit per client address, and a limit on the
//! whole data plane kept below the process's descriptor limit, the rest
//! (the management endpoint, the listeners, the log, lookups, the shared
//! upstream connections) served from a reserve. A connection over a limit
//! is closed at once; refusals are counted and logged at most once per
//! [`WARN_EVERY`].
//!
//! The bookkeeping is per connection (one short lock when it opens and
//! one when it closes), never per request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default connections one client address may hold open: far more than a
/// client's connection pool, far fewer than the data plane's budget.
pub const DEFAULT_PER_CLIENT: usize = 256;
/// Default ceiling of the data plane's connections, whatever the
/// descriptor limit allows.
pub const DEFAULT_TOTAL: usize = 16_384;
/// Descriptors kept out of the data plane's budget.
pub const RESERVED_DESCRIPTORS: u64 = 512;
/// Connections the management endpoint serves at once.
pub const MGMT_CONNECTIONS: usize = 32;
/// How often a refusal may be logged.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// The data plane's budget under a descriptor limit of `soft`: each
/// client connection may hold a second descriptor upstream, and
/// [`RESERVED_DESCRIPTORS`] stay free; never more than `ceiling`.
pub fn budget(soft: u64, ceiling: usize) -> usize {
    let usable = soft.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .clamp(1, ceiling.max(1))
}

/// The process's soft descriptor limit (`RLIMIT_NOFILE`), if it can be read.
pub fn descriptor_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Which limit a connection went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Client,
    Total,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// The limits and what is open against them.
#[derive(Debug)]
pub struct Limits {
    per_client: usize,
    total: usize,
    open: Mutex<Open>,
    refused: AtomicU64,
    /// Refusals since the last warning.
    unlogged: AtomicU64,
    /// When the last warning was written, in ms after `started`
    /// (`u64::MAX`: never).
    last_warn: AtomicU64,
    started: Instant,
}

/// One admitted connection; its place is freed when dropped.
#[derive(Debug)]
pub struct Slot {
    limits: Arc<Limits>,
    client: IpAddr,
}

impl Limits {
    pub fn new(per_client: usize, total: usize) -> Arc<Limits> {
        Arc::new(Limits {
            per_client: per_client.max(1),
            total: total.max(1),
            open: Mutex::new(Open::default()),
            refused: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            last_warn: AtomicU64::new(u64::MAX),
            started: Instant::now(),
        })
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// How many connections were refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The counts are updated whole under the lock: a panic elsewhere
        // cannot leave them half-written.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one more connection from `client`, or the limit it
    /// would go over (counted, and logged at a bounded rate).
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Result<Slot, Over> {
        let client = client.to_canonical();
        let over = {
            let mut open = self.lock();
            if open.total >= self.total {
                Some(Over::Total)
            } else {
                let count = open.by_client.entry(client).or_insert(0);
                if *count >= self.per_client {
                    Some(Over::Client)
                } else {
                    *count += 1;
                    open.total += 1;
                    None
                }
            }
        };
        match over {
            None => Ok(Slot {
                limits: self.clone(),
                client,
            }),
            Some(over) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.unlogged.fetch_add(1, Ordering::Relaxed);
                self.warn(client, over);
                Err(over)
            }
        }
    }

    /// Logs the refusals since the last warning, at most once per
    /// [`WARN_EVERY`].
    fn warn(&self, client: IpAddr, over: Over) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let last = self.last_warn.load(Ordering::Relaxed);
        let due = last == u64::MAX || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
        if !due
            || self
                .last_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let refused = self.unlogged.swap(0, Ordering::Relaxed);
        let limit = match over {
            Over::Client => format!("{} per client address", self.per_client),
            Over::Total => format!("{} in all", self.total),
        };
        tracing::warn!(
            %client,
            refused,
            "connections over the limit ({limit}) closed at once; the last from {client}"
        );
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limits.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.by_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn each_client_gets_its_share_and_the_total_holds() {
        let limits = Limits::new(2, 3);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = limits.admit(a).unwrap();
        let a2 = limits.admit(a).unwrap();
        assert_eq!(limits.admit(a).unwrap_err(), Over::Client);
        // The same address spelled as IPv4-mapped IPv6 is the same client.
        assert_eq!(
            limits
                .admit("::ffff:10.0.0.1".parse().unwrap())
                .unwrap_err(),
            Over::Client
        );
        let b1 = limits.admit(b).unwrap();
        assert_eq!(limits.admit(b).unwrap_err(), Over::Total);
        assert_eq!(limits.refused(), 3);
        drop(a1);
        let b2 = limits.admit(b).unwrap();
        drop((a2, b1, b2));
        assert_eq!(limits.open(), 0);
        assert!(limits.lock().by_client.is_empty());
    }

    #[test]
    fn the_budget_stays_below_the_descriptor_limit() {
        assert_eq!(budget(1024, DEFAULT_TOTAL), 256);
        assert_eq!(budget(20_000, DEFAULT_TOTAL), 9_744);
        assert_eq!(budget(1 << 20, DEFAULT_TOTAL), DEFAULT_TOTAL);
        assert_eq!(budget(100, DEFAULT_TOTAL), 1);
    }
}
