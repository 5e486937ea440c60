//! `hermes sandbox list`: every labelled container of this home, whatever its profile,
//! with whether its spec matches the config, its age and how long it has
//! been idle (busy while an exec or a background process runs inside); on
//! singularity the instances, on a cloud backend the task's sandbox there.
//!
//! The backend ([`crate::seam::Backend::list`]) gathers a
//! [`SandboxList`]: its JSON is its `Serialize`, its text its `Display`.

use std::process::ExitCode;

use serde::Serialize;

use crate::cli::{Output, SandboxCommand};
use crate::home::Home;
use crate::listing::SandboxList;
use crate::load::load_desired;

pub async fn run(home: &Home, profile: &str, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let output = match command {
        SandboxCommand::List { output } => output,
        SandboxCommand::Describe {
            task,
            session,
            output,
        } => {
            return crate::commands::describe::run(
                home,
                profile,
                &task,
                session.as_deref(),
                output,
            )
            .await;
        }
    };
    let desired = load_desired(home, profile)?;
    let list = crate::backend::of(&desired).list(home, &desired).await?;
    match output {
        Output::Json => crate::json::print(ListJson {
            backend: desired.config.terminal.backend.as_str(),
            sandboxes: &list,
        })?,
        Output::Text => print!("{list}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandbox list --output json`: the backend, and its rows.
#[derive(Serialize)]
struct ListJson<'a> {
    backend: &'a str,
    sandboxes: &'a SandboxList,
}
