//! `hermes sandbox list`: every labelled container of this home, whatever its profile,
//! with whether its spec matches the config, its age and how long it has
//! been idle (busy while an exec or a background process runs inside); on
//! singularity the instances, on a cloud backend the task's sandbox there.

use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::observed::{Idleness, ObservedContainer};

use crate::cli::{Output, SandboxCommand};
use crate::commands::{load_desired, observe};
use crate::home::Home;

pub async fn run(home: &Home, profile: &str, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let SandboxCommand::List { output } = command;
    let desired = load_desired(home, profile)?;
    if desired.backend() == hermes_model::config::Backend::Singularity {
        return list_instances(home, &desired, output).await;
    }
    if desired.cloud.is_some() {
        return list_cloud(home, &desired, output).await;
    }
    let engine = Engine::connect().await?.for_home(home.scope());
    let mut observed = observe(&engine, home).await?;
    observed
        .containers
        .sort_by(|a, b| (a.profile(), a.task(), &a.name).cmp(&(b.profile(), b.task(), &b.name)));
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let rows: Vec<Row> = observed
        .containers
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
            let idleness = observed.idleness(c);
            let idle = idle_text(idleness, c, now);
            Row {
                cells: [
                    c.name.clone(),
                    c.profile().unwrap_or("-").to_string(),
                    task.to_string(),
                    c.state.as_str().to_string(),
                    matches,
                    hermes_reconcilers::age(now - c.created),
                    idle,
                ],
                age_seconds: now - c.created,
                idle_seconds: match idleness {
                    Idleness::IdleSince(t) => Some(now - t),
                    _ => None,
                },
                processes: c.processes,
            }
        })
        .collect();
    const HEAD: [&str; 7] = ["NAME", "PROFILE", "TASK", "STATE", "SPEC", "AGE", "IDLE"];
    match output {
        Output::Json => {
            let list: Vec<_> = rows
                .iter()
                .map(|row| {
                    let r = &row.cells;
                    serde_json::json!({
                        "name": r[0], "profile": r[1], "task": r[2], "state": r[3],
                        "spec_matches": r[4], "age_seconds": row.age_seconds,
                        "idle_seconds": row.idle_seconds, "processes": row.processes,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        Output::Text => {
            let cells: Vec<[String; 7]> = rows.into_iter().map(|r| r.cells).collect();
            print_table(HEAD, &cells);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The singularity instances: name, profile, task, whether the spec
/// matches, the instance's process id.
async fn list_instances(
    home: &Home,
    desired: &hermes_model::desired::Desired,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let listed = crate::singularity::list(home.root(), desired).await?;
    match output {
        Output::Json => {
            let list: Vec<_> = listed
                .iter()
                .map(|i| {
                    serde_json::json!({
                        "name": i.name, "profile": i.profile, "task": i.task,
                        "state": "running", "spec_matches": i.spec, "pid": i.pid,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        Output::Text => {
            let rows: Vec<[String; 6]> = listed
                .into_iter()
                .map(|i| {
                    [
                        i.name,
                        i.profile,
                        i.task,
                        "running".to_string(),
                        i.spec,
                        i.pid.to_string(),
                    ]
                })
                .collect();
            print_table(["NAME", "PROFILE", "TASK", "STATE", "SPEC", "PID"], &rows);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The cloud backend's sandbox of the default task, as the service reports
/// it (only looked up), with the snapshot recorded for the task: `-` and
/// `suspended` when only a snapshot is left. Nothing at all: no row.
async fn list_cloud(
    home: &Home,
    desired: &hermes_model::desired::Desired,
    output: Output,
) -> anyhow::Result<ExitCode> {
    use hermes_model::cloud::CloudObserved;
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
    let (seen, error) = crate::cloud::observe(home, desired, &env).await;
    if let Some(e) = error {
        return Err(e.into());
    }
    let mut rows: Vec<[String; 6]> = Vec::new();
    if let Some(CloudObserved::Seen { sandbox, snapshot }) = seen {
        let row = match sandbox {
            Some((id, state)) => Some((id, state.to_string())),
            None => snapshot
                .as_ref()
                .map(|_| ("-".to_string(), "suspended".to_string())),
        };
        if let Some((id, state)) = row {
            rows.push([
                id,
                cloud.backend.to_string(),
                desired.profile.clone(),
                hermes_model::desired::DEFAULT_TASK.to_string(),
                state,
                snapshot.unwrap_or_else(|| "-".to_string()),
            ]);
        }
    }
    match output {
        Output::Json => {
            let list: Vec<_> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "name": r[0], "backend": r[1], "profile": r[2], "task": r[3],
                        "state": r[4], "snapshot": r[5],
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        Output::Text => print_table(
            ["NAME", "BACKEND", "PROFILE", "TASK", "STATE", "SNAPSHOT"],
            &rows,
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The IDLE column: `busy (N running)`, how long idle, or since when stopped.
pub(crate) fn idle_text(idleness: Idleness, c: &ObservedContainer, now: i64) -> String {
    match idleness {
        Idleness::Busy { processes } => format!("busy ({processes} running)"),
        Idleness::IdleSince(t) => hermes_reconcilers::age(now - t),
        Idleness::Unknown => "?".to_string(),
        Idleness::NotRunning => match c.finished_at {
            Some(t) => format!("stopped {}", hermes_reconcilers::age(now - t)),
            None => "-".to_string(),
        },
    }
}

/// Prints rows under a header, each column as wide as its widest cell.
pub(crate) fn print_table<const N: usize>(head: [&str; N], rows: &[[String; N]]) {
    let mut widths = head.map(str::len);
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(head));
    for r in rows {
        println!("{}", line(r.each_ref().map(String::as_str)));
    }
}

/// One line of the list: the printed cells, and the numbers JSON gives.
struct Row {
    cells: [String; 7],
    age_seconds: i64,
    /// Seconds since the last use, for a running sandbox with nothing inside.
    idle_seconds: Option<i64>,
    processes: Option<u32>,
}
