//! Carrying out a plan against the Docker engine: each operation is one
//! engine call or a short idempotent sequence, so an interrupted pass is
//! finished by the next one. A failed operation does not stop the others.
//! Removals go first and run a few at a time, then the releases of disk
//! images; the rest follow in order.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hermes_backends::docker::{CreateOutcome, DockerError, Engine};
use hermes_model::action::{Action, Families, SandboxAction};
use hermes_model::migration::DataMove;
use hermes_model::observed::ContainerState;
use hermes_model::plan::{Describe, Op, Target};
use hermes_model::sandbox::SandboxSpec;
use hermes_reconcilers::HostPlan;

use crate::activity::Activity;
use crate::home::Home;

/// How many removals run at once: enough to hide the engine's latency,
/// few enough not to swamp it.
pub const REMOVE_CONCURRENCY: usize = 8;

/// Why an operation failed. It is printed and logged after the
/// operation's target and verb (`error: sandbox default/default create:
/// …`), so it says the cause only.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The Docker engine refused or failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error("no Docker engine answers")]
    NoEngine,
    #[error("no home to run the proxy from")]
    NoHome,
    /// A `hermes egress` step of the proxy.
    #[error(transparent)]
    Proxy(#[from] crate::proxy_ops::ProxyError),
    /// `apptainer` or `singularity`.
    #[error(transparent)]
    Singularity(#[from] hermes_backends::singularity::SingularityError),
    /// A backend's own operation (the SSH host's; no driver for the
    /// cloud backend), as the backend reported it.
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A sandbox's disk image could not be released.
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
    /// A directory hermes keeps could not be removed.
    #[error("cannot remove {}: {source}", path.display())]
    Remove {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The cloud service, its records or its lock, with the chain of
    /// causes.
    #[error("{0:#}")]
    Cloud(anyhow::Error),
}

impl ApplyError {
    /// A backend's own error.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> ApplyError {
        ApplyError::Backend(Box::new(e))
    }
}

/// What an applied plan came to.
#[derive(Debug, Default)]
pub struct Applied {
    pub done: usize,
    pub failed: usize,
    /// The targets of the operations that succeeded, and of those that
    /// failed with why: a controller backs off per target.
    pub succeeded: Vec<Target>,
    pub failures: Vec<(Target, ApplyError)>,
    /// Operations left undone because a stop was asked for.
    pub skipped: usize,
    /// Each operation's result, in the order they ended (`--output json`).
    pub results: Vec<OpResult>,
}

/// How one operation of an applied plan ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpResult {
    pub target: String,
    pub action: &'static str,
    /// `done`, `failed`, `skipped` (a stop was asked for first) or
    /// `noop` (an operation that reports, or was already done).
    pub result: &'static str,
    /// Why it failed.
    pub error: Option<String>,
    pub seconds: f64,
}

/// How to apply a plan.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions<'a> {
    /// Print each operation as it completes.
    pub verbose: bool,
    /// Checked before each operation: once set, the operation in flight
    /// finishes and no other starts.
    pub stop: Option<&'a AtomicBool>,
    /// The home whose proxy the plan's proxy operations act on.
    pub home: Option<&'a Home>,
}

impl ApplyOptions<'_> {
    fn stopping(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }
}

impl Applied {
    /// Adds what another part of the pass applied.
    pub fn absorb(&mut self, other: Applied) {
        self.done += other.done;
        self.failed += other.failed;
        self.succeeded.extend(other.succeeded);
        self.failures.extend(other.failures);
        self.skipped += other.skipped;
        self.results.extend(other.results);
    }

    /// An operation left undone because a stop was asked for.
    pub(crate) fn skip(&mut self, op: &Op<Action>) {
        self.skipped += 1;
        self.results.push(OpResult {
            target: op.target.to_string(),
            action: op.action.verb(),
            result: "skipped",
            error: None,
            seconds: 0.0,
        });
    }

