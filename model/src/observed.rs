//! What a pass saw on the host: the labelled containers, as plain data.
//! Filled by the observers in `backends`; read by the planners.

use std::collections::BTreeMap;

use crate::sandbox::{
    LABEL_EGRESS, LABEL_POOL, LABEL_PROFILE, LABEL_RUNNER, LABEL_SESSION, LABEL_SESSION_TASK,
    LABEL_SPEC_HASH, LABEL_TASK,
};

/// The task of the container Hermes Agent starts, at each start of its
/// CLI, to describe the backend to its model (`agent/prompt_builder.py`);
/// it stays running after the probe's one command.
pub const AGENT_PROBE_TASK: &str = "prompt-backend-probe";

/// The engine's state of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ContainerState {
    #[default]
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// For a container without a spec hash (made by Hermes Agent, which
    /// labels its sandboxes as hermes does but records no spec), what its
    /// inspect says of the settings that shape it; `None` for hermes's own
    /// and for one not inspected (still `created`).
    pub made_by_agent: Option<AgentMade>,
    /// The spec hash hermes recorded when it adopted this container as it
    /// was (it cannot label a container after the fact); `None` unless
    /// adopted.
    pub adopted_hash: Option<String>,
}

/// A container Hermes Agent made, as its inspect shows it: what hermes
/// compares with the sandbox it wants before adopting it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentMade {
    pub image: String,
    pub nano_cpus: i64,
    pub memory_bytes: i64,
    pub shm_size_bytes: i64,
    pub pids_limit: Option<i64>,
    /// `none`, `bridge`, a network's name.
    pub network_mode: String,
    /// `host:container[:options]`, as the engine keeps them.
    pub binds: Vec<String>,
    /// Mount point → options.
    pub tmpfs: BTreeMap<String, String>,
    pub env: Vec<(String, String)>,
    pub cap_add: Vec<String>,
    pub devices: Vec<String>,
    pub extra_hosts: Vec<String>,
    pub init: bool,
    /// `Config.User`: empty for the image's user.
    pub user: String,
    /// `Config.Entrypoint`: the image's, unless the agent's run set one.
    pub entrypoint: Vec<String>,
}

impl ObservedContainer {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    pub fn profile(&self) -> Option<&str> {
        self.label(LABEL_PROFILE)
    }

    /// The OCI runtime hermes made it with, from its settings label;
    /// `None`: the engine's default (or a container hermes did not make).
    pub fn runtime(&self) -> Option<String> {
        self.label(crate::settings::LABEL_SETTINGS)
            .and_then(crate::settings::recorded_runtime)
    }

    /// The task: a persistent sandbox's `hermes-task-id`, a session's
    /// `hermes-session-task` (or, made before that label, its
    /// `hermes-task-id`).
    pub fn task(&self) -> Option<&str> {
        match self.session() {
            Some(_) => self.label(LABEL_SESSION_TASK).or(self.label(LABEL_TASK)),
            None => self.label(LABEL_TASK),
        }
    }

    /// Its session: a session sandbox's label, or, for a warm-pool member
    /// a session claimed, the session its name is now
    /// (`hermes-<profile>-<task>-<session>`).
    pub fn session(&self) -> Option<&str> {
        self.label(LABEL_SESSION).or_else(|| self.claimed_by())
    }

    /// The session that claimed this warm-pool member (renamed it to its
    /// container name); `None` for an unclaimed member and any other
    /// container.
    pub fn claimed_by(&self) -> Option<&str> {
        let member = self.label(LABEL_POOL)?;
        if self.name == member {
            return None;
        }
        let prefix = format!(
            "hermes-{}-{}-",
            self.profile()?,
            self.label(LABEL_SESSION_TASK)?
        );
        self.name.strip_prefix(&prefix).filter(|s| !s.is_empty())
    }

    /// Whether this is a warm-pool member no session claimed yet.
    pub fn is_unclaimed_pool_member(&self) -> bool {
        self.label(LABEL_POOL)
            .is_some_and(|member| member == self.name)
    }

