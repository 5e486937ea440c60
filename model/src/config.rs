//! Loading config text into a validated, typed [`Config`].
//!
//! [`load`] is a pure function of the text: it parses with limits
//! ([`crate::yaml`]), checks every key against [`crate::schema`], reports
//! *all* problems at once, each with its key path, line and column, and
//! merges the file over the defaults. Unknown keys are warnings with a
//! "did you mean"; everything else wrong is an error.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use crate::schema::{self, KeySpec, Ty};
use crate::value::Value;
use crate::yaml::{self, Node, NodeKind, Pos};

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// The dotted key path, with `[i]` for list items (`terminal.docker_volumes[1]`).
    /// Empty for a problem with the document itself. For a value from a
    /// `TERMINAL_*` variable ([`env`]), the variable's name in its place
    /// (`TERMINAL_DOCKER_VOLUMES[1]`), with no position.
    pub path: String,
    pub pos: Option<Pos>,
    pub message: String,
}

impl Issue {
    fn new(path: impl Into<String>, pos: Pos, message: impl Into<String>) -> Issue {
        Issue {
            path: path.into(),
            pos: Some(pos),
            message: message.into(),
        }
    }

    /// `FILE:LINE:COL: PATH: MESSAGE`, the form compilers use; a value
    /// from the environment is `VARIABLE: MESSAGE`, of no file.
    pub fn render(&self, file: &str) -> String {
        if self.pos.is_none() && env::is_variable_path(&self.path) {
            return format!("{}: {}", self.path, self.message);
        }
        let place = match self.pos {
            Some(p) => format!("{file}:{}:{}", p.line, p.col),
            None => file.to_string(),
        };
        if self.path.is_empty() {
            format!("{place}: {}", self.message)
        } else {
            format!("{place}: {}: {}", self.path, self.message)
        }
    }
}

impl Issue {
    /// `PATH: MESSAGE (line N)`: the issue where the file is known, as a
    /// plan's cause says it.
    pub fn brief(&self) -> String {
        match self.pos {
            Some(p) => format!(
                "{}: {} (config.yaml line {})",
                self.path, self.message, p.line
            ),
            None => format!("{}: {}", self.path, self.message),
        }
    }
}

impl From<yaml::YamlError> for Issue {
    fn from(e: yaml::YamlError) -> Issue {
        Issue {
            path: String::new(),
            pos: e.pos,
            message: e.message,
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render("config.yaml"))
    }
}

/// Why a config text was refused: every error found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<Issue>);

impl ConfigError {
    pub fn render(&self, file: &str) -> String {
        self.0
            .iter()
            .map(|i| i.render(file))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A config read from text.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub config: Config,
    /// Unknown keys and other things worth a word, never fatal.
    pub warnings: Vec<Issue>,
    /// The file's own values, without defaults.
    pub user: Value,
    /// Defaults with the file laid over them.
    pub merged: Value,
    /// Whether the file had no document at all (empty or only comments).
    pub empty: bool,
    /// The keys whose value a `TERMINAL_*` variable set ([`env`]).
    pub overrides: Vec<EnvOverride>,
}

/// The typed, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub terminal: Terminal,
    pub proxy: Proxy,
    pub reconcile: Reconcile,
    pub security: Security,
    /// Errors of `terminal.docker_extra_args` (a flag hermes cannot map
    /// onto the create call, one that would defeat the sandbox's
    /// isolation): they concern the Docker sandboxes alone, so the config
    /// loads, its Docker sandboxes are blocked with these as the reason,
    /// and the rest of the host converges. `config check` reports them as
    /// errors.
    pub sandbox_errors: Vec<Issue>,
}

/// The most session sandboxes `terminal.warm_pool` keeps ready.
pub const MAX_WARM_POOL: u64 = 64;

/// `terminal.idle_action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleAction {
    /// The container is removed (a persistent sandbox's files are kept).
    #[default]
    Remove,
    /// The container is stopped, and started again by the next command.
    Stop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Terminal {
    pub backend: Backend,
    pub cwd: String,
    pub timeout_seconds: u64,
    pub lifetime_seconds: u64,
    pub docker_image: String,
    /// 0: no limit (no `--cpus`), as Hermes Agent has it.
    pub container_cpu: f64,
    /// 0: no limit (no `--memory`).
    pub container_memory_mb: u64,
    /// 0: no limit (no data image).
    pub container_disk_mb: u64,
    /// `terminal.sandbox_dir`: where the sandboxes keep their data (over
    /// `$TERMINAL_SANDBOX_DIR`; else `<home>/sandboxes`).
    pub sandbox_dir: Option<String>,
    pub container_persistent: bool,
    pub docker_persist_across_processes: bool,
    pub docker_orphan_reaper: bool,
    pub docker_volumes: Vec<Volume>,
    /// Fixed environment values, in file order.
    pub docker_env: Vec<(String, String)>,
    pub docker_forward_env: Vec<String>,
    pub docker_extra_args: Vec<String>,
    /// `docker_runtime`: the sandboxes' OCI runtime (`runc`: the engine's
    /// own default, as before the key).
    pub docker_runtime: String,
    /// `warm_pool`: how many unclaimed session sandboxes are kept ready
    /// (at most [`MAX_WARM_POOL`]).
    pub warm_pool: u64,
    /// `idle_action`: an idle persistent sandbox is removed, or stopped.
    pub idle_action: IdleAction,
    /// `local_sandbox`: `none`, or `bwrap` ([`crate::local_sandbox`]).
    pub local_sandbox: String,
    /// `local_sandbox_writable`: extra paths a bwrap sandbox may write.
    pub local_sandbox_writable: Vec<String>,
    /// `local_sandbox_hidden`: extra paths hidden from a bwrap sandbox.
    pub local_sandbox_hidden: Vec<String>,
    /// Names whose values (host environment, then `.env`) every command in
    /// a Docker sandbox gets, as `docker_forward_env`'s, less Hermes
    /// Agent's provider credentials ([`agent::is_passthrough_blocked`]).
    pub env_passthrough: Vec<String>,
    /// Run the Docker sandbox as the host user's uid:gid.
    pub docker_run_as_host_user: bool,
    /// Hermes Agent binds its host working directory to `/workspace`;
    /// hermes does not (a warning says why, [`agent`]).
    pub docker_mount_cwd_to_workspace: bool,
    pub docker_network: bool,
    pub docker_shm_size_bytes: u64,
    /// `None`: persistent sandboxes are never reaped for idleness.
    pub persistent_max_idle_seconds: Option<u64>,
    /// The image a singularity instance is built from: `docker://` and
    /// `docker_image` unless set.
    pub singularity_image: String,
    /// Modal's image: `docker_image` unless set.
    pub modal_image: String,
    /// Names whose values (host environment, then `.env`) go into the
    /// Modal sandbox; nothing else does.
    pub modal_forward_env: Vec<String>,
    /// Daytona's image: `docker_image` unless set.
    pub daytona_image: String,
    pub daytona_forward_env: Vec<String>,
    pub ssh_host: Option<String>,
    pub ssh_user: Option<String>,
    pub ssh_port: u16,
    pub ssh_key: Option<String>,
    /// How long the SSH connection holder stays with nothing to do.
    pub ssh_persist_seconds: u64,
    pub vercel_runtime: String,
    pub vercel_forward_env: Vec<String>,
    /// The `kubernetes_*` keys.
    pub kubernetes: crate::kubernetes::KubeSettings,
    /// Hermes Agent's own settings of the section, carried as read: they
    /// shape nothing hermes makes.
    pub agent: AgentTerminal,
}

