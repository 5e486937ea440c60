//! Every config key we know: its dotted path, its type and its default.
//!
//! This table is the one place a key is declared. Validation checks a
//! file against it, `config set` coerces values by it, `config show` starts
//! from its defaults, and unknown keys are matched against it for a "did you
//! mean".

use crate::value::Value;

/// What a key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Bool,
    /// Any string, possibly empty.
    Str,
    /// A non-empty string.
    NonEmptyStr,
    /// A string, or null for "not set".
    OptStr,
    /// One of a fixed set of words.
    Enum(&'static [&'static str]),
    /// An integer of at least 1.
    PosInt,
    /// An integer of at least 1, or null for "not set".
    OptPosInt,
    /// A TCP port, 1 to 65535.
    Port,
    /// A number greater than 0.
    PosNumber,
    /// A number of at least 0 (a limit: 0 is no limit, as Hermes Agent
    /// reads it).
    LimitNumber,
    /// An integer of at least 0 (a limit: 0 is no limit, as Hermes Agent
    /// reads it).
    LimitInt,
    /// Any finite number.
    Number,
    /// A size such as `1g`, `512m` or a number of bytes.
    Size,
    /// A list of strings.
    StrList,
    /// A list of environment variable names.
    EnvNameList,
    /// A list of `host:container[:options]` mounts.
    VolumeList,
    /// A mapping of environment variable names to scalar values.
    EnvMap,
    /// A list of CIDR ranges, or null for the built-in list.
    OptCidrList,
    /// A list of host names or `*.domain` patterns.
    HostPatternList,
    /// A list of IP addresses, or null for the built-in choice.
    OptIpList,
    /// A mapping of host names to IP addresses (like curl's `--resolve`).
    ResolveMap,
    /// A mapping of Kubernetes label keys to label values.
    LabelMap,
    /// A list of Kubernetes tolerations, as `key[=value][:Effect]`.
    TolerationList,
    /// A Kubernetes namespace name (a DNS-1123 label).
    KubeNamespace,
    /// A Kubernetes object name (a DNS-1123 subdomain), or null.
    OptKubeName,
}

impl Ty {
    /// Whether `config set` keeps the value text as a string for this key.
    pub fn takes_text(self) -> bool {
        matches!(
            self,
            Ty::Str
                | Ty::NonEmptyStr
                | Ty::OptStr
                | Ty::Enum(_)
                | Ty::Size
                | Ty::KubeNamespace
                | Ty::OptKubeName
        )
    }

    /// What the key expects, for error messages.
    pub fn expectation(self) -> String {
        match self {
            Ty::Bool => "a boolean (true or false)".into(),
            Ty::Str => "a string".into(),
            Ty::NonEmptyStr => "a non-empty string".into(),
            Ty::OptStr => "a string or null".into(),
            Ty::Enum(words) => format!("one of {}", words.join(", ")),
            Ty::PosInt => "a positive integer".into(),
            Ty::OptPosInt => "a positive integer or null".into(),
            Ty::Port => "a port number from 1 to 65535".into(),
            Ty::PosNumber => "a number greater than 0".into(),
            Ty::LimitNumber => "a number of at least 0 (0: no limit)".into(),
            Ty::LimitInt => "an integer of at least 0 (0: no limit)".into(),
            Ty::Number => "a number".into(),
            Ty::Size => "a size such as 512m or 1g".into(),
            Ty::StrList => "a list of strings".into(),
            Ty::EnvNameList => "a list of environment variable names".into(),
            Ty::VolumeList => "a list of host:container[:options] mounts".into(),
            Ty::EnvMap => "a mapping of variable names to values".into(),
            Ty::OptCidrList => "a list of CIDR ranges (such as 10.0.0.0/8) or null".into(),
            Ty::HostPatternList => "a list of host names or *.domain patterns".into(),
            Ty::OptIpList => "a list of IP addresses (such as 127.0.0.1) or null".into(),
            Ty::ResolveMap => "a mapping of host names to IP addresses".into(),
            Ty::LabelMap => "a mapping of Kubernetes label keys to values".into(),
            Ty::TolerationList => "a list of tolerations such as gpu=true:NoSchedule".into(),
            Ty::KubeNamespace => {
                "a namespace name (lowercase letters, digits and -, at most 63)".into()
            }
            Ty::OptKubeName => "a Kubernetes object name (lowercase, DNS-1123) or null".into(),
        }
    }
}

