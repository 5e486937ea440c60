//! The Docker sandbox as hermes wants it: names, labels, the hardened
//! container spec and its spec hash.
//!
//! [`SandboxSpec::new`] is a pure function of the config, the
//! profile and task and the home directory: only what `docker create`
//! fixes. The values each command gets (`docker_forward_env`, the egress
//! proxy's variables and tokens, `--env`) travel with the command, not the
//! container. Every setting that shapes the container goes
//! into the spec hash, stored in the `hermes-spec-hash` label, so drift is
//! one string compare: Docker fills in defaults, so deep-diffing `inspect`
//! output would always look drifted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, Volume};

/// Every hermes container carries `hermes-agent=1`; nothing without it is
/// ever touched.
pub const LABEL_AGENT: &str = "hermes-agent";
pub const LABEL_PROFILE: &str = "hermes-profile";
pub const LABEL_TASK: &str = "hermes-task-id";
/// A session sandbox's task. Not [`LABEL_TASK`]: Hermes Agent takes any
/// container with `hermes-agent=1` and its task's `hermes-task-id` as that
/// task's persistent sandbox, and a session's sandbox must never be taken
/// so (its end would remove it under the agent).
pub const LABEL_SESSION_TASK: &str = "hermes-session-task";
pub const LABEL_SESSION: &str = "hermes-session";
pub const LABEL_EGRESS: &str = "hermes-egress";
pub const LABEL_SPEC_HASH: &str = "hermes-spec-hash";
/// A warm-pool member's label (`terminal.warm_pool`): the name it was made
/// with ([`pool_member_name`]). A session that claims it renames it to the
/// session's container name (labels cannot change after create): a
/// member whose name is its label's is unclaimed.
pub const LABEL_POOL: &str = "hermes-pool";
/// `hermes-runner=1`: the container has the runner's directory mounted at
/// [`RUNNER_MOUNT`], so commands can run through the runner instead of an
/// engine exec each. Not part of the spec hash (see [`SandboxSpec::runner_dir`]).
pub const LABEL_RUNNER: &str = "hermes-runner";

/// How long a replacement or a removal waits for the commands running in
/// a sandbox to end before stopping them with it (the plan's cost says so).
pub const DRAIN_GRACE_SECONDS: u64 = 10;

/// Where a sandbox sees its runner's directory.
pub const RUNNER_MOUNT: &str = "/run/hermes";

/// The capabilities a sandbox keeps after dropping all.
pub const CAP_ADD: &[&str] = &["DAC_OVERRIDE", "CHOWN", "FOWNER", "SETUID", "SETGID"];
/// The capabilities an image's init needs to drop from root to its user
/// (`s6-setuidgid`, `gosu`, `su`): not kept when the sandbox starts as
/// the host's user (`docker_run_as_host_user`), which needs no drop.
pub const PRIVILEGE_DROP_CAPS: &[&str] = &["SETUID", "SETGID"];
pub const PIDS_LIMIT: i64 = 256;

/// Under a runtime with a kernel of its own, the host's pids limit counts
/// the runtime's own threads and helper processes too (gVisor's sentry
/// and one stub per guest address space: 545 for 256 guest processes,
/// measured here), and a sentry that cannot make one dies with all its
/// processes. So there the guest's processes are bounded inside, by
/// `RLIMIT_NPROC` ([`PIDS_LIMIT`]), and the host's limit is this many
/// times larger.
pub const OWN_KERNEL_PIDS_FACTOR: i64 = 4;

/// The process slots a command leaves free under `RLIMIT_NPROC` for
/// hermes's own execs (the kill of its timeout): this variable, in the
/// sandbox's environment, tells hermes's exec wrapper (the backends'
/// `TERMINAL_SCRIPT`) to lower each command's limit by [`NPROC_RESERVE`].
pub const NPROC_RESERVE_ENV: &str = "HERMES_NPROC_RESERVE";
pub const NPROC_RESERVE: i64 = 16;

/// Whether an OCI runtime runs a sandbox's processes as the host's, on
/// the host's kernel: runc under any of its names, crun, and the engine's
/// default (`None`, which hermes never changes). Any other (gVisor's
/// runsc, a microVM's) has a kernel of its own.
pub fn runs_on_host_kernel(runtime: Option<&str>) -> bool {
    matches!(
        runtime.unwrap_or(""),
        "" | "runc" | "io.containerd.runc.v2" | "io.containerd.runtime.v1.linux" | "crun"
    )
}

/// The entrypoints of s6-overlay images (Hermes Agent's own image among
/// them), as the agent recognises them: their `/init` must be PID 1, and
/// execs from `/run` while it starts.
pub const S6_INIT_ENTRYPOINTS: &[&str] = &["/init", "/package/admin/s6-overlay/command/init"];

/// Whether an image (or container) with `entrypoint` starts through
/// s6-overlay's `/init`.
pub fn uses_s6_init(entrypoint: &[String]) -> bool {
    entrypoint
        .first()
        .is_some_and(|first| S6_INIT_ENTRYPOINTS.contains(&first.trim()))
}

/// Which sandbox: a (profile, task) pair, plus a session id for
/// disposable session sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SandboxKey {
    pub profile: String,
    pub task: String,
    pub session: Option<String>,
}

