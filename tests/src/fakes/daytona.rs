//! A contract fake of Daytona (the service cannot run here): the REST API
//! of `daytonaio/daytona` `apps/api` (OpenAPI, `@daytonaio/api-client`
//! 0.131) and the sandbox daemon's toolbox (`apps/daemon/pkg/toolbox`),
//! for the endpoints hermes uses.
//!
//! - `/api`: `GET /sandbox?labels=<json>` (a page: `items`, `total`,
//!   `page`, `totalPages`), `POST /sandbox` (200; 409 on a taken name;
//!   400 past the per-sandbox limits of 4 vCPU, 8 GiB memory, 10 GiB disk,
//!   or resources with a snapshot; 404 for a snapshot it does not have), `GET|DELETE /sandbox/{id}`, `POST
//!   /sandbox/{id}/start|stop`, `GET /sandbox/{id}/toolbox-proxy-url`.
//!   A new sandbox answers `creating` and is `started` when next read.
//! - `/toolbox/{id}`: `POST /process/session` (201, 409 when it exists),
//!   `POST /process/session/{s}/exec` (`runAsync`: 202 with `cmdId`),
//!   `GET /process/session/{s}/command/{c}` (`exitCode` once it ended),
//!   `GET …/logs` (plain, or `follow=true` over a WebSocket: the log as it
//!   grows, stdout behind `01 01 01` and stderr behind `02 02 02`, closed
//!   when the command ended), `DELETE /process/session/{s}` (kills its
//!   processes), `POST /process/execute`, `POST /files/folder`, `POST
//!   /files/upload` (multipart `file`), `GET /files/download`. A toolbox
//!   call to a sandbox that is not started answers 400.
//!
//! Every call needs `Authorization: Bearer <key>`: 401 without it or with
//! another key. Commands run as `sh -c` in the sandbox's directory (its
//! working directory and home; relative file paths resolve there) in a
//! process group of their own.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::{
    Body, Faults, Requests, bearer, body_bytes, exit_code, full, json, kill_group, lock,
    query_param,
};

/// The per-sandbox limits of a default Daytona organization.
const MAX_CPU: u64 = 4;
const MAX_MEMORY_GIB: u64 = 8;
const MAX_DISK_GIB: u64 = 10;

/// A running fake; stops serving when dropped (sandbox processes are
/// killed with their sandbox, or when the test process ends).
#[derive(Debug)]
pub struct FakeDaytona {
    pub addr: SocketAddr,
    pub faults: Faults,
    pub requests: Requests,
    state: Arc<State>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Debug)]
struct State {
    key: String,
    addr: Mutex<Option<SocketAddr>>,
    root: tempfile::TempDir,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    commands: Mutex<Vec<String>>,
    /// Every request body, as received.
    received: Mutex<Vec<u8>>,
    /// The Daytona snapshots (images) a sandbox can be created from.
    snapshots: Mutex<Vec<String>>,
    /// `(path, mode)` of every folder made through the toolbox.
    folders: Mutex<Vec<(String, String)>>,
    counter: AtomicU64,
}

impl State {
    /// Keeps a request body in [`State::received`] and hands it back.
    fn keep(&self, body: bytes::Bytes) -> bytes::Bytes {
        lock(&self.received).extend_from_slice(&body);
        body
    }
}

#[derive(Debug)]
struct Sandbox {
    id: String,
    name: String,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    state: &'static str,
    /// Reads of a new sandbox before it shows as started.
    pending_reads: u32,
    dir: PathBuf,
    cpu: u64,
    memory: u64,
    disk: u64,
    sessions: HashMap<String, HashMap<String, Arc<Command>>>,
}

/// One session command: its log as it grows, and how it ended.
#[derive(Debug)]
struct Command {
    id: String,
    command: String,
    log: Mutex<Vec<u8>>,
    exit: Mutex<Option<i64>>,
    pgid: Mutex<Option<u32>>,
    changed: tokio::sync::Notify,
}

impl Command {
    fn ended(&self) -> bool {
        lock(&self.exit).is_some()
    }

    fn kill(&self) {
        if let Some(pgid) = *lock(&self.pgid) {
            kill_group(pgid);
        }
    }
}

