//! The connection holder: a small background process that keeps one SSH
//! connection to one host/user/port open for every hermes process, as
//! OpenSSH's ControlMaster with `ControlPersist` does.
//!
//! It listens on a unix socket; each request is one connection to it (see
//! [`super::wire`]) and one channel on the SSH connection, so any number of
//! commands share one login. The SSH connection is opened by the first
//! request that needs it; one that has dropped (the server restarted, the
//! network went away) is replaced, and a command whose channel could not
//! be opened on the old one is sent once more on the new one — only when
//! nothing ran. A command whose caller goes away has its remote process
//! tree killed. The holder ends by itself after `idle` with no request
//! running, or as soon as its socket file is removed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Mutex, oneshot};
use tokio::time::Instant;

use super::connection::{ConnectOptions, Connection};
use super::error::SshError;
use super::wire::{self, Done, Forward, Op, Request};
use crate::exec::ExecIo;

/// How often the holder looks at its idle time and its socket file.
const TICK: Duration = Duration::from_millis(500);

/// How a holder runs.
#[derive(Debug, Clone)]
pub struct HolderOptions {
    /// How to connect (`learn` is taken from each request).
    pub connect: ConnectOptions,
    /// End after this long with no request running.
    pub idle: Duration,
    /// The socket file listened on: the holder ends when it is removed or
    /// replaced.
    pub socket: PathBuf,
}

struct Shared {
    options: HolderOptions,
    connection: Mutex<Option<Connection>>,
    active: AtomicUsize,
    last_use: std::sync::Mutex<Instant>,
    uid: u32,
}

/// Counts a request as running while it lives.
struct Busy<'a>(&'a Shared);

impl<'a> Busy<'a> {
    fn new(shared: &'a Shared) -> Busy<'a> {
        shared.active.fetch_add(1, Ordering::SeqCst);
        shared.touch();
        Busy(shared)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    fn touch(&self) {
        if let Ok(mut last) = self.last_use.lock() {
            *last = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last_use
            .lock()
            .map_or(Duration::ZERO, |last| last.elapsed())
    }

    /// The open connection, or a new one.
    async fn connection(&self, learn: bool) -> Result<Connection, SshError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            tracing::info!(dest = %c.dest(), "the connection has closed; opening a new one");
        }
        *slot = None;
        let mut options = self.options.connect.clone();
        options.learn = learn;
        let c = Connection::connect(&options).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Forgets `stale` if it is still the held connection.
    async fn drop_connection(&self, stale: &Connection) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| c.same(stale)) {
            *slot = None;
        }
    }

    /// Makes sure the connection forwards the remote port.
    async fn ensure_forward(&self, c: &Connection, forward: Forward) -> Result<(), SshError> {
        // Under the lock, so two requests never ask for one port twice.
        let _slot = self.connection.lock().await;
        if c.forwards_to(forward.remote_port) == Some(forward.local) {
            return Ok(());
        }
        c.forward_remote_port(forward.remote_port, forward.local)
            .await
    }
}

/// Serves requests on `listener` until idle or until the socket file is
/// gone.
pub async fn serve(listener: UnixListener, options: HolderOptions) -> std::io::Result<()> {
    let socket_identity = file_identity(&options.socket);
    let shared = Arc::new(Shared {
        options,
        connection: Mutex::new(None),
        active: AtomicUsize::new(0),
        last_use: std::sync::Mutex::new(Instant::now()),
        uid: nix::unistd::getuid().as_raw(),
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(&shared, stream).await {
                        tracing::debug!(error = %e, "a request ended early");
                    }
                });
            }
            () = tokio::time::sleep(TICK) => {
                if file_identity(&shared.options.socket) != socket_identity {
                    tracing::info!("the holder's socket was removed; ending");
                    break;
                }
                if shared.idle_for() >= shared.options.idle {
                    tracing::info!(idle = ?shared.options.idle, "idle; ending");
                    break;
                }
            }
        }
    }
    if let Some(c) = shared.connection.lock().await.take() {
        c.disconnect().await;
    }
    Ok(())
}

/// The device and inode of a file, to see it replaced.
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

