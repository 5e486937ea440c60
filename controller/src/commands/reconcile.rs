//! `hermes reconcile [--dry-run] [--prune]`: one pass of the loop
//! ([`crate::pass`]) — load, observe, plan in stages, then print, and
//! unless dry, apply stage by stage.
//!
//! A config that cannot be used (invalid, unreadable, empty) is reported
//! and the pass goes on with the last good one, removing nothing; the exit
//! code is then 1. A config whose only errors are of
//! `terminal.docker_extra_args` is used: the Docker sandboxes are blocked
//! with them, the rest converges, and the exit code is 1 (a dry run's
//! too, after its plan). A dry run stops at such a config (exit 1, no plan) and
//! writes nothing; `--config FILE` plans a candidate file against this
//! home's real state (the GitOps pre-merge check).

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_model::observed::Observed;

use crate::activity::Activity;
use crate::apply::ApplyOptions;
use crate::cli::{Output, ReconcileArgs};
use crate::home::Home;
use crate::pass::{Connect, Load, Pass, Request};

pub async fn run(home: &Home, profile: &str, args: &ReconcileArgs) -> anyhow::Result<ExitCode> {
    let verbose = args.output == Output::Text;
    if !args.dry_run {
        // Ctrl-C stops after the operation in flight, never half-way.
        crate::interrupt::install()?;
    }
    let options = ApplyOptions {
        verbose,
        stop: Some(crate::interrupt::flag()),
        home: Some(home),
    };
    let printed = std::cell::Cell::new(Ok(()));
    let print = |pass: &Pass| printed.set(print_plan(pass, args.output));
    let request = Request {
        // A dry run stops at a config that cannot be used (exit 1), never
        // a plan made from the last good one that reads "No changes".
        load: if args.dry_run {
            Load::DryRun {
                file: args.config.as_deref(),
            }
        } else {
            Load::Pass
        },
        prune: args.prune,
        apply: (!args.dry_run).then_some(options),
        hold: &|_| false,
        planned: &print,
    };
    let pass = crate::pass::run(home, profile, request, &mut Connect::default()).await?;
    if let Some(e) = &pass.ended {
        if let Some(error) = &pass.config_error {
            eprintln!("error: {error}");
        }
        anyhow::bail!("{e}");
    }
    printed.into_inner()?;
    let plan = &pass.plan;
    let config_error = &pass.config_error;
    // A config whose errors block only the Docker sandboxes is used, and
    // still an error (a GitOps check of it fails).
    let config_failed =
        config_error.is_some() || !pass.errors.is_empty() || pass.desired.docker_blocked.is_some();
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
    // For `hermes status`, after this command has ended.
    crate::failures::record(home, &pass.applied.failures, now);
    // Observe again: what the host looks like now, not what we hoped.
    let (after, _) = crate::pass::observe(pass.engine.as_ref(), home, &pass.desired).await?;
    forget_removed(&Activity::new(home), &after);
    let remaining = hermes_reconcilers::plan_all(&pass.desired, &after, SystemTime::now());
    if verbose {
        if remaining.is_pending() {
            println!("Still pending after this pass:\n{remaining}");
        } else {
            println!("The host is converged.");
        }
    }
    if crate::interrupt::requested() {
        eprintln!(
            "hermes: stopped by a signal: {} operation(s) not carried out; the next pass plans them again",
            pass.applied.skipped + pass.applied.failed
        );
        return Ok(ExitCode::from(crate::interrupt::EXIT_CODE));
    }
    Ok(
        if config_failed || pass.applied.failed > 0 || remaining.summary().blocked > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// Prints the config's error, a backend's, and the plan (before it is
/// carried out).
fn print_plan(pass: &Pass, output: Output) -> anyhow::Result<()> {
    let plan = &pass.plan;
    if let Some(error) = &pass.config_error {
        eprintln!("error: {error}");
    }
    for e in &pass.errors {
        eprintln!("error: {e}");
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&plan.to_json())?),
        // "The host is converged." would be untrue while config.yaml
        // cannot be used: the rows stay, the last line says what holds.
        Output::Text if pass.config_error.is_some() && !plan.is_pending() => {
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
    Ok(())
}

/// The last line of a plan with nothing to do.
const CONVERGED: &str = "No changes. The host is converged.";

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