/// One known key.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    pub path: &'static str,
    pub ty: Ty,
    pub default: Default,
    /// Hermes Agent takes any value here and falls back to its default (or
    /// skips what it cannot read): a value of the wrong type is a warning,
    /// and the default stands in for it.
    pub lenient: bool,
}

/// A default value, kept const-friendly.
#[derive(Debug, Clone, Copy)]
pub enum Default {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
    EmptyList,
    EmptyMap,
}

impl Default {
    pub fn to_value(self) -> Value {
        match self {
            Default::Null => Value::Null,
            Default::Bool(b) => Value::Bool(b),
            Default::Int(i) => Value::Int(i),
            Default::Float(f) => Value::Float(f),
            Default::Str(s) => Value::Str(s.to_string()),
            Default::EmptyList => Value::Seq(Vec::new()),
            Default::EmptyMap => Value::Map(Vec::new()),
        }
    }
}

pub const BACKENDS: &[&str] = &[
    "local",
    "docker",
    "ssh",
    "modal",
    "daytona",
    "vercel_sandbox",
    "singularity",
    "kubernetes",
];
pub const VERCEL_RUNTIMES: &[&str] = &["node24", "node22", "python3.13"];
pub const CREDENTIAL_SOURCES: &[&str] = &["env", "bitwarden"];

/// The image the reference uses.
pub const DEFAULT_DOCKER_IMAGE: &str = "nikolaik/python-nodejs:python3.11-nodejs20";

const fn key(path: &'static str, ty: Ty, default: Default) -> KeySpec {
    KeySpec {
        path,
        ty,
        default,
        lenient: false,
    }
}

/// A key Hermes Agent reads leniently ([`KeySpec::lenient`]).
const fn lenient(path: &'static str, ty: Ty, default: Default) -> KeySpec {
    KeySpec {
        path,
        ty,
        default,
        lenient: true,
    }
}

/// Hermes Agent's `terminal.modal_mode`.
pub const MODAL_MODES: &[&str] = &["auto", "direct", "managed"];
/// Hermes Agent's `terminal.home_mode`.
pub const HOME_MODES: &[&str] = &["auto", "real", "profile"];

/// The sections of config.yaml.
pub const SECTIONS: &[&str] = &["terminal", "proxy", "reconcile", "security"];

