//! The MCP server of one connection: the tools `terminal`, `process`,
//! `read_file` and `write_file`, their schemas and descriptions (written
//! for a model to read), and the connection's state: its sandbox target,
//! the working directory that carries over, its background processes.
//!
//! Arguments are bounded before anything runs: a value over its limit, of
//! the wrong type or missing is a protocol error (invalid params), as is
//! an unknown tool. What fails in the sandbox (a refused exec, a missing
//! file) is a tool error (`isError`), which the model reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

use super::capture::{Captured, MAX_OUTPUT, Shared};
use super::sandbox::{self, ExecError, Target};
use crate::exec_target::Which;

/// The longest command line a `terminal` call takes.
pub const MAX_COMMAND: usize = 64 * 1024;
/// The longest path.
pub const MAX_PATH: usize = 4096;
/// The largest file `write_file` writes.
pub const MAX_WRITE: usize = 1024 * 1024;
/// The most `read_file` returns of a file.
pub const MAX_READ: usize = 256 * 1024;
/// The most lines `read_file` returns (the reference's).
pub const MAX_LINES: u64 = 2000;
/// The longest timeout a command may ask for, in seconds.
pub const MAX_TIMEOUT: u64 = 24 * 3600;
/// The most background processes one connection keeps track of.
pub const MAX_PROCESSES: usize = 64;
/// How long a helper exec (files, processes) may take, in seconds.
const HELPER_TIMEOUT: u64 = 60;
/// A part of a file written in one exec: well under the kernel's limit
/// on one argument (128 KiB).
const WRITE_PART: usize = 96 * 1024;
/// How often a running command's new output goes out as progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(300);
/// After how many quiet rounds a progress notification says the command
/// still runs.
const HEARTBEAT_ROUNDS: u32 = 15;

/// One connection's state (one MCP session).
#[derive(Debug)]
pub struct Session {
    pub target: Target,
    /// The timeout of a command that names none (`terminal.timeout`).
    pub default_timeout: u64,
    /// The working directory the last command ended in.
    cwd: Mutex<Option<String>>,
    processes: Mutex<BTreeMap<String, Process>>,
    next_process: AtomicU64,
    /// Whether the session's sandbox is this connection's own (removed at
    /// its end), and whether that was done.
    pub owned: bool,
    pub ended: AtomicBool,
}

impl Session {
    pub fn new(target: Target, default_timeout: u64, owned: bool) -> Session {
        Session {
            target,
            default_timeout,
            cwd: Mutex::new(None),
            processes: Mutex::new(BTreeMap::new()),
            next_process: AtomicU64::new(1),
            owned,
            ended: AtomicBool::new(false),
        }
    }

