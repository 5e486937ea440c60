//! `hermes status`: one screen for the host — whether config.yaml can be
//! used, the backend, each sandbox of the profile (state, spec match,
//! egress), the egress proxy (health, addresses, counters), everything the
//! plan blocks with its reason, and what the running controller reports.
//!
//! Whether a controller runs is the lock's answer (a crashed controller
//! leaves its last status file but not its lock); its figures come from the
//! status file it rewrites every pass. Exit 0 when the host is healthy:
//! config usable, nothing blocked, the proxy healthy when enabled, and the
//! controller's last pass clean when one runs, no error (the engine down
//! on the Docker backend, an operation of the last pass that failed).

use std::fmt;
use std::process::ExitCode;
use std::time::SystemTime;

use hermes_model::config::Backend;
use hermes_model::desired::Egress;
use hermes_model::sandbox::{LABEL_EGRESS, sanitize};
use serde::Serialize;

use crate::cli::Output;
use crate::daemon::lock::{ControllerLock, LockError};
use crate::daemon::status::{self, ControllerStatus};
use crate::home::Home;
use crate::pass::{Connect, Load, Request};

/// `status --watch`: how often, and how many reports at most.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    pub interval: std::time::Duration,
    pub count: Option<u64>,
}

pub async fn run(
    home: &Home,
    profile: &str,
    output: Output,
    watch: Option<Watch>,
) -> anyhow::Result<ExitCode> {
    let Some(watch) = watch else {
        let report = gather(home, profile).await?;
        match output {
            Output::Json => crate::json::print(&report)?,
            Output::Text => print!("{report}"),
        }
        return Ok(exit_of(&report));
    };
    // Redrawn in place on a terminal; elsewhere one report after another
    // (JSON: one document per line), each text report after a blank line.
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal();
    let mut shown = 0u64;
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let report = gather(home, profile).await?;
        shown += 1;
        match output {
            Output::Json => println!(
                "{}",
                serde_json::to_string(&crate::json::versioned(&report)?)?
            ),
            Output::Text if terminal => {
                print!("\x1b[H\x1b[2J{report}");
                crate::stdout::flush();
            }
            Output::Text => {
                if shown > 1 {
                    println!();
                }
                print!("{report}");
                crate::stdout::flush();
            }
        }
        if watch.count.is_some_and(|n| shown >= n) {
            return Ok(exit_of(&report));
        }
        tokio::select! {
            () = tokio::time::sleep(watch.interval) => {}
            _ = &mut interrupt => return Ok(exit_of(&report)),
        }
    }
}

/// 0 when the host is healthy, else 1.
fn exit_of(report: &StatusReport) -> ExitCode {
    if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The report: its JSON form is its `Serialize`, its text its `Display`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    #[serde(rename = "healthy")]
    pub healthy: bool,
    #[serde(rename = "config")]
    pub config: ConfigReport,
    #[serde(rename = "backend", serialize_with = "backend_name")]
    pub backend: Backend,
    #[serde(rename = "profile")]
    pub profile: String,
    /// Whether a Docker engine answered.
    #[serde(rename = "engine")]
    pub engine: bool,
    #[serde(rename = "sandboxes")]
    pub sandboxes: Vec<SandboxRow>,
    #[serde(rename = "proxy")]
    pub proxy: ProxyReport,
    /// Everything that fails closed right now: the plan's blocked
    /// operations, and `hermes exec` refused while the proxy is not ready.
    #[serde(rename = "blocked")]
    pub blocked: Vec<String>,
    /// What is wrong besides: the engine not answering on the Docker
    /// backend, a backend that cannot be asked, an operation of the last
    /// `hermes reconcile` that failed (while its target is still wanted).
    #[serde(rename = "errors")]
    pub errors: Vec<String>,
    #[serde(rename = "container_disk")]
    pub container_disk: DiskReport,
    #[serde(rename = "controller")]
    pub controller: ControllerReport,
    /// When the report was made (unix seconds), for the text's ages.
    #[serde(skip)]
    pub now: i64,
}

