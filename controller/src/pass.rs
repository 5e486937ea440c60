//! One pass of the loop, the same for `hermes reconcile`, `hermes
//! reconcile --dry-run`, `hermes controller` and `hermes status`: load
//! config.yaml (a pass's rules, or a dry run's), connect to a Docker
//! engine only when the pass needs one ([`crate::backend::needs_docker`];
//! any other pass looks at one only when it answers), observe (the
//! containers, the egress proxy, and the backend's own world: the SSH
//! host, the singularity instances, the cloud sandbox), plan in stages
//! ([`hermes_reconcilers::plan_stages_with`]) and, unless the pass only looks,
//! apply.
//!
//! Applying carries out the stages in order. Before each stage after the
//! first, the pass reads the proxy's files again and observes again; when
//! the host then plans other work than the stage predicted (the same
//! operations on the same targets), it stops there, says so, and leaves
//! the rest to the next pass: nothing is ever carried out that the dry run
//! did not show. A stage with a failed operation, or one held back (a
//! controller's back-off), ends the pass's applying too.

use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::action::Action;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Plan};
use hermes_reconcilers::{HostPlan, StagedPlan};

use crate::activity::Activity;
use crate::apply::{Applied, ApplyOptions};
use crate::home::Home;
use crate::seam::Backend;

/// Which rules load config.yaml.
#[derive(Debug, Clone, Copy)]
pub enum Load<'a> {
    /// A pass's: a config that cannot be used is reported, and the last
    /// good one stands in, removing nothing
    /// ([`crate::load::load_for_pass`]).
    Pass,
    /// A dry run's: a config that cannot be used is the error; `file`
    /// plans a candidate instead of config.yaml
    /// ([`crate::load::load_for_dry_run`]).
    DryRun { file: Option<&'a std::path::Path> },
}

/// What a pass is asked to do.
pub struct Request<'a> {
    pub load: Load<'a>,
    /// `reconcile --prune`.
    pub prune: bool,
    /// Carry the plan out, so; `None` plans only.
    pub apply: Option<ApplyOptions<'a>>,
    /// Operations not to carry out this time (a controller's back-off).
    pub hold: &'a dyn Fn(&Op<Action>) -> bool,
    /// Called once the plan is made, before anything is carried out (the
    /// command prints it there, and may ask): whether to carry it out.
    pub planned: &'a dyn Fn(&Pass) -> bool,
}

/// Where a pass gets its Docker engine.
pub trait Engines {
    /// The engine of a pass; `needed` when it cannot go on without one
    /// ([`crate::backend::needs_docker`]). `Err` ends the pass with why.
    async fn connect(&mut self, home: &Home, needed: bool) -> Result<Option<Engine>, String>;

    /// What observing through the engine came to: it answered (`Ok`), or
    /// failed with why; a pass that needed it ends then, any other goes on
    /// without it.
    fn observed(&mut self, _outcome: Result<(), &str>, _needed: bool) {}
}

/// The engine of `reconcile` and `status`: connected when the pass needs
/// one, else looked at only when it answers
/// ([`crate::observe::optional_engine`]).
#[derive(Debug, Default)]
pub struct Connect {
    /// Go on without an engine the pass needs, keeping why in `error`
    /// (`status` reports it).
    pub tolerate: bool,
    pub error: Option<String>,
}

/// How long a pass that goes on without an engine it needs waits for one.
const TOLERANT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Engines for Connect {
    async fn connect(&mut self, home: &Home, needed: bool) -> Result<Option<Engine>, String> {
        if !needed {
            return Ok(crate::observe::optional_engine(home).await);
        }
        if !self.tolerate {
            return match Engine::connect().await {
                Ok(engine) => Ok(Some(engine.for_home(home.scope()))),
                Err(e) => Err(crate::chain::Chain(&anyhow::Error::from(e)).to_string()),
            };
        }
        match tokio::time::timeout(TOLERANT_WAIT, Engine::connect()).await {
            Ok(Ok(engine)) => Ok(Some(engine.for_home(home.scope()))),
            Ok(Err(e)) => {
                self.error = Some(format!("the Docker engine does not answer: {e}"));
                Ok(None)
            }
            Err(_) => {
                self.error = Some(format!(
                    "the Docker engine does not answer (waited {} s)",
                    TOLERANT_WAIT.as_secs()
                ));
                Ok(None)
            }
        }
    }

    fn observed(&mut self, outcome: Result<(), &str>, needed: bool) {
        if let (Err(e), true, true) = (outcome, needed, self.tolerate) {
            self.error = Some(format!("the Docker engine does not answer: {e}"));
        }
    }
}

