//! A command in a sandbox Pod, through its `exec` subresource (kube-rs's
//! WebSocket exec, the `v5.channel.k8s.io` protocol where the server
//! speaks it, so the command reads end of input when ours ends).
//!
//! The subresource takes no environment, so the values for the command
//! (the Pod's own, the request's, the exec marker) travel on its standard
//! input ahead of the caller's ([`crate::env_header`]); none is ever on a
//! command line, which the API server would log. Output streams as the
//! command writes it, stdout and stderr apart; the exit code is the one
//! the server reports (`NonZeroExitCode`).
//!
//! A second exec watches over the command, as on Docker: it reads its
//! input until hermes writes a line (the command ended) or the connection
//! goes (hermes was killed), and then kills every process carrying the
//! marker. On timeout the kill script runs at once, and the outcome is
//! [`TIMEOUT_EXIT_CODE`].

use std::time::Duration;

use hermes_model::kubernetes::CONTAINER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{Cluster, KubeError};
use crate::docker::watch_script;
use crate::env_header;
use crate::exec::{
    EXEC_ID_ENV, ExecIo, ExecOutcome, ExecRequest, Executor, KILL_SCRIPT, TIMEOUT_EXIT_CODE,
    new_exec_id,
};

/// How long the kill of a timed-out (or abandoned) command may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the start of an exec (the WebSocket upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Enters `$1` (126 when it cannot), then runs the rest.
const CD_SCRIPT: &str = r#"cd -- "$1" 2>/dev/null || { printf 'hermes: --cwd %s: no such directory in the sandbox\n' "$1" >&2; exit 126; }
shift
exec "$@""#;

/// One sandbox Pod, as a place commands run.
#[derive(Clone)]
pub struct PodExec {
    cluster: Cluster,
    pod: String,
    /// Values for every command (the proxy's variables and tokens).
    env: Vec<(String, String)>,
    /// Names a request's own values may not replace.
    pinned: Vec<String>,
}

impl std::fmt::Debug for PodExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodExec")
            .field("namespace", &self.cluster.namespace)
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

impl PodExec {
    /// Commands in the Pod `pod` of `cluster`'s namespace, each with `env`
    /// (whose names a request may not replace).
    pub fn new(cluster: Cluster, pod: &str, env: Vec<(String, String)>) -> PodExec {
        let pinned = env.iter().map(|(k, _)| k.clone()).collect();
        PodExec {
            cluster,
            pod: pod.to_string(),
            env,
            pinned,
        }
    }

    /// The Pod's name.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace)
    }

    fn where_(&self) -> String {
        format!("{}/{}", self.cluster.namespace, self.pod)
    }

    async fn start(&self, argv: Vec<String>, stdin: bool) -> Result<AttachedProcess, KubeError> {
        let ap = AttachParams {
            container: Some(CONTAINER.to_string()),
            stdin,
            stdout: true,
            stderr: true,
            tty: false,
            max_stdout_buf_size: Some(64 * 1024),
            max_stderr_buf_size: Some(64 * 1024),
            max_stdin_buf_size: Some(64 * 1024),
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, self.api().exec(&self.pod, argv, &ap)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(KubeError::Exec {
                pod: self.where_(),
                message: e.to_string(),
            }),
            Err(_) => Err(KubeError::Exec {
                pod: self.where_(),
                message: format!(
                    "the exec did not start within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            }),
        }
    }

    /// Kills every process of the command marked `marker`.
    async fn kill(&self, marker: &str) -> Result<(), KubeError> {
        let argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            KILL_SCRIPT.to_string(),
            "hermes-kill".to_string(),
            marker.to_string(),
        ];
        let run = async {
            let mut p = self.start(argv, false).await?;
            let status = p.take_status();
            if let Some(status) = status {
                status.await;
            }
            Ok::<(), KubeError>(())
        };
        tokio::time::timeout(KILL_TIMEOUT, run)
            .await
            .unwrap_or_else(|_| {
                Err(KubeError::Exec {
                    pod: self.where_(),
                    message: format!("the kill did not end within {} s", KILL_TIMEOUT.as_secs()),
                })
            })
    }

    /// How many processes run in the Pod besides its PID 1, PID 1's
    /// `sleep` and this look itself: another exec, or a background process
    /// one left. `None` when the Pod cannot be asked (or answers nonsense:
    /// what comes out of a sandbox is not trusted), which the reaper takes
    /// as busy.
    pub async fn count_processes(&self) -> Option<u32> {
        let argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            COUNT_SCRIPT.to_string(),
        ];
        let run = async {
            let mut p = self.start(argv, false).await.ok()?;
            use tokio::io::AsyncReadExt as _;
            let out = p.stdout()?;
            let mut text = Vec::new();
            out.take(64).read_to_end(&mut text).await.ok()?;
            if let Some(status) = p.take_status() {
                status.await;
            }
            std::str::from_utf8(&text).ok()?.trim().parse::<u32>().ok()
        };
        tokio::time::timeout(KILL_TIMEOUT, run).await.ok().flatten()
    }

    /// The values of one request: the Pod's, then the request's own (those
    /// named like a pinned one are dropped), the marker last.
    fn values(&self, req: &ExecRequest) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        env.extend(
            req.env
                .iter()
                .filter(|(k, _)| !self.pinned.contains(k) && k != EXEC_ID_ENV)
                .cloned(),
        );
        env
    }
}

