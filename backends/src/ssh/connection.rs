//! One SSH connection through russh: connecting (host key checked against
//! `known_hosts`, trusted on first use), logging in (a key file, or the
//! keys of the agent at `SSH_AUTH_SOCK`), running commands on channels of
//! it (live output, the remote exit code, the remote process tree killed on
//! timeout or when the caller goes away), and remote port forwards.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, ChannelOpenHandle, Handle, Msg, Session};
use russh::keys::{Algorithm, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{Channel, ChannelMsg, Sig};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::error::SshError;
use super::known_hosts::{self, Verdict};
use super::script;
use super::{Destination, Identity, RemoteExec};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest, TIMEOUT_EXIT_CODE, new_exec_id};

/// How long the kill of a timed-out command may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(15);

/// Keepalives: a connection whose server stops answering is closed after
/// `KEEPALIVE_INTERVAL * (KEEPALIVE_MAX + 1)`.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_MAX: usize = 3;

/// How to open a connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub dest: Destination,
    pub identity: Identity,
    /// hermes's own OpenSSH-format `known_hosts`.
    pub known_hosts: PathBuf,
    /// Trust (and record) a host seen for the first time. When false, first
    /// contact is [`SshError::HostKeyUnknown`] and nothing is written.
    pub learn: bool,
    /// For the TCP connection, the key exchange and the login together.
    pub timeout: Duration,
}

/// An open, logged-in connection. Cloning is cheap; clones share it.
#[derive(Clone)]
pub struct Connection {
    handle: Arc<Handle<Client>>,
    dest: Destination,
    /// Remote port → the local address its forwarded connections go to.
    forwards: Forwards,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("dest", &self.dest)
            .field("closed", &self.handle.is_closed())
            .finish_non_exhaustive()
    }
}

type Forwards = Arc<Mutex<BTreeMap<u32, SocketAddr>>>;

/// The client side of russh's conversation: checks the host key and takes
/// the connections the server forwards to us.
struct Client {
    known_hosts: PathBuf,
    host: String,
    port: u16,
    learn: bool,
    forwards: Forwards,
}

/// Why the handler stopped a connection.
#[derive(Debug)]
enum HandlerError {
    Ssh(russh::Error),
    Refused(SshError),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        HandlerError::Ssh(e)
    }
}

impl client::Handler for Client {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, HandlerError> {
        let key = match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            // Host certificates are not trusted as such: the key inside is
            // checked like any other.
            PublicKeyOrCertificate::Certificate(cert) => {
                russh::keys::PublicKey::new(cert.public_key().clone(), "")
            }
        };
        let name = known_hosts::host_name(&self.host, self.port);
        match known_hosts::check(&self.known_hosts, &self.host, self.port, &key)
            .map_err(HandlerError::Refused)?
        {
            Verdict::Known => Ok(true),
            Verdict::Unknown if self.learn => {
                known_hosts::learn(&self.known_hosts, &self.host, self.port, &key)
                    .map_err(HandlerError::Refused)?;
                tracing::info!(host = %name, fingerprint = %known_hosts::fingerprint(&key), "new host key trusted on first use");
                Ok(true)
            }
            Verdict::Unknown => Err(HandlerError::Refused(SshError::HostKeyUnknown {
                host: name,
                known_hosts: self.known_hosts.clone(),
                fingerprint: known_hosts::fingerprint(&key),
            })),
            Verdict::Changed { line, old } => {
                Err(HandlerError::Refused(SshError::HostKeyChanged {
                    host: name,
                    known_hosts: self.known_hosts.clone(),
                    line,
                    old: known_hosts::fingerprint(&old),
                    new: known_hosts::fingerprint(&key),
                }))
            }
        }
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: Channel<Msg>,
        connected_address: &str,
        connected_port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), HandlerError> {
        let target = self
            .forwards
            .lock()
            .ok()
            .and_then(|f| f.get(&connected_port).copied());
        let Some(target) = target else {
            tracing::warn!(
                connected_address,
                connected_port,
                "the server forwarded a connection for a port we did not ask for; refused"
            );
            drop(reply);
            return Ok(());
        };
        reply.accept().await;
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect(target).await {
                Ok(mut local) => {
                    let _ = local.set_nodelay(true);
                    let mut remote = channel.into_stream();
                    if let Err(e) = tokio::io::copy_bidirectional(&mut local, &mut remote).await {
                        tracing::debug!(%target, error = %e, "a forwarded connection ended");
                    }
                }
                Err(e) => {
                    tracing::warn!(%target, error = %e, "cannot reach the forward's local end");
                    let _ = channel.close().await;
                }
            }
        });
        Ok(())
    }
}

