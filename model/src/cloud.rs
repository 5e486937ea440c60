//! The remote sandbox services (modal, daytona, vercel_sandbox) as plain
//! data: which credentials each needs, the sandbox the config wants there,
//! what a pass found, and the snapshot records kept between sessions.
//!
//! Persistence on these services means "the filesystem survives, processes
//! do not": a session's end keeps a snapshot (Daytona: the stopped sandbox
//! itself) and the next one restores from it. The snapshot ids live in
//! `$HERMES_HOME/<backend>_snapshots.json`, the reference's file: one JSON
//! object of task → snapshot id, where hermes also keeps the id of the
//! sandbox it left running for the task (a service without names or
//! labels, Vercel, is found again only by it). The parsing and rendering
//! of that file is here, pure; reading and writing it is the controller's.
//!
//! These sandboxes reach the internet directly, so the egress proxy cannot
//! stand between them and a provider: nothing is handed to them but the
//! variables named in `terminal.<backend>_forward_env`. Where the service
//! rewrites outbound headers itself (Vercel's network policy
//! `injectionRules`, Modal's `experimental_outbound_policy`), a forwarded
//! provider key is split ([`service_side`]): the sandbox gets the proxy's
//! token in its place and the service is told to set the real key's
//! header on requests to that provider's hosts only. Daytona has no such
//! mechanism: a key forwarded there goes in as it is.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::config::{Backend, Config, Issue};
use crate::desired::HostEnv;
use crate::yaml::{self, Pos};

/// Daytona's largest disk, in MB: a bigger `container_disk` is capped to
/// it, with a warning, as the reference does.
pub const DAYTONA_MAX_DISK_MB: u64 = 10 * 1024;

/// The backends that run on a remote service.
pub const CLOUD_BACKENDS: &[Backend] = &[Backend::Modal, Backend::Daytona, Backend::VercelSandbox];

/// Every variable a cloud backend reads its credentials from: secrets of
/// the host (`.env`), never config.yaml's nor a sandbox's.
pub const CREDENTIALS: &[&str] = &[
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    "DAYTONA_API_KEY",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_TOKEN",
    "VERCEL_PROJECT_ID",
    "VERCEL_TEAM_ID",
];

/// Whether `backend`'s service sets outbound headers for hermes (a
/// service-side transform), so that a provider key can stay out of its
/// sandboxes.
pub fn transforms_headers(backend: Backend) -> bool {
    matches!(backend, Backend::Modal | Backend::VercelSandbox)
}

/// A header the service sets on the sandbox's outbound HTTPS requests to
/// `host` (exact or `*.domain`). `value` holds the real key: it goes only
/// into the policy sent to the service's API, and is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderTransform {
    pub host: String,
    /// Lower-case header name.
    pub header: String,
    pub value: String,
    /// The provider (the token's prefix, the name in `egress status`).
    pub provider: &'static str,
}

impl fmt::Debug for HeaderTransform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderTransform")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("value", &"<redacted>")
            .field("provider", &self.provider)
            .finish()
    }
}

/// The forwarded provider and the header place a service-side transform
/// uses for `name`: the provider's first header place (a `?param` place
/// cannot be set by a header rule). None for a provider with a host the
/// services' domain rules cannot name (they take an exact host or
/// `*.domain`; Vertex's `*-aiplatform.googleapis.com` is neither), which
/// stays uncovered rather than half covered.
fn transform_place(name: &str) -> Option<(&'static crate::providers::ProviderSpec, &'static str)> {
    let spec = crate::providers::PROVIDERS
        .iter()
        .find(|p| p.env.contains(&name))?;
    let nameable = |host: &str| !host.strip_prefix("*.").unwrap_or(host).contains('*');
    if !spec.hosts.iter().all(|h| nameable(h)) {
        return None;
    }
    let place = spec.places.iter().find(|p| !p.starts_with('?'))?;
    Some((spec, place))
}

/// Whether a forwarded `name` is a provider key that `backend`'s service
/// can keep out of the sandbox.
pub fn covered_by_service(backend: Backend, name: &str) -> bool {
    transforms_headers(backend) && transform_place(name).is_some()
}

