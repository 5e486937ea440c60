//! A contract fake of Vercel Sandbox (the service cannot run here): the
//! REST API v1 as the official SDK speaks it (`vercel/sandbox`,
//! `packages/vercel-sandbox/src/api-client`, SDK 2.x), for the endpoints
//! hermes uses.
//!
//! `POST /v1/sandboxes` (`projectId` must be the fake's, runtime `node24`,
//! `node22` or `python3.13`, at most 8 vCPUs, `source` a snapshot of this
//! fake, `networkPolicy` checked against the API's schema and kept, see
//! [`FakeVercel::network_policies`]; a new sandbox is `pending`, then `running` when next read), `GET
//! /v1/sandboxes/{id}`, `POST /v1/sandboxes/{id}/cmd`, `GET
//! …/cmd/{cmdId}?wait=true`, `GET …/cmd/{cmdId}/logs` (chunked
//! `application/x-ndjson`, one `{stream, data}` line per output chunk as it
//! comes, ended with the command), `POST /v1/sandboxes/{id}/{cmdId}/kill`,
//! `POST …/fs/write` (a gzipped tar extracted in `x-cwd`), `POST
//! …/fs/read` (404 when missing), `POST …/snapshot` (copies the sandbox's
//! filesystem, then stops it) and `POST …/stop`. Every call needs the
//! Bearer token (401 without, 403 with another) and `?teamId=` of the
//! fake's team (403 otherwise); errors are `{"error": {code, message}}`.
//!
//! Each sandbox is a directory standing for its `/`: an absolute path `p`
//! in a file call is `<dir>/p`, and `/vercel/sandbox` is the working
//! directory commands start in (relative paths resolve there). Commands
//! run as local processes, without a shell, in a process group of their
//! own; the paths inside their arguments are the host's.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use http_body_util::channel::Channel;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::{
    Body, Faults, Requests, bearer, body_bytes, copy_tree, exit_code, full, json, kill_group, lock,
    query_param,
};

const RUNTIMES: &[&str] = &["node24", "node22", "python3.13"];
const CWD: &str = "/vercel/sandbox";
const MAX_VCPUS: u64 = 8;

/// A running fake; stops serving when dropped.
#[derive(Debug)]
pub struct FakeVercel {
    pub addr: SocketAddr,
    pub faults: Faults,
    pub requests: Requests,
    state: Arc<State>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Debug)]
struct State {
    token: String,
    team: String,
    project: String,
    root: tempfile::TempDir,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    snapshots: Mutex<HashMap<String, PathBuf>>,
    commands: Mutex<Vec<Value>>,
    /// Every request body, as received.
    received: Mutex<Vec<u8>>,
    /// The `networkPolicy` of every create that had one, in order.
    network_policies: Mutex<Vec<Value>>,
    counter: AtomicU64,
}

impl State {
    /// Keeps a request body in [`State::received`] and hands it back.
    fn keep(&self, body: Bytes) -> Bytes {
        lock(&self.received).extend_from_slice(&body);
        body
    }
}

#[derive(Debug)]
struct Sandbox {
    id: String,
    status: &'static str,
    pending_reads: u32,
    runtime: String,
    vcpus: u64,
    timeout: u64,
    source_snapshot: Option<String>,
    root: PathBuf,
    commands: HashMap<String, Arc<Command>>,
}

#[derive(Debug)]
struct Command {
    id: String,
    name: String,
    args: Vec<String>,
    cwd: String,
    sandbox: String,
    log: Mutex<Vec<(&'static str, String)>>,
    exit: Mutex<Option<i64>>,
    pgid: Mutex<Option<u32>>,
    changed: tokio::sync::Notify,
}

impl Command {
    fn ended(&self) -> bool {
        lock(&self.exit).is_some()
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "args": self.args,
            "cwd": self.cwd,
            "sandboxId": self.sandbox,
            "exitCode": *lock(&self.exit),
            "startedAt": 0,
        })
    }

    fn kill(&self, signal: nix::sys::signal::Signal) {
        if let Some(pgid) = *lock(&self.pgid) {
            if signal == nix::sys::signal::Signal::SIGKILL {
                kill_group(pgid);
            } else if let Ok(pid) = i32::try_from(pgid) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
            }
        }
    }
}

