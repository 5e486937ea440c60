//! The singularity (Apptainer) backend as plain data: the instance hermes
//! wants for a (profile, task), where its image and overlay live, how it
//! reaches the egress proxy, and what a pass found.
//!
//! The image is built once into a cached SIF under
//! `$HERMES_HOME/cache/singularity/` from `singularity_image` (by default
//! `docker://` + `docker_image`). A persistent instance writes into an
//! overlay directory under `$HERMES_HOME/sandboxes/singularity/<profile>/
//! <task>/overlay`, so its files (`/workspace`, `/root`, installed
//! packages) outlive the instance; a session's instance gets a writable
//! tmpfs and keeps nothing.
//!
//! Apptainer shares the host's network, so a wired instance reaches the
//! proxy at the host's loopback: the same variables, CA and tokens as a
//! Docker sandbox, with the proxy at `127.0.0.1` instead of
//! `host.docker.internal` and the CA bound read-only where Docker mounts
//! it. Environment values travel in the environment of the `exec`
//! process (`APPTAINERENV_*`), never on a command line.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::config::{Config, PROXY_HOST_NAME};
use crate::egress::{CA_IN_SANDBOX, EgressWiring};
use crate::sandbox::{Bind, SandboxKey, sanitize};

/// The instance hermes wants for one sandbox key.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    pub key: SandboxKey,
    /// The instance name: `hermes-<profile>-<task>[-<session>]`.
    pub name: String,
    /// Where the image comes from (`docker://…`, `library://…`, or a SIF
    /// file on the host).
    pub source: String,
    /// The SIF the instance runs: the cached build of `source`, or
    /// `source` itself when it is a file.
    pub sif: PathBuf,
    /// The instance's directory on the host (its overlay and records).
    pub dir: PathBuf,
    /// The hermes home: `dir` and `overlay` are made from there without
    /// following a symbolic link.
    pub home: PathBuf,
    /// The overlay directory of a persistent instance; `None`: a writable
    /// tmpfs (a session's instance keeps nothing).
    pub overlay: Option<PathBuf>,
    /// `docker_volumes`, and the CA when wired to the proxy.
    pub binds: Vec<Bind>,
    pub memory_mb: u64,
    pub cpus: f64,
    /// Values for every command: `docker_forward_env`, `docker_env`, then
    /// the proxy's variables and tokens when wired. Passed per exec.
    pub env: Vec<(String, String)>,
    /// The egress fingerprint, `off` when not wired.
    pub egress: String,
    /// A hash of everything fixed when the instance starts; a change is a
    /// restart (the overlay is kept).
    pub hash: String,
}

/// The directory of a sandbox key's instance.
pub fn instance_dir(home: &Path, key: &SandboxKey) -> PathBuf {
    let mut dir = home
        .join("sandboxes")
        .join("singularity")
        .join(sanitize(&key.profile))
        .join(sanitize(&key.task));
    if let Some(session) = &key.session {
        dir = dir.join("sessions").join(sanitize(session));
    }
    dir
}

/// The file beside an instance that records the hash it was started with.
pub const HASH_FILE: &str = "spec-hash";

