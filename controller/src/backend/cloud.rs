//! The cloud backends (modal, daytona, vercel_sandbox) in the binary:
//! observing, applying, exec and a session's end, written once over any
//! [`CloudDriver`] (a [`Driver`] in the binary, a scripted one in the
//! tests), with the snapshot records kept in
//! `$HERMES_HOME/<backend>_snapshots.json` ([`crate::snapshots`]).
//!
//! [`Driver::new`] is the one place a backend name becomes a driver: an
//! enum of the drivers built into this binary (each behind its cargo
//! feature), which forwards every call to the one it holds. A backend
//! whose driver is not part of this binary is an error that says so
//! (`backend modal is not built in this binary`): the plan shows the
//! sandbox blocked with it and the command exits 1.
//!
//! A dry run only calls [`CloudDriver::find`]: observing is the whole of
//! it. Applying and exec create, resume or recreate through the same
//! planner ([`hermes_reconcilers::cloud`]); a snapshot that fails to
//! restore is dropped from the records and the sandbox created from the
//! base image in the same operation, so a bad snapshot never makes a loop.
//!
//! The sandbox an operation leaves running is recorded as the task's in
//! the same file, and its id handed to every later `find`: a service that
//! cannot name its sandboxes (Vercel) finds it by nothing else, so without
//! it each pass and each exec would make another. A session's end and a
//! destroy clear it.

// Built without any cloud driver, the generic layer has no caller, and
// `Driver` has no variant to hand its methods' arguments to.
#![cfg_attr(
    not(any(feature = "daytona", feature = "modal", feature = "vercel")),
    allow(dead_code, unused_variables)
)]

use std::time::Instant;

use anyhow::Context;
use nix::fcntl::Flock;

use hermes_backends::cloud::{CloudDriver, CloudSandbox, CloudSpec, CloudState};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest};
use hermes_model::action::{Action, CloudAction, Families};
use hermes_model::cloud::{CloudDesired, CloudObserved, CloudSandboxState};
use hermes_model::config::Backend;
use hermes_model::desired::{DEFAULT_TASK, Desired, HostEnv};
use hermes_model::observed::Observed;
use hermes_model::plan::{Describe, Op, Plan, Target};

use crate::apply::{Applied, ApplyError};
use crate::snapshots::SnapshotBook;

/// Why no driver could be made for a backend.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DriverError {
    /// The backend's driver is not compiled into this binary.
    #[error("backend {0} is not built in this binary")]
    NotBuilt(Backend),
    /// The driver refused to start (its credentials, say).
    #[error("{backend}: {reason}")]
    Refused { backend: Backend, reason: String },
}

/// The driver of a cloud backend: one variant per driver built into this
/// binary. Its [`CloudDriver`] methods forward to the driver it holds.
#[derive(Debug)]
pub enum Driver {
    #[cfg(feature = "modal")]
    // Boxed: the Modal driver is large, the others small.
    Modal(Box<hermes_backends::modal::ModalDriver>),
    #[cfg(feature = "daytona")]
    Daytona(hermes_backends::daytona::DaytonaDriver),
    #[cfg(feature = "vercel")]
    Vercel(hermes_backends::vercel::VercelDriver),
}

