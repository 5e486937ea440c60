//! `hermes session list|end`: the disposable sandboxes of sessions
//! (`hermes exec --session ID`), one per (task, session), tmpfs only.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::config::Backend;
use hermes_model::desired::check_session;
use hermes_model::plan::Plan;
use hermes_model::sandbox::sanitize;

use crate::activity::Activity;
use crate::apply::{ApplyOptions, apply};
use crate::cli::{Output, SessionCommand};
use crate::commands::observe;
use crate::commands::sandbox::{idle_text, print_table};
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, command: SessionCommand) -> anyhow::Result<ExitCode> {
    hermes_model::desired::check_profile(profile)?;
    if let SessionCommand::End { id } = &command {
        let desired = crate::commands::load_desired(home, profile)?;
        match desired.backend() {
            Backend::Singularity => {
                check_session(id)?;
                let ended = crate::singularity::end_session(home.root(), profile, id).await?;
                if ended == 0 {
                    println!("No instance of session {id} in profile {profile}; nothing to end.");
                }
                return Ok(ExitCode::SUCCESS);
            }
            Backend::Modal | Backend::Daytona | Backend::VercelSandbox => {
                return end_cloud_session(home, &desired, id).await;
            }
            _ => {}
        }
    }
    let engine = Engine::connect().await?.for_home(home.scope());
    let observed = observe(&engine, home).await?;
    let profile = sanitize(profile);
    let mut sessions: Vec<_> = observed
        .containers
        .iter()
        .filter(|c| c.profile() == Some(profile.as_str()) && c.session().is_some())
        .collect();
    sessions.sort_by(|a, b| (a.session(), a.task()).cmp(&(b.session(), b.task())));
    match command {
        SessionCommand::List { output } => {
            let now = hermes_reconcilers::unix_seconds(SystemTime::now());
            let rows: Vec<[String; 6]> = sessions
                .iter()
                .map(|c| {
                    [
                        c.session().unwrap_or_default().to_string(),
                        c.task().unwrap_or("-").to_string(),
                        c.name.clone(),
                        c.state.as_str().to_string(),
                        hermes_reconcilers::age(now - c.created),
                        idle_text(observed.idleness(c), c, now),
                    ]
                })
                .collect();
            match output {
                Output::Json => {
                    let list: Vec<_> = rows
                        .iter()
                        .zip(&sessions)
                        .map(|(r, c)| {
                            serde_json::json!({
                                "session": r[0], "task": r[1], "name": r[2], "state": r[3],
                                "age_seconds": now - c.created,
                                "processes": c.processes,
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&list)?);
                }
                Output::Text => {
                    print_table(["SESSION", "TASK", "NAME", "STATE", "AGE", "IDLE"], &rows)
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::End { id } => {
            check_session(&id)?;
            // A plan like any pass's, printed before it is carried out by
            // the same applier.
            let plan = Plan::new(hermes_reconcilers::reaping::end_session(
                &profile, &id, &observed,
            ));
            if plan.ops.is_empty() {
                println!("No sandbox of session {id} in profile {profile}; nothing to end.");
                return Ok(ExitCode::SUCCESS);
            }
            println!("{plan}");
            let options = ApplyOptions {
                verbose: true,
                stop: None,
                home: Some(home),
            };
            let applied = apply(Some(&engine), &plan, &Activity::new(home), options).await;
            Ok(if applied.failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// A session's end on a cloud service. Every session of the profile
/// shares the default task's sandbox there (as the reference shares its
/// persistent sandbox), so ending one suspends that sandbox, keeping its
/// filesystem: a snapshot recorded for the next session, or the stopped
/// sandbox itself on Daytona.
async fn end_cloud_session(
    home: &Home,
    desired: &hermes_model::desired::Desired,
    id: &str,
) -> anyhow::Result<ExitCode> {
    check_session(id)?;
    let Some(cloud) = &desired.cloud else {
        anyhow::bail!("the {} backend has no cloud settings", desired.backend());
    };
    if let Err(missing) = &cloud.credentials {
        anyhow::bail!(
            "{missing}: the {} backend needs it, in the environment or in .env",
            cloud.backend
        );
    }
    let env = crate::commands::host_env(home)?;
    let book = crate::snapshots::SnapshotBook::new(home.root(), cloud.backend);
    let home_dir = crate::cloud::home_dir(&env);
    let driver = crate::cloud::Driver::new(cloud.backend, &env, home_dir.as_deref())?;
    let task = hermes_model::desired::DEFAULT_TASK;
    match crate::cloud::end_cloud_session(&driver, desired, &book, task).await? {
        Some(snapshot) => println!(
            "{} {}/default: session {id} ended, snapshot {snapshot} kept for the next session",
            cloud.backend, desired.profile
        ),
        None => println!(
            "{} {}/default: session {id} ended (nothing was running, or the stopped sandbox is kept)",
            cloud.backend, desired.profile
        ),
    }
    Ok(ExitCode::SUCCESS)
}