/// What a sandbox on `backend` gets of the forwarded `env`, and the header
/// transforms its service applies: on a service with transforms, each
/// provider key forwarded is replaced by `token(provider)` (the proxy's
/// opaque token for it) and its real value goes into one transform per
/// provider host (`authorization: Bearer <key>` or the provider's own
/// header). Everything else, and everything on another service, is kept
/// as it is. A provider's first forwarded variable sets its transforms.
pub fn service_side(
    backend: Backend,
    env: &[(String, String)],
    token: &dyn Fn(&str) -> Option<String>,
) -> (Vec<(String, String)>, Vec<HeaderTransform>) {
    let mut sandbox_env = Vec::with_capacity(env.len());
    let mut transforms: Vec<HeaderTransform> = Vec::new();
    for (name, value) in env {
        let split = transforms_headers(backend)
            .then(|| transform_place(name))
            .flatten()
            .and_then(|(spec, place)| Some((spec, place, token(spec.name)?)));
        let Some((spec, place, placeholder)) = split else {
            sandbox_env.push((name.clone(), value.clone()));
            continue;
        };
        sandbox_env.push((name.clone(), placeholder));
        if transforms.iter().any(|t| t.provider == spec.name) {
            continue;
        }
        let (header, header_value) = match place.split_once(':') {
            Some((header, scheme)) => (header.trim(), format!("{} {value}", scheme.trim())),
            None => (place.trim(), value.clone()),
        };
        for host in spec.hosts {
            transforms.push(HeaderTransform {
                host: (*host).to_string(),
                header: header.to_ascii_lowercase(),
                value: header_value.clone(),
                provider: spec.name,
            });
        }
    }
    (sandbox_env, transforms)
}

/// Whether `backend` runs on a remote service.
pub fn is_cloud(backend: Backend) -> bool {
    CLOUD_BACKENDS.contains(&backend)
}

/// A credential a service needs that the environment (or `.env`) lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct MissingCredential {
    pub backend: Backend,
    /// The variables that are not set, in the order the service documents
    /// them.
    pub missing: Vec<&'static str>,
    /// How the service can be satisfied otherwise, when it can.
    pub alternative: Option<&'static str>,
}

impl MissingCredential {
    fn describe(&self) -> String {
        let names = match self.missing.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => self.missing.join(""),
        };
        let verb = if self.missing.len() == 1 { "is" } else { "are" };
        match self.alternative {
            Some(alt) => format!("{names} {verb} not set ({alt})"),
            None => format!("{names} {verb} not set"),
        }
    }
}

