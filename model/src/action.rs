//! The operations of the host's plan. Each is one engine call or a short
//! idempotent sequence, so a pass cut short (even by `kill -9`) is finished
//! by the next one.
//!
//! An [`Action`] is one family's operation ([`SandboxAction`] on a Docker
//! sandbox, [`ProxyAction`] on the egress proxy, [`SshAction`] on the SSH
//! backend's host, [`InstanceAction`] on a singularity instance,
//! [`CloudAction`] on a cloud service's sandbox, [`PodAction`] on a
//! Kubernetes sandbox), or one of the two that
//! change nothing: a refusal ([`Action::Blocked`]) or a report
//! ([`Action::Keep`]). Each applier takes its own family and matches it
//! whole: a new operation cannot be forgotten by one of them.

use crate::kubernetes::proxy::{ProxyObject, ProxyWanted};
use crate::kubernetes::{PodWanted, SandboxKind};
use crate::observed::MountedDisk;
use crate::plan::{Describe, Kind, Op};
use crate::sandbox::SandboxSpec;
use crate::singularity::InstanceSpec;

/// An operation of the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A Docker sandbox's (or a labelled container's).
    Sandbox(SandboxAction),
    /// The egress proxy daemon's.
    Proxy(ProxyAction),
    /// The SSH backend's host's.
    Ssh(SshAction),
    /// A singularity instance's.
    Instance(InstanceAction),
    /// A cloud service's sandbox's.
    Cloud(CloudAction),
    /// A Kubernetes sandbox's (its Pod, its claim).
    Pod(PodAction),
    /// Wanted, but refused; the cause says why.
    Blocked,
    /// Something hermes does not manage or no longer wants (a labelled
    /// container, a cloud sandbox the service is busy with): reported,
    /// never touched.
    Keep { id: String, verb: &'static str },
}

/// An operation on a Docker sandbox.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxAction {
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
    /// Remove a container (a duplicate, or one that is reaped); with
    /// `disk`, then release its sandbox's disk image (as
    /// [`SandboxAction::ReleaseDisk`]) once no container uses it.
    Remove {
        id: String,
        name: String,
        disk: Option<Box<MountedDisk>>,
    },
    /// Adopt a container Hermes Agent made, whose settings are those of
    /// `spec`, as it is: hermes records the spec's hash as the container's
    /// (it cannot label a container after the fact), in its home, and
    /// manages it from then on.
    Adopt { id: String, spec: Box<SandboxSpec> },
    /// Move the task's data from hermes's earlier layout to the one it
    /// shares with Hermes Agent (renames only), then make the sandbox of
    /// `spec`: as a replacement of `old_id` when a container of the task
    /// exists (stopped first, its running commands ended first as a
    /// replacement's are), else as a create.
    Migrate {
        old_id: Option<String>,
        spec: Box<SandboxSpec>,
        data: Box<crate::migration::DataMove>,
    },
    /// Release a disk image whose sandbox's container is gone: unmount it
    /// from the data directory and free its loop device. The image file,
    /// and so the sandbox's files, stay; the next create mounts it again.
    ReleaseDisk(Box<MountedDisk>),
    /// Make a warm-pool member: create the container, start it, run a
    /// first command in it (through its runner), and record it ready once
    /// that answered. Until then no session claims it.
    Warm(Box<SandboxSpec>),
    /// Stop an idle sandbox's container (`terminal.idle_action: stop`):
    /// its processes end, its memory is given back, its files stay; the
    /// next command starts it again.
    Stop { id: String },
}

/// An operation on the egress proxy daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyAction {
    /// Make the proxy's CA, tokens, mappings and config (`egress setup`).
    Setup,
    /// Start the proxy daemon.
    Start,
    /// Stop the proxy daemon and start it again with the current settings.
    Restart,
    /// Have the running proxy load its tokens and real keys again
    /// (SIGHUP), keeping its connections.
    Reload,
    /// Stop the proxy daemon.
    Stop,
    /// Remove the proxy-only network and its host firewall chain
    /// (`proxy.enforce_network` is off).
    RemoveNetwork,
}

