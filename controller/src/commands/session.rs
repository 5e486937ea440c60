//! `hermes session list|end`: the disposable sandboxes of sessions
//! (`hermes exec --session ID`), one per (task, session), tmpfs only.
//!
//! `session end` is a plan like any pass's, made by the backend's seam
//! ([`crate::seam::Backend::end_session`]: the session's containers
//! removed, its singularity instances ended, a cloud's shared sandbox
//! suspended), printed, then carried out by the same appliers as a pass.
//! `session list` is a [`SessionList`]: its JSON is its `Serialize`, its
//! text its `Display`.

use std::fmt;
use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::desired::check_session;
use hermes_model::sandbox::sanitize;
use serde::Serialize;

use crate::apply::ApplyOptions;
use crate::cli::{Output, SessionCommand};
use crate::home::Home;
use crate::listing::{idle_text, table};
use crate::observe::observe;

pub async fn run(home: &Home, profile: &str, command: SessionCommand) -> anyhow::Result<ExitCode> {
    hermes_model::desired::check_profile(profile)?;
    match command {
        SessionCommand::List { output } => {
            let list = list(home, profile).await?;
            match output {
                Output::Json => crate::json::print(&list)?,
                Output::Text => print!("{list}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::End { id } => end(home, profile, &id).await,
    }
}

/// Ends a session: its plan printed, then carried out.
async fn end(home: &Home, profile: &str, id: &str) -> anyhow::Result<ExitCode> {
    check_session(id)?;
    let desired = crate::load::load_desired(home, profile)?;
    let backend = crate::backend::of(&desired);
    let ending = backend.end_session(home, &desired, id).await?;
    if ending.plan.ops.is_empty() {
        println!(
            "No sandbox of session {id} in profile {}; nothing to end.",
            sanitize(profile)
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", ending.plan);
    let options = ApplyOptions {
        verbose: true,
        stop: None,
        home: Some(home),
    };
    let applied = crate::pass::apply_plan(
        backend,
        ending.engine.as_ref(),
        home,
        &desired,
        &ending.plan,
        options,
    )
    .await;
    Ok(if applied.failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The report of `hermes session list`: the profile's session containers.
#[derive(Debug, Serialize)]
pub struct SessionList {
    #[serde(rename = "sessions")]
    pub rows: Vec<SessionRow>,
}

/// A session's container.
#[derive(Debug, Serialize)]
pub struct SessionRow {
    pub session: String,
    pub task: String,
    pub name: String,
    pub state: String,
    pub age_seconds: i64,
    /// Seconds since the last use, for a running sandbox with nothing
    /// inside (the IDLE column's time).
    pub idle_seconds: Option<i64>,
    pub processes: Option<u32>,
    /// The AGE column.
    #[serde(skip)]
    pub age: String,
    /// The IDLE column.
    #[serde(skip)]
    pub idle: String,
}

impl fmt::Display for SessionList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cells: Vec<[&str; 6]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.session.as_str(),
                    &r.task,
                    &r.name,
                    &r.state,
                    &r.age,
                    &r.idle,
                ]
            })
            .collect();
        table(
            f,
            ["SESSION", "TASK", "NAME", "STATE", "AGE", "IDLE"],
            &cells,
        )
    }
}

/// The profile's session containers, by session and task.
async fn list(home: &Home, profile: &str) -> anyhow::Result<SessionList> {
    let engine = Engine::connect().await?.for_home(home.scope());
    let observed = observe(&engine, home).await?;
    let profile = sanitize(profile);
    let mut sessions: Vec<_> = observed
        .containers
        .iter()
        .filter(|c| c.profile() == Some(profile.as_str()) && c.session().is_some())
        .collect();
    sessions.sort_by(|a, b| (a.session(), a.task()).cmp(&(b.session(), b.task())));
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let rows = sessions
        .iter()
        .map(|c| SessionRow {
            session: c.session().unwrap_or_default().to_string(),
            task: c.task().unwrap_or("-").to_string(),
            name: c.name.clone(),
            state: c.state.as_str().to_string(),
            age_seconds: now - c.created,
            idle_seconds: match observed.idleness(c) {
                hermes_model::observed::Idleness::IdleSince(t) => Some(now - t),
                _ => None,
            },
            processes: c.processes,
            age: hermes_reconcilers::age(now - c.created),
            idle: idle_text(observed.idleness(c), c, now),
        })
        .collect();
    Ok(SessionList { rows })
}
