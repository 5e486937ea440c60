//! What the host should look like: derived from the config, the active
//! profile, the home directory and the environment by a pure function.
//! Observed state is compared against this.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Backend, Config};
use crate::egress::EgressWiring;
use crate::names::{self, NameError, NameKind};
use crate::sandbox::{self, ExtraArgs, SandboxKey, SandboxSpec};
use crate::singularity::InstanceSpec;

/// The profile when none is named.
pub const DEFAULT_PROFILE: &str = "default";

/// The task of the one warm persistent sandbox per profile.
pub const DEFAULT_TASK: &str = "default";

/// The session `hermes exec` uses when `container_persistent` is false and
/// no session is named.
pub const DEFAULT_SESSION: &str = "default";

/// The task of the warm pool's sandboxes (`terminal.warm_pool`): a new
/// session of this task claims one; a session of another makes its own.
pub const POOL_TASK: &str = DEFAULT_TASK;

/// The session a warm-pool member's spec is made from; its label is not
/// the member's ([`SandboxSpec::into_pool_member`]).
const POOL_SESSION: &str = "pool";

/// The environment values a desired state may read: the host process's
/// environment and the `.env` file, for `docker_forward_env`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    pub process: BTreeMap<String, String>,
    pub dotenv: Vec<(String, String)>,
    /// Whether `~/.modal.toml` exists (Modal's credentials file), as the
    /// caller found it.
    pub modal_toml: bool,
    /// What of the host shapes a Docker sandbox.
    pub facts: HostFacts,
}

/// What of the host shapes a Docker sandbox, as the caller found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// `uid:gid` of the process: the user `docker_run_as_host_user` runs
    /// a sandbox as.
    pub user: Option<String>,
    /// Whether the host's cgroups lack the `pids` controller (an
    /// unprivileged LXC, say): a sandbox then gets no pids limit.
    pub no_pids_controller: bool,
    /// Whether hermes can make `terminal.container_disk`'s filesystem
    /// images here (root, `mkfs.ext4`, loop devices): a plan then says
    /// that a new sandbox's data goes on one.
    pub disk_images: bool,
}

impl HostEnv {
    /// A forwarded name's value: the host environment first, then `.env`.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.process
            .get(name)
            .map(String::as_str)
            .or_else(|| crate::dotenv::get(&self.dotenv, name))
    }

    /// The `TERMINAL_*` variables that lay values over config.yaml
    /// ([`crate::config::env`]): `.env`'s over the process's, as Hermes
    /// Agent loads `.env` over its environment.
    pub fn terminal_vars(&self) -> BTreeMap<String, String> {
        let mut vars = crate::config::env::terminal_vars(&self.process);
        for (k, v) in crate::config::env::terminal_vars(self.dotenv.iter().map(|(k, v)| (k, v))) {
            vars.insert(k, v);
        }
        vars
    }
}

/// The desired state of one host for one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub profile: String,
    pub config: Config,
    pub home: PathBuf,
    /// The warm sandboxes: those `reconcile` keeps running whether or not
    /// anything uses them.
    pub sandboxes: Vec<SandboxSpec>,
    /// The `docker_forward_env` values that were found (host environment
    /// first, then `.env`): every command gets them, no container holds
    /// them.
    pub forward_env: Vec<(String, String)>,
    /// The `env_passthrough` values that were found (as `forward_env`'s),
    /// less Hermes Agent's provider credentials and the names
    /// `docker_forward_env` has: every command in a Docker sandbox gets
    /// them too.
    pub passthrough_env: Vec<(String, String)>,
    /// `docker_extra_args`, mapped.
    pub extra_args: ExtraArgs,
    /// Why the Docker sandboxes must not be made or started: the config's
    /// errors of `docker_extra_args` ([`Config::sandbox_errors`]). Their
    /// operations are blocked with it, the rest of the host converges.
    pub docker_blocked: Option<String>,
    /// Things worth a word that do not stop the plan (a forwarded variable
    /// that is set nowhere, say).
    pub warnings: Vec<String>,
    /// Set when this state is not the config's own (the file is invalid,
    /// unreadable or empty, and the last good one stands in): why. A plan
    /// made in doubt removes nothing.
    pub doubt: Option<String>,
    /// How sandboxes reach the egress proxy.
    pub egress: Egress,
    /// On the SSH backend, the remote host, or which key is missing.
    pub ssh: Option<Result<crate::ssh::SshTarget, String>>,
    /// On a cloud backend (modal, daytona, vercel_sandbox), the sandbox
    /// wanted there for the default task.
    pub cloud: Option<crate::cloud::CloudDesired>,
    /// On the singularity backend, the warm instances (the default task's,
    /// when persistent).
    pub instances: Vec<InstanceSpec>,
    /// On the kubernetes backend, the warm sandboxes (the default task's,
    /// when persistent): a Pod and its claim each.
    pub pods: Vec<crate::kubernetes::PodWanted>,
    /// The home's identity ([`crate::homes::home_id`]), set by the caller
    /// that can resolve the home's path: every sandbox is labelled with it.
    pub home_id: Option<String>,
    /// What of the host shapes a Docker sandbox.
    pub host: HostFacts,
    /// While the egress proxy awaits its setup ([`Egress::NotSetUp`]): the
    /// sandboxes' wiring once it is done, as far as it can be known now
    /// (set by the caller, which reads the proxy's files); what a plan's
    /// later stage is made against.
    pub egress_after_setup: Option<crate::egress::EgressWiring>,
    /// The real keys the proxy should hold, by provider, as the host's
    /// environment and `.env` have them now (set by the caller); `None`
    /// when not known here (the keys come from a secret manager).
    pub egress_keys: Option<BTreeMap<String, crate::egress::KeyState>>,
}