impl Sandbox {
    fn json(&self) -> Value {
        let mut out = json!({
            "id": self.id,
            "memory": self.vcpus * 2048,
            "vcpus": self.vcpus,
            "region": "iad1",
            "runtime": self.runtime,
            "timeout": self.timeout,
            "status": self.status,
            "requestedAt": 0,
            "createdAt": 0,
            "updatedAt": 0,
            "cwd": CWD,
        });
        if let Some(snapshot) = &self.source_snapshot {
            out["sourceSnapshotId"] = json!(snapshot);
        }
        out
    }

    fn stop(&mut self) {
        for c in self.commands.values() {
            c.kill(nix::sys::signal::Signal::SIGKILL);
        }
        self.status = "stopped";
    }

    /// A sandbox path on the host.
    fn path(&self, path: &str, cwd: Option<&str>) -> PathBuf {
        let absolute = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", cwd.unwrap_or(CWD).trim_end_matches('/'))
        };
        self.root.join(absolute.trim_start_matches('/'))
    }
}

impl FakeVercel {
    /// Serves a fake that accepts `token` for `team`, owning `project`.
    pub fn start(token: &str, team: &str, project: &str) -> FakeVercel {
        let state = Arc::new(State {
            token: token.to_owned(),
            team: team.to_owned(),
            project: project.to_owned(),
            root: tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}")),
            sandboxes: Mutex::new(HashMap::new()),
            snapshots: Mutex::new(HashMap::new()),
            commands: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            network_policies: Mutex::new(Vec::new()),
            counter: AtomicU64::new(0),
        });
        let faults = Faults::default();
        let requests = Requests::default();
        let (s, f, r) = (state.clone(), faults.clone(), requests.clone());
        let (addr, stop) = super::serve(move |req| handle(s.clone(), f.clone(), r.clone(), req));
        FakeVercel {
            addr,
            faults,
            requests,
            state,
            _stop: stop,
        }
    }

    /// The value for `VERCEL_API_URL`.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The host directory standing for a sandbox's `/vercel/sandbox`.
    pub fn sandbox_cwd(&self, id: &str) -> Option<PathBuf> {
        lock(&self.state.sandboxes)
            .get(id)
            .map(|s| s.root.join(CWD.trim_start_matches('/')))
    }

    /// A sandbox's status.
    pub fn sandbox_status(&self, id: &str) -> Option<String> {
        lock(&self.state.sandboxes)
            .get(id)
            .map(|s| s.status.to_owned())
    }

    /// Sets a sandbox's status as the service would (`snapshotting`,
    /// `failed`, …).
    pub fn set_status(&self, id: &str, status: &'static str) {
        if let Some(s) = lock(&self.state.sandboxes).get_mut(id) {
            s.status = status;
            s.pending_reads = 0;
        }
    }

    /// Every request body the fake was given, joined (file writes as the
    /// gzipped tars they are): what reached the service.
    pub fn received(&self) -> Vec<u8> {
        lock(&self.state.received).clone()
    }

    /// Every command request body the fake was given, in order.
    pub fn command_requests(&self) -> Vec<Value> {
        lock(&self.state.commands).clone()
    }

    /// The `networkPolicy` of every create that had one, in order (its
    /// `injectionRules` headers are what the firewall would set outside
    /// the sandbox).
    pub fn network_policies(&self) -> Vec<Value> {
        lock(&self.state.network_policies).clone()
    }

    /// How many sandboxes were ever created.
    pub fn sandbox_count(&self) -> usize {
        lock(&self.state.sandboxes).len()
    }
}

impl Drop for FakeVercel {
    fn drop(&mut self) {
        for sandbox in lock(&self.state.sandboxes).values_mut() {
            sandbox.stop();
        }
    }
}

fn error(status: u16, code: &str, message: &str) -> Response<Body> {
    json(
        status,
        &json!({ "error": { "code": code, "message": message } }),
    )
}