impl SandboxKey {
    pub fn persistent(profile: &str, task: &str) -> SandboxKey {
        SandboxKey {
            profile: profile.to_string(),
            task: task.to_string(),
            session: None,
        }
    }

    /// The sandbox of a session: disposable, shared by every exec that
    /// names the same session.
    pub fn session(profile: &str, task: &str, session: &str) -> SandboxKey {
        SandboxKey {
            profile: profile.to_string(),
            task: task.to_string(),
            session: Some(session.to_string()),
        }
    }

    /// The container name: `hermes-<profile>-<task>[-<session>]`, so that
    /// two processes racing to create one sandbox end with one container
    /// and a name conflict for the loser.
    pub fn container_name(&self) -> String {
        let mut name = format!(
            "hermes-{}-{}",
            sanitize(&self.profile),
            sanitize(&self.task)
        );
        if let Some(session) = &self.session {
            name.push('-');
            name.push_str(&sanitize(session));
        }
        name
    }
}

/// The name of member `index` of the warm pool of (profile, task):
/// `hermes_pool-<profile>-<task>-<index>`, outside every `hermes-…` name
/// hermes or Hermes Agent gives a sandbox, so no session's name is ever
/// one.
pub fn pool_member_name(profile: &str, task: &str, index: u32) -> String {
    format!(
        "hermes_pool-{}-{}-{index}",
        sanitize(profile),
        sanitize(task)
    )
}

/// The name a warm-pool member's spec is hashed under: one hash for every
/// member, whatever its name.
const POOL_HASH_NAME: &str = "hermes_pool";

/// A label value or one path component: `[A-Za-z0-9_.-]`, at most 63
/// characters, the first a letter or a digit. The names that reach it were
/// checked at the edge ([`crate::names`]) and it leaves them as they are;
/// for anything else (a label of a container made before the check
/// existed) it still never yields `.`, `..`, a slash or an empty string.
pub fn sanitize(value: &str) -> String {
    let mut out: String = value
        .chars()
        .enumerate()
        .map(|(i, c)| {
            let ok = if i == 0 {
                c.is_ascii_alphanumeric()
            } else {
                c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
            };
            if ok { c } else { '_' }
        })
        .take(63)
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bind {
    pub host: String,
    pub container: String,
    pub options: Option<String>,
}

impl From<&Volume> for Bind {
    fn from(v: &Volume) -> Bind {
        Bind {
            host: v.host.clone(),
            container: v.container.clone(),
            options: v.options.clone(),
        }
    }
}

impl Bind {
    /// `host:container[:options]`, the engine's bind syntax.
    pub fn to_engine(&self) -> String {
        match &self.options {
            Some(o) => format!("{}:{}:{o}", self.host, self.container),
            None => format!("{}:{}", self.host, self.container),
        }
    }
}

mod extra_args;
pub use extra_args::{
    EXTRA_OPTIONS, ExtraArgError, ExtraArgs, ExtraOption, GpuRequest, map_extra_args, options,
    parse_extra_args,
};

/// Everything the engine needs to create one sandbox container.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    pub key: SandboxKey,
    pub name: String,
    pub image: String,
    /// Labels, the spec hash included.
    pub labels: BTreeMap<String, String>,
    /// Environment values. Passed in the create call's body, never on a
    /// command line.
    pub env: Vec<(String, String)>,
    /// The egress proxy's tokens, in the container's environment beside
    /// `env` (see `crate::egress`): their names are part of the spec hash,
    /// their values are not, so a rotation recreates nothing.
    pub egress_tokens: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    /// Directories on the host that the binds need, each below `home` or
    /// below `sandbox_dir` ([`SandboxSpec::base_of`]).
    pub host_dirs: Vec<PathBuf>,
    /// A file the create writes before the container is made: `(path on
    /// the host, contents)`, the path in one of `host_dirs` (a gVisor
    /// sandbox's `/etc/resolv.conf`: see [`SandboxSpec::own_resolv_conf`]).
    /// Its bind is in `binds`, which the hash covers.
    pub host_file: Option<(PathBuf, String)>,
    /// The hermes home: `host_dirs` are made from there without following
    /// a symbolic link. Not part of the spec hash (the binds are).
    pub home: PathBuf,
    /// The sandbox directory ([`sandbox_dir`]): the data directories are
    /// made from there as from the home. Not part of the spec hash.
    pub sandbox_dir: PathBuf,
    /// `terminal.container_disk`, in MB: the size of a persistent
    /// sandbox's data image when one is made (fixed then; not part of the
    /// spec hash).
    pub disk_mb: u64,
    /// Mount point → options (`rw,nosuid,size=512m`).
    pub tmpfs: BTreeMap<String, String>,
    pub cap_drop: Vec<String>,
    pub cap_add: Vec<String>,
    pub security_opt: Vec<String>,
    pub pids_limit: i64,
    pub nano_cpus: i64,
    pub memory_bytes: i64,
    pub shm_size_bytes: i64,
    /// `false`: network mode `none`.
    pub network: bool,
    /// The network to join instead of the default bridge (the egress
    /// proxy's internal network).
    pub network_name: Option<String>,
    pub devices: Vec<String>,
    pub add_hosts: Vec<String>,
    /// The container's name servers (the proxy-only network's gateway,
    /// where the egress proxy's DNS responder answers); empty: the engine's.
    pub dns: Vec<String>,
    pub ulimits: Vec<(String, i64, i64)>,
    /// `--user` of `docker_extra_args`; `None`: the image's user.
    pub user: Option<String>,
    /// `--gpus` of `docker_extra_args`: the engine's device requests.
    pub gpus: Vec<GpuRequest>,
    /// `--cpuset-cpus` of `docker_extra_args`.
    pub cpuset_cpus: Option<String>,
    /// `--runtime` of `docker_extra_args`; `None`: the engine's default.
    pub runtime: Option<String>,
    pub cmd: Vec<String>,
    pub working_dir: String,
    /// The engine's `--init` as PID 1 (it reaps what commands leave).
    /// Not a setting: false only for an image whose own init must be PID 1
    /// ([`SandboxSpec::for_entrypoint`]), so not in the spec hash.
    pub init: bool,
    /// The host directory of the sandbox's runner ([`runner_dir`]), mounted
    /// at [`RUNNER_MOUNT`] (one of `binds`). It and [`LABEL_RUNNER`]
    /// are plumbing, not settings: the spec hash leaves them out, so a
    /// sandbox made before they existed is not recreated for them (its
    /// commands run through the engine's exec).
    pub runner_dir: Option<PathBuf>,
}

