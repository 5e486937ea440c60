//! The labelled containers the benchmarks need present, created through
//! the engine exactly as hermes creates them (same labels, a spec hash),
//! all named with the run's unique prefix, and removed by that prefix at
//! the end: other profiles' warm sandboxes ([`specs`]) and session
//! sandboxes ([`sessions`]), started and killed when they must be exited.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use bollard::query_parameters::ListContainersOptionsBuilder;
use futures_util::{StreamExt, TryStreamExt};
use hermes_backends::docker::{CreateOutcome, Engine};
use hermes_model::config::Config;
use hermes_model::desired::{DEFAULT_TASK, Desired, HostEnv};
use hermes_model::sandbox::{LABEL_AGENT, SandboxKey, SandboxSpec};

/// How many tasks each other profile has in the fleet.
const TASKS_PER_PROFILE: usize = 5;

/// `count` sandboxes of other profiles, as hermes would make them for
/// those profiles: their warm `default` task and on-demand tasks `t1`…`t4`,
/// profiles `<profile>-p000`, `<profile>-p001`, …, each of its own home
/// under `root` (`<root>/profiles/NAME`). The planners never look
/// at another profile's containers, so they leave the no-op dry-run a no-op
/// (the active profile's own containers left in `created` would be stuck
/// creations to remove). Every name starts with `prefix`.
pub fn specs(
    config: &Config,
    root: &Path,
    profile: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Vec<SandboxSpec>> {
    let mut out = Vec::with_capacity(count);
    for p in 0..count.div_ceil(TASKS_PER_PROFILE) {
        let other = format!("{profile}-p{p:03}");
        let home = root.join("profiles").join(&other);
        let desired = Desired::build(config.clone(), &other, &home, &HostEnv::default())
            .map_err(|e| anyhow::anyhow!("profile {other}: {e}"))?;
        for t in 0..TASKS_PER_PROFILE {
            if out.len() == count {
                break;
            }
            let task = if t == 0 {
                DEFAULT_TASK.to_string()
            } else {
                format!("t{t}")
            };
            let spec = desired.sandbox_for_task(&task);
            anyhow::ensure!(
                spec.name.starts_with(prefix),
                "container name {} does not start with the run's prefix {prefix}",
                spec.name
            );
            out.push(spec);
        }
    }
    Ok(out)
}

/// How many tasks the session sandboxes of [`sessions`] are spread over.
const SESSION_TASKS: usize = 10;

/// `count` session sandboxes of `profile`, as `hermes exec --session`
/// makes them (labels `hermes-agent`, `hermes-profile`, `hermes-task-id`,
/// `hermes-session`, `hermes-spec-hash`; tmpfs `/workspace` and `/root`):
/// tasks `t0`…`t9`, sessions `s0000`, `s0001`, … Every name starts with
/// `prefix`.
pub fn sessions(
    config: &Config,
    home: &Path,
    profile: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Vec<SandboxSpec>> {
    let desired = Desired::build(config.clone(), profile, home, &HostEnv::default())
        .map_err(|e| anyhow::anyhow!("profile {profile}: {e}"))?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let task = format!("t{}", i % SESSION_TASKS);
        let session = format!("s{i:04}");
        let spec = desired.sandbox(SandboxKey::session(profile, &task, &session));
        anyhow::ensure!(
            spec.name.starts_with(prefix),
            "container name {} does not start with the run's prefix {prefix}",
            spec.name
        );
        out.push(spec);
    }
    Ok(out)
}

/// Creates every spec (not started), `concurrency` at a time, and returns
/// their ids in the order of `specs`. A name that already exists is an
/// error: the prefix is meant to be unique.
pub async fn create(
    engine: &Engine,
    specs: &[SandboxSpec],
    concurrency: usize,
) -> anyhow::Result<Vec<String>> {
    let total = specs.len();
    let mut ids = Vec::with_capacity(total);
    let mut creating = futures_util::stream::iter(specs.iter().enumerate())
        .map(|(i, spec)| async move {
            match engine.create(spec).await {
                Ok(CreateOutcome::Created { id }) => Ok((i, id)),
                Ok(CreateOutcome::AlreadyExists) => {
                    anyhow::bail!("a container named {} already exists", spec.name)
                }
                Err(e) => Err(anyhow::Error::new(e).context(format!("creating {}", spec.name))),
            }
        })
        .buffer_unordered(concurrency.max(1));
    while let Some(result) = creating.next().await {
        ids.push(result?);
        let done = ids.len();
        if done % 100 == 0 || done == total {
            eprintln!("  created {done}/{total}");
        }
    }
    ids.sort_unstable();
    Ok(ids.into_iter().map(|(_, id)| id).collect())
}

/// Starts each of these containers and kills it (SIGKILL) right after, so
/// that it is exited, `concurrency` at a time: no more than that many run
/// at once. The engine reports them exited a moment later.
pub async fn run_once(engine: &Engine, ids: &[String], concurrency: usize) -> anyhow::Result<()> {
    each(ids, concurrency, "started and killed", |id| async move {
        engine
            .start(id)
            .await
            .with_context(|| format!("starting {id}"))?;
        engine
            .docker()
            .kill_container(id, None::<bollard::query_parameters::KillContainerOptions>)
            .await
            .with_context(|| format!("killing {id}"))
    })
    .await
}

/// Runs `op` on every id, `concurrency` at a time, saying every 100 how
/// far it got.
async fn each<'a, F, Fut>(
    ids: &'a [String],
    concurrency: usize,
    done_verb: &str,
    op: F,
) -> anyhow::Result<()>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let total = ids.len();
    let mut running = futures_util::stream::iter(ids)
        .map(|id| op(id.as_str()))
        .buffer_unordered(concurrency.max(1));
    let mut done = 0;
    while let Some(result) = running.next().await {
        result?;
        done += 1;
        if done % 100 == 0 || done == total {
            eprintln!("  {done_verb} {done}/{total}");
        }
    }
    Ok(())
}

