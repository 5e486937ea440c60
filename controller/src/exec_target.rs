//! Where `hermes exec` runs a command: the exec side of the backend seam
//! ([`crate::backend::Seam::exec_target`]), where the chosen backend
//! becomes an [`Executor`] ([`ExecTarget::choose`]).
//!
//! Choosing a target may create a missing sandbox or start a stopped one
//! (said on stderr in the plan's words), never recreate or remove one: a
//! running sandbox whose spec is stale runs the command, and stderr gets
//! one line naming what differs and `hermes reconcile`, which applies it
//! (only a plan changes a sandbox). Each target also says where the task's
//! working directory is carried in the sandbox, and which values every
//! command gets there (the per-command environment: forwarded variables,
//! the egress proxy's variables and tokens), so that none of them is
//! fixed in a sandbox's spec.

use std::time::SystemTime;

use anyhow::Context;
use hermes_backends::cloud::InSandbox;
use hermes_backends::docker::{Container, DockerError, Engine};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest, Executor};
use hermes_backends::local::Local;
use hermes_backends::singularity::Instance;
use hermes_backends::ssh::SshHost;
use hermes_model::action::{Action, SandboxAction};
use hermes_model::desired::{Desired, Egress};
use hermes_model::observed::{ContainerState, Observed, ObservedContainer};
use hermes_model::plan::{Describe, Kind, Op};
use hermes_model::sandbox::SandboxSpec;

use crate::activity::Activity;
use crate::apply::apply_one;
use crate::backend::Seam;
use crate::home::Home;

/// Where a command runs, ready to run it.
pub enum ExecTarget {
    Local(Local),
    Docker {
        container: Container,
        /// The sandbox's name, for the activity records and messages.
        name: String,
        activity: Activity,
        /// Held while the command runs: a replacement lets it end first
        /// ([`crate::sandbox_locks`]).
        _in_use: crate::sandbox_locks::Held,
    },
    Ssh(SshHost),
    Singularity(Instance),
    Cloud(InSandbox<crate::cloud::Driver>),
}

/// Which command: its task and session.
#[derive(Debug, Clone)]
pub struct Which<'a> {
    pub task: &'a str,
    pub session: Option<&'a str>,
}

impl Which<'_> {
    /// `profile.task` or `profile.task.session`: what names the files of
    /// `which` where several tasks share one place.
    fn key(&self, desired: &Desired) -> String {
        match self.session {
            Some(s) => format!("{}.{}.{s}", desired.profile, self.task),
            None => format!("{}.{}", desired.profile, self.task),
        }
    }
}