/// An error of the driver in use, as that driver reported it.
#[derive(Debug, thiserror::Error)]
pub enum DriverCallError {
    #[cfg(feature = "modal")]
    #[error(transparent)]
    Modal(#[from] hermes_backends::modal::ModalError),
    #[cfg(feature = "daytona")]
    #[error(transparent)]
    Daytona(#[from] hermes_backends::daytona::DaytonaError),
    #[cfg(feature = "vercel")]
    #[error(transparent)]
    Vercel(#[from] hermes_backends::vercel::VercelError),
}

impl Driver {
    /// The driver of `backend`, its credentials read through `env` (this
    /// process's environment, then `.env`; Modal also reads
    /// `~/.modal.toml` from `home_dir`).
    ///
    /// A backend whose driver's feature is off in this build, or that is
    /// no cloud, is [`DriverError::NotBuilt`].
    pub fn new(
        backend: Backend,
        env: &HostEnv,
        home_dir: Option<&std::path::Path>,
    ) -> Result<Driver, DriverError> {
        let lookup = |name: &str| env.lookup(name).map(str::to_string);
        let refused = |e: &dyn std::error::Error| DriverError::Refused {
            backend,
            reason: e.to_string(),
        };
        let _ = (&lookup, &refused, home_dir);
        match backend {
            #[cfg(feature = "modal")]
            Backend::Modal => hermes_backends::modal::ModalDriver::from_env(&lookup, home_dir)
                .map(|d| Driver::Modal(Box::new(d)))
                .map_err(|e| refused(&e)),
            #[cfg(feature = "daytona")]
            Backend::Daytona => hermes_backends::daytona::DaytonaDriver::from_env(&lookup)
                .map(Driver::Daytona)
                .map_err(|e| refused(&e)),
            #[cfg(feature = "vercel")]
            Backend::VercelSandbox => hermes_backends::vercel::VercelDriver::from_env(&lookup)
                .map(Driver::Vercel)
                .map_err(|e| refused(&e)),
            _ => Err(DriverError::NotBuilt(backend)),
        }
    }
}

/// `$call` with the driver `$d` that `$self` holds, its error made a
/// [`DriverCallError`].
macro_rules! forward {
    ($self:ident, $d:ident => $call:expr) => {
        match *$self {
            #[cfg(feature = "modal")]
            Driver::Modal(ref $d) => $call.map_err(DriverCallError::from),
            #[cfg(feature = "daytona")]
            Driver::Daytona(ref $d) => $call.map_err(DriverCallError::from),
            #[cfg(feature = "vercel")]
            Driver::Vercel(ref $d) => $call.map_err(DriverCallError::from),
        }
    };
}

impl CloudDriver for Driver {
    type Error = DriverCallError;

    fn backend(&self) -> &'static str {
        match *self {
            #[cfg(feature = "modal")]
            Driver::Modal(ref d) => d.backend(),
            #[cfg(feature = "daytona")]
            Driver::Daytona(ref d) => d.backend(),
            #[cfg(feature = "vercel")]
            Driver::Vercel(ref d) => d.backend(),
        }
    }

    async fn find(
        &self,
        profile: &str,
        task: &str,
        known: Option<&str>,
    ) -> Result<Option<CloudSandbox>, DriverCallError> {
        forward!(self, d => d.find(profile, task, known).await)
    }

    async fn create(
        &self,
        spec: &CloudSpec,
        snapshot: Option<&str>,
    ) -> Result<CloudSandbox, DriverCallError> {
        forward!(self, d => d.create(spec, snapshot).await)
    }

    async fn resume(&self, id: &str) -> Result<CloudSandbox, DriverCallError> {
        forward!(self, d => d.resume(id).await)
    }

    async fn suspend(&self, id: &str) -> Result<Option<String>, DriverCallError> {
        forward!(self, d => d.suspend(id).await)
    }

    async fn destroy(&self, id: &str) -> Result<(), DriverCallError> {
        forward!(self, d => d.destroy(id).await)
    }

    async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<ExecOutcome, DriverCallError> {
        forward!(self, d => d.exec(id, req, io).await)
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<(), DriverCallError> {
        forward!(self, d => d.write_file(id, path, content).await)
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, DriverCallError> {
        forward!(self, d => d.read_file(id, path).await)
    }
}

/// The service's state in the model's words.
fn state(s: CloudState) -> CloudSandboxState {
    match s {
        CloudState::Running => CloudSandboxState::Running,
        CloudState::Stopped => CloudSandboxState::Stopped,
        CloudState::Pending => CloudSandboxState::Pending,
        CloudState::Dead => CloudSandboxState::Dead,
    }
}

/// The placeholders a cloud sandbox holds for the provider keys its
/// service sets as headers: the proxy's tokens (`tokens.json`), as Docker
/// sandboxes hold, or fresh ones where the proxy has none. Read once per
/// process ([`load_placeholders`]), so that a sandbox and its commands
/// agree.
static PLACEHOLDERS: std::sync::OnceLock<std::collections::BTreeMap<String, String>> =
    std::sync::OnceLock::new();

/// Reads the proxy's tokens for [`PLACEHOLDERS`] (a missing or unreadable
/// file leaves fresh tokens to be minted).
pub fn load_placeholders(home: &crate::home::Home) {
    let path = crate::egress::files::Paths::new(home).tokens();
    let tokens = std::fs::read(path)
        .ok()
        .and_then(|b| hermes_egress::tokens::TokensFile::parse(&b).ok())
        .map(|f| f.tokens)
        .unwrap_or_default();
    let _ = PLACEHOLDERS.set(tokens);
}

/// The placeholder for `provider`: its proxy token, else a fresh one
/// (kept for the process).
fn placeholder(provider: &str) -> Option<String> {
    static MINTED: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    if let Some(token) = PLACEHOLDERS.get().and_then(|t| t.get(provider)) {
        return Some(token.clone());
    }
    let mut minted = MINTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(token) = minted.get(provider) {
        return Some(token.clone());
    }
    // No random source: no placeholder, and the key is not forwarded.
    let token = hermes_egress::tokens::new_token(provider).ok()?;
    minted.insert(provider.to_string(), token.clone());
    Some(token)
}

/// What a command in the cloud sandbox gets of the forwarded values, and
/// the headers the service sets: a provider key is a placeholder on
/// Vercel and Modal, the service setting its real header (a key without a
/// placeholder is left out rather than forwarded as it is).
pub fn sandbox_side(
    cloud: &CloudDesired,
) -> (
    Vec<(String, String)>,
    Vec<hermes_model::cloud::HeaderTransform>,
) {
    let (env, transforms) =
        hermes_model::cloud::service_side(cloud.backend, &cloud.env, &placeholder);
    let env = env
        .into_iter()
        .filter(|(name, value)| {
            !hermes_model::cloud::covered_by_service(cloud.backend, name)
                || !cloud.env.iter().any(|(n, v)| n == name && v == value)
        })
        .collect();
    (env, transforms)
}

/// The sandbox wanted, in the driver's terms.
pub fn spec(desired: &Desired, cloud: &CloudDesired, task: &str) -> CloudSpec {
    let (env, transforms) = sandbox_side(cloud);
    CloudSpec {
        task: task.to_string(),
        profile: desired.profile.clone(),
        image: cloud.image.clone(),
        cpu: cloud.cpu,
        memory_mb: cloud.memory_mb,
        disk_mb: cloud.disk_mb,
        lifetime: cloud.lifetime,
        env,
        transforms,
    }
}

/// What a pass sees on the service: the default task's sandbox (one
/// `find`, given the sandbox recorded for the task, nothing else) and its
/// snapshot record. Writes nothing: a dry run leaves the records alone.
pub async fn observe_cloud<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    book: &SnapshotBook,
) -> CloudObserved {
    let record = match book.entry(&desired.profile, DEFAULT_TASK) {
        Ok(r) => r,
        Err(e) => {
            return CloudObserved::Unavailable {
                reason: format!("cannot read {}: {e}", book.path().display()),
            };
        }
    };
    match driver
        .find(&desired.profile, DEFAULT_TASK, record.sandbox.as_deref())
        .await
    {
        Ok(found) => CloudObserved::Seen {
            sandbox: found.map(|s| (s.id, state(s.state))),
            snapshot: record.snapshot,
        },
        Err(e) => CloudObserved::Unavailable {
            reason: format!("cannot ask {}: {e}", driver.backend()),
        },
    }
}

/// Carries out one cloud operation for `task` that makes a sandbox run;
/// the sandbox it leaves running, recorded as the task's (so the next
/// `find` is handed its id).
async fn apply_op<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    cloud: &CloudDesired,
    book: &SnapshotBook,
    task: &str,
    op: &Op<Action>,
    action: &CloudAction,
) -> anyhow::Result<CloudSandbox> {
    let sandbox = carry_out(driver, desired, cloud, book, task, op, action).await?;
    book.record_sandbox(&desired.profile, task, &sandbox.id)?;
    Ok(sandbox)
}

/// Suspends the task's sandbox keeping its filesystem (a session's end):
/// the snapshot the driver returns is recorded for the next session
/// (Daytona keeps the stopped sandbox itself, and no record is needed),
/// and the sandbox is no longer recorded as serving the task. The
/// snapshot's id, when there is one.
async fn suspend<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    book: &SnapshotBook,
    task: &str,
    id: &str,
) -> anyhow::Result<Option<String>> {
    let snapshot = driver.suspend(id).await?;
    // The stopped sandbox is what comes back when there is no snapshot:
    // an older one is stale then.
    book.suspended(&desired.profile, task, snapshot.as_deref())?;
    Ok(snapshot)
}

/// [`apply_op`] without the final record. A create from a snapshot that
/// fails drops the snapshot's record and creates from the base image
/// instead.
async fn carry_out<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    cloud: &CloudDesired,
    book: &SnapshotBook,
    task: &str,
    op: &Op<Action>,
    action: &CloudAction,
) -> anyhow::Result<CloudSandbox> {
    let spec = spec(desired, cloud, task);
    match action {
        CloudAction::Suspend { .. } => {
            anyhow::bail!("{}: a suspend makes no sandbox run", op.target)
        }
        CloudAction::Resume { id } => Ok(driver.resume(id).await?),
        CloudAction::Create { snapshot } | CloudAction::Recreate { snapshot, .. } => {
            if let CloudAction::Recreate { old_id, .. } = action {
                driver.destroy(old_id).await?;
                // Gone: should the create below fail, nothing is recorded
                // as serving the task.
                book.forget_sandbox(&desired.profile, task)?;
            }
            match driver.create(&spec, snapshot.as_deref()).await {
                Ok(sandbox) => Ok(sandbox),
                Err(e) if snapshot.is_some() => {
                    let error = e.to_string();
                    let Some(fallback) =
                        hermes_reconcilers::cloud::without_snapshot(op, &cloud.image, &error)
                    else {
                        return Err(e.into());
                    };
                    crate::notices::warning(format_args!("{}: {}", op.target, fallback.cause));
                    book.forget(&desired.profile, task)?;
                    Ok(driver.create(&spec, None).await?)
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// Carries out the plan's cloud operations.
pub async fn apply_cloud<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    plan: &Plan<Action>,
    book: &SnapshotBook,
    verbose: bool,
) -> Applied {
    let mut applied = Applied::default();
    let Some(cloud) = &desired.cloud else {
        return applied;
    };
    for (op, _) in Families::of(&plan.ops).cloud {
        // The planner makes every cloud operation on its task's sandbox.
        let Target::Cloud { task, .. } = &op.target else {
            continue;
        };
        let started = Instant::now();
        let result = carry_out_planned(driver, desired, cloud, book, task, op).await;
        let note = result.as_ref().ok().cloned().flatten();
        applied.record(
            op,
            started,
            result.map(|_| true).map_err(ApplyError::Cloud),
            verbose,
        );
        if let (Some(note), true) = (note, verbose) {
            println!("  {}: {note}", op.target);
        }
    }
    applied
}

/// Carries out the planned `op` on the task's sandbox, under the lock, once
/// the service, asked again, still reports the sandbox the plan was made
/// against (an exec, or another hermes, may have made or changed it since
/// the pass observed): the planner that made `op` (a pass's, or a
/// session's end's) plans it again. When it does not, nothing is done:
/// the error says what changed, and the next pass plans again from what
/// it sees. A word for the person, when there is one (the snapshot a
/// session's end kept).
async fn carry_out_planned<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    cloud: &CloudDesired,
    book: &SnapshotBook,
    task: &str,
    op: &Op<Action>,
) -> anyhow::Result<Option<String>> {
    let Action::Cloud(action) = &op.action else {
        anyhow::bail!("not a cloud operation: {}", op.action.verb());
    };
    let _lock = lock_task_making(book).await?;
    let (record, found) = look(driver, desired, book, task).await?;
    let now = found
        .as_ref()
        .map(|s| format!("{} {}", s.id, state(s.state)))
        .unwrap_or_else(|| "no sandbox".to_string());
    let observed = seen(record, found);
    let still = match action {
        CloudAction::Suspend { .. } => {
            hermes_reconcilers::cloud::end_session(desired, &observed, "")
        }
        CloudAction::Create { .. } | CloudAction::Resume { .. } | CloudAction::Recreate { .. } => {
            hermes_reconcilers::cloud::plan(desired, &observed)
        }
    };
    if still.first().map(|o| &o.action) != Some(&op.action) {
        anyhow::bail!(
            "the service changed since the plan (it now reports {now}); nothing done, the next pass plans again"
        );
    }
    if let CloudAction::Suspend { id } = action {
        let snapshot = suspend(driver, desired, book, task, id).await?;
        return Ok(snapshot.map(|s| format!("snapshot {s} kept for the next session")));
    }
    apply_op(driver, desired, cloud, book, task, op, action).await?;
    Ok(None)
}

/// What a pass would see of the task's sandbox: `found` on the service,
/// with the task's record.
fn seen(record: hermes_model::cloud::TaskRecord, found: Option<CloudSandbox>) -> Observed {
    Observed {
        cloud: Some(CloudObserved::Seen {
            sandbox: found.map(|s| (s.id, state(s.state))),
            snapshot: record.snapshot,
        }),
        ..Observed::default()
    }
}

/// The cloud settings of `desired`, or why a command cannot reach the
/// service at all: no cloud backend, or a credential it needs is missing.
pub fn usable(desired: &Desired) -> anyhow::Result<&hermes_model::cloud::CloudDesired> {
    let Some(cloud) = &desired.cloud else {
        anyhow::bail!("the {} backend has no cloud settings", desired.backend());
    };
    if let Err(missing) = &cloud.credentials {
        anyhow::bail!(
            "{missing}: the {} backend needs it, in the environment or in .env",
            cloud.backend
        );
    }
    Ok(cloud)
}

/// The task's sandbox on the service as an executor, created (from the
/// task's snapshot), resumed or recreated (a dead one) first when needed;
/// and the `<backend>_forward_env` values every command there gets before
/// its own (a service without a sandbox-wide environment, Vercel, has them
/// only this way, and on the others a value changed since the sandbox was
/// made takes effect).
pub async fn executor(
    home: &crate::home::Home,
    desired: &Desired,
    task: &str,
) -> anyhow::Result<(
    hermes_backends::cloud::InSandbox<Driver>,
    Vec<(String, String)>,
)> {
    let cloud = usable(desired)?;
    let host = crate::host::host_env(home)?;
    let home_dir = home_dir(&host);
    let driver = Driver::new(cloud.backend, &host, home_dir.as_deref())?;
    let book = SnapshotBook::new(home.root(), cloud.backend);
    load_placeholders(home);
    let id = ready(&driver, desired, &book, task).await?;
    Ok((
        hermes_backends::cloud::InSandbox { driver, id },
        sandbox_side(cloud).0,
    ))
}

/// The task's sandbox on the service as an executor when it is running;
/// `None` when it is not (nothing is created or resumed).
pub async fn running_executor(
    home: &crate::home::Home,
    desired: &Desired,
    task: &str,
) -> anyhow::Result<Option<hermes_backends::cloud::InSandbox<Driver>>> {
    let cloud = usable(desired)?;
    cloud.credentials.clone()?;
    let host = crate::host::host_env(home)?;
    let home_dir = home_dir(&host);
    let driver = Driver::new(cloud.backend, &host, home_dir.as_deref())?;
    let book = SnapshotBook::new(home.root(), cloud.backend);
    let id = running(&driver, desired, &book, task).await?;
    Ok(id.map(|id| hermes_backends::cloud::InSandbox { driver, id }))
}

/// The id of the task's running sandbox on the service, which is created
/// (from the task's snapshot), resumed or recreated (a dead one) first when
/// needed.
pub async fn ready<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    book: &SnapshotBook,
    task: &str,
) -> anyhow::Result<String> {
    let cloud = desired
        .cloud
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the backend is not a cloud service"))?;
    cloud.credentials.clone()?;
    ensure(driver, desired, cloud, book, task).await
}

/// The id of the task's running sandbox, made so through the planner.
async fn ensure<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    cloud: &CloudDesired,
    book: &SnapshotBook,
    task: &str,
) -> anyhow::Result<String> {
    if let Some(id) = running(driver, desired, book, task).await? {
        return Ok(id);
    }
    let _lock = lock_task_making(book).await?;
    // The planner decides for any task as for the default one.
    let mut only = desired.clone();
    only.config.terminal.container_persistent = true;
    match converge(driver, &only, cloud, book, task).await? {
        Some(id) => Ok(id),
        None => anyhow::bail!(
            "the {} sandbox of task {task} is not running",
            cloud.backend
        ),
    }
}

/// The id of the task's sandbox when the service says it runs (recorded
/// as the task's when it was not).
async fn running<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    book: &SnapshotBook,
    task: &str,
) -> anyhow::Result<Option<String>> {
    let (record, found) = look(driver, desired, book, task).await?;
    match found {
        Some(s) if s.state == CloudState::Running => {
            if record.sandbox.as_deref() != Some(s.id.as_str()) {
                book.record_sandbox(&desired.profile, task, &s.id)?;
            }
            Ok(Some(s.id))
        }
        _ => Ok(None),
    }
}

