//! The management endpoint, on 127.0.0.1 behind a bearer token:
//! `GET /health` answers the proxy's version, where it listens and its
//! counters. `hermes egress status` reads it.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use crate::body::ProxyBody;
use crate::server::Shared;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, &req)) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
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
