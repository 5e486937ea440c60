//! Carrying out the proxy planner's operations. Each is the `hermes egress`
//! command of the same name, run as a child of this binary, so a pass and
//! a person at the shell set up, start and stop the daemon the same way
//! (pid file, readiness wait, logs). The child inherits this process's
//! environment, where the real keys come from.
//!
//! The removal of the proxy-only network (`proxy.enforce_network` turned
//! off) is done here, in-process: its firewall chain, then the network.

use std::process::Stdio;

use hermes_backends::docker::Engine;
use hermes_model::action::ProxyAction;

use crate::home::Home;

/// How long one `hermes egress` step may take (start waits up to 5 s for
/// the daemon to listen; stop up to 5 s before SIGKILL).
const STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a proxy operation failed: which `hermes egress` step, and how.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot find the hermes binary: {0}")]
    NoBinary(std::io::Error),
    #[error("`hermes egress {step}` took longer than {STEP_TIMEOUT:?}")]
    Timeout { step: &'static str },
    #[error("cannot run `hermes egress {step}`: {error}")]
    Spawn {
        step: &'static str,
        error: std::io::Error,
    },
    /// The step exited non-zero; `last` is the last line it wrote to
    /// standard error.
    #[error("`hermes egress {step}` failed: {last}")]
    Failed { step: &'static str, last: String },
    #[error("no Docker engine answers")]
    NoEngine,
    /// Containers were attached to the network when it was to go.
    #[error(
        "the network {network} has {containers} container(s) attached; it goes once they are off it"
    )]
    InUse { network: String, containers: usize },
    /// The running proxy did not confirm a reload.
    #[error("reload: {0:#}")]
    Reload(anyhow::Error),
    /// The firewall chain or the network could not be removed.
    #[error("{0:#}")]
    Network(anyhow::Error),
}

/// Runs the `hermes egress` steps of a proxy operation (the network's
/// removal in this process, with `engine`).
pub async fn apply(
    home: &Home,
    engine: Option<&Engine>,
    action: ProxyAction,
) -> Result<(), ProxyError> {
    let steps: &[&'static str] = match action {
        ProxyAction::Setup => &["setup"],
        ProxyAction::Start => &["start"],
        ProxyAction::Restart => &["stop", "start"],
        ProxyAction::Stop => &["stop"],
        ProxyAction::RemoveNetwork => {
            return remove_network(home, engine.ok_or(ProxyError::NoEngine)?).await;
        }
        ProxyAction::Reload => return reload(home).await,
    };
    let exe = std::env::current_exe().map_err(ProxyError::NoBinary)?;
    for &step in steps {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--home")
            .arg(home.root())
            .args(["egress", step])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
            .await
            .map_err(|_| ProxyError::Timeout { step })?
            .map_err(|error| ProxyError::Spawn { step, error })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            return Err(ProxyError::Failed {
                step,
                last: last.to_string(),
            });
        }
    }
    Ok(())
}

/// Removes this home's proxy-only network's firewall chain, then the
/// network; refused while containers are attached (removing the chain
/// would open the host to them).
async fn remove_network(home: &Home, engine: &Engine) -> Result<(), ProxyError> {
    let network = crate::egress::network::ProxyNetwork::for_home(home);
    let found = engine
        .inspect_internal_network(&network.name, &network.bridge)
        .await
        .map_err(|e| ProxyError::Network(e.into()))?;
    if let Some(net) = found.as_ref().filter(|net| !net.attached.is_empty()) {
        return Err(ProxyError::InUse {
            network: network.name,
            containers: net.attached.len(),
        });
    }
    let chain = network.clone();
    tokio::task::spawn_blocking(move || chain.remove_firewall())
        .await
        .map_err(|e| ProxyError::Network(e.into()))?
        .map_err(ProxyError::Network)?;
    if found.is_some() {
        engine
            .remove_network(&network.name)
            .await
            .map_err(|e| ProxyError::Network(e.into()))?;
    }
    Ok(())
}

/// Has the running proxy load its tokens and real keys again (SIGHUP),
/// and waits until it confirms.
async fn reload(home: &Home) -> Result<(), ProxyError> {
    let paths = crate::egress::files::Paths::new(home);
    let reloaded = tokio::task::spawn_blocking(move || {
        let pid = crate::egress::daemon::running_pid(&paths)?
            .ok_or_else(|| anyhow::anyhow!("the proxy is not running"))?;
        crate::egress::daemon::reload(&paths, pid)
    })
    .await
    .map_err(|e| ProxyError::Reload(anyhow::Error::from(e)))?;
    reloaded.map_err(ProxyError::Reload)
}