/// The task's record and what the service has for it (asked with the
/// sandbox id recorded).
async fn look<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    book: &SnapshotBook,
    task: &str,
) -> anyhow::Result<(hermes_model::cloud::TaskRecord, Option<CloudSandbox>)> {
    let record = book.entry(&desired.profile, task)?;
    let found = driver
        .find(&desired.profile, task, record.sandbox.as_deref())
        .await?;
    Ok((record, found))
}

/// Looks at the task's sandbox on the service and carries out what the
/// planner says of it now; the id of the running sandbox, or `None` when
/// the planner has nothing to do and none runs. Called under
/// [`lock_task_making`].
async fn converge<C: CloudDriver>(
    driver: &C,
    desired: &Desired,
    cloud: &CloudDesired,
    book: &SnapshotBook,
    task: &str,
) -> anyhow::Result<Option<String>> {
    let (record, found) = look(driver, desired, book, task).await?;
    let running = found
        .as_ref()
        .filter(|s| s.state == CloudState::Running)
        .map(|s| s.id.clone());
    let observed = seen(record, found);
    let ops = hermes_reconcilers::cloud::plan(desired, &observed);
    let Some(op) = ops.first() else {
        return Ok(running);
    };
    let action = match &op.action {
        Action::Cloud(action) => action,
        Action::Blocked => anyhow::bail!("{}: {}", op.target, op.cause),
        Action::Keep { .. } => anyhow::bail!("{}: {}; try again shortly", op.target, op.cause),
        Action::Sandbox(_)
        | Action::Proxy(_)
        | Action::Ssh(_)
        | Action::Instance(_)
        | Action::Pod(_) => {
            anyhow::bail!("{}: not a cloud operation: {}", op.target, op.action.verb())
        }
    };
    Ok(Some(
        apply_op(driver, desired, cloud, book, task, op, action)
            .await?
            .id,
    ))
}