/// Whether the credentials `backend` needs are present: in the host
/// environment or `.env` (and, for Modal, `~/.modal.toml`, whose presence
/// the caller put in `env`). Other backends need none.
pub fn credentials(backend: Backend, env: &HostEnv) -> Result<(), MissingCredential> {
    let set = |name: &str| env.lookup(name).is_some_and(|v| !v.is_empty());
    let missing = |names: &[&'static str]| -> Vec<&'static str> {
        names.iter().copied().filter(|n| !set(n)).collect()
    };
    let (lacking, alternative) = match backend {
        Backend::Modal => {
            if env.modal_toml {
                return Ok(());
            }
            (
                missing(&["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"]),
                Some("nor is there a ~/.modal.toml"),
            )
        }
        Backend::Daytona => (missing(&["DAYTONA_API_KEY"]), None),
        Backend::VercelSandbox => {
            if set("VERCEL_OIDC_TOKEN") {
                return Ok(());
            }
            (
                missing(&["VERCEL_TOKEN", "VERCEL_PROJECT_ID", "VERCEL_TEAM_ID"]),
                Some("nor is VERCEL_OIDC_TOKEN, which would do alone"),
            )
        }
        _ => return Ok(()),
    };
    if lacking.is_empty() {
        Ok(())
    } else {
        Err(MissingCredential {
            backend,
            missing: lacking,
            alternative,
        })
    }
}

/// The credential check of `hermes config check`: with a cloud backend,
/// a missing credential is an error at `terminal.backend`, naming the
/// variable. `text` is the config text that loaded cleanly.
pub fn check_credentials(text: &str, env: &HostEnv) -> Vec<Issue> {
    let Ok(root) = yaml::parse(text) else {
        return Vec::new();
    };
    // The backend as the `TERMINAL_*` variables leave it.
    let (root, _) =
        crate::config::env::apply(root, &env.terminal_vars(), &mut Vec::new(), &mut Vec::new());
    let Some(root) = root else {
        return Vec::new();
    };
    let Some(node) = root.get("terminal").and_then(|t| t.value.get("backend")) else {
        return Vec::new();
    };
    let from_env = node.value.start == crate::config::agent::ENV_POS;
    let backend = match node.value.to_value() {
        crate::value::Value::Str(word) => {
            match CLOUD_BACKENDS.iter().find(|b| b.as_str() == word) {
                Some(b) => *b,
                None => return Vec::new(),
            }
        }
        _ => return Vec::new(),
    };
    match credentials(backend, env) {
        Ok(()) => Vec::new(),
        Err(e) => vec![Issue {
            path: match from_env {
                true => "TERMINAL_ENV".to_string(),
                false => crate::schema_key!("terminal.backend").path.to_string(),
            },
            pos: (!from_env).then_some(node.value.start),
            message: format!("{e}: the {backend} backend needs it, in the environment or in .env"),
        }],
    }
}

/// The warning of a Daytona disk over its cap, at `terminal.container_disk`
/// when the file sets it, else at `terminal.backend`.
pub(crate) fn daytona_disk_warning(root: &yaml::Node) -> Option<Issue> {
    let terminal = root.get("terminal")?;
    let backend = terminal.value.get("backend")?;
    if backend.value.to_value() != crate::value::Value::Str("daytona".into()) {
        return None;
    }
    let disk = terminal.value.get("container_disk");
    let (mb, pos): (u64, Pos) = match disk {
        Some(d) => match d.value.to_value() {
            crate::value::Value::Int(i) => (u64::try_from(i).ok()?, d.value.start),
            _ => return None,
        },
        None => match crate::schema_key!("terminal.container_disk").default {
            crate::schema::Default::Int(i) => (u64::try_from(i).ok()?, backend.value.start),
            _ => return None,
        },
    };
    (mb > DAYTONA_MAX_DISK_MB).then(|| Issue {
        path: crate::schema_key!("terminal.container_disk").path.to_string(),
        pos: Some(pos),
        message: format!(
            "a Daytona sandbox has at most {DAYTONA_MAX_DISK_MB} MB of disk: {mb} MB is capped to {DAYTONA_MAX_DISK_MB} MB"
        ),
    })
}

/// What `hermes egress status` says of the backends the proxy cannot
/// cover: each cloud backend, with the real credentials its
/// `<backend>_forward_env` names that go into its sandboxes as they are
/// (not the provider keys its service sets as headers itself).
pub fn uncovered_backends(config: &Config) -> Vec<(Backend, Vec<String>)> {
    let t = &config.terminal;
    CLOUD_BACKENDS
        .iter()
        .map(|&backend| {
            let named = match backend {
                Backend::Modal => &t.modal_forward_env,
                Backend::Daytona => &t.daytona_forward_env,
                _ => &t.vercel_forward_env,
            };
            let keys = named
                .iter()
                .filter(|n| crate::providers::is_credential_variable(n))
                .filter(|n| !covered_by_service(backend, n))
                .cloned()
                .collect();
            (backend, keys)
        })
        .collect()
}

/// The provider keys that each service with header transforms keeps out
/// of its sandboxes: the ones its `<backend>_forward_env` names.
pub fn service_covered(config: &Config) -> Vec<(Backend, Vec<String>)> {
    let t = &config.terminal;
    [
        (Backend::Modal, &t.modal_forward_env),
        (Backend::VercelSandbox, &t.vercel_forward_env),
    ]
    .into_iter()
    .map(|(backend, named)| {
        let keys = named
            .iter()
            .filter(|n| covered_by_service(backend, n))
            .cloned()
            .collect();
        (backend, keys)
    })
    .collect()
}

/// The sandbox the config wants on a remote service, for the default task
/// of the active profile (one per (profile, task), as Docker's persistent
/// sandbox).
#[derive(Debug, Clone, PartialEq)]
pub struct CloudDesired {
    pub backend: Backend,
    /// Image (modal, daytona) or runtime (vercel_sandbox).
    pub image: String,
    pub cpu: f64,
    pub memory_mb: u64,
    /// Capped at [`DAYTONA_MAX_DISK_MB`] on Daytona.
    pub disk_mb: u64,
    /// How long the service keeps an unused sandbox alive on its own.
    pub lifetime: Duration,
    /// The values of `<backend>_forward_env` that were found; nothing else
    /// goes into the sandbox.
    pub env: Vec<(String, String)>,
    /// The credentials: present, or which are missing.
    pub credentials: Result<(), MissingCredential>,
}

/// How long a cloud sandbox lives on its own (the reference's Modal
/// timeout: an hour).
pub const CLOUD_LIFETIME: Duration = Duration::from_secs(3600);

/// How long the service keeps the sandbox unused: [`CLOUD_LIFETIME`];
/// on Daytona, with `terminal.idle_action: stop`, `lifetime_seconds` (at
/// least a minute, its unit): Daytona's auto-stop is idleness, as hermes's
/// is, and a stopped Daytona sandbox keeps its files and is resumed by the
/// next command. Modal's and Vercel's timeouts count from the start, busy
/// or not, so they stay as they are there.
fn lifetime(t: &crate::config::Terminal) -> Duration {
    if t.backend == Backend::Daytona && t.idle_action == crate::config::IdleAction::Stop {
        Duration::from_secs(t.lifetime_seconds.max(60))
    } else {
        CLOUD_LIFETIME
    }
}

impl CloudDesired {
    /// The cloud side of the config, when the backend is a cloud; the
    /// warnings (a forwarded name set nowhere, a provider key forwarded)
    /// are pushed to `warnings`.
    pub fn from_config(
        config: &Config,
        env: &HostEnv,
        warnings: &mut Vec<String>,
    ) -> Option<CloudDesired> {
        let t = &config.terminal;
        let (image, forward, key, disk_mb) = match t.backend {
            Backend::Modal => (
                t.modal_image.clone(),
                &t.modal_forward_env,
                "modal_forward_env",
                t.container_disk_mb,
            ),
            Backend::Daytona => (
                t.daytona_image.clone(),
                &t.daytona_forward_env,
                "daytona_forward_env",
                t.container_disk_mb.min(DAYTONA_MAX_DISK_MB),
            ),
            Backend::VercelSandbox => (
                t.vercel_runtime.clone(),
                &t.vercel_forward_env,
                "vercel_forward_env",
                t.container_disk_mb,
            ),
            _ => return None,
        };
        let mut values = Vec::new();
        for name in forward {
            match env.lookup(name) {
                Some(value) => {
                    if crate::providers::is_credential_variable(name)
                        && !covered_by_service(t.backend, name)
                    {
                        warnings.push(format!(
                            "terminal.{key}: {name} is a real credential and goes into the {} sandbox as it is (the egress proxy cannot stand in for a sandbox that reaches the internet directly)",
                            t.backend
                        ));
                    }
                    values.push((name.clone(), value.to_string()));
                }
                None => warnings.push(format!(
                    "terminal.{key}: {name} is set neither in the environment nor in .env; not forwarded"
                )),
            }
        }
        Some(CloudDesired {
            backend: t.backend,
            image,
            cpu: t.container_cpu,
            memory_mb: t.container_memory_mb,
            disk_mb,
            lifetime: lifetime(t),
            env: values,
            credentials: credentials(t.backend, env),
        })
    }
}

/// Where a sandbox is on its service, as the driver reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudSandboxState {
    Running,
    /// It exists and can be resumed.
    Stopped,
    /// Being created, started or stopped by the service.
    Pending,
    /// Failed or terminated: it can only be deleted.
    Dead,
}