impl ExecTarget {
    /// The target of `desired`'s backend for `which`, its sandbox made
    /// ready (created or started) when it needs to be; and the values
    /// every command there gets before its own `--env`.
    pub async fn choose(
        seam: Seam,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<(ExecTarget, Values)> {
        match seam {
            Seam::Local => Ok((
                ExecTarget::Local(Local { default_cwd: None }),
                Values::default(),
            )),
            Seam::Docker => {
                // Never a sandbox made other than as the config says.
                if let Some(reason) = &desired.docker_blocked {
                    anyhow::bail!(
                        "the Docker sandboxes are blocked by config.yaml: {reason}; fix terminal.docker_extra_args"
                    );
                }
                let spec = desired.exec_sandbox(which.task, which.session);
                let engine = Engine::connect().await?.for_home(home.scope());
                let (found, in_use) = ensure_sandbox(&engine, desired, &spec)
                    .await
                    .map_err(|e| racing(e, &spec.name))?;
                let runner = hermes_backends::docker::runner_dir(&found, &spec)
                    .map(std::path::Path::to_path_buf);
                let target = ExecTarget::Docker {
                    container: Container {
                        engine,
                        id: found.id.clone(),
                        runner,
                    },
                    name: spec.name.clone(),
                    activity: Activity::new(home),
                    _in_use: in_use,
                };
                Ok((target, docker_values(desired)))
            }
            Seam::Ssh => {
                let (host, env) = crate::ssh::executor(home, desired, which.task)?;
                Ok((
                    ExecTarget::Ssh(host),
                    Values {
                        base: Vec::new(),
                        pinned: env,
                    },
                ))
            }
            Seam::Singularity => {
                let instance =
                    crate::singularity::executor(desired, which.task, which.session).await?;
                Ok((ExecTarget::Singularity(instance), Values::default()))
            }
            Seam::Cloud(_) => {
                let (sandbox, env) = crate::cloud::executor(home, desired, which.task).await?;
                Ok((
                    ExecTarget::Cloud(sandbox),
                    Values {
                        base: env,
                        pinned: Vec::new(),
                    },
                ))
            }
        }
    }

    /// The target of `desired`'s backend for `which` when its sandbox is
    /// there and running, for a look inside (`hermes process`): `None`
    /// when it is not. Nothing is created, started or resumed.
    pub async fn find(
        seam: Seam,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>> {
        match seam {
            Seam::Local => Ok(Some(ExecTarget::Local(Local { default_cwd: None }))),
            Seam::Docker => {
                let spec = desired.exec_sandbox(which.task, which.session);
                let engine = Engine::connect().await?.for_home(home.scope());
                let found = {
                    let _gate = crate::sandbox_locks::gate(&spec).await?;
                    match engine.find(&spec.key).await? {
                        Some(c) => Some(c),
                        None => made_by_agent(&engine, &spec).await?,
                    }
                };
                let Some(found) = found.filter(|c| c.state == ContainerState::Running) else {
                    return Ok(None);
                };
                let in_use = crate::sandbox_locks::in_use(&spec).await?;
                let runner = hermes_backends::docker::runner_dir(&found, &spec)
                    .map(std::path::Path::to_path_buf);
                Ok(Some(ExecTarget::Docker {
                    container: Container {
                        engine,
                        id: found.id.clone(),
                        runner,
                    },
                    name: spec.name.clone(),
                    activity: Activity::new(home),
                    _in_use: in_use,
                }))
            }
            Seam::Ssh => {
                let (host, _) = crate::ssh::executor(home, desired, which.task)?;
                Ok(Some(ExecTarget::Ssh(host)))
            }
            Seam::Singularity => {
                Ok(
                    crate::singularity::running_instance(desired, which.task, which.session)
                        .await?
                        .map(ExecTarget::Singularity),
                )
            }
            Seam::Cloud(_) => Ok(crate::cloud::running_executor(home, desired, which.task)
                .await?
                .map(ExecTarget::Cloud)),
        }
    }

    /// The file, in the sandbox, that carries the working directory of
    /// `which` from one command to the next
    /// ([`hermes_backends::exec::TERMINAL_SCRIPT`]); a relative path is
    /// from the home there.
    pub fn cwd_state(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        let key = which.key(desired);
        match self {
            // The host: under the home, by profile, task and session.
            ExecTarget::Local(_) => home
                .root()
                .join("run")
                .join("cwd")
                .join(key)
                .display()
                .to_string(),
            // The remote host is shared by every task: beside the
            // task's workspace (relative to the remote home).
            ExecTarget::Ssh(_) => format!(".hermes-sandbox/{}/{key}.cwd", desired.profile),
            // A container of its own per task and session: its /tmp.
            ExecTarget::Docker { .. } => "/tmp/.hermes-cwd".to_string(),
            // A sandbox of its own per task: its home, which a restore
            // from a snapshot brings back.
            ExecTarget::Cloud(_) => ".hermes-cwd".to_string(),
            // The instance's own /tmp (it starts `--containall`), the
            // file named by task and session all the same.
            ExecTarget::Singularity(_) => format!("/tmp/.hermes-cwd.{key}"),
        }
    }

    /// The directory, in the sandbox, where the background processes of
    /// `which` keep their state and output, one directory each
    /// ([`hermes_backends::background`]); a relative path is from the
    /// home there.
    pub fn jobs_dir(&self, home: &Home, desired: &Desired, which: &Which<'_>) -> String {
        let key = which.key(desired);
        match self {
            ExecTarget::Local(_) => home
                .root()
                .join("run")
                .join("background")
                .join(key)
                .display()
                .to_string(),
            ExecTarget::Ssh(_) => format!(".hermes-sandbox/{}/{key}.background", desired.profile),
            ExecTarget::Docker { .. } => "/tmp/.hermes-background".to_string(),
            ExecTarget::Cloud(_) => ".hermes-background".to_string(),
            ExecTarget::Singularity(_) => format!("/tmp/.hermes-background.{key}"),
        }
    }

    /// Where the command ran, for a message.
    pub fn describe(&self, desired: &Desired) -> String {
        match self {
            ExecTarget::Local(_) => "this host".to_string(),
            ExecTarget::Docker { name, .. } => name.clone(),
            ExecTarget::Ssh(_) | ExecTarget::Singularity(_) | ExecTarget::Cloud(_) => {
                format!("the {} sandbox", desired.backend())
            }
        }
    }

    /// Runs `req`; the Docker sandbox's activity is recorded when the
    /// command starts and when it ends.
    pub async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, ExecError> {
        match self {
            ExecTarget::Local(local) => Ok(local.exec(req, io).await?),
            ExecTarget::Docker {
                container,
                name,
                activity,
                ..
            } => {
                record(activity, name);
                let outcome = container.exec(req, io).await;
                record(activity, name);
                Ok(outcome?)
            }
            ExecTarget::Ssh(host) => Ok(host.exec(req, io).await?),
            ExecTarget::Singularity(instance) => Ok(instance.exec(req, io).await?),
            ExecTarget::Cloud(sandbox) => Ok(sandbox.exec(req, io).await?),
        }
    }
}

impl ExecTarget {
    /// Runs `req` on a terminal of its own (`hermes exec -t`): on this
    /// host, in a Docker sandbox and in a singularity instance; the other
    /// backends have no terminal to give, which is said before anything
    /// runs.
    pub async fn exec_tty(
        &self,
        desired: &Desired,
        req: &ExecRequest,
        io: hermes_backends::exec::TtyIo<'_>,
    ) -> Result<ExecOutcome, ExecError> {
        match self {
            ExecTarget::Local(local) => Ok(local.exec_tty(req, io).await?),
            ExecTarget::Docker {
                container,
                name,
                activity,
                ..
            } => {
                record(activity, name);
                let outcome = container.engine.exec_tty(&container.id, req, io).await;
                record(activity, name);
                Ok(outcome?)
            }
            ExecTarget::Singularity(instance) => Ok(instance.exec_tty(req, io).await?),
            ExecTarget::Ssh(_) | ExecTarget::Cloud(_) => {
                Err(ExecError::NoTerminal(desired.backend().to_string()))
            }
        }
    }
}

/// Why a command did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Local(#[from] hermes_backends::local::LocalError),
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Ssh(#[from] hermes_backends::ssh::SshError),
    #[error(transparent)]
    Singularity(#[from] hermes_backends::singularity::SingularityError),
    #[error(transparent)]
    Cloud(#[from] crate::cloud::DriverCallError),
    #[error(
        "the {0} backend gives a command no terminal: `hermes exec -t` works on the local, docker and singularity backends; run the command without -t"
    )]
    NoTerminal(String),
}

impl ExecError {
    /// The sandbox vanished before the command started: made again and
    /// the command retried once.
    pub fn is_gone(&self) -> bool {
        matches!(self, ExecError::Docker(DockerError::Gone { .. }))
    }
}

/// The values every command of a target gets, besides its own `--env`.
#[derive(Debug, Clone, Default)]
pub struct Values {
    /// Under the command's own (forwarded variables).
    pub base: Vec<(String, String)>,
    /// Over the command's own (the egress proxy's variables and tokens:
    /// `--env` is refused for those names while the proxy is enabled).
    pub pinned: Vec<(String, String)>,
}

impl Values {
    /// The environment of one command whose own values are `own`.
    pub fn with(self, own: Vec<(String, String)>) -> Vec<(String, String)> {
        let Values { mut base, pinned } = self;
        base.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
        base.extend(own);
        base.retain(|(k, _)| !pinned.iter().any(|(p, _)| p == k));
        base.extend(pinned);
        base
    }
}

/// The values every command in a Docker sandbox gets: the
/// `docker_forward_env` and `env_passthrough` values found, and the egress
/// proxy's variables and
/// tokens. None of them is in the container's spec: a token rotation or
/// another forwarded value reaches the next command without a recreate.
fn docker_values(desired: &Desired) -> Values {
    Values {
        base: desired
            .forward_env
            .iter()
            .chain(&desired.passthrough_env)
            .cloned()
            .collect(),
        pinned: match &desired.egress {
            Egress::On { wiring, .. } => wiring.env(),
            _ => Vec::new(),
        },
    }
}

/// Records use of a sandbox; a failure costs the idle reaper's precision,
/// not the command, so it is a warning.
fn record(activity: &Activity, container: &str) {
    if let Err(e) = activity.touch(container) {
        tracing::warn!(container, error = %e, "cannot record the sandbox's activity");
    }
}

/// The error of a sandbox that another hermes process is replacing (a
/// replacement waited for, in vain), in a user's words.
fn racing(e: anyhow::Error, name: &str) -> anyhow::Error {
    match e.downcast_ref::<DockerError>() {
        Some(DockerError::NameTaken { .. } | DockerError::StillRemoving { .. }) => e.context(
            format!("the sandbox {name} is being replaced by another hermes process; try again"),
        ),
        _ => e,
    }
}

/// Prints an operation on stderr as the plan prints it.
pub fn say(op: &Op<Action>) {
    eprintln!(
        "{} {}   {:<10}  {}",
        op.action.kind().symbol(),
        op.target,
        op.action.verb(),
        op.cause
    );
}

/// An exec refused, failing closed: the egress proxy enforced on the
/// backend is not ready, or the sandbox is not wired to it as it is now.
#[derive(Debug, thiserror::Error)]
#[error("{0}; `hermes reconcile` (or a running controller) brings it back")]
pub struct FailClosed(pub String);

/// Whether `c` was made with other egress wiring than `spec` has (the
/// proxy turned on, off, or set up anew since): its route, CA and
/// variables are not the proxy's of now.
pub fn egress_stale(spec: &SandboxSpec, c: &ObservedContainer) -> bool {
    let label = hermes_model::sandbox::LABEL_EGRESS;
    c.label(label).unwrap_or("off") != spec.labels.get(label).map_or("off", String::as_str)
}

/// The sandbox of `spec`, running, and its in-use lock, held by the
/// caller while its command runs: a missing one is created and a stopped
/// one started (each printed as the plan prints it); a running one is used
/// as it is, with one line on stderr when its spec is stale. Never
/// recreates or removes a container: what only a recreate or a removal
/// would fix is an error naming `hermes reconcile`.
///
/// Looked at under the gate a replacement holds (a reconcile, the
/// controller): what it leaves is what is used, never its old container
/// stopped half-way; and the in-use lock, taken before the gate is left,
/// makes a replacement that comes next wait for the command.
async fn ensure_sandbox(
    engine: &Engine,
    desired: &Desired,
    spec: &SandboxSpec,
) -> anyhow::Result<(ObservedContainer, crate::sandbox_locks::Held)> {
    let _gate = crate::sandbox_locks::gate(spec).await?;
    let found = ready(engine, desired, spec).await?;
    let in_use = crate::sandbox_locks::in_use(spec).await?;
    Ok((found, in_use))
}

/// [`ensure_sandbox`]'s work, under the gate.
async fn ready(
    engine: &Engine,
    desired: &Desired,
    spec: &SandboxSpec,
) -> anyhow::Result<ObservedContainer> {
    let found = match engine.find(&spec.key).await? {
        Some(c) => Some(c),
        None => made_by_agent(engine, spec).await?,
    };
    if let Some(c) = &found
        && c.spec_hash().is_none()
    {
        // Hermes Agent's container of the task: used as it is (a plan
        // adopts it, `hermes reconcile` carries that out).
        let op = Op {
            changes: Vec::new(),
            target: hermes_model::plan::Target::Sandbox {
                profile: spec.key.profile.clone(),
                task: spec.key.task.clone(),
                session: spec.key.session.clone(),
            },
            action: Action::Sandbox(SandboxAction::Start { id: c.id.clone() }),
            cause: format!(
                "container {} made by Hermes Agent, {}",
                c.name,
                c.state.as_str()
            ),
        };
        if c.state != ContainerState::Running {
            say(&op);
            apply_one(engine, &op).await?;
        }
        crate::notices::warning(format!(
            "sandbox {} is Hermes Agent's container {}; the command runs in it as it is: \
             `hermes reconcile` adopts it",
            spec.name, c.name
        ));
        return Ok(c.clone());
    }
    if let Some(c) = &found
        && desired.egress_enforced()
        && egress_stale(spec, c)
    {
        // Fail closed: its commands would run without the proxy's route
        // or CA (or with a stale one), the variables saying otherwise.
        return Err(FailClosed(format!(
            "sandbox {} ({}) was made without the egress proxy's current wiring, and no command \
             runs in it while the proxy is enforced: its next pass recreates it ({})",
            spec.name,
            c.state.as_str(),
            recreate_keeps(spec)
        ))
        .into());
    }
    if let Some(c) = &found {
        match c.state {
            ContainerState::Running => {
                warn_if_stale(spec, c);
                return Ok(c.clone());
            }
            ContainerState::Created | ContainerState::Exited if c.spec_hash().is_some() => {
                let stale = c.spec_hash() != Some(spec.hash());
                let op = Op {
                    changes: Vec::new(),
                    target: hermes_model::plan::Target::Sandbox {
                        profile: spec.key.profile.clone(),
                        task: spec.key.task.clone(),
                        session: spec.key.session.clone(),
                    },
                    action: Action::Sandbox(SandboxAction::Start { id: c.id.clone() }),
                    cause: format!("{} since {}", c.state.as_str(), ago(c)),
                };
                say(&op);
                apply_one(engine, &op).await?;
                if stale {
                    warn_if_stale(spec, c);
                }
                return engine
                    .find(&spec.key)
                    .await?
                    .with_context(|| format!("sandbox {} vanished as it started", spec.name));
            }
            _ => {}
        }
    }
    let mut only = desired.clone();
    only.sandboxes = vec![spec.clone()];
    let observed = Observed {
        containers: found.into_iter().collect(),
        legacy: crate::migrate::legacy_of(&desired_root(desired), spec)
            .into_iter()
            .collect(),
        ..Observed::default()
    };
    let ops: Vec<Op<Action>> = hermes_reconcilers::persistence::plan(
        &only,
        &observed,
        hermes_reconcilers::unix_seconds(SystemTime::now()),
    )
    .ops
    .into_iter()
    .filter(|op| matches!(op.target, hermes_model::plan::Target::Sandbox { .. }))
    .collect();
    if let Some(op) = ops.iter().find(|op| op.action.kind() == Kind::Blocked) {
        anyhow::bail!("sandbox {} is blocked: {}", spec.name, op.cause);
    }
    if let Some(op) = ops.iter().find(|op| {
        !matches!(
            op.action,
            Action::Sandbox(
                SandboxAction::Create(_)
                    | SandboxAction::Start { .. }
                    | SandboxAction::Migrate { old_id: None, .. }
            )
        )
    }) {
        anyhow::bail!(
            "sandbox {} needs `{}` ({}); hermes exec never replaces or removes a sandbox: \
             `hermes reconcile` does",
            spec.name,
            op.action.verb(),
            op.cause
        );
    }
    for op in &ops {
        say(op);
        apply_one(engine, op).await?;
    }
    match engine.find(&spec.key).await? {
        Some(c) => Ok(c),
        None => anyhow::bail!("sandbox {} was not created", spec.name),
    }
}

/// The running (else the last made) container Hermes Agent made for the
/// task of `spec`: its labels, no spec hash label.
async fn made_by_agent(
    engine: &Engine,
    spec: &SandboxSpec,
) -> anyhow::Result<Option<ObservedContainer>> {
    if spec.key.session.is_some() {
        return Ok(None);
    }
    let profile = hermes_model::sandbox::sanitize(&spec.key.profile);
    let task = hermes_model::sandbox::sanitize(&spec.key.task);
    let mut all = engine.observe_profile(&profile).await?;
    crate::migrate::read_adoptions(&spec.home, &mut all);
    Ok(all
        .into_iter()
        .filter(|c| {
            c.profile() == Some(profile.as_str())
                && c.task() == Some(task.as_str())
                && c.session().is_none()
        })
        .max_by_key(|c| {
            (
                c.state == ContainerState::Running,
                c.started_at.unwrap_or(i64::MIN),
                c.created,
            )
        }))
}

/// The root the home of `desired` is a profile of.
fn desired_root(desired: &Desired) -> std::path::PathBuf {
    crate::home::Home::resolve(Some(desired.home.clone()))
        .map(|h| h.profiles_root())
        .unwrap_or_else(|_| desired.home.clone())
}

/// How long ago a stopped container last ran, for a start's cause.
fn ago(c: &ObservedContainer) -> String {
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let since = c.finished_at.or(c.started_at).unwrap_or(c.created);
    hermes_reconcilers::age(now - since)
}

/// One line on stderr when the running container's spec is not `spec`'s:
/// what differs, from the settings label, and the command that applies it.
fn warn_if_stale(spec: &SandboxSpec, c: &ObservedContainer) {
    if c.spec_hash() == Some(spec.hash()) {
        return;
    }
    eprintln!("{}", stale_line(spec, c));
}

/// The line of [`warn_if_stale`].
pub fn stale_line(spec: &SandboxSpec, c: &ObservedContainer) -> String {
    let old = c
        .label(hermes_model::settings::LABEL_SETTINGS)
        .and_then(hermes_model::settings::parse_label);
    let what = match old {
        Some(old) => {
            let changes = hermes_model::settings::diff(&old, &spec.settings());
            if changes.is_empty() {
                None
            } else {
                Some(
                    changes
                        .iter()
                        .map(hermes_model::settings::Change::describe)
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            }
        }
        None => None,
    };
    let what = what.unwrap_or_else(|| {
        format!(
            "spec {} → {}",
            c.spec_hash().unwrap_or("(none)"),
            spec.hash()
        )
    });
    format!(
        "hermes: sandbox {} runs a stale spec ({what}); the command runs in it as it is: `hermes reconcile` recreates it ({})",
        spec.name,
        recreate_keeps(spec)
    )
}

/// What a recreate of `spec`'s sandbox keeps, in words.
fn recreate_keeps(spec: &SandboxSpec) -> &'static str {
    if spec.key.session.is_some() {
        "a session's files are on tmpfs: every file in it is lost"
    } else {
        "its /workspace and /root kept"
    }
}
