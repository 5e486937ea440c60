//! `hermes reconcile [--dry-run] [--prune]`: one pass of the loop — load,
//! observe, plan, then print or apply.
//!
//! A config that cannot be used (invalid, unreadable, empty) is reported
//! and the pass goes on with the last good one, removing nothing; the exit
//! code is then 1. A dry run stops at such a config (exit 1, no plan) and
//! writes nothing; `--config FILE` plans a candidate file against this
//! home's real state (the GitOps pre-merge check).

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::desired::Desired;
use hermes_model::observed::Observed;

use crate::activity::Activity;
use crate::apply::{ApplyOptions, apply};
use crate::cli::{Output, ReconcileArgs};
use crate::commands::{
    apply_backends, load_for_dry_run, load_for_pass, observe_backends, observe_for, refresh_egress,
};
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, args: &ReconcileArgs) -> anyhow::Result<ExitCode> {
    let (mut desired, config_error) = if args.dry_run {
        // A config that cannot be used is the answer (exit 1), never a plan
        // made from the last good one that reads "No changes".
        let desired = load_for_dry_run(home, profile, args.config.as_deref())?;
        (desired, None)
    } else {
        let pass = load_for_pass(home, profile)?;
        if let Some(error) = &pass.config_error {
            eprintln!("error: {error}");
        }
        (pass.desired, pass.config_error)
    };
    if args.prune {
        desired.config.reconcile.prune = true;
    }
    let engine = connect(home, &desired).await?;
    let (observed, backend_error) = see(engine.as_ref(), home, &desired).await?;
    if let Some(e) = &backend_error {
        eprintln!("error: {e}");
    }
    let plan = hermes_reconcilers::plan_all(&desired, &observed, SystemTime::now());
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&plan.to_json())?),
        // "The host is converged." would be untrue while config.yaml
        // cannot be used: the rows stay, the last line says what holds.
        Output::Text if config_error.is_some() && !plan.is_pending() => {
            let text = plan.to_string();
            let rows = text
                .strip_suffix(CONVERGED)
                .unwrap_or(text.as_str())
                .trim_end();
            if !rows.is_empty() {
                println!("{rows}");
            }
            println!("No changes under the config standing in; config.yaml must be fixed.");
        }
        Output::Text => println!("{plan}"),
    }
    let config_failed = config_error.is_some() || backend_error.is_some();
    if args.dry_run {
        return Ok(if config_failed {
            ExitCode::from(1)
        } else if plan.is_pending() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    if !plan.is_pending() {
        crate::failures::record::<String>(home, &[], now);
        return Ok(if config_failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let activity = Activity::new(home);
    let options = ApplyOptions {
        verbose: args.output == Output::Text,
        stop: None,
        home: Some(home),
    };
    let verbose = args.output == Output::Text;
    let mut applied = apply(engine.as_ref(), &plan, &activity, options).await;
    applied.absorb(apply_backends(home, &desired, &plan, verbose).await);
    // A change of the proxy (set up, started) unblocks what waited on it:
    // plan again within this pass, a bounded number of times.
    let mut last = plan;
    for _ in 0..PROXY_ROUNDS {
        if !hermes_reconcilers::proxy::has_proxy_work(&last.ops) {
            break;
        }
        refresh_egress(home, &mut desired);
        let (observed, _) = see(engine.as_ref(), home, &desired).await?;
        let next = hermes_reconcilers::plan_all(&desired, &observed, SystemTime::now());
        if !next.is_pending() {
            break;
        }
        let mut more = apply(engine.as_ref(), &next, &activity, options).await;
        more.absorb(apply_backends(home, &desired, &next, verbose).await);
        let failed = more.failed;
        applied.absorb(more);
        if failed > 0 {
            // Retried by the next pass, not in a loop here.
            break;
        }
        last = next;
    }
    // For `hermes status`, after this command has ended.
    crate::failures::record(home, &applied.failures, now);
    // Observe again: what the host looks like now, not what we hoped.
    let (after, _) = see(engine.as_ref(), home, &desired).await?;
    forget_removed(&activity, &after);
    let remaining = hermes_reconcilers::plan_all(&desired, &after, SystemTime::now());
    if args.output == Output::Text {
        if remaining.is_pending() {
            println!("Still pending after this pass:\n{remaining}");
        } else {
            println!("The host is converged.");
        }
    }
    Ok(
        if config_failed || applied.failed > 0 || remaining.summary().blocked > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// The last line of a plan with nothing to do.
const CONVERGED: &str = "No changes. The host is converged.";

/// How many times a pass plans again after changing the proxy (setup,
/// then start, then the sandboxes that waited).
const PROXY_ROUNDS: usize = 3;

/// The engine of this pass: one that must answer where the pass needs
/// Docker ([`super::needs_docker`]), else one looked at only when it
/// answers ([`super::optional_engine`]), the same rule as the controller's.
async fn connect(home: &Home, desired: &Desired) -> anyhow::Result<Option<Engine>> {
    if super::needs_docker(desired) {
        return Ok(Some(Engine::connect().await?.for_home(home.scope())));
    }
    Ok(super::optional_engine(home).await)
}

/// Drops the activity records of containers that no longer exist. A stale
/// record would do no harm (a new container counts from its own start), but
/// records should not pile up.
fn forget_removed(activity: &Activity, observed: &Observed) {
    for name in observed.activity.keys() {
        if !observed.containers.iter().any(|c| &c.name == name) {
            if let Err(e) = activity.forget(name) {
                tracing::debug!(container = %name, error = %e, "cannot drop an activity record");
            }
        }
    }
}

/// What a pass sees: the containers when there is an engine, the proxy in
/// any case, and the other backends' sandboxes (the SSH host, singularity
/// instances, the cloud sandbox) when one of them is the backend; with the
/// error of a cloud backend that cannot be asked.
async fn see(
    engine: Option<&Engine>,
    home: &Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<(Observed, Option<String>)> {
    let mut observed = match engine {
        Some(engine) => observe_for(engine, home, desired).await?,
        None => Observed {
            proxy: crate::egress::pass::observe(home).await,
            ..Observed::default()
        },
    };
    let error = observe_backends(home, desired, &mut observed).await;
    Ok((observed, error))
}
