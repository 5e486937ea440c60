//! config.yaml as Hermes Agent reads it, where that differs from a plain
//! reading of its YAML: hermes shares the file with the agent, so a value
//! the agent accepts means the same here.
//!
//! - A list (`docker_forward_env`, `docker_volumes`, `docker_extra_args`)
//!   or the mapping `docker_env` written as a JSON text in a string
//!   (`docker_forward_env: '["FOO"]'`), as the agent's own `hermes config
//!   set` writes it, is that list or mapping (the agent reads these keys
//!   through `TERMINAL_*` variables, with `json.loads`).
//! - `env_passthrough` as a string is ignored, as the agent ignores it,
//!   with a warning.
//! - A key the agent reads leniently ([`crate::schema::KeySpec::lenient`])
//!   holding a value it cannot use falls back to the default, with a
//!   warning; a list item it skips is skipped here too.
//! - The agent's own sections and keys ([`AGENT_SECTIONS`],
//!   [`AGENT_SECURITY_KEYS`]) are left alone without a word.
//! - `env_passthrough` never passes one of the agent's provider
//!   credentials ([`is_passthrough_blocked`]), with a warning naming it.
//! - `docker_mount_cwd_to_workspace: true` is warned about: see
//!   [`MOUNT_CWD_UNSUPPORTED`].

use crate::schema;
use crate::value::Value;
use crate::yaml::{Entry, Node, NodeKind, Pos, Scalar, Style};

use super::Issue;

#[path = "agent_lists.rs"]
mod lists;
pub use lists::{
    AGENT_SECTIONS, AGENT_SECURITY_KEYS, AGENT_TERMINAL_DEFAULTS, PROVIDER_ENV_BLOCKLIST,
    TERMINAL_ENV_MAP,
};

/// The `terminal` keys the agent also reads as JSON text, and whether the
/// text holds a mapping (else a list).
const JSON_KEYS: &[(&str, bool)] = &[
    ("docker_forward_env", false),
    ("docker_volumes", false),
    ("docker_extra_args", false),
    ("docker_env", true),
];

/// Why `docker_mount_cwd_to_workspace: true` does nothing in hermes.
pub const MOUNT_CWD_UNSUPPORTED: &str = "hermes does not bind a working directory of the host to /workspace: a sandbox hermes keeps is made by a pass, not by an agent started in a directory, so there is no such directory to bind, and /workspace stays in the sandbox's own data directory; bind the directory with terminal.docker_volumes (HOST:/workspace/NAME) instead";

/// Whether `env_passthrough` may never pass `name` on: one of the agent's
/// provider, tool and messaging credentials, or a secret it makes under a
/// name of its own (`AUXILIARY_*_API_KEY`, `AUXILIARY_*_BASE_URL`,
/// `GATEWAY_RELAY_*_SECRET`, `_KEY`, `_TOKEN`).
pub fn is_passthrough_blocked(name: &str) -> bool {
    if PROVIDER_ENV_BLOCKLIST.binary_search(&name).is_ok() {
        return true;
    }
    let upper = name.to_ascii_uppercase();
    (upper.starts_with("AUXILIARY_")
        && (upper.ends_with("_API_KEY") || upper.ends_with("_BASE_URL")))
        || (upper.starts_with("GATEWAY_RELAY_")
            && (upper.ends_with("_SECRET") || upper.ends_with("_KEY") || upper.ends_with("_TOKEN")))
}

/// A node made from a JSON value, every part of it at `at`: the JSON
/// text's place in the file, or (for a value from the environment) a
/// place of no file ([`ENV_POS`]).
pub(super) fn node_of_json(value: &serde_json::Value, at: Pos) -> Node {
    let scalar = |text: String, style: Style| {
        NodeKind::Scalar(Scalar {
            text,
            style,
            tag: None,
        })
    };
    let kind = match value {
        serde_json::Value::Null => scalar("null".to_string(), Style::Plain),
        serde_json::Value::Bool(b) => scalar(b.to_string(), Style::Plain),
        serde_json::Value::Number(n) => scalar(n.to_string(), Style::Plain),
        serde_json::Value::String(s) => scalar(s.clone(), Style::Quoted),
        serde_json::Value::Array(items) => NodeKind::Seq {
            items: items.iter().map(|v| node_of_json(v, at)).collect(),
            flow: true,
        },
        serde_json::Value::Object(map) => NodeKind::Map {
            entries: map
                .iter()
                .map(|(k, v)| Entry {
                    key: k.clone(),
                    key_pos: at,
                    value: node_of_json(v, at),
                })
                .collect(),
            flow: true,
        },
    };
    Node {
        kind,
        start: at,
        end: at,
    }
}

/// Where a value from the environment is: line 0, which no file has.
pub(crate) const ENV_POS: Pos = Pos { line: 0, col: 0 };