    /// Whether Hermes Agent made it: its three labels (`hermes-agent=1`,
    /// a task, a profile) and none of hermes's own (no spec hash, session,
    /// runner or egress label), and not adopted by hermes since.
    pub fn is_agents(&self) -> bool {
        self.label(LABEL_TASK).is_some()
            && self.profile().is_some()
            && self.spec_hash().is_none()
            && [
                LABEL_SESSION,
                LABEL_SESSION_TASK,
                LABEL_RUNNER,
                LABEL_EGRESS,
            ]
            .iter()
            .all(|l| self.label(l).is_none())
    }

    /// The spec hash: its label, or the one hermes recorded when it
    /// adopted the container.
    pub fn spec_hash(&self) -> Option<&str> {
        self.label(LABEL_SPEC_HASH)
            .or(self.adopted_hash.as_deref())
            .filter(|h| !h.is_empty())
    }
}

/// Everything a pass saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub containers: Vec<ObservedContainer>,
    /// Unix seconds of the last exec start or finish, by container name,
    /// from the records kept outside the containers.
    pub activity: BTreeMap<String, i64>,
    /// The egress proxy daemon as seen by this pass.
    pub proxy: ProxyObserved,
    /// The remote host of the SSH backend, when that is the backend.
    pub ssh: Option<crate::ssh::SshObserved>,
    /// The cloud service's sandbox, when a cloud is the backend.
    pub cloud: Option<crate::cloud::CloudObserved>,
    /// The singularity instances, when that is the backend.
    pub singularity: Option<crate::singularity::SingularityObserved>,
    /// The namespace's sandbox Pods and claims, when kubernetes is the
    /// backend.
    pub kubernetes: Option<crate::kubernetes::KubeObserved>,
    /// The sandboxes' disk images (`terminal.container_disk`) mounted under
    /// this home, seen only when the containers were (an engine answered).
    pub disks: Vec<MountedDisk>,
    /// The wanted sandboxes' data still in hermes's earlier layout.
    pub legacy: Vec<crate::migration::LegacyData>,
    /// The images of the wanted Docker sandboxes that the engine does not
    /// have: making a sandbox of one pulls it first.
    pub missing_images: std::collections::BTreeSet<String>,
    /// The OCI runtimes the engine lists (its `Runtimes`), asked when a
    /// wanted sandbox names one (`terminal.docker_runtime`); `None`: not
    /// asked, or the engine did not say.
    pub runtimes: Option<std::collections::BTreeSet<String>>,
    /// The warm-pool members that answered their first command, by name:
    /// the id of the container that answered and when it was started
    /// then (an engine's restart starts nothing: a member stopped since
    /// is not ready).
    pub pool_ready: BTreeMap<String, PoolReady>,
    /// The warm-pool member names whose runner directory is on the host
    /// (a claimed member's keeps it until its container is removed): no
    /// new member is made under one.
    pub pool_names_held: std::collections::BTreeSet<String>,
}

/// A warm-pool member's record of its first command answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReady {
    pub id: String,
    /// The container's start (Unix seconds) when it answered.
    pub started_at: i64,
}

impl Observed {
    /// Whether the unclaimed pool member `c` answered a command since its
    /// last start.
    pub fn pool_member_ready(&self, c: &ObservedContainer) -> bool {
        c.state == ContainerState::Running
            && self
                .pool_ready
                .get(&c.name)
                .is_some_and(|r| r.id == c.id && Some(r.started_at) == c.started_at)
    }
}

/// A persistent sandbox's disk image mounted on its data directory
/// (`<home>/sandboxes/docker/<profile>/<task>`, the image `.<task>.disk`
/// beside it), as the host's mount table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedDisk {
    /// The profile and the task, as the data directory's path names them.
    pub profile: String,
    pub task: String,
    /// The data directory the image is mounted on.
    pub mount_point: std::path::PathBuf,
    /// The image file.
    pub image: std::path::PathBuf,
    /// The loop devices mounted there (`/dev/loop3`), first mounted first.
    pub devices: Vec<String>,
    /// Whether the image file was deleted: what it holds is then reachable
    /// through this mount only, and goes once it is unmounted.
    pub deleted: bool,
    /// The containers (any, by id) with a bind mount from inside it.
    pub users: Vec<String>,
}