/// The egress side of the desired state: what the config asks of the
/// proxy, with what its files (CA, tokens) allow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Egress {
    /// `proxy.enabled: false`: sandboxes are not wired, the daemon is
    /// stopped.
    #[default]
    Off,
    /// Enabled, but the CA, tokens or mappings are missing: setup is due.
    /// Sandboxes wait for it when enforced, else run unwired.
    NotSetUp { missing: String },
    /// Enabled and set up: the daemon should run with `settings`, and
    /// sandboxes are wired.
    On {
        wiring: EgressWiring,
        /// The fingerprint of the daemon's settings.
        settings: String,
    },
}

/// Checks a session id: it becomes part of a label and a container name,
/// and two ids must never map to one container ([`crate::names`]).
pub fn check_session(session: &str) -> Result<(), NameError> {
    names::validate(NameKind::Session, session)
}

/// What the config says about one labelled container of the active profile
/// that is not a warm sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A sandbox made on demand by `hermes exec` (a session's, another
    /// task's, or the default task's when it is not kept warm), removed
    /// when idle longer than `idle_limit` seconds (`None`: never).
    OnDemand { idle_limit: Option<u64> },
    /// The config no longer wants it (the backend is not docker, or a
    /// persistent sandbox while `container_persistent` is false).
    NotDesired,
}

/// Checks a profile name: it becomes part of labels, container names and
/// host paths ([`crate::names`]).
pub fn check_profile(profile: &str) -> Result<(), NameError> {
    names::validate(NameKind::Profile, profile)
}

