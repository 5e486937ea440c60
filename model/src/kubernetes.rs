//! The kubernetes backend as plain data: the `terminal.kubernetes_*`
//! settings, the objects hermes wants in the namespace for one sandbox key
//! ([`PodWanted`]: a Pod, and for a persistent sandbox the
//! PersistentVolumeClaim that outlives it), the names and label rules of
//! the API, and what a pass found there ([`KubeObserved`]).
//!
//! A persistent sandbox keeps `/workspace` and `/root` on its claim (two
//! sub-paths of one volume), so replacing its Pod (a changed spec) keeps
//! every file, as a Docker sandbox's recreate does; a session's sandbox
//! keeps them in `emptyDir` volumes that go with its Pod. The hardening of
//! a Docker sandbox becomes the Pod's security context: every capability
//! dropped and the same few added back, no privilege escalation, the
//! runtime's default seccomp profile, resource limits, no service account
//! token mounted. Objects hermes writes carry [`LABEL_MANAGED_BY`]; an
//! object without it is never changed or deleted.

pub mod proxy;

use std::collections::BTreeMap;

use crate::fingerprint::Fingerprint;
use crate::sandbox::{
    CAP_ADD, LABEL_AGENT, LABEL_EGRESS, LABEL_PROFILE, LABEL_SESSION, LABEL_SESSION_TASK,
    LABEL_SPEC_HASH, LABEL_TASK, SandboxKey,
};

/// The label every object hermes writes carries, with [`MANAGED_BY`].
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "hermes";
/// The server-side apply field manager of every write.
pub const FIELD_MANAGER: &str = "hermes";
/// The sandbox's one container.
pub const CONTAINER: &str = "sandbox";
/// Where a persistent sandbox's claim keeps its two directories.
pub const DATA_PATHS: &[(&str, &str)] = &[("workspace", "/workspace"), ("home", "/root")];
/// The sandbox's scratch directories (memory-backed `emptyDir`s, as the
/// Docker sandbox's tmpfs mounts): mount point, size limit.
pub const SCRATCH: &[(&str, &str, &str)] = &[
    ("tmp", "/tmp", "512Mi"),
    ("var-tmp", "/var/tmp", "256Mi"),
    ("run", "/run", "64Mi"),
];
/// The grace a replaced or removed Pod gets to end its commands.
pub const GRACE_SECONDS: i64 = 10;
/// The annotation every command sets on its Pod as it starts and as it
/// ends (Unix seconds): the Pod's last use as every host sees it, and, as
/// each write changes the Pod's resource version, what makes an idle
/// reaper's delete looked at before the command fail its precondition.
pub const ANNOTATION_LAST_USED: &str = "hermes-last-used";

/// One toleration of `terminal.kubernetes_tolerations`, written as
/// `key[=value][:Effect]` (kubectl's taint syntax): no value tolerates the
/// key whatever its value (`Exists`), no effect every effect.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Toleration {
    pub key: String,
    pub value: Option<String>,
    pub effect: Option<String>,
}

/// The effects a taint (and so a toleration) may name.
pub const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl Toleration {
    /// Its part of a spec hash: `key=value:effect` (`*` for either left
    /// out).
    pub fn fingerprint(&self) -> String {
        format!(
            "{}={}:{}",
            self.key,
            self.value.as_deref().unwrap_or("*"),
            self.effect.as_deref().unwrap_or("*")
        )
    }

    /// Parses `key[=value][:Effect]`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Toleration, String> {
        let (rest, effect) = match text.rsplit_once(':') {
            Some((rest, effect)) => {
                if !EFFECTS.contains(&effect) {
                    return Err(format!(
                        "`{effect}` is not a taint effect (one of {})",
                        EFFECTS.join(", ")
                    ));
                }
                (rest, Some(effect.to_string()))
            }
            None => (text, None),
        };
        let (key, value) = match rest.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (rest, None),
        };
        check_label_key(key).map_err(|e| format!("taint key: {e}"))?;
        if let Some(v) = value {
            check_label_value(v).map_err(|e| format!("taint value: {e}"))?;
        }
        Ok(Toleration {
            key: key.to_string(),
            value: value.map(str::to_string),
            effect,
        })
    }
}

