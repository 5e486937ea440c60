//! The backend seam: what each backend does for a pass, a session's end
//! and `sandbox list`, chosen once from [`Desired`] ([`Seam::of`], the one
//! place a backend is picked for these).
//!
//! The host's own parts are not a backend's: the labelled Docker
//! containers and the egress proxy are observed for every backend (a
//! switch away from Docker leaves containers to be reported, never
//! forgotten) and carried out by [`crate::apply`]. A seam observes, and
//! applies the plan's operations of, its backend's own world: the SSH
//! host, the singularity instances, the cloud service's sandbox. The
//! planners stay pure (`hermes_reconcilers`); a seam only gathers what
//! they read and carries out what they planned.
//!
//! Adding a backend: a module beside `ssh.rs` with its observe, apply,
//! end-of-session planning input and list, a variant here, and its line
//! in [`Seam::of`]; the pure planner in `reconcilers/` and its `Action`
//! family in `model/src/action.rs`.

use hermes_backends::docker::Engine;
use hermes_model::action::{Action, SandboxAction};
use hermes_model::config::Backend;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use hermes_model::plan::Plan;
use hermes_reconcilers::HostPlan;

use crate::apply::Applied;
use crate::commands::sandbox::SandboxList;
use crate::home::Home;

/// A backend, as the controller drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seam {
    /// Commands run on the host itself: nothing of its own to observe or
    /// converge.
    Local,
    /// The labelled containers (the host's part, for every backend).
    Docker,
    /// The remote host of `terminal.ssh_*`.
    Ssh,
    /// Apptainer (or SingularityCE) instances on this host.
    Singularity,
    /// A cloud service's sandbox (modal, daytona, vercel_sandbox), through
    /// its driver ([`crate::cloud::Driver`]).
    Cloud(Backend),
}

/// What a session's end plans, and the engine its Docker removals need.
#[derive(Debug)]
pub struct Ending {
    pub plan: HostPlan,
    pub engine: Option<Engine>,
}

impl Seam {
    /// The seam of the configured backend: the one place it is chosen.
    pub fn of(desired: &Desired) -> Seam {
        match desired.backend() {
            Backend::Local => Seam::Local,
            Backend::Docker => Seam::Docker,
            Backend::Ssh => Seam::Ssh,
            Backend::Singularity => Seam::Singularity,
            cloud @ (Backend::Modal | Backend::Daytona | Backend::VercelSandbox) => {
                Seam::Cloud(cloud)
            }
        }
    }

    /// What a pass sees of the backend's own world, into `observed` (only
    /// looked at: a cloud service is asked with `find`, never a mutating
    /// call). Returns the error of a backend that cannot be asked at all
    /// (a cloud driver not built in), which the plan also shows as
    /// blocked.
    pub async fn observe(
        self,
        home: &Home,
        desired: &Desired,
        observed: &mut Observed,
    ) -> Option<String> {
        match self {
            Seam::Local | Seam::Docker => None,
            Seam::Ssh => {
                observed.ssh = crate::ssh::observe(home, desired).await;
                None
            }
            Seam::Singularity => {
                observed.singularity = crate::singularity::observe(desired).await;
                None
            }
            Seam::Cloud(_) => {
                let env = match crate::host::host_env(home) {
                    Ok(env) => env,
                    Err(e) => {
                        let reason = crate::chain::Chain(&e).to_string();
                        observed.cloud = Some(hermes_model::cloud::CloudObserved::Unavailable {
                            reason: reason.clone(),
                        });
                        return Some(reason);
                    }
                };
                let (cloud, error) = crate::cloud::observe(home, desired, &env).await;
                observed.cloud = cloud;
                error.map(|e| e.to_string())
            }
        }
    }

    /// Carries out the plan's operations of the backend's own family (the
    /// Docker sandboxes' and the proxy's are [`crate::apply::apply`]'s).
    pub async fn apply(
        self,
        home: &Home,
        desired: &Desired,
        plan: &HostPlan,
        verbose: bool,
    ) -> Applied {
        match self {
            Seam::Local | Seam::Docker => Applied::default(),
            Seam::Ssh => crate::ssh::apply(home, desired, plan, verbose).await,
            Seam::Singularity => crate::singularity::apply(plan, verbose).await,
            Seam::Cloud(_) => match crate::host::host_env(home) {
                Ok(env) => crate::cloud::apply(home, desired, &env, plan, verbose).await,
                Err(e) => {
                    tracing::warn!(error = %crate::chain::Chain(&e), "cannot read the environment for the cloud backend");
                    Applied::default()
                }
            },
        }
    }

