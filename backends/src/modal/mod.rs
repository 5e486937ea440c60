//! Modal (modal.com) sandboxes through Modal's gRPC API, as a
//! [`CloudDriver`].
//!
//! What it does on the service, call by call (`proto/modal_api.proto` is
//! the subset of Modal's API this speaks):
//!
//! - every sandbox lives in the app `hermes-agent` (`AppGetOrCreate`);
//! - [`CloudDriver::find`] lists the app's running sandboxes carrying the
//!   task's tags (`hermes-agent`, `hermes-profile`, `hermes-task-id`) and
//!   creates nothing, not even the app;
//! - [`CloudDriver::create`] takes the image from its registry name
//!   (`ImageGetOrCreate` with `FROM <image>`, then `ImageJoinStreaming`
//!   until built) or a snapshot's image id, the environment as an
//!   app-owned secret, and starts `sleep infinity` with the spec's cpu,
//!   memory and lifetime (3600 s when none), the spec's header transforms
//!   as `experimental_outbound_policy` (static header replacements, Modal
//!   setting them outside the sandbox), named `hermes-<profile>-<task>`
//!   so that a racing second create fails and finds the first; then waits
//!   for its task (`SandboxGetTaskId`);
//! - [`CloudDriver::suspend`] snapshots the filesystem (`SandboxSnapshotFs`
//!   gives an image id) and terminates; the next create starts from it;
//! - [`CloudDriver::exec`] and the files: see [`exec`].
//!
//! Modules: [`config`] (credentials and server), [`rpc`] (channel,
//! metadata, deadlines, retries), [`exec`] (commands and files),
//! [`error`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_TASK, SandboxKey, sanitize};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::cloud::{CloudDriver, CloudSandbox, CloudSpec, CloudState};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest};

pub mod config;
pub mod error;
mod exec;
mod rpc;

/// The messages and client generated from `proto/modal_api.proto`.
#[allow(missing_debug_implementations, clippy::all)]
pub(crate) mod pb {
    tonic::include_proto!("modal.client");

    /// The header values are real keys: only the names are shown.
    impl std::fmt::Debug for experimental_outbound_policy::HeaderReplacement {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut names: Vec<&String> = self.headers.keys().collect();
            names.sort();
            f.debug_struct("HeaderReplacement")
                .field("domain", &self.domain)
                .field("secret_id", &self.secret_id)
                .field("headers", &names)
                .finish()
        }
    }
}

pub use config::DEFAULT_SERVER_URL;
pub use error::ModalError;

use pb::generic_result::GenericStatus;
use rpc::{POLL_DEADLINE, POLL_SECS, Retry, Rpc, UNARY_DEADLINE};

/// The Modal app every hermes sandbox belongs to.
pub const APP_NAME: &str = "hermes-agent";

/// The sandbox lifetime when the spec gives none, and Modal's ceiling.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The image builder the registry images are built with (the one the
/// official JavaScript and Go clients pin).
const IMAGE_BUILDER_VERSION: &str = "2024.10";

/// How long create waits for an image build and for the sandbox to be
/// scheduled.
const IMAGE_BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);
const SCHEDULE_LIMIT: Duration = Duration::from_secs(21 * 60);

/// The Modal driver: one gRPC channel, the app id once known, and the task
/// id of each sandbox it has seen.
#[derive(Debug)]
pub struct ModalDriver {
    rpc: Rpc,
    app_id: OnceCell<String>,
    task_ids: Mutex<HashMap<String, String>>,
}

impl ModalDriver {
    /// Reads the credentials and the server from `lookup` (the host
    /// environment, then `$HERMES_HOME/.env`) and from the active profile
    /// of `home/.modal.toml`; see [`config`]. Connects on first use.
    ///
    /// # Errors
    ///
    /// [`ModalError::MissingCredentials`] naming `MODAL_TOKEN_ID` and
    /// `MODAL_TOKEN_SECRET` when no token is found;
    /// [`ModalError::Config`] for a broken `.modal.toml` or a server URL
    /// that is neither https nor loopback.
    pub fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<Self, ModalError> {
        let settings = config::resolve(lookup, home)?;
        tracing::debug!(server = %settings.server_url, "modal driver configured");
        Ok(ModalDriver {
            rpc: Rpc::new(settings)?,
            app_id: OnceCell::new(),
            task_ids: Mutex::new(HashMap::new()),
        })
    }

    /// The server this driver talks to.
    pub fn server_url(&self) -> &str {
        &self.rpc.server_url
    }