/// Whether an image source is built (a `scheme://` reference) rather than
/// a SIF file on the host.
pub fn is_remote_source(source: &str) -> bool {
    source.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// Where the SIF built from `source` is cached: named by a hash of the
/// source, with a readable prefix.
pub fn cached_sif(home: &Path, source: &str) -> PathBuf {
    let mut f = crate::fingerprint::Fingerprint::new();
    f.field("source", source);
    let readable: String = sanitize(source.rsplit('/').next().unwrap_or(source))
        .chars()
        .take(40)
        .collect();
    home.join("cache")
        .join("singularity")
        .join(format!("{readable}-{}.sif", f.finish()))
}

/// The address the proxy is reached at from an instance: its loopback
/// address when it listens on one (by default it does), else its first.
pub fn proxy_address(config: &Config) -> IpAddr {
    let loopback = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    match &config.proxy.listen {
        None => loopback,
        Some(list) => list
            .iter()
            .find(|ip| ip.is_loopback())
            .or(list.first())
            .copied()
            .unwrap_or(loopback),
    }
}

/// The proxy's variables and tokens for an instance: a Docker sandbox's,
/// with the proxy at `proxy` instead of `host.docker.internal`. Only proxy
/// tokens, never a real key.
pub fn egress_env(wiring: &EgressWiring, proxy: IpAddr) -> Vec<(String, String)> {
    let host = match proxy {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    };
    let docker = format!("http://{PROXY_HOST_NAME}:");
    wiring
        .env()
        .into_iter()
        .map(|(k, v)| match v.strip_prefix(&docker) {
            Some(port) => (k, format!("http://{host}:{port}")),
            None => (k, v),
        })
        .collect()
}

impl InstanceSpec {
    /// The instance of `key`: persistent (an overlay directory) unless the
    /// key names a session. `forward` holds the `docker_forward_env`
    /// values that were found; `egress`, the proxy wiring when it is on.
    pub fn new(
        config: &Config,
        key: SandboxKey,
        home: &Path,
        forward: &[(String, String)],
        egress: Option<&EgressWiring>,
    ) -> InstanceSpec {
        let t = &config.terminal;
        let dir = instance_dir(home, &key);
        let overlay = key.session.is_none().then(|| dir.join("overlay"));
        let source = t.singularity_image.clone();
        let sif = if is_remote_source(&source) {
            cached_sif(home, &source)
        } else {
            PathBuf::from(&source)
        };
        let mut binds: Vec<Bind> = t.docker_volumes.iter().map(Bind::from).collect();
        let mut env: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, v: &str| {
            env.retain(|(name, _)| name != k);
            env.push((k.to_string(), v.to_string()));
        };
        for (k, v) in forward.iter().chain(&t.docker_env) {
            put(k, v);
        }
        let mut fingerprint = "off".to_string();
        if let Some(wiring) = egress {
            for (k, v) in egress_env(wiring, proxy_address(config)) {
                put(&k, &v);
            }
            binds.push(Bind {
                host: wiring.ca_host_path.display().to_string(),
                container: CA_IN_SANDBOX.to_string(),
                options: Some("ro".to_string()),
            });
            fingerprint = wiring.fingerprint();
        }
        let mut spec = InstanceSpec {
            name: key.container_name(),
            key,
            source,
            sif,
            dir,
            home: home.to_path_buf(),
            overlay,
            binds,
            memory_mb: t.container_memory_mb,
            cpus: t.container_cpu,
            env,
            egress: fingerprint,
            hash: String::new(),
        };
        spec.hash = spec.compute_hash();
        spec
    }

    /// A hash of what `instance start` fixes (the environment is given per
    /// exec and is not part of it).
    fn compute_hash(&self) -> String {
        let mut h = crate::fingerprint::Fingerprint::new();
        h.field("name", &self.name);
        h.field("source", &self.source);
        h.field("sif", &self.sif.display().to_string());
        h.field(
            "overlay",
            &self
                .overlay
                .as_ref()
                .map_or(String::new(), |o| o.display().to_string()),
        );
        for b in &self.binds {
            h.field("bind", &b.to_engine());
        }
        h.field("memory", &self.memory_mb.to_string());
        h.field("cpus", &self.cpus.to_string());
        h.field("egress", &self.egress);
        h.finish()
    }
}

/// One instance `instance list --json` reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedInstance {
    pub name: String,
    pub pid: u32,
    /// The image it runs.
    pub image: String,
    /// The hash recorded beside it when hermes started it.
    pub spec_hash: Option<String>,
}

