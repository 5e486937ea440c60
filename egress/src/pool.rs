//! Upstream connections kept for reuse across client tunnels, so that a
//! client that opens a tunnel (or a transparent connection) per request
//! does not cost an upstream TLS handshake per request.
//!
//! A connection is kept under the target it was made for (the name its
//! certificate was verified for, and the port), the address it reached and
//! whether it is TLS. A request takes only a connection to one of the
//! addresses its tunnel resolved and checked, and each of those addresses
//! is checked against the deny list again as it is taken (this host's own
//! addresses, which the list refuses, change). New connections are dialled
//! through [`crate::dial`] as before, so the connect-time checks run on
//! every one of them.
//!
//! - HTTP/2: one connection per key, shared by every request (streams).
//! - HTTP/1.1: a connection carries one request at a time. It is taken out
//!   of the pool for its request, and comes back only once the response
//!   has been read to its end ([`Pool::release`]); never two requests on
//!   one connection at once. At most [`MAX_IDLE_PER_KEY`] wait per key, each
//!   at most [`IDLE_TIMEOUT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::body::RequestBody;
use hyper::client::conn::{http1, http2};

use crate::policy::DenyList;
use crate::target::Target;
use crate::upstream::Sender;

/// How many idle HTTP/1.1 connections wait per key.
pub const MAX_IDLE_PER_KEY: usize = 32;
/// How many targets the pool keeps connections for.
pub const MAX_TARGETS: usize = 256;
/// How long an idle connection is kept: below the keep-alive timeouts of
/// common servers (nginx 75 s, Go 90 s), so that the upstream rarely
/// closes a connection just as a request is sent on it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The kept connections, per target.
#[derive(Debug, Default)]
pub struct Pool {
    targets: Mutex<HashMap<Target, Vec<Kept>>>,
}

/// The connections to one target at one address, TLS or not.
#[derive(Debug)]
struct Kept {
    addr: SocketAddr,
    tls: bool,
    h2: Option<http2::SendRequest<RequestBody>>,
    idle: Vec<(http1::SendRequest<RequestBody>, Instant)>,
}

impl Kept {
    fn is_empty(&self) -> bool {
        self.h2.is_none() && self.idle.is_empty()
    }

    /// Drops closed and expired connections.
    fn prune(&mut self, now: Instant) {
        if self.h2.as_ref().is_some_and(http2::SendRequest::is_closed) {
            self.h2 = None;
        }
        self.idle
            .retain(|(s, since)| !s.is_closed() && now.duration_since(*since) < IDLE_TIMEOUT);
    }
}

impl Pool {
    pub fn new() -> Arc<Pool> {
        Arc::new(Pool::default())
    }

    /// A connection to `target` at one of `addrs`, each checked against
    /// `deny` first: the shared HTTP/2 connection, or an idle HTTP/1.1
    /// one, which is now this caller's alone. `None` when there is none.
    pub fn take(
        &self,
        target: &Target,
        tls: bool,
        addrs: &[SocketAddr],
        deny: &DenyList,
    ) -> Option<(SocketAddr, Sender)> {
        let mut targets = self.targets.lock().ok()?;
        let kept = targets.get_mut(target)?;
        let now = Instant::now();
        for addr in addrs {
            if deny.check(addr.ip()).is_err() {
                continue;
            }
            let Some(k) = kept.iter_mut().find(|k| k.addr == *addr && k.tls == tls) else {
                continue;
            };
            if let Some(h2) = &k.h2 {
                if !h2.is_closed() {
                    return Some((*addr, Sender::H2(h2.clone())));
                }
                k.h2 = None;
            }
            while let Some((sender, since)) = k.idle.pop() {
                if sender.is_ready() && now.duration_since(since) < IDLE_TIMEOUT {
                    return Some((*addr, Sender::H1(sender)));
                }
            }
        }
        None
    }

    /// A new connection: an HTTP/2 one is shared from now on (an HTTP/1.1
    /// one comes through [`Pool::release`] once its response is read).
    pub fn offer(&self, target: &Target, addr: SocketAddr, tls: bool, sender: &Sender) {
        if let Sender::H2(h2) = sender {
            self.kept(target, addr, tls, |k| k.h2 = Some(h2.clone()));
        }
    }

