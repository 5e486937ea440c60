//! `hermes status`: what the running controller reports. Whether one runs
//! is the lock's answer (a crashed controller leaves its last status file
//! but not its lock); the rest is the status file it rewrites every pass.

use std::process::ExitCode;
use std::time::SystemTime;

use crate::cli::Output;
use crate::daemon::lock::{ControllerLock, LockError};
use crate::daemon::status::{self, ControllerStatus};
use crate::home::Home;

pub fn run(home: &Home, output: Output) -> anyhow::Result<ExitCode> {
    let lock_path = status::run_dir(home).join("controller.lock");
    let running = if lock_path.exists() {
        match ControllerLock::acquire(&lock_path) {
            Ok(_free) => None,
            Err(LockError::Held { pid, .. }) => Some(pid),
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    let saved = ControllerStatus::load(&status::path(home))?;
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let ago = |t: i64| format!("{} ago", hermes_reconcilers::age(now - t));
    let healthy = running.is_some()
        && saved
            .as_ref()
            .is_some_and(|s| s.last_error.is_none() && s.config_invalid_since.is_none());
    match output {
        Output::Json => {
            let json = serde_json::json!({
                "running": running.is_some(),
                "pid": running,
                "status": saved,
            });
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        Output::Text => {
            match &running {
                Some(pid) => println!("Controller:  running (pid {pid})"),
                None => println!("Controller:  not running"),
            }
            if let Some(s) = &saved {
                let last = s.last_pass_at.map_or("never".to_string(), |t| {
                    format!("last {} ({} ms)", ago(t), s.last_pass_ms.unwrap_or(0))
                });
                println!("Passes:      {} ({last})", s.passes);
                match (s.config_invalid_since, &s.config_error) {
                    (Some(t), Some(e)) => println!(
                        "Config:      invalid since {}: {}",
                        ago(t),
                        e.lines().next().unwrap_or_default()
                    ),
                    _ => println!("Config:      valid"),
                }
                match s.engine_unreachable_since {
                    Some(t) => println!("Engine:      unreachable since {}", ago(t)),
                    None => println!("Engine:      answering"),
                }
                if s.blocked.is_empty() {
                    println!("Blocked:     none");
                } else {
                    println!("Blocked:");
                    for b in &s.blocked {
                        println!("  {b}");
                    }
                }
                println!("Last error:  {}", s.last_error.as_deref().unwrap_or("none"));
            }
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