/// What a pass found on the service for the default task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudObserved {
    /// The driver's `find` answered: the sandbox, if there is one, and the
    /// snapshot recorded for the task.
    Seen {
        sandbox: Option<(String, CloudSandboxState)>,
        snapshot: Option<String>,
    },
    /// The service could not be asked: why (no driver in this binary, the
    /// service unreachable, credentials refused).
    Unavailable { reason: String },
}

/// The key of a task's record in `<backend>_snapshots.json`: the task, as
/// the reference keys it, for the default profile; `profile/task` for the
/// others, so two profiles of one home never share a snapshot.
pub fn snapshot_key(profile: &str, task: &str) -> String {
    if profile == crate::desired::DEFAULT_PROFILE {
        task.to_string()
    } else {
        format!("{profile}/{task}")
    }
}

/// The file name of a backend's snapshot records.
pub fn snapshots_file_name(backend: Backend) -> String {
    format!("{}_snapshots.json", backend.as_str())
}

/// What hermes keeps for one task of one profile on a service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskRecord {
    /// The snapshot the next sandbox restores from (kept by a session's
    /// end).
    pub snapshot: Option<String>,
    /// The sandbox hermes created or resumed for the task and left
    /// running: how a service without names or labels (Vercel) finds it
    /// again. Cleared when the session ends or the sandbox is destroyed.
    pub sandbox: Option<String>,
}

