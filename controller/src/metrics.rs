//! Prometheus metrics of `hermes controller --metrics-addr`: passes,
//! operations by verb and result, the last plan's duration, blocked
//! sandboxes, whether the engine answers. Served over HTTP/1.1 (hyper) at
//! `/metrics`; the controller refuses a non-loopback address unless told
//! otherwise, since the figures name the host's sandboxes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::daemon::status::ControllerStatus;

/// The figures of the last pass, rendered on request.
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<(ControllerStatus, Duration)>,
}

impl Metrics {
    pub fn update(&self, status: &ControllerStatus, pass: Duration) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state = (status.clone(), pass);
    }

    /// The Prometheus text exposition format.
    pub fn render(&self) -> String {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (status, pass) = &*state;
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for line in lines {
                out.push_str(&line);
                out.push('\n');
            }
        };
        metric(
            "hermes_controller_passes_total",
            "counter",
            "Passes of the loop.",
            vec![format!("hermes_controller_passes_total {}", status.passes)],
        );
        metric(
            "hermes_controller_operations_total",
            "counter",
            "Operations carried out, by verb and result.",
            status
                .operations
                .iter()
                .map(|(key, n)| {
                    let (verb, result) = key.split_once('/').unwrap_or((key, ""));
                    format!(
                        "hermes_controller_operations_total{{verb=\"{verb}\",result=\"{result}\"}} {n}"
                    )
                })
                .collect(),
        );
        metric(
            "hermes_controller_pass_duration_seconds",
            "gauge",
            "Duration of the last pass (observe, plan, apply).",
            vec![format!(
                "hermes_controller_pass_duration_seconds {:.6}",
                pass.as_secs_f64()
            )],
        );
        metric(
            "hermes_controller_blocked_sandboxes",
            "gauge",
            "Operations the last plan refused (fail closed).",
            vec![format!(
                "hermes_controller_blocked_sandboxes {}",
                status.blocked.len()
            )],
        );
        metric(
            "hermes_controller_engine_up",
            "gauge",
            "Whether the Docker engine answered the last pass.",
            vec![format!(
                "hermes_controller_engine_up {}",
                u8::from(status.engine_unreachable_since.is_none())
            )],
        );
        metric(
            "hermes_controller_config_valid",
            "gauge",
            "Whether config.yaml could be used by the last pass.",
            vec![format!(
                "hermes_controller_config_valid {}",
                u8::from(status.config_invalid_since.is_none())
            )],
        );
        out
    }
}

/// Binds `addr` and serves `/metrics` until the process ends. A
/// non-loopback address (the unspecified `0.0.0.0` and `::` included) is
/// refused unless `expose`: the metrics have no authentication.
pub async fn serve(addr: SocketAddr, expose: bool, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() && !expose {
        anyhow::bail!(
            "--metrics-addr {addr}: not a loopback address; the metrics have no authentication, \
             so serving them there needs --metrics-expose as well"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))?;
    tracing::info!(%addr, "serving metrics at /metrics");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: wait, do not spin.
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let metrics = Arc::clone(&metrics);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let metrics = Arc::clone(&metrics);
                        async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(())
}

fn respond<B>(req: &Request<B>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body, kind) = if req.uri().path() == "/metrics" {
        (
            StatusCode::OK,
            metrics.render(),
            "text/plain; version=0.0.4",
        )
    } else {
        (
            StatusCode::NOT_FOUND,
            "not found; try /metrics\n".to_string(),
            "text/plain",
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(kind) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_passes_operations_and_health() {
        let metrics = Metrics::default();
        let mut status = ControllerStatus {
            passes: 7,
            blocked: vec!["x".into()],
            ..ControllerStatus::default()
        };
        status.operations.insert("create/ok".into(), 2);
        metrics.update(&status, Duration::from_millis(12));
        let text = metrics.render();
        assert!(
            text.contains("hermes_controller_passes_total 7\n"),
            "{text}"
        );
        assert!(
            text.contains("hermes_controller_operations_total{verb=\"create\",result=\"ok\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("hermes_controller_pass_duration_seconds 0.012000\n"));
        assert!(text.contains("hermes_controller_blocked_sandboxes 1\n"));
        assert!(text.contains("hermes_controller_engine_up 1\n"));
    }
}
