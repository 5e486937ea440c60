//! The management endpoint, on 127.0.0.1 behind a bearer token:
//! `GET /health` answers the proxy's version, where it listens, its
//! counters, its connection limits, what signed AWS bodies hold and, per provider, whether it holds a
//! real key (and the variable it came from; never the key), and whether
//! the DNS responder serves. `hermes egress status` and every pass read it.
//! It has a budget of its own ([`MGMT_CONNECTIONS`]), apart from the data
//! plane's, so a flood of client connections never makes it look dead.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use crate::body::ProxyBody;
use crate::limits::MGMT_CONNECTIONS;
use crate::server::Shared;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        // Its own budget, apart from the data plane's: a flood of client
        // connections never makes the proxy look dead.
        if shared.mgmt_open.fetch_add(1, Ordering::AcqRel) >= MGMT_CONNECTIONS {
            shared.mgmt_open.fetch_sub(1, Ordering::AcqRel);
            drop(stream);
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            let open = Open(shared.clone());
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, &req)) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(open);
        });
    }
}

/// One open management connection, counted until dropped.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.mgmt_open.fetch_sub(1, Ordering::AcqRel);
    }
}

fn handle(shared: &Shared, req: &Request<Incoming>) -> Response<ProxyBody> {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if !bool::from(presented.ct_eq(shared.mgmt_token.as_bytes())) {
        return json(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({"error": "unauthorized"}),
        );
    }
    if req.method() != Method::GET || req.uri().path() != "/health" {
        return json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "not found"}),
        );
    }
    let bound = shared.bound.get();
    let addrs = |list: Option<&Vec<std::net::SocketAddr>>| -> Vec<String> {
        list.into_iter()
            .flatten()
            .map(ToString::to_string)
            .collect()
    };
    json(
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "tunnel": addrs(bound.map(|b| &b.tunnel)),
            "http": addrs(bound.map(|b| &b.http)),
            "counters": shared.counters().snapshot(),
            // The proxy-only network's DNS responder (transparent egress).
            "dns": shared.dns.as_ref().map(|counters| serde_json::json!({
                "listen": bound.and_then(|b| b.dns).map(|a| a.to_string()),
                // False once it stopped (its socket failed): the proxy is
                // then unhealthy to hermes, which restarts it.
                "serving": counters.serving.load(Ordering::Relaxed),
                "counters": counters.snapshot(),
            })),
            // Per provider, whether a real key is loaded and the variable
            // it came from: never the key.
            "keys": shared.credentials().iter().map(|c| serde_json::json!({
                "provider": c.provider,
                "loaded": c.has_key() || c.oauth.is_some(),
                "digest": c.key.as_ref().map(|k| crate::tokens::key_digest(&shared.mgmt_token, k.expose())),
                "from": if c.oauth.is_some() {
                    Some(crate::google::KEY_FILE_VARIABLE.to_string())
                } else {
                    c.key_env.clone()
                },
            })).collect::<Vec<_>>(),
            "limits": {
                "connections_per_client": shared.limits.per_client(),
                "connections": shared.limits.total(),
                "open": shared.limits.open(),
                "refused": shared.limits.refused(),
            },
            // Signed AWS bodies being read: the bytes they hold, against
            // the total and one client's share.
            "signed_bodies": {
                "held": shared.signed_bodies.held(),
                "bytes": shared.signed_bodies.limits().total,
                "bytes_per_client": shared.signed_bodies.limits().per_client,
            },
        }),
    )
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::text(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
