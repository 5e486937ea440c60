//! The hermes side of the holder: asks the holder of a host to probe the
//! connection or run a command, starting the holder when none answers.
//! A holder that is gone (its socket refuses, or it dies before the command
//! started) is replaced and the request sent once more; once the command
//! has started it is never sent twice.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::time::Instant;

use super::RemoteExec;
use super::error::SshError;
use super::wire::{self, Done, Op, Request};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest, Executor};

/// How long a freshly started holder may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Beyond the command's own timeout: the remote kill, a reconnect.
const GRACE: Duration = Duration::from_secs(60);

/// Starts a holder process in the background, listening on the socket.
pub trait SpawnHolder: Send + Sync {
    fn spawn(&self) -> std::io::Result<()>;
}

/// The client of one host's holder.
#[derive(Clone)]
pub struct HolderClient {
    socket: PathBuf,
    spawner: Arc<dyn SpawnHolder>,
}

impl std::fmt::Debug for HolderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HolderClient")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// Why a request did not get through: a holder that went away before the
/// command started can be replaced.
enum Attempt<T> {
    Done(T),
    HolderGone(String),
}

impl HolderClient {
    pub fn new(socket: PathBuf, spawner: Arc<dyn SpawnHolder>) -> HolderClient {
        HolderClient { socket, spawner }
    }

    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    fn error(&self, reason: impl Into<String>) -> SshError {
        SshError::Holder {
            socket: self.socket.clone(),
            reason: reason.into(),
        }
    }