/// The labelled containers whose name starts with `prefix`, as the list
/// call shows them (id, names, labels, state).
pub async fn summaries(
    engine: &Engine,
    prefix: &str,
) -> anyhow::Result<Vec<bollard::models::ContainerSummary>> {
    let filters = HashMap::from([
        ("label", vec![format!("{LABEL_AGENT}=1")]),
        ("name", vec![prefix.to_string()]),
    ]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let summaries = engine
        .docker()
        .list_containers(Some(options))
        .await
        .context("listing the benchmark's containers")?;
    // The engine's name filter matches anywhere in the name: keep only the
    // names that start with the prefix.
    Ok(summaries
        .into_iter()
        .filter(|s| {
            s.names
                .iter()
                .flatten()
                .any(|n| n.trim_start_matches('/').starts_with(prefix))
        })
        .collect())
}

/// The ids of the labelled containers whose name starts with `prefix`.
pub async fn list(engine: &Engine, prefix: &str) -> anyhow::Result<Vec<String>> {
    Ok(summaries(engine, prefix)
        .await?
        .into_iter()
        .filter_map(|s| s.id)
        .collect())
}

/// Removes every labelled container whose name starts with `prefix`,
/// `concurrency` at a time. Returns how many went.
pub async fn remove_all(
    engine: &Engine,
    prefix: &str,
    concurrency: usize,
) -> anyhow::Result<usize> {
    let ids = list(engine, prefix).await?;
    remove(engine, ids, concurrency).await
}

/// Removes these containers, `concurrency` at a time. Returns how many.
pub async fn remove(
    engine: &Engine,
    ids: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<usize> {
    let count = ids.len();
    futures_util::stream::iter(ids)
        .map(|id| async move { engine.remove(&id).await.map(|_| ()) })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await
        .context("removing the benchmark's containers")?;
    Ok(count)
}