/// A process id as a number (`null` when the lock names none).
fn pid_number<S: serde::Serializer>(pid: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match pid.as_deref().and_then(|p| p.parse::<u32>().ok()) {
        Some(n) => s.serialize_u32(n),
        None => s.serialize_none(),
    }
}

/// A backend as config.yaml spells it.
fn backend_name<S: serde::Serializer>(backend: &Backend, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(backend.as_str())
}

/// Whether config.yaml can be used.
#[derive(Debug, Serialize)]
pub struct ConfigReport {
    #[serde(rename = "valid")]
    pub valid: bool,
    #[serde(rename = "error")]
    pub error: Option<String>,
}

/// One sandbox of the profile.
#[derive(Debug, Serialize)]
pub struct SandboxRow {
    #[serde(rename = "name")]
    pub name: String,
    #[serde(rename = "state")]
    pub state: String,
    /// The OCI runtime it runs under.
    #[serde(rename = "runtime")]
    pub runtime: String,
    #[serde(rename = "spec_matches")]
    pub spec_matches: bool,
    #[serde(rename = "egress")]
    pub egress: String,
}

/// The egress proxy.
#[derive(Debug, Serialize)]
pub struct ProxyReport {
    #[serde(rename = "enabled")]
    pub enabled: bool,
    #[serde(rename = "set_up")]
    pub set_up: bool,
    #[serde(rename = "running")]
    pub running: bool,
    #[serde(rename = "healthy")]
    pub healthy: bool,
    #[serde(rename = "problem")]
    pub problem: Option<String>,
    /// Where its state file says it accepts CONNECT.
    #[serde(rename = "listening")]
    pub listening: Vec<String>,
    /// Transparent egress (`proxy.enforce_network`): names resolve to the proxy.
    #[serde(rename = "transparent")]
    pub transparent: bool,
    /// How many providers' real keys the running proxy holds, of how many
    /// it serves; `None` when it does not say (or does not run).
    #[serde(rename = "keys_loaded")]
    pub keys_loaded: Option<usize>,
    #[serde(rename = "keys_total")]
    pub keys_total: Option<usize>,
}

/// Whether `terminal.container_disk` is enforced on Docker here.
#[derive(Debug, Serialize)]
pub struct DiskReport {
    #[serde(rename = "enforced")]
    pub enforced: bool,
    /// Why not, when it is not.
    #[serde(rename = "reason")]
    pub reason: Option<String>,
    /// The line of the text.
    #[serde(skip)]
    pub text: String,
}

/// The controller, if one runs, and its last status file.
#[derive(Debug, Serialize)]
pub struct ControllerReport {
    #[serde(rename = "running")]
    pub running: bool,
    /// Its process id, as its lock file names it.
    #[serde(rename = "pid", serialize_with = "pid_number")]
    pub pid: Option<String>,
    #[serde(rename = "status")]
    pub status: Option<ControllerStatus>,
}

/// The egress proxy of the kubernetes backend, as a pass saw its Pod.
struct InCluster {
    running: bool,
    /// Why sandbox Pods wait for it; `None` when it is up on the current
    /// settings.
    problem: Option<String>,
    /// Where sandboxes reach it: its Service.
    listening: Vec<String>,
}