    /// The app's id; `create` makes the app when missing, otherwise a
    /// missing app is `None`.
    async fn app_id(&self, create: bool) -> Result<Option<String>, ModalError> {
        if let Some(id) = self.app_id.get() {
            return Ok(Some(id.clone()));
        }
        let creation = if create {
            pb::ObjectCreationType::CreateIfMissing
        } else {
            pb::ObjectCreationType::Unspecified
        };
        let msg = pb::AppGetOrCreateRequest {
            app_name: APP_NAME.to_string(),
            environment_name: self.rpc.environment.clone(),
            object_creation_type: creation as i32,
        };
        let resp = self
            .rpc
            .call(
                "AppGetOrCreate",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.app_get_or_create(r).await },
            )
            .await;
        match resp {
            Ok(resp) => {
                let _ = self.app_id.set(resp.app_id.clone());
                Ok(Some(resp.app_id))
            }
            Err(e) if !create && e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The image id of a registry image, built by the service if needed.
    async fn registry_image(&self, app_id: &str, tag: &str) -> Result<String, ModalError> {
        if tag.trim().is_empty() || tag.contains(['\n', '\r']) {
            return Err(ModalError::BadRequest(format!("image {tag:?}")));
        }
        let msg = pb::ImageGetOrCreateRequest {
            image: Some(pb::Image {
                dockerfile_commands: vec![format!("FROM {tag}")],
            }),
            app_id: app_id.to_string(),
            namespace: pb::DeploymentNamespace::Workspace as i32,
            builder_version: IMAGE_BUILDER_VERSION.to_string(),
        };
        let resp = self
            .rpc
            .call(
                "ImageGetOrCreate",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.image_get_or_create(r).await },
            )
            .await?;
        let image_id = resp.image_id;
        let mut result = resp
            .result
            .filter(|r| r.status() != GenericStatus::Unspecified);
        let started = Instant::now();
        let mut last_entry_id = String::new();
        while result.is_none() {
            if started.elapsed() > IMAGE_BUILD_LIMIT {
                return Err(ModalError::Failed {
                    call: "ImageJoinStreaming",
                    message: format!("image {tag} not built within {IMAGE_BUILD_LIMIT:?}"),
                });
            }
            let msg = pb::ImageJoinStreamingRequest {
                image_id: image_id.clone(),
                timeout: POLL_SECS,
                last_entry_id: last_entry_id.clone(),
            };
            let mut stream = self
                .rpc
                .call(
                    "ImageJoinStreaming",
                    Retry::Yes,
                    POLL_DEADLINE,
                    msg,
                    |mut c, r| async move { c.image_join_streaming(r).await },
                )
                .await?;
            loop {
                let next = tokio::time::timeout(POLL_DEADLINE, stream.message()).await;
                let Ok(Ok(Some(item))) = next else {
                    // End of this poll, or a broken stream: poll again
                    // from the last entry seen.
                    break;
                };
                if !item.entry_id.is_empty() {
                    last_entry_id = item.entry_id;
                }
                if let Some(r) = item
                    .result
                    .filter(|r| r.status() != GenericStatus::Unspecified)
                {
                    result = Some(r);
                    break;
                }
                if item.eof {
                    break;
                }
            }
        }
        match result {
            Some(r) if r.status() == GenericStatus::Success => Ok(image_id),
            Some(r) => Err(ModalError::Failed {
                call: "ImageGetOrCreate",
                message: format!("image {tag}: {}", describe(&r)),
            }),
            None => unreachable_result(),
        }
    }