/// The `terminal` keys that are Hermes Agent's own: how it runs its shell
/// and the processes on its host. Read (with the agent's defaults) so that
/// a config the agent accepts is accepted here; no sandbox depends on them.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTerminal {
    /// `auto`, `direct` or `managed` (the agent's Modal tool gateway).
    pub modal_mode: String,
    /// `auto`, `real` or `profile`.
    pub home_mode: String,
    pub shell_init_files: Vec<String>,
    pub auto_source_bashrc: bool,
    pub persistent_shell: bool,
    pub daemon_term_grace_seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    Local,
    Docker,
    Ssh,
    Modal,
    Daytona,
    VercelSandbox,
    Singularity,
    Kubernetes,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Docker => "docker",
            Backend::Ssh => "ssh",
            Backend::Modal => "modal",
            Backend::Daytona => "daytona",
            Backend::VercelSandbox => "vercel_sandbox",
            Backend::Singularity => "singularity",
            Backend::Kubernetes => "kubernetes",
        }
    }

    fn from_word(word: &str) -> Option<Backend> {
        Some(match word {
            "local" => Backend::Local,
            "docker" => Backend::Docker,
            "ssh" => Backend::Ssh,
            "modal" => Backend::Modal,
            "daytona" => Backend::Daytona,
            "vercel_sandbox" => Backend::VercelSandbox,
            "singularity" => Backend::Singularity,
            "kubernetes" => Backend::Kubernetes,
            _ => return None,
        })
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `host:container[:options]` mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub host: String,
    pub container: String,
    pub options: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Proxy {
    pub enabled: bool,
    pub tunnel_port: u16,
    pub credential_source: String,
    /// With `credential_source: bitwarden`: the Secrets Manager project
    /// whose secrets are listed (`None`: every secret the machine account
    /// reads).
    pub bitwarden_project_id: Option<String>,
    pub enforce_on_docker: bool,
    /// `None`: the built-in deny list.
    pub upstream_deny_cidrs: Option<Vec<IpNet>>,
    pub extra_allowed_hosts: Vec<String>,
    /// The hosts that get access tokens minted from the host's Google
    /// service account (`null`: [`crate::providers::GOOGLE_OAUTH_HOSTS`]).
    pub google_oauth_hosts: Vec<String>,
    pub enforce_on_ssh: bool,
    /// Sandboxes join an internal network whose only service is the proxy.
    pub enforce_network: bool,
    /// `None`: the Docker bridge gateway when there is one, and 127.0.0.1.
    pub listen: Option<Vec<IpAddr>>,
    /// Host name (lowercase) → address, used instead of DNS.
    pub resolve: Vec<(String, IpAddr)>,
    pub upstream_ca_file: Option<String>,
    pub upstream_header_timeout_seconds: u64,
    /// The region the sandboxes' AWS SDKs are told (`AWS_REGION`).
    pub aws_region: String,
    /// The AWS endpoints whose SigV4 requests the proxy signs again with
    /// the real credentials (lowercase): `proxy.aws_hosts`, or the Bedrock
    /// runtime endpoint of `aws_region` when that is empty.
    pub aws_hosts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reconcile {
    /// Remove sandboxes that are no longer desired.
    pub prune: bool,
    pub resync_seconds: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Security {
    pub redact_secrets: bool,
}

impl std::default::Default for Config {
    fn default() -> Self {
        // The defaults are a valid config: a unit test holds this.
        match load("") {
            Ok(loaded) => loaded.config,
            Err(e) => unreachable!("the built-in defaults are invalid: {e}"),
        }
    }
}

/// Loads config text: parses, validates and merges over the defaults.
/// Without the home directory, a volume of it is not recognised: callers
/// that know it use [`load_for`].
pub fn load(text: &str) -> Result<Loaded, ConfigError> {
    load_for(text, &[])
}

/// [`load`], knowing the hermes home (each spelling of it: as given, and
/// with symlinks resolved), so that a volume that would put it into a
/// sandbox is refused (or warned about without the proxy).
pub fn load_for(text: &str, home: &[&Path]) -> Result<Loaded, ConfigError> {
    load_with(text, home, &BTreeMap::new())
}

/// [`load_for`], with the `TERMINAL_*` variables of `env` laid over the
/// file as Hermes Agent lays them ([`env`]; `env` may hold any variables,
/// only those are read).
pub fn load_with(
    text: &str,
    home: &[&Path],
    env: &BTreeMap<String, String>,
) -> Result<Loaded, ConfigError> {
    let root = yaml::parse(text).map_err(|e| ConfigError(vec![e.into()]))?;
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let empty = root.is_none();
    let (mut root, overrides) = env::apply(root, env, &mut errors, &mut warnings);
    if let Some(root) = &mut root {
        agent::normalize(root, &mut warnings);
        validate(root, &mut errors, &mut warnings);
        isolation::check(root, home, &mut errors, &mut warnings);
        agent::check(root, &mut warnings);
    }
    name_variables(&mut errors, &overrides);
    name_variables(&mut warnings, &overrides);
    let (mut sandbox_errors, others): (Vec<Issue>, Vec<Issue>) =
        errors.into_iter().partition(|i| is_sandbox_issue(&i.path));
    sandbox_errors.sort_by_key(|i| i.pos);
    if !others.is_empty() {
        let mut errors = others;
        errors.extend(sandbox_errors);
        errors.sort_by_key(|i| i.pos);
        return Err(ConfigError(errors));
    }
    let user = root.as_ref().map_or(Value::Map(Vec::new()), Node::to_value);
    let mut merged = schema::defaults();
    merged.merge(&user);
    let mut config = Config::from_merged(&merged);
    config.sandbox_errors = sandbox_errors;
    if let Some(root) = &root {
        resolve::check(root, &config, &mut warnings);
    }
    Ok(Loaded {
        config,
        warnings,
        user,
        merged,
        empty,
        overrides,
    })
}

/// The tree of config text as hermes reads it, without checking it: the
/// `TERMINAL_*` variables of `env` laid over it ([`env`]) and its values
/// read as Hermes Agent reads them ([`agent`]); with the keys the
/// variables set. For `config get` and `config show`, which work on a
/// file whose values are wrong.
pub fn effective_tree(
    root: Option<Node>,
    env: &BTreeMap<String, String>,
) -> (Option<Node>, Vec<EnvOverride>) {
    let (mut root, overrides) = env::apply(root, env, &mut Vec::new(), &mut Vec::new());
    if let Some(root) = &mut root {
        agent::normalize(root, &mut Vec::new());
    }
    (root, overrides)
}

/// Whether an error concerns only the Docker sandboxes' create call (a
/// [`Config::sandbox_errors`] one): `terminal.docker_extra_args`, from the
/// file or from its variable.
fn is_sandbox_issue(path: &str) -> bool {
    let under = |key: &str| {
        path.strip_prefix(key)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('['))
    };
    under(crate::schema_key!("terminal.docker_extra_args").path)
        || env::variable_of("docker_extra_args").is_some_and(under)
        || path == crate::schema_key!("terminal.docker_runtime").path
}

/// Names the variable, instead of a place in the file, in each issue of a
/// value that came from the environment (at [`agent::ENV_POS`]).
fn name_variables(issues: &mut [Issue], overrides: &[EnvOverride]) {
    for issue in issues {
        if issue.pos != Some(agent::ENV_POS) {
            continue;
        }
        issue.pos = None;
        let set = overrides.iter().find(|o| {
            issue
                .path
                .strip_prefix(o.path.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['[', '.']))
        });
        if let Some(o) = set {
            issue.path = format!("{}{}", o.var, &issue.path[o.path.len()..]);
        }
    }
}

/// Checks a parsed document against the schema.
pub fn validate(root: &Node, errors: &mut Vec<Issue>, warnings: &mut Vec<Issue>) {
    let Some(sections) = root.entries() else {
        errors.push(Issue::new(
            "",
            root.start,
            format!(
                "the config must be a mapping of sections (terminal:, proxy:, security:), found {}",
                root.kind_name()
            ),
        ));
        return;
    };
    for section in sections {
        if !schema::SECTIONS.contains(&section.key.as_str()) {
            // Hermes Agent's own sections are its business.
            if !agent::AGENT_SECTIONS.contains(&section.key.as_str()) {
                warnings.push(unknown_key(
                    &section.key,
                    section.key_pos,
                    schema::SECTIONS
                        .iter()
                        .chain(agent::AGENT_SECTIONS)
                        .copied(),
                ));
            }
            continue;
        }
        let entries = match &section.value.kind {
            NodeKind::Map { entries, .. } => entries.as_slice(),
            NodeKind::Scalar(s) if s.resolve() == Value::Null => &[],
            _ => {
                errors.push(Issue::new(
                    section.key.as_str(),
                    section.value.start,
                    format!(
                        "expected a mapping of keys, found {}",
                        section.value.kind_name()
                    ),
                ));
                continue;
            }
        };
        for entry in entries {
            let path = format!("{}.{}", section.key, entry.key);
            match schema::lookup(&path) {
                // Checked as the agent reads it ([`agent::normalize`]).
                Some(spec) if spec.lenient => {}
                Some(spec) => check(spec, &path, &entry.value, errors),
                None if agent::is_agent_key(&section.key, &entry.key) => {}
                None => warnings.push(unknown_key(
                    &path,
                    entry.key_pos,
                    schema::leaves_of(&section.key),
                )),
            }
        }
    }
    skipped_volumes(root, warnings);
    check_extra_args(root, errors);
    check_egress_overrides(root, errors);
    warnings.extend(crate::cloud::daytona_disk_warning(root));
    check_aws_hosts(root, errors, warnings);
}

/// What `proxy.aws_hosts` says of the real AWS credentials. An entry
/// naming a credential service (`sts.amazonaws.com`, a pattern whose fixed
/// part names one, [`crate::providers::AWS_CREDENTIAL_SERVICES`]) is an
/// error: the proxy never signs for it, and a sandbox that could have it
/// signed would get credentials that work without the proxy. A pattern
/// that spans a whole AWS partition (`*.amazonaws.com`) is a warning: the
/// real credentials would sign for every service and region, not only the
/// API the agent needs. A pattern that covers the credential services'
/// hosts (`*.amazonaws.com`, `*.us-east-1.amazonaws.com`) is accepted only
/// because the proxy refuses those services at request time, which the
/// warning says.
fn check_aws_hosts(root: &Node, errors: &mut Vec<Issue>, warnings: &mut Vec<Issue>) {
    let Some(hosts) = root
        .get("proxy")
        .and_then(|p| p.value.get("aws_hosts"))
        .map(|h| &h.value)
    else {
        return;
    };
    let NodeKind::Seq { items, .. } = &hosts.kind else {
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let NodeKind::Scalar(s) = &item.kind else {
            continue;
        };
        let text = s.text.trim().to_ascii_lowercase();
        let path = format!("proxy.aws_hosts[{i}]");
        // The whole labels the entry fixes: `*.D` fixes D; `*-R.D` fixes
        // D (R is the tail of a label).
        let (wildcard, fixed) = if let Some(rest) = text.strip_prefix("*.") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("*-") {
            (true, rest.split_once('.').map_or("", |(_, domain)| domain))
        } else {
            (false, text.as_str())
        };
        if let Some(service) = crate::providers::aws_credential_service_of_host(fixed) {
            let what = if wildcard {
                "covers only hosts of"
            } else {
                "is a host of"
            };
            errors.push(Issue::new(
                path,
                item.start,
                format!(
                    "`{}` {what} {}: the proxy never signs requests to it with the real AWS credentials (a sandbox would get credentials that work without the proxy); remove it",
                    s.text, service.what
                ),
            ));
            continue;
        }
        if !wildcard {
            continue;
        }
        let partition = text
            .strip_prefix("*.")
            .or_else(|| text.strip_prefix("*-"))
            .is_some_and(|domain| domain.split('.').next() == Some("amazonaws"));
        let mut message = String::new();
        if partition {
            // `amazonaws.com`, `amazonaws.com.cn`: a partition, not a
            // service (wider patterns are errors already).
            message = format!(
                "`{}` lets the real AWS credentials sign requests to every AWS service and region; name the service's hosts (e.g. bedrock-runtime.us-east-1.amazonaws.com)",
                s.text
            );
        }
        if covers_credential_hosts(fixed) {
            if message.is_empty() {
                message = format!("`{}` covers", s.text);
            } else {
                message.push_str("; it also covers");
            }
            let names: Vec<&str> = crate::providers::AWS_CREDENTIAL_SERVICES
                .iter()
                .filter_map(|c| c.host_labels.first().copied())
                .collect();
            message.push_str(&format!(
                " the hosts of AWS's credential services ({}), which is accepted only because the proxy refuses those services, and credential-minting actions such as GetSessionToken, AssumeRole and CreateAccessKey, at request time: they are never signed with the real credentials",
                names.join(", ")
            ));
        }
        if !message.is_empty() {
            warnings.push(Issue::new(path, item.start, message));
        }
    }
}

/// Whether `*.<fixed>` covers hosts where AWS's credential services live:
/// `<service>.<partition>` and `<service>.<region>.<partition>`, so a
/// partition's domain, or one label under it (a region).
fn covers_credential_hosts(fixed: &str) -> bool {
    crate::providers::AWS_DOMAINS.iter().any(|domain| {
        fixed == *domain
            || fixed
                .strip_suffix(domain)
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty() && !head.contains('.'))
    })
}

