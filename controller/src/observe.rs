//! What a pass sees of this host: the labelled containers (only the
//! profile's inspected, and the process counts the plan reads), the
//! activity records, the proxy, the legacy and disk-image state, and the
//! optional engine of a pass that does not need Docker.

use anyhow::Context;
use hermes_backends::docker::Engine;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;

use crate::activity::Activity;
use crate::home::Home;

/// Everything there is to see: the labelled containers (one list call,
/// plus an inspect for each that ever started and a `top` for each running
/// one) and the activity records.
pub async fn observe(engine: &Engine, home: &Home) -> anyhow::Result<Observed> {
    let containers = engine.observe().await?;
    with_activity(containers, home).await
}

/// How long a pass that does not need Docker waits for an engine that may
/// not exist.
const OPTIONAL_ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The engine of a pass that does not need one ([`needs_docker`]):
/// containers (and a proxy-only network) left from an earlier Docker
/// config are still looked at when an engine answers, so they are
/// reported (or pruned), never silently forgotten; no engine there is
/// nothing to look at, and no error.
pub async fn optional_engine(home: &Home) -> Option<Engine> {
    match tokio::time::timeout(OPTIONAL_ENGINE_WAIT, Engine::connect()).await {
        Ok(Ok(engine)) => Some(engine.for_home(home.scope())),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "no engine; no containers to look at");
            None
        }
        Err(_) => {
            tracing::debug!("the engine did not answer in time; no containers to look at");
            None
        }
    }
}

/// What a pass planning `desired` sees: as [`observe`] (with the
/// proxy-only network and the sandboxes' disk images mounted under this
/// home), but only its own profile's containers inspected, and the process
/// counts (a `top` each, the engine's slowest read) only of the containers
/// whose count the plan reads ([`hermes_reconcilers::processes_needed`]).
pub async fn observe_for(
    engine: &Engine,
    home: &Home,
    desired: &Desired,
) -> anyhow::Result<Observed> {
    // A pass reads the times of its own profile's containers only.
    let profile = hermes_model::sandbox::sanitize(&desired.profile);
    let containers = engine.observe_profile(&profile).await?;
    let mut observed = with_activity(containers, home).await?;
    merge_exec_activity(engine, &profile, &mut observed).await;
    observed.legacy = crate::migrate::observe_legacy(home, desired);
    let pool = (desired.pool_size() > 0).then(|| desired.pool_member(0));
    let images: std::collections::BTreeSet<&str> = desired
        .sandboxes
        .iter()
        .chain(pool.as_ref())
        .map(|s| s.image.as_str())
        .collect();
    for image in images {
        // An engine that cannot say is no cost to print.
        if let Ok(false) = engine.has_image(image).await {
            observed.missing_images.insert(image.to_string());
        }
    }
    // Asked only when a sandbox names a runtime (`docker_runtime`).
    if desired
        .sandboxes
        .iter()
        .chain(pool.as_ref())
        .any(|s| s.runtime.is_some())
    {
        observed.runtimes = engine.runtimes().await.ok();
    }
    // Whatever the backend: an image left by an earlier Docker config is
    // released as well.
    let dir = hermes_model::sandbox::sandbox_dir(&desired.config, &desired.home);
    observed.disks = crate::disk::observe(&dir, &desired.profile, engine).await;
    observed.proxy.network =
        crate::egress::pass::observe_network(home, engine, &desired.config).await;
    let needed = hermes_reconcilers::processes_needed(desired, &observed);
    if !needed.is_empty() {
        let ids: Vec<&str> = needed.iter().map(String::as_str).collect();
        engine.count_processes(&mut observed.containers, &ids).await;
    }
    Ok(observed)
}

/// How far back a pass asks the engine for the commands run in the
/// sandboxes (the engine holds fewer events than this in practice).
const EXEC_EVENTS_WINDOW_SECONDS: i64 = 7 * 86_400;

/// Adds to the activity records the commands the engine saw start or end
/// in the profile's containers, whoever ran them (Hermes Agent's `docker
/// exec` leaves no record of hermes's): the later of the two times counts.
/// An engine that cannot replay its events leaves the records as they are.
async fn merge_exec_activity(engine: &Engine, profile: &str, observed: &mut Observed) {
    let at = std::time::SystemTime::now();
    let now = hermes_reconcilers::unix_seconds(at);
    match engine
        .exec_activity(profile, now - EXEC_EVENTS_WINDOW_SECONDS, at)
        .await
    {
        Ok(seen) => {
            for (name, at) in seen {
                let record = observed.activity.entry(name).or_insert(at);
                *record = (*record).max(at);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the engine's exec events; idleness counts hermes's own commands only");
        }
    }
}

async fn with_activity(
    containers: Vec<hermes_model::observed::ObservedContainer>,
    home: &Home,
) -> anyhow::Result<Observed> {
    let activity = Activity::new(home)
        .read_all()
        .context("reading the sandboxes' activity records")?;
    let mut containers = containers;
    crate::migrate::read_adoptions(home.root(), &mut containers);
    Ok(Observed {
        containers,
        activity,
        proxy: crate::egress::pass::observe(home).await,
        pool_ready: crate::pool::read_ready(home),
        pool_names_held: crate::pool::names_held(home),
        ..Observed::default()
    })
}
