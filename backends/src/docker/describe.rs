//! What `hermes sandbox describe` shows of one container, as the engine
//! has it: its inspect (state, image, mounts, networks, labels), the
//! processes running in it, and the events the engine still holds of it.

use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::EventsOptionsBuilder;
use futures_util::StreamExt;
use std::collections::HashMap;

use super::events::ContainerEvent;
use super::{DockerError, Engine, is_not_found};

/// How many of the engine's past events of the container are read at
/// most.
const EVENT_LIMIT: usize = 200;

/// How far back the events are asked for.
const EVENTS_WINDOW_SECONDS: i64 = 30 * 86_400;

/// One container, described.
#[derive(Debug, Clone)]
pub struct Described {
    pub inspect: ContainerInspectResponse,
    /// `docker top`: the column titles and one row per process; empty
    /// when it is not running.
    pub titles: Vec<String>,
    pub processes: Vec<Vec<String>>,
    /// The engine's events of the container still held, oldest first.
    pub events: Vec<ContainerEvent>,
}

impl Engine {
    /// Describes the container `name` (an exact name or id): `None` when
    /// there is none.
    pub async fn describe(&self, name: &str, now: i64) -> Result<Option<Described>, DockerError> {
        let inspect = match self.docker.inspect_container(name, None).await {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(DockerError::engine("inspect", name, e)),
        };
        let running = inspect
            .state
            .as_ref()
            .and_then(|s| s.running)
            .unwrap_or(false);
        let (titles, processes) = if running {
            match self.top(name, super::top::Seen::of(&inspect)).await {
                Ok(top) => (
                    top.titles.unwrap_or_default(),
                    top.processes.unwrap_or_default(),
                ),
                Err(e) => {
                    tracing::debug!(container = %name, error = %e, "top failed");
                    (Vec::new(), Vec::new())
                }
            }
        } else {
            (Vec::new(), Vec::new())
        };
        let id = inspect.id.clone().unwrap_or_else(|| name.to_string());
        let filters = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("container", vec![id]),
        ]);
        // With `until`, the engine ends the stream once it has replayed
        // (it holds a bounded number of recent events anyway).
        let since = now.saturating_sub(EVENTS_WINDOW_SECONDS);
        let options = EventsOptionsBuilder::default()
            .since(&since.to_string())
            // Now to the nanosecond: a whole second ahead would make the
            // engine wait out the rest of this one.
            .until(&super::events::engine_time(std::time::SystemTime::now()))
            .filters(&filters)
            .build();
        let mut stream = Box::pin(self.docker.events(Some(options)).take(EVENT_LIMIT * 10));
        let mut events = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    let event = ContainerEvent::of(event);
                    // Attach and resize events say nothing to a person.
                    if !matches!(event.action.as_str(), "attach" | "resize" | "exec_create") {
                        events.push(event);
                    }
                }
                Err(e) => {
                    tracing::debug!(container = %name, error = %e, "cannot read its events");
                    break;
                }
            }
        }
        let skip = events.len().saturating_sub(EVENT_LIMIT);
        events.drain(..skip);
        Ok(Some(Described {
            inspect,
            titles,
            processes,
            events,
        }))
    }
}