/// What a pass came to.
#[derive(Debug)]
pub struct Pass {
    pub desired: Desired,
    /// What was wrong with config.yaml (a pass's rules only).
    pub config_error: Option<String>,
    pub engine: Option<Engine>,
    /// What the pass saw first.
    pub observed: Observed,
    /// Why the pass ended before it planned (an engine it needs did not
    /// answer); the plan is then empty.
    pub ended: Option<String>,
    /// The errors of observing besides (a backend that cannot be asked).
    pub errors: Vec<String>,
    /// The plan, in stages, as the dry run prints it.
    pub plan: StagedPlan,
    /// Each stage carried out, as planned when it was (the operations
    /// held back left out).
    pub carried: Vec<HostPlan>,
    pub applied: Applied,
    /// Why a later stage was not carried out, when the host, observed
    /// again, planned other work than the stage predicted.
    pub halted: Option<String>,
    /// The plan was not carried out: the person asked said no.
    pub declined: bool,
}

impl Pass {
    /// The plan of the host as it stands after the pass's applying: the
    /// last stage carried out, else the first planned.
    pub fn last(&self) -> &HostPlan {
        self.carried.last().unwrap_or(&self.plan.first)
    }
}

/// One pass: load, observe, plan in stages and, when asked, apply.
/// Errors only when config.yaml (or the profile, or the environment)
/// cannot be loaded under `request.load`'s rules, or the activity records
/// cannot be read.
pub async fn run(
    home: &Home,
    profile: &str,
    request: Request<'_>,
    engines: &mut impl Engines,
) -> anyhow::Result<Pass> {
    let (mut desired, config_error) = match request.load {
        Load::Pass => {
            let pass = crate::load::load_for_pass(home, profile)?;
            (pass.desired, pass.config_error)
        }
        Load::DryRun { file } => (crate::load::load_for_dry_run(home, profile, file)?, None),
    };
    if request.prune {
        desired.config.reconcile.prune = true;
    }
    let mut pass = Pass {
        desired,
        config_error,
        engine: None,
        observed: Observed::default(),
        ended: None,
        errors: Vec::new(),
        plan: StagedPlan::single(Plan::new(Vec::new())),
        carried: Vec::new(),
        applied: Applied::default(),
        halted: None,
        declined: false,
    };
    let needed = crate::backend::needs_docker(&pass.desired);
    pass.engine = match engines.connect(home, needed).await {
        Ok(engine) => engine,
        Err(e) => {
            pass.ended = Some(e);
            return Ok(pass);
        }
    };
    let (observed, error) = match observe(pass.engine.as_ref(), home, &pass.desired).await {
        Ok(seen) => {
            if pass.engine.is_some() {
                engines.observed(Ok(()), needed);
            }
            seen
        }
        Err(ObserveError::Activity(e)) => return Err(e),
        Err(ObserveError::Engine(e)) => {
            let why = crate::chain::Chain(&e).to_string();
            engines.observed(Err(&why), needed);
            if needed {
                pass.engine = None;
                pass.ended = Some(why);
                return Ok(pass);
            }
            tracing::debug!(error = %why, "the engine went away; no containers to look at");
            pass.engine = None;
            match observe(None, home, &pass.desired).await {
                Ok(seen) => seen,
                Err(ObserveError::Activity(e) | ObserveError::Engine(e)) => return Err(e),
            }
        }
    };
    pass.errors.extend(error);
    pass.plan = hermes_reconcilers::plan_stages_with(
        &pass.desired,
        &observed,
        SystemTime::now(),
        crate::backend::of(&pass.desired).planner(),
    );
    pass.observed = observed;
    let go_on = (request.planned)(&pass);
    if let Some(options) = request.apply.filter(|_| go_on) {
        carry_out(home, &mut pass, options, request.hold).await;
    }
    pass.declined = !go_on;
    Ok(pass)
}

/// Why a pass could not observe.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The Docker engine failed.
    #[error("{0:#}")]
    Engine(anyhow::Error),
    /// The activity records could not be read.
    #[error("{0:#}")]
    Activity(anyhow::Error),
}