    fn cwd(&self) -> Option<String> {
        self.cwd.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_cwd(&self, cwd: String) {
        *self.cwd.lock().unwrap_or_else(|e| e.into_inner()) = Some(cwd);
    }
}

/// A background process started through `terminal`.
#[derive(Debug, Clone)]
struct Process {
    command: String,
    /// Its id, as `hermes exec --background` gives it (`hermes process`
    /// knows it by it).
    job: String,
    started: std::time::SystemTime,
    /// The last state seen.
    state: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct TerminalParams {
    /// The command line to run in the sandbox, in bash (sh where the
    /// sandbox has no bash): pipes, redirections, `&&` and `cd` work. The
    /// working directory carries over from one call to the next. Nothing
    /// is read from standard input: do not run interactive programs.
    pub command: String,
    /// Seconds before the command is killed together with everything it
    /// started; it then ends with exit code 124. Default: the host's
    /// terminal.timeout (180 s unless configured).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Start the command in the background and return at once with a
    /// process id; read its output and stop it with the `process` tool.
    /// For servers and long jobs.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessAction {
    /// The background processes of this session, with their last known
    /// state.
    List,
    /// A process's state (running, or its exit code) and the end of its
    /// output.
    Poll,
    /// Stop a process and everything it started (SIGTERM, then SIGKILL).
    Kill,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ProcessParams {
    /// What to do: list, poll or kill.
    pub action: ProcessAction,
    /// The process id that `terminal` returned (for poll and kill).
    #[serde(default)]
    pub process_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadFileParams {
    /// The file's path in the sandbox, absolute or relative to the
    /// working directory.
    pub path: String,
    /// The first line to return, counting from 1. Default 1.
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many lines to return, at most 2000. Default 2000.
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteFileParams {
    /// The file's path in the sandbox, absolute or relative to the
    /// working directory. Missing parent directories are created.
    pub path: String,
    /// The whole new content of the file (text, at most 1 MiB). The file
    /// is replaced at once: a reader sees the old or the new content.
    pub content: String,
}

/// The server of one connection.
#[derive(Debug, Clone)]
pub struct Hermes {
    session: Arc<Session>,
    /// Ends the session when the last handle on this server goes (HTTP).
    _end: Option<Arc<EndGuard>>,
}

impl Hermes {
    pub fn new(session: Arc<Session>) -> Hermes {
        Hermes {
            session,
            _end: None,
        }
    }

    /// This server, ending its session (its own sandbox removed) when it
    /// is dropped.
    pub fn ending(mut self, base: super::Base) -> Hermes {
        self._end = Some(Arc::new(EndGuard {
            base,
            session: self.session.clone(),
        }));
        self
    }
}

/// Ends a session when dropped, in the background.
#[derive(Debug)]
pub struct EndGuard {
    base: super::Base,
    session: Arc<Session>,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.session.owned || self.session.ended.load(Ordering::SeqCst) {
            return;
        }
        let base = self.base.clone();
        let session = self.session.clone();
        // A thread of its own: the removal is not a `Send` future, and a
        // drop cannot wait.
        std::thread::spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(super::end(&base, &session)),
                Err(e) => tracing::warn!(error = %e, "cannot end the MCP session's sandbox"),
            }
        });
    }
}

/// A tool's arguments: unlike the SDK's `Parameters`, which answers a
/// value of the wrong type with a tool error, a protocol error (invalid
/// params), as for any other bad input.
#[derive(Debug)]
pub struct Args<T>(pub T);

impl<S, T: serde::de::DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Args<T> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        serde_json::from_value(serde_json::Value::Object(arguments))
            .map(Args)
            .map_err(|e| invalid(format!("invalid arguments: {e}")))
    }
}

/// The input schema of a tool whose arguments are `T`.
fn input_schema<T: schemars::JsonSchema + std::any::Any>() -> Arc<rmcp::model::JsonObject> {
    rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|_| rmcp::handler::server::common::schema_for_type::<T>())
}

fn invalid(message: String) -> ErrorData {
    ErrorData::invalid_params(message, None)
}

fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn json_result(value: serde_json::Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(value.to_string())])
}

fn exec_error(e: ExecError) -> CallToolResult {
    tool_error(e.to_string())
}

/// A path argument: bounded, no NUL, not empty.
fn check_path(path: &str) -> Result<(), ErrorData> {
    if path.is_empty() {
        return Err(invalid("path: empty".to_string()));
    }
    if path.len() > MAX_PATH {
        return Err(invalid(format!(
            "path: {} bytes, over the limit of {MAX_PATH}",
            path.len()
        )));
    }
    if path.contains('\0') {
        return Err(invalid("path: contains a NUL character".to_string()));
    }
    Ok(())
}

