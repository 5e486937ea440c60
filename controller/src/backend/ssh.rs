//! The SSH backend in the binary: where a host's connection holder lives
//! (`$HERMES_HOME/run/ssh-<id>.sock`, 0600 in a 0700 directory, with its
//! lock and log beside it), starting it (`hermes ssh-holder`, a hidden
//! subcommand, in the background), running it, and what `exec` and
//! `reconcile` ask of it.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hermes_backends::exec::{ExecIo, ExecRequest};
use hermes_backends::ssh::{
    ConnectOptions, Destination, Forward, HolderClient, HolderOptions, Identity, RemoteExec,
    RemoteFile, SpawnHolder, SshError, SshHost,
};
use hermes_model::action::{Action, Families, SshAction};
use hermes_model::desired::{DEFAULT_TASK, Desired, Egress};
use hermes_model::plan::Plan;
use hermes_model::ssh::{SshObserved, SshTarget, remote_ca, remote_workspace, ssh_egress};

use crate::cli::SshHolderArgs;
use crate::home::Home;

/// How long connecting and logging in may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the probe of a reconcile pass may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The holder's files for one destination.
#[derive(Debug, Clone)]
pub struct HolderFiles {
    pub socket: PathBuf,
    pub lock: PathBuf,
    pub log: PathBuf,
}

impl HolderFiles {
    pub fn new(home: &Home, dest: &Destination) -> HolderFiles {
        let run = home.root().join("run");
        let id = dest.holder_id();
        HolderFiles {
            socket: run.join(format!("ssh-{id}.sock")),
            lock: run.join(format!("ssh-{id}.lock")),
            log: run.join(format!("ssh-{id}.log")),
        }
    }
}

/// The destination of a target.
pub fn destination(target: &SshTarget) -> Destination {
    Destination {
        host: target.host.clone(),
        port: target.port,
        user: target.user.clone(),
    }
}

/// The SSH target of the desired state, or why there is none.
pub fn target(desired: &Desired) -> anyhow::Result<&SshTarget> {
    match &desired.ssh {
        Some(Ok(target)) => Ok(target),
        Some(Err(missing)) => anyhow::bail!("the ssh backend needs a host: {missing}"),
        None => anyhow::bail!("the backend is not ssh"),
    }
}

/// Starts `hermes ssh-holder` for one target in the background: its own
/// process group (a Ctrl-C of the command that started it does not reach
/// it), no terminal, output to its log.
#[derive(Debug)]
struct Spawner {
    home: PathBuf,
    target: SshTarget,
    files: HolderFiles,
}