/// The `terminal` section's entries, to change.
fn terminal_entries(root: &mut Node) -> Option<&mut Vec<Entry>> {
    let NodeKind::Map { entries, .. } = &mut root.kind else {
        return None;
    };
    let terminal = entries.iter_mut().find(|e| e.key == "terminal")?;
    match &mut terminal.value.kind {
        NodeKind::Map { entries, .. } => Some(entries),
        _ => None,
    }
}

/// Reads the file's values as the agent does (the module's list), before
/// the schema's checks: JSON texts become the lists and mappings they
/// hold; what the agent ignores or falls back from is taken out, each
/// with a warning.
pub(super) fn normalize(root: &mut Node, warnings: &mut Vec<Issue>) {
    let Some(entries) = terminal_entries(root) else {
        return;
    };
    for entry in entries.iter_mut() {
        let Some(&(_, mapping)) = JSON_KEYS.iter().find(|(k, _)| *k == entry.key) else {
            continue;
        };
        let NodeKind::Scalar(s) = &entry.value.kind else {
            continue;
        };
        if !matches!(s.resolve(), Value::Str(_)) {
            continue;
        }
        let text = s.text.trim();
        let opens = if mapping { '{' } else { '[' };
        if !text.starts_with(opens) {
            continue;
        }
        let Ok(json) = serde_json::from_str::<serde_json::Value>(text) else {
            continue; // the type check says what it expected
        };
        if json.is_object() == mapping && (json.is_array() || json.is_object()) {
            entry.value = node_of_json(&json, entry.value.start);
        }
    }
    entries.retain(|entry| keep(entry, warnings));
}

/// Whether an entry of `terminal` stays: not when the agent ignores it or
/// falls back to its default (the warning says so).
fn keep(entry: &Entry, warnings: &mut Vec<Issue>) -> bool {
    let path = format!("terminal.{}", entry.key);
    let Some(spec) = schema::lookup(&path).filter(|s| s.lenient) else {
        return true;
    };
    if entry.key == "env_passthrough"
        && let NodeKind::Scalar(s) = &entry.value.kind
        && matches!(s.resolve(), Value::Str(_))
    {
        warnings.push(Issue::new(
            path,
            entry.value.start,
            "Hermes Agent reads terminal.env_passthrough only as a list, and ignores this string; so does hermes (write it as a list of names)",
        ));
        return false;
    }
    let mut problems = Vec::new();
    super::check(spec, &path, &entry.value, &mut problems);
    let default = spec.default.to_value().to_yaml_inline();
    let whole = problems.iter().any(|p| p.path == path);
    for p in problems {
        let message = if p.path == path {
            format!(
                "{}; Hermes Agent falls back to its default ({default}), and so does hermes",
                p.message
            )
        } else {
            format!("{}; Hermes Agent skips it, and so does hermes", p.message)
        };
        warnings.push(Issue { message, ..p });
    }
    !whole
}

/// The warnings of the agent's keys over the tree as validated: a
/// blocked `env_passthrough` name, `docker_mount_cwd_to_workspace: true`.
pub(super) fn check(root: &Node, warnings: &mut Vec<Issue>) {
    let Some(terminal) = root.get("terminal") else {
        return;
    };
    let terminal = &terminal.value;
    if let Some(entry) = terminal.get("env_passthrough")
        && let NodeKind::Seq { items, .. } = &entry.value.kind
    {
        for (i, item) in items.iter().enumerate() {
            if let Value::Str(name) = item.to_value()
                && is_passthrough_blocked(name.trim())
            {
                warnings.push(Issue::new(
                    format!("terminal.env_passthrough[{i}]"),
                    item.start,
                    format!(
                        "`{name}` is a credential Hermes Agent never passes through to a sandbox (its provider blocklist); neither does hermes"
                    ),
                ));
            }
        }
    }
    if let Some(entry) = terminal.get("docker_mount_cwd_to_workspace")
        && entry.value.to_value() == Value::Bool(true)
    {
        warnings.push(Issue::new(
            "terminal.docker_mount_cwd_to_workspace",
            entry.value.start,
            MOUNT_CWD_UNSUPPORTED,
        ));
    }
}

/// Whether a key of a section is the agent's alone: hermes leaves it
/// without a word.
pub(super) fn is_agent_key(section: &str, key: &str) -> bool {
    section == "security" && AGENT_SECURITY_KEYS.contains(&key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_blocklist_is_sorted_so_a_binary_search_finds_every_name() {
        assert!(PROVIDER_ENV_BLOCKLIST.windows(2).all(|w| w[0] < w[1]));
        for name in PROVIDER_ENV_BLOCKLIST {
            assert!(is_passthrough_blocked(name), "{name}");
        }
        assert!(is_passthrough_blocked("OPENAI_API_KEY"));
        assert!(is_passthrough_blocked("AUXILIARY_VISION_API_KEY"));
        assert!(is_passthrough_blocked("gateway_relay_x_token"));
        assert!(!is_passthrough_blocked("GATEWAY_RELAY_URL"));
        assert!(!is_passthrough_blocked("NOTION_TOKEN"));
        assert!(!is_passthrough_blocked("PIP_INDEX_URL"));
    }
}