impl Sandbox {
    fn dto(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "organizationId": "org-fake",
            "user": "daytona",
            "env": self.env,
            "labels": self.labels,
            "public": false,
            "target": "us",
            "cpu": self.cpu,
            "gpu": 0,
            "memory": self.memory,
            "disk": self.disk,
            "state": self.state,
        })
    }

    fn kill_all(&mut self) {
        for commands in self.sessions.values() {
            for c in commands.values() {
                c.kill();
            }
        }
        self.sessions.clear();
    }
}

impl FakeDaytona {
    /// Serves a fake Daytona that accepts the API key `key`.
    pub fn start(key: &str) -> FakeDaytona {
        let state = Arc::new(State {
            key: key.to_owned(),
            addr: Mutex::new(None),
            root: tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}")),
            sandboxes: Mutex::new(HashMap::new()),
            commands: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            snapshots: Mutex::new(Vec::new()),
            folders: Mutex::new(Vec::new()),
            counter: AtomicU64::new(0),
        });
        let faults = Faults::default();
        let requests = Requests::default();
        let (s, f, r) = (state.clone(), faults.clone(), requests.clone());
        let (addr, stop) = super::serve(move |req| handle(s.clone(), f.clone(), r.clone(), req));
        *lock(&state.addr) = Some(addr);
        FakeDaytona {
            addr,
            faults,
            requests,
            state,
            _stop: stop,
        }
    }

    /// The value for `DAYTONA_API_URL`.
    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// The directory behind a sandbox (its working directory).
    pub fn sandbox_dir(&self, id: &str) -> Option<PathBuf> {
        lock(&self.state.sandboxes).get(id).map(|s| s.dir.clone())
    }

    /// A sandbox's state as the service reports it.
    pub fn sandbox_state(&self, id: &str) -> Option<String> {
        lock(&self.state.sandboxes)
            .get(id)
            .map(|s| s.state.to_owned())
    }

    /// How many sandboxes exist.
    pub fn sandbox_count(&self) -> usize {
        lock(&self.state.sandboxes).len()
    }

    /// The labels of a sandbox.
    pub fn sandbox_labels(&self, id: &str) -> Option<BTreeMap<String, String>> {
        lock(&self.state.sandboxes)
            .get(id)
            .map(|s| s.labels.clone())
    }

    /// Makes `name` a snapshot sandboxes can be created from (none is,
    /// at first: a create from another answers 404).
    pub fn add_snapshot(&self, name: &str) {
        lock(&self.state.snapshots).push(name.to_owned());
    }

    /// Every request body the fake was given (JSON, multipart uploads),
    /// joined: what reached the service.
    pub fn received(&self) -> Vec<u8> {
        lock(&self.state.received).clone()
    }

    /// `(path, mode)` of every folder made through the toolbox, in order.
    pub fn folders(&self) -> Vec<(String, String)> {
        lock(&self.state.folders).clone()
    }

    /// Every session command string the fake was given, in order.
    pub fn commands(&self) -> Vec<String> {
        lock(&self.state.commands).clone()
    }
}

impl Drop for FakeDaytona {
    fn drop(&mut self) {
        for sandbox in lock(&self.state.sandboxes).values_mut() {
            sandbox.kill_all();
        }
    }
}

fn error(status: u16, message: &str) -> Response<Body> {
    json(
        status,
        &json!({ "statusCode": status, "message": message, "error": message }),
    )
}

async fn handle(
    state: Arc<State>,
    faults: Faults,
    requests: Requests,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    requests.record(&method, &path);
    if let Some(fault) = faults.take() {
        return super::fault_response(fault);
    }
    match bearer(&req) {
        Some(key) if key == state.key => {}
        Some(_) => return error(401, "Invalid API key"),
        None => return error(401, "Unauthorized"),
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", rest @ ..] => api(&state, &method, rest, req).await,
        ["toolbox", id, rest @ ..] => {
            let id = (*id).to_owned();
            let rest: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
            toolbox(&state, &id, &method, &rest, req).await
        }
        _ => error(404, "Cannot find route"),
    }
}

