//! The singularity backend in the binary: observing the instances for a
//! pass, applying the plan's instance operations (a session's end among
//! them: planned by `reconcilers::singularity::end_session` from
//! [`known_keys`]), `hermes exec` in an instance (made so first through
//! the planner), and the instances of `hermes sandbox list`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hermes_backends::singularity::{Instance, Runtime};
use hermes_model::action::{Action, Families, InstanceAction};
use hermes_model::config::Backend;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;
use hermes_model::plan::{Describe, Kind};
use hermes_model::sandbox::{SandboxKey, sanitize};
use hermes_model::singularity::{HASH_FILE, InstanceSpec, SingularityObserved};

use crate::apply::{Applied, ApplyError};

/// What a pass sees: the instances, when singularity is the backend.
pub async fn observe(desired: &Desired) -> Option<SingularityObserved> {
    if desired.backend() != Backend::Singularity {
        return None;
    }
    Some(hermes_backends::singularity::observe(&desired.instances).await)
}

/// Carries out the plan's instance operations.
pub async fn apply(plan: &hermes_reconcilers::HostPlan, verbose: bool) -> Applied {
    let mut applied = Applied::default();
    let ops = Families::of(&plan.ops).instance;
    for (op, action) in ops {
        let started = Instant::now();
        let result = match Runtime::from_env() {
            Ok(runtime) => carry_out(&runtime, action).await,
            Err(e) => Err(e.into()),
        };
        applied.record(op, started, result.map(|()| true), verbose);
    }
    applied
}

/// Carries out one instance operation.
async fn carry_out(runtime: &Runtime, action: &InstanceAction) -> Result<(), ApplyError> {
    match action {
        InstanceAction::Start(spec) => Ok(runtime.start(spec).await?),
        InstanceAction::Restart(spec) => Ok(runtime.restart(spec).await?),
        InstanceAction::Stop { name } => Ok(runtime.stop(name).await?),
        InstanceAction::End { name, dir } => {
            runtime.stop(name).await?;
            match std::fs::remove_dir_all(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ApplyError::Remove {
                    path: dir.clone(),
                    source: e,
                }),
                _ => Ok(()),
            }
        }
    }
}

/// The instance of `task` (or the session's) as an executor, started
/// first when it is not running (said on stderr in the plan's words). A
/// running instance of a stale spec is used as it is, with one line on
/// stderr: only `hermes reconcile` restarts it.
pub async fn executor(
    desired: &Desired,
    task: &str,
    session: Option<&str>,
) -> anyhow::Result<Instance> {
    let spec = desired.exec_instance(task, session);
    let runtime = Runtime::from_env()?;
    ensure(&runtime, desired, &spec).await?;
    Ok(Instance::new(runtime, &spec))
}

/// The instance of `task` (and `session`) when it is running; `None`
/// when it is not (nothing is started).
pub async fn running_instance(
    desired: &Desired,
    task: &str,
    session: Option<&str>,
) -> anyhow::Result<Option<Instance>> {
    let spec = desired.exec_instance(task, session);
    let runtime = Runtime::from_env()?;
    let seen = runtime.observe(std::slice::from_ref(&spec)).await?;
    let running = match &seen {
        hermes_model::singularity::SingularityObserved::Seen { instances, .. } => {
            instances.iter().any(|i| i.name == spec.name)
        }
        hermes_model::singularity::SingularityObserved::Unavailable { .. } => false,
    };
    Ok(running.then(|| Instance::new(runtime, &spec)))
}

/// Starts the instance of `spec` when the planner says so; a restart it
/// wants is left to `hermes reconcile`, said in one line.
async fn ensure(runtime: &Runtime, desired: &Desired, spec: &InstanceSpec) -> anyhow::Result<()> {
    let seen = runtime.observe(std::slice::from_ref(spec)).await?;
    let mut only = desired.clone();
    only.instances = vec![spec.clone()];
    let observed = Observed {
        singularity: Some(seen),
        ..Observed::default()
    };
    for op in hermes_reconcilers::singularity::plan(&only, &observed) {
        if op.action.kind() == Kind::Blocked {
            anyhow::bail!("{}: {}", op.target, op.cause);
        }
        match &op.action {
            Action::Instance(action @ InstanceAction::Start(_)) => {
                crate::exec_target::say(&op);
                carry_out(runtime, action).await?;
            }
            Action::Instance(InstanceAction::Restart(_)) => eprintln!(
                "hermes: {} runs a stale spec ({}); the command runs in it as it is: `hermes reconcile` restarts it (its overlay kept)",
                op.target, op.cause
            ),
            _ => {}
        }
    }
    Ok(())
}

