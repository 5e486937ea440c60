//! The engine's event stream, narrowed to containers labelled
//! `hermes-agent=1`: a controller wakes on each (a sandbox died, was
//! removed, ran out of memory) and then observes everything afresh, so the
//! events carry no meaning beyond "look again".

use std::collections::HashMap;

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

/// One event of a labelled container: its action (`die`, `destroy`, `oom`,
/// `start`…) and the container's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    pub action: String,
    pub container: String,
}

impl Engine {
    /// The events of `profile`'s labelled containers from now on that
    /// change what a pass would see: created, started, stopped, died,
    /// killed, out of memory, paused, renamed, removed (not the exec and
    /// attach events every command makes). The stream ends, or yields an
    /// error, when the engine goes away: reconnect after a delay.
    pub fn container_events(
        &self,
        profile: &str,
    ) -> impl Stream<Item = Result<ContainerEvent, DockerError>> + use<> {
        let filters = HashMap::from([
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
                LIFECYCLE_EVENTS.iter().map(|e| e.to_string()).collect(),
            ),
        ]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        self.docker.events(Some(options)).map(|item| match item {
            Ok(event) => Ok(ContainerEvent {
                action: event.action.unwrap_or_default(),
                container: event
                    .actor
                    .and_then(|a| a.attributes)
                    .and_then(|mut attrs| attrs.remove("name"))
                    .unwrap_or_default(),
            }),
            Err(e) => Err(DockerError::engine("read events", "the engine", e)),
        })
    }
}
