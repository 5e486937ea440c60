//! `hermes status`: one screen for the host — whether config.yaml can be
//! used, the backend, each sandbox of the profile (state, spec match,
//! egress), the egress proxy (health, addresses, counters), everything the
//! plan blocks with its reason, and what the running controller reports.
//!
//! Whether a controller runs is the lock's answer (a crashed controller
//! leaves its last status file but not its lock); its figures come from the
//! status file it rewrites every pass. Exit 0 when the host is healthy:
//! config usable, nothing blocked, the proxy healthy when enabled, and the
//! controller's last pass clean when one runs.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::desired::Egress;
use hermes_model::sandbox::{LABEL_EGRESS, sanitize};
use serde_json::json;

use crate::cli::Output;
use crate::commands::{load_for_pass, observe_for};
use crate::daemon::lock::{ControllerLock, LockError};
use crate::daemon::status::{self, ControllerStatus};
use crate::home::Home;

/// How long status waits for an engine that may not be there.
const ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn run(home: &Home, profile: &str, output: Output) -> anyhow::Result<ExitCode> {
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let ago = |t: i64| format!("{} ago", hermes_reconcilers::age(now - t));

    // The host as a pass would see it.
    let pass = load_for_pass(home, profile)?;
    let desired = &pass.desired;
    let engine = match tokio::time::timeout(ENGINE_WAIT, Engine::connect()).await {
        Ok(Ok(engine)) => Some(engine.for_home(home.scope())),
        _ => None,
    };
    let observed = match &engine {
        Some(engine) => Some(observe_for(engine, home, desired).await?),
        None => None,
    };
    let proxy = crate::egress::pass::observe(home).await;
    let mut plan_input = observed
        .clone()
        .unwrap_or_else(|| hermes_model::observed::Observed {
            proxy: proxy.clone(),
            ..Default::default()
        });
    // The singularity instances and the cloud sandbox (only looked up),
    // so that what blocks them is shown.
    plan_input.singularity = crate::singularity::observe(desired).await;
    if desired.cloud.is_some() {
        let env = super::host_env(home)?;
        plan_input.cloud = crate::cloud::observe(home, desired, &env).await.0;
    }
    let plan = hermes_reconcilers::plan_all(desired, &plan_input, SystemTime::now());
    let blocked = hermes_reconcilers::blocked(&plan);
    let profile_label = sanitize(profile);
    let sandboxes: Vec<serde_json::Value> = observed
        .iter()
        .flat_map(|o| o.containers.iter())
        .filter(|c| c.profile() == Some(profile_label.as_str()))
        .map(|c| {
            let task = c.task().unwrap_or("-");
            let wanted = match c.session() {
                Some(s) => desired.exec_sandbox(task, Some(s)),
                None => desired.sandbox_for_task(task),
            };
            json!({
                "name": c.name,
                "state": c.state.as_str(),
                "spec_matches": c.spec_hash() == Some(wanted.hash()),
                "egress": c.label(LABEL_EGRESS).unwrap_or("-"),
            })
        })
        .collect();
    let listening: Vec<String> =
        crate::egress::state::read(&crate::egress::files::Paths::new(home))
            .ok()
            .flatten()
            .map(|s| s.tunnel.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
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

    let healthy = pass.config_error.is_none()
        && blocked.is_empty()
        && (!proxy_enabled || proxy.healthy)
        && (controller_pid.is_none() || controller_clean);

    match output {
        Output::Json => {
            let report = json!({
                "healthy": healthy,
                "config": {
                    "valid": pass.config_error.is_none(),
                    "error": pass.config_error,
                },
                "backend": desired.backend().as_str(),
                "profile": profile,
                "engine": engine.is_some(),
                "sandboxes": sandboxes,
                "proxy": {
                    "enabled": proxy_enabled,
                    "set_up": !matches!(desired.egress, Egress::NotSetUp { .. }),
                    "running": proxy.running,
                    "healthy": proxy.healthy,
                    "problem": proxy.problem,
                    "listening": listening,
                },
                "blocked": blocked,
                "container_disk": crate::disk::status(),
                "controller": {
                    "running": controller_pid.is_some(),
                    "pid": controller_pid,
                    "status": saved,
                },
            });
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Output::Text => {
            match &pass.config_error {
                None => println!("Config:      valid"),
                Some(e) => println!(
                    "Config:      invalid: {}",
                    e.lines().next().unwrap_or_default()
                ),
            }
            println!("Backend:     {} (profile {profile})", desired.backend());
            if desired.backend() == hermes_model::config::Backend::Docker {
                println!("Disk limit:  {}", crate::disk::status());
            }
            match (&engine, sandboxes.is_empty()) {
                (None, _) => println!("Sandboxes:   no Docker engine answers"),
                (Some(_), true) => println!("Sandboxes:   none"),
                (Some(_), false) => {
                    println!("Sandboxes:");
                    for s in &sandboxes {
                        println!(
                            "  {}  {}  spec {}  egress {}",
                            s["name"].as_str().unwrap_or_default(),
                            s["state"].as_str().unwrap_or_default(),
                            if s["spec_matches"] == true {
                                "current"
                            } else {
                                "changed"
                            },
                            s["egress"].as_str().unwrap_or_default()
                        );
                    }
                }
            }
            if proxy_enabled {
                let health = if proxy.healthy {
                    "healthy".to_string()
                } else {
                    format!(
                        "not healthy: {}",
                        proxy.problem.as_deref().unwrap_or("unknown")
                    )
                };
                println!("Proxy:       {health}; listening on {}", {
                    if listening.is_empty() {
                        "nothing".to_string()
                    } else {
                        listening.join(", ")
                    }
                });
            } else {
                println!(
                    "Proxy:       disabled{}",
                    if proxy.running { " (but running)" } else { "" }
                );
            }
            if blocked.is_empty() {
                println!("Blocked:     none");
            } else {
                println!("Blocked:");
                for b in &blocked {
                    println!("  {b}");
                }
            }
            match &controller_pid {
                Some(pid) => println!("Controller:  running (pid {pid})"),
                None => println!("Controller:  not running"),
            }
            if let Some(s) = &saved {
                let last = s.last_pass_at.map_or("never".to_string(), |t| {
                    format!("last {} ({} ms)", ago(t), s.last_pass_ms.unwrap_or(0))
                });
                println!("  Passes:      {} ({last})", s.passes);
                match (s.config_invalid_since, &s.config_error) {
                    (Some(t), Some(e)) => println!(
                        "  Config:      invalid since {}: {}",
                        ago(t),
                        e.lines().next().unwrap_or_default()
                    ),
                    _ => println!("  Config:      valid"),
                }
                match s.engine_unreachable_since {
                    Some(t) => println!("  Engine:      unreachable since {}", ago(t)),
                    None => println!("  Engine:      answering"),
                }
                println!(
                    "  Last error:  {}",
                    s.last_error.as_deref().unwrap_or("none")
                );
            }
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