fn not_found() -> Response<Body> {
    error(404, "not_found", "Sandbox not found")
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
        Some(token) if token == state.token => {}
        Some(_) => return error(403, "forbidden", "Not authorized"),
        None => return error(401, "unauthorized", "Authentication required"),
    }
    if query_param(&req, "teamId").as_deref() != Some(state.team.as_str()) {
        return error(403, "forbidden", "Not authorized for this team");
    }
    let parts: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    match (method.as_str(), parts.as_slice()) {
        ("POST", ["v1", "sandboxes"]) => create(&state, state.keep(body_bytes(req).await)),
        ("GET", ["v1", "sandboxes", id]) => {
            let mut sandboxes = lock(&state.sandboxes);
            let Some(s) = sandboxes.get_mut(*id) else {
                return not_found();
            };
            if s.pending_reads > 0 {
                s.pending_reads -= 1;
            } else if s.status == "pending" {
                s.status = "running";
            }
            json(200, &json!({ "sandbox": s.json(), "routes": [] }))
        }
        ("POST", ["v1", "sandboxes", id, "stop"]) => {
            let mut sandboxes = lock(&state.sandboxes);
            let Some(s) = sandboxes.get_mut(*id) else {
                return not_found();
            };
            s.stop();
            json(200, &json!({ "sandbox": s.json() }))
        }
        ("POST", ["v1", "sandboxes", id, "snapshot"]) => snapshot(&state, id),
        ("POST", ["v1", "sandboxes", id, "cmd"]) => {
            let id = (*id).to_owned();
            run(&state, &id, state.keep(body_bytes(req).await))
        }
        ("GET", ["v1", "sandboxes", id, "cmd", cmd]) => {
            let Some(c) = command(&state, id, cmd) else {
                return error(404, "not_found", "Command not found");
            };
            if query_param(&req, "wait").as_deref() == Some("true") {
                loop {
                    let notified = c.changed.notified();
                    if c.ended() {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
                }
            }
            json(200, &json!({ "command": c.json() }))
        }
        ("GET", ["v1", "sandboxes", id, "cmd", cmd, "logs"]) => {
            let Some(c) = command(&state, id, cmd) else {
                return error(404, "not_found", "Command not found");
            };
            logs(c)
        }
        ("POST", ["v1", "sandboxes", id, cmd, "kill"]) => {
            let Some(c) = command(&state, id, cmd) else {
                return error(404, "not_found", "Command not found");
            };
            let body: Value =
                serde_json::from_slice(&state.keep(body_bytes(req).await)).unwrap_or_default();
            let signal = body["signal"]
                .as_i64()
                .and_then(|s| i32::try_from(s).ok())
                .and_then(|s| nix::sys::signal::Signal::try_from(s).ok())
                .unwrap_or(nix::sys::signal::Signal::SIGTERM);
            c.kill(signal);
            json(200, &json!({ "command": c.json() }))
        }
        ("POST", ["v1", "sandboxes", id, "fs", "write"]) => {
            let cwd = req
                .headers()
                .get("x-cwd")
                .and_then(|v| v.to_str().ok())
                .unwrap_or(CWD)
                .to_owned();
            let dir = {
                let sandboxes = lock(&state.sandboxes);
                let Some(s) = sandboxes.get(*id) else {
                    return not_found();
                };
                if s.status != "running" {
                    return error(410, "sandbox_stopped", "Sandbox is stopped");
                }
                s.path(&cwd, None)
            };
            let body = state.keep(body_bytes(req).await);
            let unpacked = std::fs::create_dir_all(&dir).and_then(|()| {
                tar::Archive::new(flate2::read::GzDecoder::new(&body[..])).unpack(&dir)
            });
            match unpacked {
                Ok(()) => json(200, &json!({})),
                Err(e) => error(400, "bad_request", &format!("invalid tarball: {e}")),
            }
        }
        ("POST", ["v1", "sandboxes", id, "fs", "read"]) => {
            let body: Value =
                serde_json::from_slice(&state.keep(body_bytes(req).await)).unwrap_or_default();
            let path = {
                let sandboxes = lock(&state.sandboxes);
                let Some(s) = sandboxes.get(*id) else {
                    return not_found();
                };
                if s.status != "running" {
                    return error(410, "sandbox_stopped", "Sandbox is stopped");
                }
                s.path(
                    body["path"].as_str().unwrap_or_default(),
                    body["cwd"].as_str(),
                )
            };
            match std::fs::read(&path) {
                Ok(bytes) => full(200, "application/octet-stream", bytes),
                Err(_) => error(404, "file_not_found", "File not found"),
            }
        }
        _ => error(404, "not_found", "The requested path was not found"),
    }
}

