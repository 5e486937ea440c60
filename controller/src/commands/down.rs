//! `hermes down [--dry-run] [--yes]`: takes down everything hermes runs
//! for this home, by a plan printed first ([`hermes_reconcilers::down`]):
//! every labelled container of the profile with the disk image mounted for
//! it, and the backend's own part ([`crate::seam::Backend::down`]: the
//! singularity instances stopped, their overlays kept; a cloud task's
//! sandbox suspended, its filesystem kept; the Pods deleted, their claims
//! kept), then, once they are gone, the proxy-only network and the proxy.
//! Files stay, so `hermes reconcile` brings it all back. On a terminal it
//! asks first (`--yes` does not); a running controller would bring
//! everything back at once, so `down` refuses while one runs.

use std::process::ExitCode;

use hermes_reconcilers::StagedPlan;

use crate::apply::{ApplyOptions, OpResult};
use crate::cli::{DownArgs, Output};
use crate::daemon::lock::{ControllerLock, LockError};
use crate::daemon::status;
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, args: &DownArgs) -> anyhow::Result<ExitCode> {
    let desired = crate::load::load_desired(home, profile)?;
    let lock = status::run_dir(home).join("controller.lock");
    if lock.exists() {
        match ControllerLock::acquire(&lock) {
            Ok(_free) => {}
            Err(LockError::Held { pid, .. }) => anyhow::bail!(
                "a controller runs for this home (pid {pid}) and would bring everything back: stop it first (`systemctl stop hermes`, or its Ctrl-C)"
            ),
            Err(e) => return Err(e.into()),
        }
    }
    // Without an engine there are no sandboxes to see: the proxy only.
    let engine = crate::observe::optional_engine(home).await;
    let (mut observed, _) = crate::pass::observe(engine.as_ref(), home, &desired).await?;
    if let Some(engine) = &engine {
        let ids: Vec<String> = observed.containers.iter().map(|c| c.id.clone()).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        engine.count_processes(&mut observed.containers, &ids).await;
    }
    let backend = crate::backend::of(&desired);
    let own = backend.down(home, &desired, &observed).await;
    let plan = hermes_reconcilers::down::plan(&observed, own);
    let json = args.output == Output::Json;
    if !json {
        println!("{}", super::plan_text(&plan));
    }
    if args.dry_run {
        if json {
            print_json(&plan, true, &[], !plan.is_pending())?;
        }
        return Ok(ExitCode::from(if plan.is_pending() { 2 } else { 0 }));
    }
    if !plan.is_pending() {
        if json {
            print_json(&plan, false, &[], true)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let everything: Vec<String> = plan
        .plans()
        .flat_map(|p| p.ops.iter())
        .map(|op| op.target.to_string())
        .collect();
    if !args.yes
        && !super::ask(&format!(
            "This takes down {} (their files are kept).",
            everything.join(", ")
        ))
    {
        eprintln!("Not carried out: nothing was changed.");
        crate::json::note_error("hermes down was not carried out: declined at the prompt");
        return Ok(ExitCode::from(1));
    }
    let options = ApplyOptions {
        verbose: !json,
        stop: None,
        home: Some(home),
    };
    // The host's operations and the backend's (a cloud sandbox's
    // suspend), each by its own applier.
    let mut applied = crate::pass::apply_plan(
        backend,
        engine.as_ref(),
        home,
        &desired,
        &plan.first,
        options,
    )
    .await;
    for stage in &plan.later {
        if applied.failed > 0 {
            break;
        }
        // The proxy: the host's daemon and network, or the backend's
        // (the kubernetes proxy's Pod).
        applied.absorb(
            crate::pass::apply_plan(
                backend,
                engine.as_ref(),
                home,
                &desired,
                &stage.plan,
                options,
            )
            .await,
        );
    }
    let done = applied.failed == 0;
    if json {
        print_json(&plan, false, &applied.results, done)?;
    } else if done {
        println!("Down: nothing of this home runs any more; `hermes reconcile` brings it back.");
    }
    Ok(if done {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The document of `down --output json`: a pass's, as `reconcile` has it,
/// with each operation's result after an apply; `converged`: nothing is
/// up (any more).
fn print_json(
    plan: &StagedPlan,
    dry_run: bool,
    results: &[OpResult],
    down: bool,
) -> anyhow::Result<()> {
    let mut json = plan.to_json();
    json.converged = down;
    crate::json::print(super::reconcile::PassJson {
        dry_run,
        config_error: None,
        errors: &[],
        plan: json,
        results: (!dry_run).then_some(results),
        halted: (!dry_run).then_some(None),
        remaining: None,
    })?;
    Ok(())
}
