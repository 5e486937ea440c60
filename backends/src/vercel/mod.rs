//! The `vercel_sandbox` backend: Vercel Sandbox through its REST API.
//!
//! Follows the Vercel Sandbox API v1 as the official SDK speaks it
//! (`vercel/sandbox`, `packages/vercel-sandbox/src/api-client`, SDK 2.x):
//! `POST /v1/sandboxes` (runtime `node24`, `node22` or `python3.13`,
//! `resources.vcpus`, `timeout` in ms, or `source: {type: "snapshot",
//! snapshotId}`; with header transforms, `networkPolicy: {mode: "custom",
//! allowedDomains, injectionRules: [{domain, headers}]}`), `GET /v1/sandboxes/{id}`, `POST
//! /v1/sandboxes/{id}/cmd` (`command`, `args`, `cwd`, `env`), `GET
//! …/cmd/{cmdId}/logs` (an NDJSON stream of `{stream, data}` lines), `GET
//! …/cmd/{cmdId}?wait=true` (the exit code), `POST
//! /v1/sandboxes/{id}/{cmdId}/kill`, `POST …/fs/write` (a gzipped tar,
//! `x-cwd` the directory it extracts in), `POST …/fs/read`, `POST
//! …/snapshot` (which stops the sandbox) and `POST …/stop`. Every call
//! carries `?teamId=`.
//!
//! Credentials: `VERCEL_OIDC_TOKEN` (team and project from its claims), or
//! `VERCEL_TOKEN` with `VERCEL_PROJECT_ID` and `VERCEL_TEAM_ID`. The API is
//! `https://api.vercel.com`; `VERCEL_API_URL` overrides it (a private
//! deployment, or a test's fake: plain http only to a loopback host).
//!
//! A Vercel sandbox has no name or labels and cannot start again once
//! stopped: `find` asks only about the id the caller recorded when it
//! created the sandbox (`GET /v1/sandboxes/{id}`: running, pending or
//! snapshotting, stopped or failed, or 404 and so none), `suspend`
//! snapshots it and returns the snapshot id, `create` restores from it,
//! `resume` only accepts a sandbox that still runs, `destroy` stops it.

mod api;
mod exec;

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};

use crate::cloud::{CloudDriver, CloudSandbox, CloudSpec, CloudState};
use crate::cloud_http::{
    self, BaseUrlError, BodyError, REQUEST_TIMEOUT, Retry, Secret, path_segment,
};
use crate::exec::{ExecIo, ExecOutcome, ExecRequest};

pub use api::{RUNTIMES, SANDBOX_CWD};

pub const OIDC_TOKEN_ENV: &str = "VERCEL_OIDC_TOKEN";
pub const TOKEN_ENV: &str = "VERCEL_TOKEN";
pub const PROJECT_ID_ENV: &str = "VERCEL_PROJECT_ID";
pub const TEAM_ID_ENV: &str = "VERCEL_TEAM_ID";
pub const API_URL_ENV: &str = "VERCEL_API_URL";
pub const DEFAULT_API_URL: &str = "https://api.vercel.com";