/// The `terminal.kubernetes_*` settings, as read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KubeSettings {
    /// A kubeconfig file (`~/` expanded by the reader of the host);
    /// `None`: `$KUBECONFIG`, else `~/.kube/config`.
    pub kubeconfig: Option<String>,
    /// The kubeconfig's context; `None`: its current one.
    pub context: Option<String>,
    /// Use the Pod's own service account instead of a kubeconfig.
    pub in_cluster: bool,
    pub namespace: String,
    /// The sandbox image: `kubernetes_image`, else `docker_image`.
    pub image: String,
    /// CPUs (0: no limit).
    pub cpu: f64,
    /// MiB (0: no limit).
    pub memory_mb: u64,
    /// MiB: a persistent sandbox's claim, and its ephemeral storage
    /// limit (0: none).
    pub disk_mb: u64,
    pub storage_class: Option<String>,
    pub runtime_class: Option<String>,
    /// The Pod's service account (its token never mounted); `None`: the
    /// namespace's `default`.
    pub service_account: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// Extra labels on every object (never one of hermes's own).
    pub labels: BTreeMap<String, String>,
    /// The egress proxy Pod's image (`hermes` on its `PATH`); `None`:
    /// not set, which blocks the proxy (and so, with `proxy.enabled`,
    /// every sandbox).
    pub proxy_image: Option<String>,
}

/// Which kind holds a sandbox: a Pod hermes manages, or agent-sandbox's
/// `Sandbox` (`agents.x-k8s.io`) when the cluster serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxKind {
    Pod,
    AgentSandbox,
}

impl SandboxKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxKind::Pod => "Pod",
            SandboxKind::AgentSandbox => "Sandbox (agents.x-k8s.io)",
        }
    }
}

/// agent-sandbox's API group, and the version of it hermes writes.
pub const SANDBOX_GROUP: &str = "agents.x-k8s.io";
pub const SANDBOX_VERSION: &str = "v1beta1";

/// The objects hermes wants for one sandbox key.
#[derive(Debug, Clone, PartialEq)]
pub struct PodWanted {
    pub key: SandboxKey,
    /// What holds it: a Pod of hermes's own, or agent-sandbox's `Sandbox`
    /// (whose controller makes the Pod, of the same name); set by the
    /// planner from what the cluster serves ([`PodWanted::holding`]).
    pub kind: SandboxKind,
    pub namespace: String,
    /// The Pod's name ([`object_name`]).
    pub name: String,
    /// The persistent sandbox's claim: `<name>-data`; `None` for a
    /// session's sandbox.
    pub claim: Option<String>,
    pub image: String,
    /// Labels of the Pod and its claim: hermes's own (the spec hash
    /// included) over the configured extra ones.
    pub labels: BTreeMap<String, String>,
    /// Environment values fixed in the Pod: the proxy's variables and
    /// tokens when wired (tokens, never a real key).
    pub env: Vec<(String, String)>,
    /// CPU limit in millicores (0: none).
    pub cpu_millis: u64,
    /// Memory limit in MiB (0: none).
    pub memory_mb: u64,
    /// The claim's size, and the ephemeral storage limit, in MiB (0: the
    /// claim gets 1 GiB, no limit).
    pub disk_mb: u64,
    pub storage_class: Option<String>,
    pub runtime_class: Option<String>,
    pub service_account: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// The capabilities added back after dropping all.
    pub cap_add: Vec<String>,
    /// The proxy's CA as a ConfigMap, mounted where a Docker sandbox has
    /// it, when wired.
    pub ca_config_map: Option<String>,
    /// The egress fingerprint, `off` when not wired.
    pub egress: String,
    /// A hash of everything fixed when the Pod is made; a change is a
    /// replacement (the claim kept).
    pub hash: String,
}

