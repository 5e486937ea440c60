//! `hermes reconcile [--dry-run]`: one pass of the loop — load, observe,
//! plan, then print or apply.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_model::config::Backend;
use hermes_model::observed::Observed;

use hermes_backends::docker::Engine;

use crate::activity::Activity;
use crate::apply::apply;
use crate::cli::{Output, ReconcileArgs};
use crate::commands::{load_desired, observe};
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, args: &ReconcileArgs) -> anyhow::Result<ExitCode> {
    let desired = load_desired(home, profile)?;
    // The engine is only needed where there are containers to converge.
    let engine = if desired.backend() == Backend::Docker {
        Some(Engine::connect().await?)
    } else {
        None
    };
    let observed = match &engine {
        Some(engine) => observe(engine, home).await?,
        None => Observed::default(),
    };
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
    let Some(engine) = engine else {
        // No engine: only refusals can be pending, and a refusal fails the pass.
        return Ok(if plan.summary().blocked > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    };
    if !plan.is_pending() {
        return Ok(ExitCode::SUCCESS);
    }
    let applied = apply(&engine, &plan, args.output == Output::Text).await;
    // Observe again: what the host looks like now, not what we hoped.
    let after = observe(&engine, home).await?;
    forget_removed(home, &after);
    let remaining = hermes_reconcilers::plan_all(&desired, &after, SystemTime::now());
    if args.output == Output::Text {
        if remaining.is_pending() {
            println!("Still pending after this pass:\n{remaining}");
        } else {
            println!("The host is converged.");
        }
    }
    Ok(if applied.failed > 0 || remaining.summary().blocked > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Drops the activity records of containers that no longer exist. A stale
/// record would do no harm (a new container counts from its own start), but
/// records should not pile up.
fn forget_removed(home: &Home, observed: &Observed) {
    let activity = Activity::new(home);
    for name in observed.activity.keys() {
        if !observed.containers.iter().any(|c| &c.name == name) {
            if let Err(e) = activity.forget(name) {
                tracing::debug!(container = %name, error = %e, "cannot drop an activity record");
            }
        }
    }
}