/// The cluster's proxy, on the kubernetes backend with `proxy.enabled`.
fn in_cluster(
    desired: &hermes_model::desired::Desired,
    observed: &hermes_model::observed::Observed,
    plan: &hermes_reconcilers::HostPlan,
) -> Option<InCluster> {
    use hermes_model::kubernetes::KubeObserved;
    use hermes_model::kubernetes::proxy::ProxyObject;
    if desired.backend() != Backend::Kubernetes || !desired.config.proxy.enabled {
        return None;
    }
    let wanted = desired.kube_proxy();
    let Some(KubeObserved::Seen { proxy: seen, .. }) = &observed.kubernetes else {
        return Some(InCluster {
            running: false,
            problem: Some("the API server could not be asked".to_string()),
            listening: Vec::new(),
        });
    };
    let own: Vec<_> = plan
        .ops
        .iter()
        .filter(|op| op.target == hermes_model::plan::Target::Proxy)
        .cloned()
        .collect();
    let running = wanted.as_ref().is_some_and(|w| {
        seen.get(ProxyObject::Pod, &w.object_name(ProxyObject::Pod))
            .is_some_and(|p| p.phase == "Running")
    });
    Some(InCluster {
        running,
        problem: hermes_reconcilers::kubernetes::proxy::sandboxes_wait(desired, seen, &own),
        listening: wanted
            .map(|w| {
                vec![format!(
                    "{}.{}.svc:{} (Pod {}/{})",
                    w.name(),
                    w.namespace,
                    w.tunnel_port,
                    w.namespace,
                    w.object_name(ProxyObject::Pod)
                )]
            })
            .unwrap_or_default(),
    })
}

