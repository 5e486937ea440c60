//! A command in a running instance: `exec instance://<name> bash -c …`.
//!
//! Output streams as the command writes it, stdout and stderr apart; the
//! exit code is the command's (128 + n for a signal). The values for the
//! command (the spec's, the request's, the exec marker) travel in the
//! child's environment as prefixed variables, never on its command line.
//! On timeout a second exec kills every process inside that carries the
//! marker, and their descendants; the client's own process group is
//! killed too, and the outcome is 124.

use std::process::Stdio;
use std::time::Duration;

use hermes_model::singularity::InstanceSpec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{Runtime, SingularityError, argv};
use crate::exec::{
    EXEC_ID_ENV, ExecIo, ExecOutcome, ExecRequest, Executor, TIMEOUT_EXIT_CODE, new_exec_id,
};

/// How long the kill of a timed-out command may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(15);

/// Where a command runs when the request names no directory.
pub const DEFAULT_CWD: &str = "/workspace";

/// One running instance, as a place commands run.
#[derive(Debug, Clone)]
pub struct Instance {
    runtime: Runtime,
    name: String,
    /// The spec's values, for every command.
    env: Vec<(String, String)>,
    /// The names a request's own values may not replace: the egress
    /// proxy's variables and tokens of a wired instance.
    pinned: Vec<String>,
}

impl Instance {
    pub fn new(runtime: Runtime, spec: &InstanceSpec) -> Instance {
        let pinned = if spec.egress == "off" {
            Vec::new()
        } else {
            spec.env
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| {
                    hermes_model::config::PROXY_VARIABLES.contains(&k.as_str())
                        || k == "NODE_USE_ENV_PROXY"
                        || hermes_model::providers::is_credential_variable(k)
                })
                .collect()
        };
        Instance {
            runtime,
            name: spec.name.clone(),
            env: spec.env.clone(),
            pinned,
        }
    }

    /// The values a command gets: the spec's, the request's over them
    /// (but for the pinned names), and the marker.
    fn values(&self, req: &ExecRequest, marker: &str) -> Vec<(String, String)> {
        let mut values = self.env.clone();
        for (k, v) in &req.env {
            if self.pinned.contains(k) || k == EXEC_ID_ENV {
                continue;
            }
            values.retain(|(name, _)| name != k);
            values.push((k.clone(), v.clone()));
        }
        values.push((EXEC_ID_ENV.to_string(), marker.to_string()));
        values
    }

    /// Kills what carries `marker` inside the instance; a failure is logged
    /// (the instance may be gone, taking the processes with it).
    async fn kill_marked(&self, marker: &str) {
        let mut cmd = self
            .runtime
            .command(&argv::kill_marked(&self.name, marker), &[]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        match tokio::time::timeout(KILL_TIMEOUT, cmd.status()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                tracing::warn!(instance = %self.name, %status, "the kill of a timed-out command failed");
            }
            Ok(Err(e)) => tracing::warn!(instance = %self.name, error = %e, "cannot run the kill"),
            Err(_) => tracing::warn!(instance = %self.name, "the kill did not finish in time"),
        }
    }
}

impl Executor for Instance {
    type Error = SingularityError;

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, Self::Error> {
        let deadline = tokio::time::Instant::now() + req.timeout;
        let marker = new_exec_id();
        let cwd = req.cwd.as_deref().unwrap_or(DEFAULT_CWD);
        let mut cmd = self.runtime.command(
            &argv::exec(&self.name, cwd, &req.cmd),
            &self.values(req, &marker),
        );
        cmd.process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if io.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().map_err(|source| SingularityError::Spawn {
            program: self.runtime.program().display().to_string(),
            source,
        })?;
        let group = child.id().and_then(|p| i32::try_from(p).ok());
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let child_in = child.stdin.take();
        let ExecIo {
            stdin,
            stdout,
            stderr,
        } = io;
        let feed = async move {
            if let (Some(input), Some(mut sink)) = (stdin, child_in) {
                // The command may stop reading: a broken pipe is its choice.
                let _ = tokio::io::copy(input, &mut sink).await;
                let _ = sink.shutdown().await;
            }
            std::future::pending::<()>().await;
        };
        let run = async {
            // The first failed write ends both: a closed stdout must not
            // wait for the end of a stderr the command keeps open.
            tokio::try_join!(pump(&mut out, stdout), pump(&mut err, stderr))
                .map_err(SingularityError::Output)?;
            child
                .wait()
                .await
                .map_err(|source| SingularityError::Spawn {
                    program: self.runtime.program().display().to_string(),
                    source,
                })
        };
        let result = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                r = run => r,
                () = feed => unreachable!("the input feed never ends on its own"),
            }
        })
        .await;
        match result {
            Ok(Ok(status)) => Ok(ExecOutcome {
                exit_code: exit_code(status),
                timed_out: false,
            }),
            Ok(Err(e)) => {
                self.kill_marked(&marker).await;
                kill_group(group);
                Err(e)
            }
            Err(_elapsed) => {
                self.kill_marked(&marker).await;
                kill_group(group);
                Ok(ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                })
            }
        }
    }
}

