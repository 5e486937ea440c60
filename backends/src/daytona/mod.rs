//! The `daytona` backend: sandboxes on Daytona through its REST API.
//!
//! Follows the Daytona API as published in `daytonaio/daytona` (OpenAPI of
//! `apps/api`, `@daytonaio/api-client` 0.131) and the sandbox daemon's
//! toolbox API (`apps/daemon/pkg/toolbox`):
//!
//! - `GET /sandbox?labels=<json>` (find), `POST /sandbox` (create, from an
//!   image as `buildInfo.dockerfileContent`, or a Daytona snapshot),
//!   `GET /sandbox/{id}`, `POST /sandbox/{id}/start`, `POST
//!   /sandbox/{id}/stop`, `DELETE /sandbox/{id}`, and `GET
//!   /sandbox/{id}/toolbox-proxy-url`, whose `url` + `/{id}` is the base of
//!   the toolbox calls;
//! - toolbox: `POST /process/session`, `POST
//!   /process/session/{sessionId}/exec` (`runAsync`), `GET
//!   …/command/{commandId}/logs?follow=true` (a WebSocket carrying the
//!   log, stdout and stderr behind three-byte markers), `GET
//!   …/command/{commandId}` (the exit code), `DELETE
//!   /process/session/{sessionId}`, `POST /process/execute`, `POST
//!   /files/folder`, `POST /files/upload` (multipart `file`), `GET
//!   /files/download`.
//!
//! Credentials: `DAYTONA_API_KEY` (a Bearer token), and `DAYTONA_API_URL`
//! (default `https://app.daytona.io/api`; plain http only to a loopback
//! host). The sandbox is named `hermes-<task>` and labelled
//! `hermes-agent=1`, `hermes-profile`, `hermes-task`. `suspend` stops it
//! (the stopped sandbox keeps its filesystem and is what `resume` starts
//! again), so it returns no snapshot id.

mod api;
mod demux;
mod exec;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::{Client, RequestBuilder, Response, StatusCode};

use crate::cloud::{CloudDriver, CloudSandbox, CloudSpec, CloudState};
use crate::cloud_http::{
    self, BaseUrlError, BodyError, REQUEST_TIMEOUT, Retry, Secret, path_segment,
};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest};

pub use api::{LABEL_TASK, MAX_DISK_GIB, sandbox_name};

/// The variable holding the API key.
pub const API_KEY_ENV: &str = "DAYTONA_API_KEY";
/// The variable overriding the API's base URL.
pub const API_URL_ENV: &str = "DAYTONA_API_URL";
/// Daytona's hosted API.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";

/// How long `create` and `resume` wait for a sandbox to start.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// How long `suspend` waits for a sandbox to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(300);

