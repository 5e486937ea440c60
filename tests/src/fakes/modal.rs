//! A contract fake of Modal's gRPC API: a tonic server on 127.0.0.1,
//! generated from the same `backends/proto/modal_api.proto` the driver
//! speaks (the subset of `modal_proto/api.proto` of modal-labs/modal-client,
//! checked against the `modal` 1.6.4 client), implementing the calls the
//! driver makes with the semantics Modal documents for them.
//!
//! It is a fake because the real service cannot run here (no network
//! beyond loopback, no account), and a *contract* fake because what it
//! does is real: every call checks the auth metadata (`x-modal-token-id`,
//! `x-modal-token-secret`; UNAUTHENTICATED when missing or wrong) and the
//! client headers; a sandbox is a temporary directory with its entrypoint
//! running as a real process group; an exec is a real subprocess in that
//! directory, whose output is streamed in batches as it is produced, whose
//! input arrives indexed, whose exit code is the process's, and whose
//! `timeout_secs` kills its process group; a filesystem snapshot copies the
//! directory into a new image id that a later sandbox starts from.
//!
//! Where it differs from Modal: there is no container, so a sandbox's
//! filesystem is its directory (relative paths and the default working
//! directory are inside it; absolute paths are the host's), and registry
//! images are not pulled (a tag starting with `broken/` fails its build,
//! like an image that cannot be pulled). [`FakeModal::fail_next`] makes the
//! next calls fail with UNAVAILABLE, as a flaky network would. A sandbox's
//! `experimental_outbound_policy` is checked against the rules Modal's
//! client states and kept ([`FakeModal::outbound_policies`]); with no
//! network here, its headers are applied to nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status};

/// The server side generated from the driver's proto.
#[allow(missing_debug_implementations, clippy::all)]
pub mod pb {
    tonic::include_proto!("modal.client");
}

use pb::generic_result::GenericStatus;
use pb::modal_client_server::{ModalClient, ModalClientServer};