    /// An app-owned secret holding `env`, for every command of a sandbox.
    async fn env_secret(
        &self,
        app_id: &str,
        env: &[(String, String)],
    ) -> Result<String, ModalError> {
        let msg = pb::SecretGetOrCreateRequest {
            environment_name: self.rpc.environment.clone(),
            object_creation_type: pb::ObjectCreationType::AnonymousOwnedByApp as i32,
            env_dict: env.iter().cloned().collect(),
            app_id: app_id.to_string(),
        };
        let resp = self
            .rpc
            .call(
                "SecretGetOrCreate",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.secret_get_or_create(r).await },
            )
            .await?;
        Ok(resp.secret_id)
    }

    /// Waits until the sandbox has a running task; returns the task id.
    async fn wait_ready(&self, id: &str, limit: Duration) -> Result<String, ModalError> {
        if let Some(task) = self.cached_task(id) {
            return Ok(task);
        }
        let started = Instant::now();
        loop {
            let msg = pb::SandboxGetTaskIdRequest {
                sandbox_id: id.to_string(),
                timeout: Some(POLL_SECS),
                wait_until_ready: true,
            };
            let resp = self
                .rpc
                .call(
                    "SandboxGetTaskId",
                    Retry::Yes,
                    POLL_DEADLINE,
                    msg,
                    |mut c, r| async move { c.sandbox_get_task_id(r).await },
                )
                .await?;
            if let Some(result) = resp.task_result.filter(|r| {
                !matches!(
                    r.status(),
                    GenericStatus::Unspecified | GenericStatus::Success
                )
            }) {
                self.forget_task(id);
                return Err(ModalError::SandboxGone {
                    id: id.to_string(),
                    state: describe(&result),
                });
            }
            if let Some(task) = resp.task_id.filter(|t| !t.is_empty()) {
                if let Ok(mut map) = self.task_ids.lock() {
                    map.insert(id.to_string(), task.clone());
                }
                return Ok(task);
            }
            if started.elapsed() > limit {
                return Err(ModalError::Failed {
                    call: "SandboxGetTaskId",
                    message: format!("sandbox {id} not scheduled within {limit:?}"),
                });
            }
            // A poll that came back early must not become a busy loop.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A command the service refused to start (its task not found, or
    /// finished) most likely met a sandbox that has ended: the cached task
    /// is dropped and the sandbox asked again, so the error says so.
    async fn explain_refusal<T>(
        &self,
        id: &str,
        result: Result<T, ModalError>,
    ) -> Result<T, ModalError> {
        match result {
            Err(
                e @ ModalError::Rpc {
                    call: "ContainerExec",
                    code: tonic::Code::NotFound | tonic::Code::FailedPrecondition,
                    ..
                },
            ) => {
                self.forget_task(id);
                self.wait_ready(id, UNARY_DEADLINE).await?;
                Err(e)
            }
            other => other,
        }
    }

    fn cached_task(&self, id: &str) -> Option<String> {
        self.task_ids.lock().ok()?.get(id).cloned()
    }

    fn forget_task(&self, id: &str) {
        if let Ok(mut map) = self.task_ids.lock() {
            map.remove(id);
        }
    }

    /// The sandbox named `name` in the app, if one runs.
    async fn by_name(&self, name: &str) -> Result<String, ModalError> {
        let msg = pb::SandboxGetFromNameRequest {
            sandbox_name: name.to_string(),
            environment_name: self.rpc.environment.clone(),
            app_name: APP_NAME.to_string(),
        };
        let resp = self
            .rpc
            .call(
                "SandboxGetFromName",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_get_from_name(r).await },
            )
            .await?;
        Ok(resp.sandbox_id)
    }

    async fn terminate(&self, id: &str) -> Result<(), ModalError> {
        self.forget_task(id);
        let msg = pb::SandboxTerminateRequest {
            sandbox_id: id.to_string(),
        };
        let resp = self
            .rpc
            .call(
                "SandboxTerminate",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_terminate(r).await },
            )
            .await;
        match resp {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl CloudDriver for ModalDriver {
    type Error = ModalError;

    fn backend(&self) -> &'static str {
        "modal"
    }

    async fn find(
        &self,
        profile: &str,
        task: &str,
        // Modal's sandboxes carry hermes's tags: the list finds them.
        _known: Option<&str>,
    ) -> Result<Option<CloudSandbox>, ModalError> {
        let Some(app_id) = self.app_id(false).await? else {
            return Ok(None);
        };
        let msg = pb::SandboxListRequest {
            app_id,
            before_timestamp: 0.0,
            environment_name: self.rpc.environment.clone(),
            include_finished: false,
            tags: tags(profile, task),
        };
        let resp = self
            .rpc
            .call(
                "SandboxList",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_list(r).await },
            )
            .await?;
        let newest = resp
            .sandboxes
            .into_iter()
            .filter(|s| state_of(s) != CloudState::Dead)
            .max_by(|a, b| a.created_at.total_cmp(&b.created_at));
        Ok(newest.map(|s| CloudSandbox {
            state: state_of(&s),
            id: s.id,
        }))
    }

    async fn create(
        &self,
        spec: &CloudSpec,
        snapshot: Option<&str>,
    ) -> Result<CloudSandbox, ModalError> {
        let Some(app_id) = self.app_id(true).await? else {
            return unreachable_result();
        };
        let image_id = match snapshot {
            Some(image_id) => image_id.to_string(),
            None => self.registry_image(&app_id, &spec.image).await?,
        };
        let secret_ids = if spec.env.is_empty() {
            Vec::new()
        } else {
            vec![self.env_secret(&app_id, &spec.env).await?]
        };
        let name = sandbox_name(&spec.profile, &spec.task);
        let msg = pb::SandboxCreateRequest {
            app_id,
            definition: Some(pb::Sandbox {
                entrypoint_args: vec!["sleep".to_string(), "infinity".to_string()],
                image_id,
                secret_ids,
                resources: Some(resources(spec)),
                timeout_secs: lifetime_secs(spec.lifetime),
                workdir: None,
                name: Some(name.clone()),
                experimental_outbound_policy: outbound_policy(&spec.transforms),
            }),
            environment_name: self.rpc.environment.clone(),
            tags: tags(&spec.profile, &spec.task),
        };
        // Named, so sending it again cannot make a second sandbox: a
        // repeat (or a racing hermes) gets ALREADY_EXISTS and finds it.
        let created = self
            .rpc
            .call(
                "SandboxCreate",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_create(r).await },
            )
            .await;
        let id = match created {
            Ok(resp) => resp.sandbox_id,
            Err(ModalError::Rpc {
                code: tonic::Code::AlreadyExists,
                ..
            }) => {
                tracing::info!(%name, "modal sandbox already exists; using it");
                self.by_name(&name).await?
            }
            Err(e) => return Err(e),
        };
        tracing::info!(sandbox = %id, %name, from_snapshot = snapshot.is_some(), "modal sandbox created");
        if let Err(e) = self.wait_ready(&id, SCHEDULE_LIMIT).await {
            // Nobody will use a sandbox that never became ready.
            if let Err(te) = self.terminate(&id).await {
                tracing::warn!(sandbox = %id, error = %te, "could not terminate a sandbox that failed to start");
            }
            return Err(e);
        }
        Ok(CloudSandbox {
            id,
            state: CloudState::Running,
        })
    }

    async fn resume(&self, id: &str) -> Result<CloudSandbox, ModalError> {
        // Modal sandboxes do not stop: one that still runs is resumed as
        // it is; one that ended is gone (suspend keeps a snapshot instead).
        let msg = pb::SandboxWaitRequest {
            sandbox_id: id.to_string(),
            timeout: 0.0,
        };
        let resp = self
            .rpc
            .call(
                "SandboxWait",
                Retry::Yes,
                UNARY_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_wait(r).await },
            )
            .await?;
        match resp
            .result
            .filter(|r| r.status() != GenericStatus::Unspecified)
        {
            None => {
                self.wait_ready(id, SCHEDULE_LIMIT).await?;
                Ok(CloudSandbox {
                    id: id.to_string(),
                    state: CloudState::Running,
                })
            }
            Some(result) => Err(ModalError::SandboxGone {
                id: id.to_string(),
                state: describe(&result),
            }),
        }
    }

    async fn suspend(&self, id: &str) -> Result<Option<String>, ModalError> {
        let msg = pb::SandboxSnapshotFsRequest {
            sandbox_id: id.to_string(),
            timeout: POLL_SECS,
        };
        let resp = self
            .rpc
            .call(
                "SandboxSnapshotFs",
                Retry::Yes,
                POLL_DEADLINE,
                msg,
                |mut c, r| async move { c.sandbox_snapshot_fs(r).await },
            )
            .await?;
        match resp.result {
            Some(r) if r.status() == GenericStatus::Success && !resp.image_id.is_empty() => {}
            Some(r) => {
                return Err(ModalError::Failed {
                    call: "SandboxSnapshotFs",
                    message: format!("sandbox {id}: {}", describe(&r)),
                });
            }
            None => {
                return Err(ModalError::Failed {
                    call: "SandboxSnapshotFs",
                    message: format!("sandbox {id}: no result"),
                });
            }
        }
        tracing::info!(sandbox = %id, image = %resp.image_id, "modal sandbox snapshotted");
        self.terminate(id).await?;
        Ok(Some(resp.image_id))
    }

    async fn destroy(&self, id: &str) -> Result<(), ModalError> {
        self.terminate(id).await?;
        tracing::info!(sandbox = %id, "modal sandbox terminated");
        Ok(())
    }

    async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<ExecOutcome, ModalError> {
        let task = self.wait_ready(id, UNARY_DEADLINE).await?;
        let result = exec::run(&self.rpc, &task, req, io).await;
        self.explain_refusal(id, result).await
    }

    async fn write_file(&self, id: &str, path: &str, contents: &[u8]) -> Result<(), ModalError> {
        let task = self.wait_ready(id, UNARY_DEADLINE).await?;
        let result = exec::write_file(&self.rpc, id, &task, path, contents).await;
        self.explain_refusal(id, result).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ModalError> {
        let task = self.wait_ready(id, UNARY_DEADLINE).await?;
        let result = exec::read_file(&self.rpc, id, &task, path).await;
        self.explain_refusal(id, result).await
    }
}