impl Instance {
    /// Runs `req` in the instance on a terminal of its own: `exec` of the
    /// runtime on a pseudo-terminal of this host ([`crate::pty`]), which
    /// the runtime hands to the command. On timeout every process of the
    /// command is killed inside, as for [`Executor::exec`].
    pub async fn exec_tty(
        &self,
        req: &ExecRequest,
        io: crate::exec::TtyIo<'_>,
    ) -> Result<ExecOutcome, SingularityError> {
        let marker = new_exec_id();
        let cwd = req.cwd.as_deref().unwrap_or(DEFAULT_CWD);
        let cmd = self.runtime.command(
            &argv::exec(&self.name, cwd, &req.cmd),
            &self.values(req, &marker),
        );
        let spawn_error = |source| SingularityError::Spawn {
            program: self.runtime.program().display().to_string(),
            source,
        };
        match crate::pty::run(pty_process::Command::from(cmd), io, req.timeout).await {
            Ok(crate::pty::Ended::Exited(status)) => Ok(ExecOutcome {
                exit_code: exit_code(status),
                timed_out: false,
            }),
            Ok(crate::pty::Ended::TimedOut) => {
                self.kill_marked(&marker).await;
                Ok(ExecOutcome {
                    exit_code: TIMEOUT_EXIT_CODE,
                    timed_out: true,
                })
            }
            Err(crate::pty::PtyError::Open(e) | crate::pty::PtyError::Spawn(e)) => {
                Err(spawn_error(e))
            }
            Err(crate::pty::PtyError::Output(e)) => {
                self.kill_marked(&marker).await;
                Err(SingularityError::Output(e))
            }
        }
    }
}

/// Copies a child's output to a writer as it comes, flushing each chunk.
async fn pump<R: AsyncRead + Unpin>(
    from: &mut Option<R>,
    to: &mut (dyn AsyncWrite + Unpin + Send),
) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let Some(from) = from else {
        return Ok(());
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
    }
}

fn kill_group(group: Option<i32>) {
    if let Some(pid) = group.filter(|p| *p > 0) {
        // Already gone is fine.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn exit_code(status: std::process::ExitStatus) -> i64 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => i64::from(code),
        (None, Some(signal)) => 128 + i64::from(signal),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    use hermes_model::config::load;
    use hermes_model::egress::EgressWiring;
    use hermes_model::sandbox::SandboxKey;

    use super::*;

    fn spec(egress: Option<&EgressWiring>) -> InstanceSpec {
        InstanceSpec::new(
            &load("terminal:\n  docker_env: {A: spec}\n").unwrap().config,
            SandboxKey::persistent("p", "t"),
            Path::new("/h"),
            &[],
            egress,
        )
    }

    fn wiring() -> EgressWiring {
        EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 9090,
            ca_host_path: PathBuf::from("/h/proxy/ca.crt"),
            ca_sha256: "ab".repeat(32),
            tokens: vec![("OPENAI_API_KEY".to_string(), "openai-tok".to_string())],
            network: None,
            gcp_adc_host_path: None,
            env_dir_host_path: None,
        }
    }

    fn runtime(dir: &Path, script: &str) -> Runtime {
        let program = dir.join("apptainer");
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        Runtime::find(Some(dir.as_os_str())).unwrap()
    }

    fn request(cmd: &[&str], env: &[(&str, &str)], timeout: Duration) -> ExecRequest {
        ExecRequest {
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
            timeout,
        }
    }

    #[test]
    fn a_request_may_not_replace_the_proxy_or_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path(), "#!/bin/sh\n");
        let wired = Instance::new(rt.clone(), &spec(Some(&wiring())));
        let values = wired.values(
            &request(
                &["true"],
                &[
                    ("A", "mine"),
                    ("HTTPS_PROXY", "http://evil:1"),
                    ("OPENAI_API_KEY", "sk-real"),
                    ("HERMES_EXEC_ID", "forged"),
                ],
                Duration::from_secs(1),
            ),
            "m1",
        );
        let get = |k: &str| {
            values
                .iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("A"), ["mine"]);
        assert_eq!(get("HTTPS_PROXY"), ["http://127.0.0.1:9090"]);
        assert_eq!(get("OPENAI_API_KEY"), ["openai-tok"]);
        assert_eq!(get("HERMES_EXEC_ID"), ["m1"]);
        // Unwired, a request's values are its own.
        let plain = Instance::new(rt, &spec(None));
        let values = plain.values(
            &request(
                &["true"],
                &[("HTTPS_PROXY", "http://p:1")],
                Duration::from_secs(1),
            ),
            "m",
        );
        assert!(values.contains(&("HTTPS_PROXY".to_string(), "http://p:1".to_string())));
    }

    /// A stand-in runtime: records its arguments and environment, then runs
    /// the command after the `hermes CWD` of the exec line itself.
    const FAKE: &str = r#"#!/bin/sh
