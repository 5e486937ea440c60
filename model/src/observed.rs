//! What a pass saw on the host: the labelled containers, as plain data.
//! Filled by the observers in `backends`; read by the planners.

use std::collections::BTreeMap;

use crate::sandbox::{LABEL_PROFILE, LABEL_SESSION, LABEL_SPEC_HASH, LABEL_TASK};

/// The engine's state of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Paused,
    Restarting,
    Removing,
    Exited,
    Dead,
}

impl ContainerState {
    /// The engine's word (`running`, `exited`, …); unknown words read as dead.
    pub fn from_engine(word: &str) -> ContainerState {
        match word {
            "created" => ContainerState::Created,
            "running" => ContainerState::Running,
            "paused" => ContainerState::Paused,
            "restarting" => ContainerState::Restarting,
            "removing" => ContainerState::Removing,
            "exited" => ContainerState::Exited,
            _ => ContainerState::Dead,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Paused => "paused",
            ContainerState::Restarting => "restarting",
            ContainerState::Removing => "removing",
            ContainerState::Exited => "exited",
            ContainerState::Dead => "dead",
        }
    }
}

/// One container labelled `hermes-agent=1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedContainer {
    pub id: String,
    /// Without the engine's leading `/`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub state: ContainerState,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds of the last start, if it ever started.
    pub started_at: Option<i64>,
    /// Unix seconds of the last exit, if it ever exited.
    pub finished_at: Option<i64>,
    /// Processes running inside, besides the init, when known (read only
    /// for running containers the plan may replace).
    pub processes: Option<u32>,
}

impl ObservedContainer {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    pub fn profile(&self) -> Option<&str> {
        self.label(LABEL_PROFILE)
    }

    pub fn task(&self) -> Option<&str> {
        self.label(LABEL_TASK)
    }

    pub fn session(&self) -> Option<&str> {
        self.label(LABEL_SESSION)
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.label(LABEL_SPEC_HASH).filter(|h| !h.is_empty())
    }
}

/// Everything a pass saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub containers: Vec<ObservedContainer>,
}