/// The sandbox's name in the app: `hermes-<profile>-<task>`, shortened
/// with a hash when longer than Modal's 63 characters.
pub fn sandbox_name(profile: &str, task: &str) -> String {
    let name = SandboxKey::persistent(profile, task).container_name();
    if name.len() <= 63 {
        return name;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hash}", &name[..50])
}

/// The tags that mark a task's sandbox.
fn tags(profile: &str, task: &str) -> Vec<pb::SandboxTag> {
    [
        (LABEL_AGENT, "1".to_string()),
        (LABEL_PROFILE, sanitize(profile)),
        (LABEL_TASK, sanitize(task)),
    ]
    .into_iter()
    .map(|(k, v)| pb::SandboxTag {
        tag_name: k.to_string(),
        tag_value: v,
    })
    .collect()
}

/// The sandbox's outbound policy for `transforms`, none without any: one
/// static header replacement per provider host (no secret, so a `$` in a
/// value is written `$$`, Modal's escape for a literal one).
fn outbound_policy(
    transforms: &[hermes_model::cloud::HeaderTransform],
) -> Option<pb::ExperimentalOutboundPolicy> {
    if transforms.is_empty() {
        return None;
    }
    let mut by_host: std::collections::BTreeMap<&str, std::collections::HashMap<String, String>> =
        std::collections::BTreeMap::new();
    for t in transforms {
        by_host
            .entry(t.host.as_str())
            .or_default()
            .insert(t.header.clone(), t.value.replace('$', "$$"));
    }
    Some(pb::ExperimentalOutboundPolicy {
        header_replacements: by_host
            .into_iter()
            .map(
                |(domain, headers)| pb::experimental_outbound_policy::HeaderReplacement {
                    domain: domain.to_string(),
                    secret_id: String::new(),
                    headers,
                },
            )
            .collect(),
    })
}

