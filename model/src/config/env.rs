//! The `TERMINAL_*` variables over config.yaml, as Hermes Agent applies
//! them (its `apply_terminal_config_to_env`, then its terminal tool
//! reading the variables).
//!
//! The agent's `TERMINAL_CONFIG_ENV_MAP` ([`TERMINAL_ENV_MAP`]) names a
//! variable for each of 28 keys of `terminal`. Which wins:
//!
//! - the file has a `terminal:` mapping: the file, for every key it has
//!   and every key of the agent's defaults ([`AGENT_TERMINAL_DEFAULTS`]);
//!   the variable, for the others (`sandbox_dir`, `lifetime_seconds`,
//!   `ssh_*`, `docker_persist_across_processes`, `docker_orphan_reaper`
//!   unless the file sets them), and for `cwd` while the file's is `.`,
//!   `auto` or `cwd` (the agent never bridges those);
//! - no `terminal:` mapping (none, or `terminal:` with nothing): the
//!   variable, for every key.
//!
//! A value is read as the agent reads it: lists and `docker_env` as JSON,
//! integers and numbers as Python's `int` and `float` take them, booleans
//! true for `true`, `1` and `yes` (any case), false for `false`, `0`,
//! `no` and nothing, and false with a warning for anything else; an
//! empty text is no value for a key of text. A value the agent would not
//! read on the configured backend (the container limits but on docker,
//! singularity, modal and daytona; the Docker lists but on docker) is
//! taken when it reads, and otherwise ignored with a warning, as the
//! agent ignores it.
//!
//! Each value taken becomes the key's node in the tree, at a place of no
//! file ([`super::agent::ENV_POS`]), so that every check the file's
//! values get applies to it; a problem found there is named by the
//! variable (`TERMINAL_DOCKER_VOLUMES[0]: …`), without a file or line.
//!
//! Pure: the caller passes the variables (the process's, `.env` over them,
//! as the agent loads `.env`).

use std::collections::BTreeMap;

use crate::schema::{self, Ty};
use crate::value::Value;
use crate::yaml::{Entry, Node, NodeKind, Scalar, Style};

use super::Issue;
use super::agent::{AGENT_TERMINAL_DEFAULTS, ENV_POS, TERMINAL_ENV_MAP, node_of_json};

/// A key of config.yaml whose value came from a `TERMINAL_*` variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOverride {
    /// `terminal.docker_image`.
    pub path: String,
    /// `TERMINAL_DOCKER_IMAGE`.
    pub var: &'static str,
    /// The variable's text.
    pub value: String,
}

/// The variable of a key of `terminal` (its leaf), if the agent has one.
pub fn variable_of(leaf: &str) -> Option<&'static str> {
    TERMINAL_ENV_MAP
        .iter()
        .find(|(key, _)| *key == leaf)
        .map(|(_, var)| *var)
}

/// Whether an issue's path names a variable (`TERMINAL_DOCKER_ENV.A`)
/// rather than a key of the file.
pub fn is_variable_path(path: &str) -> bool {
    TERMINAL_ENV_MAP.iter().any(|(_, var)| {
        path.strip_prefix(var)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['[', '.']))
    })
}