impl Desired {
    pub fn build(
        config: Config,
        profile: &str,
        home: &Path,
        env: &HostEnv,
    ) -> Result<Desired, NameError> {
        check_profile(profile)?;
        let mut warnings = Vec::new();
        let t = &config.terminal;
        let mut forward_env = Vec::new();
        for name in &t.docker_forward_env {
            match env.lookup(name) {
                Some(value) => forward_env.push((name.clone(), value.to_string())),
                None => warnings.push(format!(
                    "terminal.docker_forward_env: {name} is set neither in the environment nor in .env; not forwarded"
                )),
            }
        }
        let mut passthrough_env: Vec<(String, String)> = Vec::new();
        for name in &t.env_passthrough {
            let name = name.trim();
            let skip = !crate::config::is_env_name(name)
                || crate::config::agent::is_passthrough_blocked(name)
                || t.docker_forward_env.iter().any(|f| f == name)
                || passthrough_env.iter().any(|(n, _)| n == name);
            if skip {
                continue;
            }
            // As Hermes Agent: a name set nowhere, or empty, is not passed.
            if let Some(value) = env.lookup(name).filter(|v| !v.is_empty()) {
                passthrough_env.push((name.to_string(), value.to_string()));
            }
        }
        // What cannot be mapped is in the config's sandbox errors, which
        // block the Docker sandboxes.
        let (extra_args, _) = sandbox::map_extra_args(&t.docker_extra_args);
        let docker_blocked = (!config.sandbox_errors.is_empty()).then(|| {
            config
                .sandbox_errors
                .iter()
                .map(crate::config::Issue::brief)
                .collect::<Vec<_>>()
                .join("; ")
        });
        // The default task's sandbox is kept warm unless it is to go away
        // when idle.
        let wants_sandbox = t.backend == Backend::Docker
            && t.container_persistent
            && t.docker_persist_across_processes
            && t.persistent_max_idle_seconds.is_none();
        let cloud = crate::cloud::CloudDesired::from_config(&config, env, &mut warnings);
        let wants_instance = t.backend == Backend::Singularity && t.container_persistent;
        let wants_pod = t.backend == Backend::Kubernetes
            && t.container_persistent
            && t.persistent_max_idle_seconds.is_none();
        let mut desired = Desired {
            profile: profile.to_string(),
            config,
            home: home.to_path_buf(),
            sandboxes: Vec::new(),
            forward_env,
            passthrough_env,
            extra_args,
            docker_blocked,
            warnings,
            doubt: None,
            egress: Egress::Off,
            ssh: None,
            cloud,
            instances: Vec::new(),
            pods: Vec::new(),
            home_id: None,
            host: env.facts.clone(),
            egress_after_setup: None,
            egress_keys: None,
        };
        if desired.config.terminal.backend == Backend::Ssh {
            desired.ssh = Some(crate::ssh::SshTarget::from_config(
                &desired.config.terminal,
                env,
            ));
        }
        if wants_sandbox {
            desired
                .sandboxes
                .push(desired.sandbox_for_task(DEFAULT_TASK));
        }
        if wants_instance {
            desired
                .instances
                .push(desired.instance(SandboxKey::persistent(&desired.profile, DEFAULT_TASK)));
        }
        if wants_pod {
            desired
                .pods
                .push(desired.pod(SandboxKey::persistent(&desired.profile, DEFAULT_TASK)));
        }
        Ok(desired)
    }

    /// The persistent sandbox of one task of the active profile.
    pub fn sandbox_for_task(&self, task: &str) -> SandboxSpec {
        self.sandbox(SandboxKey::persistent(&self.profile, task))
    }

    /// The sandbox of a key of the active profile, wired to the egress
    /// proxy when it is on.
    pub fn sandbox(&self, key: SandboxKey) -> SandboxSpec {
        let mut spec = SandboxSpec::new(&self.config, key, &self.home, &self.extra_args)
            .with_host(&self.config, &self.host);
        if let Some(id) = &self.home_id {
            // Not part of the spec hash: see `crate::homes`.
            spec.labels
                .insert(crate::homes::LABEL_HOME.to_string(), id.clone());
        }
        match (&self.egress, &self.egress_after_setup) {
            (Egress::On { wiring, .. }, _) => spec.with_egress(wiring),
            // A setup that only brings the proxy's config up to date
            // leaves the wiring as it is: the sandboxes keep theirs.
            (Egress::NotSetUp { .. }, Some(after)) if after.is_known() => spec.with_egress(after),
            _ => spec,
        }
    }

    /// The singularity instance of a key of the active profile, wired to
    /// the egress proxy when it is on.
    pub fn instance(&self, key: SandboxKey) -> InstanceSpec {
        let wiring = match &self.egress {
            Egress::On { wiring, .. } => Some(wiring),
            _ => None,
        };
        InstanceSpec::new(&self.config, key, &self.home, &self.forward_env, wiring)
    }

    /// The Kubernetes sandbox of a key of the active profile, wired to
    /// the home's proxy in the cluster when it is on.
    pub fn pod(&self, key: SandboxKey) -> crate::kubernetes::PodWanted {
        let egress = match (&self.egress, self.kube_proxy()) {
            (Egress::On { wiring, .. }, Some(proxy)) => Some(proxy.sandbox_egress(&wiring.tokens)),
            _ => None,
        };
        crate::kubernetes::PodWanted::new(
            &self.config.terminal.kubernetes,
            key,
            self.home_id.as_deref(),
            egress.as_ref(),
        )
    }

    /// The home's egress proxy in the cluster: on the kubernetes backend
    /// with `proxy.enabled`, once the proxy is set up (its files read) and
    /// the home's id is known; `None` otherwise.
    pub fn kube_proxy(&self) -> Option<crate::kubernetes::proxy::ProxyWanted> {
        if self.backend() != Backend::Kubernetes || !self.config.proxy.enabled {
            return None;
        }
        let (Egress::On { wiring, settings }, Some(home)) = (&self.egress, &self.home_id) else {
            return None;
        };
        let digest = crate::kubernetes::proxy::secret_digest(
            settings,
            &wiring.ca_sha256,
            self.egress_keys.as_ref(),
        );
        Some(crate::kubernetes::proxy::ProxyWanted::new(
            &self.config.terminal.kubernetes,
            home,
            wiring.tunnel_port,
            digest,
            wiring.ca_sha256.clone(),
        ))
    }

