//! The interface every backend implements: what a pass observes of the
//! backend's own world and how it carries out the operations its pure
//! planner made, where a command runs, what `sandbox list` shows and what a
//! session's end plans. [`crate::backend::of`] is the one place a backend
//! is picked; nothing else matches on the configured backend.
//!
//! The host's own parts are no backend's: the labelled Docker containers
//! and the egress proxy are observed and carried out for every backend
//! ([`crate::observe`], [`crate::apply`]), so a switch away from Docker
//! leaves containers to be reported, never forgotten.

use async_trait::async_trait;
use hermes_backends::docker::Engine;
use hermes_model::action::Action;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use hermes_model::plan::Op;
use hermes_reconcilers::{HostPlan, Planner};
use tokio::sync::mpsc;

use crate::apply::Applied;
use crate::exec_target::{ExecTarget, Values, Which};
use crate::home::Home;
use crate::listing::SandboxList;

/// A backend, as the controller drives it.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Its pure planner: its own part of each stage's plan
    /// ([`hermes_reconcilers::plan_stages`]).
    fn planner(&self) -> Planner;

    /// Whether a pass fails without a Docker engine (the Docker backend):
    /// any other looks at one only when one answers.
    fn needs_docker(&self) -> bool {
        false
    }

    /// Whether `hermes exec -t` can give a command a terminal of its own.
    fn gives_terminals(&self) -> bool {
        false
    }

    /// What a pass sees of the backend's own world, into `observed` (only
    /// looked at: never a mutating call). Returns the error of a backend
    /// that cannot be asked at all, which the plan also shows as blocked.
    async fn observe(
        &self,
        _home: &Home,
        _desired: &Desired,
        _observed: &mut Observed,
    ) -> Option<String> {
        None
    }

    /// Carries out the plan's operations of the backend's own family (the
    /// Docker sandboxes' and the proxy's are [`crate::apply::apply`]'s).
    async fn apply(
        &self,
        _home: &Home,
        _desired: &Desired,
        _plan: &HostPlan,
        _verbose: bool,
    ) -> Applied {
        Applied::default()
    }

    /// Where `hermes exec` runs a command of `which`, its sandbox created
    /// or started when needed (never recreated), and the values every
    /// command there gets before its own `--env`.
    async fn exec_target(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<(ExecTarget, Values)>;

    /// The target of `which` when its sandbox is there and running, for a
    /// look inside (`hermes process`): `None` when it is not. Nothing is
    /// created, started or resumed.
    async fn find(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>>;

    /// Where the processes of `which` run, for a message when there is no
    /// sandbox to look in.
    fn place(&self, desired: &Desired, which: &Which<'_>) -> String {
        format!("the {} sandbox of task {}", desired.backend(), which.task)
    }

    /// The operations of `hermes down` on the backend's own world (a
    /// cloud sandbox suspended, an instance stopped, a Pod deleted), from
    /// what a pass observed; they go with the down plan's first stage.
    async fn down(
        &self,
        _home: &Home,
        _desired: &Desired,
        _observed: &Observed,
    ) -> Vec<Op<Action>> {
        Vec::new()
    }

    /// Which world of the backend's own a controller follows between
    /// passes (`None`: none; Docker's events are the host's, followed for
    /// every backend). A controller follows anew when the key changes.
    fn follow_key(&self, _desired: &Desired) -> Option<String> {
        None
    }

    /// Follows that world, sending on `wake` at each change, until it
    /// cannot go on: why it stopped.
    async fn follow(&self, _home: &Home, _desired: &Desired, _wake: &mpsc::Sender<()>) -> String {
        "nothing to follow".to_string()
    }

    /// The sandboxes of `hermes sandbox list`.
    async fn list(&self, home: &Home, desired: &Desired) -> anyhow::Result<SandboxList>;

    /// The plan of `hermes session end ID`, made by the backend's pure
    /// planner from what it observes now.
    async fn end_session(
        &self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<Ending>;
}

/// What a session's end plans, and the engine its Docker removals need.
#[derive(Debug)]
pub struct Ending {
    pub plan: HostPlan,
    pub engine: Option<Engine>,
}
