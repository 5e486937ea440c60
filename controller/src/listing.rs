//! The rows of `hermes sandbox list`, one kind per backend family (the
//! labelled containers, the singularity instances, a cloud service's
//! sandbox), and the table they print as. A backend gathers them
//! ([`crate::seam::Backend::list`]); `commands/` prints them.

use std::fmt;

use hermes_model::observed::{Idleness, ObservedContainer};
use serde::Serialize;

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
    /// The OCI runtime it runs under (`runc`, `runsc`, …).
    pub runtime: String,
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
    /// An unclaimed warm-pool member's state: `ready` (a session's first
    /// command may claim it) or `starting`; `null` for any other
    /// container (a claimed member is its session's sandbox).
    pub pool: Option<&'static str>,
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
                let cells: Vec<[&str; 8]> = rows
                    .iter()
                    .map(|r| {
                        [
                            r.name.as_str(),
                            &r.profile,
                            &r.task,
                            &r.state,
                            &r.runtime,
                            &r.spec,
                            &r.age,
                            &r.idle,
                        ]
                    })
                    .collect();
                table(
                    f,
                    [
                        "NAME", "PROFILE", "TASK", "STATE", "RUNTIME", "SPEC", "AGE", "IDLE",
                    ],
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