    /// Counts and prints the result of one operation.
    pub(crate) fn record(
        &mut self,
        op: &Op<Action>,
        started: Instant,
        result: Result<bool, ApplyError>,
        verbose: bool,
    ) {
        let outcome = OpResult {
            target: op.target.to_string(),
            action: op.action.verb(),
            result: match &result {
                Ok(false) => "noop",
                Ok(true) => "done",
                Err(_) => "failed",
            },
            error: result.as_ref().err().map(ToString::to_string),
            seconds: started.elapsed().as_secs_f64(),
        };
        self.results.push(outcome);
        match result {
            Ok(false) => {}
            Ok(true) => {
                self.done += 1;
                self.succeeded.push(op.target.clone());
                if verbose {
                    println!(
                        "{} {}   {} done ({:.1}s)",
                        op.action.kind().symbol(),
                        op.target,
                        op.action.verb(),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Err(e) => {
                self.failed += 1;
                tracing::debug!(resource = %op.target, action = op.action.verb(), error = %e, "operation failed");
                crate::notices::op_error(format_args!("{} {}: {e}", op.target, op.action.verb()));
                self.failures.push((op.target.clone(), e));
            }
        }
    }
}

/// Applies every operation of `plan`, printing each as it completes
/// (`verbose`) and every failure. Removals go first, [`REMOVE_CONCURRENCY`]
/// at a time: a duplicate must be gone before a create takes the name it
/// may hold. The releases of disk images follow, once the containers that
/// used them are gone, and before a create mounts one anew. The activity
/// record of a removed container is dropped.
pub async fn apply(
    engine: Option<&Engine>,
    plan: &HostPlan,
    activity: &Activity,
    options: ApplyOptions<'_>,
) -> Applied {
    let verbose = options.verbose;
    let mut applied = Applied::default();
    // The proxy's and the Docker sandboxes' operations are carried out
    // here; the backend's own (the SSH host's, the singularity
    // instances', the cloud sandbox's) by its seam (`crate::backend`).
    let families = Families::of(&plan.ops);
    // The proxy first: sandboxes may wait on it.
    for (op, action) in families.proxy {
        if options.stopping() {
            applied.skip(op);
            continue;
        }
        let started = Instant::now();
        let result = match options.home {
            Some(home) => crate::proxy_ops::apply(home, engine, action)
                .await
                .map(|()| true)
                .map_err(ApplyError::from),
            None => Err(ApplyError::NoHome),
        };
        applied.record(op, started, result, verbose);
    }
    let (removals, others): (Vec<_>, Vec<_>) = families
        .sandbox
        .into_iter()
        .partition(|(_, action)| matches!(action, SandboxAction::Remove { .. }));
    let (releases, others): (Vec<_>, Vec<_>) = others
        .into_iter()
        .partition(|(_, action)| matches!(action, SandboxAction::ReleaseDisk(_)));
    let mut removing = futures_util::stream::iter(removals)
        .map(|(op, action)| async move {
            let started = Instant::now();
            if options.stopping() {
                return (op, action, started, None);
            }
            // A warm-pool member is removed under the pool's lock, and only
            // while no session claimed it since the plan was made.
            let _pool = match (&op.target, options.home, engine, action) {
                (
                    Target::Pool { profile, .. },
                    Some(home),
                    Some(engine),
                    SandboxAction::Remove { id, .. },
                ) => match crate::pool::hold_unclaimed(engine, home, profile, id).await {
                    Ok(Some(held)) => Some(held),
                    Ok(None) => return (op, action, started, Some((Ok(false), None))),
                    Err(e) => return (op, action, started, Some((Err(e.into()), None))),
                },
                _ => None,
            };
            // A claimed warm-pool member's run state is by the name it
            // was made with.
            let made_as = match (engine, action) {
                (Some(engine), SandboxAction::Remove { id, .. }) => made_as(engine, id).await,
                _ => None,
            };
            (
                op,
                action,
                started,
                Some((apply_with(engine, action).await, made_as)),
            )
        })
        .buffer_unordered(REMOVE_CONCURRENCY);
    while let Some((op, action, started, result)) = removing.next().await {
        let Some((result, made_as)) = result else {
            applied.skip(op);
            continue;
        };
        if let (Ok(true), SandboxAction::Remove { name, .. }) = (&result, action) {
            if let Err(e) = activity.forget(name) {
                tracing::debug!(container = %name, error = %e, "cannot drop an activity record");
            }
            if let Some(member) = made_as {
                activity.forget_run_state(&member);
            }
        }
        applied.record(op, started, result, verbose);
    }
    for (op, action) in releases.into_iter().chain(others) {
        if options.stopping() {
            applied.skip(op);
            continue;
        }
        let started = Instant::now();
        let result = apply_with(engine, action).await;
        applied.record(op, started, result, verbose);
    }
    applied
}

/// The name a claimed warm-pool member was made with (its
/// [`hermes_model::sandbox::LABEL_POOL`]), when `id` is one.
async fn made_as(engine: &Engine, id: &str) -> Option<String> {
    let found = engine.find_named(id).await.ok().flatten()?;
    found.claimed_by()?;
    found
        .label(hermes_model::sandbox::LABEL_POOL)
        .map(str::to_string)
}

/// [`apply_sandbox`] when there is an engine; an error when there is none.
async fn apply_with(engine: Option<&Engine>, action: &SandboxAction) -> Result<bool, ApplyError> {
    match engine {
        Some(engine) => apply_sandbox(engine, action).await.map(|()| true),
        None => Err(ApplyError::NoEngine),
    }
}

/// Carries out the Docker sandbox's operation of `op`; `Ok(false)` when it
/// has none (a refusal, a report).
pub async fn apply_one(engine: &Engine, op: &Op<Action>) -> Result<bool, ApplyError> {
    match &op.action {
        Action::Sandbox(action) => apply_sandbox(engine, action).await.map(|()| true),
        Action::Proxy(_)
        | Action::Ssh(_)
        | Action::Instance(_)
        | Action::Cloud(_)
        | Action::Pod(_)
        | Action::Blocked
        | Action::Keep { .. } => Ok(false),
    }
}

/// Carries out one operation on a Docker sandbox.
pub async fn apply_sandbox(engine: &Engine, action: &SandboxAction) -> Result<(), ApplyError> {
    match action {
        SandboxAction::Create(spec) => {
            ensure_image(engine, spec).await?;
            create_and_start(engine, spec).await?;
        }
        SandboxAction::Start { id } => {
            crate::disk::remount(engine, id).await?;
            engine.start(id).await?;
        }
        SandboxAction::Recreate { old_id, spec } => {
            // Pull first: a failed pull must not cost the old container.
            ensure_image(engine, spec).await?;
            replace(engine, old_id, spec).await?;
            crate::migrate::forget_adoption(&spec.home, old_id);
        }
        SandboxAction::Adopt { id, spec } => {
            crate::migrate::record_adoption(&spec.home, id, spec.hash()).map_err(|e| {
                DockerError::HostFiles {
                    container: spec.name.clone(),
                    message: format!("cannot record its adoption under run/adopted: {e}"),
                }
            })?;
        }
        SandboxAction::Migrate { old_id, spec, data } => {
            ensure_image(engine, spec).await?;
            match old_id {
                Some(old_id) => {
                    replace_moving(engine, old_id, spec, Some(data)).await?;
                    crate::migrate::forget_adoption(&spec.home, old_id);
                }
                None => {
                    let _gate = crate::sandbox_locks::gate(spec).await?;
                    move_data(spec, data)?;
                    create_and_start(engine, spec).await?;
                }
            }
        }
        SandboxAction::Remove { id, disk, .. } => {
            // What runs inside (an exec of anyone's, a process one left)
            // ends first, up to a grace; the removal stops what is left,
            // as the plan's cost said.
            engine
                .wait_idle(id, crate::sandbox_locks::IN_FLIGHT_GRACE)
                .await;
            engine.remove(id).await?;
            if let Some(disk) = disk {
                match crate::disk::release(engine, disk).await {
                    // Another container of the sandbox, removed beside
                    // this one, is the last to go: its removal releases it.
                    Err(crate::disk::DiskError::InUse { container, .. }) => {
                        tracing::debug!(%container, image = %disk.image.display(), "the disk image is still in use; left mounted");
                    }
                    other => other?,
                }
            }
        }
        SandboxAction::ReleaseDisk(disk) => crate::disk::release(engine, disk).await?,
        SandboxAction::Warm(spec) => {
            ensure_image(engine, spec).await?;
            let id = create_and_start(engine, spec).await?;
            crate::pool::warm(engine, spec, &id).await?;
        }
        SandboxAction::Stop { id } => engine.stop(id).await?,
    }
    Ok(())
}

/// Moves a sandbox's data to the shared layout ([`crate::migrate`]).
fn move_data(spec: &SandboxSpec, data: &DataMove) -> Result<(), DockerError> {
    crate::migrate::move_data(data).map_err(|e| DockerError::HostFiles {
        container: spec.name.clone(),
        message: format!("its files were not moved to the shared layout: {e}"),
    })
}

/// Pulls the spec's image when the engine lacks it. On a terminal the
/// engine's progress is one status line rewritten in place; elsewhere (a
/// log, a pipe, the controller) one line when the pull starts and one
/// when it ends, never a `\r`.
async fn ensure_image(engine: &Engine, spec: &SandboxSpec) -> Result<(), DockerError> {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal() && !crate::notices::logging();
    let started = std::time::Instant::now();
    let mut last_len = 0usize;
    let mut pulling = false;
    let result = engine
        .ensure_image(&spec.image, |line: &str| {
            if !pulling {
                pulling = true;
                if !terminal {
                    crate::notices::progress(format_args!(
                        "pulling image {} (not on this engine)",
                        spec.image
                    ));
                }
            }
            if terminal {
                let mut err = std::io::stderr().lock();
                let pad = last_len.saturating_sub(line.chars().count());
                let _ = write!(err, "\r{line}{}", " ".repeat(pad));
                let _ = err.flush();
                last_len = line.chars().count();
            }
        })
        .await;
    if last_len > 0 {
        eprintln!();
    }
    if pulling && !terminal && result.is_ok() {
        crate::notices::progress(format_args!(
            "pulled image {} in {:.1} s",
            spec.image,
            started.elapsed().as_secs_f64()
        ));
    }
    result.map(|_| ())
}

/// The label of a container made by [`replace`] under a temporary name:
/// its value is the name it is to take.
pub const LABEL_NEXT: &str = "hermes-next";

/// Replaces the container `old_id` by one of `spec`, creating before
/// removing: the new container is made (not started) under a temporary
/// name, `<name>-next-<random>`, with the spec's labels and
/// [`LABEL_NEXT`], once the commands running in the old one ended (up
/// to [`crate::sandbox_locks::IN_FLIGHT_GRACE`]). Only once the engine
/// accepted it is the old one stopped and the new one started; only once the new one runs is the old
/// one removed and the new one renamed to the sandbox's name. A spec the
/// engine refuses, at the create or at the start, leaves the old sandbox
/// as it was (started again if it ran) and the new container removed, and the
/// operation fails with the engine's reason.
///
/// The two bind the same data directories: the new one starts only once
/// the old one is stopped, and the old one starts again only once the new
/// one is stopped. Each step is safe to be cut short: a leftover
/// temporary container carries the sandbox's labels, so the next pass
/// sees two containers of one sandbox, keeps the running (or last
/// started) one and removes the other by a planned operation, and
/// recreates a kept temporary one under the sandbox's name.
pub async fn replace(
    engine: &Engine,
    old_id: &str,
    spec: &SandboxSpec,
) -> Result<String, DockerError> {
    replace_moving(engine, old_id, spec, None).await
}

/// [`replace`], moving the sandbox's data from hermes's earlier layout
/// once the old container is stopped and before the new one starts (its
/// disk image made or mounted only then, at the new place). A move that
/// fails starts the old one again, as a failed start does.
pub async fn replace_moving(
    engine: &Engine,
    old_id: &str,
    spec: &SandboxSpec,
    data: Option<&DataMove>,
) -> Result<String, DockerError> {
    // One replacement of a sandbox at a time across hermes processes (a
    // controller, a reconcile, execs): two would start two containers on
    // the same data. The loser finds the old container gone and the new
    // one in place, which a create of the same spec counts as done. An
    // exec started meanwhile waits at the gate and runs in the new one.
    let _gate = crate::sandbox_locks::gate(spec).await?;
    let old_gone = match engine.docker().inspect_container(old_id, None).await {
        Ok(_) => false,
        Err(e) => hermes_backends::docker::is_not_found(&e),
    };
    if old_gone {
        if let Some(data) = data {
            move_data(spec, data)?;
        }
        return create_and_start(engine, spec).await;
    }
    if data.is_none() {
        crate::disk::prepare(spec).await?;
    }
    // The commands already running in the old container end first (up
    // to a grace), before anything is made: an interrupted wait leaves the
    // sandbox as it was, with no temporary container behind. The stop
    // below ends what still runs.
    let _drained = crate::sandbox_locks::drain(spec, crate::sandbox_locks::IN_FLIGHT_GRACE).await?;
    let mut next = spec.clone();
    next.name = format!("{}-next-{}", spec.name, suffix());
    next.labels
        .insert(LABEL_NEXT.to_string(), spec.name.clone());
    let id = match engine.create(&next).await? {
        CreateOutcome::Created { id } => id,
        CreateOutcome::AlreadyExists => {
            return Err(DockerError::NameTaken {
                container: next.name.clone(),
                found: "(another container)".to_string(),
                wanted: spec.hash().to_string(),
            });
        }
    };
    // Started again after a failed start only if it ran.
    let was_running = engine
        .docker()
        .inspect_container(old_id, None)
        .await
        .ok()
        .and_then(|i| i.state)
        .and_then(|s| s.running)
        .unwrap_or(true);
    if let Err(e) = engine.stop(old_id).await {
        discard(engine, &id, &next.name).await;
        return Err(e);
    }
    let moved = match data {
        Some(data) => match move_data(spec, data) {
            Ok(()) => crate::disk::prepare(spec).await,
            Err(e) => Err(e),
        },
        None => Ok(()),
    };
    let started = match moved {
        Ok(()) => match crate::disk::remount(engine, &id).await {
            Ok(()) => engine.start(&id).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = started {
        // Stopped first: the old one must not run beside it.
        let _ = engine.stop(&id).await;
        discard(engine, &id, &next.name).await;
        let restarted = match crate::disk::remount(engine, old_id).await {
            Ok(()) if was_running => engine.start(old_id).await,
            other => other,
        };
        if let Err(again) = restarted {
            tracing::warn!(container = %old_id, error = %again, "cannot start the old container again; the next pass will");
        }
        return Err(e);
    }
    engine.remove(old_id).await?;
    engine.rename(&id, &spec.name).await?;
    Ok(id)
}

/// Removes the new container of a replacement that failed, best effort:
/// left behind, the next pass removes it.
async fn discard(engine: &Engine, id: &str, name: &str) {
    if let Err(e) = engine.remove(id).await {
        tracing::warn!(container = %name, error = %e, "cannot remove the new container; the next pass will");
    }
}

/// Eight random hex digits for a temporary name; the time's when the
/// system has no randomness (a collision only fails the create).
fn suffix() -> String {
    let mut buf = [0u8; 4];
    if getrandom::fill(&mut buf).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        buf = nanos.to_le_bytes();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates the container and starts it. A name conflict counts as done
/// only when the container holding the name has this very spec (a racing
/// process created it); any other holder is an error, never adopted.
///
/// It removes nothing: a holder the plan saw has its removal planned
/// before this create (`reconcilers::persistence`). A holder being
/// removed is waited for, up to [`REMOVAL_WAIT`], and the create tried
/// again; a dead one (which stays until removed) fails the create at once,
/// and the next pass plans its removal; a holder in another state is
/// waited for up to [`HOLDER_WAIT`] (the engine reports a container whose
/// removal another process started as it was until its processes are
/// dead).
pub async fn create_and_start(engine: &Engine, spec: &SandboxSpec) -> Result<String, DockerError> {
    crate::disk::prepare(spec).await?;
    let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
    let holder_deadline = tokio::time::Instant::now() + HOLDER_WAIT;
    let id = loop {
        match engine.create(spec).await? {
            CreateOutcome::Created { id } => break id,
            CreateOutcome::AlreadyExists => match engine.find_named(&spec.name).await? {
                Some(found) if found.spec_hash() == Some(spec.hash()) => break found.id,
                Some(found) if waits_for(&found, deadline, holder_deadline) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(found) => {
                    return Err(DockerError::NameTaken {
                        container: spec.name.clone(),
                        found: found.spec_hash().unwrap_or("(none)").to_string(),
                        wanted: spec.hash().to_string(),
                    });
                }
                // Gone between the create and the lookup: try again.
                None if tokio::time::Instant::now() < deadline => {}
                None => {
                    return Err(DockerError::Gone {
                        container: spec.name.clone(),
                        reason: "created by another process, then removed".to_string(),
                    });
                }
            },
        }
    };
    // Its disk image mounted again if a release took it off since the
    // prepare (under the lock a release takes: made now, the container
    // keeps its image from here on).
    crate::disk::remount(engine, &id).await?;
    engine.start(&id).await?;
    Ok(id)
}

/// Whether a create still waits for `holder`, of another spec, to go:
/// one being removed until `removal`; a dead one not at all (it stays
/// until something removes it); one the engine reports as it was
/// (running, even, while another process removes it) until `other`.
fn waits_for(
    holder: &hermes_model::observed::ObservedContainer,
    removal: tokio::time::Instant,
    other: tokio::time::Instant,
) -> bool {
    let until = match holder.state {
        ContainerState::Removing => removal,
        ContainerState::Dead => return false,
        _ => other,
    };
    tokio::time::Instant::now() < until
}

/// How long a create waits for a container of its name to finish being
/// removed.
const REMOVAL_WAIT: Duration = Duration::from_secs(15);

/// How long a create waits for a container of its name and another spec
/// that the engine does not (yet) report as being removed.
const HOLDER_WAIT: Duration = Duration::from_secs(3);