/// The egress side of a Kubernetes sandbox: the variables and tokens it
/// gets, the CA's ConfigMap, and the fingerprint that names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeEgress {
    pub env: Vec<(String, String)>,
    pub ca_config_map: String,
    pub fingerprint: String,
}

impl PodWanted {
    /// The objects of `key` under `settings`; `home_id` labels them with
    /// the home, `egress` wires them to the proxy.
    pub fn new(
        settings: &KubeSettings,
        key: SandboxKey,
        home_id: Option<&str>,
        egress: Option<&KubeEgress>,
    ) -> PodWanted {
        let name = object_name(&key);
        let mut labels: BTreeMap<String, String> = settings.labels.clone();
        labels.insert(LABEL_AGENT.to_string(), "1".to_string());
        labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
        labels.insert(LABEL_PROFILE.to_string(), label_value(&key.profile));
        match &key.session {
            None => {
                labels.insert(LABEL_TASK.to_string(), label_value(&key.task));
            }
            Some(session) => {
                labels.insert(LABEL_SESSION_TASK.to_string(), label_value(&key.task));
                labels.insert(LABEL_SESSION.to_string(), label_value(session));
            }
        }
        if let Some(id) = home_id {
            labels.insert(crate::homes::LABEL_HOME.to_string(), label_value(id));
        }
        let egress_label = egress.map_or("off".to_string(), |e| e.fingerprint.clone());
        labels.insert(LABEL_EGRESS.to_string(), label_value(&egress_label));
        let mut wanted = PodWanted {
            kind: SandboxKind::Pod,
            claim: key.session.is_none().then(|| format!("{name}-data")),
            namespace: settings.namespace.clone(),
            name,
            key,
            image: settings.image.clone(),
            labels,
            env: egress.map(|e| e.env.clone()).unwrap_or_default(),
            cpu_millis: (settings.cpu * 1000.0).round().max(0.0) as u64,
            memory_mb: settings.memory_mb,
            disk_mb: settings.disk_mb,
            storage_class: settings.storage_class.clone(),
            runtime_class: settings.runtime_class.clone(),
            service_account: settings.service_account.clone(),
            node_selector: settings.node_selector.clone(),
            tolerations: settings.tolerations.clone(),
            cap_add: CAP_ADD.iter().map(|c| c.to_string()).collect(),
            ca_config_map: egress.map(|e| e.ca_config_map.clone()),
            egress: egress_label,
            hash: String::new(),
        };
        wanted.hash = wanted.compute_hash();
        wanted
            .labels
            .insert(LABEL_SPEC_HASH.to_string(), wanted.hash.clone());
        wanted
    }

    /// The hash of what the Pod is made with. Token values are left out
    /// (their names stay in), so a token rotation replaces nothing; the
    /// claim's size and class are the claim's, fixed when it is made.
    fn compute_hash(&self) -> String {
        let mut f = Fingerprint::new();
        f.field("image", &self.image);
        f.field("cpu", &self.cpu_millis.to_string());
        f.field("memory", &self.memory_mb.to_string());
        f.field("disk", &self.disk_mb.to_string());
        f.field("runtime_class", self.runtime_class.as_deref().unwrap_or(""));
        f.field(
            "service_account",
            self.service_account.as_deref().unwrap_or(""),
        );
        for (k, v) in &self.node_selector {
            f.field("node_selector", &format!("{k}={v}"));
        }
        for t in &self.tolerations {
            f.field("toleration", &t.fingerprint());
        }
        for (k, v) in &self.labels {
            if k != LABEL_SPEC_HASH {
                f.field("label", &format!("{k}={v}"));
            }
        }
        for (k, v) in &self.env {
            let value = if crate::providers::is_credential_variable(k) {
                ""
            } else {
                v.as_str()
            };
            f.field("env", &format!("{k}={value}"));
        }
        f.field("ca", self.ca_config_map.as_deref().unwrap_or(""));
        f.field("egress", &self.egress);
        f.finish()
    }