/// The host directory of a gVisor sandbox's own `resolv.conf`
/// ([`SandboxSpec::own_resolv_conf`]), removed with the container.
pub fn resolv_dir(home: &Path, container: &str) -> PathBuf {
    home.join("run").join("resolv").join(container)
}

/// The host directory of a sandbox's runner: runtime state, not data, so
/// it lives under `run/`, by container name, for persistent and session
/// sandboxes alike.
pub fn runner_dir(home: &Path, container_name: &str) -> PathBuf {
    home.join("run").join("sandboxes").join(container_name)
}

/// The host's root of all sandbox data, as Hermes Agent has it:
/// `terminal.sandbox_dir` (which `$TERMINAL_SANDBOX_DIR` sets when the
/// file does not; a relative one is taken from the home), else
/// `<home>/sandboxes`.
pub fn sandbox_dir(config: &Config, home: &Path) -> PathBuf {
    match config.terminal.sandbox_dir.as_deref() {
        Some(dir) if !dir.is_empty() => home.join(dir),
        _ => home.join("sandboxes"),
    }
}

/// Where a persistent Docker sandbox keeps its data on the host:
/// `<sandbox_dir>/docker/<task>`, with `workspace` and `home` in it
/// (bound to `/workspace` and `/root`): Hermes Agent's layout, so either
/// program finds the task's files.
pub fn data_dir(sandbox_dir: &Path, task: &str) -> PathBuf {
    sandbox_dir.join("docker").join(sanitize(task))
}

/// Where hermes kept a persistent sandbox's data before it shared the
/// agent's layout: `<root>/sandboxes/docker/<profile>/<task>`, every
/// profile under one home (`root`, the home a profile's home is under).
pub fn legacy_data_dir(root: &Path, profile: &str, task: &str) -> PathBuf {
    root.join("sandboxes")
        .join("docker")
        .join(sanitize(profile))
        .join(sanitize(task))
}