/// The variables through which a sandbox finds and trusts the egress
/// proxy: hermes sets them, and config may not.
pub const PROXY_VARIABLES: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "HERMES_EGRESS_PROXY",
];

/// The host name the sandbox reaches the proxy by.
pub const PROXY_HOST_NAME: &str = "host.docker.internal";

/// With the proxy enforced on Docker sandboxes ([`proxy_enforced`]),
/// config may not set the proxy variables or hand a provider key to the
/// sandbox: each such entry is an error naming its key. (Remapping the
/// proxy's host name is checked with the rest of `isolation`.)
fn check_egress_overrides(root: &Node, errors: &mut Vec<Issue>) {
    if !proxy_enforced(root) {
        return;
    }
    let Some(terminal) = root.get("terminal") else {
        return;
    };
    let why = |name: &str| -> Option<String> {
        if PROXY_VARIABLES.contains(&name) {
            Some(format!(
                "`{name}` is set by hermes while the egress proxy is enforced (proxy.enforce_on_docker)"
            ))
        } else if crate::providers::key_variables().any(|v| v == name) {
            Some(format!(
                "`{name}` would hand the sandbox a real key; behind the egress proxy it gets a proxy token in {name} instead"
            ))
        } else {
            None
        }
    };
    if let Some(env) = terminal.value.get("docker_env") {
        if let NodeKind::Map { entries, .. } = &env.value.kind {
            for entry in entries {
                if let Some(message) = why(&entry.key) {
                    errors.push(Issue::new(
                        format!("terminal.docker_env.{}", entry.key),
                        entry.key_pos,
                        message,
                    ));
                }
            }
        }
    }
    if let Some(list) = terminal.value.get("docker_forward_env") {
        if let NodeKind::Seq { items, .. } = &list.value.kind {
            for (i, item) in items.iter().enumerate() {
                if let Value::Str(name) = item.to_value() {
                    if let Some(message) = why(&name) {
                        errors.push(Issue::new(
                            format!("terminal.docker_forward_env[{i}]"),
                            item.start,
                            message,
                        ));
                    }
                }
            }
        }
    }
    for extra in isolation::extra_arg_options(&terminal.value) {
        let message = match extra.option.as_str() {
            "--env" => why(extra.value.split('=').next().unwrap_or_default()),
            // `--add-host` of the proxy's name: see `isolation`.
            _ => None,
        };
        if let Some(message) = message {
            // The error points at the item holding the value.
            errors.push(Issue::new(
                format!("terminal.docker_extra_args[{}]", extra.at),
                extra.pos,
                message,
            ));
        }
    }
}

