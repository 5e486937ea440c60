//! The Daytona request and answer bodies hermes uses, and the pure rules
//! that shape them: the sandbox name and labels, the resources (disk
//! capped), the state mapping, the session command.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cloud::{CloudSpec, CloudState};
use crate::model::sandbox::{LABEL_AGENT, LABEL_PROFILE, sanitize};

/// The label naming the task a sandbox serves.
pub const LABEL_TASK: &str = "hermes-task";

/// The largest disk hermes asks for, in GiB (Daytona's default per-sandbox
/// limit).
pub const MAX_DISK_GIB: u64 = 10;

/// The service-side name of the sandbox serving `task`.
pub fn sandbox_name(task: &str) -> String {
    format!("hermes-{}", sanitize(task))
}

/// The labels every hermes sandbox carries, by which `find` looks it up.
pub fn labels(profile: &str, task: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_AGENT.to_owned(), "1".to_owned()),
        (LABEL_PROFILE.to_owned(), sanitize(profile)),
        (LABEL_TASK.to_owned(), sanitize(task)),
    ])
}

/// Whole vCPUs, at least one.
pub fn cpu_units(cpu: f64) -> u64 {
    if cpu.is_finite() && cpu > 1.0 {
        // Bounded and positive: the cast cannot wrap.
        cpu.ceil().min(1024.0) as u64
    } else {
        1
    }
}

/// MiB rounded up to whole GiB, at least one.
pub fn gib(mb: u64) -> u64 {
    mb.div_ceil(1024).max(1)
}

/// The disk in GiB, capped at [`MAX_DISK_GIB`].
pub fn disk_gib(mb: u64) -> u64 {
    gib(mb).min(MAX_DISK_GIB)
}

/// `POST /sandbox` (CreateSandboxDto).
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_info: Option<BuildInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<u64>,
    /// Minutes without activity before Daytona stops it (0: never).
    pub auto_stop_interval: u64,
}

/// An image to build the sandbox from: `FROM <image>`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BuildInfo {
    pub dockerfile_content: String,
}

impl CreateSandbox {
    /// From `spec`'s image, or from a Daytona snapshot (which brings its own
    /// resources: Daytona refuses resources with a snapshot).
    pub fn new(spec: &CloudSpec, snapshot: Option<&str>) -> CreateSandbox {
        let (snapshot, build_info, cpu, memory, disk) = match snapshot {
            Some(name) => (Some(name.to_owned()), None, None, None, None),
            None => (
                None,
                Some(BuildInfo {
                    dockerfile_content: format!("FROM {}\n", spec.image),
                }),
                Some(cpu_units(spec.cpu)),
                Some(gib(spec.memory_mb)),
                Some(disk_gib(spec.disk_mb)),
            ),
        };
        CreateSandbox {
            name: sandbox_name(&spec.task),
            labels: labels(&spec.profile, &spec.task),
            env: spec.env.iter().cloned().collect(),
            snapshot,
            build_info,
            cpu,
            memory,
            disk,
            auto_stop_interval: spec.lifetime.as_secs().div_ceil(60),
        }
    }
}

/// A sandbox as Daytona describes it (the fields hermes reads).
#[derive(Debug, Deserialize, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    pub id: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Sandbox {
    pub fn cloud_state(&self) -> CloudState {
        state(self.state.as_deref().unwrap_or("unknown"))
    }
}

/// `GET /sandbox`: a page (`items`), or a bare list from older servers.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SandboxList {
    Page { items: Vec<Sandbox> },
    Bare(Vec<Sandbox>),
}

impl SandboxList {
    pub fn into_items(self) -> Vec<Sandbox> {
        match self {
            SandboxList::Page { items } | SandboxList::Bare(items) => items,
        }
    }
}

/// Daytona's sandbox states in hermes' terms.
pub fn state(name: &str) -> CloudState {
    match name {
        "started" => CloudState::Running,
        "stopped" | "archived" => CloudState::Stopped,
        "error" | "build_failed" | "destroyed" | "destroying" => CloudState::Dead,
        _ => CloudState::Pending,
    }
}

/// `GET /sandbox/{id}/toolbox-proxy-url`.
#[derive(Debug, Deserialize)]
pub struct ToolboxProxyUrl {
    pub url: String,
}

/// `POST /process/session/{sessionId}/exec` (SessionExecuteRequest).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionExecute {
    pub command: String,
    pub run_async: bool,
    #[serde(rename = "async")]
    pub async_: bool,
}

/// Its answer (SessionExecuteResponse) and `GET …/command/{commandId}`
/// (Command): the id and, once it ended, the exit code.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionCommand {
    #[serde(default, alias = "id")]
    pub cmd_id: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i64>,
}

/// `POST /process/execute` (ExecuteRequest), for the kill.
#[derive(Debug, Serialize)]
pub struct Execute {
    pub command: String,
    pub timeout: u64,
}