/// The variables of [`TERMINAL_ENV_MAP`] among `vars`.
pub fn terminal_vars<'a>(
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(k, _)| TERMINAL_ENV_MAP.iter().any(|(_, var)| var == k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Backends on which the agent reads the container limits' variables.
const CONTAINER_BACKENDS: &[&str] = &["docker", "singularity", "modal", "daytona"];

/// Lays the variables that win over the file ([`self`]'s rules) onto the
/// tree, and says which keys they set. A value that cannot be read is an
/// error naming the variable, or a warning when the agent would not read
/// it on the backend.
pub(crate) fn apply(
    root: Option<Node>,
    env: &BTreeMap<String, String>,
    errors: &mut Vec<Issue>,
    warnings: &mut Vec<Issue>,
) -> (Option<Node>, Vec<EnvOverride>) {
    if !TERMINAL_ENV_MAP
        .iter()
        .any(|(_, var)| env.contains_key(*var))
    {
        return (root, Vec::new());
    }
    let mut root = root.unwrap_or_else(|| Node {
        kind: NodeKind::Map {
            entries: Vec::new(),
            flow: false,
        },
        start: ENV_POS,
        end: ENV_POS,
    });
    let NodeKind::Map { entries, .. } = &mut root.kind else {
        // Not a mapping: the file's own error says so.
        return (Some(root), Vec::new());
    };
    let at = match entries.iter().position(|e| e.key == "terminal") {
        Some(i) => i,
        None => {
            entries.push(Entry {
                key: "terminal".to_string(),
                key_pos: ENV_POS,
                value: scalar("null", Style::Plain),
            });
            entries.len() - 1
        }
    };
    let terminal = &mut entries[at].value;
    let file_section = match &terminal.kind {
        NodeKind::Map { .. } => true,
        NodeKind::Scalar(s) if s.resolve() == Value::Null => {
            terminal.kind = NodeKind::Map {
                entries: Vec::new(),
                flow: false,
            };
            false
        }
        // Not a mapping: the file's own error says so.
        _ => return (Some(root), Vec::new()),
    };
    let NodeKind::Map { entries, .. } = &mut terminal.kind else {
        return (Some(root), Vec::new());
    };
    let file_has = |entries: &[Entry], leaf: &str| entries.iter().any(|e| e.key == leaf);
    let wins = |entries: &[Entry], leaf: &str| {
        if !file_section {
            return true;
        }
        if leaf == "cwd" {
            let cwd = entries
                .iter()
                .find(|e| e.key == "cwd")
                .map_or(Value::Str(".".to_string()), |e| e.value.to_value());
            if let Value::Str(cwd) = cwd
                && matches!(cwd.trim(), "." | "auto" | "cwd")
            {
                return true;
            }
        }
        !file_has(entries, leaf) && !AGENT_TERMINAL_DEFAULTS.contains(&leaf)
    };
    // The backend first: which variables the agent reads depends on it.
    let file_backend = entries
        .iter()
        .find(|e| e.key == "backend")
        .map(|e| e.value.to_value());
    let backend = match (env.get("TERMINAL_ENV"), wins(entries, "backend")) {
        (Some(v), true) if !v.trim().is_empty() => v.trim().to_string(),
        _ => match file_backend {
            Some(Value::Str(b)) => b,
            _ => "local".to_string(),
        },
    };
    let mut overrides = Vec::new();
    for (leaf, var) in TERMINAL_ENV_MAP {
        let Some(raw) = env.get(*var) else {
            continue;
        };
        if !wins(entries, leaf) {
            continue;
        }
        let path = format!("terminal.{leaf}");
        let Some(spec) = schema::lookup(&path) else {
            continue;
        };
        let read = match *leaf {
            "container_cpu" | "container_memory" | "container_disk" => {
                CONTAINER_BACKENDS.contains(&backend.as_str())
            }
            "docker_forward_env" | "docker_volumes" | "docker_env" | "docker_extra_args" => {
                backend == "docker"
            }
            _ => true,
        };
        let node = match parse(spec.ty, raw) {
            Ok(Parsed::Unset) => continue,
            Ok(Parsed::Node(node)) => node,
            Ok(Parsed::Loose(node, why)) => {
                warnings.push(env_issue(var, why));
                node
            }
            Err(why) if read => {
                errors.push(env_issue(var, why));
                continue;
            }
            Err(why) => {
                warnings.push(env_issue(
                    var,
                    format!(
                        "{why}; ignored: Hermes Agent does not read it on the {backend} backend"
                    ),
                ));
                continue;
            }
        };
        entries.retain(|e| e.key != *leaf);
        entries.push(Entry {
            key: leaf.to_string(),
            key_pos: ENV_POS,
            value: node,
        });
        overrides.push(EnvOverride {
            path,
            var,
            value: raw.clone(),
        });
    }
    (Some(root), overrides)
}

/// An issue of a variable's value: its name, no file, no line.
fn env_issue(var: &str, message: String) -> Issue {
    Issue {
        path: var.to_string(),
        pos: None,
        message,
    }
}

/// What a variable's text is as the agent reads it.
enum Parsed {
    Node(Node),
    /// Read, but not as written (a boolean that is neither true nor
    /// false): the warning says how.
    Loose(Node, String),
    /// No value (an empty text for a key of text).
    Unset,
}

fn scalar(text: &str, style: Style) -> Node {
    Node {
        kind: NodeKind::Scalar(Scalar {
            text: text.to_string(),
            style,
            tag: None,
        }),
        start: ENV_POS,
        end: ENV_POS,
    }
}

/// Reads a variable's text for a key of type `ty`.
fn parse(ty: Ty, raw: &str) -> Result<Parsed, String> {
    let trimmed = raw.trim();
    match ty {
        Ty::Bool => {
            let lower = raw.to_lowercase();
            Ok(match lower.as_str() {
                "true" | "1" | "yes" => Parsed::Node(scalar("true", Style::Plain)),
                "false" | "0" | "no" | "" => Parsed::Node(scalar("false", Style::Plain)),
                _ => Parsed::Loose(
                    scalar("false", Style::Plain),
                    format!(
                        "`{raw}` reads as false: Hermes Agent takes only true, 1 and yes as true"
                    ),
                ),
            })
        }
        Ty::PosInt | Ty::OptPosInt | Ty::Port | Ty::LimitInt => {
            let digits = trimmed
                .strip_prefix('+')
                .unwrap_or(trimmed)
                .replace('_', "");
            match digits.parse::<i64>() {
                Ok(n)
                    if !trimmed.contains("__")
                        && !trimmed.starts_with('_')
                        && !trimmed.ends_with('_') =>
                {
                    Ok(Parsed::Node(scalar(&n.to_string(), Style::Plain)))
                }
                _ => Err(format!("`{raw}` is not an integer")),
            }
        }
        Ty::PosNumber | Ty::LimitNumber | Ty::Number => match trimmed.parse::<f64>() {
            Ok(f) if f.is_finite() => {
                let text = if f.fract() == 0.0 && f.abs() < 1e15 {
                    format!("{}", f as i64)
                } else {
                    f.to_string()
                };
                Ok(Parsed::Node(scalar(&text, Style::Plain)))
            }
            _ => Err(format!("`{raw}` is not a finite number")),
        },
        Ty::StrList
        | Ty::EnvNameList
        | Ty::VolumeList
        | Ty::EnvMap
        | Ty::LabelMap
        | Ty::TolerationList => match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(json) => Ok(Parsed::Node(node_of_json(&json, ENV_POS))),
            Err(e) => Err(format!(
                "`{raw}` is not valid JSON ({e}); Hermes Agent reads this variable as a JSON {}",
                if matches!(ty, Ty::EnvMap | Ty::LabelMap) {
                    "object, such as {\"NAME\": \"value\"}"
                } else {
                    "list, such as [\"a\", \"b\"]"
                }
            )),
        },
        // Text: the key's own check takes it from here.
        _ if raw.is_empty() => Ok(Parsed::Unset),
        _ => Ok(Parsed::Node(scalar(raw, Style::Quoted))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::{Loaded, load_with};

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with(text: &str, pairs: &[(&str, &str)]) -> Loaded {
        load_with(text, &[], &vars(pairs)).unwrap()
    }

    fn rendered_errors(text: &str, pairs: &[(&str, &str)]) -> Vec<String> {
        match load_with(text, &[], &vars(pairs)) {
            Ok(loaded) => loaded
                .config
                .sandbox_errors
                .iter()
                .map(|i| i.render("config.yaml"))
                .collect(),
            Err(e) => e.0.iter().map(|i| i.render("config.yaml")).collect(),
        }
    }

    #[test]
    fn without_a_terminal_mapping_every_variable_wins() {
        let env = [
            ("TERMINAL_ENV", "docker"),
            ("TERMINAL_DOCKER_IMAGE", "debian:12"),
            ("TERMINAL_DOCKER_FORWARD_ENV", "[\"FOO\"]"),
            ("TERMINAL_CONTAINER_MEMORY", "0"),
            ("TERMINAL_DOCKER_NETWORK", "no"),
            ("UNRELATED", "x"),
        ];
        for text in ["", "proxy:\n  enabled: false\n", "terminal:\n"] {
            let loaded = with(text, &env);
            let t = &loaded.config.terminal;
            assert_eq!(t.backend, crate::config::Backend::Docker, "{text:?}");
            assert_eq!(t.docker_image, "debian:12");
            assert_eq!(t.docker_forward_env, ["FOO"]);
            assert_eq!(t.container_memory_mb, 0);
            assert!(!t.docker_network);
            let set: Vec<&str> = loaded.overrides.iter().map(|o| o.var).collect();
            assert_eq!(
                set,
                [
                    "TERMINAL_ENV",
                    "TERMINAL_DOCKER_IMAGE",
                    "TERMINAL_DOCKER_FORWARD_ENV",
                    "TERMINAL_CONTAINER_MEMORY",
                    "TERMINAL_DOCKER_NETWORK"
                ]
            );
            assert_eq!(loaded.overrides[1].path, "terminal.docker_image");
        }
    }

    #[test]
    fn with_a_terminal_mapping_the_file_and_the_agents_defaults_win_and_the_rest_comes_from_the_environment()
     {
        let env = [
            ("TERMINAL_DOCKER_IMAGE", "debian:12"),
            ("TERMINAL_TIMEOUT", "5"),
            ("TERMINAL_SANDBOX_DIR", "/data/sandboxes"),
            ("TERMINAL_LIFETIME_SECONDS", "60"),
            ("TERMINAL_SSH_HOST", "box"),
            ("TERMINAL_CWD", "/srv/project"),
        ];
        let loaded = with("terminal:\n  timeout: 30\n", &env);
        let t = &loaded.config.terminal;
        // The file's, and a key of the agent's defaults: the file wins.
        assert_eq!(t.timeout_seconds, 30);
        assert_eq!(t.docker_image, crate::schema::DEFAULT_DOCKER_IMAGE);
        // No default in the agent: the variable.
        assert_eq!(t.sandbox_dir.as_deref(), Some("/data/sandboxes"));
        assert_eq!(t.lifetime_seconds, 60);
        assert_eq!(t.ssh_host.as_deref(), Some("box"));
        // The agent never bridges a cwd of `.`.
        assert_eq!(t.cwd, "/srv/project");
        let loaded = with("terminal:\n  sandbox_dir: /mine\n  cwd: /srv/mine\n", &env);
        assert_eq!(loaded.config.terminal.sandbox_dir.as_deref(), Some("/mine"));
        assert_eq!(loaded.config.terminal.cwd, "/srv/mine");
        // An empty text is no value.
        let loaded = with(
            "",
            &[("TERMINAL_SSH_HOST", ""), ("TERMINAL_SANDBOX_DIR", "")],
        );
        assert_eq!(loaded.config.terminal.ssh_host, None);
        assert!(loaded.overrides.is_empty());
    }

    #[test]
    fn values_are_read_as_the_agent_reads_them() {
        let loaded = with(
            "",
            &[
                ("TERMINAL_ENV", "docker"),
                ("TERMINAL_CONTAINER_CPU", " 1.5 "),
                ("TERMINAL_SSH_PORT", "+2_222"),
                ("TERMINAL_DOCKER_ENV", "{\"A\": \"1\"}"),
                ("TERMINAL_CONTAINER_PERSISTENT", "YES"),
                ("TERMINAL_DOCKER_RUN_AS_HOST_USER", "1"),
                ("TERMINAL_DOCKER_NETWORK", "on"),
            ],
        );
        let t = &loaded.config.terminal;
        assert_eq!(t.container_cpu, 1.5);
        assert_eq!(t.ssh_port, 2222);
        assert_eq!(t.docker_env, [("A".to_string(), "1".to_string())]);
        assert!(t.container_persistent);
        assert!(t.docker_run_as_host_user);
        // Only true, 1 and yes are true to the agent.
        assert!(!t.docker_network);
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            [
                "TERMINAL_DOCKER_NETWORK: `on` reads as false: Hermes Agent takes only true, 1 and yes as true"
            ]
        );
    }

    #[test]
    fn a_bad_value_is_named_by_its_variable_without_a_file_or_line() {
        assert_eq!(
            rendered_errors("", &[("TERMINAL_TIMEOUT", "5m")]),
            ["TERMINAL_TIMEOUT: `5m` is not an integer"]
        );
        assert_eq!(
            rendered_errors("", &[("TERMINAL_TIMEOUT", "0")]),
            ["TERMINAL_TIMEOUT: must be at least 1, found 0"]
        );
        let e = rendered_errors(
            "proxy:\n  enabled: true\n",
            &[
                ("TERMINAL_ENV", "docker"),
                (
                    "TERMINAL_DOCKER_VOLUMES",
                    "[\"/srv:/srv\", \"/var/run/docker.sock:/s\"]",
                ),
            ],
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("TERMINAL_DOCKER_VOLUMES[1]: `/var/run/docker.sock:/s` hands the sandbox the Docker engine's socket"),
            "{e:?}"
        );
        let e = rendered_errors(
            "",
            &[
                ("TERMINAL_ENV", "docker"),
                ("TERMINAL_DOCKER_VOLUMES", "/srv:/srv"),
            ],
        );
        assert!(
            e[0].starts_with("TERMINAL_DOCKER_VOLUMES: `/srv:/srv` is not valid JSON"),
            "{e:?}"
        );
    }

    #[test]
    fn a_bad_value_the_agent_does_not_read_on_the_backend_is_ignored_with_a_warning() {
        let loaded = with(
            "",
            &[
                ("TERMINAL_DOCKER_VOLUMES", "/srv:/srv"),
                ("TERMINAL_CONTAINER_MEMORY", "lots"),
            ],
        );
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 2, "{w:?}");
        // In the order of the agent's map.
        assert!(
            w[0].starts_with("TERMINAL_CONTAINER_MEMORY: `lots` is not an integer"),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("TERMINAL_DOCKER_VOLUMES: `/srv:/srv` is not valid JSON"),
            "{w:?}"
        );
        assert!(
            w[1].ends_with("ignored: Hermes Agent does not read it on the local backend"),
            "{w:?}"
        );
        assert!(loaded.overrides.is_empty());
    }

    #[test]
    fn docker_extra_args_from_the_environment_block_the_docker_sandboxes_by_its_name() {
        let loaded = with(
            "",
            &[
                ("TERMINAL_ENV", "docker"),
                ("TERMINAL_DOCKER_NETWORK", "false"),
                (
                    "TERMINAL_DOCKER_EXTRA_ARGS",
                    "[\"--shm-size=1g\", \"--privileged\", \"--network=ml\"]",
                ),
            ],
        );
        let e: Vec<String> = loaded
            .config
            .sandbox_errors
            .iter()
            .map(|i| i.render("config.yaml"))
            .collect();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("TERMINAL_DOCKER_EXTRA_ARGS[1]: `--privileged`"),
            "{e:?}"
        );
        assert!(
            e[1].contains(
                "contradicts terminal.docker_network: false (from TERMINAL_DOCKER_NETWORK)"
            ),
            "{e:?}"
        );
    }

    #[test]
    fn the_credentials_check_sees_the_backend_a_variable_sets() {
        let env = crate::desired::HostEnv {
            process: [("TERMINAL_ENV".to_string(), "daytona".to_string())].into(),
            ..Default::default()
        };
        let issues = crate::cloud::check_credentials("", &env);
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(
            issues[0]
                .render("config.yaml")
                .starts_with("TERMINAL_ENV: DAYTONA_API_KEY is not set"),
            "{issues:?}"
        );
        // `.env` over the process, as the agent loads it.
        let env = crate::desired::HostEnv {
            process: [("TERMINAL_ENV".to_string(), "daytona".to_string())].into(),
            dotenv: vec![("TERMINAL_ENV".to_string(), "local".to_string())],
            ..Default::default()
        };
        assert!(crate::cloud::check_credentials("", &env).is_empty());
    }

    #[test]
    fn every_variable_of_the_agent_names_a_key_of_the_schema() {
        for (leaf, var) in TERMINAL_ENV_MAP {
            assert!(
                schema::lookup(&format!("terminal.{leaf}")).is_some(),
                "{var}: terminal.{leaf} is not in schema::KEYS"
            );
            assert!(is_variable_path(var));
        }
        for leaf in AGENT_TERMINAL_DEFAULTS {
            assert!(
                schema::lookup(&format!("terminal.{leaf}")).is_some(),
                "terminal.{leaf}, of the agent's defaults, is not in schema::KEYS"
            );
        }
        assert!(is_variable_path("TERMINAL_DOCKER_VOLUMES[2]"));
        assert!(is_variable_path("TERMINAL_DOCKER_ENV.A"));
        assert!(!is_variable_path("TERMINAL_DOCKER_VOLUMESX"));
        assert!(!is_variable_path("terminal.docker_volumes"));
    }
}