fn resources(spec: &CloudSpec) -> pb::Resources {
    let milli_cpu = (spec.cpu * 1000.0).round();
    pb::Resources {
        memory_mb: u32::try_from(spec.memory_mb).unwrap_or(u32::MAX),
        // A float to int cast saturates; NaN becomes 0 (the default).
        milli_cpu: if milli_cpu.is_finite() && milli_cpu > 0.0 {
            milli_cpu as u32
        } else {
            0
        },
    }
}

fn lifetime_secs(lifetime: Duration) -> u32 {
    let lifetime = if lifetime.is_zero() {
        DEFAULT_LIFETIME
    } else {
        lifetime.min(MAX_LIFETIME)
    };
    u32::try_from(lifetime.as_secs().max(1)).unwrap_or(u32::MAX)
}

fn state_of(info: &pb::SandboxInfo) -> CloudState {
    match &info.task_info {
        Some(task) => {
            let ended = task
                .result
                .as_ref()
                .is_some_and(|r| r.status() != GenericStatus::Unspecified);
            if ended || task.finished_at > 0.0 {
                CloudState::Dead
            } else if !task.id.is_empty() || task.started_at > 0.0 {
                CloudState::Running
            } else {
                CloudState::Pending
            }
        }
        None => CloudState::Pending,
    }
}

fn describe(result: &pb::GenericResult) -> String {
    let status = result
        .status()
        .as_str_name()
        .trim_start_matches("GENERIC_STATUS_");
    if result.exception.is_empty() {
        status.to_ascii_lowercase()
    } else {
        format!("{}: {}", status.to_ascii_lowercase(), result.exception)
    }
}