impl SpawnHolder for Spawner {
    fn spawn(&self) -> std::io::Result<()> {
        if let Some(run) = self.files.socket.parent() {
            crate::fsio::ensure_dir(run, 0o700)?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.files.log)?;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.arg("--home")
            .arg(&self.home)
            .arg("ssh-holder")
            .arg("--host")
            .arg(&self.target.host)
            .arg("--port")
            .arg(self.target.port.to_string())
            .arg("--user")
            .arg(&self.target.user)
            .arg("--persist-seconds")
            .arg(self.target.persist_seconds.to_string());
        if let Some(key) = &self.target.key {
            cmd.arg("--key").arg(key);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map(|_child| ())
    }
}

/// The client of the target's holder (started on first use).
pub fn client(home: &Home, target: &SshTarget) -> HolderClient {
    let files = HolderFiles::new(home, &destination(target));
    let spawner = Spawner {
        home: home.root().to_path_buf(),
        target: target.clone(),
        files: files.clone(),
    };
    HolderClient::new(files.socket, Arc::new(spawner))
}

/// `hermes ssh-holder`: holds the connection until idle. A holder already
/// running for this destination is left to serve, and this one exits 0.
pub async fn run_holder(home: &Home, args: SshHolderArgs) -> anyhow::Result<ExitCode> {
    let dest = Destination {
        host: args.host,
        port: args.port,
        user: args.user,
    };
    let files = HolderFiles::new(home, &dest);
    let run = files
        .socket
        .parent()
        .context("the holder's socket has no directory")?;
    crate::fsio::ensure_dir(run, 0o700)
        .with_context(|| format!("cannot make {}", run.display()))?;
    let _lock = match crate::daemon::lock::ControllerLock::acquire(&files.lock) {
        Ok(lock) => lock,
        Err(crate::daemon::lock::LockError::Held { pid, .. }) => {
            tracing::debug!(pid, "a holder already runs for {dest}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    // Under the lock: whatever socket file is there is a dead holder's.
    match std::fs::remove_file(&files.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("cannot remove {}", files.socket.display()));
        }
    }
    let listener = tokio::net::UnixListener::bind(&files.socket)
        .with_context(|| format!("cannot listen on {}", files.socket.display()))?;
    std::fs::set_permissions(&files.socket, std::fs::Permissions::from_mode(0o600))?;
    // The terminal that started the first exec may close: keep holding.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move { while hangup.recv().await.is_some() {} });
    let options = HolderOptions {
        connect: ConnectOptions {
            dest: dest.clone(),
            identity: match args.key {
                Some(key) => Identity::KeyFile(key),
                None => Identity::Agent,
            },
            known_hosts: home.root().join("known_hosts"),
            learn: false,
            timeout: CONNECT_TIMEOUT,
        },
        idle: Duration::from_secs(args.persist_seconds),
        socket: files.socket.clone(),
    };
    tracing::info!(%dest, socket = %files.socket.display(), "holding the connection");
    let served = hermes_backends::ssh::serve(listener, options).await;
    // Still under the lock: the socket file is ours to remove.
    let _ = std::fs::remove_file(&files.socket);
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The target as an executor (through its holder), and the values every
/// command there gets before its own `--env`. With the egress proxy wired
/// (`Egress::On`), the proxy's tunnel and plain ports are forwarded from
/// the remote's `127.0.0.1` to the proxy here, the CA is copied beside the
/// task's workspace, and the command gets the proxy, CA and token
/// variables (over any of the same name): no real key leaves this host.
pub fn executor(
    home: &Home,
    desired: &Desired,
    task: &str,
) -> anyhow::Result<(SshHost, Vec<(String, String)>)> {
    let target = target(desired)?;
    let mut env = Vec::new();
    let mut remote = RemoteExec {
        default_cwd: remote_workspace(&desired.profile, task)?,
        learn: true,
        ..RemoteExec::default()
    };
    if let Egress::On { wiring, .. } = &desired.egress {
        let ca = remote_ca(&desired.profile, task)?;
        let content = std::fs::read_to_string(&wiring.ca_host_path)
            .with_context(|| format!("reading {}", wiring.ca_host_path.display()))?;
        let wired = ssh_egress(wiring, &ca);
        let local = proxy_address(desired);
        remote.forwards = wired
            .ports
            .iter()
            .map(|&port| Forward {
                remote_port: port,
                local: SocketAddr::new(local, port),
            })
            .collect();
        remote.files.push(RemoteFile { path: ca, content });
        remote.home_env = wired.home_env;
        env = wired.env;
    }
    Ok((
        SshHost {
            holder: client(home, target),
            remote,
        },
        env,
    ))
}

/// Where the proxy listens here for the forwarded connections: its
/// loopback address when it listens on one, else its first address.
fn proxy_address(desired: &Desired) -> IpAddr {
    let listen = desired
        .config
        .proxy
        .listen
        .clone()
        .unwrap_or_else(crate::egress::network::default_listen);
    listen
        .iter()
        .find(|ip| ip.is_loopback())
        .or(listen.first())
        .copied()
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// What a pass sees of the target: connected over a trusted key (a new
/// host is reported, not trusted: observing changes nothing) and whether
/// the default task's workspace exists. `None` off the ssh backend or
/// without a host (the planner reports that by itself).
pub async fn observe(home: &Home, desired: &Desired) -> Option<SshObserved> {
    let target = target(desired).ok()?;
    let workspace = match remote_workspace(&desired.profile, DEFAULT_TASK) {
        Ok(path) => path,
        Err(e) => {
            return Some(SshObserved::Unreachable {
                reason: e.to_string(),
            });
        }
    };
    let client = client(home, target);
    let look = async {
        client.probe(false).await?;
        let req = ExecRequest {
            cmd: vec!["test".into(), "-d".into(), workspace],
            env: Vec::new(),
            cwd: Some(".".into()),
            timeout: PROBE_TIMEOUT,
        };
        let remote = RemoteExec {
            default_cwd: ".".into(),
            learn: false,
            ..RemoteExec::default()
        };
        let (mut out, mut err) = (tokio::io::sink(), tokio::io::sink());
        let io = ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        };
        client.exec(&req, &remote, io).await
    };
    Some(
        match tokio::time::timeout(PROBE_TIMEOUT + CONNECT_TIMEOUT, look).await {
            Ok(Ok(outcome)) => SshObserved::Ready {
                workspace: outcome.exit_code == 0 && !outcome.timed_out,
            },
            Ok(Err(SshError::HostKeyUnknown { fingerprint, .. })) => {
                SshObserved::NewHost { fingerprint }
            }
            Ok(Err(SshError::HostKeyChanged {
                host,
                known_hosts,
                line,
                old,
                new,
            })) => SshObserved::HostKeyChanged {
                detail: format!(
                    "{}:{line} holds {old}, the server offers {new}; not connecting \
                     (if the change is expected: ssh-keygen -R '{host}' -f {})",
                    known_hosts.display(),
                    known_hosts.display()
                ),
            },
            Ok(Err(e)) => SshObserved::Unreachable {
                reason: e.to_string(),
            },
            Err(_) => SshObserved::Unreachable {
                reason: "no answer within a minute".to_string(),
            },
        },
    )
}

/// Carries out the plan's SSH operations: makes the workspace, trusting a
/// new host's key on the way.
pub async fn apply(
    home: &Home,
    desired: &Desired,
    plan: &Plan<Action>,
    verbose: bool,
) -> crate::apply::Applied {
    let mut applied = crate::apply::Applied::default();
    for (op, action) in Families::of(&plan.ops).ssh {
        let started = Instant::now();
        let result = match action {
            SshAction::PrepareWorkspace { path } => prepare_workspace(home, desired, path).await,
        };
        applied.record(
            op,
            started,
            result
                .map(|()| true)
                .map_err(crate::apply::ApplyError::backend),
            verbose,
        );
    }
    applied
}

/// Why an operation on the SSH host failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("the ssh backend needs a host: {0}")]
    NoHost(String),
    #[error("the backend is not ssh")]
    NotSsh,
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error("mkdir exited {code}: {stderr}")]
    Mkdir { code: i64, stderr: String },
}

/// Makes the workspace `path` on the host, trusting a new host's key on
/// the way.
async fn prepare_workspace(home: &Home, desired: &Desired, path: &str) -> Result<(), PrepareError> {
    let target = match &desired.ssh {
        Some(Ok(target)) => target,
        Some(Err(missing)) => return Err(PrepareError::NoHost(missing.clone())),
        None => return Err(PrepareError::NotSsh),
    };
    let req = ExecRequest {
        cmd: vec!["mkdir".into(), "-p".into(), "--".into(), path.to_string()],
        env: Vec::new(),
        cwd: Some(".".into()),
        timeout: PROBE_TIMEOUT,
    };
    let remote = RemoteExec {
        default_cwd: ".".into(),
        learn: true,
        ..RemoteExec::default()
    };
    let mut out = tokio::io::sink();
    let mut err = Vec::new();
    let outcome = client(home, target)
        .exec(
            &req,
            &remote,
            ExecIo {
                stdin: None,
                stdout: &mut out,
                stderr: &mut err,
            },
        )
        .await?;
    if outcome.exit_code != 0 {
        return Err(PrepareError::Mkdir {
            code: outcome.exit_code,
            stderr: String::from_utf8_lossy(&err).trim().to_string(),
        });
    }
    Ok(())
}

/// The SSH backend: the remote host of `terminal.ssh_*`.
pub struct Ssh;

#[async_trait::async_trait]
impl crate::seam::Backend for Ssh {
    fn planner(&self) -> hermes_reconcilers::Planner {
        hermes_reconcilers::ssh::planner
    }