impl SandboxSpec {
    /// The sandbox of `key`. A persistent one keeps `/workspace` and
    /// `/root` in bind mounts under [`data_dir`], so recreating the
    /// container loses no file; a session's (`key.session` set) are tmpfs
    /// mounts of 10 GiB and 1 GiB, so nothing is carried over from one
    /// session to the next.
    pub fn new(config: &Config, key: SandboxKey, home: &Path, extra: &ExtraArgs) -> SandboxSpec {
        let t = &config.terminal;
        let sandbox_dir = sandbox_dir(config, home);
        let mut binds = Vec::new();
        let mut host_dirs = Vec::new();
        let mut tmpfs = BTreeMap::new();
        if key.session.is_some() {
            tmpfs.insert(
                "/workspace".to_string(),
                "rw,exec,nosuid,size=10g".to_string(),
            );
            tmpfs.insert("/root".to_string(), "rw,exec,nosuid,size=1g".to_string());
        } else {
            let data = data_dir(&sandbox_dir, &key.task);
            for (dir, container) in [("workspace", "/workspace"), ("home", "/root")] {
                let host = data.join(dir);
                binds.push(Bind {
                    host: host.display().to_string(),
                    container: container.to_string(),
                    options: None,
                });
                host_dirs.push(host);
            }
        }
        binds.extend(t.docker_volumes.iter().map(Bind::from));
        tmpfs.insert("/tmp".to_string(), "rw,nosuid,size=512m".to_string());
        tmpfs.insert(
            "/var/tmp".to_string(),
            "rw,noexec,nosuid,size=256m".to_string(),
        );
        tmpfs.insert("/run".to_string(), "rw,noexec,nosuid,size=64m".to_string());
        let mut env: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, v: &str| {
            env.retain(|(name, _)| name != k);
            env.push((k.to_string(), v.to_string()));
        };
        for (k, v) in &t.docker_env {
            put(k, v);
        }
        for (k, v) in &extra.env {
            put(k, v);
        }
        let mut cap_add: Vec<String> = CAP_ADD.iter().map(|c| c.to_string()).collect();
        for cap in &extra.cap_add {
            if !cap_add.contains(cap) {
                cap_add.push(cap.clone());
            }
        }
        let mut labels = BTreeMap::new();
        for (k, v) in &extra.labels {
            labels.insert(k.clone(), v.clone());
        }
        labels.insert(LABEL_AGENT.to_string(), "1".to_string());
        labels.insert(LABEL_PROFILE.to_string(), sanitize(&key.profile));
        match &key.session {
            None => {
                labels.insert(LABEL_TASK.to_string(), sanitize(&key.task));
            }
            Some(session) => {
                labels.insert(LABEL_SESSION_TASK.to_string(), sanitize(&key.task));
                labels.insert(LABEL_SESSION.to_string(), sanitize(session));
            }
        }
        labels.insert(LABEL_EGRESS.to_string(), "off".to_string());
        labels.insert(LABEL_RUNNER.to_string(), "1".to_string());
        let name = key.container_name();
        let runner = runner_dir(home, &name);
        binds.push(Bind {
            host: runner.display().to_string(),
            container: RUNNER_MOUNT.to_string(),
            options: None,
        });
        host_dirs.push(runner.clone());
        let shm = extra.shm_size_bytes.unwrap_or(t.docker_shm_size_bytes);
        let mut spec = SandboxSpec {
            name,
            key,
            image: t.docker_image.clone(),
            labels,
            env,
            egress_tokens: Vec::new(),
            binds,
            host_dirs,
            host_file: None,
            home: home.to_path_buf(),
            sandbox_dir,
            disk_mb: t.container_disk_mb,
            tmpfs,
            cap_drop: vec!["ALL".to_string()],
            cap_add,
            security_opt: vec!["no-new-privileges".to_string()],
            pids_limit: PIDS_LIMIT,
            nano_cpus: (t.container_cpu * 1e9).round() as i64,
            memory_bytes: i64::try_from(t.container_memory_mb).unwrap_or(i64::MAX / (1 << 20))
                * (1 << 20),
            shm_size_bytes: i64::try_from(shm).unwrap_or(i64::MAX),
            network: t.docker_network,
            network_name: None,
            devices: extra.devices.clone(),
            add_hosts: extra.add_hosts.clone(),
            dns: Vec::new(),
            ulimits: extra.ulimits.clone(),
            user: None,
            gpus: Vec::new(),
            cpuset_cpus: None,
            runtime: None,
            cmd: vec!["sleep".to_string(), "infinity".to_string()],
            working_dir: "/workspace".to_string(),
            init: true,
            runner_dir: Some(runner),
        };
        spec.apply_extra_args(extra);
        // `terminal.docker_runtime`; `runc` is the engine's own default, so
        // a spec of it is the spec of before the key (its hash unchanged).
        // A `--runtime` of `docker_extra_args` that says otherwise is a
        // config error, which blocks the sandbox.
        if spec.runtime.is_none() && config.terminal.docker_runtime != "runc" {
            spec.runtime = Some(config.terminal.docker_runtime.clone());
        }
        if !runs_on_host_kernel(spec.runtime.as_deref()) {
            spec.bound_processes_inside();
            // `--dns` of `docker_extra_args`.
            spec.own_resolv_conf();
        }
        spec.rehash();
        spec
    }

    /// Under a runtime with a kernel of its own, name servers of the
    /// sandbox's own (`dns`, the proxy's responder with
    /// `proxy.enforce_network`) cannot be reached through the engine's
    /// embedded resolver: its `127.0.0.11` is redirected by rules of the
    /// container's network namespace, which the guest's own network stack
    /// never meets (measured under gVisor: no name resolved). So such a
    /// sandbox gets a `resolv.conf` of its own naming them, bound
    /// read-only over `/etc/resolv.conf`.
    pub fn own_resolv_conf(&mut self) {
        if runs_on_host_kernel(self.runtime.as_deref()) || self.dns.is_empty() {
            return;
        }
        let dir = resolv_dir(&self.home, &self.name);
        let file = dir.join("resolv.conf");
        let text: String = self
            .dns
            .iter()
            .map(|ns| format!("nameserver {ns}\n"))
            .chain(std::iter::once("options ndots:0\n".to_string()))
            .collect();
        self.binds.retain(|b| b.container != "/etc/resolv.conf");
        self.binds.push(Bind {
            host: file.display().to_string(),
            container: "/etc/resolv.conf".to_string(),
            options: Some("ro".to_string()),
        });
        if !self.host_dirs.contains(&dir) {
            self.host_dirs.push(dir);
        }
        self.host_file = Some((file, text));
    }

    /// Under a runtime with a kernel of its own: the guest's processes
    /// bounded by `RLIMIT_NPROC` (unless `docker_extra_args` sets
    /// `--ulimit nproc`), the host's limit left room for the runtime's
    /// own ([`OWN_KERNEL_PIDS_FACTOR`]), and [`NPROC_RESERVE`] slots kept
    /// from commands for hermes's kill.
    fn bound_processes_inside(&mut self) {
        if !self.ulimits.iter().any(|(name, _, _)| name == "nproc") {
            self.ulimits
                .push(("nproc".to_string(), PIDS_LIMIT, PIDS_LIMIT));
        }
        self.pids_limit = self.pids_limit.saturating_mul(OWN_KERNEL_PIDS_FACTOR);
        self.env.retain(|(k, _)| k != NPROC_RESERVE_ENV);
        self.env
            .push((NPROC_RESERVE_ENV.to_string(), NPROC_RESERVE.to_string()));
    }