impl Connection {
    /// Connects and logs in.
    pub async fn connect(opts: &ConnectOptions) -> Result<Connection, SshError> {
        let dest = opts.dest.to_string();
        match tokio::time::timeout(opts.timeout, Self::connect_inner(opts)).await {
            Ok(result) => result,
            Err(_) => Err(SshError::Unreachable {
                dest,
                reason: format!("no connection and login within {}s", opts.timeout.as_secs()),
            }),
        }
    }

    async fn connect_inner(opts: &ConnectOptions) -> Result<Connection, SshError> {
        let dest = opts.dest.to_string();
        let tcp = tokio::net::TcpStream::connect((opts.dest.host.as_str(), opts.dest.port))
            .await
            .map_err(|e| SshError::Unreachable {
                dest: dest.clone(),
                reason: e.to_string(),
            })?;
        let _ = tcp.set_nodelay(true);
        let config = Arc::new(client::Config {
            keepalive_interval: Some(KEEPALIVE_INTERVAL),
            keepalive_max: KEEPALIVE_MAX,
            nodelay: true,
            ..client::Config::default()
        });
        let forwards = Forwards::default();
        let handler = Client {
            known_hosts: opts.known_hosts.clone(),
            host: opts.dest.host.clone(),
            port: opts.dest.port,
            learn: opts.learn,
            forwards: forwards.clone(),
        };
        let mut handle =
            client::connect_stream(config, tcp, handler)
                .await
                .map_err(|e| match e {
                    HandlerError::Refused(e) => e,
                    HandlerError::Ssh(e) => SshError::Protocol {
                        dest: dest.clone(),
                        reason: e.to_string(),
                    },
                })?;
        authenticate(&mut handle, opts).await?;
        tracing::debug!(%dest, "connected and logged in");
        Ok(Connection {
            handle: Arc::new(handle),
            dest: opts.dest.clone(),
            forwards,
        })
    }

    /// Whether both are the same connection.
    pub fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.handle, &other.handle)
    }

    /// Where connections to the server's `127.0.0.1:remote_port` go, if
    /// that port is forwarded.
    pub fn forwards_to(&self, remote_port: u16) -> Option<SocketAddr> {
        self.forwards
            .lock()
            .ok()
            .and_then(|f| f.get(&u32::from(remote_port)).copied())
    }

    /// Says goodbye to the server.
    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }

    pub fn dest(&self) -> &Destination {
        &self.dest
    }

    /// Whether the connection has ended (the server went away, keepalives
    /// went unanswered).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Asks the server to listen on its `127.0.0.1:remote_port` and to send
    /// each connection there back through this connection, to `local`.
    pub async fn forward_remote_port(
        &self,
        remote_port: u16,
        local: SocketAddr,
    ) -> Result<(), SshError> {
        if let Ok(mut forwards) = self.forwards.lock() {
            forwards.insert(u32::from(remote_port), local);
        }
        self.handle
            .tcpip_forward("127.0.0.1", u32::from(remote_port))
            .await
            .map(|_| ())
            .map_err(|e| SshError::Protocol {
                dest: self.dest.to_string(),
                reason: format!("the server refused to forward its 127.0.0.1:{remote_port}: {e}"),
            })
    }

    /// Opens a channel and sends the command. Until this returns, nothing
    /// ran: an error here on a connection that broke can be retried on a
    /// new one ([`SshError::is_stale_connection`]).
    pub async fn start(&self, req: &ExecRequest, remote: &RemoteExec) -> Result<Running, SshError> {
        let marker = new_exec_id();
        let header = script::header(req, &marker, remote).map_err(|e| SshError::Protocol {
            dest: self.dest.to_string(),
            reason: e.0,
        })?;
        let deadline = Instant::now() + req.timeout;
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| self.protocol(&e))?;
        channel
            .exec(true, script::exec_command())
            .await
            .map_err(|e| self.protocol(&e))?;
        channel
            .data_bytes(header)
            .await
            .map_err(|e| self.protocol(&e))?;
        Ok(Running {
            connection: self.clone(),
            channel,
            marker,
            deadline,
        })
    }

    fn protocol(&self, e: &russh::Error) -> SshError {
        SshError::Protocol {
            dest: self.dest.to_string(),
            reason: e.to_string(),
        }
    }

    fn lost(&self, reason: impl Into<String>) -> SshError {
        SshError::Lost {
            dest: self.dest.to_string(),
            reason: reason.into(),
        }
    }

    /// Stops and kills every process carrying `marker`, and their
    /// descendants, on a channel of its own. Best effort: failures are
    /// logged.
    async fn kill_marked(&self, marker: &str) {
        let kill = async {
            let mut channel = self.handle.channel_open_session().await?;
            channel.exec(true, script::kill_command(marker)).await?;
            channel.eof().await?;
            let mut code = None;
            while let Some(msg) = channel.wait().await {
                match msg {
                    ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
                    ChannelMsg::Close => break,
                    _ => {}
                }
            }
            Ok::<_, russh::Error>(code)
        };
        match tokio::time::timeout(KILL_TIMEOUT, kill).await {
            Ok(Ok(Some(0))) => {}
            Ok(Ok(code)) => {
                tracing::warn!(dest = %self.dest, ?code, "the kill of a timed-out command failed");
            }
            Ok(Err(e)) => {
                tracing::warn!(dest = %self.dest, error = %e, "cannot kill a timed-out command");
            }
            Err(_) => {
                tracing::warn!(dest = %self.dest, "the kill of a timed-out command did not finish");
            }
        }
    }
}

