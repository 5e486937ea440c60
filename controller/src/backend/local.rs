//! The local backend: commands run on this host itself, so there is
//! nothing of its own to observe or converge; its sessions' sandboxes, if
//! any, are this engine's containers. With `terminal.local_sandbox:
//! bwrap` each command runs under bubblewrap
//! ([`hermes_backends::local::bwrap`]): its task's `/tmp`, exec state and
//! the records of its background sandboxes live under
//! `$HERMES_HOME/run/local-sandbox/<task>/`, and with the
//! egress proxy on it gets the proxy's variables and tokens, reaching the
//! proxy through its Unix socket.

use anyhow::Context;
use async_trait::async_trait;
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest, TtyIo};
use hermes_backends::local::Local as LocalHost;
use hermes_backends::local::bwrap;
use hermes_model::desired::Desired;
use hermes_model::desired::Egress;
use hermes_reconcilers::Planner;

use crate::exec_target::{ExecError, ExecTarget, Target, Values, Which};
use crate::home::Home;
use crate::listing::SandboxList;
use crate::seam::{Backend, Ending};

/// The local backend.
pub struct Local;

#[async_trait]
impl Backend for Local {
    fn planner(&self) -> Planner {
        hermes_reconcilers::host_only
    }

    fn gives_terminals(&self) -> bool {
        true
    }

    async fn exec_target(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<(ExecTarget, Values)> {
        let host = host(home, desired, which)?;
        let values = match (&host.sandbox, &desired.egress) {
            (Some(_), Egress::On { wiring, .. }) => Values {
                base: Vec::new(),
                pinned: sandbox_egress_env(&wiring.tokens),
            },
            _ => Values::default(),
        };
        Ok((Box::new(host), values))
    }

    async fn find(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>> {
        Ok(Some(Box::new(host(home, desired, which)?)))
    }

    fn place(&self, _desired: &Desired, _which: &Which<'_>) -> String {
        "the local backend (this host)".to_string()
    }

    async fn list(&self, home: &Home, desired: &Desired) -> anyhow::Result<SandboxList> {
        super::docker::list_containers(home, desired).await
    }

    async fn end_session(
        &self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<Ending> {
        super::docker::end_session(home, desired, session).await
    }
}

/// This host, in the task's bubblewrap sandbox when the config says so.
fn host(home: &Home, desired: &Desired, which: &Which<'_>) -> anyhow::Result<LocalHost> {
    let t = &desired.config.terminal;
    if t.local_sandbox != "bwrap" {
        return Ok(LocalHost::default());
    }
    let dir = home
        .root()
        .join("run")
        .join("local-sandbox")
        .join(which.key(desired));
    let (tmp, state, launched) = (dir.join("tmp"), dir.join("state"), dir.join("launched"));
    for d in [&tmp, &state, &launched] {
        crate::fsio::ensure_dir(d, 0o700)
            .with_context(|| format!("cannot make the sandbox's directory {}", d.display()))?;
    }
    let user_home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let extra: Vec<std::path::PathBuf> = t.local_sandbox_hidden.iter().map(Into::into).collect();
    let proxy = match &desired.egress {
        Egress::On { wiring, .. } => Some(bwrap::ProxyWiring {
            socket: home.root().join("proxy").join("proxy.sock"),
            ca: wiring.ca_host_path.clone(),
        }),
        _ => None,
    };
    let sandbox = bwrap::Bwrap {
        program: bwrap::program(),
        init: std::env::current_exe()
            .context("cannot find hermes's own binary for the sandbox's init")?,
        tmp,
        state,
        launched,
        writable: t.local_sandbox_writable.iter().map(Into::into).collect(),
        hidden: bwrap::hidden_paths(user_home.as_deref(), home.root(), &extra),
        proxy,
    };
    Ok(LocalHost {
        default_cwd: None,
        sandbox: Some(std::sync::Arc::new(sandbox)),
    })
}

/// The egress variables of a bwrap sandbox: the proxy on its own loopback
/// (the init's bridge), the CA where it is bound, the tokens.
fn sandbox_egress_env(tokens: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = hermes_model::egress::proxy_env("127.0.0.1", bwrap::PROXY_PORT);
    env.extend(tokens.iter().cloned());
    for (k, v) in env.iter_mut() {
        if v == hermes_model::egress::CA_IN_SANDBOX {
            *v = bwrap::CA_PATH.to_string();
        }
        // The proxy is reached on loopback: only the sandbox's own
        // services are left out of it.
        if k.eq_ignore_ascii_case("no_proxy") {
            *v = "localhost,::1".to_string();
        }
    }
    env
}

#[async_trait]
impl Target for LocalHost {
    /// The host: under the home, by profile, task and session; in a
    /// sandbox, its state directory.
    fn cwd_state(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        if self.sandbox.is_some() {
            return format!("{}/cwd", bwrap::STATE_DIR);
        }
        home.root()
            .join("run")
            .join("cwd")
            .join(which.key(desired))
            .display()
            .to_string()
    }

    fn jobs_dir(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        if self.sandbox.is_some() {
            return format!("{}/jobs", bwrap::STATE_DIR);
        }
        home.root()
            .join("run")
            .join("background")
            .join(which.key(desired))
            .display()
            .to_string()
    }

    fn describe(&self, _desired: &Desired) -> String {
        if self.sandbox.is_some() {
            "this host, in a bubblewrap sandbox".to_string()
        } else {
            "this host".to_string()
        }
    }

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, ExecError> {
        use hermes_backends::exec::Executor;
        Executor::exec(self, req, io)
            .await
            .map_err(ExecError::backend)
    }

    async fn exec_tty(
        &self,
        _desired: &Desired,
        req: &ExecRequest,
        io: TtyIo<'_>,
    ) -> Result<ExecOutcome, ExecError> {
        LocalHost::exec_tty(self, req, io)
            .await
            .map_err(ExecError::backend)
    }
}