async fn gather(home: &Home, profile: &str) -> anyhow::Result<StatusReport> {
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    // The host as a pass would see it: the same pass, planning only.
    let mut engines = Connect {
        tolerate: true,
        error: None,
    };
    let request = Request {
        load: Load::Pass,
        prune: false,
        apply: None,
        hold: &|_| false,
        planned: &|_| true,
    };
    let pass = crate::pass::run(home, profile, request, &mut engines).await?;
    let desired = &pass.desired;
    let mut errors: Vec<String> = engines.error.into_iter().collect();
    errors.extend(pass.ended.iter().cloned());
    errors.extend(pass.errors.iter().cloned());
    let engine = pass.engine.as_ref();
    let observed = engine.map(|_| &pass.observed);
    let mut proxy = pass.observed.proxy.clone();
    let keys = proxy.keys.clone();
    // What blocks now (the first stage: later ones wait on it).
    let plan = &pass.plan.first;
    // On kubernetes the proxy is the cluster's Pod, not a daemon here.
    let cluster_proxy = in_cluster(desired, &pass.observed, plan);
    if let Some(c) = &cluster_proxy {
        proxy.running = c.running;
        proxy.healthy = c.problem.is_none();
        proxy.problem = c.problem.clone();
    }
    let mut blocked = hermes_reconcilers::blocked(plan);
    // What `hermes exec` refuses right now (exit 3), even when no
    // operation of the plan is blocked (a sandbox that already runs).
    if desired.config.proxy.enabled
        && let Some(reason) = hermes_reconcilers::proxy::fail_closed_reason(desired, &proxy)
    {
        blocked.push(format!(
            "exec on the {} backend: {reason}",
            desired.backend()
        ));
    }
    // The Docker sandboxes of a config hermes will not honour: `hermes
    // exec` refuses them too, warm or not.
    if desired.backend() == Backend::Docker
        && let Some(reason) = &desired.docker_blocked
    {
        blocked.push(format!("exec on the docker backend: {reason}"));
    }
    // A bwrap sandbox this host cannot make: `hermes exec` refuses.
    if desired.backend() == Backend::Local && desired.config.terminal.local_sandbox == "bwrap" {
        use hermes_backends::local::bwrap;
        if let Err(why) = bwrap::probe(&bwrap::program()) {
            blocked.push(format!(
                "exec on the local backend: {}",
                bwrap::Refusal::Unavailable(why)
            ));
        }
    }
    // A failed operation of the last `hermes reconcile`, while the plan
    // still wants its target changed.
    for failed in crate::failures::read(home) {
        let still_wanted = plan
            .ops
            .iter()
            .any(|op| op.target.to_string() == failed.target);
        if still_wanted {
            errors.push(format!(
                "{}: failed {}: {}",
                failed.target,
                format_args!("{} ago", hermes_reconcilers::age(now - failed.at)),
                failed.error
            ));
        }
    }
    // Validity as `hermes config check` has it: a cloud backend without
    // its credentials cannot run a command.
    let mut config_error = pass.config_error.clone();
    if config_error.is_none()
        && let Ok(Some(text)) = crate::host::read_config_text(home)
    {
        let missing = hermes_model::cloud::check_credentials(&text, &crate::host::host_env(home)?);
        if !missing.is_empty() {
            let file = home.config().display().to_string();
            config_error = Some(
                missing
                    .iter()
                    .map(|issue| issue.render(&file))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
    }
    let profile_label = sanitize(profile);
    // What a sandbox made without a runtime of its own runs under.
    let default_runtime = match engine {
        Some(engine) if observed.is_some_and(|o| !o.containers.is_empty()) => engine
            .default_runtime()
            .await
            .unwrap_or_else(|_| "runc".to_string()),
        _ => "runc".to_string(),
    };
    let pool_member = desired.pool_member(0);
    let sandboxes: Vec<SandboxRow> = observed
        .iter()
        .flat_map(|o| o.containers.iter())
        .filter(|c| c.profile() == Some(profile_label.as_str()))
        .map(|c| {
            let task = c.task().unwrap_or("-");
            // A warm-pool member's spec is the pool's, claimed or not.
            let wanted = match c.session() {
                _ if c.label(hermes_model::sandbox::LABEL_POOL).is_some() => pool_member.clone(),
                Some(s) => desired.exec_sandbox(task, Some(s)),
                None => desired.sandbox_for_task(task),
            };
            SandboxRow {
                name: c.name.clone(),
                state: c.state.as_str().to_string(),
                runtime: c.runtime().unwrap_or_else(|| default_runtime.clone()),
                spec_matches: c.spec_hash() == Some(wanted.hash()),
                egress: c.label(LABEL_EGRESS).unwrap_or("-").to_string(),
            }
        })
        .collect();
    let listening: Vec<String> = match cluster_proxy {
        Some(c) => c.listening,
        None => crate::egress::state::read(&crate::egress::files::Paths::new(home))
            .ok()
            .flatten()
            .map(|s| s.tunnel.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
    };
    let proxy_enabled = desired.config.proxy.enabled;

    // The controller, if one runs.
    let lock_path = status::run_dir(home).join("controller.lock");
    let controller_pid = if lock_path.exists() {
        match ControllerLock::acquire(&lock_path) {
            Ok(_free) => None,
            Err(LockError::Held { pid, .. }) => Some(pid),
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    let saved = ControllerStatus::load(&status::path(home))?;
    let controller_clean = saved
        .as_ref()
        .is_none_or(|s| s.last_error.is_none() && s.config_invalid_since.is_none());

    let healthy = config_error.is_none()
        && errors.is_empty()
        && blocked.is_empty()
        && (!proxy_enabled || proxy.healthy)
        && (controller_pid.is_none() || controller_clean);

    Ok(StatusReport {
        healthy,
        config: ConfigReport {
            valid: config_error.is_none(),
            error: config_error,
        },
        backend: desired.backend(),
        profile: profile.to_string(),
        engine: engine.is_some(),
        sandboxes,
        proxy: ProxyReport {
            enabled: proxy_enabled,
            // What `egress setup` writes: its config under proxy/.
            set_up: !matches!(desired.egress, Egress::NotSetUp { .. })
                && crate::egress::files::Paths::new(home).config().is_file(),
            running: proxy.running,
            healthy: proxy.healthy,
            problem: proxy.problem,
            listening,
            transparent: proxy_enabled && desired.config.proxy.enforce_network,
            keys_loaded: keys
                .as_ref()
                .map(|k| k.values().filter(|s| s.loaded).count()),
            keys_total: keys.as_ref().map(|k| k.len()),
        },
        blocked,
        errors,
        container_disk: {
            let reason = crate::disk::unavailable();
            DiskReport {
                enforced: reason.is_none(),
                reason,
                text: crate::disk::status(),
            }
        },
        controller: ControllerReport {
            running: controller_pid.is_some(),
            pid: controller_pid,
            status: saved,
        },
        now,
    })
}

impl fmt::Display for StatusReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ago = |t: i64| format!("{} ago", hermes_reconcilers::age(self.now - t));
        match &self.config.error {
            None => writeln!(f, "Config:      valid")?,
            Some(e) => writeln!(
                f,
                "Config:      invalid: {}",
                e.lines().next().unwrap_or_default()
            )?,
        }
        writeln!(
            f,
            "Backend:     {} (profile {})",
            self.backend, self.profile
        )?;
        if self.backend == Backend::Docker {
            writeln!(f, "Disk limit:  {}", self.container_disk.text)?;
        }
        match (self.engine, self.sandboxes.is_empty()) {
            (false, _) => writeln!(f, "Sandboxes:   no Docker engine answers")?,
            (true, true) => writeln!(f, "Sandboxes:   none")?,
            (true, false) => {
                writeln!(f, "Sandboxes:")?;
                for s in &self.sandboxes {
                    writeln!(
                        f,
                        "  {}  {}  runtime {}  spec {}  egress {}",
                        s.name,
                        s.state,
                        s.runtime,
                        if s.spec_matches { "current" } else { "changed" },
                        s.egress
                    )?;
                }
            }
        }
        let proxy = &self.proxy;
        if proxy.enabled {
            let health = if proxy.healthy {
                "healthy".to_string()
            } else {
                format!(
                    "not healthy: {}",
                    proxy.problem.as_deref().unwrap_or("unknown")
                )
            };
            let listening = if proxy.listening.is_empty() {
                "nothing".to_string()
            } else {
                proxy.listening.join(", ")
            };
            let transparent = if proxy.transparent {
                "; transparent egress on"
            } else {
                ""
            };
            let keys = match (proxy.keys_loaded, proxy.keys_total) {
                (Some(0), Some(total)) => format!(
                    "; holds none of {total} providers' real keys (set one: `hermes config set OPENAI_API_KEY …`, then reconcile)"
                ),
                (Some(n), Some(total)) => format!("; {n} of {total} providers' real keys"),
                _ => String::new(),
            };
            writeln!(
                f,
                "Proxy:       {health}; listening on {listening}{transparent}{keys}"
            )?;
        } else {
            writeln!(
                f,
                "Proxy:       disabled{}",
                if proxy.running { " (but running)" } else { "" }
            )?;
        }
        if self.blocked.is_empty() {
            writeln!(f, "Blocked:     none")?;
        } else {
            writeln!(f, "Blocked:")?;
            for b in &self.blocked {
                writeln!(f, "  {b}")?;
            }
        }
        if !self.errors.is_empty() {
            writeln!(f, "Errors:")?;
            for e in &self.errors {
                writeln!(f, "  {e}")?;
            }
        }
        match &self.controller.pid {
            Some(pid) => writeln!(f, "Controller:  running (pid {pid})")?,
            None => writeln!(f, "Controller:  not running")?,
        }
        if let Some(s) = &self.controller.status {
            let running = self.controller.pid.is_some();
            if !running {
                // What a controller said before it stopped is history, not
                // the host now: said as such, without its engine line.
                writeln!(f, "  Its last report, from before it stopped:")?;
            }
            let last = s.last_pass_at.map_or("never".to_string(), |t| {
                format!("last {} ({} ms)", ago(t), s.last_pass_ms.unwrap_or(0))
            });
            writeln!(f, "  Passes:      {} ({last})", s.passes)?;
            match (s.config_invalid_since, &s.config_error) {
                (Some(t), Some(e)) => writeln!(
                    f,
                    "  Config:      invalid since {}: {}",
                    ago(t),
                    e.lines().next().unwrap_or_default()
                )?,
                _ => writeln!(f, "  Config:      valid")?,
            }
            match s.engine_unreachable_since {
                Some(t) if running => writeln!(f, "  Engine:      unreachable since {}", ago(t))?,
                None if running => writeln!(f, "  Engine:      answering")?,
                _ => {}
            }
            writeln!(
                f,
                "  Last error:  {}",
                s.last_error.as_deref().unwrap_or("none")
            )?;
        }
        Ok(())
    }
}