/// What a pass of `desired` sees: the containers when there is an engine
/// (only the profile's inspected), the proxy in any case, and the backend's
/// own world (the SSH host, singularity instances, the cloud sandbox, only
/// looked up); with the error of a backend that cannot be asked.
pub async fn observe(
    engine: Option<&Engine>,
    home: &Home,
    desired: &Desired,
) -> Result<(Observed, Option<String>), ObserveError> {
    let mut observed = match engine {
        Some(engine) => crate::observe::observe_for(engine, home, desired)
            .await
            .map_err(|e| {
                if e.downcast_ref::<hermes_backends::docker::DockerError>()
                    .is_some()
                {
                    ObserveError::Engine(e)
                } else {
                    ObserveError::Activity(e)
                }
            })?,
        None => Observed {
            proxy: crate::egress::pass::observe(home).await,
            ..Observed::default()
        },
    };
    let error = crate::backend::of(desired)
        .observe(home, desired, &mut observed)
        .await;
    Ok((observed, error))
}

/// Carries out one plan: the proxy's and the Docker sandboxes' operations
/// ([`crate::apply::apply`]), then the backend's own ([`Backend::apply`]).
pub async fn apply_plan(
    backend: &dyn Backend,
    engine: Option<&Engine>,
    home: &Home,
    desired: &Desired,
    plan: &HostPlan,
    options: ApplyOptions<'_>,
) -> Applied {
    let mut applied = crate::apply::apply(engine, plan, &Activity::new(home), options).await;
    applied.absorb(backend.apply(home, desired, plan, options.verbose).await);
    applied
}

/// Carries out the pass's stages in order (see the module's doc).
async fn carry_out(
    home: &Home,
    pass: &mut Pass,
    options: ApplyOptions<'_>,
    hold: &dyn Fn(&Op<Action>) -> bool,
) {
    let stages = pass.plan.later.len() + 1;
    let mut plan = pass.plan.first.clone();
    for stage in 1..=stages {
        if stage > 1 {
            let predicted = &pass.plan.later[stage - 2].plan;
            crate::load::refresh_egress(home, &mut pass.desired);
            let observed = match observe(pass.engine.as_ref(), home, &pass.desired).await {
                Ok((observed, _)) => observed,
                Err(e) => {
                    pass.halted = Some(format!(
                        "Stage {stage} of {stages} not carried out: cannot observe the host again: {e}; the next pass plans again"
                    ));
                    break;
                }
            };
            plan = hermes_reconcilers::plan_all_with(
                &pass.desired,
                &observed,
                SystemTime::now(),
                crate::backend::of(&pass.desired).planner(),
            );
            if plan.work() != predicted.work() {
                pass.halted = Some(format!(
                    "Stage {stage} of {stages} not carried out: observed again, the host plans {} where stage {stage} said {}; the next pass plans again",
                    work_text(&plan),
                    work_text(predicted)
                ));
                break;
            }
        }
        let (held, ready): (Vec<_>, Vec<_>) = plan.ops.iter().cloned().partition(|op| hold(op));
        let ready = Plan::new(ready);
        if options.verbose && stages > 1 {
            println!("Stage {stage} of {stages}:");
        }
        let backend = crate::backend::of(&pass.desired);
        let applied = apply_plan(
            backend,
            pass.engine.as_ref(),
            home,
            &pass.desired,
            &ready,
            options,
        )
        .await;
        let stop = applied.failed > 0 || applied.skipped > 0 || !held.is_empty();
        pass.applied.absorb(applied);
        pass.carried.push(ready);
        if stop {
            // Retried by the next pass, not in a loop here.
            break;
        }
    }
    if let Some(halted) = &pass.halted {
        tracing::warn!(reason = %halted, "a stage of the plan was not carried out");
        if options.verbose {
            println!("{halted}");
        }
    }
}

/// A plan's work in words: `create sandbox default/default, start proxy`,
/// or `nothing`.
fn work_text(plan: &HostPlan) -> String {
    let work = plan.work();
    if work.is_empty() {
        return "nothing".to_string();
    }
    work.iter()
        .map(|(_, target, verb)| format!("{verb} {target}"))
        .collect::<Vec<_>>()
        .join(", ")
}