    /// The spec as it is created from an image whose entrypoint is
    /// `entrypoint`. For an s6-overlay `/init` ([`uses_s6_init`]), as
    /// Hermes Agent does: no engine `--init` (two inits would compete for
    /// PID 1) and `/run` mounted `exec` (s6's stage 0 execs from it; a
    /// `noexec` one stops it with exit 126). The spec hash stays the
    /// desired one's: what the image implies is not a setting.
    pub fn for_entrypoint(&self, entrypoint: &[String]) -> SandboxSpec {
        let mut spec = self.clone();
        if uses_s6_init(entrypoint) {
            spec.init = false;
            if let Some(opts) = spec.tmpfs.get_mut("/run") {
                *opts = opts
                    .split(',')
                    .map(|o| if o == "noexec" { "exec" } else { o })
                    .collect::<Vec<_>>()
                    .join(",");
            }
        }
        spec
    }

    /// The spec with what of the host shapes a sandbox: started as the
    /// host's user under `docker_run_as_host_user` (a `--user` of
    /// `docker_extra_args` still wins, as it comes later on the agent's
    /// command line), without the capabilities a drop from root needs;
    /// no pids limit where the host's cgroups have no `pids` controller
    /// (the engine could not apply one). Rehashed.
    pub fn with_host(mut self, config: &Config, host: &crate::desired::HostFacts) -> SandboxSpec {
        if config.terminal.docker_run_as_host_user
            && let Some(user) = &host.user
        {
            self.user.get_or_insert_with(|| user.clone());
            self.cap_add
                .retain(|c| !PRIVILEGE_DROP_CAPS.contains(&c.as_str()));
        }
        if host.no_pids_controller {
            self.pids_limit = 0;
        }
        self.rehash();
        self
    }

    /// The spec hash: the first 12 hex digits of SHA-256 over every field
    /// that shapes the container, in a fixed order, the hash label excluded.
    pub fn compute_hash(&self) -> String {
        let mut h = crate::fingerprint::Fingerprint::new();
        let mut field = |name: &str, value: &str| h.field(name, value);
        field("name", &self.name);
        field("image", &self.image);
        // A session's task label is hashed under the name it had before it
        // moved out of the agent's sight: a session sandbox made then is
        // not recreated (its files lost) for the rename.
        let mut labels: Vec<(&str, &str)> = self
            .labels
            .iter()
            // The home's label is identity, not a setting: a sandbox made
            // before it existed is adopted, not recreated for it.
            .filter(|(k, _)| {
                *k != LABEL_SPEC_HASH
                    && *k != LABEL_POOL
                    && *k != LABEL_RUNNER
                    && *k != crate::homes::LABEL_HOME
                    && *k != crate::settings::LABEL_SETTINGS
            })
            .map(|(k, v)| {
                let k = if k == LABEL_SESSION_TASK {
                    LABEL_TASK
                } else {
                    k.as_str()
                };
                (k, v.as_str())
            })
            .collect();
        labels.sort_unstable();
        for (k, v) in labels {
            field("label", &format!("{k}={v}"));
        }
        for (k, v) in &self.env {
            field("env", &format!("{k}={v}"));
        }
        for (k, _) in &self.egress_tokens {
            field("egress_token", k);
        }
        let runner = self.runner_bind();
        for b in self.binds.iter().filter(|b| runner.as_ref() != Some(*b)) {
            field("bind", &b.to_engine());
        }
        for (k, v) in &self.tmpfs {
            field("tmpfs", &format!("{k}={v}"));
        }
        for c in &self.cap_drop {
            field("cap_drop", c);
        }
        for c in &self.cap_add {
            field("cap_add", c);
        }
        for s in &self.security_opt {
            field("security_opt", s);
        }
        field("pids", &self.pids_limit.to_string());
        field("cpus", &self.nano_cpus.to_string());
        field("memory", &self.memory_bytes.to_string());
        field("shm", &self.shm_size_bytes.to_string());
        field("network", &self.network.to_string());
        if let Some(name) = &self.network_name {
            field("network_name", name);
        }
        for d in &self.devices {
            field("device", d);
        }
        for a in &self.add_hosts {
            field("add_host", a);
        }
        for d in &self.dns {
            field("dns", d);
        }
        for (n, s, hd) in &self.ulimits {
            field("ulimit", &format!("{n}={s}:{hd}"));
        }
        for c in &self.cmd {
            field("cmd", c);
        }
        field("workdir", &self.working_dir);
        // Hashed only when set: a sandbox made before they existed keeps
        // its hash.
        if let Some(user) = &self.user {
            field("user", user);
        }
        for gpu in &self.gpus {
            field("gpus", &gpu.to_string());
        }
        if let Some(cpus) = &self.cpuset_cpus {
            field("cpuset_cpus", cpus);
        }
        if let Some(runtime) = &self.runtime {
            field("runtime", runtime);
        }
        h.finish()
    }