    /// The same objects held by `kind`. The spec hash is the Pod's either
    /// way: what runs is the same.
    pub fn holding(&self, kind: SandboxKind) -> PodWanted {
        PodWanted {
            kind,
            ..self.clone()
        }
    }

    /// The size its claim asks for: `kubernetes_disk`, or 1 GiB when that
    /// is 0 (a claim must ask for something).
    pub fn claim_size_mb(&self) -> u64 {
        if self.disk_mb == 0 {
            1024
        } else {
            self.disk_mb
        }
    }

    /// The label selector that finds exactly this sandbox's objects.
    pub fn selector(&self) -> String {
        selector_of(&self.key)
    }
}

/// `hermes-agent=1` plus the key's own labels: what finds one sandbox's
/// objects.
pub fn selector_of(key: &SandboxKey) -> String {
    let mut s = format!(
        "{LABEL_AGENT}=1,{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_PROFILE}={}",
        label_value(&key.profile)
    );
    match &key.session {
        None => s.push_str(&format!(",{LABEL_TASK}={}", label_value(&key.task))),
        Some(session) => s.push_str(&format!(
            ",{LABEL_SESSION_TASK}={},{LABEL_SESSION}={}",
            label_value(&key.task),
            label_value(session)
        )),
    }
    s
}

/// The selector of every object hermes made in a namespace.
pub const ALL_SELECTOR: &str = "hermes-agent=1,app.kubernetes.io/managed-by=hermes";

/// A Pod's name for `key`: `hermes-<profile>-<task>[-<session>]` in the
/// API's alphabet (lowercase letters, digits and `-`), cut to fit, and a
/// hash of the exact key, so two keys that read the same once lowercased
/// (`Task_1`, `task-1`) never share a Pod. At most 57 characters, so
/// `-data` still fits a claim's name within 63.
pub fn object_name(key: &SandboxKey) -> String {
    let mut f = Fingerprint::new();
    f.field("profile", &key.profile);
    f.field("task", &key.task);
    f.field("session", key.session.as_deref().unwrap_or(""));
    let hash = &f.finish()[..8];
    let mut readable = format!("hermes-{}-{}", key.profile, key.task);
    if let Some(s) = &key.session {
        readable.push('-');
        readable.push_str(s);
    }
    let mut out = String::new();
    for c in readable.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out.truncate(57 - hash.len() - 1);
    let out = out.trim_end_matches('-');
    format!("{out}-{hash}")
}

/// A label value of the API: at most 63 of `[A-Za-z0-9_.-]`, starting and
/// ending with a letter or digit. Names checked at the edge pass as they
/// are; anything else is mapped into that alphabet.
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "x".to_string()
    } else {
        trimmed.to_string()
    }
}

