//! `hermes mcp --http ADDR`: the streamable HTTP transport, on a loopback
//! address only, every request carrying `Authorization: Bearer TOKEN`.
//!
//! The token is 256 random bits in `$HERMES_HOME/mcp/token` (0600, in a
//! 0700 directory, made on first use, never through a symbolic link; a
//! file or directory that others can read is refused, not repaired). It
//! is compared in constant time (SHA-256 of both sides, then
//! `subtle`), never logged, never in an error. A request without it, or
//! with another, gets 401 before the MCP layer sees it. Each MCP session
//! is a connection in [`super`]'s sense: its own state, and its own
//! sandbox where sessions are disposable.

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{Base, Hermes};
use crate::home::Home;

/// The path every MCP request goes to.
pub const PATH: &str = "/mcp";

/// The token file: `$HERMES_HOME/mcp/token`.
pub fn token_path(home: &Home) -> PathBuf {
    home.root().join("mcp").join("token")
}

/// Reads the token, making it first if there is none.
fn load_or_create_token(home: &Home) -> anyhow::Result<String> {
    let path = token_path(home);
    let dir = path.parent().unwrap_or(home.root());
    crate::fsio::ensure_dir(dir, 0o700).with_context(|| format!("creating {}", dir.display()))?;
    check_private(dir, 0o700)?;
    match std::fs::symlink_metadata(&path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
            let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            crate::fsio::write_atomic(&path, token.as_bytes(), 0o600, true)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    check_private(&path, 0o600)?;
    let bytes = crate::fsio::read_bounded(&path, 1024)
        .with_context(|| format!("reading {}", path.display()))?
        .with_context(|| format!("{} vanished", path.display()))?;
    let token = String::from_utf8(bytes)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| t.len() >= 32 && t.len() <= 512 && t.bytes().all(|b| b.is_ascii_graphic()))
        .with_context(|| {
            format!(
                "{}: not a token (32 to 512 printable characters); remove it and a new one is made",
                path.display()
            )
        })?;
    Ok(token)
}

/// Refuses a symbolic link, something not ours, or a mode that lets
/// others in.
fn check_private(path: &Path, mode: u32) -> anyhow::Result<()> {
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        !meta.file_type().is_symlink(),
        "{} is a symbolic link; refusing it",
        path.display()
    );
    anyhow::ensure!(
        meta.uid() == nix::unistd::getuid().as_raw(),
        "{} belongs to another user; refusing it",
        path.display()
    );
    let actual = meta.permissions().mode() & 0o777;
    anyhow::ensure!(
        actual & 0o077 == 0,
        "{} has mode {actual:o}; expected {mode:o} (chmod {mode:o} {})",
        path.display(),
        path.display()
    );
    Ok(())
}

/// Whether `header` (an Authorization value) carries `token`; in constant
/// time over the token's bytes.
fn authorized(header: Option<&hyper::header::HeaderValue>, token: &[u8; 32]) -> bool {
    let Some(presented) = header
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let presented: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
    presented.ct_eq(token).into()
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer realm=\"hermes\""),
        );
    }
    response
}

/// Serves until the process is stopped.
pub async fn serve(base: Base, addr: SocketAddr) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "--http {addr}: only a loopback address (127.0.0.1, ::1): the sandbox's tools must not be reachable from the network"
    );
    let token = load_or_create_token(&base.home)?;
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    drop(token);
    let factory_base = base.clone();
    let service = StreamableHttpService::new(
        move || {
            let session = factory_base.connect();
            Ok(Hermes::new(session.clone()).ending(factory_base.clone()))
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!(
        "hermes mcp: serving http://{local}{PATH} (Authorization: Bearer, the token in {})",
        token_path(&base.home).display()
    );
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = service.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let service = service.clone();
                async move {
                    if !authorized(req.headers().get(hyper::header::AUTHORIZATION), &digest) {
                        return Ok::<_, std::convert::Infallible>(plain(
                            StatusCode::UNAUTHORIZED,
                            "a bearer token is required (the one in $HERMES_HOME/mcp/token)\n",
                        ));
                    }
                    if req.uri().path() != PATH {
                        return Ok(plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp\n"));
                    }
                    Ok(service.handle(req).await)
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, handler)
                .await
            {
                tracing::debug!(error = %e, "an HTTP connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_is_authorized() {
        let digest: [u8; 32] = Sha256::digest(b"secret-token").into();
        let ok = hyper::header::HeaderValue::from_static("Bearer secret-token");
        let bad = hyper::header::HeaderValue::from_static("Bearer secret-tokem");
        let basic = hyper::header::HeaderValue::from_static("Basic secret-token");
        assert!(authorized(Some(&ok), &digest));
        assert!(!authorized(Some(&bad), &digest));
        assert!(!authorized(Some(&basic), &digest));
        assert!(!authorized(None, &digest));
    }
}