/// Every known key, in the order `config show` prints them.
pub const KEYS: &[KeySpec] = &[
    key(
        "terminal.backend",
        Ty::Enum(BACKENDS),
        Default::Str("local"),
    ),
    // Hermes Agent's own (its Modal tool gateway); hermes reaches Modal
    // with the direct credentials only.
    lenient(
        "terminal.modal_mode",
        Ty::Enum(MODAL_MODES),
        Default::Str("auto"),
    ),
    key("terminal.cwd", Ty::NonEmptyStr, Default::Str(".")),
    key("terminal.timeout", Ty::PosInt, Default::Int(180)),
    // Hermes Agent's own, for the processes it starts on its host.
    lenient(
        "terminal.daemon_term_grace_seconds",
        Ty::Number,
        Default::Float(2.0),
    ),
    // Names whose host values go into Docker sandboxes as
    // `docker_forward_env`'s do, but never one of Hermes Agent's provider
    // credentials.
    lenient(
        "terminal.env_passthrough",
        Ty::EnvNameList,
        Default::EmptyList,
    ),
    // Hermes Agent's own: the HOME of the processes it starts on its host,
    // the files its shell snapshot sources.
    lenient(
        "terminal.home_mode",
        Ty::Enum(HOME_MODES),
        Default::Str("auto"),
    ),
    lenient("terminal.shell_init_files", Ty::StrList, Default::EmptyList),
    lenient("terminal.auto_source_bashrc", Ty::Bool, Default::Bool(true)),
    key("terminal.lifetime_seconds", Ty::PosInt, Default::Int(300)),
    key(
        "terminal.docker_image",
        Ty::NonEmptyStr,
        Default::Str(DEFAULT_DOCKER_IMAGE),
    ),
    key("terminal.container_cpu", Ty::LimitNumber, Default::Int(1)),
    key(
        "terminal.container_memory",
        Ty::LimitInt,
        Default::Int(5120),
    ),
    key("terminal.container_disk", Ty::LimitInt, Default::Int(51200)),
    // Where the sandboxes keep their data: `$TERMINAL_SANDBOX_DIR`, else
    // `<home>/sandboxes`, as Hermes Agent has it.
    key("terminal.sandbox_dir", Ty::OptStr, Default::Null),
    key(
        "terminal.container_persistent",
        Ty::Bool,
        Default::Bool(true),
    ),
    key(
        "terminal.docker_persist_across_processes",
        Ty::Bool,
        Default::Bool(true),
    ),
    key(
        "terminal.docker_orphan_reaper",
        Ty::Bool,
        Default::Bool(true),
    ),
    key(
        "terminal.docker_volumes",
        Ty::VolumeList,
        Default::EmptyList,
    ),
    key("terminal.docker_env", Ty::EnvMap, Default::EmptyMap),
    key(
        "terminal.docker_forward_env",
        Ty::EnvNameList,
        Default::EmptyList,
    ),
    key(
        "terminal.docker_extra_args",
        Ty::StrList,
        Default::EmptyList,
    ),
    // The OCI runtime of Docker sandboxes: runc, runsc (gVisor), or any
    // runtime the engine lists.
    key(
        "terminal.docker_runtime",
        Ty::NonEmptyStr,
        Default::Str("runc"),
    ),
    // Session sandboxes kept made, started and answering, unclaimed, so a
    // new session's first command claims one instead of making its own
    // (Docker; at most MAX_WARM_POOL).
    key("terminal.warm_pool", Ty::LimitInt, Default::Int(0)),
    // What becomes of a persistent Docker sandbox idle longer than its
    // limit: `remove` (its files kept, the container made again on the
    // next command) or `stop` (the container stopped, started again on the
    // next command).
    key(
        "terminal.idle_action",
        Ty::Enum(&["remove", "stop"]),
        Default::Str("remove"),
    ),
    // The `local` backend's sandbox: `none` (the command is the user's, as
    // Hermes Agent runs it) or `bwrap` (bubblewrap: the host read-only,
    // the working directory and /tmp writable, secrets invisible, no
    // network but the egress proxy).
    key(
        "terminal.local_sandbox",
        Ty::Enum(&["none", "bwrap"]),
        Default::Str("none"),
    ),
    // Absolute paths a bwrap sandbox may also write (the host's root is
    // read-only there), checked like a volume's source.
    key(
        "terminal.local_sandbox_writable",
        Ty::StrList,
        Default::EmptyList,
    ),
    // Absolute paths hidden from a bwrap sandbox besides the built-in
    // secret paths (the hermes home, ~/.ssh, cloud credentials, …).
    key(
        "terminal.local_sandbox_hidden",
        Ty::StrList,
        Default::EmptyList,
    ),
    // Hermes Agent binds its host working directory to /workspace; a
    // sandbox hermes keeps has none (see `config::agent`).
    key(
        "terminal.docker_mount_cwd_to_workspace",
        Ty::Bool,
        Default::Bool(false),
    ),
    key("terminal.docker_network", Ty::Bool, Default::Bool(true)),
    key(
        "terminal.docker_run_as_host_user",
        Ty::Bool,
        Default::Bool(false),
    ),
    // Hermes Agent's own: its long-lived shell between commands.
    lenient("terminal.persistent_shell", Ty::Bool, Default::Bool(true)),
    key("terminal.docker_shm_size", Ty::Size, Default::Str("1g")),
    key(
        "terminal.persistent_max_idle_seconds",
        Ty::OptPosInt,
        Default::Null,
    ),
    key("terminal.singularity_image", Ty::OptStr, Default::Null),
    key("terminal.modal_image", Ty::OptStr, Default::Null),
    key(
        "terminal.modal_forward_env",
        Ty::EnvNameList,
        Default::EmptyList,
    ),
    key("terminal.daytona_image", Ty::OptStr, Default::Null),
    key(
        "terminal.daytona_forward_env",
        Ty::EnvNameList,
        Default::EmptyList,
    ),
    // The kubernetes backend (hermes's own: Hermes Agent has none).
    // A kubeconfig file; null: $KUBECONFIG, else ~/.kube/config.
    key("terminal.kubernetes_kubeconfig", Ty::OptStr, Default::Null),
    key("terminal.kubernetes_context", Ty::OptStr, Default::Null),
    key(
        "terminal.kubernetes_in_cluster",
        Ty::Bool,
        Default::Bool(false),
    ),
    key(
        "terminal.kubernetes_namespace",
        Ty::KubeNamespace,
        Default::Str("hermes"),
    ),
    // Null: terminal.docker_image.
    key("terminal.kubernetes_image", Ty::OptStr, Default::Null),
    // Null: the egress proxy (proxy.enabled) cannot run in the cluster.
    key("terminal.kubernetes_proxy_image", Ty::OptStr, Default::Null),
    key("terminal.kubernetes_cpu", Ty::LimitNumber, Default::Int(1)),
    key(
        "terminal.kubernetes_memory",
        Ty::LimitInt,
        Default::Int(5120),
    ),
    key(
        "terminal.kubernetes_disk",
        Ty::LimitInt,
        Default::Int(51200),
    ),
    key(
        "terminal.kubernetes_storage_class",
        Ty::OptKubeName,
        Default::Null,
    ),
    key(
        "terminal.kubernetes_runtime_class",
        Ty::OptKubeName,
        Default::Null,
    ),
    key(
        "terminal.kubernetes_service_account",
        Ty::OptKubeName,
        Default::Null,
    ),
    key(
        "terminal.kubernetes_node_selector",
        Ty::LabelMap,
        Default::EmptyMap,
    ),
    key(
        "terminal.kubernetes_tolerations",
        Ty::TolerationList,
        Default::EmptyList,
    ),
    key(
        "terminal.kubernetes_labels",
        Ty::LabelMap,
        Default::EmptyMap,
    ),
    key("terminal.ssh_host", Ty::OptStr, Default::Null),
    key("terminal.ssh_user", Ty::OptStr, Default::Null),
    key("terminal.ssh_port", Ty::Port, Default::Int(22)),
    key("terminal.ssh_key", Ty::OptStr, Default::Null),
    key(
        "terminal.ssh_persist_seconds",
        Ty::PosInt,
        Default::Int(300),
    ),
    key(
        "terminal.vercel_runtime",
        Ty::Enum(VERCEL_RUNTIMES),
        Default::Str("node24"),
    ),
    key(
        "terminal.vercel_forward_env",
        Ty::EnvNameList,
        Default::EmptyList,
    ),
    key("proxy.enabled", Ty::Bool, Default::Bool(false)),
    key("proxy.tunnel_port", Ty::Port, Default::Int(9090)),
    key(
        "proxy.credential_source",
        Ty::Enum(CREDENTIAL_SOURCES),
        Default::Str("env"),
    ),
    key("proxy.bitwarden_project_id", Ty::OptStr, Default::Null),
    key("proxy.enforce_on_docker", Ty::Bool, Default::Bool(true)),
    key("proxy.upstream_deny_cidrs", Ty::OptCidrList, Default::Null),
    key(
        "proxy.extra_allowed_hosts",
        Ty::HostPatternList,
        Default::EmptyList,
    ),
    key(
        "proxy.google_oauth_hosts",
        Ty::HostPatternList,
        Default::Null,
    ),
    key("proxy.enforce_on_ssh", Ty::Bool, Default::Bool(true)),
    key("proxy.enforce_network", Ty::Bool, Default::Bool(false)),
    key("proxy.listen", Ty::OptIpList, Default::Null),
    key("proxy.resolve", Ty::ResolveMap, Default::EmptyMap),
    key("proxy.upstream_ca_file", Ty::OptStr, Default::Null),
    key(
        "proxy.upstream_header_timeout_seconds",
        Ty::PosInt,
        Default::Int(300),
    ),
    key(
        "proxy.aws_region",
        Ty::NonEmptyStr,
        Default::Str("us-east-1"),
    ),
    // Empty: the Bedrock runtime endpoint of `proxy.aws_region`.
    key("proxy.aws_hosts", Ty::HostPatternList, Default::EmptyList),
    key("reconcile.prune", Ty::Bool, Default::Bool(false)),
    key("reconcile.resync_seconds", Ty::PosInt, Default::Int(30)),
    key("security.redact_secrets", Ty::Bool, Default::Bool(true)),
];

