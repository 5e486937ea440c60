//! The local backend: commands run on this host itself, so there is
//! nothing of its own to observe or converge; its sessions' sandboxes, if
//! any, are this engine's containers.

use async_trait::async_trait;
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest, TtyIo};
use hermes_backends::local::Local as LocalHost;
use hermes_model::desired::Desired;
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
        _home: &Home,
        _desired: &Desired,
        _which: &Which<'_>,
    ) -> anyhow::Result<(ExecTarget, Values)> {
        Ok((Box::new(LocalHost { default_cwd: None }), Values::default()))
    }

    async fn find(
        &self,
        _home: &Home,
        _desired: &Desired,
        _which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>> {
        Ok(Some(Box::new(LocalHost { default_cwd: None })))
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

#[async_trait]
impl Target for LocalHost {
    /// The host: under the home, by profile, task and session.
    fn cwd_state(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        home.root()
            .join("run")
            .join("cwd")
            .join(which.key(desired))
            .display()
            .to_string()
    }

    fn jobs_dir(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        home.root()
            .join("run")
            .join("background")
            .join(which.key(desired))
            .display()
            .to_string()
    }

    fn describe(&self, _desired: &Desired) -> String {
        "this host".to_string()
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