    /// Gives an HTTP/1.1 connection back once the response it carries
    /// has been read to its end (hyper says it is ready again); one that
    /// closes first (the client went away mid-body, the upstream closed)
    /// is dropped.
    pub fn release(
        self: &Arc<Self>,
        target: Target,
        addr: SocketAddr,
        tls: bool,
        mut sender: http1::SendRequest<RequestBody>,
    ) {
        let pool = self.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                pool.kept(&target, addr, tls, |k| {
                    if k.idle.len() < MAX_IDLE_PER_KEY {
                        k.idle.push((sender, Instant::now()));
                    }
                });
            }
        });
    }

    /// Runs `f` on the entry of `target` at `addr`, made when missing
    /// (unless the pool already holds [`MAX_TARGETS`] targets).
    fn kept(&self, target: &Target, addr: SocketAddr, tls: bool, f: impl FnOnce(&mut Kept)) {
        let Ok(mut targets) = self.targets.lock() else {
            return;
        };
        if !targets.contains_key(target) {
            if targets.len() >= MAX_TARGETS {
                prune(&mut targets);
                if targets.len() >= MAX_TARGETS {
                    return;
                }
            }
            targets.insert(target.clone(), Vec::new());
        }
        let Some(kept) = targets.get_mut(target) else {
            return;
        };
        let now = Instant::now();
        kept.iter_mut().for_each(|k| k.prune(now));
        let k = match kept.iter().position(|k| k.addr == addr && k.tls == tls) {
            Some(i) => &mut kept[i],
            None => {
                kept.push(Kept {
                    addr,
                    tls,
                    h2: None,
                    idle: Vec::new(),
                });
                let last = kept.len() - 1;
                &mut kept[last]
            }
        };
        f(k);
        kept.retain(|k| !k.is_empty());
        if kept.is_empty() {
            targets.remove(target);
        }
    }

    /// Drops closed and expired connections, and targets left with none.
    pub fn sweep(&self) {
        if let Ok(mut targets) = self.targets.lock() {
            prune(&mut targets);
        }
    }

    /// How many connections are kept: shared HTTP/2 and idle HTTP/1.1.
    pub fn len(&self) -> usize {
        self.targets.lock().map_or(0, |targets| {
            targets
                .values()
                .flatten()
                .map(|k| usize::from(k.h2.is_some()) + k.idle.len())
                .sum()
        })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sweeps every [`IDLE_TIMEOUT`], so that idle connections are closed
    /// even when no request comes for their target.
    pub async fn sweep_every(self: Arc<Self>) {
        loop {
            tokio::time::sleep(IDLE_TIMEOUT).await;
            self.sweep();
        }
    }
}

fn prune(targets: &mut HashMap<Target, Vec<Kept>>) {
    let now = Instant::now();
    targets.retain(|_, kept| {
        kept.iter_mut().for_each(|k| k.prune(now));
        kept.retain(|k| !k.is_empty());
        !kept.is_empty()
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::target::parse_connect;
    use crate::test_upstream::Upstream;
    use crate::upstream::UpstreamTls;

    /// A pooled connection to an address the deny list refuses now (this
    /// host's addresses change) is never handed out.
    #[tokio::test]
    async fn a_connection_to_a_denied_address_is_not_taken() {
        let upstream = Upstream::start_with("127.0.0.1:0".parse().unwrap(), &["localhost"], false);
        let tls = UpstreamTls::new(
            Some(upstream.ca_pem.as_bytes()),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .unwrap();
        let target = parse_connect(&format!("localhost:{}", upstream.addr.port())).unwrap();
        let open = DenyList::new(vec!["169.254.0.0/16".parse().unwrap()]);
        let (sender, addr) = tls
            .connect(&target, &[upstream.addr], &open, false)
            .await
            .unwrap();
        let Sender::H1(h1) = sender else {
            panic!("the upstream offers HTTP/1.1 only")
        };
        let pool = Pool::new();
        pool.release(target.clone(), addr, true, h1);
        // Kept once hyper says the connection is ready again.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.len(), 1);
        // Loopback denied (the default list): not taken, still kept.
        assert!(
            pool.take(&target, true, &[addr], &DenyList::default())
                .is_none()
        );
        // Another port, or plain instead of TLS: another key.
        let other = parse_connect(&format!("localhost:{}", addr.port() + 1)).unwrap();
        assert!(pool.take(&other, true, &[addr], &open).is_none());
        assert!(pool.take(&target, false, &[addr], &open).is_none());
        // An address the tunnel did not resolve: not taken.
        let elsewhere: SocketAddr = format!("127.0.0.2:{}", addr.port()).parse().unwrap();
        assert!(pool.take(&target, true, &[elsewhere], &open).is_none());
        // Allowed: taken, and then the caller's alone.
        let (taken, Sender::H1(_)) = pool.take(&target, true, &[addr], &open).unwrap() else {
            panic!("an HTTP/1.1 connection was kept")
        };
        assert_eq!(taken, addr);
        assert!(pool.take(&target, true, &[addr], &open).is_none());
        assert_eq!(upstream.accepted(), 1);
    }
}