    async fn observe(
        &self,
        home: &Home,
        desired: &Desired,
        observed: &mut hermes_model::observed::Observed,
    ) -> Option<String> {
        observed.ssh = observe(home, desired).await;
        None
    }

    async fn apply(
        &self,
        home: &Home,
        desired: &Desired,
        plan: &hermes_reconcilers::HostPlan,
        verbose: bool,
    ) -> crate::apply::Applied {
        apply(home, desired, plan, verbose).await
    }

    async fn exec_target(
        &self,
        home: &Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<(crate::exec_target::ExecTarget, crate::exec_target::Values)> {
        let (host, env) = executor(home, desired, which.task)?;
        let values = crate::exec_target::Values {
            base: Vec::new(),
            pinned: env,
        };
        Ok((Box::new(host), values))
    }

    async fn find(
        &self,
        home: &Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<Option<crate::exec_target::ExecTarget>> {
        let (host, _) = executor(home, desired, which.task)?;
        Ok(Some(Box::new(host)))
    }

    /// Its sessions' sandboxes, if any, are this host's containers.
    async fn list(
        &self,
        home: &Home,
        desired: &Desired,
    ) -> anyhow::Result<crate::listing::SandboxList> {
        super::docker::list_containers(home, desired).await
    }

    async fn end_session(
        &self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<crate::seam::Ending> {
        super::docker::end_session(home, desired, session).await
    }
}

#[async_trait::async_trait]
impl crate::exec_target::Target for SshHost {
    /// The remote host is shared by every task: beside the task's
    /// workspace (relative to the remote home).
    fn cwd_state(
        &self,
        _home: &Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> String {
        format!(
            ".hermes-sandbox/{}/{}.cwd",
            desired.profile,
            which.key(desired)
        )
    }

    fn jobs_dir(
        &self,
        _home: &Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> String {
        format!(
            ".hermes-sandbox/{}/{}.background",
            desired.profile,
            which.key(desired)
        )
    }

    async fn exec(
        &self,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<hermes_backends::exec::ExecOutcome, crate::exec_target::ExecError> {
        use hermes_backends::exec::Executor;
        Executor::exec(self, req, io)
            .await
            .map_err(crate::exec_target::ExecError::backend)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn holder_files_live_under_run_and_differ_by_destination() {
        let home = Home::resolve(Some(PathBuf::from("/h"))).unwrap();
        let a = Destination {
            host: "h".into(),
            port: 22,
            user: "u".into(),
        };
        let b = Destination {
            port: 2222,
            ..a.clone()
        };
        let fa = HolderFiles::new(&home, &a);
        let fb = HolderFiles::new(&home, &b);
        assert!(fa.socket.starts_with("/h/run"));
        assert!(fa.socket.to_str().unwrap().ends_with(".sock"));
        assert_ne!(fa.socket, fb.socket);
    }
}
