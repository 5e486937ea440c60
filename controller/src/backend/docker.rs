//! The Docker backend: the labelled containers this home makes, the
//! host's part of every pass (observed by [`crate::observe`], carried out
//! by [`crate::apply`], whatever the backend), so its own seam only makes a
//! sandbox ready for a command, lists the containers and ends a session.
//! The local and SSH backends list and end sessions the same way: their
//! sessions' sandboxes, if any, are containers of this engine.

use std::time::SystemTime;

use anyhow::Context;
use async_trait::async_trait;
use hermes_backends::docker::{Container, DockerError, Engine};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest, Executor, TtyIo};
use hermes_model::action::{Action, SandboxAction};
use hermes_model::desired::{Desired, Egress};
use hermes_model::observed::{ContainerState, Idleness, Observed, ObservedContainer};
use hermes_model::plan::{Describe, Kind, Op, Plan};
use hermes_model::sandbox::SandboxSpec;
use hermes_reconcilers::Planner;

use crate::activity::Activity;
use crate::apply::apply_one;
use crate::exec_target::{
    ExecError, ExecTarget, FailClosed, Target, Values, Which, egress_stale, say,
};
use crate::home::Home;
use crate::listing::{ContainerRow, SandboxList, idle_text};
use crate::observe::observe;
use crate::seam::{Backend, Ending};

/// The Docker backend.
pub struct Docker;

#[async_trait]
impl Backend for Docker {
    fn planner(&self) -> Planner {
        hermes_reconcilers::host_only
    }

    fn needs_docker(&self) -> bool {
        true
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
        // Never a sandbox made other than as the config says.
        if let Some(reason) = &desired.docker_blocked {
            anyhow::bail!(
                "the Docker sandboxes are blocked by config.yaml: {reason}; fix terminal.docker_extra_args"
            );
        }
        let spec = desired.exec_sandbox(which.task, which.session);
        let engine = Engine::connect().await?.for_home(home.scope());
        let (found, in_use) = ensure_sandbox(&engine, home, desired, &spec)
            .await
            .map_err(|e| racing(e, &spec.name))?;
        let runs = crate::pool::spec_of(desired, &found, &spec);
        let runner =
            hermes_backends::docker::runner_dir(&found, &runs).map(std::path::Path::to_path_buf);
        let target = DockerTarget {
            container: Container {
                engine,
                id: found.id.clone(),
                runner,
            },
            name: spec.name.clone(),
            activity: Activity::new(home),
            _in_use: in_use,
        };
        Ok((Box::new(target) as ExecTarget, docker_values(desired)))
    }