async fn api(state: &State, method: &str, rest: &[&str], req: Request<Incoming>) -> Response<Body> {
    match (method, rest) {
        ("GET", ["sandbox"]) => {
            let filter: BTreeMap<String, String> = query_param(&req, "labels")
                .and_then(|l| serde_json::from_str(&l).ok())
                .unwrap_or_default();
            let mut sandboxes = lock(&state.sandboxes);
            let items: Vec<Value> = sandboxes
                .values_mut()
                .filter(|s| filter.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
                .map(|s| {
                    settle(s);
                    s.dto()
                })
                .collect();
            let total = items.len();
            json(
                200,
                &json!({ "items": items, "total": total, "page": 1, "totalPages": 1 }),
            )
        }
        ("POST", ["sandbox"]) => create(state, state.keep(body_bytes(req).await)).await,
        ("GET", ["sandbox", id]) => {
            let mut sandboxes = lock(&state.sandboxes);
            match sandboxes.get_mut(*id) {
                Some(s) => {
                    settle(s);
                    json(200, &s.dto())
                }
                None => error(404, &format!("Sandbox with ID or name {id} not found")),
            }
        }
        ("DELETE", ["sandbox", id]) => match lock(&state.sandboxes).remove(*id) {
            Some(mut s) => {
                s.kill_all();
                full(200, "application/json", "")
            }
            None => error(404, &format!("Sandbox with ID or name {id} not found")),
        },
        ("POST", ["sandbox", id, "start"]) => {
            let mut sandboxes = lock(&state.sandboxes);
            match sandboxes.get_mut(*id) {
                Some(s) => {
                    s.state = "started";
                    s.pending_reads = 0;
                    json(200, &s.dto())
                }
                None => error(404, &format!("Sandbox with ID or name {id} not found")),
            }
        }
        ("POST", ["sandbox", id, "stop"]) => {
            let mut sandboxes = lock(&state.sandboxes);
            match sandboxes.get_mut(*id) {
                Some(s) => {
                    s.kill_all();
                    s.state = "stopped";
                    full(200, "application/json", "")
                }
                None => error(404, &format!("Sandbox with ID or name {id} not found")),
            }
        }
        ("GET", ["sandbox", id, "toolbox-proxy-url"]) => {
            if !lock(&state.sandboxes).contains_key(*id) {
                return error(404, &format!("Sandbox with ID or name {id} not found"));
            }
            let addr = lock(&state.addr).map(|a| a.to_string()).unwrap_or_default();
            json(200, &json!({ "url": format!("http://{addr}/toolbox") }))
        }
        _ => error(404, "Cannot find route"),
    }
}

/// A new sandbox shows as `creating` to the first read, then `started`.
fn settle(s: &mut Sandbox) {
    if s.pending_reads > 0 {
        s.pending_reads -= 1;
    } else if s.state == "creating" {
        s.state = "started";
    }
}

async fn create(state: &State, body: bytes::Bytes) -> Response<Body> {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "invalid JSON body");
    };
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    let resources = ["cpu", "memory", "disk"].map(|k| body[k].as_u64());
    let has_resources = resources.iter().any(Option::is_some);
    if body.get("snapshot").is_some() && body.get("buildInfo").is_some() {
        return error(
            400,
            "Cannot specify a snapshot when using a build info entry",
        );
    }
    if body.get("snapshot").is_some() && has_resources {
        return error(
            400,
            "Cannot specify Sandbox resources when using a snapshot",
        );
    }
    if let Some(snapshot) = body.get("snapshot").and_then(Value::as_str) {
        if !lock(&state.snapshots).iter().any(|s| s == snapshot) {
            return error(404, &format!("Snapshot {snapshot} not found"));
        }
    }
    let [cpu, memory, disk] = resources.map(|r| r.unwrap_or(1));
    if cpu > MAX_CPU {
        return error(
            400,
            &format!("CPU request {cpu} exceeds maximum allowed per-sandbox limit ({MAX_CPU})"),
        );
    }
    if memory > MAX_MEMORY_GIB {
        return error(
            400,
            &format!(
                "Memory request {memory}GB exceeds maximum allowed per-sandbox limit ({MAX_MEMORY_GIB}GB)"
            ),
        );
    }
    if disk > MAX_DISK_GIB {
        return error(
            400,
            &format!(
                "Disk request {disk}GB exceeds maximum allowed per-sandbox limit ({MAX_DISK_GIB}GB)"
            ),
        );
    }
    let labels: BTreeMap<String, String> =
        serde_json::from_value(body["labels"].clone()).unwrap_or_default();
    let env: BTreeMap<String, String> =
        serde_json::from_value(body["env"].clone()).unwrap_or_default();
    let mut sandboxes = lock(&state.sandboxes);
    if !name.is_empty() && sandboxes.values().any(|s| s.name == name) {
        return error(409, &format!("Sandbox with name {name} already exists"));
    }
    let n = state.counter.fetch_add(1, Ordering::SeqCst);
    let id = format!("sbx-{n:04}-fake");
    let dir = state.root.path().join(&id);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return error(500, &format!("creating the sandbox: {e}"));
    }
    let sandbox = Sandbox {
        id: id.clone(),
        name: if name.is_empty() { id.clone() } else { name },
        labels,
        env,
        state: "creating",
        pending_reads: 1,
        dir,
        cpu,
        memory,
        disk,
        sessions: HashMap::new(),
    };
    let dto = sandbox.dto();
    sandboxes.insert(id, sandbox);
    json(200, &dto)
}