impl TaskRecord {
    /// Whether there is nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.sandbox.is_none()
    }
}

/// The records of one `<backend>_snapshots.json`: key → the task's record.
pub type Snapshots = BTreeMap<String, TaskRecord>;

/// Why a snapshot file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadSnapshots(String);

/// Parses the records: one JSON object of key → either a snapshot id (the
/// reference's format, which older files have throughout) or an object
/// `{"snapshot": id, "sandbox": id}` with either field optional. An empty
/// text is no record; unknown fields of a record are ignored.
pub fn parse_snapshots(text: &str) -> Result<Snapshots, BadSnapshots> {
    if text.trim().is_empty() {
        return Ok(Snapshots::new());
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| BadSnapshots(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(BadSnapshots(
            "expected an object of task → snapshot id".to_string(),
        ));
    };
    let mut records = Snapshots::new();
    for (k, v) in map {
        let record = match v {
            serde_json::Value::String(id) if !id.is_empty() => TaskRecord {
                snapshot: Some(id),
                sandbox: None,
            },
            serde_json::Value::Object(fields) => {
                let id = |name: &str| -> Result<Option<String>, BadSnapshots> {
                    match fields.get(name) {
                        None | Some(serde_json::Value::Null) => Ok(None),
                        Some(serde_json::Value::String(id)) if !id.is_empty() => {
                            Ok(Some(id.clone()))
                        }
                        Some(other) => Err(BadSnapshots(format!(
                            "the {name} of `{k}` is {other}, not an id"
                        ))),
                    }
                };
                TaskRecord {
                    snapshot: id("snapshot")?,
                    sandbox: id("sandbox")?,
                }
            }
            other => {
                return Err(BadSnapshots(format!(
                    "the record of `{k}` is {other}, not a snapshot id"
                )));
            }
        };
        if !record.is_empty() {
            records.insert(k, record);
        }
    }
    Ok(records)
}

/// Renders the records: a record with only a snapshot as the reference
/// writes it (the id itself), one with a live sandbox as an object; an
/// empty record is left out.
pub fn render_snapshots(snapshots: &Snapshots) -> String {
    let object: serde_json::Map<String, serde_json::Value> = snapshots
        .iter()
        .filter(|(_, r)| !r.is_empty())
        .map(|(k, r)| {
            let value = match (&r.snapshot, &r.sandbox) {
                (Some(snapshot), None) => serde_json::Value::String(snapshot.clone()),
                (snapshot, sandbox) => {
                    let mut fields = serde_json::Map::new();
                    if let Some(id) = snapshot {
                        fields.insert("snapshot".into(), serde_json::Value::String(id.clone()));
                    }
                    if let Some(id) = sandbox {
                        fields.insert("sandbox".into(), serde_json::Value::String(id.clone()));
                    }
                    serde_json::Value::Object(fields)
                }
            };
            (k.clone(), value)
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&serde_json::Value::Object(object))
        .unwrap_or_else(|_| "{}".to_string());
    text.push('\n');
    text
}

impl fmt::Display for CloudSandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CloudSandboxState::Running => "running",
            CloudSandboxState::Stopped => "stopped",
            CloudSandboxState::Pending => "pending",
            CloudSandboxState::Dead => "dead",
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    fn env(pairs: &[(&str, &str)]) -> HostEnv {
        HostEnv {
            process: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..HostEnv::default()
        }
    }

    #[test]
    fn every_credential_a_service_asks_for_is_a_known_secret() {
        for &backend in CLOUD_BACKENDS {
            let lacking = credentials(backend, &HostEnv::default()).unwrap_err();
            for name in lacking.missing {
                assert!(CREDENTIALS.contains(&name), "{name}");
                assert!(crate::config::is_secret_name(name), "{name}");
            }
        }
    }

    #[test]
    fn each_service_names_the_credential_it_lacks() {
        let none = HostEnv::default();
        assert_eq!(
            credentials(Backend::Daytona, &none)
                .unwrap_err()
                .to_string(),
            "DAYTONA_API_KEY is not set"
        );
        assert_eq!(
            credentials(Backend::Modal, &env(&[("MODAL_TOKEN_ID", "a")]))
                .unwrap_err()
                .to_string(),
            "MODAL_TOKEN_SECRET is not set (nor is there a ~/.modal.toml)"
        );
        assert_eq!(
            credentials(Backend::VercelSandbox, &env(&[("VERCEL_TOKEN", "t")]))
                .unwrap_err()
                .to_string(),
            "VERCEL_PROJECT_ID and VERCEL_TEAM_ID are not set (nor is VERCEL_OIDC_TOKEN, which would do alone)"
        );
        assert!(credentials(Backend::Daytona, &env(&[("DAYTONA_API_KEY", "k")])).is_ok());
        assert!(credentials(Backend::VercelSandbox, &env(&[("VERCEL_OIDC_TOKEN", "o")])).is_ok());
        assert!(
            credentials(
                Backend::VercelSandbox,
                &env(&[
                    ("VERCEL_TOKEN", "t"),
                    ("VERCEL_PROJECT_ID", "p"),
                    ("VERCEL_TEAM_ID", "team")
                ])
            )
            .is_ok()
        );
        let toml = HostEnv {
            modal_toml: true,
            ..HostEnv::default()
        };
        assert!(credentials(Backend::Modal, &toml).is_ok());
        // An empty value is not a credential.
        assert!(credentials(Backend::Daytona, &env(&[("DAYTONA_API_KEY", "")])).is_err());
        // .env counts as well as the environment.
        let dotenv = HostEnv {
            dotenv: vec![("DAYTONA_API_KEY".into(), "k".into())],
            ..HostEnv::default()
        };
        assert!(credentials(Backend::Daytona, &dotenv).is_ok());
        assert!(credentials(Backend::Singularity, &none).is_ok());
    }

    #[test]
    fn config_check_reports_the_missing_credential_at_the_backend_key() {
        let text = "terminal:\n  timeout: 5\n  backend: daytona\n";
        let issues = check_credentials(text, &HostEnv::default());
        assert_eq!(issues.len(), 1);
        assert_eq!(
            issues[0].render("config.yaml"),
            "config.yaml:3:12: terminal.backend: DAYTONA_API_KEY is not set: the daytona backend needs it, in the environment or in .env"
        );
        assert!(check_credentials(text, &env(&[("DAYTONA_API_KEY", "k")])).is_empty());
        assert!(
            check_credentials("terminal:\n  backend: docker\n", &HostEnv::default()).is_empty()
        );
    }

    #[test]
    fn idle_action_stop_is_daytona_s_own_auto_stop_and_nothing_elsewhere() {
        let cloud = |text: &str| {
            let loaded = load(text).unwrap();
            CloudDesired::from_config(&loaded.config, &HostEnv::default(), &mut Vec::new())
                .unwrap()
                .lifetime
        };
        assert_eq!(
            cloud("terminal:\n  backend: daytona\n  lifetime_seconds: 600\n  idle_action: stop\n"),
            Duration::from_secs(600)
        );
        assert_eq!(
            cloud("terminal:\n  backend: daytona\n  lifetime_seconds: 5\n  idle_action: stop\n"),
            Duration::from_secs(60)
        );
        assert_eq!(
            cloud("terminal:\n  backend: daytona\n  lifetime_seconds: 600\n"),
            CLOUD_LIFETIME
        );
        assert_eq!(
            cloud("terminal:\n  backend: modal\n  lifetime_seconds: 600\n  idle_action: stop\n"),
            CLOUD_LIFETIME
        );
    }

    #[test]
    fn a_daytona_disk_over_the_cap_is_a_warning_and_is_capped() {
        let loaded = load("terminal:\n  backend: daytona\n  container_disk: 20480\n").unwrap();
        assert_eq!(loaded.warnings.len(), 1);
        assert_eq!(
            loaded.warnings[0].render("config.yaml"),
            "config.yaml:3:19: terminal.container_disk: a Daytona sandbox has at most 10240 MB of disk: 20480 MB is capped to 10240 MB"
        );
        let mut warnings = Vec::new();
        let cloud =
            CloudDesired::from_config(&loaded.config, &HostEnv::default(), &mut warnings).unwrap();
        assert_eq!(cloud.disk_mb, DAYTONA_MAX_DISK_MB);
        // The default disk (50 GiB) is capped too, the warning at the backend.
        let loaded = load("terminal:\n  backend: daytona\n").unwrap();
        assert_eq!(
            loaded.warnings[0].pos.map(|p| (p.line, p.col)),
            Some((2, 12))
        );
        // Within the cap, or on another service: no word.
        assert!(
            load("terminal:\n  backend: daytona\n  container_disk: 4096\n")
                .unwrap()
                .warnings
                .is_empty()
        );
        assert!(
            load("terminal:\n  backend: modal\n")
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn only_the_named_variables_go_into_a_cloud_sandbox() {
        let host = env(&[
            ("OPENAI_API_KEY", "sk-real"),
            ("GIT_AUTHOR", "me"),
            ("MODAL_TOKEN_ID", "a"),
            ("MODAL_TOKEN_SECRET", "b"),
        ]);
        let config = load("terminal:\n  backend: modal\n  modal_image: python:3.12\n  modal_forward_env: [GIT_AUTHOR, NOPE]\n")
            .unwrap()
            .config;
        let mut warnings = Vec::new();
        let cloud = CloudDesired::from_config(&config, &host, &mut warnings).unwrap();
        assert_eq!(cloud.env, [("GIT_AUTHOR".to_string(), "me".to_string())]);
        assert_eq!(cloud.image, "python:3.12");
        assert!(cloud.credentials.is_ok());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("NOPE is set neither"), "{warnings:?}");
        // A provider key goes only when named, and then with a warning.
        let config =
            load("terminal:\n  backend: vercel_sandbox\n  vercel_forward_env: [OPENAI_API_KEY]\n")
                .unwrap()
                .config;
        let mut warnings = Vec::new();
        let cloud = CloudDesired::from_config(&config, &host, &mut warnings).unwrap();
        assert_eq!(
            cloud.env,
            [("OPENAI_API_KEY".to_string(), "sk-real".to_string())]
        );
        assert_eq!(cloud.image, "node24");
        // Vercel sets the key's header itself: no warning; Daytona cannot.
        assert!(warnings.is_empty(), "{warnings:?}");
        let config =
            load("terminal:\n  backend: daytona\n  daytona_forward_env: [OPENAI_API_KEY]\n")
                .unwrap()
                .config;
        let mut warnings = Vec::new();
        CloudDesired::from_config(&config, &host, &mut warnings).unwrap();
        assert!(warnings[0].contains("is a real credential"), "{warnings:?}");
        // The image falls back on docker_image.
        let config = load("terminal:\n  backend: daytona\n  docker_image: img:1\n")
            .unwrap()
            .config;
        let cloud = CloudDesired::from_config(&config, &host, &mut Vec::new()).unwrap();
        assert_eq!(cloud.image, "img:1");
        assert_eq!(cloud.credentials.unwrap_err().missing, ["DAYTONA_API_KEY"]);
        let docker = load("terminal:\n  backend: docker\n").unwrap().config;
        assert!(CloudDesired::from_config(&docker, &host, &mut Vec::new()).is_none());
    }

    #[test]
    fn a_provider_key_is_a_token_in_the_sandbox_and_a_header_at_the_service() {
        let env = [
            ("GIT_AUTHOR".to_string(), "me".to_string()),
            ("ANTHROPIC_API_KEY".to_string(), "sk-ant-real".to_string()),
            ("GEMINI_API_KEY".to_string(), "gem-real".to_string()),
            ("GOOGLE_API_KEY".to_string(), "gem-second".to_string()),
            (
                "GOOGLE_APPLICATION_CREDENTIALS".to_string(),
                "/k.json".to_string(),
            ),
        ];
        let token = |p: &str| Some(format!("{p}-tok"));
        let (sandbox, transforms) = service_side(Backend::Modal, &env, &token);
        assert_eq!(
            sandbox,
            [
                ("GIT_AUTHOR", "me"),
                ("ANTHROPIC_API_KEY", "anthropic-tok"),
                ("GEMINI_API_KEY", "google-tok"),
                ("GOOGLE_API_KEY", "google-tok"),
                // A key file is no header: it stays as it is (uncovered).
                ("GOOGLE_APPLICATION_CREDENTIALS", "/k.json"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let got: Vec<(&str, &str, &str)> = transforms
            .iter()
            .map(|t| (t.host.as_str(), t.header.as_str(), t.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("api.anthropic.com", "x-api-key", "sk-ant-real"),
                (
                    "generativelanguage.googleapis.com",
                    "x-goog-api-key",
                    "gem-real"
                ),
            ]
        );
        assert!(!format!("{transforms:?}").contains("real"));
        // Daytona has no transforms: everything as it is.
        let (sandbox, transforms) = service_side(Backend::Daytona, &env, &token);
        assert_eq!(sandbox, env);
        assert!(transforms.is_empty());
        // Bearer places carry the scheme.
        let (_, transforms) = service_side(
            Backend::VercelSandbox,
            &[("OPENAI_API_KEY".to_string(), "sk-o".to_string())],
            &token,
        );
        assert_eq!(transforms[0].header, "authorization");
        assert_eq!(transforms[0].value, "Bearer sk-o");
        // Vertex's regional hosts cannot be named by a service rule: the
        // access token stays as it is (uncovered), not half covered.
        let gcp = [(
            "GOOGLE_OAUTH_ACCESS_TOKEN".to_string(),
            "ya29.x".to_string(),
        )];
        let (sandbox, transforms) = service_side(Backend::Modal, &gcp, &token);
        assert_eq!(sandbox, gcp);
        assert!(transforms.is_empty());
        assert!(!covered_by_service(
            Backend::Modal,
            "GOOGLE_OAUTH_ACCESS_TOKEN"
        ));
        assert!(covered_by_service(Backend::Modal, "AZURE_OPENAI_API_KEY"));
    }

    #[test]
    fn every_cloud_backend_is_uncovered_with_the_keys_it_is_handed() {
        let config = load("terminal:\n  daytona_forward_env: [GIT_AUTHOR, ANTHROPIC_API_KEY]\n  modal_forward_env: [OPENAI_API_KEY, GOOGLE_APPLICATION_CREDENTIALS]\n")
            .unwrap()
            .config;
        assert_eq!(
            uncovered_backends(&config),
            [
                (
                    Backend::Modal,
                    vec!["GOOGLE_APPLICATION_CREDENTIALS".to_string()]
                ),
                (Backend::Daytona, vec!["ANTHROPIC_API_KEY".to_string()]),
                (Backend::VercelSandbox, vec![]),
            ]
        );
        assert_eq!(
            service_covered(&config),
            [
                (Backend::Modal, vec!["OPENAI_API_KEY".to_string()]),
                (Backend::VercelSandbox, vec![]),
            ]
        );
    }

    #[test]
    fn snapshot_records_round_trip_in_the_reference_format() {
        let text = "{\n  \"default\": \"im-abc\",\n  \"work/review\": \"snap_1\"\n}\n";
        let records = parse_snapshots(text).unwrap();
        assert_eq!(records["default"].snapshot.as_deref(), Some("im-abc"));
        assert_eq!(records["default"].sandbox, None);
        assert_eq!(render_snapshots(&records), text);
        assert!(parse_snapshots("").unwrap().is_empty());
        assert!(parse_snapshots("[1]").is_err());
        assert!(parse_snapshots("{\"default\": 3}").is_err());
        assert!(parse_snapshots("{not json").is_err());
        assert!(parse_snapshots("{\"default\": {\"sandbox\": 3}}").is_err());
        assert_eq!(snapshot_key("default", "t"), "t");
        assert_eq!(snapshot_key("work", "t"), "work/t");
        assert_eq!(
            snapshots_file_name(Backend::VercelSandbox),
            "vercel_sandbox_snapshots.json"
        );
    }

    #[test]
    fn a_live_sandbox_is_kept_beside_the_snapshot_and_older_files_still_read() {
        let text = "{\n  \"default\": {\n    \"snapshot\": \"snap_1\",\n    \"sandbox\": \"sbx_2\"\n  },\n  \"t\": {\n    \"sandbox\": \"sbx_3\"\n  },\n  \"u\": \"snap_4\"\n}\n";
        let records = parse_snapshots(text).unwrap();
        assert_eq!(
            records["default"],
            TaskRecord {
                snapshot: Some("snap_1".into()),
                sandbox: Some("sbx_2".into())
            }
        );
        assert_eq!(records["t"].snapshot, None);
        assert_eq!(records["t"].sandbox.as_deref(), Some("sbx_3"));
        assert_eq!(records["u"].snapshot.as_deref(), Some("snap_4"));
        assert_eq!(render_snapshots(&records), text);
        // Unknown fields and empty records are tolerated; an empty record
        // is not written back.
        let records =
            parse_snapshots("{\"a\": {\"snapshot\": null, \"other\": 1}, \"b\": {\"sandbox\": \"x\", \"since\": 3}}")
                .unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records["b"].sandbox.as_deref(), Some("x"));
        let mut records = records;
        records.insert("c".into(), TaskRecord::default());
        assert_eq!(
            render_snapshots(&records),
            "{\n  \"b\": {\n    \"sandbox\": \"x\"\n  }\n}\n"
        );
    }
}
