//! `hermes sandbox describe [--task T] [--session ID]`: one Docker
//! sandbox in full, for a person at a terminal or a script: its state and
//! times, its spec (the hash it runs against the config's, and the
//! settings that differ, old and new), its mounts, its egress wiring
//! (network, name servers, hosts), the processes in it, and the events
//! the engine still holds of it. Only looked up: nothing is made.

use std::fmt;
use std::process::ExitCode;
use std::time::SystemTime;

use hermes_backends::docker::{Described, Engine};
use hermes_model::sandbox::{LABEL_EGRESS, LABEL_SPEC_HASH};
use hermes_model::settings::{self, Change, LABEL_SETTINGS};
use serde::Serialize;

use crate::cli::Output;
use crate::home::Home;

pub async fn run(
    home: &Home,
    profile: &str,
    task: &str,
    session: Option<&str>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let desired = crate::load::load_desired(home, profile)?;
    let backend = desired.config.terminal.backend;
    anyhow::ensure!(
        backend == hermes_model::config::Backend::Docker,
        "sandbox describe shows Docker sandboxes; terminal.backend is {} (see `hermes sandbox list`)",
        backend.as_str()
    );
    let spec = desired.exec_sandbox(task, session);
    let engine = Engine::connect().await?.for_home(home.scope());
    let now = hermes_reconcilers::unix_seconds(SystemTime::now());
    let Some(found) = engine.describe(&spec.name, now).await? else {
        anyhow::bail!(
            "no sandbox {} (task {task}{}): `hermes exec` or `hermes reconcile` makes it",
            spec.name,
            session
                .map(|s| format!(", session {s}"))
                .unwrap_or_default()
        );
    };
    let description = Description::of(&found, &spec, task, session, now);
    match output {
        Output::Json => crate::json::print(&description)?,
        Output::Text => print!("{description}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A sandbox, described: its JSON is its `Serialize`, its text its
/// `Display`.
#[derive(Debug, Serialize)]
pub struct Description {
    name: String,
    id: String,
    profile: String,
    task: String,
    session: Option<String>,
    state: String,
    created_at: Option<String>,
    started_at: Option<String>,
    image: String,
    spec: SpecReport,
    /// The settings it was made with (its settings label).
    settings: std::collections::BTreeMap<String, String>,
    mounts: Vec<Mount>,
    egress: Egress,
    processes: Processes,
    events: Vec<Event>,
    #[serde(skip)]
    now: i64,
}

#[derive(Debug, Serialize)]
struct SpecReport {
    /// The hash it runs, and the config's for it.
    running: Option<String>,
    wanted: String,
    matches: bool,
    /// The settings that differ (`field`, `old`, `new`).
    changes: Vec<Change>,
}

#[derive(Debug, Serialize)]
struct Mount {
    source: String,
    destination: String,
    kind: String,
    writable: bool,
}

#[derive(Debug, Serialize)]
struct Egress {
    /// Its egress label (`off`, or the wiring it was made with).
    wiring: String,
    networks: Vec<String>,
    dns: Vec<String>,
    extra_hosts: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Processes {
    titles: Vec<String>,
    rows: Vec<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct Event {
    time: i64,
    action: String,
}

impl Description {
    fn of(
        found: &Described,
        spec: &hermes_model::sandbox::SandboxSpec,
        task: &str,
        session: Option<&str>,
        now: i64,
    ) -> Description {
        let info = &found.inspect;
        let config = info.config.clone().unwrap_or_default();
        let host = info.host_config.clone().unwrap_or_default();
        let labels = config.labels.clone().unwrap_or_default();
        let state = info.state.clone().unwrap_or_default();
        let made_with = labels
            .get(LABEL_SETTINGS)
            .and_then(|l| settings::parse_label(l))
            .unwrap_or_default();
        let running = labels.get(LABEL_SPEC_HASH).cloned();
        let wanted = spec.hash().to_string();
        let changes = if made_with.is_empty() {
            Vec::new()
        } else {
            settings::diff(&made_with, &spec.settings())
        };
        let started = state.started_at.clone().filter(|t| !t.starts_with("0001-"));
        Description {
            name: info
                .name
                .clone()
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_string(),
            id: info.id.clone().unwrap_or_default(),
            profile: spec.key.profile.clone(),
            task: task.to_string(),
            session: session.map(str::to_string),
            state: state
                .status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown".to_string()),
            created_at: info.created.clone(),
            started_at: started,
            image: config.image.clone().unwrap_or_default(),
            spec: SpecReport {
                matches: running.as_deref() == Some(wanted.as_str()),
                running,
                wanted,
                changes,
            },
            settings: made_with,
            mounts: info
                .mounts
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|m| Mount {
                    source: m.source.unwrap_or_default(),
                    destination: m.destination.unwrap_or_default(),
                    kind: m.typ.map(|t| t.to_string()).unwrap_or_default(),
                    writable: m.rw.unwrap_or(false),
                })
                .collect(),
            egress: Egress {
                wiring: labels
                    .get(LABEL_EGRESS)
                    .cloned()
                    .unwrap_or_else(|| "off".to_string()),
                networks: info
                    .network_settings
                    .clone()
                    .and_then(|n| n.networks)
                    .map(|n| n.into_keys().collect())
                    .unwrap_or_default(),
                dns: host.dns.clone().unwrap_or_default(),
                extra_hosts: host.extra_hosts.clone().unwrap_or_default(),
            },
            processes: Processes {
                titles: found.titles.clone(),
                rows: found.processes.clone(),
            },
            events: found
                .events
                .iter()
                .map(|e| Event {
                    time: e.time,
                    action: e.action.clone(),
                })
                .collect(),
            now,
        }
    }
}

impl fmt::Display for Description {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id: String = self.id.chars().take(12).collect();
        writeln!(f, "Sandbox:    {} ({id})", self.name)?;
        let session = self
            .session
            .as_deref()
            .map(|s| format!(", session {s}"))
            .unwrap_or_default();
        writeln!(
            f,
            "Of:         profile {}, task {}{session}",
            self.profile, self.task
        )?;
        writeln!(f, "State:      {}", self.state)?;
        if let Some(created) = &self.created_at {
            writeln!(f, "Created:    {created}")?;
        }
        if let Some(started) = &self.started_at {
            writeln!(f, "Started:    {started}")?;
        }
        writeln!(f, "Image:      {}", self.image)?;
        if self.spec.matches {
            writeln!(f, "Spec:       the config's ({})", self.spec.wanted)?;
        } else {
            let running = self.spec.running.as_deref().unwrap_or("none");
            writeln!(
                f,
                "Spec:       stale ({running}, the config wants {}): `hermes reconcile` recreates it",
                self.spec.wanted
            )?;
            for change in &self.spec.changes {
                writeln!(f, "  {}", change.describe())?;
            }
        }
        if !self.settings.is_empty() {
            writeln!(f, "Settings:")?;
            for (k, v) in &self.settings {
                if k.starts_with("docker_env.") {
                    // A fingerprint, not the value: only that it is set.
                    writeln!(f, "  {k}: (set)")?;
                } else if !v.is_empty() {
                    writeln!(f, "  {k}: {v}")?;
                }
            }
        }
        writeln!(f, "Mounts:")?;
        for m in &self.mounts {
            let mode = if m.writable { "rw" } else { "ro" };
            let source = if m.source.is_empty() { "-" } else { &m.source };
            writeln!(f, "  {} ← {source} ({}, {mode})", m.destination, m.kind)?;
        }
        writeln!(f, "Egress:     {}", self.egress.wiring)?;
        writeln!(f, "  Networks: {}", list(&self.egress.networks))?;
        writeln!(f, "  DNS:      {}", list(&self.egress.dns))?;
        writeln!(f, "  Hosts:    {}", list(&self.egress.extra_hosts))?;
        if self.processes.rows.is_empty() {
            writeln!(f, "Processes:  none")?;
        } else {
            writeln!(f, "Processes:")?;
            let pid = self.column("PID");
            let cmd = self.column("CMD").or_else(|| self.column("COMMAND"));
            for row in &self.processes.rows {
                let at = |i: Option<usize>| i.and_then(|i| row.get(i)).map_or("?", String::as_str);
                writeln!(f, "  {:>7}  {}", at(pid), at(cmd))?;
            }
        }
        writeln!(f, "Events:     {} held by the engine", self.events.len())?;
        for e in self.events.iter().rev().take(10).rev() {
            writeln!(
                f,
                "  {} ago  {}",
                hermes_reconcilers::age(self.now - e.time),
                e.action
            )?;
        }
        Ok(())
    }
}

impl Description {
    fn column(&self, title: &str) -> Option<usize> {
        self.processes.titles.iter().position(|t| t == title)
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(", ")
    }
}