/// How long `create` waits for a sandbox to run.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// What went wrong talking to Vercel. Never holds the token.
#[derive(Debug, thiserror::Error)]
pub enum VercelError {
    #[error("{0} is not set: the vercel_sandbox backend needs it")]
    MissingCredential(&'static str),
    #[error(
        "{OIDC_TOKEN_ENV} is not a Vercel OIDC token (no owner_id/project_id claims); set {PROJECT_ID_ENV} and {TEAM_ID_ENV} with {TOKEN_ENV} instead"
    )]
    BadOidcToken,
    #[error("{API_URL_ENV}: {0}")]
    BaseUrl(#[from] BaseUrlError),
    #[error("could not set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("{0:?} is not a Vercel Sandbox runtime (node24, node22, python3.13)")]
    Runtime(String),
    #[error("Vercel refused the credentials (HTTP {status}) on {what}: check {credential}")]
    Unauthorized {
        what: String,
        status: u16,
        credential: &'static str,
    },
    #[error("Vercel answered HTTP {status} to {what}: {message}")]
    Api {
        what: String,
        status: u16,
        message: String,
    },
    #[error("could not reach Vercel for {what}: {source}")]
    Transport {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Vercel's answer to {what} was not understood: {detail}")]
    Protocol { what: String, detail: String },
    #[error(
        "sandbox {id} is {status}: a stopped Vercel sandbox cannot start again (create one from its snapshot)"
    )]
    NotResumable { id: String, status: String },
    #[error("sandbox {id} is {status} and cannot run commands")]
    Failed { id: String, status: String },
    #[error("sandbox {id} was not running after {secs} s (status {status})")]
    Timeout {
        id: String,
        secs: u64,
        status: String,
    },
    #[error("the command's log stream failed: {code}: {message}")]
    Stream { code: String, message: String },
    #[error("the command is empty")]
    EmptyCommand,
    #[error("packing the file: {0}")]
    Pack(#[source] std::io::Error),
    #[error("writing the command's output: {0}")]
    Output(#[source] std::io::Error),
}

impl VercelError {
    /// The HTTP status of a refused call, if that is what this is.
    pub fn status(&self) -> Option<u16> {
        match self {
            VercelError::Api { status, .. } | VercelError::Unauthorized { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

/// One Vercel project, as its credentials open it.
pub struct VercelDriver {
    http: Client,
    api: String,
    token: Secret,
    /// Which variable the token came from, to name it in errors.
    token_env: &'static str,
    team_id: String,
    project_id: String,
    poll: Duration,
}

impl fmt::Debug for VercelDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VercelDriver")
            .field("api", &self.api)
            .field("token", &self.token)
            .field("team_id", &self.team_id)
            .field("project_id", &self.project_id)
            .finish_non_exhaustive()
    }
}

fn non_empty(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

impl VercelDriver {
    /// Reads the credentials through `lookup` (the host environment, then
    /// `$HERMES_HOME/.env`): `VERCEL_OIDC_TOKEN`, else `VERCEL_TOKEN` with
    /// `VERCEL_PROJECT_ID` and `VERCEL_TEAM_ID`; and `VERCEL_API_URL`.
    pub fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, VercelError> {
        let (token, token_env, team_id, project_id) =
            if let Some(token) = non_empty(lookup, OIDC_TOKEN_ENV) {
                let (team, project) = api::oidc_claims(&token).ok_or(VercelError::BadOidcToken)?;
                let project = project
                    .or_else(|| non_empty(lookup, PROJECT_ID_ENV))
                    .ok_or(VercelError::MissingCredential(PROJECT_ID_ENV))?;
                (token, OIDC_TOKEN_ENV, team, project)
            } else if let Some(token) = non_empty(lookup, TOKEN_ENV) {
                let project = non_empty(lookup, PROJECT_ID_ENV)
                    .ok_or(VercelError::MissingCredential(PROJECT_ID_ENV))?;
                let team = non_empty(lookup, TEAM_ID_ENV)
                    .ok_or(VercelError::MissingCredential(TEAM_ID_ENV))?;
                (token, TOKEN_ENV, team, project)
            } else {
                return Err(VercelError::MissingCredential(
                    "VERCEL_OIDC_TOKEN (or VERCEL_TOKEN)",
                ));
            };
        let url = non_empty(lookup, API_URL_ENV).unwrap_or_else(|| DEFAULT_API_URL.to_owned());
        let api = cloud_http::base_url(&url)?;
        let http = cloud_http::client().map_err(VercelError::Client)?;
        Ok(VercelDriver {
            http,
            api,
            token: Secret::new(token),
            token_env,
            team_id,
            project_id,
            poll: Duration::from_millis(500),
        })
    }

    /// The API base URL in use.
    pub fn api_url(&self) -> &str {
        &self.api
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    /// A request with the token, the team and the ordinary timeout.
    fn request(&self, method: Method, url: &str) -> RequestBuilder {
        self.http
            .request(method, url)
            .header(reqwest::header::AUTHORIZATION, self.token.bearer())
            .query(&[("teamId", self.team_id.as_str())])
            .timeout(REQUEST_TIMEOUT)
    }

    async fn send(
        &self,
        what: &str,
        retry: Retry,
        build: &(dyn Fn() -> RequestBuilder + Send + Sync),
    ) -> Result<Response, VercelError> {
        cloud_http::send(what, retry, build)
            .await
            .map_err(|source| VercelError::Transport {
                what: what.to_owned(),
                source,
            })
    }

    async fn call(
        &self,
        what: &str,
        retry: Retry,
        build: &(dyn Fn() -> RequestBuilder + Send + Sync),
    ) -> Result<Response, VercelError> {
        let response = self.send(what, retry, build).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(self.refused(what, response).await)
        }
    }

    async fn refused(&self, what: &str, response: Response) -> VercelError {
        let status = response.status().as_u16();
        if matches!(status, 401 | 403) {
            return VercelError::Unauthorized {
                what: what.to_owned(),
                status,
                credential: self.token_env,
            };
        }
        VercelError::Api {
            what: what.to_owned(),
            status,
            message: cloud_http::error_text(response, &self.token).await,
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        what: &str,
        response: Response,
    ) -> Result<T, VercelError> {
        cloud_http::read_json(response).await.map_err(|e| match e {
            BodyError::Transport(source) => VercelError::Transport {
                what: what.to_owned(),
                source,
            },
            BodyError::Json(e) => VercelError::Protocol {
                what: what.to_owned(),
                detail: e.to_string(),
            },
        })
    }

    async fn get_sandbox(&self, id: &str) -> Result<api::Sandbox, VercelError> {
        let url = self.url(&format!("/v1/sandboxes/{}", path_segment(id)));
        let response = self
            .call("get sandbox", Retry::Idempotent, &|| {
                self.request(Method::GET, &url)
            })
            .await?;
        Ok(Self::json::<api::SandboxResponse>("get sandbox", response)
            .await?
            .sandbox)
    }

    /// The sandbox `id`, or `None` when the service does not know it (404).
    async fn lookup_sandbox(&self, id: &str) -> Result<Option<api::Sandbox>, VercelError> {
        let url = self.url(&format!("/v1/sandboxes/{}", path_segment(id)));
        let response = self
            .send("get sandbox", Retry::Idempotent, &|| {
                self.request(Method::GET, &url)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(self.refused("get sandbox", response).await);
        }
        Ok(Some(
            Self::json::<api::SandboxResponse>("get sandbox", response)
                .await?
                .sandbox,
        ))
    }

    async fn wait_running(&self, id: &str) -> Result<CloudSandbox, VercelError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let sandbox = self.get_sandbox(id).await?;
            match sandbox.cloud_state() {
                CloudState::Running => {
                    return Ok(CloudSandbox {
                        id: sandbox.id,
                        state: CloudState::Running,
                    });
                }
                CloudState::Dead | CloudState::Stopped => {
                    return Err(VercelError::Failed {
                        id: id.to_owned(),
                        status: sandbox.status,
                    });
                }
                CloudState::Pending if Instant::now() >= deadline => {
                    return Err(VercelError::Timeout {
                        id: id.to_owned(),
                        secs: START_TIMEOUT.as_secs(),
                        status: sandbox.status,
                    });
                }
                CloudState::Pending => tokio::time::sleep(self.poll).await,
            }
        }
    }
}

impl CloudDriver for VercelDriver {
    type Error = VercelError;

    fn backend(&self) -> &'static str {
        "vercel_sandbox"
    }

    async fn find(
        &self,
        _profile: &str,
        _task: &str,
        known: Option<&str>,
    ) -> Result<Option<CloudSandbox>, VercelError> {
        // Vercel sandboxes carry no name or label to find them by: only the
        // id the caller recorded when it created the sandbox.
        let Some(id) = known else {
            return Ok(None);
        };
        Ok(self.lookup_sandbox(id).await?.map(|s| CloudSandbox {
            state: s.cloud_state(),
            id: s.id,
        }))
    }

    async fn create(
        &self,
        spec: &CloudSpec,
        snapshot: Option<&str>,
    ) -> Result<CloudSandbox, VercelError> {
        if snapshot.is_none() && !RUNTIMES.contains(&spec.image.as_str()) {
            return Err(VercelError::Runtime(spec.image.clone()));
        }
        let body = api::CreateSandbox::new(&self.project_id, spec, snapshot);
        let url = self.url("/v1/sandboxes");
        // Not idempotent: a repeated create makes a second sandbox.
        let response = self
            .call("create sandbox", Retry::Once, &|| {
                self.request(Method::POST, &url).json(&body)
            })
            .await?;
        let created: api::SandboxResponse = Self::json("create sandbox", response).await?;
        tracing::info!(sandbox = %created.sandbox.id, from_snapshot = snapshot.is_some(), "created a Vercel sandbox");
        self.wait_running(&created.sandbox.id).await
    }

    async fn resume(&self, id: &str) -> Result<CloudSandbox, VercelError> {
        let sandbox = self.get_sandbox(id).await?;
        match sandbox.cloud_state() {
            CloudState::Running | CloudState::Pending => self.wait_running(id).await,
            _ => Err(VercelError::NotResumable {
                id: id.to_owned(),
                status: sandbox.status,
            }),
        }
    }

    async fn suspend(&self, id: &str) -> Result<Option<String>, VercelError> {
        let url = self.url(&format!("/v1/sandboxes/{}/snapshot", path_segment(id)));
        let response = self
            .call("snapshot sandbox", Retry::Once, &|| {
                self.request(Method::POST, &url)
            })
            .await?;
        let snapshot: api::SnapshotResponse = Self::json("snapshot sandbox", response).await?;
        tracing::info!(sandbox = id, snapshot = %snapshot.snapshot.id, "snapshotted the Vercel sandbox");
        Ok(Some(snapshot.snapshot.id))
    }

    async fn destroy(&self, id: &str) -> Result<(), VercelError> {
        let url = self.url(&format!("/v1/sandboxes/{}/stop", path_segment(id)));
        let response = self
            .send("stop sandbox", Retry::Idempotent, &|| {
                self.request(Method::POST, &url)
            })
            .await?;
        if response.status().is_success() || response.status() == StatusCode::NOT_FOUND {
            return Ok(());
        }
        // A sandbox that is over already (stopped, failed) may be refused a
        // stop: it is as destroyed as it gets.
        if !matches!(response.status().as_u16(), 401 | 403) {
            if let Ok(Some(s)) = self.lookup_sandbox(id).await {
                if s.cloud_state() == CloudState::Dead {
                    return Ok(());
                }
            }
        }
        Err(self.refused("stop sandbox", response).await)
    }

    async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<ExecOutcome, VercelError> {
        exec::run(self, id, req, io).await
    }

    async fn write_file(&self, id: &str, path: &str, contents: &[u8]) -> Result<(), VercelError> {
        let (extract_dir, name) = api::tar_target(path);
        let body = api::gzipped_tar(&name, contents).map_err(VercelError::Pack)?;
        let url = self.url(&format!("/v1/sandboxes/{}/fs/write", path_segment(id)));
        self.call("write a file", Retry::Idempotent, &|| {
            self.request(Method::POST, &url)
                .header(reqwest::header::CONTENT_TYPE, "application/gzip")
                .header("x-cwd", extract_dir.as_str())
                .body(body.clone())
        })
        .await?;
        Ok(())
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, VercelError> {
        let url = self.url(&format!("/v1/sandboxes/{}/fs/read", path_segment(id)));
        let body = serde_json::json!({ "path": path, "cwd": SANDBOX_CWD });
        let response = self
            .call("read a file", Retry::Idempotent, &|| {
                self.request(Method::POST, &url).json(&body)
            })
            .await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|source| VercelError::Transport {
                what: "read a file".to_owned(),
                source,
            })?;
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use base64::Engine as _;

    use super::*;

    fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn credentials_are_named_when_missing() {
        let e = VercelDriver::from_env(&lookup(&[])).unwrap_err();
        assert!(e.to_string().contains("VERCEL_OIDC_TOKEN"), "{e}");
        let e = VercelDriver::from_env(&lookup(&[("VERCEL_TOKEN", "t")])).unwrap_err();
        assert!(e.to_string().contains("VERCEL_PROJECT_ID"), "{e}");
        let e = VercelDriver::from_env(&lookup(&[
            ("VERCEL_TOKEN", "t"),
            ("VERCEL_PROJECT_ID", "p"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("VERCEL_TEAM_ID"), "{e}");
        let e = VercelDriver::from_env(&lookup(&[("VERCEL_OIDC_TOKEN", "opaque")])).unwrap_err();
        assert!(e.to_string().contains("VERCEL_OIDC_TOKEN"), "{e}");
    }

    #[test]
    fn an_oidc_token_names_team_and_project_and_never_prints() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(r#"{"owner_id":"team_9","project_id":"prj_9"}"#);
        let token = format!("eyJhbGciOiJub25lIn0.{payload}.c2lnbmF0dXJl");
        let d = VercelDriver::from_env(&|k| (k == OIDC_TOKEN_ENV).then(|| token.clone())).unwrap();
        assert_eq!(
            (d.team_id.as_str(), d.project_id.as_str()),
            ("team_9", "prj_9")
        );
        assert_eq!(d.api_url(), DEFAULT_API_URL);
        assert!(!format!("{d:?}").contains("c2lnbmF0dXJl"));
    }

    #[test]
    fn the_api_url_can_be_overridden_but_stays_secure() {
        let d = VercelDriver::from_env(&lookup(&[
            ("VERCEL_TOKEN", "t"),
            ("VERCEL_PROJECT_ID", "p"),
            ("VERCEL_TEAM_ID", "team"),
            ("VERCEL_API_URL", "https://sandbox.internal.example/"),
        ]))
        .unwrap();
        assert_eq!(d.api_url(), "https://sandbox.internal.example");
        let e = VercelDriver::from_env(&lookup(&[
            ("VERCEL_TOKEN", "t"),
            ("VERCEL_PROJECT_ID", "p"),
            ("VERCEL_TEAM_ID", "team"),
            ("VERCEL_API_URL", "http://sandbox.internal.example"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("VERCEL_API_URL"), "{e}");
    }
}