/// The spec of a known key, checked when the crate compiles:
/// `schema_key!("terminal.backend")` is a `&'static KeySpec`, and a path
/// that is not in [`KEYS`] does not compile. Code that reads a key by its
/// path names it this way, so a misspelt path cannot fall back to a
/// default unnoticed.
///
/// ```
/// let spec = hermes_model::schema_key!("terminal.container_memory");
/// assert_eq!(spec.path, "terminal.container_memory");
/// ```
///
/// ```compile_fail
/// let spec = hermes_model::schema_key!("terminal.container_memroy");
/// ```
#[macro_export]
macro_rules! schema_key {
    ($path:literal) => {{
        const SPEC: &$crate::schema::KeySpec = match $crate::schema::position($path) {
            Some(i) => &$crate::schema::KEYS[i],
            None => panic!(concat!(
                "unknown config key `",
                $path,
                "`: not in schema::KEYS"
            )),
        };
        SPEC
    }};
}

/// The index in [`KEYS`] of the key at `path`, usable in constants (see
/// [`schema_key!`](crate::schema_key)).
pub const fn position(path: &str) -> Option<usize> {
    let mut i = 0;
    while i < KEYS.len() {
        if const_eq(KEYS[i].path, path) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// `a == b`, for constants.
const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The spec of a dotted key, if we know it.
pub fn lookup(path: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.path == path)
}

/// The map-typed key (`terminal.docker_env`, `proxy.resolve`,
/// `terminal.kubernetes_labels`) of which
/// `keys` names one entry, as `proxy.resolve."api.openai.com"` does.
pub fn map_entry_of<S: AsRef<str>>(keys: &[S]) -> Option<&'static KeySpec> {
    let [section, key, _entry] = keys else {
        return None;
    };
    let spec = lookup(&format!("{}.{}", section.as_ref(), key.as_ref()))?;
    matches!(spec.ty, Ty::EnvMap | Ty::ResolveMap | Ty::LabelMap).then_some(spec)
}