/// Serializes, across hermes processes, what makes a backend's sandboxes
/// (a pass and an exec, two execs): under it the service is asked again
/// before anything is made, so that racing processes never make two
/// sandboxes for one task (a service without names, Vercel's, would keep
/// both). The lock is an exclusive `flock` on a 0600 file beside the
/// records, released when the guard drops (or the process dies).
async fn lock_task_making(book: &SnapshotBook) -> anyhow::Result<Flock<std::fs::File>> {
    let path = book.path().with_extension("lock");
    tokio::task::spawn_blocking(move || {
        crate::fsio::lock_exclusive(&path)
            .with_context(|| format!("cannot lock {}", path.display()))
    })
    .await?
}

/// What a pass sees of the cloud backend: `None` off the clouds or while
/// a credential is missing (the plan then blocks on it without asking the
/// service); the error when no driver could be made, which the plan shows
/// as a blocked sandbox.
pub async fn observe(
    home: &crate::home::Home,
    desired: &Desired,
    env: &HostEnv,
) -> (Option<CloudObserved>, Option<DriverError>) {
    let Some(cloud) = &desired.cloud else {
        return (None, None);
    };
    if cloud.credentials.is_err() {
        return (None, None);
    }
    let book = SnapshotBook::new(home.root(), cloud.backend);
    let seen = match Driver::new(cloud.backend, env, home_dir(env).as_deref()) {
        Ok(driver) => Ok(observe_cloud(&driver, desired, &book).await),
        Err(e) => Err(e),
    };
    match seen {
        // A service that did not answer is an error of the pass, as an
        // engine that does not answer is.
        Ok(CloudObserved::Unavailable { reason }) => (
            Some(CloudObserved::Unavailable {
                reason: reason.clone(),
            }),
            Some(DriverError::Refused {
                backend: cloud.backend,
                reason,
            }),
        ),
        Ok(seen) => (Some(seen), None),
        Err(e) => (
            Some(CloudObserved::Unavailable {
                reason: e.to_string(),
            }),
            Some(e),
        ),
    }
}