#[tool_router]
impl Hermes {
    #[tool(
        description = "Run a shell command in this session's sandbox (a hardened container with no real API keys; network access only through the host's credential proxy) and return its exit code and output (stdout and stderr together). The working directory carries over between calls (`cd` persists). Output over 50 000 bytes keeps its first 40% and last 60% with a marker saying how much was cut. A command that runs out of time is killed with everything it started and exits 124. Set background=true for servers and long jobs, then use the `process` tool.",
        input_schema = input_schema::<TerminalParams>()
    )]
    async fn terminal(
        &self,
        Args(p): Args<TerminalParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if p.command.trim().is_empty() {
            return Err(invalid("command: empty".to_string()));
        }
        if p.command.len() > MAX_COMMAND {
            return Err(invalid(format!(
                "command: {} bytes, over the limit of {MAX_COMMAND}",
                p.command.len()
            )));
        }
        if p.command.contains('\0') {
            return Err(invalid("command: contains a NUL character".to_string()));
        }
        let timeout = p.timeout.unwrap_or(self.session.default_timeout);
        if timeout == 0 || timeout > MAX_TIMEOUT {
            return Err(invalid(format!(
                "timeout: {timeout} seconds; expected 1 to {MAX_TIMEOUT}"
            )));
        }
        if p.background {
            return Ok(self.start_background(p.command).await);
        }
        let cwd = self.session.cwd().unwrap_or_default();
        let marker = format!("__hermes_cwd_{}__=", nonce());
        let argv: Vec<String> = vec![
            "/bin/sh".into(),
            "-c".into(),
            sandbox::BOOT.into(),
            "hermes-mcp".into(),
            sandbox::TERMINAL.into(),
            p.command,
            cwd,
            marker.clone(),
        ];
        let capture = Shared::new(Captured::terminal());
        let run = sandbox::exec(&self.session.target, argv, timeout, &capture);
        let progress = report_progress(&ctx, &capture);
        let code = tokio::select! {
            code = run => code,
            () = progress => unreachable_progress(),
            () = ctx.ct.cancelled() => {
                return Ok(tool_error("cancelled by the client; the command was stopped"));
            }
        };
        let code = match code {
            Ok(code) => code,
            Err(e) => return Ok(exec_error(e)),
        };
        let mut captured = capture.lock();
        if let Some(dir) = captured.take_marker(&marker) {
            if dir.starts_with('/') && dir.len() <= MAX_PATH && !dir.chars().any(char::is_control) {
                self.session.set_cwd(dir);
            }
        }
        let mut output = captured.text();
        drop(captured);
        if code == 124 {
            output.push_str(&format!("\n[Command timed out after {timeout}s]"));
        }
        Ok(json_result(serde_json::json!({
            "output": output,
            "exit_code": code,
            "cwd": self.session.cwd(),
        })))
    }

    #[tool(
        description = "Manage the background processes started with terminal(background=true): action=list shows them; action=poll returns a process's state (running, or its exit code) and the last 50 000 bytes of its output; action=kill stops it and everything it started.",
        input_schema = input_schema::<ProcessParams>()
    )]
    async fn process(&self, Args(p): Args<ProcessParams>) -> Result<CallToolResult, ErrorData> {
        if let ProcessAction::List = p.action {
            let list: Vec<_> = self
                .session
                .processes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(id, proc)| {
                    serde_json::json!({
                        "process_id": id,
                        "command": proc.command,
                        "state": proc.state,
                        "started_seconds_ago": proc.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
                    })
                })
                .collect();
            return Ok(json_result(serde_json::json!({ "processes": list })));
        }
        let Some(id) = p.process_id else {
            return Err(invalid(
                "process_id: required for poll and kill".to_string(),
            ));
        };
        if id.len() > 32 {
            return Err(invalid("process_id: too long".to_string()));
        }
        let found = self
            .session
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        let Some(proc) = found else {
            return Ok(tool_error(format!(
                "no background process {id:?} in this session (process action=list shows them)"
            )));
        };
        let result = match p.action {
            ProcessAction::Poll => self.poll(&id, &proc).await,
            _ => self.kill(&id, &proc).await,
        };
        Ok(result.unwrap_or_else(exec_error))
    }

    #[tool(
        description = "Read a text file in the sandbox. Returns its lines numbered from `offset` (default 1), at most `limit` lines (default and most 2000) and 256 KiB, with the file's size and line count. Binary files, directories and missing paths are errors.",
        input_schema = input_schema::<ReadFileParams>()
    )]
    async fn read_file(&self, Args(p): Args<ReadFileParams>) -> Result<CallToolResult, ErrorData> {
        check_path(&p.path)?;
        let offset = p.offset.unwrap_or(1);
        let limit = p.limit.unwrap_or(MAX_LINES);
        if offset == 0 || offset > u64::from(u32::MAX) {
            return Err(invalid(format!("offset: {offset}; lines count from 1")));
        }
        if limit == 0 || limit > MAX_LINES {
            return Err(invalid(format!(
                "limit: {limit}; expected 1 to {MAX_LINES}"
            )));
        }
        let cwd = self.session.cwd().unwrap_or_default();
        let (offset_s, limit_s, max_s) =
            (offset.to_string(), limit.to_string(), MAX_READ.to_string());
        let ran = sandbox::script(
            &self.session.target,
            sandbox::READ,
            &[&p.path, &offset_s, &limit_s, &max_s, &cwd],
            HELPER_TIMEOUT,
            MAX_READ + 128,
        )
        .await;
        let (code, bytes, _) = match ran {
            Ok(ran) => ran,
            Err(e) => return Ok(exec_error(e)),
        };
        let (head, body) = split_line(&bytes);
        let head = String::from_utf8_lossy(head);
        let mut words = head.split(' ');
        let path = &p.path;
        match (code, words.next()) {
            (0, Some("ok")) => {}
            (0, Some("missing")) => return Ok(tool_error(format!("{path}: no such file"))),
            (0, Some("directory")) => {
                return Ok(tool_error(format!("{path}: a directory, not a file")));
            }
            (0, Some("special")) => {
                return Ok(tool_error(format!(
                    "{path}: not a regular file (a device, pipe or socket)"
                )));
            }
            (0, Some("unreadable")) => {
                return Ok(tool_error(format!("{path}: permission denied")));
            }
            (0, Some("binary")) => {
                return Ok(tool_error(format!(
                    "{path}: a binary file (it holds NUL bytes); read_file reads text"
                )));
            }
            _ => {
                return Ok(tool_error(format!(
                    "cannot read {path}: {}",
                    super::capture::clean(&String::from_utf8_lossy(&bytes[..bytes.len().min(500)]))
                )));
            }
        }
        let size: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let lines: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let Ok(text) = std::str::from_utf8(body) else {
            // Cut at the byte limit inside a character, or not UTF-8.
            let valid = match std::str::from_utf8(body) {
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                _ => {
                    return Ok(tool_error(format!(
                        "{path}: not UTF-8 text; read_file reads text"
                    )));
                }
            };
            return Ok(self.numbered(path, &body[..valid], offset, size, lines, true));
        };
        let cut = body.len() >= MAX_READ;
        Ok(self.numbered(path, text.as_bytes(), offset, size, lines, cut))
    }

    #[tool(
        description = "Write a text file in the sandbox, replacing it whole (at most 1 MiB). Missing parent directories are created.",
        input_schema = input_schema::<WriteFileParams>()
    )]
    async fn write_file(
        &self,
        Args(p): Args<WriteFileParams>,
    ) -> Result<CallToolResult, ErrorData> {
        check_path(&p.path)?;
        if p.content.len() > MAX_WRITE {
            return Err(invalid(format!(
                "content: {} bytes, over the limit of {MAX_WRITE}",
                p.content.len()
            )));
        }
        if p.content.contains('\0') {
            return Err(invalid(
                "content: contains a NUL character; write_file writes text".to_string(),
            ));
        }
        let cwd = self.session.cwd().unwrap_or_default();
        let parts = split_parts(&p.content, WRITE_PART);
        let mut tmp = String::new();
        let last = parts.len() - 1;
        for (i, part) in parts.iter().enumerate() {
            let mode = match (i, i == last) {
                (0, true) => "only",
                (0, false) => "first",
                (_, true) => "last",
                _ => "more",
            };
            let ran = sandbox::script(
                &self.session.target,
                sandbox::WRITE,
                &[&p.path, part, mode, &tmp, &cwd],
                HELPER_TIMEOUT,
                MAX_PATH + 64,
            )
            .await;
            let (code, bytes, _) = match ran {
                Ok(ran) => ran,
                Err(e) => return Ok(exec_error(e)),
            };
            let said = String::from_utf8_lossy(&bytes);
            let said = said.trim_end();
            let path = &p.path;
            match (code, said) {
                (0, "wrote") if i == last => {}
                (0, "") if mode == "more" => {}
                (0, s) if mode == "first" && s.starts_with("tmp ") => {
                    let t = &s[4..];
                    if t.len() > MAX_PATH + 32 || t.contains('\n') {
                        return Ok(tool_error(format!("cannot write {path}: a bad answer")));
                    }
                    tmp = t.to_string();
                }
                (0, "directory") => {
                    return Ok(tool_error(format!(
                        "{path}: a directory; give a file's path"
                    )));
                }
                (0, "nodir") => {
                    return Ok(tool_error(format!(
                        "{path}: cannot create its parent directory"
                    )));
                }
                (0, "notmp" | "nowrite") => {
                    return Ok(tool_error(format!(
                        "{path}: cannot write there (permission denied or no space)"
                    )));
                }
                _ => {
                    return Ok(tool_error(format!(
                        "cannot write {path}: {}",
                        super::capture::clean(&said[..floor_char(said, 500)])
                    )));
                }
            }
        }
        Ok(json_result(serde_json::json!({
            "path": p.path,
            "bytes_written": p.content.len(),
        })))
    }
}