/// A running fake; stopped (and every process it started killed) on drop.
#[derive(Debug)]
pub struct FakeModal {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct State {
    token_id: String,
    token_secret: String,
    root: TempDir,
    faults: AtomicU32,
    counter: AtomicU64,
    calls: Mutex<Vec<String>>,
    commands: Mutex<Vec<Vec<String>>>,
    /// The environment of every secret (`NAME=value` lines) and every
    /// exec's input, as received.
    received: Mutex<Vec<u8>>,
    /// The `experimental_outbound_policy` of every sandbox created with
    /// one, in order.
    outbound_policies: Mutex<Vec<pb::ExperimentalOutboundPolicy>>,
    world: Mutex<World>,
}

#[derive(Debug, Default)]
struct World {
    /// App name → id.
    apps: HashMap<String, String>,
    images: HashMap<String, Image>,
    secrets: HashMap<String, HashMap<String, String>>,
    sandboxes: HashMap<String, Sandbox>,
    execs: HashMap<String, Arc<Exec>>,
}

#[derive(Debug, Clone)]
enum Image {
    Registry(String),
    Snapshot(PathBuf),
}

#[derive(Debug)]
struct Sandbox {
    app_id: String,
    name: Option<String>,
    tags: Vec<(String, String)>,
    dir: PathBuf,
    task_id: String,
    env: HashMap<String, String>,
    created_at: f64,
    ended: Option<(GenericStatus, f64)>,
    groups: Vec<i32>,
}

#[derive(Debug)]
struct Exec {
    pgid: i32,
    output: Mutex<Output>,
    changed: Notify,
    input: mpsc::UnboundedSender<(Vec<u8>, bool)>,
    applied_index: Mutex<u64>,
}

#[derive(Debug, Default)]
struct Output {
    stdout: Vec<Vec<u8>>,
    stderr: Vec<Vec<u8>>,
    exit: Option<i32>,
}

impl FakeModal {
    /// Starts a fake on an ephemeral loopback port that accepts only this
    /// token.
    pub async fn start(token_id: &str, token_secret: &str) -> FakeModal {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind the fake's port: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the fake's address: {e}"));
        let state = Arc::new(State {
            token_id: token_id.to_string(),
            token_secret: token_secret.to_string(),
            root: tempfile::tempdir().unwrap_or_else(|e| panic!("the fake's directory: {e}")),
            faults: AtomicU32::new(0),
            counter: AtomicU64::new(0),
            calls: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            outbound_policies: Mutex::new(Vec::new()),
            world: Mutex::new(World::default()),
        });
        let (tx, rx) = oneshot::channel::<()>();
        let service = Service {
            state: state.clone(),
        };
        tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(ModalClientServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                eprintln!("fake modal server: {e}");
            }
        });
        FakeModal {
            addr,
            state,
            shutdown: Some(tx),
        }
    }

    /// `http://127.0.0.1:<port>`, for `MODAL_SERVER_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `n` calls fail with UNAVAILABLE before doing anything.
    pub fn fail_next(&self, n: u32) {
        self.state.faults.store(n, Ordering::SeqCst);
    }

    /// The calls admitted so far (authenticated, not failed by a fault),
    /// by method name, in order.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.state.calls).clone()
    }

    /// The command line of every exec started, in order.
    pub fn commands(&self) -> Vec<Vec<String>> {
        lock(&self.state.commands).clone()
    }

    /// What reached the service of the sandboxes' environment: every
    /// secret's values (`NAME=value` lines) and every exec's input, joined.
    pub fn received(&self) -> Vec<u8> {
        lock(&self.state.received).clone()
    }

    /// The outbound policy of every sandbox created with one, in order
    /// (its header values are the ones Modal would set outside the
    /// sandbox; they reach neither its environment nor its commands).
    pub fn outbound_policies(&self) -> Vec<pb::ExperimentalOutboundPolicy> {
        lock(&self.state.outbound_policies).clone()
    }

    /// How many injected faults are still to come.
    pub fn faults_left(&self) -> u32 {
        self.state.faults.load(Ordering::SeqCst)
    }

    /// The names of the apps that exist.
    pub fn apps(&self) -> Vec<String> {
        lock(&self.state.world).apps.keys().cloned().collect()
    }

    /// How many sandboxes run now.
    pub fn running(&self) -> usize {
        lock(&self.state.world)
            .sandboxes
            .values()
            .filter(|s| s.ended.is_none())
            .count()
    }

    /// A sandbox's directory (its filesystem).
    pub fn sandbox_dir(&self, id: &str) -> Option<PathBuf> {
        lock(&self.state.world)
            .sandboxes
            .get(id)
            .map(|s| s.dir.clone())
    }

    /// Ends a sandbox as if the service had (a crash, its lifetime).
    pub fn end_sandbox(&self, id: &str) {
        let mut world = lock(&self.state.world);
        end(&mut world, id, GenericStatus::Terminated);
    }
}

impl Drop for FakeModal {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let mut world = lock(&self.state.world);
        let ids: Vec<String> = world.sandboxes.keys().cloned().collect();
        for id in ids {
            end(&mut world, &id, GenericStatus::Terminated);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Marks a sandbox ended and kills every process group it started.
fn end(world: &mut World, id: &str, status: GenericStatus) {
    let Some(sandbox) = world.sandboxes.get_mut(id) else {
        return;
    };
    if sandbox.ended.is_none() {
        sandbox.ended = Some((status, now()));
    }
    for pgid in sandbox.groups.drain(..) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

fn result(status: GenericStatus, exception: &str) -> pb::GenericResult {
    pb::GenericResult {
        status: status as i32,
        exception: exception.to_string(),
        exitcode: 0,
    }
}

#[derive(Debug)]
struct Service {
    state: Arc<State>,
}

impl Service {
    /// Faults first (as the network would fail), then the auth and client
    /// metadata, then the call is logged.
    fn admit<T>(&self, req: &Request<T>, name: &str) -> Result<(), Status> {
        let faulted = self
            .state
            .faults
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if faulted {
            return Err(Status::unavailable("injected fault: service unavailable"));
        }
        let md = req.metadata();
        let header = |key: &str| md.get(key).and_then(|v| v.to_str().ok());
        match (header("x-modal-token-id"), header("x-modal-token-secret")) {
            (Some(id), Some(secret))
                if id == self.state.token_id && secret == self.state.token_secret => {}
            (None, _) | (_, None) => return Err(Status::unauthenticated("Token missing")),
            _ => return Err(Status::unauthenticated("Token validation failed")),
        }
        if header("x-modal-client-type").is_none() || header("x-modal-client-version").is_none() {
            return Err(Status::invalid_argument("missing client headers"));
        }
        lock(&self.state.calls).push(name.to_string());
        Ok(())
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.state.counter.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}-{n:06}")
    }

    fn sandbox_of_task(world: &World, task_id: &str) -> Result<String, Status> {
        world
            .sandboxes
            .iter()
            .find(|(_, s)| s.task_id == task_id)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| Status::not_found(format!("task {task_id} not found")))
    }

    fn exec_of(&self, exec_id: &str) -> Result<Arc<Exec>, Status> {
        lock(&self.state.world)
            .execs
            .get(exec_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("exec {exec_id} not found")))
    }
}