/// A command that was sent: stream it to its end with [`Running::finish`].
pub struct Running {
    connection: Connection,
    channel: Channel<Msg>,
    marker: String,
    deadline: Instant,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("dest", &self.connection.dest)
            .finish_non_exhaustive()
    }
}

/// Why streaming stopped early.
enum Stop {
    Output(std::io::Error),
    Lost(String),
}

impl Running {
    /// Feeds the command its input and streams its output until it ends.
    /// On timeout, or when `cancel` completes first (the caller went away),
    /// the whole remote process tree is killed; a timeout is the outcome
    /// `timed_out`, a cancel an [`SshError::Output`].
    pub async fn finish(
        self,
        io: ExecIo<'_>,
        cancel: impl Future<Output = ()>,
    ) -> Result<ExecOutcome, SshError> {
        let Running {
            connection,
            channel,
            marker,
            deadline,
        } = self;
        let (mut read, write) = channel.split();
        let ExecIo {
            stdin,
            stdout,
            stderr,
        } = io;
        let pump = async {
            if let Some(stdin) = stdin {
                if let Err(e) = write.data(stdin).await {
                    tracing::debug!(error = %e, "the command's input was cut short");
                    return;
                }
            }
            let _ = write.eof().await;
        };
        let output = async {
            let mut code: Option<i64> = None;
            loop {
                let Some(msg) = read.wait().await else {
                    return match code {
                        Some(code) => Ok(code),
                        None => Err(Stop::Lost(
                            "the channel ended without an exit status".into(),
                        )),
                    };
                };
                match msg {
                    ChannelMsg::Data { data } => write_out(stdout, &data).await?,
                    ChannelMsg::ExtendedData { data, ext: 1 } => write_out(stderr, &data).await?,
                    ChannelMsg::ExitStatus { exit_status } => code = Some(i64::from(exit_status)),
                    ChannelMsg::ExitSignal { signal_name, .. } => {
                        code = Some(128 + signal_number(&signal_name));
                    }
                    ChannelMsg::Failure => {
                        return Err(Stop::Lost("the server refused the command".into()));
                    }
                    ChannelMsg::Close => {
                        return code.ok_or_else(|| {
                            Stop::Lost("the channel closed without an exit status".into())
                        });
                    }
                    _ => {}
                }
            }
        };
        // The input may never end (a terminal): the command's end is the end.
        let run = async {
            let mut pump = std::pin::pin!(pump);
            let mut output = std::pin::pin!(output);
            let mut pumping = true;
            loop {
                tokio::select! {
                    result = &mut output => return result,
                    () = &mut pump, if pumping => pumping = false,
                }
            }
        };
        let result = tokio::select! {
            result = run => Some(result),
            () = tokio::time::sleep_until(deadline) => None,
            () = cancel => Some(Err(Stop::Output(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the caller went away",
            )))),
        };
        if !matches!(result, Some(Ok(_))) {
            // Nothing reads the channel any more: its reader goes first,
            // or the connection's loop would wait to hand it the output
            // of a command still writing, and the kill below would never
            // go out.
            drop(read);
            let _ = write.close().await;
        }
        match result {
            Some(Ok(exit_code)) => Ok(ExecOutcome {
                exit_code,
                timed_out: false,
            }),
            None => {
                connection.kill_marked(&marker).await;
                Ok(ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                })
            }
            Some(Err(Stop::Output(e))) => {
                connection.kill_marked(&marker).await;
                Err(SshError::Output {
                    reason: e.to_string(),
                })
            }
            Some(Err(Stop::Lost(reason))) => Err(connection.lost(reason)),
        }
    }
}