    /// Connects to the holder, starting one when none listens.
    async fn open(&self) -> Result<UnixStream, SshError> {
        match UnixStream::connect(&self.socket).await {
            Ok(s) => return Ok(s),
            Err(e) if is_absent(&e) => {}
            Err(e) => return Err(self.error(e.to_string())),
        }
        tracing::debug!(socket = %self.socket.display(), "starting a connection holder");
        self.spawner
            .spawn()
            .map_err(|e| self.error(format!("cannot start it: {e}")))?;
        let deadline = Instant::now() + START_TIMEOUT;
        let mut pause = Duration::from_millis(2);
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
            match UnixStream::connect(&self.socket).await {
                Ok(s) => return Ok(s),
                Err(e) if is_absent(&e) && Instant::now() < deadline => {}
                Err(e) => {
                    return Err(self.error(format!(
                        "it did not listen within {}s: {e}",
                        START_TIMEOUT.as_secs()
                    )));
                }
            }
        }
    }

    /// Makes sure the connection is open (trusting a new host only with
    /// `learn`).
    pub async fn probe(&self, learn: bool) -> Result<(), SshError> {
        let request = Request {
            learn,
            op: Op::Probe,
        };
        for attempt in 0..2 {
            let stream = self.open().await?;
            let (mut reader, mut writer) = stream.into_split();
            if let Err(e) = wire::write_json(&mut writer, wire::REQUEST, &request).await {
                if attempt == 0 {
                    continue;
                }
                return Err(self.error(e.to_string()));
            }
            match wire::read_frame(&mut reader).await {
                Ok(Some((wire::PROBED, _))) => return Ok(()),
                Ok(Some((wire::FAILURE, payload))) => {
                    return Err(wire::parse::<SshError>(&payload)
                        .unwrap_or_else(|e| self.error(e.to_string())));
                }
                Ok(Some((tag, _))) => {
                    return Err(self.error(format!("unexpected frame {}", char::from(tag))));
                }
                Ok(None) | Err(_) if attempt == 0 => {}
                Ok(None) => return Err(self.error("it went away")),
                Err(e) => return Err(self.error(e.to_string())),
            }
        }
        Err(self.error("it went away twice"))
    }

    /// Runs a command through the holder.
    pub async fn exec(
        &self,
        req: &ExecRequest,
        remote: &RemoteExec,
        mut io: ExecIo<'_>,
    ) -> Result<ExecOutcome, SshError> {
        let request = Request {
            learn: remote.learn,
            op: Op::Exec {
                cmd: req.cmd.clone(),
                env: req.env.clone(),
                cwd: req.cwd.clone(),
                timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
                stdin: io.stdin.is_some(),
                remote: remote.clone(),
            },
        };
        let limit = req.timeout.saturating_add(GRACE);
        for attempt in 0..2 {
            let run = self.exec_once(&request, &mut io);
            let result = match tokio::time::timeout(limit, run).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(self.error(format!(
                        "no answer within {}s of the command's timeout",
                        GRACE.as_secs()
                    )));
                }
            };
            match result {
                Attempt::Done(outcome) => return Ok(outcome),
                Attempt::HolderGone(why) if attempt == 0 => {
                    tracing::info!(reason = %why, "the holder went away before the command started; starting another");
                }
                Attempt::HolderGone(why) => return Err(self.error(why)),
            }
        }
        Err(self.error("it went away twice"))
    }

    async fn exec_once(
        &self,
        request: &Request,
        io: &mut ExecIo<'_>,
    ) -> Result<Attempt<ExecOutcome>, SshError> {
        let stream = self.open().await?;
        let (mut reader, mut writer) = stream.into_split();
        if let Err(e) = wire::write_json(&mut writer, wire::REQUEST, request).await {
            return Ok(Attempt::HolderGone(e.to_string()));
        }
        // Until `S`, nothing ran.
        match wire::read_frame(&mut reader).await {
            Ok(Some((wire::STARTED, _))) => {}
            Ok(Some((wire::FAILURE, payload))) => {
                return Err(
                    wire::parse::<SshError>(&payload).unwrap_or_else(|e| self.error(e.to_string()))
                );
            }
            Ok(Some((tag, _))) => {
                return Err(self.error(format!("unexpected frame {}", char::from(tag))));
            }
            Ok(None) => return Ok(Attempt::HolderGone("it closed the request".into())),
            Err(e) => return Ok(Attempt::HolderGone(e.to_string())),
        }
        let ExecIo {
            stdin,
            stdout,
            stderr,
        } = io;
        let pump = pump_input(stdin.as_deref_mut(), &mut writer);
        let output = async {
            loop {
                let frame = wire::read_frame(&mut reader)
                    .await
                    .map_err(|e| self.error(format!("lost while the command ran: {e}")))?;
                match frame {
                    Some((wire::STDOUT, data)) => write_out(&mut **stdout, &data).await?,
                    Some((wire::STDERR, data)) => write_out(&mut **stderr, &data).await?,
                    Some((wire::DONE, payload)) => {
                        let done: Done =
                            wire::parse(&payload).map_err(|e| self.error(e.to_string()))?;
                        return Ok(Attempt::Done(done.into()));
                    }
                    Some((wire::FAILURE, payload)) => {
                        return Err(wire::parse::<SshError>(&payload)
                            .unwrap_or_else(|e| self.error(e.to_string())));
                    }
                    Some(_) => {}
                    None => return Err(self.error("it went away while the command ran")),
                }
            }
        };
        // The input may never end (a terminal): the command's end is the end.
        let mut pump = std::pin::pin!(pump);
        let mut output = std::pin::pin!(output);
        let mut pumping = true;
        loop {
            tokio::select! {
                result = &mut output => return result,
                () = &mut pump, if pumping => pumping = false,
            }
        }
    }
}

/// Sends the input in frames, then its end.
async fn pump_input<R: tokio::io::AsyncRead + Unpin + ?Sized>(
    stdin: Option<&mut R>,
    writer: &mut OwnedWriteHalf,
) {
    if let Some(stdin) = stdin {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if wire::write_frame(writer, wire::INPUT, &buf[..n])
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading the command's input");
                    break;
                }
            }
        }
    }
    let _ = wire::write_frame(writer, wire::INPUT_END, &[]).await;
}

async fn write_out(w: &mut (dyn AsyncWrite + Unpin + Send), data: &[u8]) -> Result<(), SshError> {
    use tokio::io::AsyncWriteExt;
    let result = async {
        w.write_all(data).await?;
        w.flush().await
    };
    result.await.map_err(|e| SshError::Output {
        reason: e.to_string(),
    })
}

fn is_absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

/// A remote host, reached through its holder, as an [`Executor`].
#[derive(Debug, Clone)]
pub struct SshHost {
    pub holder: HolderClient,
    pub remote: RemoteExec,
}

impl Executor for SshHost {
    type Error = SshError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, SshError> {
        self.holder.exec(req, &self.remote, io).await
    }
}