/// An operation on the SSH backend's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshAction {
    /// Make the workspace directory on the host (relative to the remote
    /// home), trusting the host's key if it is new.
    PrepareWorkspace { path: String },
}

/// An operation on a singularity instance.
#[derive(Debug, Clone, PartialEq)]
pub enum InstanceAction {
    /// Start the instance (building its image into the cache first when it
    /// is not there).
    Start(Box<InstanceSpec>),
    /// Stop the instance and start it with the current spec; its overlay,
    /// and so its files, are kept.
    Restart(Box<InstanceSpec>),
    /// Stop a session's instance and remove its directory (its overlay):
    /// the session's end (`hermes session end`).
    End {
        /// The instance's name.
        name: String,
        /// The directory hermes keeps the instance's overlay and records in.
        dir: std::path::PathBuf,
    },
    /// Stop the instance, its overlay (and so its files) kept: `hermes
    /// down`; the next pass starts it again.
    Stop {
        /// The instance's name.
        name: String,
    },
}

/// An operation on a Kubernetes sandbox. Every write is a server-side
/// apply with hermes's field manager; every delete names the object's uid
/// as a precondition, so an object made again since it was seen (by
/// someone else) is never the one deleted.
#[derive(Debug, Clone, PartialEq)]
pub enum PodAction {
    /// Make the persistent sandbox's claim.
    CreateClaim(Box<PodWanted>),
    /// Make the sandbox's Pod (its claim made first).
    Create(Box<PodWanted>),
    /// Delete the Pod (`uid`) and make it again with the current spec: its
    /// claim, and so its files, kept.
    Replace { wanted: Box<PodWanted>, uid: String },
    /// Delete a Pod hermes made (`uid`), or the `Sandbox` that holds it
    /// (`kind`; its Pod goes with it): a session's end (its `emptyDir`
    /// goes with it), `hermes down`, an ended Pod.
    Delete {
        name: String,
        uid: String,
        kind: SandboxKind,
    },
    /// The idle reaper's delete of a Pod hermes made (`uid`), carried out
    /// only if the Pod is still idle when it is applied: nothing used it
    /// for `lifetime` seconds and nothing runs in it, and the object is
    /// the very one then looked at (its resource version), so a command
    /// that started since the plan keeps its Pod.
    DeleteIdle {
        name: String,
        uid: String,
        lifetime: i64,
        kind: SandboxKind,
    },
    /// The idle reaper's suspension of a `Sandbox` hermes made (`uid`):
    /// `operatingMode: Suspended`, so its controller deletes the Pod and
    /// keeps the claims; decided again when applied, as
    /// [`PodAction::DeleteIdle`] is.
    Suspend {
        name: String,
        uid: String,
        lifetime: i64,
    },
    /// Bring the suspended `Sandbox` of `uid` back (`operatingMode:
    /// Running`): its controller makes its Pod again, on its claims.
    Resume { wanted: Box<PodWanted>, uid: String },
    /// Write one object of the home's egress proxy in the cluster as
    /// `wanted` says (server-side apply), `existing` the uid of the one
    /// there now. The Pod is replaced instead (the old one deleted by that
    /// uid first) and waited for until it is Ready.
    ApplyProxy {
        object: ProxyObject,
        wanted: Box<ProxyWanted>,
        existing: Option<String>,
    },
    /// Delete one object of the home's proxy (`uid`): the proxy is off.
    DeleteProxy {
        object: ProxyObject,
        name: String,
        uid: String,
    },
}

/// An operation on a cloud service's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudAction {
    /// Create a sandbox on the service, from the task's snapshot when
    /// there is one, else from the base image.
    Create { snapshot: Option<String> },
    /// Start the task's stopped sandbox on the service again.
    Resume { id: String },
    /// Delete a sandbox the service says is dead, then create as
    /// [`CloudAction::Create`].
    Recreate {
        old_id: String,
        snapshot: Option<String>,
    },
    /// Suspend the sandbox keeping its filesystem (a snapshot recorded for
    /// the next session, or the stopped sandbox itself): a session's end
    /// (`hermes session end`).
    Suspend { id: String },
}

