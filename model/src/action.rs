//! The operations of the host's plan. Each is one engine call or a short
//! idempotent sequence, so a pass cut short (even by `kill -9`) is finished
//! by the next one.

use crate::plan::{Describe, Kind};
use crate::sandbox::SandboxSpec;

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the container and start it.
    Create(Box<SandboxSpec>),
    /// Start an existing container whose spec is current.
    Start { id: String },
    /// Remove the old container, then create and start the new spec. The
    /// sandbox's data lives in bind mounts and is kept.
    Recreate {
        old_id: String,
        spec: Box<SandboxSpec>,
    },
    /// Remove a container (a duplicate, or one that is reaped).
    Remove { id: String, name: String },
    /// Make the proxy's CA, tokens, mappings and config (`egress setup`).
    ProxySetup,
    /// Start the proxy daemon.
    ProxyStart,
    /// Stop the proxy daemon and start it again with the current settings.
    ProxyRestart,
    /// Stop the proxy daemon.
    ProxyStop,
    /// Make the workspace directory on the SSH backend's host (relative to
    /// the remote home), trusting the host's key if it is new.
    PrepareWorkspace { path: String },
    /// Wanted, but refused; the cause says why.
    Blocked,
    /// A labelled container hermes does not manage or no longer wants:
    /// reported, never touched.
    Keep { id: String, verb: &'static str },
}

impl Describe for Action {
    fn kind(&self) -> Kind {
        match self {
            Action::Create(_) | Action::Start { .. } | Action::PrepareWorkspace { .. } => {
                Kind::Create
            }
            Action::ProxySetup | Action::ProxyStart => Kind::Create,
            Action::Recreate { .. } | Action::ProxyRestart => Kind::Change,
            Action::Remove { .. } | Action::ProxyStop => Kind::Remove,
            Action::Blocked => Kind::Blocked,
            Action::Keep { .. } => Kind::Report,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Action::Create(_) => "create",
            Action::Start { .. } => "start",
            Action::PrepareWorkspace { .. } => "prepare",
            Action::Recreate { .. } => "recreate",
            Action::Remove { .. } => "remove",
            Action::ProxySetup => "setup",
            Action::ProxyStart => "start",
            Action::ProxyRestart => "restart",
            Action::ProxyStop => "stop",
            Action::Blocked => "blocked",
            Action::Keep { verb, .. } => verb,
        }
    }
}
