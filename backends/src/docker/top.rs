//! A running container's processes, read where they are.
//!
//! Under runc a container's processes are the host's: the engine's `top`
//! lists them (it runs the host's `ps` and keeps the pids the runtime
//! names). Under a runtime with a kernel of its own (gVisor's runsc, a
//! microVM) they are not: the runtime names its guest's pids, the engine
//! looks those numbers up among the host's processes, and `top` shows
//! whatever host processes happen to have them (seen here under runsc: the
//! host's own init and kernel threads). For those, hermes lists the guest's
//! `/proc` with an engine exec instead ([`GUEST_TOP`]), in `top`'s shape.
//!
//! What the guest prints is the sandbox's and hostile: only rows of the
//! expected shape are taken, a bounded number of them, of bounded length.
//! A sandbox that lies about its processes changes only how busy it looks.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerInspectResponse, ContainerTopResponse};
use futures_util::StreamExt;

use super::Engine;

/// Where a container's processes are seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// In the host's process table; `main_pid`: the host pid of its init.
    Host { main_pid: Option<i64> },
    /// Only inside: its runtime runs a kernel of its own.
    Guest,
}

impl Seen {
    /// From the container's inspect (its runtime and main pid).
    pub(super) fn of(info: &ContainerInspectResponse) -> Seen {
        let runtime = info.host_config.as_ref().and_then(|h| h.runtime.as_deref());
        if host_visible(runtime) {
            Seen::Host {
                main_pid: info.state.as_ref().and_then(|s| s.pid),
            }
        } else {
            Seen::Guest
        }
    }

    /// The pid of the init in the listing [`Engine::top`] gives.
    pub(super) fn main_pid(self) -> Option<i64> {
        match self {
            Seen::Host { main_pid } => main_pid,
            // The guest numbers its own processes: its init is 1.
            Seen::Guest => Some(1),
        }
    }
}

/// Whether a container of `runtime` (its inspect's `HostConfig.Runtime`)
/// runs its processes as the host's.
pub(super) fn host_visible(runtime: Option<&str>) -> bool {
    hermes_model::sandbox::runs_on_host_kernel(runtime)
}

/// Prints `PID PPID CMD` and a row for each process of the guest but this
/// listing's own (and what it starts), `CMD` its command line with spaces
/// between the arguments. Only `sh`, `tr` and `/proc` are needed.
pub(super) const GUEST_TOP: &str = r#"me=$$
echo 'PID PPID CMD'
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$me" ] && continue
  read -r stat 2>/dev/null < "$p/stat" || continue
  rest=${stat##*) }
  ppid=${rest#* }
  ppid=${ppid%% *}
  [ "$ppid" = "$me" ] && continue
  cmd=$(tr '\0\n' '  ' < "$p/cmdline" 2>/dev/null)
  printf '%s %s %s\n' "$pid" "$ppid" "${cmd% }"
done
"#;

/// The most of the listing's output that is read.
const OUTPUT_LIMIT: usize = 256 << 10;
/// Rows taken at most (a sandbox has 256 pids at most).
const MAX_ROWS: usize = 1024;
/// How long the listing may take.
const GUEST_TOP_TIMEOUT: Duration = Duration::from_secs(15);

impl Engine {
    /// The processes of the running container `id`, in `top`'s shape:
    /// the engine's `top` when they are the host's, [`GUEST_TOP`] run
    /// inside otherwise.
    pub(super) async fn top(
        &self,
        id: &str,
        seen: Seen,
    ) -> Result<ContainerTopResponse, bollard::errors::Error> {
        match seen {
            Seen::Host { .. } => self.docker.top_processes(id, None).await,
            Seen::Guest => self.guest_top(id).await,
        }
    }

    async fn guest_top(&self, id: &str) -> Result<ContainerTopResponse, bollard::errors::Error> {
        let options = CreateExecOptions::<String> {
            cmd: Some(vec![
                "sh".to_string(),
                "-c".to_string(),
                GUEST_TOP.to_string(),
                "hermes-top".to_string(),
            ]),
            user: Some("root".to_string()),
            attach_stdout: Some(true),
            attach_stderr: Some(false),
            tty: Some(false),
            ..Default::default()
        };
        let listing = async {
            let exec = self.docker.create_exec(id, options).await?.id;
            let mut said = Vec::new();
            if let StartExecResults::Attached { mut output, .. } =
                self.docker.start_exec(&exec, None).await?
            {
                while let Some(item) = output.next().await {
                    let Ok(item) = item else { break };
                    let bytes = item.into_bytes();
                    let room = OUTPUT_LIMIT.saturating_sub(said.len());
                    said.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    if room == 0 {
                        break;
                    }
                }
            }
            Ok::<_, bollard::errors::Error>(said)
        };
        match tokio::time::timeout(GUEST_TOP_TIMEOUT, listing).await {
            Ok(Ok(said)) => Ok(parse_guest_top(&String::from_utf8_lossy(&said))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(bollard::errors::Error::IOError {
                err: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "listing the sandbox's processes did not finish",
                ),
            }),
        }
    }
}

/// [`GUEST_TOP`]'s output as `top`'s: rows of a numeric pid and parent
/// pid, the rest of the line the command; anything else is dropped.
fn parse_guest_top(text: &str) -> ContainerTopResponse {
    let processes = text
        .lines()
        .skip_while(|l| *l != "PID PPID CMD")
        .skip(1)
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let pid = parts.next()?;
            let ppid = parts.next()?;
            let number =
                |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
            if !number(pid) || !number(ppid) {
                return None;
            }
            let cmd: String = parts.next().unwrap_or("").chars().take(4096).collect();
            Some(vec![pid.to_string(), ppid.to_string(), cmd])
        })
        .take(MAX_ROWS)
        .collect();
    ContainerTopResponse {
        titles: Some(vec![
            "PID".to_string(),
            "PPID".to_string(),
            "CMD".to_string(),
        ]),
        processes: Some(processes),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_listing_keeps_only_rows_of_its_shape() {
        let text = "noise before\nPID PPID CMD\n1 0 /sbin/docker-init -- sleep infinity\n\
                    7 1 sleep infinity\nx 1 forged\n12 7\n99999999999 1 too long\n\
                    40 1 sh -c a  b\n";
        let top = parse_guest_top(text);
        let rows = top.processes.unwrap();
        assert_eq!(
            rows,
            vec![
                vec![
                    "1".to_string(),
                    "0".into(),
                    "/sbin/docker-init -- sleep infinity".into()
                ],
                vec!["7".to_string(), "1".into(), "sleep infinity".into()],
                vec!["12".to_string(), "7".into(), String::new()],
                vec!["40".to_string(), "1".into(), "sh -c a  b".into()],
            ]
        );
    }

    #[test]
    fn a_guest_listing_is_bounded() {
        let mut text = String::from("PID PPID CMD\n");
        for i in 0..5000 {
            text.push_str(&format!("{i} 1 {}\n", "x".repeat(10_000)));
        }
        let rows = parse_guest_top(&text).processes.unwrap();
        assert_eq!(rows.len(), MAX_ROWS);
        assert!(rows.iter().all(|r| r[2].len() <= 4096));
    }
}