/// What a pass found of the singularity backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SingularityObserved {
    /// The running instances, and whether each wanted image is cached
    /// (by SIF path).
    Seen {
        instances: Vec<ObservedInstance>,
        cached: Vec<PathBuf>,
    },
    /// Neither `apptainer` nor `singularity` can be run: why.
    Unavailable { reason: String },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    fn spec(text: &str, key: SandboxKey, egress: Option<&EgressWiring>) -> InstanceSpec {
        InstanceSpec::new(
            &load(text).unwrap().config,
            key,
            Path::new("/h"),
            &[("FWD".to_string(), "f".to_string())],
            egress,
        )
    }

    fn wiring() -> EgressWiring {
        EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 9090,
            ca_host_path: PathBuf::from("/h/proxy/ca.crt"),
            ca_sha256: "ab".repeat(32),
            tokens: vec![(
                "OPENAI_API_KEY".to_string(),
                "openai-0123456789abcdef0123456789abcdef".to_string(),
            )],
            network: None,
            gcp_adc_host_path: None,
            env_dir_host_path: None,
        }
    }

    #[test]
    fn a_persistent_instance_keeps_an_overlay_under_the_home_and_a_cached_image() {
        let s = spec(
            "terminal:\n  docker_image: python:3.12\n  docker_env: {A: 1}\n  docker_volumes: [/srv:/data:ro]\n",
            SandboxKey::persistent("default", "t"),
            None,
        );
        assert_eq!(s.name, "hermes-default-t");
        assert_eq!(s.source, "docker://python:3.12");
        assert!(
            s.sif.starts_with("/h/cache/singularity/"),
            "{}",
            s.sif.display()
        );
        assert!(s.sif.to_string_lossy().ends_with(".sif"));
        assert_eq!(
            s.overlay.as_deref(),
            Some(Path::new("/h/sandboxes/singularity/default/t/overlay"))
        );
        assert_eq!(s.binds[0].to_engine(), "/srv:/data:ro");
        assert_eq!(
            s.env,
            [
                ("FWD".to_string(), "f".to_string()),
                ("A".to_string(), "1".to_string())
            ]
        );
        assert_eq!(s.egress, "off");
        let session = spec("", SandboxKey::session("default", "t", "s1"), None);
        assert_eq!(session.overlay, None);
        assert_eq!(session.name, "hermes-default-t-s1");
    }

    #[test]
    fn a_sif_file_is_used_as_it_is() {
        let s = spec(
            "terminal:\n  singularity_image: /opt/images/agent.sif\n",
            SandboxKey::persistent("p", "t"),
            None,
        );
        assert_eq!(s.sif, Path::new("/opt/images/agent.sif"));
        assert!(is_remote_source("docker://x"));
        assert!(is_remote_source("library://a/b/c:1"));
        assert!(!is_remote_source("/x/y.sif"));
        assert!(!is_remote_source("relative.sif"));
    }

    #[test]
    fn a_wired_instance_reaches_the_proxy_on_loopback_with_tokens_and_the_ca() {
        let w = wiring();
        let plain = spec("", SandboxKey::persistent("p", "t"), None);
        let wired = spec("", SandboxKey::persistent("p", "t"), Some(&w));
        let env = |k: &str| {
            wired
                .env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(env("HTTPS_PROXY"), Some("http://127.0.0.1:9090"));
        assert_eq!(env("http_proxy"), Some("http://127.0.0.1:9091"));
        assert_eq!(env("SSL_CERT_FILE"), Some(CA_IN_SANDBOX));
        assert_eq!(
            env("OPENAI_API_KEY"),
            Some("openai-0123456789abcdef0123456789abcdef")
        );
        assert!(
            wired
                .binds
                .iter()
                .any(|b| b.to_engine() == "/h/proxy/ca.crt:/etc/ssl/certs/hermes-egress-ca.crt:ro")
        );
        assert_ne!(wired.hash, plain.hash);
        let v6 = spec(
            "proxy:\n  listen: [\"::1\"]\n",
            SandboxKey::persistent("p", "t"),
            Some(&w),
        );
        assert!(
            v6.env
                .contains(&("HTTPS_PROXY".to_string(), "http://[::1]:9090".to_string()))
        );
    }

    #[test]
    fn what_instance_start_fixes_changes_the_hash_and_the_environment_does_not() {
        let key = || SandboxKey::persistent("p", "t");
        let base = spec("", key(), None).hash;
        for text in [
            "terminal:\n  container_memory: 1024\n",
            "terminal:\n  container_cpu: 2\n",
            "terminal:\n  docker_volumes: [/a:/b]\n",
            "terminal:\n  docker_image: other\n",
        ] {
            assert_ne!(spec(text, key(), None).hash, base, "{text}");
        }
        assert_eq!(
            spec("terminal:\n  docker_env: {A: 2}\n", key(), None).hash,
            base
        );
        assert_eq!(base.len(), 12);
    }
}
