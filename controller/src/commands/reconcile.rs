//! `hermes reconcile [--dry-run]`: one pass of the loop — load, observe,
//! plan, then print or apply.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_model::config::{self, Backend};
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::Observed;

use crate::cli::{Output, ReconcileArgs};
use crate::commands::config::{read_config_text, read_env_text};
use crate::home::Home;

pub fn run(home: &Home, profile: &str, args: &ReconcileArgs) -> anyhow::Result<ExitCode> {
    let file = home.config().display().to_string();
    let text = read_config_text(home)?.unwrap_or_default();
    let loaded = config::load(&text).map_err(|e| anyhow::anyhow!("{}", e.render(&file)))?;
    for w in &loaded.warnings {
        eprintln!("warning: {}", w.render(&file));
    }
    let desired = Desired::build(loaded.config, profile, home.root(), &host_env(home)?)?;
    for w in &desired.warnings {
        eprintln!("warning: {w}");
    }
    if desired.backend() == Backend::Docker {
        anyhow::bail!("the docker backend is not wired into reconcile in this build");
    }
    let observed = Observed::default();
    let plan = hermes_reconcilers::plan_all(&desired, &observed, SystemTime::now());
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&plan.to_json())?),
        Output::Text => println!("{plan}"),
    }
    if args.dry_run {
        return Ok(if plan.is_pending() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }
    // Blocked operations are the only ones a pass without a sandbox backend
    // can produce; they are refusals, and a refusal is a failed pass.
    if plan.summary().blocked > 0 {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The environment `docker_forward_env` may read: this process's, then `.env`.
pub fn host_env(home: &Home) -> anyhow::Result<HostEnv> {
    Ok(HostEnv {
        process: std::env::vars().collect(),
        dotenv: hermes_model::dotenv::parse(&read_env_text(home)?),
    })
}
