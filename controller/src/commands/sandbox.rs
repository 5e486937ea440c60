//! `hermes sandbox list`: every labelled container of this home, whatever its profile,
//! with whether its spec matches the config, its age and how long it has
//! been idle (busy while an exec or a background process runs inside); on
//! singularity the instances, on a cloud backend the task's sandbox there.
//!
//! The backend's seam ([`crate::backend::Seam::list`]) gathers a
//! [`SandboxList`]: its JSON is its `Serialize`, its text its `Display`.

use std::fmt;
use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::Engine;
use hermes_model::observed::{Idleness, ObservedContainer};
use serde::Serialize;

use crate::backend::Seam;
use crate::cli::{Output, SandboxCommand};
use crate::home::Home;
use crate::load::load_desired;
use crate::observe::observe;

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
    let list = Seam::of(&desired).list(home, &desired).await?;
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

/// The report of `hermes sandbox list`, by backend.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum SandboxList {
    Containers(Vec<ContainerRow>),
    Instances(Vec<InstanceRow>),
    Cloud(Vec<CloudRow>),
}

/// A labelled container.
#[derive(Debug, Serialize)]
pub struct ContainerRow {
    pub name: String,
    pub profile: String,
    pub task: String,
    pub state: String,
    /// The session of a session sandbox.
    pub session: Option<String>,
    /// Whether hermes made it (it has a spec hash).
    pub managed: bool,
    /// Whether its spec is the config's: for the active profile's
    /// persistent sandboxes; `null` for the others.
    pub spec_matches: Option<bool>,
    /// The SPEC column: `yes`/`no`, `-`, `unmanaged`.
    #[serde(skip)]
    pub spec: String,
    pub age_seconds: i64,
    /// Seconds since the last use, for a running sandbox with nothing inside.
    pub idle_seconds: Option<i64>,
    pub processes: Option<u32>,
    /// The AGE column.
    #[serde(skip)]
    pub age: String,
    /// The IDLE column ([`idle_text`]).
    #[serde(skip)]
    pub idle: String,
}

/// A singularity instance.
#[derive(Debug, Serialize)]
pub struct InstanceRow {
    pub name: String,
    pub profile: String,
    pub task: String,
    /// Always `running`: a stopped instance does not exist.
    pub state: &'static str,
    /// As a container's ([`ContainerRow::spec_matches`]).
    pub spec_matches: Option<bool>,
    #[serde(skip)]
    pub spec: String,
    pub pid: u32,
}

/// The cloud backend's sandbox of a task.
#[derive(Debug, Serialize)]
pub struct CloudRow {
    /// The service's id of the sandbox, `null` when only a snapshot is
    /// left.
    pub id: Option<String>,
    /// The NAME column: the id, or `-`.
    #[serde(skip)]
    pub name: String,
    pub backend: String,
    pub profile: String,
    pub task: String,
    pub state: String,
    /// The snapshot recorded for the task.
    pub snapshot: Option<String>,
}

impl fmt::Display for SandboxList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxList::Containers(rows) => {
                let cells: Vec<[&str; 7]> = rows
                    .iter()
                    .map(|r| {
                        [
                            r.name.as_str(),
                            &r.profile,
                            &r.task,
                            &r.state,
                            &r.spec,
                            &r.age,
                            &r.idle,
                        ]
                    })
                    .collect();
                table(
                    f,
                    ["NAME", "PROFILE", "TASK", "STATE", "SPEC", "AGE", "IDLE"],
                    &cells,
                )
            }
            SandboxList::Instances(rows) => {
                let pids: Vec<String> = rows.iter().map(|r| r.pid.to_string()).collect();
                let cells: Vec<[&str; 6]> = rows
                    .iter()
                    .zip(&pids)
                    .map(|(r, pid)| [r.name.as_str(), &r.profile, &r.task, r.state, &r.spec, pid])
                    .collect();
                table(
                    f,
                    ["NAME", "PROFILE", "TASK", "STATE", "SPEC", "PID"],
                    &cells,
                )
            }
            SandboxList::Cloud(rows) => {
                let cells: Vec<[&str; 6]> = rows
                    .iter()
                    .map(|r| {
                        [
                            r.name.as_str(),
                            &r.backend,
                            &r.profile,
                            &r.task,
                            &r.state,
                            r.snapshot.as_deref().unwrap_or("-"),
                        ]
                    })
                    .collect();
                table(
                    f,
                    ["NAME", "BACKEND", "PROFILE", "TASK", "STATE", "SNAPSHOT"],
                    &cells,
                )
            }
        }
    }
}