fn unknown_key<'a>(path: &str, pos: Pos, known: impl IntoIterator<Item = &'a str>) -> Issue {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    let hint = schema::did_you_mean(leaf, known)
        .map(|k| format!("; did you mean `{k}`?"))
        .unwrap_or_default();
    Issue::new(path, pos, format!("unknown key, ignored{hint}"))
}

/// A `docker_volumes` entry without a colon: Hermes Agent skips it with a
/// warning, and so does hermes.
fn skipped_volumes(root: &Node, warnings: &mut Vec<Issue>) {
    let Some(NodeKind::Seq { items, .. }) = root
        .get("terminal")
        .and_then(|t| t.value.get("docker_volumes"))
        .map(|v| &v.value.kind)
    else {
        return;
    };
    for (i, item) in items.iter().enumerate() {
        if let Value::Str(text) = item.to_value()
            && !text.contains(':')
        {
            warnings.push(Issue::new(
                format!("terminal.docker_volumes[{i}]"),
                item.start,
                format!(
                    "`{text}` has no colon, so it is not host:container: skipped, as Hermes Agent skips it"
                ),
            ));
        }
    }
}

/// `warm_pool`: at most [`MAX_WARM_POOL`].
fn check_warm_pool(terminal: &crate::yaml::Entry, errors: &mut Vec<Issue>) {
    let Some(pool) = terminal.value.get("warm_pool") else {
        return;
    };
    if let Value::Int(n) = pool.value.to_value()
        && n > i64::try_from(MAX_WARM_POOL).unwrap_or(i64::MAX)
    {
        errors.push(Issue::new(
            crate::schema_key!("terminal.warm_pool").path,
            pool.value.start,
            format!("{n} sandboxes: at most {MAX_WARM_POOL} are kept ready"),
        ));
    }
}

