//! Contract fakes of the remote sandbox services hermes drives (Daytona,
//! Vercel Sandbox, Modal): the services cannot run here, so each fake is a
//! small server on 127.0.0.1 (HTTP; gRPC for Modal) that follows the
//! service's published API for the endpoints hermes uses — paths, JSON fields, status codes, auth,
//! streamed logs — with real sandboxes behind it: every command is a local
//! process in the sandbox's own temporary directory, so exit codes,
//! output, timeouts, kills and files are real.
//!
//! What they share lives here: the server loop, the injectable faults
//! ([`Faults`]: the next N calls, or every call, answer a status, with
//! `Retry-After` when asked), the request log ([`Requests`]) and the
//! process helpers.

pub mod daytona;
pub mod modal;
pub mod vercel;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// A response body.
pub type Body = BoxBody<Bytes, Infallible>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub status: u16,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

#[derive(Debug, Default)]
struct FaultState {
    next: VecDeque<Fault>,
    forever: Option<Fault>,
}

/// Failures the fake answers instead of serving, before anything else
/// (as a gateway in front of the service would).
#[derive(Debug, Default, Clone)]
pub struct Faults(Arc<Mutex<FaultState>>);

impl Faults {
    /// The next `n` requests answer `status`.
    pub fn fail_next(&self, n: usize, status: u16, retry_after: Option<u64>) {
        let mut s = lock(&self.0);
        for _ in 0..n {
            s.next.push_back(Fault {
                status,
                retry_after,
            });
        }
    }

    /// Every request answers `status` until [`Faults::clear`].
    pub fn fail_forever(&self, status: u16) {
        lock(&self.0).forever = Some(Fault {
            status,
            retry_after: None,
        });
    }

    pub fn clear(&self) {
        let mut s = lock(&self.0);
        s.next.clear();
        s.forever = None;
    }

    fn take(&self) -> Option<Fault> {
        let mut s = lock(&self.0);
        s.next.pop_front().or(s.forever)
    }
}

/// Every request a fake received: method and path.
#[derive(Debug, Default, Clone)]
pub struct Requests(Arc<Mutex<Vec<(String, String)>>>);

impl Requests {
    fn record(&self, method: &str, path: &str) {
        lock(&self.0).push((method.to_owned(), path.to_owned()));
    }

    /// How many `method` requests had a path ending with `suffix`.
    pub fn count(&self, method: &str, suffix: &str) -> usize {
        lock(&self.0)
            .iter()
            .filter(|(m, p)| m == method && p.ends_with(suffix))
            .count()
    }

    /// All of them, in order.
    pub fn all(&self) -> Vec<(String, String)> {
        lock(&self.0).clone()
    }
}

/// Serves `handler` on 127.0.0.1 (a port of its own) from a thread with
/// its own runtime, until the returned sender is dropped.
fn serve<F, Fut>(handler: F) -> (SocketAddr, tokio::sync::oneshot::Sender<()>)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("binding the fake's port: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        runtime.block_on(async move {
            let listener =
                tokio::net::TcpListener::from_std(listener).unwrap_or_else(|e| panic!("{e}"));
            let serve = async {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let handler = handler.clone();
                            async move { Ok::<_, Infallible>(handler(req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), service)
                            .with_upgrades()
                            .await;
                    });
                }
            };
            tokio::select! {
                () = serve => {}
                _ = stopped => {}
            }
        });
    });
    (addr, stop)
}

/// A whole answer.
pub(crate) fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

pub(crate) fn json(status: u16, value: &serde_json::Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

fn fault_response(fault: Fault) -> Response<Body> {
    let mut response = json(
        fault.status,
        &serde_json::json!({ "error": { "code": "injected", "message": "injected fault" } }),
    );
    if let Some(secs) = fault.retry_after {
        if let Ok(v) = secs.to_string().parse() {
            response.headers_mut().insert(hyper::header::RETRY_AFTER, v);
        }
    }
    response
}

/// The Bearer token of a request.
fn bearer(req: &Request<Incoming>) -> Option<String> {
    req.headers()
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_owned)
}

/// The query parameter `name`, percent-decoded.
fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    let query = req.uri().query()?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The request's whole body.
async fn body_bytes(req: Request<Incoming>) -> Bytes {
    match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    }
}

/// Kills a process group started by the fake.
fn kill_group(pgid: u32) {
    if let Ok(pid) = i32::try_from(pgid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Whether process `pid` still runs (a zombie does not).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z' | 'X') | None)
        }
        Err(_) => false,
    }
}

/// Copies a directory tree (a snapshot).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// An output sink for exec tests that keeps every write with the moment
/// it came, to show output arrives while the command still runs.
#[derive(Debug, Default, Clone)]
pub struct Capture(Arc<Mutex<Vec<Write>>>);

/// One write and when it came.
type Write = (std::time::Instant, Vec<u8>);

impl Capture {
    /// Everything written, joined.
    pub fn bytes(&self) -> Vec<u8> {
        lock(&self.0).iter().flat_map(|(_, b)| b.clone()).collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// When the first byte of `needle` had arrived.
    pub fn arrived(&self, needle: &str) -> Option<std::time::Instant> {
        let mut seen = Vec::new();
        for (at, chunk) in lock(&self.0).iter() {
            seen.extend_from_slice(chunk);
            if String::from_utf8_lossy(&seen).contains(needle) {
                return Some(*at);
            }
        }
        None
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        lock(&self.0).push((std::time::Instant::now(), buf.to_vec()));
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A file of this host that a command of a fake's sandbox (a local
/// process) waits for: the test opens the gate once it has seen what it
/// waits for, so that "while the command still runs" is an order of
/// events, not a span of time.
#[derive(Debug)]
pub struct Gate {
    dir: tempfile::TempDir,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            dir: tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}")),
        }
    }
}

impl Gate {
    /// sh that waits until the gate is open (at most 15 s) and succeeds
    /// only if it was.
    pub fn shell(&self) -> String {
        let path = self.dir.path().join("open");
        let path = path.display();
        format!(
            "i=0; while [ ! -e '{path}' ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; [ -e '{path}' ]"
        )
    }

    pub fn open(&self) {
        std::fs::write(self.dir.path().join("open"), "")
            .unwrap_or_else(|e| panic!("opening the gate: {e}"));
    }

    /// Opens the gate once `seen` is true (looked at every 20 ms, for at
    /// most 20 s; never opened otherwise, so a command that ends without
    /// being let go shows it).
    pub async fn open_once(&self, seen: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if seen() {
                self.open();
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// The exit code of a finished process as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> i64 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => i64::from(code),
        (None, Some(signal)) => 128 + i64::from(signal),
        (None, None) => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_queries() {
        assert_eq!(percent_decode("a%20b%2Fc+d"), "a b/c d");
        assert_eq!(percent_decode("%zz%"), "%zz%");
    }
}