/// The egress proxy daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyObserved {
    /// Its process is alive (the pid file names a live proxy).
    pub running: bool,
    /// Its management endpoint answered the health check.
    pub healthy: bool,
    /// The fingerprint of the settings it runs with, as it reports them.
    pub settings: Option<String>,
    /// What is wrong, in words, when it is not healthy.
    pub problem: Option<String>,
    /// This home's proxy-only network (`proxy.enforce_network`) and its
    /// host firewall chain, when either exists.
    pub network: Option<ProxyNetworkObserved>,
    /// The real keys it holds, by provider, as its health endpoint says;
    /// `None` when it does not say (or does not answer).
    pub keys: Option<BTreeMap<String, crate::egress::KeyState>>,
}

/// The proxy-only network of this home as a pass found it: the Docker
/// network (with hermes's labels and this home's `hermes-home` label) or
/// its firewall chain, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyNetworkObserved {
    /// The Docker network's name.
    pub name: String,
    /// Whether the Docker network exists.
    pub exists: bool,
    /// The containers attached to it (their ids).
    pub attached: Vec<String>,
    /// The host firewall chain's name.
    pub chain: String,
    /// Whether the chain (or its rules) is in the host firewall.
    pub chain_exists: bool,
}

/// Whether a container is in use, and since when it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idleness {
    /// Not running: idleness does not apply.
    NotRunning,
    /// Processes besides the init and the keeper run inside: an exec, or a
    /// background process it left.
    Busy { processes: u32 },
    /// Running, but what runs inside is not known: never treated as idle.
    Unknown,
    /// Running with nothing inside since this moment (Unix seconds): the
    /// last recorded exec, or the start when it is later.
    IdleSince(i64),
}

impl Observed {
    /// How idle `c` is, from its processes and the activity records.
    pub fn idleness(&self, c: &ObservedContainer) -> Idleness {
        if c.state != ContainerState::Running {
            return Idleness::NotRunning;
        }
        match c.processes {
            None => Idleness::Unknown,
            Some(n) if n > 0 => Idleness::Busy { processes: n },
            Some(_) => {
                let last = self.activity.get(&c.name).copied();
                match (last, c.started_at) {
                    (Some(a), Some(s)) => Idleness::IdleSince(a.max(s)),
                    (Some(t), None) | (None, Some(t)) => Idleness::IdleSince(t),
                    (None, None) => Idleness::IdleSince(c.created),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(processes: Option<u32>) -> ObservedContainer {
        ObservedContainer {
            id: "i".into(),
            name: "hermes-p-t".into(),
            labels: BTreeMap::new(),
            state: ContainerState::Running,
            created: 100,
            started_at: Some(200),
            finished_at: None,
            processes,
            made_by_agent: None,
            adopted_hash: None,
        }
    }

    #[test]
    fn idleness_counts_from_the_later_of_start_and_last_exec() {
        let mut observed = Observed::default();
        let c = running(Some(0));
        assert_eq!(observed.idleness(&c), Idleness::IdleSince(200));
        observed.activity.insert("hermes-p-t".into(), 150);
        assert_eq!(observed.idleness(&c), Idleness::IdleSince(200));
        observed.activity.insert("hermes-p-t".into(), 300);
        assert_eq!(observed.idleness(&c), Idleness::IdleSince(300));
    }

    #[test]
    fn processes_inside_make_it_busy_and_unknown_is_never_idle() {
        let observed = Observed::default();
        assert_eq!(
            observed.idleness(&running(Some(2))),
            Idleness::Busy { processes: 2 }
        );
        assert_eq!(observed.idleness(&running(None)), Idleness::Unknown);
        let mut stopped = running(Some(0));
        stopped.state = ContainerState::Exited;
        assert_eq!(observed.idleness(&stopped), Idleness::NotRunning);
    }
}