    /// Recomputes the spec hash label, and the settings label beside it
    /// ([`crate::settings`]), after a change of the spec.
    pub fn rehash(&mut self) {
        let hash = self.compute_hash();
        self.labels.insert(LABEL_SPEC_HASH.to_string(), hash);
        let settings = self.settings_label();
        self.labels
            .insert(crate::settings::LABEL_SETTINGS.to_string(), settings);
    }

    /// The directory a persistent sandbox's data is in; none for a
    /// session's (tmpfs).
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.key
            .session
            .is_none()
            .then(|| data_dir(&self.sandbox_dir, &self.key.task))
    }

    /// The directory `dir` (one of `host_dirs`) is made from: the sandbox
    /// directory for the data, the home for the rest.
    pub fn base_of(&self, dir: &Path) -> &Path {
        if dir.starts_with(&self.sandbox_dir) {
            &self.sandbox_dir
        } else {
            &self.home
        }
    }

    /// The bind of the runner's directory, when the spec has one.
    pub fn runner_bind(&self) -> Option<Bind> {
        self.runner_dir.as_ref().map(|dir| Bind {
            host: dir.display().to_string(),
            container: RUNNER_MOUNT.to_string(),
            options: None,
        })
    }

    pub fn hash(&self) -> &str {
        self.labels.get(LABEL_SPEC_HASH).map_or("", String::as_str)
    }

    /// This session sandbox's spec as warm-pool member `name`: without
    /// the session's label, with [`LABEL_POOL`], its runner's (and a gVisor
    /// sandbox's `resolv.conf`'s) directory by that name, hashed as every
    /// member is ([`POOL_HASH_NAME`]): a session that claims it gets
    /// exactly this container.
    pub fn into_pool_member(mut self, name: &str) -> SandboxSpec {
        self.labels.remove(LABEL_SESSION);
        self.labels.insert(LABEL_POOL.to_string(), name.to_string());
        self.rename(POOL_HASH_NAME);
        self.rehash();
        self.rename(name);
        self
    }

    /// Gives the sandbox another container name, with the host
    /// directories named after it (its runner's, its `resolv.conf`'s).
    /// The spec hash is left as it was.
    fn rename(&mut self, to: &str) {
        let moves = [
            (
                runner_dir(&self.home, &self.name),
                runner_dir(&self.home, to),
            ),
            (
                resolv_dir(&self.home, &self.name),
                resolv_dir(&self.home, to),
            ),
        ];
        let moved = |path: &Path| -> Option<PathBuf> {
            moves.iter().find_map(|(from, to)| {
                let rest = path.strip_prefix(from).ok()?;
                Some(if rest.as_os_str().is_empty() {
                    to.clone()
                } else {
                    to.join(rest)
                })
            })
        };
        for bind in &mut self.binds {
            if let Some(new) = moved(Path::new(&bind.host)) {
                bind.host = new.display().to_string();
            }
        }
        for dir in &mut self.host_dirs {
            if let Some(new) = moved(dir) {
                *dir = new;
            }
        }
        if let Some(dir) = &mut self.runner_dir
            && let Some(new) = moved(dir)
        {
            *dir = new;
        }
        if let Some((file, _)) = &mut self.host_file
            && let Some(new) = moved(file)
        {
            *file = new;
        }
        self.name = to.to_string();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    #[test]
    fn an_s6_overlay_image_starts_without_the_engine_s_init_and_with_an_exec_run() {
        let spec = spec("terminal:\n  docker_image: img:1\n");
        assert!(spec.init);
        assert_eq!(spec.tmpfs["/run"], "rw,noexec,nosuid,size=64m");
        for entrypoint in [
            &["/init"][..],
            &["/package/admin/s6-overlay/command/init", "x"],
        ] {
            let entrypoint: Vec<String> = entrypoint.iter().map(|s| s.to_string()).collect();
            let s6 = spec.for_entrypoint(&entrypoint);
            assert!(!s6.init);
            assert_eq!(s6.tmpfs["/run"], "rw,exec,nosuid,size=64m");
            // What the image implies is not a setting.
            assert_eq!(s6.hash(), spec.hash());
        }
        for other in [&[][..], &["/docker-entrypoint.sh"], &["/usr/bin/init"]] {
            let other: Vec<String> = other.iter().map(|s| s.to_string()).collect();
            assert_eq!(spec.for_entrypoint(&other), spec);
        }
    }

    #[test]
    fn run_as_host_user_starts_the_sandbox_as_the_host_s_user_without_the_drop_caps() {
        let text = "terminal:\n  docker_run_as_host_user: true\n";
        let config = crate::config::load(text).unwrap().config;
        let host = crate::desired::HostFacts {
            user: Some("1000:1001".to_string()),
            no_pids_controller: false,
            disk_images: false,
        };
        let plain = spec(text);
        let as_user = plain.clone().with_host(&config, &host);
        assert_eq!(as_user.user.as_deref(), Some("1000:1001"));
        assert!(
            !as_user
                .cap_add
                .iter()
                .any(|c| c == "SETUID" || c == "SETGID")
        );
        assert!(as_user.cap_add.iter().any(|c| c == "CHOWN"));
        assert_ne!(as_user.hash(), plain.hash());
        // A `--user` of docker_extra_args comes later on the agent's line.
        let text =
            "terminal:\n  docker_run_as_host_user: true\n  docker_extra_args: [--user=7:7]\n";
        let config = crate::config::load(text).unwrap().config;
        let given = spec(text).with_host(&config, &host);
        assert_eq!(given.user.as_deref(), Some("7:7"));
        // Off: the host's user is not used.
        let off = crate::config::load("").unwrap().config;
        let unchanged = spec("").with_host(&off, &host);
        assert_eq!(unchanged, spec(""));
    }

    #[test]
    fn under_a_runtime_of_its_own_kernel_processes_are_bounded_inside() {
        let runc = spec("terminal:\n  docker_runtime: runc\n");
        assert_eq!(runc.pids_limit, PIDS_LIMIT);
        assert!(runc.ulimits.is_empty());
        assert!(runc.env.iter().all(|(k, _)| k != NPROC_RESERVE_ENV));
        let gvisor = spec("terminal:\n  docker_runtime: runsc\n");
        assert_eq!(gvisor.pids_limit, PIDS_LIMIT * OWN_KERNEL_PIDS_FACTOR);
        assert_eq!(
            gvisor.ulimits,
            [("nproc".to_string(), PIDS_LIMIT, PIDS_LIMIT)]
        );
        assert!(
            gvisor
                .env
                .contains(&(NPROC_RESERVE_ENV.to_string(), NPROC_RESERVE.to_string()))
        );
        // A limit of the user's own is kept.
        let own =
            spec("terminal:\n  docker_runtime: runsc\n  docker_extra_args: [--ulimit, nproc=64]\n");
        assert_eq!(own.ulimits, [("nproc".to_string(), 64, 64)]);
        for runtime in [
            None,
            Some("runc"),
            Some("io.containerd.runc.v2"),
            Some("crun"),
        ] {
            assert!(runs_on_host_kernel(runtime), "{runtime:?}");
        }
        for runtime in ["runsc", "kata", "runsc-debug"] {
            assert!(!runs_on_host_kernel(Some(runtime)), "{runtime}");
        }
    }

    #[test]
    fn a_gvisor_sandbox_with_name_servers_of_its_own_gets_its_own_resolv_conf() {
        let mut runc = spec("terminal:\n  docker_runtime: runc\n");
        runc.dns = vec!["172.30.0.1".to_string()];
        runc.own_resolv_conf();
        assert!(runc.host_file.is_none());
        let mut gvisor = spec("terminal:\n  docker_runtime: runsc\n");
        gvisor.own_resolv_conf();
        assert!(gvisor.host_file.is_none(), "no name servers: the engine's");
        gvisor.dns = vec!["172.30.0.1".to_string()];
        gvisor.own_resolv_conf();
        let (path, text) = gvisor.host_file.clone().unwrap();
        assert_eq!(text, "nameserver 172.30.0.1\noptions ndots:0\n");
        assert!(
            gvisor
                .host_dirs
                .contains(&path.parent().unwrap().to_path_buf())
        );
        let bind = gvisor
            .binds
            .iter()
            .find(|b| b.container == "/etc/resolv.conf")
            .unwrap();
        assert_eq!(bind.host, path.display().to_string());
        assert_eq!(bind.options.as_deref(), Some("ro"));
    }

    #[test]
    fn without_the_pids_controller_a_sandbox_gets_no_pids_limit() {
        let config = crate::config::load("").unwrap().config;
        let host = crate::desired::HostFacts {
            user: None,
            no_pids_controller: true,
            disk_images: false,
        };
        let plain = spec("");
        assert_eq!(plain.pids_limit, PIDS_LIMIT);
        let unlimited = plain.clone().with_host(&config, &host);
        assert_eq!(unlimited.pids_limit, 0);
        assert_ne!(unlimited.hash(), plain.hash());
    }

    fn spec(text: &str) -> SandboxSpec {
        let config = load(text).unwrap().config;
        let extra = parse_extra_args(&config.terminal.docker_extra_args).unwrap();
        SandboxSpec::new(
            &config,
            SandboxKey::persistent("default", "default"),
            Path::new("/h"),
            &extra,
        )
    }

    #[test]
    fn a_persistent_sandbox_is_hardened_as_the_reference() {
        let s = spec("");
        assert_eq!(s.name, "hermes-default-default");
        assert_eq!(s.cap_drop, ["ALL"]);
        assert_eq!(s.cap_add, CAP_ADD);
        assert_eq!(s.security_opt, ["no-new-privileges"]);
        assert_eq!(s.pids_limit, 256);
        assert_eq!(s.tmpfs["/tmp"], "rw,nosuid,size=512m");
        assert_eq!(s.tmpfs["/var/tmp"], "rw,noexec,nosuid,size=256m");
        assert_eq!(s.tmpfs["/run"], "rw,noexec,nosuid,size=64m");
        assert_eq!(s.nano_cpus, 1_000_000_000);
        assert_eq!(s.memory_bytes, 5120 << 20);
        assert_eq!(s.shm_size_bytes, 1 << 30);
        assert_eq!(s.cmd, ["sleep", "infinity"]);
        assert_eq!(
            s.binds[0].to_engine(),
            "/h/sandboxes/docker/default/workspace:/workspace"
        );
        assert_eq!(
            s.binds[1].to_engine(),
            "/h/sandboxes/docker/default/home:/root"
        );
        assert_eq!(s.labels[LABEL_AGENT], "1");
        assert_eq!(s.labels[LABEL_EGRESS], "off");
        assert_eq!(s.hash().len(), 12);
        assert_eq!(
            s.binds[2].to_engine(),
            "/h/run/sandboxes/hermes-default-default:/run/hermes"
        );
        assert_eq!(s.labels[LABEL_RUNNER], "1");
    }

    #[test]
    fn the_runner_leaves_the_hash_as_it_was() {
        // A sandbox made before the runner existed keeps its hash, so it is
        // not recreated for it.
        let with = spec("");
        let mut without = with.clone();
        without.binds.retain(|b| b.container != RUNNER_MOUNT);
        without.labels.remove(LABEL_RUNNER);
        without.runner_dir = None;
        assert_eq!(without.compute_hash(), with.hash());
        assert_eq!(with.compute_hash(), with.hash());
        // A volume of the user's at the same place is not the runner's.
        let mut other = without.clone();
        other.binds.push(Bind {
            host: "/elsewhere".into(),
            container: RUNNER_MOUNT.into(),
            options: None,
        });
        assert_ne!(other.compute_hash(), with.hash());
    }

    #[test]
    fn a_session_sandbox_keeps_nothing_on_the_host() {
        let config = load("").unwrap().config;
        let s = SandboxSpec::new(
            &config,
            SandboxKey::session("default", "default", "s-1"),
            Path::new("/h"),
            &ExtraArgs::default(),
        );
        assert_eq!(s.name, "hermes-default-default-s-1");
        assert_eq!(s.labels[LABEL_SESSION], "s-1");
        // Only the runner's directory, which holds no data.
        assert_eq!(s.binds, [s.runner_bind().unwrap()]);
        assert_eq!(
            s.host_dirs,
            [PathBuf::from("/h/run/sandboxes/hermes-default-default-s-1")]
        );
        assert_eq!(s.tmpfs["/workspace"], "rw,exec,nosuid,size=10g");
        assert_eq!(s.tmpfs["/root"], "rw,exec,nosuid,size=1g");
        assert_eq!(s.cap_drop, ["ALL"]);
        assert_ne!(s.hash(), spec("").hash());
    }

    #[test]
    fn every_shaping_setting_changes_the_hash() {
        let base = spec("").hash().to_string();
        for text in [
            "terminal:\n  docker_image: debian:12\n",
            "terminal:\n  docker_env: {A: b}\n",
            "terminal:\n  container_memory: 1024\n",
            "terminal:\n  container_cpu: 2\n",
            "terminal:\n  docker_network: false\n",
            "terminal:\n  docker_volumes: [/srv:/srv]\n",
            "terminal:\n  docker_shm_size: 2g\n",
            "terminal:\n  docker_extra_args: [--cap-add=SYS_PTRACE]\n",
        ] {
            assert_ne!(spec(text).hash(), base, "{text}");
        }
        // Settings that do not shape the container do not.
        assert_eq!(spec("terminal:\n  timeout: 5\n").hash(), base);
        assert_eq!(spec("").hash(), base);
    }

    #[test]
    fn extra_args_map_onto_the_create_call() {
        let args: Vec<String> = [
            "--cap-add=SYS_PTRACE",
            "--device",
            "/dev/fuse",
            "--add-host=db:10.0.0.5",
            "-e",
            "A=1",
            "--ulimit",
            "nofile=1024:2048",
            "--shm-size=2g",
            "--label",
            "team=ml",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let extra = parse_extra_args(&args).unwrap();
        assert_eq!(extra.cap_add, ["SYS_PTRACE"]);
        assert_eq!(extra.devices, ["/dev/fuse"]);
        assert_eq!(extra.add_hosts, ["db:10.0.0.5"]);
        assert_eq!(extra.env, [("A".to_string(), "1".to_string())]);
        assert_eq!(extra.ulimits, [("nofile".to_string(), 1024, 2048)]);
        assert_eq!(extra.shm_size_bytes, Some(2 << 30));
        assert_eq!(extra.labels, [("team".to_string(), "ml".to_string())]);
    }

    #[test]
    fn unsupported_extra_args_name_the_option() {
        let e =
            parse_extra_args(&["--cap-add=X".to_string(), "--privileged".to_string()]).unwrap_err();
        assert_eq!(e.index, 1);
        assert!(
            e.message
                .starts_with("`--privileged` gives the sandbox every capability"),
            "{e}"
        );
        let e = parse_extra_args(&["--device".to_string()]).unwrap_err();
        assert!(e.message.contains("needs a value"), "{e}");
    }

    #[test]
    fn names_and_labels_are_sanitized() {
        assert_eq!(sanitize("a b/c"), "a_b_c");
        assert_eq!(sanitize(&"x".repeat(80)).len(), 63);
        assert_eq!(sanitize(".."), "_.");
        assert_eq!(sanitize("."), "_");
        assert_eq!(sanitize("-x"), "_x");
        assert_eq!(sanitize("work-2.a_b"), "work-2.a_b");
        let key = SandboxKey {
            profile: "p".into(),
            task: "t 1".into(),
            session: Some("s/2".into()),
        };
        assert_eq!(key.container_name(), "hermes-p-t_1-s_2");
    }
}