/// Every labelled container of this home, sorted by profile, task and
/// name.
pub async fn containers(
    home: &Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<SandboxList> {
    let engine = Engine::connect().await?.for_home(home.scope());
    let mut observed = observe(&engine, home).await?;
    observed
        .containers
        .sort_by(|a, b| (a.profile(), a.task(), &a.name).cmp(&(b.profile(), b.task(), &b.name)));
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let rows = observed
        .containers
        .iter()
        .map(|c| {
            let task = c.task().unwrap_or("-");
            let matches = match c.spec_hash() {
                Some(h)
                    if c.profile() == Some(desired.profile.as_str()) && c.session().is_none() =>
                {
                    Some(desired.sandbox_for_task(task).hash() == h)
                }
                _ => None,
            };
            let spec = match (c.spec_hash(), matches) {
                (None, _) => "unmanaged",
                (_, Some(true)) => "yes",
                (_, Some(false)) => "no",
                (_, None) => "-",
            };
            let idleness = observed.idleness(c);
            ContainerRow {
                name: c.name.clone(),
                profile: c.profile().unwrap_or("-").to_string(),
                task: task.to_string(),
                state: c.state.as_str().to_string(),
                session: c.session().map(str::to_string),
                managed: c.spec_hash().is_some(),
                spec_matches: matches,
                spec: spec.to_string(),
                age_seconds: now - c.created,
                idle_seconds: match idleness {
                    Idleness::IdleSince(t) => Some(now - t),
                    _ => None,
                },
                processes: c.processes,
                age: hermes_reconcilers::age(now - c.created),
                idle: idle_text(idleness, c, now),
            }
        })
        .collect();
    Ok(SandboxList::Containers(rows))
}

/// The singularity instances: name, profile, task, whether the spec
/// matches, the instance's process id.
pub async fn instances(
    home: &Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<SandboxList> {
    let listed = crate::singularity::list(home.root(), desired).await?;
    Ok(SandboxList::Instances(
        listed
            .into_iter()
            .map(|i| InstanceRow {
                name: i.name,
                profile: i.profile,
                task: i.task,
                state: "running",
                spec_matches: match i.spec.as_str() {
                    "yes" => Some(true),
                    "no" => Some(false),
                    _ => None,
                },
                spec: i.spec,
                pid: i.pid,
            })
            .collect(),
    ))
}

/// The cloud backend's sandbox of the default task, as the service reports
/// it (only looked up), with the snapshot recorded for the task: `-` and
/// `suspended` when only a snapshot is left. Nothing at all: no row.
pub async fn cloud(
    home: &Home,
    desired: &hermes_model::desired::Desired,
) -> anyhow::Result<SandboxList> {
    use hermes_model::cloud::CloudObserved;
    let cloud = crate::cloud::usable(desired)?;
    let env = crate::host::host_env(home)?;
    let (seen, error) = crate::cloud::observe(home, desired, &env).await;
    if let Some(e) = error {
        return Err(e.into());
    }
    let mut rows = Vec::new();
    if let Some(CloudObserved::Seen { sandbox, snapshot }) = seen {
        let row = match sandbox {
            Some((id, state)) => Some((id, state.to_string())),
            None => snapshot
                .as_ref()
                .map(|_| ("-".to_string(), "suspended".to_string())),
        };
        if let Some((id, state)) = row {
            rows.push(CloudRow {
                id: (id != "-").then(|| id.clone()),
                name: id,
                backend: cloud.backend.to_string(),
                profile: desired.profile.clone(),
                task: hermes_model::desired::DEFAULT_TASK.to_string(),
                state,
                snapshot,
            });
        }
    }
    Ok(SandboxList::Cloud(rows))
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

/// Writes rows under a header, each column as wide as its widest cell.
pub(crate) fn table<const N: usize>(
    f: &mut fmt::Formatter<'_>,
    head: [&str; N],
    rows: &[[&str; N]],
) -> fmt::Result {
    let mut widths = head.map(str::len);
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str; N]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    writeln!(f, "{}", line(&head))?;
    for r in rows {
        writeln!(f, "{}", line(r))?;
    }
    Ok(())
}