/// Counts the Pod's processes that are neither PID 1, PID 1's `sleep`
/// (the keeper) nor of this script's own exec (those whose parents lead
/// to one of the script's ancestors): its one line is the count.
const COUNT_SCRIPT: &str = r#"ppid() { s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }; s=${s##*) }; set -- $s; echo "$2"; }
ours=" "; p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do ours="$ours$p "; p=$(ppid "$p"); done
n=0
for d in /proc/[0-9]*; do
  pid=${d#/proc/}; [ "$pid" = 1 ] && continue
  q=$pid; mine=no
  while [ "$q" -gt 1 ] 2>/dev/null; do case $ours in *" $q "*) mine=yes; break ;; esac; q=$(ppid "$q"); done
  [ "$mine" = yes ] && continue
  if [ "$(ppid "$pid")" = 1 ] && [ "$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)" = "sleep 86400 " ]; then continue; fi
  [ -r "$d/stat" ] && n=$((n+1))
done
echo "$n""#;

/// The exit code a finished exec's status reports.
fn exit_code(status: Option<Status>) -> Result<i64, String> {
    let Some(status) = status else {
        return Err("the connection ended without the command's status".to_string());
    };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if status.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_deref())
            .and_then(|m| m.parse::<i64>().ok())
    {
        return Ok(code);
    }
    Err(format!(
        "the command failed: {} {}",
        status.reason.unwrap_or_default(),
        status.message.unwrap_or_default()
    ))
}

async fn pump(
    from: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>,
    to: &mut (dyn AsyncWrite + Unpin + Send),
) -> std::io::Result<()> {
    let Some(mut from) = from else {
        return Ok(());
    };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut from, &mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
    }
}

async fn feed(
    to: Option<tokio::io::WriteHalf<tokio::io::SimplexStream>>,
    header: Vec<u8>,
    stdin: Option<&mut (dyn AsyncRead + Unpin + Send)>,
) -> std::io::Result<()> {
    let Some(mut to) = to else {
        return Ok(());
    };
    to.write_all(&header).await?;
    if let Some(from) = stdin {
        tokio::io::copy(from, &mut to).await?;
    }
    to.shutdown().await
}

impl Executor for PodExec {
    type Error = KubeError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, KubeError> {
        if req.cmd.is_empty() {
            return Err(KubeError::Exec {
                pod: self.where_(),
                message: "no command given".to_string(),
            });
        }
        let marker = new_exec_id();
        let header =
            env_header::header(&self.values(req), &marker).map_err(|message| KubeError::Exec {
                pod: self.where_(),
                message,
            })?;
        let mut argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            env_header::BOOTSTRAP.to_string(),
            "hermes-exec".to_string(),
        ];
        if let Some(cwd) = &req.cwd {
            argv.extend([
                "/bin/sh".to_string(),
                "-c".to_string(),
                CD_SCRIPT.to_string(),
                "hermes-cd".to_string(),
                cwd.clone(),
            ]);
        }
        argv.extend(req.cmd.iter().cloned());
        // The watch is up before the command starts: a hermes killed from
        // here on leaves nothing running.
        let watch_argv = vec![
            "sh".to_string(),
            "-c".to_string(),
            watch_script(),
            "hermes-watch".to_string(),
            marker.clone(),
        ];
        let watch = match self.start(watch_argv, true).await {
            Ok(w) => Some(w),
            Err(error) => {
                tracing::debug!(pod = %self.where_(), %error, "cannot start the watch over a command; it runs unwatched");
                None
            }
        };
        let mut process = self.start(argv, true).await?;
        let status = process.take_status();
        let (stdin_w, stdout_r, stderr_r) = (process.stdin(), process.stdout(), process.stderr());
        let ExecIo {
            stdin,
            stdout,
            stderr,
        } = io;
        let run = async {
            let outputs =
                async { tokio::try_join!(pump(stdout_r, stdout), pump(stderr_r, stderr)) };
            let input = feed(stdin_w, header, stdin);
            tokio::pin!(outputs, input);
            let mut input_done = false;
            loop {
                tokio::select! {
                    out = &mut outputs => break out,
                    sent = &mut input, if !input_done => {
                        input_done = true;
                        if let Err(error) = sent {
                            tracing::debug!(%error, "exec input ended early");
                        }
                    }
                }
            }?;
            let status = match status {
                Some(s) => s.await,
                None => None,
            };
            Ok::<_, std::io::Error>(status)
        };
        let outcome = match tokio::time::timeout(req.timeout, run).await {
            Ok(Ok(status)) => {
                let code = exit_code(status).map_err(|message| KubeError::Exec {
                    pod: self.where_(),
                    message,
                })?;
                ExecOutcome {
                    exit_code: code,
                    timed_out: false,
                }
            }
            Ok(Err(source)) => {
                return Err(KubeError::Io {
                    pod: self.where_(),
                    source,
                });
            }
            Err(_) => {
                tracing::info!(pod = %self.where_(), timeout = ?req.timeout, "exec timed out; killing it");
                drop(process);
                self.kill(&marker).await?;
                ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                }
            }
        };
        if let Some(mut w) = watch {
            // The command ended: the watch goes, killing nothing.
            if let Some(mut input) = w.stdin() {
                let _ = input.write_all(b"\n").await;
                let _ = input.shutdown().await;
            }
            if let Some(status) = w.take_status() {
                let _ = tokio::time::timeout(KILL_TIMEOUT, status).await;
            }
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn the_exit_code_is_read_from_the_status() {
        let ok = Status {
            status: Some("Success".into()),
            ..Status::default()
        };
        assert_eq!(exit_code(Some(ok)), Ok(0));
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            message: Some("command terminated with non-zero exit code".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("127".into()),
                    field: None,
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        };
        assert_eq!(exit_code(Some(failed)), Ok(127));
        assert!(exit_code(None).is_err());
    }
}