async fn write_out(w: &mut (dyn AsyncWrite + Unpin + Send), data: &[u8]) -> Result<(), Stop> {
    w.write_all(data).await.map_err(Stop::Output)?;
    w.flush().await.map_err(Stop::Output)
}

/// Linux's number of a signal SSH names.
fn signal_number(sig: &Sig) -> i64 {
    match sig {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        Sig::Custom(name) => match name.as_str() {
            "USR2" => 12,
            "CHLD" => 17,
            "CONT" => 18,
            "STOP" => 19,
            "TSTP" => 20,
            "XCPU" => 24,
            "XFSZ" => 25,
            _ => 0,
        },
    }
}

/// Logs in with the key file, or with each key of the agent in turn.
async fn authenticate(handle: &mut Handle<Client>, opts: &ConnectOptions) -> Result<(), SshError> {
    let dest = opts.dest.to_string();
    let user = opts.dest.user.clone();
    let protocol = |e: russh::Error| SshError::Protocol {
        dest: dest.clone(),
        reason: e.to_string(),
    };
    match &opts.identity {
        Identity::KeyFile(path) => {
            let key = russh::keys::load_secret_key(path, None).map_err(|e| SshError::Key {
                path: path.clone(),
                reason: match e {
                    russh::keys::Error::KeyIsEncrypted => {
                        "it is protected by a passphrase: load it into ssh-agent and leave terminal.ssh_key unset".to_string()
                    }
                    other => other.to_string(),
                },
            })?;
            let hash = rsa_hash(handle, key.algorithm()).await.map_err(protocol)?;
            let fingerprint = known_hosts::fingerprint(key.public_key());
            let result = handle
                .authenticate_publickey(user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
                .await
                .map_err(protocol)?;
            if result.success() {
                Ok(())
            } else {
                Err(SshError::AuthFailed {
                    dest: dest.clone(),
                    tried: format!("the key {} ({fingerprint})", path.display()),
                })
            }
        }
        Identity::Agent => {
            let mut agent = russh::keys::agent::client::AgentClient::connect_env()
                .await
                .map_err(|e| match e {
                    russh::keys::Error::EnvVar(_) => SshError::NoIdentity { dest: dest.clone() },
                    other => SshError::Agent {
                        reason: other.to_string(),
                    },
                })?;
            let identities = agent
                .request_identities()
                .await
                .map_err(|e| SshError::Agent {
                    reason: e.to_string(),
                })?;
            let mut tried = Vec::new();
            for identity in identities {
                let russh::keys::agent::AgentIdentity::PublicKey { key, .. } = identity else {
                    continue;
                };
                let hash = rsa_hash(handle, key.algorithm()).await.map_err(protocol)?;
                tried.push(known_hosts::fingerprint(&key));
                let result = handle
                    .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                    .await
                    .map_err(|e| SshError::Agent {
                        reason: e.to_string(),
                    })?;
                if result.success() {
                    return Ok(());
                }
            }
            if tried.is_empty() {
                return Err(SshError::NoIdentity { dest });
            }
            Err(SshError::AuthFailed {
                dest: dest.clone(),
                tried: format!("the agent's keys {}", tried.join(", ")),
            })
        }
    }
}

/// The signature hash for an RSA key: the best the server takes.
async fn rsa_hash(
    handle: &Handle<Client>,
    algorithm: Algorithm,
) -> Result<Option<russh::keys::HashAlg>, russh::Error> {
    if matches!(algorithm, Algorithm::Rsa { .. }) {
        Ok(handle.best_supported_rsa_hash().await?.flatten())
    } else {
        Ok(None)
    }
}