/// Copies a directory's content into another (made if missing).
async fn copy_dir(from: &Path, to: &Path) -> Result<(), Status> {
    tokio::fs::create_dir_all(to)
        .await
        .map_err(|e| Status::internal(format!("mkdir: {e}")))?;
    let status = tokio::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .await
        .map_err(|e| Status::internal(format!("cp: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Status::internal("copying the filesystem failed"))
    }
}

/// Starts `argv` as its own process group in `dir`.
fn spawn(
    argv: &[String],
    dir: &Path,
    env: &HashMap<String, String>,
    piped: bool,
) -> Result<tokio::process::Child, Status> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Status::invalid_argument("empty command"));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", dir)
        .envs(env)
        .process_group(0)
        .kill_on_drop(false)
        .stdin(if piped { Stdio::piped() } else { Stdio::null() })
        .stdout(if piped { Stdio::piped() } else { Stdio::null() })
        .stderr(if piped { Stdio::piped() } else { Stdio::null() });
    cmd.spawn()
        .map_err(|e| Status::failed_precondition(format!("cannot start {program}: {e}")))
}

type Stream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl ModalClient for Service {
    async fn app_get_or_create(
        &self,
        request: Request<pb::AppGetOrCreateRequest>,
    ) -> Result<Response<pb::AppGetOrCreateResponse>, Status> {
        self.admit(&request, "AppGetOrCreate")?;
        let req = request.into_inner();
        let create = req.object_creation_type() == pb::ObjectCreationType::CreateIfMissing;
        let new_id = self.new_id("ap");
        let mut world = lock(&self.state.world);
        let app_id = match world.apps.get(&req.app_name) {
            Some(id) => id.clone(),
            None if create => {
                world.apps.insert(req.app_name.clone(), new_id.clone());
                new_id
            }
            None => {
                return Err(Status::not_found(format!(
                    "App '{}' not found",
                    req.app_name
                )));
            }
        };
        Ok(Response::new(pb::AppGetOrCreateResponse { app_id }))
    }

    async fn image_get_or_create(
        &self,
        request: Request<pb::ImageGetOrCreateRequest>,
    ) -> Result<Response<pb::ImageGetOrCreateResponse>, Status> {
        self.admit(&request, "ImageGetOrCreate")?;
        let req = request.into_inner();
        let mut world = lock(&self.state.world);
        if !world.apps.values().any(|id| *id == req.app_id) {
            return Err(Status::not_found("app not found"));
        }
        let commands = req.image.map(|i| i.dockerfile_commands).unwrap_or_default();
        let tag = match commands.as_slice() {
            [only] => only.strip_prefix("FROM ").map(str::to_string),
            _ => None,
        }
        .ok_or_else(|| Status::invalid_argument("expected one FROM command"))?;
        if req.builder_version.is_empty() {
            return Err(Status::invalid_argument("builder_version missing"));
        }
        let image_id = self.new_id("im");
        world.images.insert(image_id.clone(), Image::Registry(tag));
        // The build is reported by ImageJoinStreaming.
        Ok(Response::new(pb::ImageGetOrCreateResponse {
            image_id,
            result: None,
        }))
    }

    type ImageJoinStreamingStream = Stream<pb::ImageJoinStreamingResponse>;

    async fn image_join_streaming(
        &self,
        request: Request<pb::ImageJoinStreamingRequest>,
    ) -> Result<Response<Self::ImageJoinStreamingStream>, Status> {
        self.admit(&request, "ImageJoinStreaming")?;
        let req = request.into_inner();
        let image = lock(&self.state.world).images.get(&req.image_id).cloned();
        let outcome = match image {
            None => return Err(Status::not_found("image not found")),
            Some(Image::Registry(tag)) if tag.starts_with("broken/") => result(
                GenericStatus::Failure,
                &format!("Image build failed: pull access denied for {tag}"),
            ),
            Some(_) => result(GenericStatus::Success, ""),
        };
        let (tx, rx) = mpsc::channel(2);
        let _ = tx
            .send(Ok(pb::ImageJoinStreamingResponse {
                result: Some(outcome),
                entry_id: "1".to_string(),
                eof: true,
            }))
            .await;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn secret_get_or_create(
        &self,
        request: Request<pb::SecretGetOrCreateRequest>,
    ) -> Result<Response<pb::SecretGetOrCreateResponse>, Status> {
        self.admit(&request, "SecretGetOrCreate")?;
        let req = request.into_inner();
        let secret_id = self.new_id("st");
        {
            let mut received = lock(&self.state.received);
            for (k, v) in &req.env_dict {
                received.extend_from_slice(format!("{k}={v}\n").as_bytes());
            }
        }
        lock(&self.state.world)
            .secrets
            .insert(secret_id.clone(), req.env_dict.into_iter().collect());
        Ok(Response::new(pb::SecretGetOrCreateResponse { secret_id }))
    }

    async fn sandbox_create(
        &self,
        request: Request<pb::SandboxCreateRequest>,
    ) -> Result<Response<pb::SandboxCreateResponse>, Status> {
        self.admit(&request, "SandboxCreate")?;
        let req = request.into_inner();
        let def = req
            .definition
            .ok_or_else(|| Status::invalid_argument("definition missing"))?;
        if let Some(policy) = &def.experimental_outbound_policy {
            check_outbound_policy(policy)?;
        }
        let id = self.new_id("sb");
        let dir = self.state.root.path().join(&id);
        let (image, env) =
            {
                let world = lock(&self.state.world);
                if !world.apps.values().any(|a| *a == req.app_id) {
                    return Err(Status::not_found("app not found"));
                }
                if let Some(name) = &def.name {
                    let taken = world.sandboxes.values().any(|s| {
                        s.app_id == req.app_id && s.ended.is_none() && s.name.as_ref() == Some(name)
                    });
                    if taken {
                        return Err(Status::already_exists(format!(
                            "a running Sandbox named '{name}' already exists"
                        )));
                    }
                }
                let image = world.images.get(&def.image_id).cloned().ok_or_else(|| {
                    Status::not_found(format!("image {} not found", def.image_id))
                })?;
                let mut env = HashMap::new();
                for secret_id in &def.secret_ids {
                    let values = world.secrets.get(secret_id).ok_or_else(|| {
                        Status::not_found(format!("secret {secret_id} not found"))
                    })?;
                    env.extend(values.clone());
                }
                (image, env)
            };
        match image {
            Image::Snapshot(from) => copy_dir(&from, &dir).await?,
            Image::Registry(_) => tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| Status::internal(format!("mkdir: {e}")))?,
        }
        let entry = if def.entrypoint_args.is_empty() {
            vec!["sleep".to_string(), "infinity".to_string()]
        } else {
            def.entrypoint_args.clone()
        };
        let child = spawn(&entry, &dir, &env, false)?;
        if let Some(policy) = def.experimental_outbound_policy.clone() {
            lock(&self.state.outbound_policies).push(policy);
        }
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let task_id = self.new_id("ta");
        {
            let mut world = lock(&self.state.world);
            world.sandboxes.insert(
                id.clone(),
                Sandbox {
                    app_id: req.app_id,
                    name: def.name,
                    tags: req
                        .tags
                        .into_iter()
                        .map(|t| (t.tag_name, t.tag_value))
                        .collect(),
                    dir,
                    task_id,
                    env,
                    created_at: now(),
                    ended: None,
                    groups: vec![pgid],
                },
            );
        }
        // The entrypoint's end, or the lifetime, ends the sandbox.
        let state = self.state.clone();
        let sandbox_id = id.clone();
        let lifetime = Duration::from_secs(u64::from(def.timeout_secs.max(1)));
        tokio::spawn(async move {
            let mut child = child;
            let status = tokio::select! {
                _ = child.wait() => GenericStatus::Success,
                _ = tokio::time::sleep(lifetime) => GenericStatus::Timeout,
            };
            let mut world = lock(&state.world);
            end(&mut world, &sandbox_id, status);
        });
        Ok(Response::new(pb::SandboxCreateResponse { sandbox_id: id }))
    }

    async fn sandbox_get_from_name(
        &self,
        request: Request<pb::SandboxGetFromNameRequest>,
    ) -> Result<Response<pb::SandboxGetFromNameResponse>, Status> {
        self.admit(&request, "SandboxGetFromName")?;
        let req = request.into_inner();
        let world = lock(&self.state.world);
        let app_id = world
            .apps
            .get(&req.app_name)
            .ok_or_else(|| Status::not_found("app not found"))?;
        let id = world
            .sandboxes
            .iter()
            .find(|(_, s)| {
                s.app_id == *app_id
                    && s.ended.is_none()
                    && s.name.as_deref() == Some(&req.sandbox_name)
            })
            .map(|(id, _)| id.clone())
            .ok_or_else(|| Status::not_found("sandbox not found"))?;
        Ok(Response::new(pb::SandboxGetFromNameResponse {
            sandbox_id: id,
        }))
    }

    async fn sandbox_get_task_id(
        &self,
        request: Request<pb::SandboxGetTaskIdRequest>,
    ) -> Result<Response<pb::SandboxGetTaskIdResponse>, Status> {
        self.admit(&request, "SandboxGetTaskId")?;
        let req = request.into_inner();
        let world = lock(&self.state.world);
        let sandbox = world
            .sandboxes
            .get(&req.sandbox_id)
            .ok_or_else(|| Status::not_found("sandbox not found"))?;
        let resp = match sandbox.ended {
            Some((status, _)) => pb::SandboxGetTaskIdResponse {
                task_id: None,
                task_result: Some(result(status, "")),
            },
            None => pb::SandboxGetTaskIdResponse {
                task_id: Some(sandbox.task_id.clone()),
                task_result: None,
            },
        };
        Ok(Response::new(resp))
    }

    async fn sandbox_list(
        &self,
        request: Request<pb::SandboxListRequest>,
    ) -> Result<Response<pb::SandboxListResponse>, Status> {
        self.admit(&request, "SandboxList")?;
        let req = request.into_inner();
        let world = lock(&self.state.world);
        let mut sandboxes: Vec<pb::SandboxInfo> = world
            .sandboxes
            .iter()
            .filter(|(_, s)| s.app_id == req.app_id)
            .filter(|(_, s)| req.include_finished || s.ended.is_none())
            .filter(|(_, s)| {
                req.tags.iter().all(|t| {
                    s.tags
                        .iter()
                        .any(|(k, v)| *k == t.tag_name && *v == t.tag_value)
                })
            })
            .map(|(id, s)| pb::SandboxInfo {
                id: id.clone(),
                created_at: s.created_at,
                task_info: Some(pb::TaskInfo {
                    id: s.task_id.clone(),
                    started_at: s.created_at,
                    finished_at: s.ended.map_or(0.0, |(_, at)| at),
                    result: s.ended.map(|(status, _)| result(status, "")),
                    sandbox_id: id.clone(),
                }),
                app_id: s.app_id.clone(),
                tags: s
                    .tags
                    .iter()
                    .map(|(k, v)| pb::SandboxTag {
                        tag_name: k.clone(),
                        tag_value: v.clone(),
                    })
                    .collect(),
                name: s.name.clone().unwrap_or_default(),
            })
            .collect();
        sandboxes.sort_by(|a, b| b.created_at.total_cmp(&a.created_at));
        Ok(Response::new(pb::SandboxListResponse { sandboxes }))
    }

    async fn sandbox_wait(
        &self,
        request: Request<pb::SandboxWaitRequest>,
    ) -> Result<Response<pb::SandboxWaitResponse>, Status> {
        self.admit(&request, "SandboxWait")?;
        let req = request.into_inner();
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs_f32(req.timeout.clamp(0.0, 60.0));
        loop {
            let ended = {
                let world = lock(&self.state.world);
                world
                    .sandboxes
                    .get(&req.sandbox_id)
                    .ok_or_else(|| Status::not_found("sandbox not found"))?
                    .ended
            };
            if let Some((status, _)) = ended {
                return Ok(Response::new(pb::SandboxWaitResponse {
                    result: Some(result(status, "")),
                }));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Response::new(pb::SandboxWaitResponse { result: None }));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn sandbox_terminate(
        &self,
        request: Request<pb::SandboxTerminateRequest>,
    ) -> Result<Response<pb::SandboxTerminateResponse>, Status> {
        self.admit(&request, "SandboxTerminate")?;
        let req = request.into_inner();
        let mut world = lock(&self.state.world);
        let existing = world
            .sandboxes
            .get(&req.sandbox_id)
            .ok_or_else(|| Status::not_found("sandbox not found"))?
            .ended
            .map(|(status, _)| result(status, ""));
        end(&mut world, &req.sandbox_id, GenericStatus::Terminated);
        Ok(Response::new(pb::SandboxTerminateResponse {
            existing_result: existing,
        }))
    }

    async fn sandbox_snapshot_fs(
        &self,
        request: Request<pb::SandboxSnapshotFsRequest>,
    ) -> Result<Response<pb::SandboxSnapshotFsResponse>, Status> {
        self.admit(&request, "SandboxSnapshotFs")?;
        let req = request.into_inner();
        let dir = {
            let world = lock(&self.state.world);
            let sandbox = world
                .sandboxes
                .get(&req.sandbox_id)
                .ok_or_else(|| Status::not_found("sandbox not found"))?;
            if sandbox.ended.is_some() {
                return Ok(Response::new(pb::SandboxSnapshotFsResponse {
                    image_id: String::new(),
                    result: Some(result(
                        GenericStatus::Failure,
                        "Sandbox has already finished",
                    )),
                }));
            }
            sandbox.dir.clone()
        };
        let image_id = self.new_id("im");
        let to = self.state.root.path().join(format!("snapshot-{image_id}"));
        copy_dir(&dir, &to).await?;
        lock(&self.state.world)
            .images
            .insert(image_id.clone(), Image::Snapshot(to));
        Ok(Response::new(pb::SandboxSnapshotFsResponse {
            image_id,
            result: Some(result(GenericStatus::Success, "")),
        }))
    }

    async fn container_exec(
        &self,
        request: Request<pb::ContainerExecRequest>,
    ) -> Result<Response<pb::ContainerExecResponse>, Status> {
        self.admit(&request, "ContainerExec")?;
        let req = request.into_inner();
        let (sandbox_id, dir, mut env) = {
            let world = lock(&self.state.world);
            let sandbox_id = Self::sandbox_of_task(&world, &req.task_id)?;
            let sandbox = &world.sandboxes[&sandbox_id];
            if sandbox.ended.is_some() {
                return Err(Status::failed_precondition("the sandbox has finished"));
            }
            (sandbox_id, sandbox.dir.clone(), sandbox.env.clone())
        };
        {
            let world = lock(&self.state.world);
            for secret_id in &req.secret_ids {
                let values = world
                    .secrets
                    .get(secret_id)
                    .ok_or_else(|| Status::not_found("secret not found"))?;
                env.extend(values.clone());
            }
        }
        let cwd = match &req.workdir {
            Some(w) if w.starts_with('/') => PathBuf::from(w),
            Some(w) => dir.join(w),
            None => dir.clone(),
        };
        lock(&self.state.commands).push(req.command.clone());
        let mut child = spawn(&req.command, &cwd, &env, true)?;
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let exec_id = self.new_id("ex");
        let (input_tx, mut input_rx) = mpsc::unbounded_channel::<(Vec<u8>, bool)>();
        let exec = Arc::new(Exec {
            pgid,
            output: Mutex::new(Output::default()),
            changed: Notify::new(),
            input: input_tx,
            applied_index: Mutex::new(0),
        });
        {
            let mut world = lock(&self.state.world);
            if let Some(sandbox) = world.sandboxes.get_mut(&sandbox_id) {
                sandbox.groups.push(pgid);
            }
            world.execs.insert(exec_id.clone(), exec.clone());
        }

        // Input, in order, until end of input.
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                while let Some((bytes, eof)) = input_rx.recv().await {
                    if stdin.write_all(&bytes).await.is_err() || eof {
                        break;
                    }
                }
            });
        }
        // Output, one batch per read, as it comes.
        let reader = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>, err: bool| {
            let exec = exec.clone();
            tokio::spawn(async move {
                let Some(mut pipe) = pipe else { return };
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    {
                        let mut out = lock(&exec.output);
                        let batches = if err {
                            &mut out.stderr
                        } else {
                            &mut out.stdout
                        };
                        batches.push(buf[..n].to_vec());
                    }
                    exec.changed.notify_waiters();
                }
            })
        };
        let out_task = reader(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            false,
        );
        let err_task = reader(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            true,
        );
        let timeout = Duration::from_secs(u64::from(req.timeout_secs));
        let waiter = exec.clone();
        tokio::spawn(async move {
            let status = if timeout.is_zero() {
                child.wait().await
            } else {
                match tokio::time::timeout(timeout, child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        let _ = killpg(Pid::from_raw(waiter.pgid), Signal::SIGKILL);
                        child.wait().await
                    }
                }
            };
            let code = match status {
                Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
                Err(_) => -1,
            };
            // Output written just before the exit still belongs to it; a
            // background child holding the pipes does not hold the exit.
            let _ = tokio::time::timeout(Duration::from_millis(500), async {
                let _ = out_task.await;
                let _ = err_task.await;
            })
            .await;
            lock(&waiter.output).exit = Some(code);
            waiter.changed.notify_waiters();
        });
        Ok(Response::new(pb::ContainerExecResponse { exec_id }))
    }

    type ContainerExecGetOutputStream = Stream<pb::RuntimeOutputBatch>;

    async fn container_exec_get_output(
        &self,
        request: Request<pb::ContainerExecGetOutputRequest>,
    ) -> Result<Response<Self::ContainerExecGetOutputStream>, Status> {
        self.admit(&request, "ContainerExecGetOutput")?;
        let req = request.into_inner();
        let fd = req.file_descriptor();
        if !matches!(fd, pb::FileDescriptor::Stdout | pb::FileDescriptor::Stderr) {
            return Err(Status::invalid_argument(
                "file_descriptor must be stdout or stderr",
            ));
        }
        let exec = self.exec_of(&req.exec_id)?;
        let poll = Duration::from_secs_f32(req.timeout.clamp(0.0, 60.0));
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + poll;
            let mut sent = usize::try_from(req.last_batch_index).unwrap_or(usize::MAX);
            loop {
                let notified = exec.changed.notified();
                let (batches, exit) = {
                    let out = lock(&exec.output);
                    let all = if fd == pb::FileDescriptor::Stdout {
                        &out.stdout
                    } else {
                        &out.stderr
                    };
                    (all.get(sent..).unwrap_or_default().to_vec(), out.exit)
                };
                for bytes in batches {
                    sent += 1;
                    let batch = pb::RuntimeOutputBatch {
                        items: vec![pb::RuntimeOutputMessage {
                            file_descriptor: fd as i32,
                            message: String::new(),
                            message_bytes: bytes,
                        }],
                        batch_index: sent as u64,
                        exit_code: None,
                    };
                    if tx.send(Ok(batch)).await.is_err() {
                        return;
                    }
                }
                if let Some(code) = exit {
                    // Everything written before the exit was sent above.
                    let _ = tx
                        .send(Ok(pb::RuntimeOutputBatch {
                            items: Vec::new(),
                            batch_index: sent as u64,
                            exit_code: Some(code),
                        }))
                        .await;
                    return;
                }
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn container_exec_put_input(
        &self,
        request: Request<pb::ContainerExecPutInputRequest>,
    ) -> Result<Response<()>, Status> {
        self.admit(&request, "ContainerExecPutInput")?;
        let req = request.into_inner();
        let exec = self.exec_of(&req.exec_id)?;
        let input = req
            .input
            .ok_or_else(|| Status::invalid_argument("input missing"))?;
        lock(&self.state.received).extend_from_slice(&input.message);
        let mut applied = lock(&exec.applied_index);
        if input.message_index <= *applied {
            // A resent message: already applied.
            return Ok(Response::new(()));
        }
        *applied = input.message_index;
        // The process may be gone; its input then goes nowhere, as on Modal.
        let _ = exec.input.send((input.message, input.eof));
        Ok(Response::new(()))
    }

    async fn container_exec_wait(
        &self,
        request: Request<pb::ContainerExecWaitRequest>,
    ) -> Result<Response<pb::ContainerExecWaitResponse>, Status> {
        self.admit(&request, "ContainerExecWait")?;
        let req = request.into_inner();
        let exec = self.exec_of(&req.exec_id)?;
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs_f32(req.timeout.clamp(0.0, 60.0));
        loop {
            let notified = exec.changed.notified();
            if let Some(code) = lock(&exec.output).exit {
                return Ok(Response::new(pb::ContainerExecWaitResponse {
                    exit_code: Some(code),
                    completed: true,
                }));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Response::new(pb::ContainerExecWaitResponse {
                    exit_code: None,
                    completed: false,
                }));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }
}

/// The rules Modal's client (`modal._outbound_policy`, 1.6.4) states for an
/// outbound policy: a domain is `*`, or a host name that may start with
/// `*.`; each replacement sets at least one header with a token name and a
/// value without control characters (a tab aside); a value naming a
/// secret key (`$KEY`; `$$` is a literal `$`) needs a secret; at most 25
/// headers in all.
fn check_outbound_policy(policy: &pb::ExperimentalOutboundPolicy) -> Result<(), Status> {
    let bad = |what: String| Err(Status::invalid_argument(what));
    let mut total = 0;
    for r in &policy.header_replacements {
        let host = r.domain.strip_prefix("*.").unwrap_or(&r.domain);
        let host_ok = r.domain == "*"
            || (host.contains('.')
                && host.split('.').all(|l| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                }));
        if !host_ok {
            return bad(format!("Invalid domain: {:?}", r.domain));
        }
        if r.headers.is_empty() {
            return bad("`headers` must contain at least one header".to_string());
        }
        for (name, value) in &r.headers {
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+.^_`|~-".contains(&b);
            if name.is_empty() || !name.bytes().all(token) {
                return bad(format!("Invalid header name: {name:?}"));
            }
            if value
                .chars()
                .any(|c| (c < ' ' && c != '\t') || c == '\u{7f}')
            {
                return bad(format!(
                    "Header value for {name:?} must not contain control characters"
                ));
            }
            if r.secret_id.is_empty() && references_key(value) {
                return bad(format!(
                    "Header value for {name:?} references a secret key, but no `secret` was passed"
                ));
            }
        }
        total += r.headers.len();
    }
    if total > 25 {
        return bad("Outbound policy cannot have more than 25 header replacements".to_string());
    }
    Ok(())
}

/// Whether a header value template names a secret key: a `$` (not
/// `$$`) before a letter or `_`.
fn references_key(template: &str) -> bool {
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' {
            match chars.peek() {
                Some('$') => {
                    chars.next();
                }
                Some(n) if n.is_ascii_alphabetic() || *n == '_' => return true,
                _ => {}
            }
        }
    }
    false
}