impl Describe for Action {
    fn kind(&self) -> Kind {
        match self {
            Action::Sandbox(a) => a.kind(),
            Action::Proxy(a) => a.kind(),
            Action::Ssh(a) => a.kind(),
            Action::Instance(a) => a.kind(),
            Action::Pod(a) => a.kind(),
            Action::Cloud(a) => a.kind(),
            Action::Blocked => Kind::Blocked,
            Action::Keep { .. } => Kind::Report,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Action::Sandbox(a) => a.verb(),
            Action::Proxy(a) => a.verb(),
            Action::Ssh(a) => a.verb(),
            Action::Instance(a) => a.verb(),
            Action::Pod(a) => a.verb(),
            Action::Cloud(a) => a.verb(),
            Action::Blocked => "blocked",
            Action::Keep { verb, .. } => verb,
        }
    }

    fn step(&self) -> u8 {
        match self {
            Action::Pod(a) => a.step(),
            _ => 0,
        }
    }
}

impl SandboxAction {
    /// The spec of the container the operation makes: a create's, a
    /// recreate's, a migration's; `None` for one that makes none.
    pub fn made(&self) -> Option<&SandboxSpec> {
        match self {
            SandboxAction::Create(spec)
            | SandboxAction::Warm(spec)
            | SandboxAction::Recreate { spec, .. }
            | SandboxAction::Migrate { spec, .. } => Some(spec),
            SandboxAction::Start { .. }
            | SandboxAction::Stop { .. }
            | SandboxAction::Adopt { .. }
            | SandboxAction::Remove { .. }
            | SandboxAction::ReleaseDisk(_) => None,
        }
    }
}

impl Describe for SandboxAction {
    fn kind(&self) -> Kind {
        match self {
            SandboxAction::Create(_) | SandboxAction::Warm(_) => Kind::Create,
            SandboxAction::Stop { .. } => Kind::Change,
            // A stopped container exists: starting it changes it.
            SandboxAction::Start { .. }
            | SandboxAction::Recreate { .. }
            | SandboxAction::Adopt { .. }
            | SandboxAction::Migrate { .. } => Kind::Change,
            SandboxAction::Remove { .. } | SandboxAction::ReleaseDisk(_) => Kind::Remove,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            SandboxAction::Create(_) | SandboxAction::Warm(_) => "create",
            SandboxAction::Start { .. } => "start",
            SandboxAction::Stop { .. } => "stop",
            SandboxAction::Recreate { .. } => "recreate",
            SandboxAction::Adopt { .. } => "adopt",
            SandboxAction::Migrate { .. } => "migrate",
            SandboxAction::Remove { .. } => "remove",
            SandboxAction::ReleaseDisk(_) => "release-disk",
        }
    }
}

impl Describe for ProxyAction {
    fn kind(&self) -> Kind {
        match self {
            ProxyAction::Setup | ProxyAction::Start => Kind::Create,
            ProxyAction::Restart | ProxyAction::Reload => Kind::Change,
            ProxyAction::Stop | ProxyAction::RemoveNetwork => Kind::Remove,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            ProxyAction::Setup => "setup",
            ProxyAction::Start => "start",
            ProxyAction::Restart => "restart",
            ProxyAction::Reload => "reload",
            ProxyAction::Stop => "stop",
            ProxyAction::RemoveNetwork => "remove-network",
        }
    }
}

impl Describe for SshAction {
    fn kind(&self) -> Kind {
        match self {
            SshAction::PrepareWorkspace { .. } => Kind::Create,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            SshAction::PrepareWorkspace { .. } => "prepare",
        }
    }
}