log="$(dirname "$0")/calls"
printf '%s\n' "$*" >> "$log"
env | grep -E '^(APPTAINERENV_|SECRET_OF_HERMES)' | sort >> "$log"
if [ "$1" = exec ]; then
  case " $* " in *" hermes "*) ;; *) exit 0 ;; esac
  while [ "$1" != hermes ]; do shift; done
  shift 2
  exec "$@"
fi
"#;

    #[tokio::test]
    async fn exec_streams_output_keeps_the_exit_code_and_passes_values_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path(), FAKE);
        let instance = Instance::new(rt, &spec(None));
        let mut out = Vec::new();
        let mut err = Vec::new();
        let req = request(
            &["sh", "-c", "echo out; echo err >&2; exit 7"],
            &[("B", "value-b")],
            Duration::from_secs(10),
        );
        let outcome = instance
            .exec(
                &req,
                ExecIo {
                    stdin: None,
                    stdout: &mut out,
                    stderr: &mut err,
                },
            )
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ExecOutcome {
                exit_code: 7,
                timed_out: false
            }
        );
        assert_eq!(out, b"out\n");
        assert_eq!(err, b"err\n");
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        let first = calls.lines().next().unwrap();
        assert!(
            first.starts_with("exec --cleanenv instance://hermes-p-t bash -c "),
            "{first}"
        );
        assert!(
            !first.contains("value-b") && !first.contains("spec"),
            "{first}"
        );
        assert!(calls.contains("APPTAINERENV_A=spec\n"), "{calls}");
        assert!(calls.contains("APPTAINERENV_B=value-b\n"), "{calls}");
        assert!(calls.contains("APPTAINERENV_HERMES_EXEC_ID="), "{calls}");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_command_and_exits_124() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path(), FAKE);
        let instance = Instance::new(rt, &spec(None));
        let mut out = Vec::new();
        let mut err = Vec::new();
        let started = std::time::Instant::now();
        let req = request(
            &["sh", "-c", "echo started; sleep 30"],
            &[],
            Duration::from_millis(500),
        );
        let outcome = instance
            .exec(
                &req,
                ExecIo {
                    stdin: None,
                    stdout: &mut out,
                    stderr: &mut err,
                },
            )
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ExecOutcome {
                exit_code: 124,
                timed_out: true
            }
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(out, b"started\n");
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        // The kill ran inside the instance with the exec's marker.
        let marker = calls
            .lines()
            .find_map(|l| l.strip_prefix("APPTAINERENV_HERMES_EXEC_ID="))
            .unwrap();
        assert!(
            calls.contains("exec --cleanenv instance://hermes-p-t sh -c id=$1\n"),
            "{calls}"
        );
        assert!(
            calls.contains(&format!("exit 0\n sh {marker}\n")),
            "{calls}"
        );
    }
}