/// What went wrong talking to Daytona. Never holds the API key.
#[derive(Debug, thiserror::Error)]
pub enum DaytonaError {
    #[error("{0} is not set: the daytona backend needs a Daytona API key")]
    MissingCredential(&'static str),
    #[error("{API_URL_ENV}: {0}")]
    BaseUrl(#[from] BaseUrlError),
    #[error("the toolbox URL Daytona gave: {0}")]
    ToolboxUrl(BaseUrlError),
    #[error("could not set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("Daytona refused the API key (HTTP {status}) on {what}: check {API_KEY_ENV}")]
    Unauthorized { what: String, status: u16 },
    #[error("Daytona answered HTTP {status} to {what}: {message}")]
    Api {
        what: String,
        status: u16,
        message: String,
    },
    #[error("could not reach Daytona for {what}: {source}")]
    Transport {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Daytona's answer to {what} was not understood: {detail}")]
    Protocol { what: String, detail: String },
    #[error("sandbox {id} is in state {state} and cannot run commands")]
    Failed { id: String, state: String },
    #[error("sandbox {id} was not {wanted} after {secs} s (state {state})")]
    Timeout {
        id: String,
        wanted: &'static str,
        secs: u64,
        state: String,
    },
    #[error("the command is empty")]
    EmptyCommand,
    #[error("{0:?} is not a valid environment variable name")]
    BadEnvName(String),
    #[error("writing the command's output: {0}")]
    Output(#[source] std::io::Error),
}

impl DaytonaError {
    /// The HTTP status of a refused call, if that is what this is.
    pub fn status(&self) -> Option<u16> {
        match self {
            DaytonaError::Api { status, .. } | DaytonaError::Unauthorized { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

/// One Daytona account, as `DAYTONA_API_KEY` opens it.
pub struct DaytonaDriver {
    http: Client,
    api: String,
    key: Secret,
    /// Toolbox base URL per sandbox id.
    toolbox: Mutex<HashMap<String, String>>,
    poll: Duration,
}

impl fmt::Debug for DaytonaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DaytonaDriver")
            .field("api", &self.api)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl DaytonaDriver {
    /// Reads `DAYTONA_API_KEY` and `DAYTONA_API_URL` through `lookup` (the
    /// host environment, then `$HERMES_HOME/.env`).
    pub fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, DaytonaError> {
        let key = lookup(API_KEY_ENV)
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .ok_or(DaytonaError::MissingCredential(API_KEY_ENV))?;
        let url = lookup(API_URL_ENV)
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
        let api = cloud_http::base_url(&url)?;
        let http = cloud_http::client().map_err(DaytonaError::Client)?;
        Ok(DaytonaDriver {
            http,
            api,
            key: Secret::new(key),
            toolbox: Mutex::new(HashMap::new()),
            poll: Duration::from_millis(500),
        })
    }

    /// The API base URL in use.
    pub fn api_url(&self) -> &str {
        &self.api
    }

    /// A request with the key and the ordinary timeout.
    fn request(&self, method: reqwest::Method, url: &str) -> RequestBuilder {
        self.http
            .request(method, url)
            .header(reqwest::header::AUTHORIZATION, self.key.bearer())
            .timeout(REQUEST_TIMEOUT)
    }

    /// Sends with retries; a non-success answer becomes an error.
    async fn call(
        &self,
        what: &str,
        retry: Retry,
        build: &(dyn Fn() -> RequestBuilder + Send + Sync),
    ) -> Result<Response, DaytonaError> {
        let response = self.send(what, retry, build).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(self.refused(what, response).await)
        }
    }

    /// Sends with retries; the answer is returned whatever its status.
    async fn send(
        &self,
        what: &str,
        retry: Retry,
        build: &(dyn Fn() -> RequestBuilder + Send + Sync),
    ) -> Result<Response, DaytonaError> {
        cloud_http::send(what, retry, build)
            .await
            .map_err(|source| DaytonaError::Transport {
                what: what.to_owned(),
                source,
            })
    }

    async fn refused(&self, what: &str, response: Response) -> DaytonaError {
        let status = response.status().as_u16();
        if matches!(status, 401 | 403) {
            return DaytonaError::Unauthorized {
                what: what.to_owned(),
                status,
            };
        }
        DaytonaError::Api {
            what: what.to_owned(),
            status,
            message: cloud_http::error_text(response, &self.key).await,
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        what: &str,
        response: Response,
    ) -> Result<T, DaytonaError> {
        cloud_http::read_json(response).await.map_err(|e| match e {
            BodyError::Transport(source) => DaytonaError::Transport {
                what: what.to_owned(),
                source,
            },
            BodyError::Json(e) => DaytonaError::Protocol {
                what: what.to_owned(),
                detail: e.to_string(),
            },
        })
    }

    async fn get_sandbox(&self, id: &str) -> Result<api::Sandbox, DaytonaError> {
        let url = format!("{}/sandbox/{}", self.api, path_segment(id));
        let response = self
            .call("get sandbox", Retry::Idempotent, &|| {
                self.request(reqwest::Method::GET, &url)
            })
            .await?;
        Self::json("get sandbox", response).await
    }

    /// Polls until the sandbox is `wanted` (started or stopped).
    async fn wait_for(
        &self,
        id: &str,
        wanted: CloudState,
        limit: Duration,
    ) -> Result<CloudSandbox, DaytonaError> {
        let deadline = Instant::now() + limit;
        loop {
            let sandbox = self.get_sandbox(id).await?;
            let state = sandbox.cloud_state();
            let name = sandbox.state.clone().unwrap_or_default();
            if state == wanted {
                return Ok(CloudSandbox {
                    id: sandbox.id,
                    state,
                });
            }
            if state == CloudState::Dead {
                return Err(DaytonaError::Failed {
                    id: id.to_owned(),
                    state: name,
                });
            }
            if Instant::now() >= deadline {
                return Err(DaytonaError::Timeout {
                    id: id.to_owned(),
                    wanted: if wanted == CloudState::Running {
                        "started"
                    } else {
                        "stopped"
                    },
                    secs: limit.as_secs(),
                    state: name,
                });
            }
            tracing::debug!(sandbox = id, state = %name, "waiting for the sandbox");
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn list(&self, profile: &str, task: &str) -> Result<Vec<api::Sandbox>, DaytonaError> {
        let labels = api::labels(profile, task);
        let filter = serde_json::to_string(&labels).map_err(|e| DaytonaError::Protocol {
            what: "list sandboxes".to_owned(),
            detail: e.to_string(),
        })?;
        let url = format!("{}/sandbox", self.api);
        let response = self
            .call("list sandboxes", Retry::Idempotent, &|| {
                self.request(reqwest::Method::GET, &url).query(&[
                    ("labels", filter.as_str()),
                    ("page", "1"),
                    ("limit", "100"),
                ])
            })
            .await?;
        let list: api::SandboxList = Self::json("list sandboxes", response).await?;
        Ok(list
            .into_items()
            .into_iter()
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .filter(|s| s.state.as_deref() != Some("destroyed"))
            .collect())
    }

    async fn start(&self, id: &str) -> Result<(), DaytonaError> {
        let url = format!("{}/sandbox/{}/start", self.api, path_segment(id));
        self.call("start sandbox", Retry::Idempotent, &|| {
            self.request(reqwest::Method::POST, &url)
        })
        .await?;
        Ok(())
    }

    /// The toolbox base URL of sandbox `id`, asked once per sandbox.
    async fn toolbox_base(&self, id: &str) -> Result<String, DaytonaError> {
        if let Some(found) = self.toolbox_cache().get(id) {
            return Ok(found.clone());
        }
        let url = format!(
            "{}/sandbox/{}/toolbox-proxy-url",
            self.api,
            path_segment(id)
        );
        let response = self
            .call("get the toolbox URL", Retry::Idempotent, &|| {
                self.request(reqwest::Method::GET, &url)
            })
            .await?;
        let proxy: api::ToolboxProxyUrl = Self::json("get the toolbox URL", response).await?;
        let base = cloud_http::base_url(&proxy.url).map_err(DaytonaError::ToolboxUrl)?;
        let base = format!("{base}/{}", path_segment(id));
        self.toolbox_cache().insert(id.to_owned(), base.clone());
        Ok(base)
    }

    fn toolbox_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A panic while holding this lock leaves a plain map behind: still
        // usable.
        self.toolbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates the parent folder of `path` then uploads `contents` there.
    /// Uploads `contents` to `path`, its parent folder made first with
    /// `dir_mode` (octal, as the toolbox takes it).
    async fn upload(
        &self,
        toolbox: &str,
        path: &str,
        contents: &[u8],
        dir_mode: &str,
    ) -> Result<(), DaytonaError> {
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !parent.is_empty() {
                let url = format!("{toolbox}/files/folder");
                self.call("create a folder", Retry::Idempotent, &|| {
                    self.request(reqwest::Method::POST, &url)
                        .query(&[("path", parent), ("mode", dir_mode)])
                })
                .await?;
            }
        }
        let url = format!("{toolbox}/files/upload");
        let name = path.rsplit('/').next().unwrap_or("file").to_owned();
        self.call("upload a file", Retry::Idempotent, &|| {
            let part = reqwest::multipart::Part::bytes(contents.to_vec()).file_name(name.clone());
            self.request(reqwest::Method::POST, &url)
                .query(&[("path", path)])
                .multipart(reqwest::multipart::Form::new().part("file", part))
        })
        .await?;
        Ok(())
    }
}

impl CloudDriver for DaytonaDriver {
    type Error = DaytonaError;

    fn backend(&self) -> &'static str {
        "daytona"
    }

    async fn find(
        &self,
        profile: &str,
        task: &str,
        // Daytona's sandboxes carry hermes's labels: the list finds them.
        _known: Option<&str>,
    ) -> Result<Option<CloudSandbox>, DaytonaError> {
        let found = self.list(profile, task).await?;
        // A running one first, then one that can be resumed, then the rest.
        let rank = |s: &api::Sandbox| match s.cloud_state() {
            CloudState::Running => 0,
            CloudState::Stopped => 1,
            CloudState::Pending => 2,
            CloudState::Dead => 3,
        };
        Ok(found.into_iter().min_by_key(rank).map(|s| CloudSandbox {
            state: s.cloud_state(),
            id: s.id,
        }))
    }

    async fn create(
        &self,
        spec: &CloudSpec,
        snapshot: Option<&str>,
    ) -> Result<CloudSandbox, DaytonaError> {
        let body = api::CreateSandbox::new(spec, snapshot);
        let url = format!("{}/sandbox", self.api);
        // The name is unique per organization: a repeated create answers
        // 409, which means the first one went through.
        let response = self
            .send("create sandbox", Retry::Idempotent, &|| {
                self.request(reqwest::Method::POST, &url).json(&body)
            })
            .await?;
        let id = if response.status() == StatusCode::CONFLICT {
            tracing::info!(name = %body.name, "the sandbox exists already; using it");
            let found = self.find(&spec.profile, &spec.task, None).await?;
            let Some(found) = found else {
                return Err(self.refused("create sandbox", response).await);
            };
            if found.state == CloudState::Stopped {
                self.start(&found.id).await?;
            }
            found.id
        } else if response.status().is_success() {
            let sandbox: api::Sandbox = Self::json("create sandbox", response).await?;
            tracing::info!(sandbox = %sandbox.id, name = %body.name, "created a Daytona sandbox");
            sandbox.id
        } else {
            return Err(self.refused("create sandbox", response).await);
        };
        self.wait_for(&id, CloudState::Running, START_TIMEOUT).await
    }

    async fn resume(&self, id: &str) -> Result<CloudSandbox, DaytonaError> {
        self.start(id).await?;
        self.wait_for(id, CloudState::Running, START_TIMEOUT).await
    }

    async fn suspend(&self, id: &str) -> Result<Option<String>, DaytonaError> {
        let url = format!("{}/sandbox/{}/stop", self.api, path_segment(id));
        self.call("stop sandbox", Retry::Idempotent, &|| {
            self.request(reqwest::Method::POST, &url)
        })
        .await?;
        self.wait_for(id, CloudState::Stopped, STOP_TIMEOUT).await?;
        self.toolbox_cache().remove(id);
        Ok(None)
    }

    async fn destroy(&self, id: &str) -> Result<(), DaytonaError> {
        let url = format!("{}/sandbox/{}", self.api, path_segment(id));
        let response = self
            .send("delete sandbox", Retry::Idempotent, &|| {
                self.request(reqwest::Method::DELETE, &url)
            })
            .await?;
        self.toolbox_cache().remove(id);
        if response.status().is_success() || response.status() == StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(self.refused("delete sandbox", response).await)
        }
    }

    async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<ExecOutcome, DaytonaError> {
        exec::run(self, id, req, io).await
    }

    async fn write_file(&self, id: &str, path: &str, contents: &[u8]) -> Result<(), DaytonaError> {
        let toolbox = self.toolbox_base(id).await?;
        self.upload(&toolbox, path, contents, "755").await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, DaytonaError> {
        let toolbox = self.toolbox_base(id).await?;
        let url = format!("{toolbox}/files/download");
        let response = self
            .call("download a file", Retry::Idempotent, &|| {
                self.request(reqwest::Method::GET, &url)
                    .query(&[("path", path)])
            })
            .await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|source| DaytonaError::Transport {
                what: "download a file".to_owned(),
                source,
            })?;
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_missing_key_is_named() {
        let e = DaytonaDriver::from_env(&|_| None).unwrap_err();
        assert!(e.to_string().contains("DAYTONA_API_KEY"), "{e}");
    }

    #[test]
    fn the_key_never_prints() {
        let d =
            DaytonaDriver::from_env(&|k| (k == API_KEY_ENV).then(|| "dtn_supersecret".to_owned()))
                .unwrap();
        assert_eq!(d.api_url(), DEFAULT_API_URL);
        assert!(!format!("{d:?}").contains("supersecret"));
    }

    #[test]
    fn plain_http_only_to_loopback() {
        let lookup = |url: &'static str| {
            move |k: &str| match k {
                API_KEY_ENV => Some("k".to_owned()),
                API_URL_ENV => Some(url.to_owned()),
                _ => None,
            }
        };
        assert!(DaytonaDriver::from_env(&lookup("http://127.0.0.1:9/api")).is_ok());
        let e = DaytonaDriver::from_env(&lookup("http://daytona.example/api")).unwrap_err();
        assert!(e.to_string().contains("DAYTONA_API_URL"), "{e}");
    }

    #[test]
    fn ids_are_one_path_segment() {
        assert_eq!(path_segment("abc-1_2"), "abc-1_2");
        assert_eq!(path_segment("../x y"), "%2E%2E%2Fx%20y");
    }
}