impl Hermes {
    /// Starts a background command (as `hermes exec --background`) and
    /// records it.
    async fn start_background(&self, command: String) -> CallToolResult {
        let count = self
            .session
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        if count >= MAX_PROCESSES {
            return tool_error(format!(
                "this session already has {MAX_PROCESSES} background processes; kill some first"
            ));
        }
        let cwd = self.session.cwd();
        let ran = sandbox::start(
            &self.session.target,
            &command,
            cwd.as_deref(),
            HELPER_TIMEOUT,
        )
        .await;
        let (code, out, err) = match ran {
            Ok(ran) => ran,
            Err(e) => return exec_error(e),
        };
        let out = String::from_utf8_lossy(&out);
        let job = out.trim_end();
        if code != 0 || hermes_backends::background::check_id(job).is_err() {
            let said = String::from_utf8_lossy(&err);
            let said = said.trim_end();
            return tool_error(format!(
                "cannot start the background process (exit {code}): {}",
                super::capture::clean(&said[..floor_char(said, 500)])
            ));
        }
        let id = format!(
            "proc_{}",
            self.session.next_process.fetch_add(1, Ordering::Relaxed)
        );
        self.session
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id.clone(),
                Process {
                    command: command.clone(),
                    job: job.to_string(),
                    started: std::time::SystemTime::now(),
                    state: "running".to_string(),
                },
            );
        json_result(serde_json::json!({
            "process_id": id,
            "state": "running",
            "hint": "process(action=\"poll\", process_id=...) reads its output; action=\"kill\" stops it",
        }))
    }

    /// The session's config and which sandbox it runs in, for the
    /// process verbs.
    fn place(&self) -> Result<(hermes_model::desired::Desired, Which<'_>), ExecError> {
        let t = &self.session.target;
        let desired =
            crate::load::load_desired(&t.home, &t.profile).map_err(|e| sandbox::failed(t, &e))?;
        let which = Which {
            task: &t.task,
            session: t.session.as_deref(),
        };
        Ok((desired, which))
    }

    async fn poll(&self, id: &str, proc: &Process) -> Result<CallToolResult, ExecError> {
        let t = &self.session.target;
        let (desired, which) = self.place()?;
        let polled =
            crate::commands::process::poll(&t.home, &desired, &which, &proc.job, MAX_OUTPUT)
                .await
                .map_err(|e| sandbox::failed(t, &e))?;
        let Some(polled) = polled else {
            self.set_state(id, "gone");
            return Ok(json_result(serde_json::json!({
                "process_id": id,
                "state": "gone",
                "exit_code": null,
                "output": "",
            })));
        };
        let mut text = String::new();
        let shown = polled.tail.len() as u64;
        if polled.output_bytes > shown {
            text.push_str(&format!(
                "... [{} earlier bytes not shown] ...\n",
                polled.output_bytes - shown
            ));
        }
        text.push_str(&super::capture::clean(&String::from_utf8_lossy(
            &polled.tail,
        )));
        let state = polled.state.as_str();
        self.set_state(id, state);
        Ok(json_result(serde_json::json!({
            "process_id": id,
            "state": state,
            "exit_code": polled.state.exit_code(),
            "output": text,
        })))
    }

    async fn kill(&self, id: &str, proc: &Process) -> Result<CallToolResult, ExecError> {
        let t = &self.session.target;
        let (desired, which) = self.place()?;
        let stopped = crate::commands::process::stop(&t.home, &desired, &which, &proc.job)
            .await
            .map_err(|e| sandbox::failed(t, &e))?;
        match stopped {
            Some("killed") => {
                self.set_state(id, "killed");
                Ok(json_result(
                    serde_json::json!({ "process_id": id, "state": "killed" }),
                ))
            }
            Some(_) => Ok(json_result(serde_json::json!({
                "process_id": id,
                "state": "not running",
            }))),
            None => {
                self.set_state(id, "gone");
                Ok(json_result(
                    serde_json::json!({ "process_id": id, "state": "gone" }),
                ))
            }
        }
    }

    fn set_state(&self, id: &str, state: &str) {
        if let Some(p) = self
            .session
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(id)
        {
            p.state = state.to_string();
        }
    }

    /// A file's lines numbered from `offset`, with what the model needs
    /// to read on.
    fn numbered(
        &self,
        path: &str,
        body: &[u8],
        offset: u64,
        size: u64,
        lines: u64,
        cut: bool,
    ) -> CallToolResult {
        let text = String::from_utf8_lossy(body);
        let mut out = String::with_capacity(text.len() + text.len() / 8);
        let mut shown = 0u64;
        for (n, line) in (offset..).zip(text.lines()) {
            out.push_str(&format!("{n:>6}|{line}\n"));
            shown += 1;
        }
        json_result(serde_json::json!({
            "path": path,
            "content": out,
            "size_bytes": size,
            "total_lines": lines,
            "first_line": offset,
            "lines_shown": shown,
            "truncated": cut || offset.saturating_add(shown) <= lines,
        }))
    }
}