    /// The plan of `hermes session end ID`, made by the backend's pure
    /// planner from what it observes now: the session's containers
    /// removed (Docker, and the hosts whose sessions run there: local,
    /// SSH), its instances ended (singularity), the shared sandbox
    /// suspended keeping its filesystem (a cloud).
    pub async fn end_session(
        self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<Ending> {
        let profile = &desired.profile;
        match self {
            Seam::Local | Seam::Docker | Seam::Ssh => {
                let engine = Engine::connect().await?.for_home(home.scope());
                let mut observed = crate::observe::observe(&engine, home).await?;
                // The plan says what runs in what it removes.
                let ending = hermes_reconcilers::reaping::end_session(profile, session, &observed);
                let ids: Vec<String> = ending
                    .iter()
                    .filter_map(|op| match &op.action {
                        Action::Sandbox(SandboxAction::Remove { id, .. }) => Some(id.clone()),
                        _ => None,
                    })
                    .collect();
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                engine.count_processes(&mut observed.containers, &ids).await;
                let ops = hermes_reconcilers::reaping::end_session(profile, session, &observed);
                Ok(Ending {
                    plan: Plan::new(ops),
                    engine: Some(engine),
                })
            }
            Seam::Singularity => {
                let known = crate::singularity::known_keys(home.root());
                let ops = hermes_reconcilers::singularity::end_session(profile, session, &known);
                Ok(Ending {
                    plan: Plan::new(ops),
                    engine: None,
                })
            }
            Seam::Cloud(backend) => {
                let Some(cloud) = &desired.cloud else {
                    anyhow::bail!("the {backend} backend has no cloud settings");
                };
                if let Err(missing) = &cloud.credentials {
                    anyhow::bail!(
                        "{missing}: the {backend} backend needs it, in the environment or in .env"
                    );
                }
                let mut observed = Observed::default();
                if let Some(e) = self.observe(home, desired, &mut observed).await {
                    anyhow::bail!("{e}");
                }
                let ops = hermes_reconcilers::cloud::end_session(desired, &observed, session);
                Ok(Ending {
                    plan: Plan::new(ops),
                    engine: None,
                })
            }
        }
    }

    /// The sandboxes of `hermes sandbox list`: every labelled container of
    /// this home (Docker, and the backends with no sandboxes of their own:
    /// local, SSH), the singularity instances, or the cloud backend's
    /// sandbox of the default task.
    pub async fn list(self, home: &Home, desired: &Desired) -> anyhow::Result<SandboxList> {
        use crate::commands::sandbox;
        match self {
            Seam::Local | Seam::Docker | Seam::Ssh => sandbox::containers(home, desired).await,
            Seam::Singularity => sandbox::instances(home, desired).await,
            Seam::Cloud(_) => sandbox::cloud(home, desired).await,
        }
    }

    /// Where `hermes exec` runs a command of `which`: the backend's
    /// [`Executor`](hermes_backends::exec::Executor), its sandbox created
    /// or started when needed (never recreated), and the values every
    /// command there gets ([`crate::exec_target`]).
    pub async fn exec_target(
        self,
        home: &Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<(crate::exec_target::ExecTarget, crate::exec_target::Values)> {
        crate::exec_target::ExecTarget::choose(self, home, desired, which).await
    }
}

/// Whether a pass of `desired` needs a Docker engine, and fails without
/// one: the Docker backend, or the proxy's proxy-only network
/// (`proxy.enforce_network`), which lives in Docker. Any other pass looks
/// at an engine only when one answers ([`crate::observe::optional_engine`]).
pub fn needs_docker(desired: &Desired) -> bool {
    let proxy = &desired.config.proxy;
    Seam::of(desired) == Seam::Docker || (proxy.enabled && proxy.enforce_network)
}