fn create(state: &State, body: Bytes) -> Response<Body> {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "bad_request", "Invalid JSON");
    };
    if body["projectId"].as_str() != Some(state.project.as_str()) {
        return error(404, "not_found", "Project not found");
    }
    let policy = body.get("networkPolicy").cloned();
    if let Some(policy) = &policy {
        if let Err(what) = check_network_policy(policy) {
            return error(400, "bad_request", &what);
        }
    }
    let vcpus = body["resources"]["vcpus"].as_u64().unwrap_or(2);
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return error(
            400,
            "bad_request",
            &format!("resources.vcpus must be between 1 and {MAX_VCPUS}"),
        );
    }
    let n = state.counter.fetch_add(1, Ordering::SeqCst);
    let id = format!("sbx_fake{n:04}");
    let root = state.root.path().join(&id);
    let (runtime, source_snapshot) = match body["source"]["type"].as_str() {
        Some("snapshot") => {
            let snap = body["source"]["snapshotId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let Some(from) = lock(&state.snapshots).get(&snap).cloned() else {
                return error(404, "not_found", "Snapshot not found");
            };
            if let Err(e) = copy_tree(&from, &root) {
                return error(500, "internal_error", &e.to_string());
            }
            ("node24".to_owned(), Some(snap))
        }
        Some(_) => return error(400, "bad_request", "unsupported source"),
        None => {
            let runtime = body["runtime"].as_str().unwrap_or("node24").to_owned();
            if !RUNTIMES.contains(&runtime.as_str()) {
                return error(400, "bad_request", &format!("Invalid runtime {runtime}"));
            }
            if let Err(e) = std::fs::create_dir_all(root.join(CWD.trim_start_matches('/'))) {
                return error(500, "internal_error", &e.to_string());
            }
            (runtime, None)
        }
    };
    let sandbox = Sandbox {
        id: id.clone(),
        status: "pending",
        pending_reads: 1,
        runtime,
        vcpus,
        timeout: body["timeout"].as_u64().unwrap_or(300_000),
        source_snapshot,
        root,
        commands: HashMap::new(),
    };
    let out = json!({ "sandbox": sandbox.json(), "routes": [] });
    lock(&state.sandboxes).insert(id, sandbox);
    if let Some(policy) = policy {
        lock(&state.network_policies).push(policy);
    }
    json(200, &out)
}

fn snapshot(state: &State, id: &str) -> Response<Body> {
    let mut sandboxes = lock(&state.sandboxes);
    let Some(s) = sandboxes.get_mut(id) else {
        return not_found();
    };
    if s.status != "running" {
        return error(410, "sandbox_stopped", "Sandbox is not running");
    }
    let n = state.counter.fetch_add(1, Ordering::SeqCst);
    let snap = format!("snap_fake{n:04}");
    let to = state.root.path().join("snapshots").join(&snap);
    if let Err(e) = copy_tree(&s.root, &to) {
        return error(500, "internal_error", &e.to_string());
    }
    s.stop();
    lock(&state.snapshots).insert(snap.clone(), to);
    json(
        200,
        &json!({
            "snapshot": {
                "id": snap,
                "sourceSandboxId": s.id,
                "region": "iad1",
                "status": "created",
                "sizeBytes": 0,
                "createdAt": 0,
                "updatedAt": 0,
            },
            "sandbox": s.json(),
        }),
    )
}

fn command(state: &State, id: &str, cmd: &str) -> Option<Arc<Command>> {
    lock(&state.sandboxes).get(id)?.commands.get(cmd).cloned()
}

fn run(state: &State, id: &str, body: Bytes) -> Response<Body> {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "bad_request", "Invalid JSON");
    };
    lock(&state.commands).push(body.clone());
    let Some(name) = body["command"].as_str().filter(|c| !c.is_empty()) else {
        return error(400, "bad_request", "command is required");
    };
    let args: Vec<String> = serde_json::from_value(body["args"].clone()).unwrap_or_default();
    let env: BTreeMap<String, String> =
        serde_json::from_value(body["env"].clone()).unwrap_or_default();
    let cwd = body["cwd"].as_str().unwrap_or(CWD).to_owned();
    let mut sandboxes = lock(&state.sandboxes);
    let Some(s) = sandboxes.get_mut(id) else {
        return not_found();
    };
    if s.status != "running" {
        return error(410, "sandbox_stopped", "Sandbox is not running");
    }
    let n = state.counter.fetch_add(1, Ordering::SeqCst);
    let cmd = Arc::new(Command {
        id: format!("cmd_fake{n:04}"),
        name: name.to_owned(),
        args: args.clone(),
        cwd: cwd.clone(),
        sandbox: id.to_owned(),
        log: Mutex::new(Vec::new()),
        exit: Mutex::new(None),
        pgid: Mutex::new(None),
        changed: tokio::sync::Notify::new(),
    });
    let dir = s.path(&cwd, None);
    let home = s.path(CWD, None);
    if let Err(e) = start(cmd.clone(), name, &args, &dir, &home, &env) {
        return error(400, "bad_request", &format!("cannot run {name}: {e}"));
    }
    s.commands.insert(cmd.id.clone(), cmd.clone());
    json(200, &json!({ "command": cmd.json() }))
}