/// Runs in the session's shell: a `/bin/sh` that sources the uploaded
/// environment file, deletes it, enters the directory and execs the
/// arguments with no input. No single quote, so it can be quoted.
const SESSION_SCRIPT: &str = r#"f=$1; d=$2; shift 2
set -a; . "$f" || exit 125; set +a
rm -f -- "$f"; rmdir -- "${f%/*}" 2>/dev/null
if [ -n "$d" ]; then cd -- "$d" || exit 125; fi
exec "$@""#;

/// The command string of one exec: only the script, the environment
/// file's path, the directory and the arguments; no environment value.
pub fn session_command(env_file: &str, cwd: Option<&str>, argv: &[String]) -> String {
    let mut out = format!(
        "/bin/sh -c '{SESSION_SCRIPT}' hermes-exec {} {}",
        shell_quote(env_file),
        shell_quote(cwd.unwrap_or(""))
    );
    for arg in argv {
        out.push(' ');
        out.push_str(&shell_quote(arg));
    }
    out.push_str(" < /dev/null");
    out
}

/// The environment file: `NAME='value'` lines for `set -a; .`. Names must
/// have been checked ([`hermes_model::config::is_env_name`]).
pub fn env_file(env: &[(String, String)]) -> String {
    let mut out = String::new();
    for (name, value) in env {
        out.push_str(name);
        out.push('=');
        out.push_str(&shell_quote(value));
        out.push('\n');
    }
    out
}

/// `'value'` for a POSIX shell.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn spec() -> CloudSpec {
        CloudSpec {
            task: "my task/1".to_owned(),
            profile: "default".to_owned(),
            image: "python:3.12".to_owned(),
            cpu: 1.5,
            memory_mb: 5120,
            disk_mb: 51200,
            lifetime: Duration::from_secs(300),
            env: vec![("A".to_owned(), "1".to_owned())],
            transforms: Vec::new(),
        }
    }

    #[test]
    fn name_and_labels_are_sanitized() {
        assert_eq!(sandbox_name("my task/1"), "hermes-my_task_1");
        let l = labels("p", "my task/1");
        assert_eq!(l["hermes-agent"], "1");
        assert_eq!(l["hermes-profile"], "p");
        assert_eq!(l["hermes-task"], "my_task_1");
        assert_eq!(sanitize(&"x".repeat(100)).len(), 63);
    }

    #[test]
    fn resources_round_up_and_the_disk_is_capped() {
        assert_eq!(cpu_units(1.5), 2);
        assert_eq!(cpu_units(0.25), 1);
        assert_eq!(cpu_units(f64::NAN), 1);
        assert_eq!(gib(5120), 5);
        assert_eq!(gib(1), 1);
        assert_eq!(disk_gib(51200), MAX_DISK_GIB);
        assert_eq!(disk_gib(4096), 4);
    }

    #[test]
    fn create_body_follows_the_spec() {
        let body = serde_json::to_value(CreateSandbox::new(&spec(), None)).unwrap();
        assert_eq!(body["name"], "hermes-my_task_1");
        assert_eq!(body["buildInfo"]["dockerfileContent"], "FROM python:3.12\n");
        assert_eq!(body["cpu"], 2);
        assert_eq!(body["memory"], 5);
        assert_eq!(body["disk"], 10);
        assert_eq!(body["autoStopInterval"], 5);
        assert_eq!(body["env"]["A"], "1");
        assert!(body.get("snapshot").is_none());

        let body = serde_json::to_value(CreateSandbox::new(&spec(), Some("snap"))).unwrap();
        assert_eq!(body["snapshot"], "snap");
        assert!(body.get("cpu").is_none());
        assert!(body.get("buildInfo").is_none());
    }

    #[test]
    fn states_map() {
        assert_eq!(state("started"), CloudState::Running);
        assert_eq!(state("stopped"), CloudState::Stopped);
        assert_eq!(state("starting"), CloudState::Pending);
        assert_eq!(state("build_failed"), CloudState::Dead);
    }

    #[test]
    fn lists_in_both_shapes() {
        let page: SandboxList =
            serde_json::from_str(r#"{"items":[{"id":"a","state":"started"}],"total":1}"#).unwrap();
        assert_eq!(page.into_items()[0].id, "a");
        let bare: SandboxList = serde_json::from_str(r#"[{"id":"b"}]"#).unwrap();
        assert_eq!(bare.into_items()[0].cloud_state(), CloudState::Pending);
    }

    #[test]
    fn the_command_carries_no_environment_value() {
        let cmd = session_command(
            "/tmp/e",
            Some("/work dir"),
            &["echo".to_owned(), "it's".to_owned()],
        );
        assert!(cmd.starts_with("/bin/sh -c '"));
        assert!(cmd.ends_with(r"'/tmp/e' '/work dir' 'echo' 'it'\''s' < /dev/null"));
        assert!(!SESSION_SCRIPT.contains('\''));
        let file = env_file(&[("K".to_owned(), "v'1\nx".to_owned())]);
        assert_eq!(file, "K='v'\\''1\nx'\n");
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