impl Describe for InstanceAction {
    fn kind(&self) -> Kind {
        match self {
            // An instance that is not running does not exist.
            InstanceAction::Start(_) => Kind::Create,
            InstanceAction::Restart(_) => Kind::Change,
            InstanceAction::End { .. } | InstanceAction::Stop { .. } => Kind::Remove,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            InstanceAction::Start(_) => "start",
            InstanceAction::Restart(_) => "restart",
            InstanceAction::End { .. } => "end",
            InstanceAction::Stop { .. } => "stop",
        }
    }
}

impl Describe for PodAction {
    fn kind(&self) -> Kind {
        match self {
            PodAction::CreateClaim(_)
            | PodAction::Create(_)
            | PodAction::ApplyProxy { existing: None, .. } => Kind::Create,
            PodAction::Replace { .. }
            | PodAction::Resume { .. }
            | PodAction::ApplyProxy {
                existing: Some(_), ..
            } => Kind::Change,
            PodAction::Delete { .. }
            | PodAction::DeleteIdle { .. }
            | PodAction::Suspend { .. }
            | PodAction::DeleteProxy { .. } => Kind::Remove,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            PodAction::CreateClaim(_) => "create-claim",
            PodAction::Create(_) => "create",
            PodAction::Replace { .. } => "replace",
            PodAction::Delete { .. }
            | PodAction::DeleteIdle { .. }
            | PodAction::DeleteProxy { .. } => "delete",
            PodAction::Suspend { .. } => "suspend",
            PodAction::Resume { .. } => "resume",
            PodAction::ApplyProxy { existing: None, .. } => "create",
            PodAction::ApplyProxy {
                object: ProxyObject::Pod,
                existing: Some(_),
                ..
            } => "replace",
            PodAction::ApplyProxy { .. } => "update",
        }
    }

    /// A Pod's claim is made before the Pod that mounts it; the proxy's
    /// Pod after what it mounts and is reached through.
    fn step(&self) -> u8 {
        match self {
            PodAction::Create(_)
            | PodAction::Resume { .. }
            | PodAction::ApplyProxy {
                object: ProxyObject::Pod,
                ..
            } => 1,
            _ => 0,
        }
    }
}

impl Describe for CloudAction {
    fn kind(&self) -> Kind {
        match self {
            CloudAction::Create { .. } => Kind::Create,
            // A stopped sandbox exists: starting it changes it.
            CloudAction::Resume { .. } | CloudAction::Recreate { .. } => Kind::Change,
            // It is kept, stopped or as a snapshot.
            CloudAction::Suspend { .. } => Kind::Change,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            CloudAction::Create { .. } => "create",
            CloudAction::Resume { .. } => "resume",
            CloudAction::Recreate { .. } => "recreate",
            CloudAction::Suspend { .. } => "suspend",
        }
    }
}

/// A plan's operations sorted by family, in the plan's order: what each
/// applier carries out. Refusals and reports belong to none.
#[derive(Debug, Default)]
pub struct Families<'a> {
    pub sandbox: Vec<(&'a Op<Action>, &'a SandboxAction)>,
    pub proxy: Vec<(&'a Op<Action>, ProxyAction)>,
    pub ssh: Vec<(&'a Op<Action>, &'a SshAction)>,
    pub instance: Vec<(&'a Op<Action>, &'a InstanceAction)>,
    pub cloud: Vec<(&'a Op<Action>, &'a CloudAction)>,
    pub pod: Vec<(&'a Op<Action>, &'a PodAction)>,
}

impl<'a> Families<'a> {
    /// The operations of `ops`, each with its family's action.
    pub fn of(ops: &'a [Op<Action>]) -> Families<'a> {
        let mut families = Families::default();
        for op in ops {
            match &op.action {
                Action::Sandbox(a) => families.sandbox.push((op, a)),
                Action::Proxy(a) => families.proxy.push((op, *a)),
                Action::Ssh(a) => families.ssh.push((op, a)),
                Action::Instance(a) => families.instance.push((op, a)),
                Action::Cloud(a) => families.cloud.push((op, a)),
                Action::Pod(a) => families.pod.push((op, a)),
                Action::Blocked | Action::Keep { .. } => {}
            }
        }
        families
    }
}
