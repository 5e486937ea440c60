//! The engine's event stream, narrowed to containers labelled
//! `hermes-agent=1`: a controller wakes on each lifecycle event (a sandbox
//! died, was removed, ran out of memory) and then observes everything
//! afresh, so those events carry no meaning beyond "look again". The exec
//! events are activity: whoever ran the command (`hermes exec`, or Hermes
//! Agent's own `docker exec`), the sandbox was in use then. A controller
//! records them as they come; a pass reads what the engine still holds
//! ([`Engine::exec_activity`]).

use std::collections::{BTreeMap, HashMap};

use bollard::query_parameters::EventsOptionsBuilder;
use futures_util::{Stream, StreamExt};
use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE};

/// The container events that change what a pass sees.
const LIFECYCLE_EVENTS: &[&str] = &[
    "create", "start", "restart", "stop", "die", "kill", "oom", "pause", "unpause", "rename",
    "update", "destroy",
];

use super::Engine;
use super::error::DockerError;

/// The exec events, which mark a sandbox's use (the engine adds the
/// command to `exec_start`'s action: matched by prefix, never kept).
const EXEC_EVENTS: &[&str] = &["exec_start", "exec_die"];

/// At most this many events are read back by one pass: the engine keeps
/// only its last few hundred anyway.
const REPLAY_LIMIT: usize = 10_000;

/// One event of a labelled container: its action (`die`, `destroy`, `oom`,
/// `start`, `exec_start`…, without what follows a `:`, the command of an
/// exec), the container's name, and when (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    pub action: String,
    pub container: String,
    pub time: i64,
}

impl ContainerEvent {
    /// A command started or ended in the container: activity, not a
    /// change of what a pass sees.
    pub fn is_exec(&self) -> bool {
        EXEC_EVENTS.contains(&self.action.as_str())
    }

    pub(super) fn of(event: bollard::models::EventMessage) -> ContainerEvent {
        let action = event.action.unwrap_or_default();
        ContainerEvent {
            // `exec_start: sh -c …`: the command is not ours to keep.
            action: action
                .split(':')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string(),
            container: event
                .actor
                .and_then(|a| a.attributes)
                .and_then(|mut attrs| attrs.remove("name"))
                .unwrap_or_default(),
            time: event.time.unwrap_or_default(),
        }
    }
}

/// The filters of `profile`'s labelled containers' events of `kinds`.
fn filters(profile: &str, kinds: &[&[&str]]) -> HashMap<&'static str, Vec<String>> {
    HashMap::from([
        ("type", vec!["container".to_string()]),
        (
            "label",
            vec![
                format!("{LABEL_AGENT}=1"),
                format!("{LABEL_PROFILE}={profile}"),
            ],
        ),
        (
            "event",
            kinds
                .iter()
                .flat_map(|k| k.iter())
                .map(|e| e.to_string())
                .collect(),
        ),
    ])
}

impl Engine {
    /// The events of `profile`'s labelled containers from now on: those
    /// that change what a pass would see (created, started, stopped, died,
    /// killed, out of memory, paused, renamed, removed) and a command's
    /// start and end ([`ContainerEvent::is_exec`]); not the attach events.
    /// The stream ends, or yields an error, when the engine goes away:
    /// reconnect after a delay.
    pub fn container_events(
        &self,
        profile: &str,
    ) -> impl Stream<Item = Result<ContainerEvent, DockerError>> + use<> {
        let filters = filters(profile, &[LIFECYCLE_EVENTS, EXEC_EVENTS]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        self.docker.events(Some(options)).map(|item| match item {
            Ok(event) => Ok(ContainerEvent::of(event)),
            Err(e) => Err(DockerError::engine("read events", "the engine", e)),
        })
    }

    /// The last command's start or end (Unix seconds) in each of
    /// `profile`'s labelled containers, by name, from the events the
    /// engine still holds between `since` and `until`: the uses that
    /// hermes did not record itself (Hermes Agent's `docker exec`). The
    /// engine keeps a bounded number of recent events, so an older use may
    /// be missing; a controller records each as it comes.
    pub async fn exec_activity(
        &self,
        profile: &str,
        since: i64,
        until: std::time::SystemTime,
    ) -> Result<BTreeMap<String, i64>, DockerError> {
        let filters = filters(profile, &[EXEC_EVENTS]);
        let options = EventsOptionsBuilder::default()
            .since(&since.to_string())
            .until(&engine_time(until))
            .filters(&filters)
            .build();
        // With `until`, the engine ends the stream once it has replayed.
        let mut events = Box::pin(self.docker.events(Some(options)).take(REPLAY_LIMIT));
        let mut last = BTreeMap::new();
        while let Some(item) = events.next().await {
            let event = ContainerEvent::of(
                item.map_err(|e| DockerError::engine("read events", "the engine", e))?,
            );
            if event.container.is_empty() || !event.is_exec() {
                continue;
            }
            let at = last.entry(event.container).or_insert(event.time);
            *at = (*at).max(event.time);
        }
        Ok(last)
    }
}

/// `at` as the engine's events API takes it: seconds and nanoseconds. A
/// whole second after now would include this second's events too, but the
/// engine then holds the stream open until that second is over: up to a
/// second added to every pass.
pub fn engine_time(at: std::time::SystemTime) -> String {
    let d = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
}