    /// The instance `hermes exec` runs in, chosen as [`Desired::exec_sandbox`]
    /// chooses a Docker sandbox.
    pub fn exec_instance(&self, task: &str, session: Option<&str>) -> InstanceSpec {
        self.instance(self.exec_sandbox(task, session).key)
    }

    /// Sets the home's identity and rebuilds the warm sandboxes' specs
    /// with its label.
    pub fn set_home_id(&mut self, id: String) {
        self.home_id = Some(id);
        let keys: Vec<SandboxKey> = self.sandboxes.iter().map(|s| s.key.clone()).collect();
        self.sandboxes = keys.into_iter().map(|k| self.sandbox(k)).collect();
        let keys: Vec<SandboxKey> = self.pods.iter().map(|s| s.key.clone()).collect();
        self.pods = keys.into_iter().map(|k| self.pod(k)).collect();
    }

    /// Sets the egress side (read from the proxy's files) and rebuilds
    /// the warm sandboxes' and instances' specs with it.
    pub fn set_egress(&mut self, egress: Egress) {
        self.egress = egress;
        let keys: Vec<SandboxKey> = self.sandboxes.iter().map(|s| s.key.clone()).collect();
        self.sandboxes = keys.into_iter().map(|k| self.sandbox(k)).collect();
        let keys: Vec<SandboxKey> = self.instances.iter().map(|s| s.key.clone()).collect();
        self.instances = keys.into_iter().map(|k| self.instance(k)).collect();
        let keys: Vec<SandboxKey> = self.pods.iter().map(|s| s.key.clone()).collect();
        self.pods = keys.into_iter().map(|k| self.pod(k)).collect();
    }

    /// Whether Docker sandboxes (and singularity instances, which run on
    /// this host as well) must not run without a healthy proxy.
    pub fn egress_enforced(&self) -> bool {
        let p = &self.config.proxy;
        p.enabled && p.enforce_on_docker
    }

    /// The sandbox `hermes exec` runs in: the session's when one is named;
    /// without one, the task's persistent sandbox, or, when
    /// `container_persistent` is false, the task's `default` session.
    pub fn exec_sandbox(&self, task: &str, session: Option<&str>) -> SandboxSpec {
        match session {
            Some(s) => self.sandbox(SandboxKey::session(&self.profile, task, s)),
            None if !self.config.terminal.container_persistent => {
                self.sandbox(SandboxKey::session(&self.profile, task, DEFAULT_SESSION))
            }
            None => self.sandbox_for_task(task),
        }
    }

    /// How many ready, unclaimed session sandboxes the warm pool keeps
    /// (`terminal.warm_pool`, on the docker backend; 0 elsewhere).
    pub fn pool_size(&self) -> u32 {
        if self.config.terminal.backend != Backend::Docker {
            return 0;
        }
        u32::try_from(self.config.terminal.warm_pool).unwrap_or(u32::MAX)
    }

    /// The spec of warm-pool member `index`.
    pub fn pool_member(&self, index: u32) -> SandboxSpec {
        self.pool_member_named(&sandbox::pool_member_name(&self.profile, POOL_TASK, index))
    }

    /// The spec of the warm-pool member made as `name` (its
    /// [`sandbox::LABEL_POOL`]), as the current config has it: what a
    /// member is compared with, and where its runner's directory is once
    /// a session claimed it.
    pub fn pool_member_named(&self, name: &str) -> SandboxSpec {
        self.sandbox(SandboxKey::session(&self.profile, POOL_TASK, POOL_SESSION))
            .into_pool_member(name)
    }

    /// Whether the sandbox of `key` may be a claimed warm-pool member: a
    /// session's of the pool's task, while the pool is on.
    pub fn pool_serves(&self, key: &SandboxKey) -> bool {
        self.pool_size() > 0 && key.session.is_some() && key.task == POOL_TASK
    }