fn start(
    cmd: Arc<Command>,
    name: &str,
    args: &[String],
    dir: &Path,
    home: &Path,
    env: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let mut child = tokio::process::Command::new(name)
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    *lock(&cmd.pgid) = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    tokio::spawn(async move {
        let pump = |mut from: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                    stream: &'static str| {
            let cmd = cmd.clone();
            async move {
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = from.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let data = String::from_utf8_lossy(&buf[..n]).into_owned();
                    lock(&cmd.log).push((stream, data));
                    cmd.changed.notify_waiters();
                }
            }
        };
        let out = stdout.map(|s| tokio::spawn(pump(Box::new(s), "stdout")));
        let err = stderr.map(|s| tokio::spawn(pump(Box::new(s), "stderr")));
        let status = child.wait().await;
        for task in [out, err].into_iter().flatten() {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        *lock(&cmd.exit) = Some(status.map_or(-1, exit_code));
        cmd.changed.notify_waiters();
    });
    Ok(())
}

/// The log as chunked NDJSON, line by line as output comes.
fn logs(cmd: Arc<Command>) -> Response<Body> {
    let (mut tx, body) = Channel::<Bytes, Infallible>::new(16);
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            let notified = cmd.changed.notified();
            let ended = cmd.ended();
            let lines: Vec<(&'static str, String)> = lock(&cmd.log)[sent..].to_vec();
            if lines.is_empty() {
                if ended {
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
                continue;
            }
            sent += lines.len();
            for (stream, data) in lines {
                let mut line = json!({ "stream": stream, "data": data }).to_string();
                line.push('\n');
                if tx.send_data(Bytes::from(line)).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut response = Response::new(body.boxed());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

/// The create request's `networkPolicy` as the REST API defines it (and
/// the SDK's validators check): `mode` one of the API's modes;
/// `allowedDomains`, `allowedCIDRs`, `deniedCIDRs` lists of strings;
/// `injectionRules` a list of `{domain, headers}`, the headers an object of
/// strings (the values the firewall sets), only with mode `custom`.
fn check_network_policy(policy: &Value) -> Result<(), String> {
    const MODES: &[&str] = &[
        "allow-all",
        "deny-all",
        "custom",
        "default-allow",
        "default-deny",
    ];
    let mode = policy["mode"].as_str().unwrap_or_default();
    if !MODES.contains(&mode) {
        return Err(format!(
            "networkPolicy.mode: invalid value {:?}",
            policy["mode"]
        ));
    }
    for list in ["allowedDomains", "allowedCIDRs", "deniedCIDRs"] {
        if let Some(v) = policy.get(list) {
            let ok = v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                return Err(format!("networkPolicy.{list} must be a list of strings"));
            }
        }
    }
    if let Some(rules) = policy.get("injectionRules") {
        if mode != "custom" {
            return Err("networkPolicy.injectionRules needs mode custom".to_string());
        }
        let Some(rules) = rules.as_array() else {
            return Err("networkPolicy.injectionRules must be a list".to_string());
        };
        for (i, rule) in rules.iter().enumerate() {
            if !rule["domain"].is_string() {
                return Err(format!(
                    "networkPolicy.injectionRules[{i}].domain must be a string"
                ));
            }
            let headers_ok = rule.get("headers").is_none_or(|h| {
                h.as_object()
                    .is_some_and(|o| o.values().all(Value::is_string))
            });
            if !headers_ok {
                return Err(format!(
                    "networkPolicy.injectionRules[{i}].headers must map names to strings"
                ));
            }
        }
    }
    Ok(())
}