/// For the branches the loop or the creation above rules out.
fn unreachable_result<T>() -> Result<T, ModalError> {
    Err(ModalError::Failed {
        call: "internal",
        message: "no result where one was required".to_string(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lookup(id: &'static str, secret: &'static str) -> impl Fn(&str) -> Option<String> {
        move |name| match name {
            "MODAL_TOKEN_ID" => Some(id.to_string()),
            "MODAL_TOKEN_SECRET" => Some(secret.to_string()),
            _ => None,
        }
    }

    #[test]
    fn a_driver_is_made_outside_a_runtime_and_its_debug_hides_the_token() {
        let driver = ModalDriver::from_env(&lookup("ak-unit-id", "as-unit-secret"), None).unwrap();
        assert_eq!(driver.server_url(), DEFAULT_SERVER_URL);
        let shown = format!("{driver:?}");
        assert!(
            !shown.contains("ak-unit-id") && !shown.contains("as-unit-secret"),
            "{shown}"
        );
    }

    #[test]
    fn a_token_a_header_cannot_carry_is_refused_without_echoing_it() {
        let err = ModalDriver::from_env(&lookup("ak-ok", "as-bad\nsecret"), None).unwrap_err();
        assert!(matches!(err, ModalError::Config(_)), "{err:?}");
        assert!(!err.to_string().contains("as-bad"), "{err}");
    }

    fn spec() -> CloudSpec {
        CloudSpec {
            task: "default".to_string(),
            profile: "default".to_string(),
            image: "python:3.12".to_string(),
            cpu: 1.5,
            memory_mb: 5120,
            disk_mb: 51200,
            lifetime: Duration::ZERO,
            env: Vec::new(),
            transforms: Vec::new(),
        }
    }

    #[test]
    fn names_are_the_container_names_and_fit_modal() {
        assert_eq!(sandbox_name("default", "default"), "hermes-default-default");
        let long = sandbox_name(&"p".repeat(60), &"t".repeat(60));
        assert_eq!(long.len(), 63);
        assert_ne!(long, sandbox_name(&"p".repeat(60), &"t".repeat(61)));
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        );
    }

    #[test]
    fn resources_and_lifetime_come_from_the_spec() {
        let r = resources(&spec());
        assert_eq!((r.milli_cpu, r.memory_mb), (1500, 5120));
        let mut s = spec();
        s.cpu = f64::NAN;
        assert_eq!(resources(&s).milli_cpu, 0);
        assert_eq!(lifetime_secs(Duration::ZERO), 3600);
        assert_eq!(lifetime_secs(Duration::from_secs(300)), 300);
        assert_eq!(lifetime_secs(Duration::from_secs(10 * 86400)), 86400);
    }

    #[test]
    fn transforms_become_static_header_replacements() {
        assert_eq!(outbound_policy(&[]), None);
        let (_, transforms) = hermes_model::cloud::service_side(
            hermes_model::config::Backend::Modal,
            &[("ANTHROPIC_API_KEY".to_string(), "sk-ant-$real".to_string())],
            &|p| Some(format!("{p}-token")),
        );
        let policy = outbound_policy(&transforms).unwrap();
        assert!(!format!("{policy:?}").contains("real"), "{policy:?}");
        assert_eq!(policy.header_replacements.len(), 1);
        let r = &policy.header_replacements[0];
        assert_eq!(r.domain, "api.anthropic.com");
        assert_eq!(r.secret_id, "");
        assert_eq!(
            r.headers,
            [("x-api-key".to_string(), "sk-ant-$$real".to_string())].into()
        );
    }

    #[test]
    fn tags_mark_the_task() {
        let t = tags("my profile", "t1");
        let pairs: Vec<(&str, &str)> = t
            .iter()
            .map(|t| (t.tag_name.as_str(), t.tag_value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("hermes-agent", "1"),
                ("hermes-profile", "my_profile"),
                ("hermes-task-id", "t1")
            ]
        );
    }

    #[test]
    fn states_follow_the_task() {
        let info = |task: Option<pb::TaskInfo>| pb::SandboxInfo {
            id: "sb-1".to_string(),
            task_info: task,
            ..Default::default()
        };
        assert_eq!(state_of(&info(None)), CloudState::Pending);
        let running = pb::TaskInfo {
            id: "ta-1".to_string(),
            started_at: 1.0,
            ..Default::default()
        };
        assert_eq!(state_of(&info(Some(running.clone()))), CloudState::Running);
        let ended = pb::TaskInfo {
            result: Some(pb::GenericResult {
                status: GenericStatus::Terminated as i32,
                ..Default::default()
            }),
            ..running
        };
        assert_eq!(state_of(&info(Some(ended))), CloudState::Dead);
    }
}
