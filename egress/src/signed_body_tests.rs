#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Frame;
use tokio::sync::mpsc;

use super::*;

/// A body fed by hand: each message is one frame; dropping the sender
/// ends it.
struct Fed(mpsc::UnboundedReceiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
    }
}

fn fed() -> (mpsc::UnboundedSender<Bytes>, Fed) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Fed(rx))
}

const KIB: usize = 1024;

fn small() -> Arc<Budget> {
    Budget::new(BodyLimits {
        total: 64 * KIB,
        per_client: 32 * KIB,
        grace: Duration::from_secs(2),
        min_rate: 4 * KIB as u64,
    })
}

fn declaring(n: usize) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_LENGTH, n.to_string().parse().unwrap());
    h
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_declared_length_holds_nothing_until_the_bytes_arrive() {
    let budget = small();
    let a = ip("10.0.0.1");
    // Many bodies declaring the largest size, none of them sending.
    let mut waiting = Vec::new();
    for _ in 0..64 {
        let (tx, body) = fed();
        let budget = budget.clone();
        let task =
            tokio::spawn(async move { read_whole(&budget, a, &declaring(MAX_BODY), body).await });
        waiting.push((tx, task));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(budget.held(), 0);
    // Another client's body is read whole meanwhile.
    let (tx, body) = fed();
    tx.send(Bytes::from(vec![b'x'; 20 * KIB])).unwrap();
    drop(tx);
    let (bytes, hold) = read_whole(&budget, ip("10.0.0.2"), &declaring(20 * KIB), body)
        .await
        .unwrap();
    assert_eq!(bytes.len(), 20 * KIB);
    assert_eq!(budget.held(), 20 * KIB);
    drop(hold);
    assert_eq!(budget.held(), 0);
    for (tx, task) in waiting {
        drop(tx);
        let (bytes, _) = task.await.unwrap().unwrap();
        assert!(bytes.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn one_client_holds_at_most_its_share_and_the_others_keep_theirs() {
    let budget = small();
    let a = ip("10.0.0.1");
    // Client a sends 24 KiB in one body, which it may hold.
    let (tx1, body) = fed();
    tx1.send(Bytes::from(vec![b'a'; 24 * KIB])).unwrap();
    let first = {
        let budget = budget.clone();
        tokio::spawn(async move { read_whole(&budget, a, &declaring(30 * KIB), body).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(budget.held_by(a), 24 * KIB);
    // A second body of a that would take it over 32 KiB is refused at
    // once, saying whose share and how much.
    let (tx2, body) = fed();
    tx2.send(Bytes::from(vec![b'a'; 16 * KIB])).unwrap();
    let r = read_whole(&budget, a, &declaring(16 * KIB), body)
        .await
        .unwrap_err();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.reason, "sigv4-busy");
    assert!(
        r.why
            .starts_with("this client (10.0.0.1) holds 24 KiB of signed AWS bodies being read"),
        "{}",
        r.why
    );
    assert!(
        r.why.contains("(32 KiB, of the proxy's 64 KiB in all)"),
        "{}",
        r.why
    );
    assert_eq!(budget.held_by(a), 24 * KIB);
    // The same address as IPv4-mapped IPv6 is the same client.
    let (tx3, body) = fed();
    tx3.send(Bytes::from(vec![b'a'; 16 * KIB])).unwrap();
    assert!(
        read_whole(&budget, ip("::ffff:10.0.0.1"), &declaring(16 * KIB), body)
            .await
            .is_err()
    );
    // Client b still gets its whole share.
    let (tx, body) = fed();
    tx.send(Bytes::from(vec![b'b'; 32 * KIB])).unwrap();
    drop(tx);
    let (_, b_hold) = read_whole(&budget, ip("10.0.0.2"), &declaring(32 * KIB), body)
        .await
        .unwrap();
    // With the total full, a third client is told it is the proxy's.
    let (tx, body) = fed();
    tx.send(Bytes::from(vec![b'c'; 16 * KIB])).unwrap();
    let r = read_whole(&budget, ip("10.0.0.3"), &declaring(16 * KIB), body)
        .await
        .unwrap_err();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.why
            .starts_with("the proxy already holds 64 KiB of signed AWS bodies"),
        "{}",
        r.why
    );
    drop(b_hold);
    drop(tx1);
    let (bytes, hold) = first.await.unwrap().unwrap();
    assert_eq!(bytes.len(), 24 * KIB);
    drop(hold);
    assert_eq!(budget.held(), 0);
    assert_eq!(budget.held_by(a), 0);
}

#[tokio::test(start_paused = true)]
async fn a_body_slower_than_the_minimum_rate_is_cut_at_its_due_time_and_gives_back_what_it_held() {
    let budget = small();
    let a = ip("10.0.0.1");
    let (tx, body) = fed();
    let started = Instant::now();
    let reading = {
        let budget = budget.clone();
        tokio::spawn(async move { read_whole(&budget, a, &declaring(30 * KIB), body).await })
    };
    // 8 KiB at once earns 2 s beyond the 2 s grace; then a byte now and
    // then, far below 4 KiB/s.
    tx.send(Bytes::from(vec![b'x'; 8 * KIB])).unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if tx.send(Bytes::from_static(b"y")).is_err() {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(budget.held_by(a), 8 * KIB + 3);
    let r = reading.await.unwrap().unwrap_err();
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(r.reason, "body-too-slow");
    assert!(
        r.why.starts_with("the signed request body arrived too slowly: 8195 bytes of 30 KiB in 4 s; a body gets 2 s, and one more for every 4 KiB that arrives"),
        "{}",
        r.why
    );
    // Due at 2 s of grace + 8195 bytes at 4 KiB/s (2.000 s).
    assert!(
        took >= Duration::from_millis(4000) && took < Duration::from_millis(4010),
        "{took:?}"
    );
    assert_eq!(budget.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_body_at_the_minimum_rate_is_read_whole_and_none_after_the_timeout() {
    let budget = Budget::new(BodyLimits {
        total: MAX_BODY,
        per_client: MAX_BODY,
        grace: Duration::from_secs(1),
        min_rate: 1024,
    });
    let a = ip("10.0.0.1");
    // 2 KiB a second keeps ahead of 1 KiB/s: read whole after 5 s.
    let (tx, body) = fed();
    let reading = {
        let budget = budget.clone();
        tokio::spawn(async move { read_whole(&budget, a, &HeaderMap::new(), body).await })
    };
    for _ in 0..5 {
        tx.send(Bytes::from(vec![b'x'; 2 * KIB])).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(tx);
    let (bytes, _) = reading.await.unwrap().unwrap();
    assert_eq!(bytes.len(), 10 * KIB);
    // However fast, a body gets BODY_TIMEOUT in all.
    let (tx, body) = fed();
    let reading = {
        let budget = budget.clone();
        tokio::spawn(async move { read_whole(&budget, a, &HeaderMap::new(), body).await })
    };
    tx.send(Bytes::from(vec![b'x'; 1024 * KIB])).unwrap();
    let r = reading.await.unwrap().unwrap_err();
    assert_eq!(r.reason, "body-timeout");
    drop(tx);
}

#[tokio::test]
async fn a_declared_or_received_body_over_the_largest_is_refused() {
    let budget = small();
    let (_tx, body) = fed();
    let r = read_whole(&budget, ip("10.0.0.1"), &declaring(MAX_BODY + 1), body)
        .await
        .unwrap_err();
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(budget.held(), 0);
}

#[test]
fn sizes_read_as_people_write_them() {
    assert_eq!(size(64 << 20), "64 MiB");
    assert_eq!(size(512 * 1024), "512 KiB");
    assert_eq!(size(1000), "1000 bytes");
}