/// The whole default config as a value tree.
pub fn defaults() -> Value {
    let mut root: Vec<(String, Value)> = SECTIONS
        .iter()
        .map(|s| (s.to_string(), Value::Map(Vec::new())))
        .collect();
    for spec in KEYS {
        let (section, leaf) = split(spec.path);
        if let Some((_, Value::Map(entries))) = root.iter_mut().find(|(name, _)| name == section) {
            entries.push((leaf.to_string(), spec.default.to_value()));
        }
    }
    Value::Map(root)
}

/// Splits `terminal.backend` into `("terminal", "backend")`.
pub fn split(path: &str) -> (&str, &str) {
    path.split_once('.').unwrap_or((path, ""))
}

/// The closest known name to `unknown` among `candidates`, if close enough
/// to be a likely typo.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(unknown, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// The known leaf names of one section.
pub fn leaves_of(section: &str) -> impl Iterator<Item = &'static str> + '_ {
    KEYS.iter().filter_map(move |k| {
        let (s, leaf) = split(k.path);
        (s == section).then_some(leaf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_lives_in_a_known_section() {
        for spec in KEYS {
            let (section, leaf) = split(spec.path);
            assert!(SECTIONS.contains(&section), "{}", spec.path);
            assert!(!leaf.is_empty(), "{}", spec.path);
        }
    }

    #[test]
    fn defaults_match_the_reference() {
        let d = defaults();
        assert_eq!(
            d.get_path("terminal.backend"),
            Some(&Value::Str("local".into()))
        );
        assert_eq!(d.get_path("terminal.timeout"), Some(&Value::Int(180)));
        assert_eq!(
            d.get_path("terminal.container_memory"),
            Some(&Value::Int(5120))
        );
        assert_eq!(d.get_path("proxy.tunnel_port"), Some(&Value::Int(9090)));
        assert_eq!(d.get_path("proxy.upstream_deny_cidrs"), Some(&Value::Null));
        assert_eq!(
            d.get_path("security.redact_secrets"),
            Some(&Value::Bool(true))
        );
    }

    #[test]
    fn entries_of_map_keys_are_known() {
        let keys = ["proxy", "resolve", "api.openai.com"];
        assert_eq!(map_entry_of(&keys).map(|k| k.path), Some("proxy.resolve"));
        assert_eq!(
            map_entry_of(&["terminal", "docker_env", "A"]).map(|k| k.path),
            Some("terminal.docker_env")
        );
        assert!(map_entry_of(&["terminal", "backend", "x"]).is_none());
        assert!(map_entry_of(&["proxy", "resolve"]).is_none());
    }

    #[test]
    fn positions_agree_with_lookup() {
        for (i, spec) in KEYS.iter().enumerate() {
            assert_eq!(position(spec.path), Some(i), "{}", spec.path);
        }
        assert_eq!(position("terminal.backnd"), None);
        assert_eq!(position("terminal"), None);
        assert_eq!(position(""), None);
        assert_eq!(schema_key!("proxy.tunnel_port").path, "proxy.tunnel_port");
    }

    #[test]
    fn typos_find_their_key() {
        assert_eq!(
            did_you_mean("backnd", leaves_of("terminal")),
            Some("backend")
        );
        assert_eq!(
            did_you_mean("docker_imgae", leaves_of("terminal")),
            Some("docker_image")
        );
        assert_eq!(did_you_mean("zzzz", leaves_of("terminal")), None);
    }
}
