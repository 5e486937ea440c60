//! The warm pool's host side (`terminal.warm_pool`; its plan is
//! [`hermes_reconcilers::pool`]):
//!
//! - a member is made ready by its plan's operation ([`warm`]): created,
//!   started, and a first command (`true`) run through its runner; only
//!   then is it recorded ready, in `run/pool/<name>` (the container's id
//!   and the start it answered in);
//! - a new session's first command claims one ([`claim`]): under the
//!   pool's lock (`run/locks/pool-<profile>.lock`, one claim at a time
//!   across every hermes process on the host), a ready member of the
//!   current spec is renamed to the session's container name, its
//!   activity recorded first, its record dropped. Labels cannot change
//!   after create: the name is the claim ([`ObservedContainer::claimed_by`]).
//!   A claimer killed at any point leaves either an unclaimed member or
//!   the session's sandbox, never a member two sessions hold: the engine's
//!   rename is one step, and the lock goes with the process that held it.
//!
//! A claimed member keeps the runner's directory of the name it was made
//! with (a bind fixed at create); [`spec_of`] says where it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hermes_backends::docker::{Container, DockerError, Engine};
use hermes_backends::exec::{ExecIo, ExecRequest, Executor};
use hermes_model::desired::Desired;
use hermes_model::observed::{ObservedContainer, PoolReady};
use hermes_model::sandbox::{LABEL_POOL, SandboxSpec, sanitize};

use crate::activity::Activity;
use crate::home::Home;

/// How long a member's first command may take.
const FIRST_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The most ready records read.
const MAX_RECORDS: usize = 1024;

/// `run/pool/` under the home: the ready records.
fn records_dir(home: &Path) -> PathBuf {
    home.join("run").join("pool")
}

/// The ready records of this home, by member name (bounded; one that
/// does not parse is left out).
pub fn read_ready(home: &Home) -> BTreeMap<String, PoolReady> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(records_dir(home.root())) else {
        return out;
    };
    for entry in entries.flatten().take(MAX_RECORDS) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if sanitize(name) != name {
            continue;
        }
        let Ok(Some(bytes)) = crate::fsio::read_bounded(&entry.path(), 256) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut words = text.split_ascii_whitespace();
        let (Some(id), Some(started)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(started_at) = started.parse() else {
            continue;
        };
        out.insert(
            name.to_string(),
            PoolReady {
                id: id.to_string(),
                started_at,
            },
        );
    }
    out
}

/// The warm-pool member names that have a runner directory under this
/// home (bounded).
pub fn names_held(home: &Home) -> std::collections::BTreeSet<String> {
    let dir = hermes_model::sandbox::runner_dir(home.root(), "x");
    let Some(dir) = dir.parent() else {
        return Default::default();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Default::default();
    };
    entries
        .flatten()
        .take(MAX_RECORDS * 4)
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("hermes_pool-"))
        .collect()
}

/// Drops the ready record of member `name` (claimed, or removed).
pub fn forget(home: &Path, name: &str) {
    if sanitize(name) != name {
        return;
    }
    match std::fs::remove_file(records_dir(home).join(name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::debug!(member = name, error = %e, "cannot drop a pool member's record");
        }
        _ => {}
    }
}

/// Runs a first command in the member `id` of `spec` just started, and
/// records it ready once it answered.
pub async fn warm(engine: &Engine, spec: &SandboxSpec, id: &str) -> Result<(), DockerError> {
    let container = Container {
        engine: engine.clone(),
        id: id.to_string(),
        runner: spec.runner_dir.clone(),
    };
    let req = ExecRequest {
        cmd: vec!["true".to_string()],
        env: Vec::new(),
        cwd: None,
        timeout: FIRST_COMMAND_TIMEOUT,
    };
    let (mut out, mut err) = (tokio::io::sink(), tokio::io::sink());
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = container.exec(&req, io).await?;
    if outcome.exit_code != 0 {
        return Err(DockerError::Gone {
            container: spec.name.clone(),
            reason: format!("its first command exited {}: not ready", outcome.exit_code),
        });
    }
    let found = engine
        .find_named(&spec.name)
        .await?
        .ok_or_else(|| DockerError::Gone {
            container: spec.name.clone(),
            reason: "removed as it was made ready".to_string(),
        })?;
    let started = found.started_at.unwrap_or(0);
    let dir = records_dir(&spec.home);
    let failed = |e: std::io::Error| DockerError::HostFiles {
        container: spec.name.clone(),
        message: format!("cannot record it ready under run/pool: {e}"),
    };
    crate::fsio::ensure_dir(&dir, 0o700).map_err(failed)?;
    crate::fsio::write_atomic(
        &dir.join(&spec.name),
        format!("{} {started}\n", found.id).as_bytes(),
        0o600,
        true,
    )
    .map_err(failed)
}