async fn handle(shared: &Shared, stream: UnixStream) -> std::io::Result<()> {
    let peer = stream.peer_cred()?;
    if peer.uid() != shared.uid {
        tracing::warn!(uid = peer.uid(), "a request from another user; refused");
        return Ok(());
    }
    let _busy = Busy::new(shared);
    let (mut reader, mut writer) = stream.into_split();
    let Some((wire::REQUEST, payload)) = wire::read_frame(&mut reader).await? else {
        return Ok(());
    };
    let request: Request = wire::parse(&payload)?;
    let Some(exec) = request.op.exec_request() else {
        return match shared.connection(request.learn).await {
            Ok(_) => wire::write_frame(&mut writer, wire::PROBED, &[]).await,
            Err(e) => wire::write_json(&mut writer, wire::FAILURE, &e).await,
        };
    };
    let Op::Exec { stdin, remote, .. } = &request.op else {
        return Ok(());
    };
    // Open the channel; on a connection that turns out broken, once more
    // on a new one.
    let mut attempt = 0;
    let learn = request.learn || remote.learn;
    let (connection, running) = loop {
        attempt += 1;
        let c = match shared.connection(learn).await {
            Ok(c) => c,
            Err(e) => return wire::write_json(&mut writer, wire::FAILURE, &e).await,
        };
        let mut forwarded = Ok(());
        for forward in &remote.forwards {
            forwarded = shared.ensure_forward(&c, *forward).await;
            if forwarded.is_err() {
                break;
            }
        }
        if let Err(e) = forwarded {
            if e.is_stale_connection() && attempt == 1 {
                shared.drop_connection(&c).await;
                continue;
            }
            return wire::write_json(&mut writer, wire::FAILURE, &e).await;
        }
        match c.start(&exec, remote).await {
            Ok(running) => break (c, running),
            Err(e) if e.is_stale_connection() && attempt == 1 => {
                tracing::info!(error = %e, "the held connection is broken; reconnecting once");
                shared.drop_connection(&c).await;
            }
            Err(e) => return wire::write_json(&mut writer, wire::FAILURE, &e).await,
        }
    };
    drop(connection);
    wire::write_frame(&mut writer, wire::STARTED, &[]).await?;

    // The client's frames: input, its end, and the client's own end.
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let (mut input_w, mut input_r) = tokio::io::duplex(64 * 1024);
    let wants_input = *stdin;
    tokio::spawn(async move {
        let mut input = Some(&mut input_w);
        if !wants_input {
            input = None;
        }
        loop {
            match wire::read_frame(&mut reader).await {
                Ok(Some((wire::INPUT, data))) => {
                    if let Some(w) = input.as_mut() {
                        if w.write_all(&data).await.is_err() {
                            input = None;
                        }
                    }
                }
                Ok(Some((wire::INPUT_END, _))) => {
                    if let Some(w) = input.take() {
                        let _ = w.shutdown().await;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let _ = gone_tx.send(());
    });
    let cancel = async {
        let _ = gone_rx.await;
    };

    let (mut out_w, out_r) = tokio::io::duplex(64 * 1024);
    let (mut err_w, err_r) = tokio::io::duplex(64 * 1024);
    let run = async move {
        let mut empty = tokio::io::empty();
        let io = ExecIo {
            stdin: Some(if wants_input {
                &mut input_r as &mut (dyn AsyncRead + Unpin + Send)
            } else {
                &mut empty
            }),
            stdout: &mut out_w,
            stderr: &mut err_w,
        };
        running.finish(io, cancel).await
        // The output pipes close here: the relay below drains them.
    };
    let relay = relay_output(out_r, err_r, &mut writer);
    let (result, relayed) = tokio::join!(run, relay);
    relayed?;
    match result {
        Ok(outcome) => wire::write_json(&mut writer, wire::DONE, &Done::from(outcome)).await,
        Err(e) => wire::write_json(&mut writer, wire::FAILURE, &e).await,
    }
}

/// Frames the command's stdout and stderr to the client until both end.
async fn relay_output(
    mut out: impl AsyncRead + Unpin,
    mut err: impl AsyncRead + Unpin,
    writer: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut out_buf = vec![0u8; 32 * 1024];
    let mut err_buf = vec![0u8; 32 * 1024];
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        tokio::select! {
            n = out.read(&mut out_buf), if out_open => match n? {
                0 => out_open = false,
                n => wire::write_frame(writer, wire::STDOUT, &out_buf[..n]).await?,
            },
            n = err.read(&mut err_buf), if err_open => match n? {
                0 => err_open = false,
                n => wire::write_frame(writer, wire::STDERR, &err_buf[..n]).await?,
            },
        }
    }
    Ok(())
}
