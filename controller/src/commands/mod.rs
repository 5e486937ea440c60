//! One module per top-level subcommand, and what several of them share.

pub mod config;
pub mod exec;
pub mod reconcile;
pub mod sandbox;

use anyhow::Context;
use hermes_backends::docker::Engine;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::Observed;

use crate::activity::Activity;
use crate::home::Home;

/// Everything a pass sees: the labelled containers (one list call, plus
/// inspect and top where the plan needs them) and the activity records.
pub async fn observe(engine: &Engine, home: &Home) -> anyhow::Result<Observed> {
    let containers = engine.observe().await?;
    let activity = Activity::new(home)
        .read_all()
        .context("reading the sandboxes' activity records")?;
    Ok(Observed {
        containers,
        activity,
    })
}

/// Loads config.yaml (errors with file, line and key), prints its warnings
/// and builds the desired state of `profile`.
pub fn load_desired(home: &Home, profile: &str) -> anyhow::Result<Desired> {
    let file = home.config().display().to_string();
    let text = config::read_config_text(home)?.unwrap_or_default();
    let loaded =
        hermes_model::config::load(&text).map_err(|e| anyhow::anyhow!("{}", e.render(&file)))?;
    for w in &loaded.warnings {
        eprintln!("warning: {}", w.render(&file));
    }
    let desired = Desired::build(loaded.config, profile, home.root(), &host_env(home)?)?;
    for w in &desired.warnings {
        eprintln!("warning: {w}");
    }
    Ok(desired)
}

/// The environment `docker_forward_env` may read: this process's, then `.env`.
fn host_env(home: &Home) -> anyhow::Result<HostEnv> {
    Ok(HostEnv {
        process: std::env::vars().collect(),
        dotenv: hermes_model::dotenv::parse(&config::read_env_text(home)?),
    })
}