/// A path in the sandbox: relative ones resolve in its directory.
fn resolve(dir: &Path, path: &str) -> PathBuf {
    if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        dir.join(path)
    }
}

async fn toolbox(
    state: &State,
    id: &str,
    method: &str,
    rest: &[String],
    req: Request<Incoming>,
) -> Response<Body> {
    let (dir, env) = {
        let sandboxes = lock(&state.sandboxes);
        let Some(s) = sandboxes.get(id) else {
            return error(404, &format!("Sandbox with ID or name {id} not found"));
        };
        if s.state != "started" {
            return error(400, "Sandbox is not started");
        }
        (s.dir.clone(), s.env.clone())
    };
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, rest.as_slice()) {
        ("POST", ["files", "folder"]) => {
            use std::os::unix::fs::PermissionsExt;
            let path = query_param(&req, "path").unwrap_or_default();
            let mode = query_param(&req, "mode").unwrap_or_else(|| "755".to_owned());
            let Ok(bits) = u32::from_str_radix(&mode, 8) else {
                return error(400, &format!("mode {mode} is not octal"));
            };
            lock(&state.folders).push((path.clone(), mode));
            let folder = resolve(&dir, &path);
            match std::fs::create_dir_all(&folder).and_then(|()| {
                std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(bits))
            }) {
                Ok(()) => full(201, "application/json", ""),
                Err(e) => error(400, &e.to_string()),
            }
        }
        ("POST", ["files", "upload"]) => {
            let path = query_param(&req, "path").unwrap_or_default();
            let content_type = req
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = state.keep(body_bytes(req).await);
            let Some(file) = multipart_file(&content_type, &body) else {
                return error(400, "no file in the multipart form");
            };
            match std::fs::write(resolve(&dir, &path), file) {
                Ok(()) => full(200, "application/json", ""),
                Err(e) => error(400, &e.to_string()),
            }
        }
        ("GET", ["files", "download"]) => {
            let path = query_param(&req, "path").unwrap_or_default();
            match std::fs::read(resolve(&dir, &path)) {
                Ok(bytes) => full(200, "application/octet-stream", bytes),
                Err(_) => error(404, "file not found"),
            }
        }
        ("POST", ["process", "execute"]) => {
            let body: Value =
                serde_json::from_slice(&state.keep(body_bytes(req).await)).unwrap_or_default();
            let Some(command) = body["command"].as_str() else {
                return error(400, "command is required");
            };
            let timeout = body["timeout"].as_u64().unwrap_or(360);
            let cwd = body["cwd"]
                .as_str()
                .map_or(dir.clone(), |c| resolve(&dir, c));
            let child = match spawn(command, &cwd, &env, Stdio::null()) {
                Ok(c) => c,
                Err(e) => return error(400, &e.to_string()),
            };
            let output =
                tokio::time::timeout(Duration::from_secs(timeout), child.wait_with_output()).await;
            match output {
                Ok(Ok(out)) => {
                    let mut result = out.stdout;
                    result.extend(out.stderr);
                    json(
                        200,
                        &json!({
                            "exitCode": exit_code(out.status),
                            "result": String::from_utf8_lossy(&result),
                        }),
                    )
                }
                Ok(Err(e)) => error(400, &e.to_string()),
                Err(_) => error(408, "command timed out"),
            }
        }
        ("POST", ["process", "session"]) => {
            let body: Value =
                serde_json::from_slice(&state.keep(body_bytes(req).await)).unwrap_or_default();
            let Some(session) = body["sessionId"].as_str() else {
                return error(400, "sessionId is required");
            };
            let mut sandboxes = lock(&state.sandboxes);
            let Some(s) = sandboxes.get_mut(id) else {
                return error(404, "sandbox not found");
            };
            if s.sessions.contains_key(session) {
                return error(409, "session already exists");
            }
            s.sessions.insert(session.to_owned(), HashMap::new());
            full(201, "application/json", "")
        }
        ("DELETE", ["process", "session", session]) => {
            let mut sandboxes = lock(&state.sandboxes);
            let removed = sandboxes
                .get_mut(id)
                .and_then(|s| s.sessions.remove(*session));
            match removed {
                Some(commands) => {
                    for c in commands.values() {
                        c.kill();
                        c.changed.notify_waiters();
                    }
                    full(204, "application/json", "")
                }
                None => error(404, "session not found"),
            }
        }
        ("POST", ["process", "session", session, "exec"]) => {
            let session = (*session).to_owned();
            let body: Value =
                serde_json::from_slice(&state.keep(body_bytes(req).await)).unwrap_or_default();
            let command = body["command"].as_str().unwrap_or_default().to_owned();
            if command.trim().is_empty() {
                return error(400, "command cannot be empty");
            }
            lock(&state.commands).push(command.clone());
            let run_async = body["runAsync"].as_bool().unwrap_or(false)
                || body["async"].as_bool().unwrap_or(false);
            let n = state.counter.fetch_add(1, Ordering::SeqCst);
            let cmd = Arc::new(Command {
                id: format!("cmd-{n:04}"),
                command: command.clone(),
                log: Mutex::new(Vec::new()),
                exit: Mutex::new(None),
                pgid: Mutex::new(None),
                changed: tokio::sync::Notify::new(),
            });
            {
                let mut sandboxes = lock(&state.sandboxes);
                let Some(commands) = sandboxes
                    .get_mut(id)
                    .and_then(|s| s.sessions.get_mut(&session))
                else {
                    return error(404, "session not found");
                };
                commands.insert(cmd.id.clone(), cmd.clone());
            }
            if let Err(e) = start_command(cmd.clone(), &dir, &env) {
                return error(400, &e.to_string());
            }
            if run_async {
                return json(202, &json!({ "cmdId": cmd.id }));
            }
            loop {
                let notified = cmd.changed.notified();
                if cmd.ended() {
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            }
            let (stdout, stderr) = split_log(&lock(&cmd.log));
            json(
                200,
                &json!({
                    "cmdId": cmd.id,
                    "output": format!("{stdout}{stderr}"),
                    "stdout": stdout,
                    "stderr": stderr,
                    "exitCode": *lock(&cmd.exit),
                }),
            )
        }
        ("GET", ["process", "session", session, "command", cmd_id]) => {
            match find_command(state, id, session, cmd_id) {
                Some(c) => {
                    let mut out = json!({ "id": c.id, "command": c.command });
                    if let Some(code) = *lock(&c.exit) {
                        out["exitCode"] = json!(code);
                    }
                    json(200, &out)
                }
                None => error(404, "command not found"),
            }
        }
        ("GET", ["process", "session", session, "command", cmd_id, "logs"]) => {
            let Some(c) = find_command(state, id, session, cmd_id) else {
                return error(404, "command not found");
            };
            let follow = query_param(&req, "follow").as_deref() == Some("true");
            let upgrade = req
                .headers()
                .get(hyper::header::UPGRADE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
            if upgrade {
                websocket_log(req, c, follow)
            } else {
                let log = lock(&c.log).clone();
                full(200, "text/plain", log)
            }
        }
        _ => error(404, "Cannot find route"),
    }
}