    /// What the config says about a labelled container of the active
    /// profile that no warm sandbox claims, from its session label.
    pub fn role(&self, is_session: bool) -> Role {
        let t = &self.config.terminal;
        if t.backend != Backend::Docker {
            return Role::NotDesired;
        }
        if is_session {
            return Role::OnDemand {
                idle_limit: Some(t.lifetime_seconds),
            };
        }
        if !t.container_persistent {
            return Role::NotDesired;
        }
        if let Some(limit) = self.idle_stop_after() {
            return Role::OnDemand {
                idle_limit: Some(limit),
            };
        }
        Role::OnDemand {
            idle_limit: if t.docker_persist_across_processes {
                t.persistent_max_idle_seconds
            } else {
                Some(t.lifetime_seconds)
            },
        }
    }

    /// With `terminal.idle_action: stop`, how long a persistent sandbox may
    /// be idle before its container is stopped (the warm one's too):
    /// `persistent_max_idle_seconds`, else `lifetime_seconds`. `None`: an
    /// idle persistent sandbox is removed, if ever.
    pub fn idle_stop_after(&self) -> Option<u64> {
        let t = &self.config.terminal;
        (t.idle_action == crate::config::IdleAction::Stop)
            .then(|| t.persistent_max_idle_seconds.unwrap_or(t.lifetime_seconds))
    }