/// `docker_runtime`: a runtime's name (what the engine's `Runtimes` keys
/// are), and not one that contradicts a `--runtime` of `docker_extra_args`.
fn check_runtime(terminal: &crate::yaml::Entry, errors: &mut Vec<Issue>) {
    let Some(runtime) = terminal.value.get("docker_runtime") else {
        return;
    };
    let Value::Str(name) = runtime.value.to_value() else {
        return; // the type check has reported it
    };
    let path = crate::schema_key!("terminal.docker_runtime").path;
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        errors.push(Issue::new(
            path,
            runtime.value.start,
            format!("`{name}` is not a runtime's name (letters, digits, `.`, `_`, `-`)"),
        ));
        return;
    }
    let extra: Vec<String> = match terminal
        .value
        .get("docker_extra_args")
        .map(|a| &a.value.kind)
    {
        Some(NodeKind::Seq { items, .. }) => items
            .iter()
            .filter_map(|i| match i.to_value() {
                Value::Str(s) => Some(s),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let (mapped, _) = crate::sandbox::map_extra_args(&extra);
    if let Some(other) = mapped
        .runtime
        .filter(|other| *other != name && name != "runc")
    {
        errors.push(Issue::new(
            path,
            runtime.value.start,
            format!(
                "is {name} but terminal.docker_extra_args names --runtime={other}: keep one of them"
            ),
        ));
    }
}

/// `local_sandbox_writable` and `local_sandbox_hidden`: absolute paths
/// without `.` or `..` parts; the host's root is never writable. (What
/// they may not reach on this host, the hermes home and the secret paths,
/// is checked when a sandbox is made: see `hermes_backends::local`.)
fn check_local_sandbox_paths(terminal: &crate::yaml::Entry, errors: &mut Vec<Issue>) {
    for key in [
        crate::schema_key!("terminal.local_sandbox_writable"),
        crate::schema_key!("terminal.local_sandbox_hidden"),
    ] {
        let name = key.path.rsplit('.').next().unwrap_or(key.path);
        let Some(entry) = terminal.value.get(name) else {
            continue;
        };
        let NodeKind::Seq { items, .. } = &entry.value.kind else {
            continue; // the type check has reported it
        };
        for (i, item) in items.iter().enumerate() {
            let Value::Str(path) = item.to_value() else {
                continue;
            };
            let parts_ok = std::path::Path::new(&path).components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
            let why = if !path.starts_with('/') {
                Some(format!("`{path}` is not an absolute path"))
            } else if !parts_ok || path.contains("//") {
                Some(format!(
                    "`{path}` has `.`, `..` or an empty part: name the directory itself"
                ))
            } else if path == "/" && key.path.ends_with("writable") {
                Some("`/` would make the whole host writable".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                errors.push(Issue::new(format!("{}[{i}]", key.path), item.start, why));
            }
        }
    }
}

/// `docker_extra_args`: every flag hermes cannot map onto the create call
/// ([`crate::sandbox::map_extra_args`]), and every one that contradicts
/// the rest of the config: a network other than `none` with
/// `docker_network: false` (which means no network at all), a network or
/// a name server of its own with the proxy-only network
/// (`proxy.enforce_network`), which hermes joins the sandbox to, with the
/// proxy as its name server.
fn check_extra_args(root: &Node, errors: &mut Vec<Issue>) {
    let Some(terminal) = root.get("terminal") else {
        return;
    };
    check_runtime(terminal, errors);
    check_local_sandbox_paths(terminal, errors);
    check_warm_pool(terminal, errors);
    let Some(args) = terminal.value.get("docker_extra_args") else {
        return;
    };
    let NodeKind::Seq { items, .. } = &args.value.kind else {
        return;
    };
    let strings: Option<Vec<String>> = items
        .iter()
        .map(|item| match item.to_value() {
            Value::Str(s) => Some(s),
            _ => None,
        })
        .collect();
    let Some(strings) = strings else {
        return; // the type check has reported the non-strings
    };
    let at = |index: usize, message: String| {
        Issue::new(
            format!("terminal.docker_extra_args[{index}]"),
            items.get(index).map_or(args.value.start, |item| item.start),
            message,
        )
    };
    let (_, refused) = crate::sandbox::map_extra_args(&strings);
    errors.extend(refused.into_iter().map(|e| at(e.index, e.message)));
    let network_off = terminal
        .value
        .get("docker_network")
        .filter(|n| n.value.to_value() == Value::Bool(false));
    let proxy = root.get("proxy").map(|p| &p.value);
    let flag = |key: &str| {
        proxy
            .and_then(|p| p.get(key))
            .is_some_and(|e| e.value.to_value() == Value::Bool(true))
    };
    let proxy_network = flag("enabled") && flag("enforce_network");
    let (options, _) = crate::sandbox::options(&strings);
    for option in options {
        let value = option.value.as_deref().unwrap_or_default();
        let is_network = matches!(
            option.option.as_str(),
            "--network" | "--network-alias" | "--ip" | "--ip6"
        );
        if let Some(network) = network_off
            && is_network
            && !(option.option == "--network" && value.trim() == "none")
        {
            let place = if network.key_pos == agent::ENV_POS {
                env::variable_of("docker_network").map_or(String::new(), |v| format!("from {v}"))
            } else {
                format!("line {}", network.key_pos.line)
            };
            errors.push(at(
                option.index,
                format!(
                    "`{}` contradicts terminal.docker_network: false ({place}), which means no network at all",
                    strings[option.index]
                ),
            ));
        }
        let own = match option.option.as_str() {
            // The host's or another container's: isolation's refusal.
            "--network"
                if !matches!(value.trim(), "none" | "host") && !value.starts_with("container:") =>
            {
                Some("a network")
            }
            "--dns" => Some("a name server"),
            _ => None,
        };
        if let Some(own) = own
            && proxy_network
        {
            errors.push(at(
                option.index,
                format!(
                    "`{}` gives the sandbox {own} of its own, while proxy.enforce_network puts it on the proxy-only network, with the egress proxy as its name server",
                    option.text()
                ),
            ));
        }
    }
}

/// Checks one key's value against its type.
fn check(spec: &KeySpec, path: &str, node: &Node, errors: &mut Vec<Issue>) {
    let value = node.to_value();
    let wrong = |errors: &mut Vec<Issue>| {
        errors.push(Issue::new(
            path,
            node.start,
            format!(
                "expected {}, found {}",
                spec.ty.expectation(),
                describe(node, &value)
            ),
        ));
    };
    match spec.ty {
        Ty::Bool => {
            if !matches!(value, Value::Bool(_)) {
                wrong(errors);
            }
        }
        Ty::Str => {
            if !matches!(value, Value::Str(_)) {
                wrong(errors);
            }
        }
        Ty::NonEmptyStr => match &value {
            Value::Str(s) if s.trim().is_empty() => wrong(errors),
            // It becomes part of a host name and of every signature.
            Value::Str(s)
                if path == crate::schema_key!("proxy.aws_region").path
                    && !s
                        .bytes()
                        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-')) =>
            {
                errors.push(Issue::new(
                    path,
                    node.start,
                    format!("`{s}` is not an AWS region name such as us-east-1"),
                ));
            }
            Value::Str(_) => {}
            _ => wrong(errors),
        },
        Ty::OptStr => {
            if !matches!(value, Value::Str(_) | Value::Null) {
                wrong(errors);
            }
        }
        Ty::Enum(words) => match &value {
            Value::Str(s) if words.contains(&s.as_str()) => {}
            Value::Str(s) => {
                let hint = schema::did_you_mean(s, words.iter().copied())
                    .map(|w| format!("; did you mean `{w}`?"))
                    .unwrap_or_default();
                errors.push(Issue::new(
                    path,
                    node.start,
                    format!(
                        "unknown value `{s}`: expected {}{hint}",
                        spec.ty.expectation()
                    ),
                ));
            }
            _ => wrong(errors),
        },
        Ty::PosInt | Ty::OptPosInt => match value {
            Value::Int(i) if i >= 1 => {}
            Value::Null if spec.ty == Ty::OptPosInt => {}
            Value::Int(i) => errors.push(Issue::new(
                path,
                node.start,
                format!("must be at least 1, found {i}"),
            )),
            _ => wrong(errors),
        },
        Ty::Port => match value {
            Value::Int(i) if (1..=65535).contains(&i) => {
                if path == crate::schema_key!("proxy.tunnel_port").path && i == 65535 {
                    errors.push(Issue::new(
                        path,
                        node.start,
                        "must be at most 65534: the plain HTTP port is the next one",
                    ));
                }
            }
            Value::Int(i) => errors.push(Issue::new(
                path,
                node.start,
                format!("port {i} is out of range 1 to 65535"),
            )),
            _ => wrong(errors),
        },
        Ty::PosNumber => match value {
            Value::Int(i) if i > 0 => {}
            Value::Float(f) if f > 0.0 && f.is_finite() => {}
            Value::Int(_) | Value::Float(_) => errors.push(Issue::new(
                path,
                node.start,
                format!("must be greater than 0, found {}", value.to_yaml_inline()),
            )),
            _ => wrong(errors),
        },
        Ty::LimitNumber => match value {
            Value::Int(i) if i >= 0 => {}
            Value::Float(f) if f >= 0.0 && f.is_finite() => {}
            Value::Int(_) | Value::Float(_) => errors.push(Issue::new(
                path,
                node.start,
                format!(
                    "must be at least 0 (0: no limit), found {}",
                    value.to_yaml_inline()
                ),
            )),
            _ => wrong(errors),
        },
        Ty::LimitInt => match value {
            Value::Int(i) if i >= 0 => {}
            Value::Int(i) => errors.push(Issue::new(
                path,
                node.start,
                format!("must be at least 0 (0: no limit), found {i}"),
            )),
            _ => wrong(errors),
        },
        Ty::Number => match value {
            Value::Int(_) => {}
            Value::Float(f) if f.is_finite() => {}
            _ => wrong(errors),
        },
        Ty::Size => match &value {
            Value::Int(i) if *i > 0 => {}
            Value::Str(s) if parse_size(s).is_some_and(|n| n > 0) => {}
            _ => wrong(errors),
        },
        Ty::StrList => each_item(path, node, errors, spec, |_, v| match v {
            Value::Str(_) => Ok(()),
            _ => Err("expected a string".to_string()),
        }),
        Ty::EnvNameList => each_item(path, node, errors, spec, |_, v| match v {
            Value::Str(s) if is_env_name(s) => Ok(()),
            Value::Str(s) => Err(format!("`{s}` is not a valid environment variable name")),
            _ => Err("expected an environment variable name".to_string()),
        }),
        Ty::VolumeList => each_item(path, node, errors, spec, |_, v| match v {
            // Skipped with a warning ([`skipped_volumes`]).
            Value::Str(s) if !s.contains(':') => Ok(()),
            Value::Str(s) => parse_volume(s).map(drop),
            _ => Err("expected a host:container[:options] string".to_string()),
        }),
        Ty::HostPatternList => each_item(path, node, errors, spec, |_, v| match v {
            Value::Str(s) => check_host_pattern(s),
            _ => Err("expected a host name or *.domain pattern".to_string()),
        }),
        Ty::OptCidrList => {
            if value == Value::Null {
                return;
            }
            each_item(path, node, errors, spec, |_, v| match v {
                Value::Str(s) => parse_cidr(s).map(drop),
                _ => Err("expected a CIDR range such as 10.0.0.0/8".to_string()),
            })
        }
        Ty::OptIpList => {
            if value == Value::Null {
                return;
            }
            each_item(path, node, errors, spec, |_, v| match v {
                Value::Str(s) => parse_listen_addr(s).map(drop),
                _ => Err("expected an IP address such as 127.0.0.1".to_string()),
            })
        }
        Ty::ResolveMap => match &node.kind {
            NodeKind::Map { entries, .. } => {
                for entry in entries {
                    let item_path = crate::keypath::join(path, &entry.key);
                    if let Err(message) = check_host_pattern(&entry.key) {
                        errors.push(Issue::new(item_path.as_str(), entry.key_pos, message));
                    } else if entry.key.starts_with("*.") {
                        errors.push(Issue::new(
                            item_path.as_str(),
                            entry.key_pos,
                            "name one host; wildcards cannot be resolved",
                        ));
                    }
                    match entry.value.to_value() {
                        Value::Str(s) if s.parse::<IpAddr>().is_ok() => {}
                        other => errors.push(Issue::new(
                            item_path,
                            entry.value.start,
                            format!(
                                "expected an IP address such as 127.0.0.1, found {}",
                                describe(&entry.value, &other)
                            ),
                        )),
                    }
                }
            }
            _ if value == Value::Null => {}
            _ => wrong(errors),
        },
        Ty::KubeNamespace => match &value {
            Value::Str(s) => {
                if let Err(e) = crate::kubernetes::check_dns_label(s) {
                    errors.push(Issue::new(
                        path,
                        node.start,
                        format!("`{s}` is not a namespace name: it {e}"),
                    ));
                }
            }
            _ => wrong(errors),
        },
        Ty::OptKubeName => match &value {
            Value::Null => {}
            Value::Str(s) => {
                if let Err(e) = crate::kubernetes::check_dns_subdomain(s) {
                    errors.push(Issue::new(path, node.start, e));
                }
            }
            _ => wrong(errors),
        },
        Ty::TolerationList => each_item(path, node, errors, spec, |_, v| match v {
            Value::Str(s) => crate::kubernetes::Toleration::parse(s).map(drop),
            _ => Err("expected a toleration such as gpu=true:NoSchedule".to_string()),
        }),
        Ty::LabelMap => match &node.kind {
            NodeKind::Map { entries, .. } => {
                for entry in entries {
                    let item_path = crate::keypath::join(path, &entry.key);
                    if let Err(e) = crate::kubernetes::check_label_key(&entry.key) {
                        errors.push(Issue::new(
                            item_path.as_str(),
                            entry.key_pos,
                            format!("not a label key: {e}"),
                        ));
                    } else if path == crate::schema_key!("terminal.kubernetes_labels").path
                        && crate::kubernetes::is_own_label(&entry.key)
                    {
                        errors.push(Issue::new(
                            item_path.as_str(),
                            entry.key_pos,
                            format!("`{}` is a label hermes sets itself", entry.key),
                        ));
                    }
                    match entry.value.to_value() {
                        Value::Str(s) => {
                            if let Err(e) = crate::kubernetes::check_label_value(&s) {
                                errors.push(Issue::new(
                                    item_path,
                                    entry.value.start,
                                    format!("not a label value: {e}"),
                                ));
                            }
                        }
                        Value::Int(_) | Value::Bool(_) => {}
                        other => errors.push(Issue::new(
                            item_path,
                            entry.value.start,
                            format!(
                                "expected a label value (a string), found {}",
                                describe(&entry.value, &other)
                            ),
                        )),
                    }
                }
            }
            _ if value == Value::Null => {}
            _ => wrong(errors),
        },
        Ty::EnvMap => match &node.kind {
            NodeKind::Map { entries, .. } => {
                for entry in entries {
                    let item_path = crate::keypath::join(path, &entry.key);
                    if !is_env_name(&entry.key) {
                        errors.push(Issue::new(
                            item_path.as_str(),
                            entry.key_pos,
                            format!("`{}` is not a valid environment variable name", entry.key),
                        ));
                    }
                    if entry.value.to_value().is_collection() {
                        errors.push(Issue::new(
                            item_path,
                            entry.value.start,
                            format!(
                                "expected a string, number or boolean, found {}",
                                entry.value.kind_name()
                            ),
                        ));
                    }
                }
            }
            _ if value == Value::Null => {}
            _ => wrong(errors),
        },
    }
}

/// Checks each item of a list node with `item_ok`, naming `path[i]`.
fn each_item(
    path: &str,
    node: &Node,
    errors: &mut Vec<Issue>,
    spec: &KeySpec,
    item_ok: impl Fn(usize, &Value) -> Result<(), String>,
) {
    match &node.kind {
        NodeKind::Seq { items, .. } => {
            for (i, item) in items.iter().enumerate() {
                if let Err(message) = item_ok(i, &item.to_value()) {
                    errors.push(Issue::new(format!("{path}[{i}]"), item.start, message));
                }
            }
        }
        NodeKind::Scalar(s) if s.resolve() == Value::Null => {}
        _ => errors.push(Issue::new(
            path,
            node.start,
            format!(
                "expected {}, found {}",
                spec.ty.expectation(),
                node.kind_name()
            ),
        )),
    }
}

fn describe(node: &Node, value: &Value) -> String {
    match value {
        Value::Seq(_) | Value::Map(_) => node.kind_name().to_string(),
        scalar => format!("{} `{}`", node.kind_name(), scalar.to_yaml_inline()),
    }
}

/// Whether `name` can be an environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses `512m`, `1g`, `1.5g`, `1024` (bytes) into bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => return None,
    };
    let bytes = number * factor as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Parses a `host:container[:options]` mount.
pub fn parse_volume(text: &str) -> Result<Volume, String> {
    const OPTIONS: &[&str] = &[
        "ro",
        "rw",
        "z",
        "Z",
        "shared",
        "slave",
        "private",
        "rshared",
        "rslave",
        "rprivate",
        "nocopy",
        "consistent",
        "cached",
        "delegated",
    ];
    let parts: Vec<&str> = text.split(':').collect();
    let (host, container, options) = match parts.as_slice() {
        [h, c] => (*h, *c, None),
        [h, c, o] => (*h, *c, Some(*o)),
        _ => {
            return Err(format!(
                "`{text}` is not host:container[:options] (for example /srv/data:/data:ro)"
            ));
        }
    };
    if host.is_empty() {
        return Err(format!("`{text}` has an empty host side"));
    }
    if !container.starts_with('/') {
        return Err(format!(
            "`{text}`: the container side `{container}` must be an absolute path"
        ));
    }
    if let Some(options) = options {
        if let Some(bad) = options.split(',').find(|o| !OPTIONS.contains(o)) {
            return Err(format!("`{text}`: unknown mount option `{bad}`"));
        }
    }
    Ok(Volume {
        host: host.to_string(),
        container: container.to_string(),
        options: options.map(str::to_string),
    })
}

/// Parses a CIDR range; a bare address is a single-host range.
pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Ok(IpNet::from(addr));
    }
    Err(format!(
        "`{text}` is not a CIDR range (for example 10.0.0.0/8 or fc00::/7)"
    ))
}