/// Carries out the plan's cloud operations with the backend's driver.
pub async fn apply(
    home: &crate::home::Home,
    desired: &Desired,
    env: &HostEnv,
    plan: &Plan<Action>,
    verbose: bool,
) -> Applied {
    let Some(cloud) = &desired.cloud else {
        return Applied::default();
    };
    let ops = Families::of(&plan.ops).cloud;
    if ops.is_empty() {
        return Applied::default();
    }
    let book = SnapshotBook::new(home.root(), cloud.backend);
    load_placeholders(home);
    match Driver::new(cloud.backend, env, home_dir(env).as_deref()) {
        Ok(driver) => apply_cloud(&driver, desired, plan, &book, verbose).await,
        Err(e) => {
            let mut applied = Applied::default();
            for (op, _) in ops {
                applied.record(
                    op,
                    Instant::now(),
                    Err(ApplyError::backend(e.clone())),
                    verbose,
                );
            }
            applied
        }
    }
}

/// The user's home directory (where `~/.modal.toml` lives).
pub fn home_dir(env: &HostEnv) -> Option<std::path::PathBuf> {
    env.process.get("HOME").map(std::path::PathBuf::from)
}

/// The cloud backend's sandbox of the default task, as the service reports
/// it (only looked up), with the snapshot recorded for the task: `-` and
/// `suspended` when only a snapshot is left. Nothing at all: no row.
async fn list_cloud(
    home: &crate::home::Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<crate::listing::SandboxList> {
    let cloud = usable(desired)?;
    let env = crate::host::host_env(home)?;
    let (seen, error) = observe(home, desired, &env).await;
    if let Some(e) = error {
        return Err(e.into());
    }
    let mut rows = Vec::new();
    if let Some(CloudObserved::Seen { sandbox, snapshot }) = seen {
        let row = match sandbox {
            Some((id, state)) => Some((id, state.to_string())),
            None => snapshot
                .as_ref()
                .map(|_| ("-".to_string(), "suspended".to_string())),
        };
        if let Some((id, state)) = row {
            rows.push(crate::listing::CloudRow {
                id: (id != "-").then(|| id.clone()),
                name: id,
                backend: cloud.backend.to_string(),
                profile: desired.profile.clone(),
                task: hermes_model::desired::DEFAULT_TASK.to_string(),
                state,
                snapshot,
            });
        }
    }
    Ok(crate::listing::SandboxList::Cloud(rows))
}

/// A cloud backend (modal, daytona, vercel_sandbox): the sandbox on the
/// service, through its [`Driver`].
pub struct Cloud(pub Backend);

#[async_trait::async_trait]
impl crate::seam::Backend for Cloud {
    fn planner(&self) -> hermes_reconcilers::Planner {
        hermes_reconcilers::cloud::planner
    }

    async fn observe(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        observed: &mut Observed,
    ) -> Option<String> {
        let env = match crate::host::host_env(home) {
            Ok(env) => env,
            Err(e) => {
                let reason = crate::chain::Chain(&e).to_string();
                observed.cloud = Some(CloudObserved::Unavailable {
                    reason: reason.clone(),
                });
                return Some(reason);
            }
        };
        let (cloud, error) = observe(home, desired, &env).await;
        observed.cloud = cloud;
        error.map(|e| e.to_string())
    }

    async fn apply(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        plan: &hermes_reconcilers::HostPlan,
        verbose: bool,
    ) -> Applied {
        match crate::host::host_env(home) {
            Ok(env) => apply(home, desired, &env, plan, verbose).await,
            Err(e) => {
                tracing::warn!(error = %crate::chain::Chain(&e), "cannot read the environment for the cloud backend");
                Applied::default()
            }
        }
    }

    async fn exec_target(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<(crate::exec_target::ExecTarget, crate::exec_target::Values)> {
        let (sandbox, env) = executor(home, desired, which.task).await?;
        let values = crate::exec_target::Values {
            base: env,
            pinned: Vec::new(),
        };
        Ok((Box::new(sandbox), values))
    }

    async fn find(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        which: &crate::exec_target::Which<'_>,
    ) -> anyhow::Result<Option<crate::exec_target::ExecTarget>> {
        Ok(running_executor(home, desired, which.task)
            .await?
            .map(|s| Box::new(s) as crate::exec_target::ExecTarget))
    }

    async fn list(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
    ) -> anyhow::Result<crate::listing::SandboxList> {
        list_cloud(home, desired).await
    }

    /// The task's sandbox suspended, its filesystem kept.
    async fn down(
        &self,
        _home: &crate::home::Home,
        desired: &Desired,
        observed: &Observed,
    ) -> Vec<hermes_model::plan::Op<hermes_model::action::Action>> {
        hermes_reconcilers::cloud::down(desired, observed)
    }

    /// The shared sandbox suspended, keeping its filesystem.
    async fn end_session(
        &self,
        home: &crate::home::Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<crate::seam::Ending> {
        let backend = self.0;
        let Some(cloud) = &desired.cloud else {
            anyhow::bail!("the {backend} backend has no cloud settings");
        };
        if let Err(missing) = &cloud.credentials {
            anyhow::bail!(
                "{missing}: the {backend} backend needs it, in the environment or in .env"
            );
        }
        let mut observed = Observed::default();
        if let Some(e) = crate::seam::Backend::observe(self, home, desired, &mut observed).await {
            anyhow::bail!("{e}");
        }
        let ops = hermes_reconcilers::cloud::end_session(desired, &observed, session);
        Ok(crate::seam::Ending {
            plan: Plan::new(ops),
            engine: None,
        })
    }
}

#[async_trait::async_trait]
impl crate::exec_target::Target for hermes_backends::cloud::InSandbox<Driver> {
    /// A sandbox of its own per task: its home, which a restore from a
    /// snapshot brings back.
    fn cwd_state(
        &self,
        _home: &crate::home::Home,
        _desired: &Desired,
        _which: &crate::exec_target::Which<'_>,
    ) -> String {
        ".hermes-cwd".to_string()
    }

    fn jobs_dir(
        &self,
        _home: &crate::home::Home,
        _desired: &Desired,
        _which: &crate::exec_target::Which<'_>,
    ) -> String {
        ".hermes-background".to_string()
    }

    async fn exec(
        &self,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<ExecOutcome, crate::exec_target::ExecError> {
        use hermes_backends::exec::Executor;
        Executor::exec(self, req, io)
            .await
            .map_err(crate::exec_target::ExecError::backend)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::RefCell;
    use std::path::Path;

    use hermes_model::config::load;

    use super::*;

    /// A driver of calls recorded, answering from a script.
    #[derive(Debug, Default)]
    struct Scripted {
        found: Option<CloudSandbox>,
        /// Like Vercel: no names, found only by the id handed to `find`
        /// (any id it created is running).
        by_id: bool,
        created: RefCell<u32>,
        /// Creates from these snapshots fail.
        bad_snapshots: Vec<String>,
        suspend_to: Option<String>,
        /// What `find` answers from its second call on, when set: the
        /// service changed after the pass observed.
        later: Option<Option<CloudSandbox>>,
        calls: RefCell<Vec<String>>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failure(String);

    impl CloudDriver for Scripted {
        type Error = Failure;

        fn backend(&self) -> &'static str {
            "modal"
        }

        async fn find(
            &self,
            profile: &str,
            task: &str,
            known: Option<&str>,
        ) -> Result<Option<CloudSandbox>, Failure> {
            let first = !self.calls.borrow().iter().any(|c| c.starts_with("find "));
            self.calls
                .borrow_mut()
                .push(format!("find {profile}/{task} {}", known.unwrap_or("-")));
            if let (false, Some(later)) = (first, &self.later) {
                return Ok(later.clone());
            }
            if self.by_id {
                return Ok(known
                    .filter(|id| id.starts_with("sb-new"))
                    .map(|id| CloudSandbox {
                        id: id.into(),
                        state: CloudState::Running,
                    }));
            }
            Ok(self.found.clone())
        }

        async fn create(
            &self,
            spec: &CloudSpec,
            snapshot: Option<&str>,
        ) -> Result<CloudSandbox, Failure> {
            self.calls.borrow_mut().push(format!(
                "create {} from {}",
                spec.task,
                snapshot.unwrap_or(&spec.image)
            ));
            if snapshot.is_some_and(|s| self.bad_snapshots.iter().any(|b| b == s)) {
                return Err(Failure("image not found".into()));
            }
            let mut n = self.created.borrow_mut();
            *n += 1;
            Ok(CloudSandbox {
                id: if *n == 1 {
                    "sb-new".into()
                } else {
                    format!("sb-new{n}")
                },
                state: CloudState::Running,
            })
        }

        async fn resume(&self, id: &str) -> Result<CloudSandbox, Failure> {
            self.calls.borrow_mut().push(format!("resume {id}"));
            Ok(CloudSandbox {
                id: id.into(),
                state: CloudState::Running,
            })
        }

        async fn suspend(&self, id: &str) -> Result<Option<String>, Failure> {
            self.calls.borrow_mut().push(format!("suspend {id}"));
            Ok(self.suspend_to.clone())
        }

        async fn destroy(&self, id: &str) -> Result<(), Failure> {
            self.calls.borrow_mut().push(format!("destroy {id}"));
            Ok(())
        }

        async fn exec(
            &self,
            id: &str,
            req: &ExecRequest,
            _io: ExecIo<'_>,
        ) -> Result<ExecOutcome, Failure> {
            self.calls
                .borrow_mut()
                .push(format!("exec {id} {}", req.cmd.join(" ")));
            Ok(ExecOutcome {
                exit_code: 0,
                timed_out: false,
            })
        }

        async fn write_file(&self, _: &str, _: &str, _: &[u8]) -> Result<(), Failure> {
            Ok(())
        }

        async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>, Failure> {
            Ok(Vec::new())
        }
    }

    fn desired() -> Desired {
        let env = HostEnv {
            process: [
                ("MODAL_TOKEN_ID".to_string(), "a".to_string()),
                ("MODAL_TOKEN_SECRET".to_string(), "b".to_string()),
            ]
            .into(),
            ..HostEnv::default()
        };
        Desired::build(
            load("terminal:\n  backend: modal\n  modal_image: python:3.12\n")
                .unwrap()
                .config,
            "default",
            Path::new("/h"),
            &env,
        )
        .unwrap()
    }

    fn plan(desired: &Desired, seen: CloudObserved) -> Plan<Action> {
        let observed = Observed {
            cloud: Some(seen),
            ..Observed::default()
        };
        hermes_reconcilers::plan_all_with(
            desired,
            &observed,
            std::time::SystemTime::UNIX_EPOCH,
            hermes_reconcilers::cloud::planner,
        )
    }

    #[tokio::test]
    async fn a_dry_run_only_finds() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        book.record("default", "default", "im-1").unwrap();
        let driver = Scripted::default();
        let d = desired();
        let seen = observe_cloud(&driver, &d, &book).await;
        assert_eq!(
            seen,
            CloudObserved::Seen {
                sandbox: None,
                snapshot: Some("im-1".into())
            }
        );
        assert_eq!(*driver.calls.borrow(), ["find default/default -"]);
    }

    #[tokio::test]
    async fn a_snapshot_that_fails_to_restore_is_dropped_and_the_base_image_used_once() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        book.record("default", "default", "im-bad").unwrap();
        let driver = Scripted {
            bad_snapshots: vec!["im-bad".into()],
            ..Scripted::default()
        };
        let d = desired();
        let seen = observe_cloud(&driver, &d, &book).await;
        let applied = apply_cloud(&driver, &d, &plan(&d, seen), &book, false).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(
            *driver.calls.borrow(),
            [
                "find default/default -",
                // Under the lock, the service is asked again.
                "find default/default -",
                "create default from im-bad",
                "create default from python:3.12"
            ]
        );
        // The record is gone: the next pass creates from the base image.
        assert_eq!(book.get("default", "default").unwrap(), None);
    }

    #[tokio::test]
    async fn exec_resumes_a_stopped_sandbox_first_and_a_sessions_end_records_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        let driver = Scripted {
            found: Some(CloudSandbox {
                id: "sb-1".into(),
                state: CloudState::Stopped,
            }),
            suspend_to: Some("im-next".into()),
            ..Scripted::default()
        };
        let d = desired();
        let req = ExecRequest {
            cmd: vec!["true".into()],
            env: Vec::new(),
            cwd: None,
            timeout: std::time::Duration::from_secs(5),
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let io = ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        };
        exec_cloud(&driver, &d, &book, "t", &req, io).await.unwrap();
        assert_eq!(
            *driver.calls.borrow(),
            // Asked again under the lock before the resume.
            [
                "find default/t -",
                "find default/t -",
                "resume sb-1",
                "exec sb-1 true"
            ]
        );
        // A session's end, the sandbox running: planned (the suspend), then
        // carried out under the lock, the snapshot recorded for the next
        // session.
        let driver = Scripted {
            found: Some(CloudSandbox {
                id: "sb-1".into(),
                state: CloudState::Running,
            }),
            suspend_to: Some("im-next".into()),
            ..Scripted::default()
        };
        let applied = end_session(&driver, &d, &book).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(
            book.get("default", "default").unwrap().as_deref(),
            Some("im-next")
        );
        assert_eq!(book.sandbox("default", "default").unwrap(), None);
        assert_eq!(
            *driver.calls.borrow(),
            [
                "find default/default -",
                "find default/default -",
                "suspend sb-1"
            ]
        );
    }

    /// `hermes session end` on the cloud: observe, plan the end, carry
    /// the plan out.
    async fn end_session(driver: &Scripted, d: &Desired, book: &SnapshotBook) -> Applied {
        let observed = Observed {
            cloud: Some(observe_cloud(driver, d, book).await),
            ..Observed::default()
        };
        let plan = Plan::new(hermes_reconcilers::cloud::end_session(d, &observed, "s1"));
        apply_cloud(driver, d, &plan, book, false).await
    }

    /// A command in the task's sandbox, as `hermes exec` runs it: made
    /// ready, then the driver's exec.
    async fn exec_cloud<C: CloudDriver>(
        driver: &C,
        desired: &Desired,
        book: &SnapshotBook,
        task: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> anyhow::Result<ExecOutcome> {
        let id = ready(driver, desired, book, task).await?;
        Ok(driver.exec(&id, req, io).await?)
    }

    fn exec_req() -> ExecRequest {
        ExecRequest {
            cmd: vec!["true".into()],
            env: Vec::new(),
            cwd: None,
            timeout: std::time::Duration::from_secs(5),
        }
    }

    async fn exec_once(driver: &Scripted, d: &Desired, book: &SnapshotBook) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let io = ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        };
        exec_cloud(driver, d, book, "default", &exec_req(), io)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_sandbox_found_only_by_its_id_is_created_once_for_every_pass_and_exec() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::VercelSandbox);
        let driver = Scripted {
            by_id: true,
            suspend_to: Some("snap-1".into()),
            ..Scripted::default()
        };
        let d = desired();
        let seen = observe_cloud(&driver, &d, &book).await;
        let applied = apply_cloud(&driver, &d, &plan(&d, seen), &book, false).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(
            book.sandbox("default", "default").unwrap().as_deref(),
            Some("sb-new")
        );
        // The next pass is converged; two execs use the same sandbox.
        let seen = observe_cloud(&driver, &d, &book).await;
        assert!(plan(&d, seen).ops.is_empty());
        exec_once(&driver, &d, &book).await;
        exec_once(&driver, &d, &book).await;
        assert_eq!(*driver.created.borrow(), 1);
        assert_eq!(
            *driver.calls.borrow(),
            [
                "find default/default -",
                // Under the lock, the service is asked again.
                "find default/default -",
                "create default from python:3.12",
                "find default/default sb-new",
                "find default/default sb-new",
                "exec sb-new true",
                "find default/default sb-new",
                "exec sb-new true",
            ]
        );
        // A session's end snapshots it and forgets it; the next exec
        // restores the snapshot into one new sandbox, recorded in turn.
        let applied = end_session(&driver, &d, &book).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(book.sandbox("default", "default").unwrap(), None);
        exec_once(&driver, &d, &book).await;
        exec_once(&driver, &d, &book).await;
        assert_eq!(*driver.created.borrow(), 2);
        assert_eq!(
            book.entry("default", "default").unwrap(),
            hermes_model::cloud::TaskRecord {
                snapshot: Some("snap-1".into()),
                sandbox: Some("sb-new2".into()),
            }
        );
    }

    #[tokio::test]
    async fn a_dead_sandbox_is_replaced_and_the_new_one_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        book.record_sandbox("default", "default", "sb-dead")
            .unwrap();
        let driver = Scripted {
            found: Some(CloudSandbox {
                id: "sb-dead".into(),
                state: CloudState::Dead,
            }),
            ..Scripted::default()
        };
        let d = desired();
        let seen = observe_cloud(&driver, &d, &book).await;
        let applied = apply_cloud(&driver, &d, &plan(&d, seen), &book, false).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(
            book.sandbox("default", "default").unwrap().as_deref(),
            Some("sb-new")
        );
        assert_eq!(
            *driver.calls.borrow(),
            [
                "find default/default sb-dead",
                // Under the lock, the service is asked again.
                "find default/default sb-dead",
                "destroy sb-dead",
                "create default from python:3.12"
            ]
        );
        // A dead sandbox at a session's end: nothing left to keep, nothing
        // planned, nothing asked of the service but a find.
        let before = driver.calls.borrow().len();
        let applied = end_session(&driver, &d, &book).await;
        assert_eq!((applied.done, applied.failed), (0, 0));
        assert_eq!(
            driver.calls.borrow()[before..],
            ["find default/default sb-new"]
        );
    }

    #[tokio::test]
    async fn a_service_changed_under_the_lock_stops_the_planned_operation() {
        let d = desired();
        // Planned: resume the stopped sb-1. Under the lock the service
        // reports it dead: no resume (nor the recreate a new plan would
        // make); the next pass plans again.
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        let driver = Scripted {
            found: Some(CloudSandbox {
                id: "sb-1".into(),
                state: CloudState::Stopped,
            }),
            later: Some(Some(CloudSandbox {
                id: "sb-1".into(),
                state: CloudState::Dead,
            })),
            ..Scripted::default()
        };
        let seen = observe_cloud(&driver, &d, &book).await;
        let planned = plan(&d, seen);
        assert_eq!(
            planned.ops[0].action,
            Action::Cloud(CloudAction::Resume { id: "sb-1".into() })
        );
        let applied = apply_cloud(&driver, &d, &planned, &book, false).await;
        assert_eq!((applied.done, applied.failed), (0, 1));
        let error = applied.failures[0].1.to_string();
        assert!(
            error.contains("the service changed since the plan (it now reports sb-1 dead)")
                && error.contains("the next pass plans again"),
            "{error}"
        );
        assert_eq!(
            *driver.calls.borrow(),
            ["find default/default -", "find default/default -"]
        );
        // Planned: create. Under the lock an exec has made one: nothing is
        // created, and the next pass, seeing it run, is converged.
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        let driver = Scripted {
            later: Some(Some(CloudSandbox {
                id: "sb-exec".into(),
                state: CloudState::Running,
            })),
            ..Scripted::default()
        };
        let seen = observe_cloud(&driver, &d, &book).await;
        let planned = plan(&d, seen);
        let applied = apply_cloud(&driver, &d, &planned, &book, false).await;
        assert_eq!((applied.done, applied.failed), (0, 1));
        assert_eq!(*driver.created.borrow(), 0);
        let seen = observe_cloud(&driver, &d, &book).await;
        assert!(plan(&d, seen).ops.is_empty());
        // Unchanged under the lock: the planned operation is carried out.
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Modal);
        let driver = Scripted {
            found: Some(CloudSandbox {
                id: "sb-1".into(),
                state: CloudState::Stopped,
            }),
            ..Scripted::default()
        };
        let seen = observe_cloud(&driver, &d, &book).await;
        let applied = apply_cloud(&driver, &d, &plan(&d, seen), &book, false).await;
        assert_eq!((applied.done, applied.failed), (1, 0));
        assert_eq!(driver.calls.borrow().last().unwrap(), "resume sb-1");
    }

    #[cfg(not(feature = "modal"))]
    #[tokio::test]
    async fn a_backend_without_its_driver_is_an_error_naming_it() {
        let e = Driver::new(Backend::Modal, &HostEnv::default(), None).unwrap_err();
        assert_eq!(e.to_string(), "backend modal is not built in this binary");
    }
}
