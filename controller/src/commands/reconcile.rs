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
    let options = ApplyOptions {
        verbose,
        stop: Some(crate::interrupt::flag()),
        home: Some(home),
    };
    let printed = std::cell::Cell::new(Ok(()));
    let json = args.output == Output::Json;
    // JSON: the dry run's document is its plan; an apply's is printed
    // once it is done, with each operation's result.
    let print = |pass: &Pass| {
        printed.set(print_plan(pass, args.output, args.dry_run || !json));
        let go = args.dry_run || args.yes || consent(pass);
        // From the apply on, Ctrl-C stops after the operation in flight,
        // never half-way; until then (planning, the question) nothing has
        // changed, and it ends the command at once.
        if go && !args.dry_run {
            if let Err(e) = crate::interrupt::install() {
                tracing::warn!(error = %e, "cannot handle Ctrl-C; it ends the command at once");
            }
        }
        go
    };
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
            crate::json::note_error(error);
        }
        anyhow::bail!("{e}");
    }
    printed.into_inner()?;
    if pass.declined {
        eprintln!("Not carried out: nothing was changed.");
        crate::json::note_error("the plan was not carried out: declined at the prompt");
        return Ok(ExitCode::from(1));
    }
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
        if json {
            print_applied(&pass, None)?;
        }
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
    let remaining = hermes_reconcilers::plan_all_with(
        &pass.desired,
        &after,
        SystemTime::now(),
        crate::backend::of(&pass.desired).planner(),
    );
    if verbose {
        if remaining.is_pending() {
            println!(
                "Still pending after this pass:\n{}",
                super::plan_text(&remaining)
            );
        } else {
            println!("The host is converged.");
        }
    }
    if json {
        print_applied(&pass, Some(&remaining))?;
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
/// carried out); the JSON plan only when `document` (a dry run's).
fn print_plan(pass: &Pass, output: Output, document: bool) -> anyhow::Result<()> {
    let plan = &pass.plan;
    if let Some(error) = &pass.config_error {
        eprintln!("error: {error}");
        crate::json::note_error(error);
    }
    for e in &pass.errors {
        eprintln!("error: {e}");
        crate::json::note_error(e);
    }
    match output {
        Output::Json if !document => {}
        Output::Json => crate::json::print(PassJson {
            dry_run: true,
            config_error: pass.config_error.as_deref(),
            errors: &pass.errors,
            plan: plan.to_json(),
            results: None,
            halted: None,
            remaining: None,
        })?,
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
        Output::Text => println!("{}", super::plan_text(plan)),
    }
    Ok(())
}

/// On a terminal (stdin and stderr both), a plan that removes or
/// recreates sandboxes or stops the proxy is carried out only once the
/// person says yes; without a terminal it always is (`--yes` skips the
/// question).
fn consent(pass: &Pass) -> bool {
    let costly = costly_ops(&pass.plan);
    costly.is_empty()
        || super::ask(&format!(
            "This plan stops what runs in, or removes: {}.",
            costly.join(", ")
        ))
}

/// The operations of every stage that stop processes or remove what
/// holds files: removals, recreates, the proxy's stop (`verb target`).
pub(crate) fn costly_ops(plan: &hermes_reconcilers::StagedPlan) -> Vec<String> {
    use hermes_model::plan::{Describe, Kind};
    std::iter::once(&plan.first)
        .chain(plan.later.iter().map(|stage| &stage.plan))
        .flat_map(|p| p.ops.iter())
        .filter(|op| {
            op.action.kind() == Kind::Remove || matches!(op.action.verb(), "recreate" | "stop")
        })
        .map(|op| format!("{} {}", op.action.verb(), op.target))
        .collect()
}

/// A pass as `--output json` gives it: the plan (flattened: `operations`,
/// `summary`, `stages`), and after an apply each operation's result, why
/// a stage was not carried out and what is still pending. The plan's
/// `converged` is whether nothing is left to do: in a dry run, whether the
/// plan is empty; after an apply, whether the host observed again plans
/// nothing.
#[derive(serde::Serialize)]
pub(crate) struct PassJson<'a> {
    pub dry_run: bool,
    pub config_error: Option<&'a str>,
    pub errors: &'a [String],
    #[serde(flatten)]
    pub plan: hermes_model::plan::PlanJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results: Option<&'a [crate::apply::OpResult]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halted: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<hermes_model::plan::PlanJson<'a>>,
}

/// The document of an applied pass; `remaining` is the plan of the host
/// observed again (`None`: nothing was to do).
fn print_applied(
    pass: &Pass,
    remaining: Option<&hermes_reconcilers::HostPlan>,
) -> anyhow::Result<()> {
    let mut plan = pass.plan.to_json();
    plan.converged = remaining.is_none_or(|r| !r.is_pending());
    crate::json::print(PassJson {
        dry_run: false,
        config_error: pass.config_error.as_deref(),
        errors: &pass.errors,
        plan,
        results: Some(&pass.applied.results),
        halted: Some(pass.halted.as_deref()),
        remaining: remaining.map(|r| r.to_json()),
    })?;
    Ok(())
}

/// The last line of a plan with nothing to do.
const CONVERGED: &str = "No changes. The host is converged.";

/// Drops the activity records of containers that no longer exist. A stale
/// record would do no harm (a new container counts from its own start), but
/// records should not pile up.
/// A name a claimed warm-pool member was made with has no container any
/// more, but its runner's directory is that member's still: only the
/// record goes.
fn forget_removed(activity: &Activity, observed: &Observed) {
    let made_as: std::collections::BTreeSet<&str> = observed
        .containers
        .iter()
        .filter_map(|c| c.label(hermes_model::sandbox::LABEL_POOL))
        .collect();
    for name in observed.activity.keys() {
        if !observed.containers.iter().any(|c| &c.name == name) {
            let forgotten = if made_as.contains(name.as_str()) {
                activity.forget_record(name)
            } else {
                activity.forget(name)
            };
            if let Err(e) = forgotten {
                tracing::debug!(container = %name, error = %e, "cannot drop an activity record");
            }
        }
    }
}