/// Every instance key hermes made under the home: each task's, and each
/// session's, of every profile (from the directories it keeps them in).
pub fn known_keys(home: &Path) -> Vec<(SandboxKey, PathBuf)> {
    let root = home.join("sandboxes").join("singularity");
    let mut keys = Vec::new();
    for profile in dir_names(&root) {
        for task in dir_names(&root.join(&profile)) {
            let dir = root.join(&profile).join(&task);
            if dir.join(HASH_FILE).exists() {
                keys.push((SandboxKey::persistent(&profile, &task), dir.clone()));
            }
            for session in dir_names(&dir.join("sessions")) {
                let sdir = dir.join("sessions").join(&session);
                keys.push((SandboxKey::session(&profile, &task, &session), sdir));
            }
        }
    }
    keys
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// One instance of `hermes sandbox list`.
#[derive(Debug)]
pub struct Listed {
    pub name: String,
    pub profile: String,
    pub task: String,
    /// `yes`/`no` for the active profile's persistent instances, `-` for
    /// the others, `unmanaged` for instances hermes did not start.
    pub spec: String,
    pub pid: u32,
}

/// The running instances, each matched with the key hermes started it
/// for.
pub async fn list(home: &Path, desired: &Desired) -> anyhow::Result<Vec<Listed>> {
    let runtime = Runtime::from_env()?;
    let SingularityObserved::Seen { instances, .. } = runtime.observe(&[]).await? else {
        return Ok(Vec::new());
    };
    let keys = known_keys(home);
    Ok(instances
        .into_iter()
        .map(|i| {
            let known = keys.iter().find(|(k, _)| k.container_name() == i.name);
            let (profile, task, spec) = match known {
                None => ("-".to_string(), "-".to_string(), "unmanaged".to_string()),
                Some((key, dir)) => {
                    let spec = if key.profile == sanitize(&desired.profile) && key.session.is_none()
                    {
                        let recorded =
                            std::fs::read_to_string(dir.join(HASH_FILE)).unwrap_or_default();
                        if recorded.trim() == desired.instance(key.clone()).hash {
                            "yes"
                        } else {
                            "no"
                        }
                    } else {
                        "-"
                    };
                    (key.profile.clone(), key.task.clone(), spec.to_string())
                }
            };
            Listed {
                name: i.name,
                profile,
                task,
                spec,
                pid: i.pid,
            }
        })
        .collect())
}

/// The singularity instances: name, profile, task, whether the spec
/// matches, the instance's process id.
async fn list_instances(
    home: &crate::home::Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<crate::listing::SandboxList> {
    let listed = list(home.root(), desired).await?;
    Ok(crate::listing::SandboxList::Instances(
        listed
            .into_iter()
            .map(|i| crate::listing::InstanceRow {
                name: i.name,
                profile: i.profile,
                task: i.task,
                state: "running",
                spec_matches: match i.spec.as_str() {
                    "yes" => Some(true),
                    "no" => Some(false),
                    _ => None,
                },
                spec: i.spec,
                pid: i.pid,
            })
            .collect(),
    ))
}

/// The singularity backend: Apptainer (or SingularityCE) instances on this
/// host.
pub struct Singularity;

#[async_trait::async_trait]
impl crate::seam::Backend for Singularity {
    fn planner(&self) -> hermes_reconcilers::Planner {
        hermes_reconcilers::singularity::planner
    }

    fn gives_terminals(&self) -> bool {
        true
    }

    async fn observe(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        observed: &mut Observed,
    ) -> Option<String> {
        observed.singularity = observe(desired).await;
        None
    }

    async fn apply(
        &self,
        _home: &crate::home::Home,
        _desired: &Desired,
        plan: &hermes_reconcilers::HostPlan,
        verbose: bool,
    ) -> Applied {
        apply(plan, verbose).await
    }

    async fn exec_target(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<(crate::exec_target::ExecTarget, crate::exec_target::Values)> {
        let instance = executor(desired, which.task, which.session).await?;
        Ok((Box::new(instance), crate::exec_target::Values::default()))
    }

    async fn find(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<Option<crate::exec_target::ExecTarget>> {
        Ok(running_instance(desired, which.task, which.session)
            .await?
            .map(|i| Box::new(i) as crate::exec_target::ExecTarget))
    }

    async fn list(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
    ) -> anyhow::Result<crate::listing::SandboxList> {
        list_instances(home, desired).await
    }

    /// The instances hermes made under the home that run, stopped.
    async fn down(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        observed: &hermes_model::observed::Observed,
    ) -> Vec<hermes_model::plan::Op<hermes_model::action::Action>> {
        let known = known_keys(home.root());
        hermes_reconcilers::singularity::down(&desired.profile, observed, &known)
    }

    /// The session's instances ended.
    async fn end_session(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<crate::seam::Ending> {
        let known = known_keys(home.root());
        let ops = hermes_reconcilers::singularity::end_session(&desired.profile, session, &known);
        Ok(crate::seam::Ending {
            plan: hermes_model::plan::Plan::new(ops),
            engine: None,
        })
    }
}

#[async_trait::async_trait]
impl crate::exec_target::Target for Instance {
    /// The instance's own /tmp (it starts `--containall`), the file named
    /// by task and session all the same.
    fn cwd_state(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> String {
        format!("/tmp/.hermes-cwd.{}", which.key(desired))
    }

    fn jobs_dir(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> String {
        format!("/tmp/.hermes-background.{}", which.key(desired))
    }

    async fn exec(
        &self,
        req: &hermes_backends::exec::ExecRequest,
        io: hermes_backends::exec::ExecIo<'_>,
    ) -> Result<hermes_backends::exec::ExecOutcome, crate::exec_target::ExecError> {
        use hermes_backends::exec::Executor;
        Executor::exec(self, req, io)
            .await
            .map_err(crate::exec_target::ExecError::backend)
    }

    async fn exec_tty(
        &self,
        _desired: &Desired,
        req: &hermes_backends::exec::ExecRequest,
        io: hermes_backends::exec::TtyIo<'_>,
    ) -> Result<hermes_backends::exec::ExecOutcome, crate::exec_target::ExecError> {
        Instance::exec_tty(self, req, io)
            .await
            .map_err(crate::exec_target::ExecError::backend)
    }
}