    pub fn backend(&self) -> Backend {
        self.config.terminal.backend
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    fn build(text: &str, env: &HostEnv) -> Desired {
        Desired::build(load(text).unwrap().config, "default", Path::new("/h"), env).unwrap()
    }

    #[test]
    fn profiles_are_label_safe_names() {
        assert!(check_profile("default").is_ok());
        assert!(check_profile("work-2.a_b").is_ok());
        assert!(check_profile("").is_err());
        assert!(check_profile("a/b").is_err());
        assert!(check_profile(&"x".repeat(64)).is_err());
        assert!(check_profile("..").is_err());
    }

    #[test]
    fn the_local_backend_wants_no_sandbox() {
        assert!(build("", &HostEnv::default()).sandboxes.is_empty());
    }

    #[test]
    fn docker_wants_one_persistent_sandbox_of_the_default_task() {
        let d = build("terminal:\n  backend: docker\n", &HostEnv::default());
        assert_eq!(d.sandboxes.len(), 1);
        assert_eq!(
            d.sandboxes[0].key,
            SandboxKey::persistent("default", "default")
        );
        let d = build(
            "terminal:\n  backend: docker\n  container_persistent: false\n",
            &HostEnv::default(),
        );
        assert!(d.sandboxes.is_empty());
    }

    #[test]
    fn the_default_sandbox_is_warm_only_when_kept_across_processes_and_never_idle_reaped() {
        let warm = |extra: &str| {
            build(
                &format!("terminal:\n  backend: docker\n{extra}"),
                &HostEnv::default(),
            )
            .sandboxes
            .len()
        };
        assert_eq!(warm(""), 1);
        assert_eq!(warm("  docker_persist_across_processes: false\n"), 0);
        assert_eq!(warm("  persistent_max_idle_seconds: 600\n"), 0);
    }

    #[test]
    fn roles_follow_the_backend_persistence_and_idle_settings() {
        let role = |extra: &str, session: bool| {
            build(&format!("terminal:\n{extra}"), &HostEnv::default()).role(session)
        };
        assert_eq!(role("  backend: local\n", true), Role::NotDesired);
        assert_eq!(role("  backend: local\n", false), Role::NotDesired);
        assert_eq!(
            role("  backend: docker\n  lifetime_seconds: 30\n", true),
            Role::OnDemand {
                idle_limit: Some(30)
            }
        );
        assert_eq!(
            role("  backend: docker\n", false),
            Role::OnDemand { idle_limit: None }
        );
        assert_eq!(
            role(
                "  backend: docker\n  persistent_max_idle_seconds: 900\n",
                false
            ),
            Role::OnDemand {
                idle_limit: Some(900)
            }
        );
        assert_eq!(
            role(
                "  backend: docker\n  docker_persist_across_processes: false\n  lifetime_seconds: 40\n",
                false
            ),
            Role::OnDemand {
                idle_limit: Some(40)
            }
        );
        assert_eq!(
            role("  backend: docker\n  container_persistent: false\n", false),
            Role::NotDesired
        );
    }

    #[test]
    fn exec_picks_the_session_or_the_task_sandbox() {
        let d = build("terminal:\n  backend: docker\n", &HostEnv::default());
        assert_eq!(d.exec_sandbox("t", None).name, "hermes-default-t");
        assert_eq!(d.exec_sandbox("t", Some("s")).name, "hermes-default-t-s");
        let d = build(
            "terminal:\n  backend: docker\n  container_persistent: false\n",
            &HostEnv::default(),
        );
        assert_eq!(d.exec_sandbox("t", None).name, "hermes-default-t-default");
        assert!(check_session("a.b_c-1").is_ok());
        assert!(check_session("a b").is_err());
        assert!(check_session("..").is_err());
    }

    #[test]
    fn env_passthrough_forwards_what_is_set_but_never_an_agents_provider_credential() {
        let env = HostEnv {
            process: [
                (
                    "PIP_INDEX_URL".to_string(),
                    "https://pypi.example".to_string(),
                ),
                ("OPENAI_API_KEY".to_string(), "sk-real".to_string()),
                ("EMPTY".to_string(), String::new()),
            ]
            .into(),
            dotenv: vec![("NOTION_TOKEN".to_string(), "nt".to_string())],
            ..HostEnv::default()
        };
        let d = build(
            "terminal:\n  backend: docker\n  docker_forward_env: [PIP_INDEX_URL]\n  env_passthrough: [PIP_INDEX_URL, OPENAI_API_KEY, EMPTY, NOTION_TOKEN, UNSET]\n",
            &env,
        );
        assert_eq!(
            d.passthrough_env,
            [("NOTION_TOKEN".to_string(), "nt".to_string())]
        );
        assert_eq!(d.forward_env[0].0, "PIP_INDEX_URL");
        // Per command, like docker_forward_env's: no container holds them.
        assert!(d.sandboxes[0].env.is_empty());
    }

    #[test]
    fn errors_of_docker_extra_args_block_the_docker_sandboxes_with_their_place() {
        let d = build(
            "terminal:\n  backend: docker\n  docker_extra_args: [--shm-size=2g, --privileged]\n",
            &HostEnv::default(),
        );
        let blocked = d.docker_blocked.unwrap();
        assert!(
            blocked.starts_with("terminal.docker_extra_args[1]: `--privileged` gives the sandbox"),
            "{blocked}"
        );
        assert!(blocked.ends_with("(config.yaml line 3)"), "{blocked}");
        // What maps is still mapped.
        assert_eq!(d.extra_args.shm_size_bytes, Some(2 << 30));
        assert!(
            build("terminal:\n  backend: docker\n", &HostEnv::default())
                .docker_blocked
                .is_none()
        );
    }

    #[test]
    fn the_terminal_variables_of_dotenv_win_over_the_processs() {
        let env = HostEnv {
            process: [
                ("TERMINAL_ENV".to_string(), "docker".to_string()),
                ("TERMINAL_TIMEOUT".to_string(), "5".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
            ]
            .into(),
            dotenv: vec![("TERMINAL_ENV".to_string(), "ssh".to_string())],
            ..HostEnv::default()
        };
        let vars: Vec<(String, String)> = env.terminal_vars().into_iter().collect();
        assert_eq!(
            vars,
            [
                ("TERMINAL_ENV".to_string(), "ssh".to_string()),
                ("TERMINAL_TIMEOUT".to_string(), "5".to_string())
            ]
        );
    }

    #[test]
    fn forwarded_variables_come_from_the_environment_then_dotenv() {
        let env = HostEnv {
            process: [("A".to_string(), "from-env".to_string())].into(),
            dotenv: vec![
                ("A".to_string(), "from-dotenv".to_string()),
                ("B".to_string(), "b".to_string()),
            ],
            ..HostEnv::default()
        };
        let d = build(
            "terminal:\n  backend: docker\n  docker_forward_env: [A, B, C]\n",
            &env,
        );
        assert_eq!(
            d.forward_env,
            [
                ("A".to_string(), "from-env".to_string()),
                ("B".to_string(), "b".to_string())
            ]
        );
        // Per command, never in the container's spec: another value makes
        // no other container.
        assert!(d.sandboxes[0].env.is_empty());
        let other = build(
            "terminal:\n  backend: docker\n  docker_forward_env: [A, B, C]\n",
            &HostEnv::default(),
        );
        assert_eq!(other.sandboxes[0].hash(), d.sandboxes[0].hash());
        assert_eq!(d.warnings.len(), 1);
        assert!(
            d.warnings[0].contains("C is set neither"),
            "{}",
            d.warnings[0]
        );
    }
}