fn find_command(state: &State, id: &str, session: &str, cmd_id: &str) -> Option<Arc<Command>> {
    lock(&state.sandboxes)
        .get(id)?
        .sessions
        .get(session)?
        .get(cmd_id)
        .cloned()
}

fn spawn(
    command: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    stdin: Stdio,
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env("HOME", cwd)
        .envs(env)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn()
}

/// Runs a session command as the daemon does, `{ CMD; }` in the session's
/// shell (here a shell of its own, with an input that stays open), its
/// output labelled into the log as it comes.
fn start_command(
    cmd: Arc<Command>,
    dir: &Path,
    env: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let script = format!("{{ {}\n}}", cmd.command);
    let mut child = spawn(&script, dir, env, Stdio::piped())?;
    *lock(&cmd.pgid) = child.id();
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    tokio::spawn(async move {
        let pump = |mut from: Box<dyn tokio::io::AsyncRead + Unpin + Send>, mark: [u8; 3]| {
            let cmd = cmd.clone();
            async move {
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = from.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut log = lock(&cmd.log);
                    log.extend_from_slice(&mark);
                    log.extend_from_slice(&buf[..n]);
                    drop(log);
                    cmd.changed.notify_waiters();
                }
            }
        };
        let out = stdout.map(|s| tokio::spawn(pump(Box::new(s), [1, 1, 1])));
        let err = stderr.map(|s| tokio::spawn(pump(Box::new(s), [2, 2, 2])));
        let status = child.wait().await;
        drop(stdin);
        for task in [out, err].into_iter().flatten() {
            // A killed command's descendants may hold the pipe: bounded.
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        let code = status.map_or(-1, exit_code);
        *lock(&cmd.exit) = Some(code);
        cmd.changed.notify_waiters();
    });
    Ok(())
}