/// Sends what a running command printed since the last notification as
/// MCP progress, when the client asked for progress (a progress token);
/// never ends.
async fn report_progress(ctx: &RequestContext<RoleServer>, capture: &Shared) {
    let Some(token) = ctx.meta.get_progress_token() else {
        return std::future::pending().await;
    };
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    let mut quiet = 0u32;
    let mut ticker = tokio::time::interval(PROGRESS_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let new = capture.lock().take_new();
        let message = match new {
            Some(text) => {
                quiet = 0;
                text
            }
            None => {
                quiet += 1;
                if quiet < HEARTBEAT_ROUNDS {
                    continue;
                }
                quiet = 0;
                format!("still running ({}s)", started.elapsed().as_secs())
            }
        };
        sent += 1;
        let param =
            ProgressNotificationParam::new(token.clone(), sent as f64).with_message(message);
        if let Err(e) = ctx.peer.notify_progress(param).await {
            tracing::debug!(error = %e, "cannot send a progress notification");
        }
    }
}

/// [`report_progress`] never ends.
fn unreachable_progress() -> Result<u8, ExecError> {
    Err(ExecError::Failed(
        "progress reporting ended before the command".to_string(),
    ))
}

/// 64 random bits as letters, for a marker no command prints by chance.
fn nonce() -> String {
    let mut buf = [0u8; 8];
    if getrandom::fill(&mut buf).is_err() {
        // A marker still works without randomness; it is only guessable.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        buf = (t as u64).to_le_bytes();
    }
    buf.iter()
        .flat_map(|b| [b'a' + (b >> 4), b'a' + (b & 0x0f)])
        .map(char::from)
        .collect()
}