/// A DNS-1123 label (a namespace's name): at most 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit.
pub fn check_dns_label(value: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if value.is_empty() {
        return Err("is empty".to_string());
    }
    if value.len() > 63 {
        return Err(format!("is {} characters long; at most 63", value.len()));
    }
    if !value.chars().all(ok_char) {
        return Err("may hold only lowercase letters, digits and `-`".to_string());
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err("must start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// A DNS-1123 subdomain (the name of a storage class, a runtime class, a
/// service account): dot-separated DNS-1123 labels, at most 253 long.
pub fn check_dns_subdomain(value: &str) -> Result<(), String> {
    if value.len() > 253 {
        return Err(format!("is {} characters long; at most 253", value.len()));
    }
    value
        .split('.')
        .try_for_each(check_dns_label)
        .map_err(|e| format!("`{value}` is not a DNS-1123 name: a part {e}"))
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of
/// at most 63 of `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|e| format!("prefix of `{key}`: {e}"))?;
    }
    check_label_value(name).map_err(|e| format!("`{key}`: {e}"))?;
    if name.is_empty() {
        return Err(format!("`{key}` has an empty name"));
    }
    Ok(())
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9_.-]`, starting and
/// ending alphanumeric.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err(format!("is {} characters long; at most 63", value.len()));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(format!(
            "`{value}` may hold only letters, digits, `_`, `.` and `-`"
        ));
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge(value.chars().next()) || !edge(value.chars().last()) {
        return Err(format!(
            "`{value}` must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Whether a label key is one hermes sets itself, which
/// `kubernetes_labels` may not replace.
pub fn is_own_label(key: &str) -> bool {
    [
        LABEL_AGENT,
        LABEL_MANAGED_BY,
        LABEL_PROFILE,
        LABEL_TASK,
        LABEL_SESSION,
        LABEL_SESSION_TASK,
        LABEL_SPEC_HASH,
        LABEL_EGRESS,
        crate::homes::LABEL_HOME,
        proxy::LABEL_PROXY,
    ]
    .contains(&key)
}

/// A Pod as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenPod {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: String,
    /// Its Ready condition.
    pub ready: bool,
    /// Being deleted (a deletion timestamp).
    pub deleting: bool,
    /// Why its container waits (`ErrImagePull`, …), when it does.
    pub waiting: Option<String>,
    /// When it started (Unix seconds).
    pub started_at: Option<i64>,
    /// When a command last started or ended in it (the later of its
    /// [`ANNOTATION_LAST_USED`] and this host's activity record), when
    /// one did.
    pub last_used: Option<i64>,
    /// Processes running in it besides its own (an exec, a background
    /// process): counted only for a Pod the idle reaper looks at; `None`
    /// when not counted or not known, which counts as busy.
    pub processes: Option<u32>,
    /// Made by agent-sandbox's controller for a `Sandbox` (its
    /// controller reference), not by hermes directly.
    pub of_sandbox: bool,
}

impl SeenPod {
    /// Whether hermes made it (its managed-by label).
    pub fn made_by_hermes(&self) -> bool {
        self.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.labels.get(LABEL_SPEC_HASH).map(String::as_str)
    }

    /// Since when nothing was used in it: its last command, or its start
    /// when that is later; `None` before it started.
    pub fn unused_since(&self) -> Option<i64> {
        match (self.last_used, self.started_at) {
            (Some(a), Some(s)) => Some(a.max(s)),
            (a, s) => a.or(s),
        }
    }
}

/// An agent-sandbox `Sandbox` as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenSandbox {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// Its `operatingMode` is `Suspended`.
    pub suspended: bool,
    pub deleting: bool,
}

impl SeenSandbox {
    pub fn made_by_hermes(&self) -> bool {
        self.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.labels.get(LABEL_SPEC_HASH).map(String::as_str)
    }
}

/// The name of a Pod's activity record (`state/activity/`), apart from
/// the Docker containers'.
pub fn activity_key(namespace: &str, pod: &str) -> String {
    format!("k8s.{namespace}.{pod}")
}

/// A claim as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenClaim {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// `Pending`, `Bound`, `Lost`.
    pub phase: String,
    pub deleting: bool,
}

impl SeenClaim {
    pub fn made_by_hermes(&self) -> bool {
        self.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
    }
}

/// What a pass found in the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeObserved {
    /// The API server could not be asked (no kubeconfig, refused, 403):
    /// why, naming the verb and resource where the server said.
    Unavailable { reason: String },
    Seen {
        kind: SandboxKind,
        /// Every Pod whose name a wanted sandbox would take, and every
        /// Pod hermes labelled.
        pods: Vec<SeenPod>,
        claims: Vec<SeenClaim>,
        /// agent-sandbox's `Sandbox` objects hermes labelled (and any
        /// named like a wanted one), when that is the kind.
        sandboxes: Vec<SeenSandbox>,
        /// The home's egress proxy objects, when the proxy is wanted or
        /// any was found.
        proxy: proxy::SeenProxy,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn object_names_fit_the_api_and_never_collide_once_lowercased() {
        let a = object_name(&SandboxKey::persistent("default", "Task_1"));
        let b = object_name(&SandboxKey::persistent("default", "task-1"));
        assert_ne!(a, b);
        for name in [&a, &b] {
            check_dns_label(name).unwrap();
            assert!(name.starts_with("hermes-default-task-1-"), "{name}");
        }
        let long = object_name(&SandboxKey::session("p", &"x".repeat(200), "s"));
        assert!(long.len() <= 57, "{long}");
        check_dns_label(&long).unwrap();
        check_dns_label(&format!("{long}-data")).unwrap();
    }

    #[test]
    fn tolerations_read_kubectl_s_taint_syntax() {
        assert_eq!(
            Toleration::parse("gpu=true:NoSchedule").unwrap(),
            Toleration {
                key: "gpu".into(),
                value: Some("true".into()),
                effect: Some("NoSchedule".into())
            }
        );
        assert_eq!(
            Toleration::parse("example.com/dedicated").unwrap().value,
            None
        );
        assert!(
            Toleration::parse("gpu:Sometimes")
                .unwrap_err()
                .contains("effect")
        );
        assert!(Toleration::parse("bad key:NoSchedule").is_err());
    }

    #[test]
    fn label_rules_follow_the_api() {
        check_label_key("app.kubernetes.io/name").unwrap();
        check_label_key("team").unwrap();
        assert!(check_label_key("-team").is_err());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_value("ends-").is_err());
        assert_eq!(label_value("a b/c-"), "a_b_c");
        assert_eq!(label_value("__"), "x");
    }

    fn settings() -> KubeSettings {
        KubeSettings {
            namespace: "hermes".into(),
            image: "debian:bookworm".into(),
            cpu: 1.0,
            memory_mb: 5120,
            disk_mb: 51200,
            ..KubeSettings::default()
        }
    }

    #[test]
    fn a_persistent_sandbox_has_a_claim_and_a_session_none() {
        let p = PodWanted::new(
            &settings(),
            SandboxKey::persistent("default", "t"),
            Some("abc"),
            None,
        );
        assert_eq!(
            p.claim.as_deref(),
            Some(format!("{}-data", p.name).as_str())
        );
        assert_eq!(p.labels[LABEL_MANAGED_BY], "hermes");
        assert_eq!(p.labels[LABEL_SPEC_HASH], p.hash);
        assert_eq!(p.cpu_millis, 1000);
        let s = PodWanted::new(
            &settings(),
            SandboxKey::session("default", "t", "s1"),
            Some("abc"),
            None,
        );
        assert_eq!(s.claim, None);
        assert_eq!(s.labels[LABEL_SESSION], "s1");
    }

    #[test]
    fn a_token_rotation_keeps_the_hash_and_an_image_change_does_not() {
        let egress = |token: &str| KubeEgress {
            env: vec![
                ("HTTPS_PROXY".into(), "http://proxy:9090".into()),
                ("OPENAI_API_KEY".into(), token.into()),
            ],
            ca_config_map: "hermes-proxy-ca".into(),
            fingerprint: "f1".into(),
        };
        let key = SandboxKey::persistent("default", "t");
        let a = PodWanted::new(&settings(), key.clone(), None, Some(&egress("a")));
        let b = PodWanted::new(&settings(), key.clone(), None, Some(&egress("b")));
        assert_eq!(a.hash, b.hash);
        let mut other = settings();
        other.image = "debian:trixie".into();
        let c = PodWanted::new(&other, key, None, Some(&egress("a")));
        assert_ne!(a.hash, c.hash);
    }
}
