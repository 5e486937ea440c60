//! `hermes sandbox list`: every labelled container, whatever its profile.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;

use crate::cli::{Output, SandboxCommand};
use crate::commands::load_desired;
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let SandboxCommand::List { output } = command;
    let desired = load_desired(home, profile)?;
    let engine = Engine::connect().await?;
    let mut containers = engine.observe().await?;
    containers
        .sort_by(|a, b| (a.profile(), a.task(), &a.name).cmp(&(b.profile(), b.task(), &b.name)));
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let rows: Vec<[String; 7]> = containers
        .iter()
        .map(|c| {
            let task = c.task().unwrap_or("-");
            let matches = match c.spec_hash() {
                None => "unmanaged".to_string(),
                Some(h)
                    if c.profile() == Some(desired.profile.as_str()) && c.session().is_none() =>
                {
                    if desired.sandbox_for_task(task).hash() == h {
                        "yes"
                    } else {
                        "no"
                    }
                    .to_string()
                }
                Some(_) => "-".to_string(),
            };
            [
                c.name.clone(),
                c.profile().unwrap_or("-").to_string(),
                task.to_string(),
                c.state.as_str().to_string(),
                matches,
                hermes_reconcilers::age(now - c.created),
                c.finished_at
                    .filter(|_| c.state != hermes_model::observed::ContainerState::Running)
                    .map_or("-".to_string(), |t| hermes_reconcilers::age(now - t)),
            ]
        })
        .collect();
    const HEAD: [&str; 7] = ["NAME", "PROFILE", "TASK", "STATE", "SPEC", "AGE", "STOPPED"];
    match output {
        Output::Json => {
            let list: Vec<_> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "name": r[0], "profile": r[1], "task": r[2], "state": r[3],
                        "spec_matches": r[4], "age": r[5], "stopped_for": r[6],
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        Output::Text => {
            let mut widths = HEAD.map(str::len);
            for r in &rows {
                for (w, cell) in widths.iter_mut().zip(r) {
                    *w = (*w).max(cell.chars().count());
                }
            }
            let line = |cells: [&str; 7]| {
                cells
                    .iter()
                    .zip(widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            };
            println!("{}", line(HEAD));
            for r in &rows {
                println!("{}", line(r.each_ref().map(String::as_str)));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