/// Parses a listen address: a concrete IP, never the unspecified one.
pub fn parse_listen_addr(text: &str) -> Result<IpAddr, String> {
    let addr: IpAddr = text
        .parse()
        .map_err(|_| format!("`{text}` is not an IP address (for example 127.0.0.1)"))?;
    if addr.is_unspecified() {
        return Err(format!(
            "`{text}` would listen on every interface; name the addresses to listen on"
        ));
    }
    Ok(addr)
}

/// Checks an allowlist entry: an exact host name or `*.domain`.
pub fn check_host_pattern(text: &str) -> Result<(), String> {
    if text == "*" {
        return Err("a bare `*` would allow every host; list the hosts, or `*.domain`".into());
    }
    if text.contains("://") || text.contains('/') || text.contains(':') {
        return Err(format!(
            "`{text}` must be a host name only, without scheme, port or path"
        ));
    }
    // `*.domain`, or `*-rest.domain` (a first label ending in `-rest`:
    // Vertex AI's regional `us-central1-aiplatform.googleapis.com`).
    let (wildcard, name) = match text.strip_prefix("*.").or_else(|| text.strip_prefix("*-")) {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if name.len() > 253 || name.is_empty() {
        return Err(format!("`{text}` is not a valid host name"));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !ok {
            let why = if label.contains('*') {
                "a wildcard may only open the first label (`*.example.com`, `*-api.example.com`)"
            } else {
                "labels are letters, digits and inner hyphens"
            };
            return Err(format!("`{text}` is not a valid host pattern: {why}"));
        }
    }
    if wildcard && labels.len() < 2 {
        return Err(format!(
            "`{text}` would allow a whole top-level domain; name at least two labels after `*.`"
        ));
    }
    Ok(())
}

pub mod agent;
pub mod env;
pub use env::EnvOverride;
mod isolation;
pub use isolation::{is_secret_name, proxy_enforced};
mod read;
mod resolve;
pub use resolve::DEFAULT_UPSTREAM_DENY;

#[cfg(test)]
mod tests;