/// The pool's lock of `profile`, held until dropped.
async fn lock(home: &Home, profile: &str) -> std::io::Result<crate::sandbox_locks::Held> {
    let dir = home.root().join("run").join("locks");
    crate::fsio::ensure_dir(&dir, 0o700)?;
    let lock = dir.join(format!("pool-{}.lock", sanitize(profile)));
    tokio::task::spawn_blocking(move || crate::fsio::lock_exclusive(&lock))
        .await
        .map_err(std::io::Error::other)?
}

/// For the plan's removal of member `id`: the pool's lock, held until
/// dropped, when `id` is still an unclaimed member; `None` when a session
/// claimed it since the plan was made (it is that session's sandbox now,
/// not the plan's to remove) or it is gone.
pub async fn hold_unclaimed(
    engine: &Engine,
    home: &Home,
    profile: &str,
    id: &str,
) -> Result<Option<crate::sandbox_locks::Held>, DockerError> {
    let held = lock(home, profile)
        .await
        .map_err(|e| DockerError::HostFiles {
            container: id.to_string(),
            message: format!("cannot take the warm pool's lock: {e}"),
        })?;
    match engine.find_named(id).await? {
        Some(c) if c.is_unclaimed_pool_member() => Ok(Some(held)),
        _ => Ok(None),
    }
}

/// Claims a ready member of the current pool for the session sandbox of
/// `spec`: the member renamed to its name, as the engine sees it then;
/// `None` when no member is ready (the caller makes the sandbox).
pub async fn claim(
    engine: &Engine,
    home: &Home,
    desired: &Desired,
    spec: &SandboxSpec,
) -> anyhow::Result<Option<ObservedContainer>> {
    if !desired.pool_serves(&spec.key) {
        return Ok(None);
    }
    let _held = lock(home, &desired.profile).await?;
    let wanted = desired.pool_member(0);
    let ready = read_ready(home);
    let members = engine.pool_members(&sanitize(&desired.profile)).await?;
    let Some(member) = members.into_iter().find(|c| {
        c.spec_hash() == Some(wanted.hash()) && ready.get(&c.name).is_some_and(|r| r.id == c.id)
    }) else {
        return Ok(None);
    };
    // Its activity first: a claimer killed after the rename leaves a
    // session sandbox used now, not one idle since the pool made it.
    if let Err(e) = Activity::new(home).touch(&spec.name) {
        tracing::warn!(container = %spec.name, error = %e, "cannot record the sandbox's activity");
    }
    match engine.rename(&member.id, &spec.name).await {
        Ok(()) => {}
        // Removed since the listing (the plan's lock is not held over
        // its whole pass): the session's sandbox is made instead.
        Err(DockerError::Gone { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    forget(home.root(), &member.name);
    tracing::debug!(member = %member.name, session = ?spec.key.session, "claimed a warm-pool member");
    Ok(engine.find_named(&spec.name).await?)
}

/// The spec a container is compared with and whose runner directory it
/// uses: a claimed member's is the pool's, under the name it was made
/// with; any other's is `spec`.
pub fn spec_of(desired: &Desired, found: &ObservedContainer, spec: &SandboxSpec) -> SandboxSpec {
    match found.label(LABEL_POOL) {
        Some(member) if found.claimed_by().is_some() => desired.pool_member_named(member),
        _ => spec.clone(),
    }
}