    async fn find(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>> {
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
        let runs = crate::pool::spec_of(desired, &found, &spec);
        let runner =
            hermes_backends::docker::runner_dir(&found, &runs).map(std::path::Path::to_path_buf);
        Ok(Some(Box::new(DockerTarget {
            container: Container {
                engine,
                id: found.id.clone(),
                runner,
            },
            name: spec.name.clone(),
            activity: Activity::new(home),
            _in_use: in_use,
        })))
    }

    fn place(&self, desired: &Desired, which: &Which<'_>) -> String {
        desired.exec_sandbox(which.task, which.session).name
    }

    async fn list(&self, home: &Home, desired: &Desired) -> anyhow::Result<SandboxList> {
        list_containers(home, desired).await
    }

    async fn end_session(
        &self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<Ending> {
        end_session(home, desired, session).await
    }
}

/// A Docker sandbox, running, ready for a command.
struct DockerTarget {
    container: Container,
    /// The sandbox's name, for the activity records and messages.
    name: String,
    activity: Activity,
    /// Held while the command runs: a replacement lets it end first
    /// ([`crate::sandbox_locks`]).
    _in_use: crate::sandbox_locks::Held,
}

#[async_trait]
impl Target for DockerTarget {
    /// A container of its own per task and session: its /tmp.
    fn cwd_state(&self, _home: &Home, _desired: &Desired, _which: &Which<'_>) -> String {
        crate::exec_target::OWN_CWD_STATE.to_string()
    }

    fn jobs_dir(&self, _home: &Home, _desired: &Desired, _which: &Which<'_>) -> String {
        crate::exec_target::OWN_JOBS_DIR.to_string()
    }

    fn describe(&self, _desired: &Desired) -> String {
        self.name.clone()
    }

    /// Runs `req`; the sandbox's activity is recorded when the command
    /// starts and when it ends.
    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, ExecError> {
        record(&self.activity, &self.name);
        let outcome = self.container.exec(req, io).await;
        record(&self.activity, &self.name);
        Ok(outcome?)
    }

    async fn exec_tty(
        &self,
        _desired: &Desired,
        req: &ExecRequest,
        io: TtyIo<'_>,
    ) -> Result<ExecOutcome, ExecError> {
        record(&self.activity, &self.name);
        let outcome = self
            .container
            .engine
            .exec_tty(&self.container.id, req, io)
            .await;
        record(&self.activity, &self.name);
        Ok(outcome?)
    }
}

/// The plan of `hermes session end ID` where a session's sandboxes are
/// containers (Docker, and the hosts whose sessions run there: local,
/// SSH): its containers removed, the plan saying what runs in them.
pub async fn end_session(home: &Home, desired: &Desired, session: &str) -> anyhow::Result<Ending> {
    let profile = &desired.profile;
    let engine = Engine::connect().await?.for_home(home.scope());
    let mut observed = observe(&engine, home).await?;
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

/// Every labelled container of this home, sorted by profile, task and
/// name.
pub async fn list_containers(
    home: &Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<SandboxList> {
    let engine = Engine::connect().await?.for_home(home.scope());
    let mut observed = observe(&engine, home).await?;
    let default_runtime = engine.default_runtime().await?;
    observed
        .containers
        .sort_by(|a, b| (a.profile(), a.task(), &a.name).cmp(&(b.profile(), b.task(), &b.name)));
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let pool_hash = desired.pool_member(0).hash().to_string();
    let rows = observed
        .containers
        .iter()
        .map(|c| {
            let ours = c.profile() == Some(desired.profile.as_str());
            let member = c.is_unclaimed_pool_member();
            let task = match c.task() {
                Some(task) => task,
                None if member => hermes_model::desired::POOL_TASK,
                None => "-",
            };
            let matches = match c.spec_hash() {
                Some(h) if ours && (member || c.claimed_by().is_some()) => Some(pool_hash == h),
                Some(h) if ours && c.session().is_none() => {
                    Some(desired.sandbox_for_task(task).hash() == h)
                }
                _ => None,
            };
            let pool = member.then(|| {
                if observed.pool_member_ready(c) {
                    "ready"
                } else {
                    "starting"
                }
            });
            let spec = match (c.spec_hash(), matches) {
                (None, _) => "unmanaged",
                (_, Some(true)) => "yes",
                (_, Some(false)) => "no",
                (_, None) => "-",
            };
            let idleness = observed.idleness(c);
            ContainerRow {
                name: c.name.clone(),
                profile: c.profile().unwrap_or("-").to_string(),
                task: task.to_string(),
                state: c.state.as_str().to_string(),
                runtime: c.runtime().unwrap_or_else(|| default_runtime.clone()),
                session: c.session().map(str::to_string),
                managed: c.spec_hash().is_some(),
                spec_matches: matches,
                spec: spec.to_string(),
                age_seconds: now - c.created,
                idle_seconds: match idleness {
                    Idleness::IdleSince(t) => Some(now - t),
                    _ => None,
                },
                processes: c.processes,
                pool,
                age: hermes_reconcilers::age(now - c.created),
                idle: match pool {
                    Some(state) => format!("pool: {state}"),
                    None => idle_text(idleness, c, now),
                },
            }
        })
        .collect();
    Ok(SandboxList::Containers(rows))
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
    home: &Home,
    desired: &Desired,
    spec: &SandboxSpec,
) -> anyhow::Result<(ObservedContainer, crate::sandbox_locks::Held)> {
    let _gate = crate::sandbox_locks::gate(spec).await?;
    let found = ready(engine, home, desired, spec).await?;
    let in_use = crate::sandbox_locks::in_use(spec).await?;
    Ok((found, in_use))
}

/// [`ensure_sandbox`]'s work, under the gate.
async fn ready(
    engine: &Engine,
    home: &Home,
    desired: &Desired,
    spec: &SandboxSpec,
) -> anyhow::Result<ObservedContainer> {
    let found = match engine.find(&spec.key).await? {
        Some(c) => Some(c),
        None => made_by_agent(engine, spec).await?,
    };
    // A new session's sandbox: a ready warm-pool member, when there is
    // one (its plan's operation, as exec's create prints its own).
    if found.is_none() && desired.pool_serves(&spec.key) {
        let started = std::time::Instant::now();
        if let Some(c) = crate::pool::claim(engine, home, desired, spec).await? {
            eprintln!(
                "~ {}   {:<10}  {}, ready in the warm pool ({} ms)",
                hermes_model::plan::Target::Sandbox {
                    profile: spec.key.profile.clone(),
                    task: spec.key.task.clone(),
                    session: spec.key.session.clone(),
                },
                "claim",
                c.label(hermes_model::sandbox::LABEL_POOL)
                    .unwrap_or("a member"),
                started.elapsed().as_millis()
            );
            return Ok(c);
        }
    }
    // A claimed member is compared with the pool's spec.
    let expected = match &found {
        Some(c) => crate::pool::spec_of(desired, c, spec),
        None => spec.clone(),
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
        && egress_stale(&expected, c)
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
                warn_if_stale(&expected, c);
                return Ok(c.clone());
            }
            ContainerState::Created | ContainerState::Exited if c.spec_hash().is_some() => {
                let stale = c.spec_hash() != Some(expected.hash());
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
                let started = std::time::Instant::now();
                apply_one(engine, &op).await?;
                // A stopped sandbox resumed: the wait said when it is one.
                if started.elapsed() > std::time::Duration::from_millis(100) {
                    eprintln!(
                        "hermes: sandbox {} started again in {:.2} s",
                        c.name,
                        started.elapsed().as_secs_f64()
                    );
                }
                if stale {
                    warn_if_stale(&expected, c);
                }
                return engine
                    .find_named(&c.name)
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
        // As a pass asks: only for a runtime of its own.
        runtimes: match spec.runtime {
            Some(_) => engine.runtimes().await.ok(),
            None => None,
        },
        ..Observed::default()
    };
    let mut ops: Vec<Op<Action>> = hermes_reconcilers::persistence::plan(
        &only,
        &observed,
        hermes_reconcilers::unix_seconds(SystemTime::now()),
    )
    .ops
    .into_iter()
    .filter(|op| matches!(op.target, hermes_model::plan::Target::Sandbox { .. }))
    .collect();
    if let Some(runtimes) = &observed.runtimes {
        hermes_reconcilers::block_missing_runtime(&mut ops, runtimes);
    }
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
        c.name,
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