/// The first line of `bytes` (without its newline) and the rest.
fn split_line(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &[]),
    }
}

/// The largest char boundary of `s` at or below `max`.
fn floor_char(s: &str, max: usize) -> usize {
    let mut i = max.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `text` cut into parts of at most `max` bytes, at char boundaries; at
/// least one part (empty for empty text).
fn split_parts(text: &str, max: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let at = floor_char(rest, max);
        parts.push(&rest[..at]);
        rest = &rest[at..];
    }
    parts.push(rest);
    parts
}

/// The tools, each schema (input, and output where a tool has one) made
/// flat ([`super::schema`]) once, for listing and for calls alike.
pub(super) fn router() -> &'static ToolRouter<Hermes> {
    static ROUTER: LazyLock<ToolRouter<Hermes>> = LazyLock::new(|| {
        let mut router = Hermes::tool_router();
        for route in router.map.values_mut() {
            let tool = &mut route.attr;
            tool.input_schema = Arc::new(super::schema::flatten(&tool.input_schema));
            if let Some(output) = &tool.output_schema {
                tool.output_schema = Some(Arc::new(super::schema::flatten(output)));
            }
        }
        router
    });
    &ROUTER
}

#[tool_handler(router = router())]
impl ServerHandler for Hermes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("hermes", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "hermes: a hardened, persistent sandbox for this session. Run commands with `terminal`, manage background processes with `process`, and read and write files with `read_file` and `write_file`. The sandbox holds no real API keys: requests to allowed AI providers go through the host's credential proxy.",
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_split_at_char_boundaries() {
        let text = "é".repeat(10);
        let parts = split_parts(&text, 5);
        assert!(parts.iter().all(|p| p.len() <= 5));
        assert_eq!(parts.concat(), text);
        assert_eq!(split_parts("", 5), vec![""]);
    }

    #[test]
    fn nonces_are_letters() {
        let n = nonce();
        assert_eq!(n.len(), 16);
        assert!(n.chars().all(|c| c.is_ascii_lowercase()));
    }
}
