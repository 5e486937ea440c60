//! The operations of the host's plan. Each is one engine call or a short
//! idempotent sequence, so a pass cut short (even by `kill -9`) is finished
//! by the next one.

use crate::plan::{Describe, Kind};
use crate::sandbox::SandboxSpec;
use crate::singularity::InstanceSpec;

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
    /// Start a singularity instance (building its image into the cache
    /// first when it is not there).
    InstanceStart(Box<InstanceSpec>),
    /// Stop the instance and start it with the current spec; its overlay,
    /// and so its files, are kept.
    InstanceRestart(Box<InstanceSpec>),
    /// Create a sandbox on the cloud service, from the task's snapshot when
    /// there is one, else from the base image.
    CloudCreate { snapshot: Option<String> },
    /// Start the task's stopped sandbox on the service again.
    CloudResume { id: String },
    /// Delete a sandbox the service says is dead, then create as
    /// [`Action::CloudCreate`].
    CloudRecreate {
        old_id: String,
        snapshot: Option<String>,
    },
    /// Wanted, but refused; the cause says why.
    Blocked,
    /// A labelled container hermes does not manage or no longer wants:
    /// reported, never touched.
    Keep { id: String, verb: &'static str },
}

impl Describe for Action {
    fn kind(&self) -> Kind {
        match self {
            Action::Create(_) | Action::PrepareWorkspace { .. } => Kind::Create,
            Action::ProxySetup | Action::ProxyStart => Kind::Create,
            // An instance that is not running does not exist.
            Action::InstanceStart(_) | Action::CloudCreate { .. } => Kind::Create,
            // A stopped container or sandbox exists: starting it changes it.
            Action::Start { .. } | Action::CloudResume { .. } => Kind::Change,
            Action::InstanceRestart(_) | Action::CloudRecreate { .. } => Kind::Change,
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
            Action::InstanceStart(_) => "start",
            Action::InstanceRestart(_) => "restart",
            Action::CloudCreate { .. } => "create",
            Action::CloudResume { .. } => "resume",
            Action::CloudRecreate { .. } => "recreate",
            Action::Blocked => "blocked",
            Action::Keep { verb, .. } => verb,
        }
    }
}