fn split_log(log: &[u8]) -> (String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut current = &mut out;
    let mut i = 0;
    while i < log.len() {
        if log[i..].starts_with(&[1, 1, 1]) {
            current = &mut out;
            i += 3;
        } else if log[i..].starts_with(&[2, 2, 2]) {
            current = &mut err;
            i += 3;
        } else {
            current.push(log[i]);
            i += 1;
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// The file part of a multipart form.
fn multipart_file(content_type: &str, body: &[u8]) -> Option<Vec<u8>> {
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))?
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let mut parts = split_bytes(body, delimiter.as_bytes());
    parts.find_map(|part| {
        let head_end = find(part, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&part[..head_end]);
        if !head.contains("name=\"file\"") {
            return None;
        }
        let content = &part[head_end + 4..];
        Some(content.strip_suffix(b"\r\n").unwrap_or(content).to_vec())
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn split_bytes<'a>(mut hay: &'a [u8], delimiter: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut out = Vec::new();
    while let Some(at) = find(hay, delimiter) {
        out.push(&hay[..at]);
        hay = &hay[at + delimiter.len()..];
    }
    out.push(hay);
    out.into_iter()
}

/// The follow endpoint: the log over a WebSocket as it grows, closed when
/// the command ended (or at once without `follow`).
fn websocket_log(mut req: Request<Incoming>, cmd: Arc<Command>, follow: bool) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return error(400, "not a websocket handshake");
    };
    let accept = derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut io = TokioIo::new(upgraded);
        let mut sent = 0;
        loop {
            let notified = cmd.changed.notified();
            let ended = cmd.ended() || lock(&cmd.pgid).is_none();
            let chunk = lock(&cmd.log)[sent..].to_vec();
            if !chunk.is_empty() {
                if io.write_all(&frame(0x2, &chunk)).await.is_err() {
                    return;
                }
                let _ = io.flush().await;
                sent += chunk.len();
                continue;
            }
            if ended || !follow {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
        let _ = io.write_all(&frame(0x8, &1000u16.to_be_bytes())).await;
        let _ = io.flush().await;
    });
    let mut response = full(101, "text/plain", "");
    response.headers_mut().remove(hyper::header::CONTENT_TYPE);
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = accept.parse() {
        headers.insert("sec-websocket-accept", v);
    }
    response
}

/// One unmasked server frame.
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    let len = payload.len();
    if len < 126 {
        out.push(u8::try_from(len).unwrap_or(0));
    } else if let Ok(short) = u16::try_from(len) {
        out.push(126);
        out.extend_from_slice(&short.to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_files_are_found() {
        let body = b"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhello\r\n--XX--\r\n";
        assert_eq!(
            multipart_file("multipart/form-data; boundary=XX", body).as_deref(),
            Some(&b"hello"[..])
        );
    }

    #[test]
    fn logs_split() {
        assert_eq!(
            split_log(b"\x01\x01\x01out\x02\x02\x02err"),
            ("out".to_owned(), "err".to_owned())
        );
    }
}
