//! The settings a user sets that shape a Docker sandbox, kept beside the
//! spec hash so a plan can say which of them changed, old and new.
//!
//! They are derived from the [`SandboxSpec`] and stored at create time, as
//! compact JSON, in the [`LABEL_SETTINGS`] label (not part of the spec
//! hash, which stays the drift signal). An environment value is never
//! stored: only a short fingerprint of it, so a plan can say
//! `docker_env.X changed` without showing either value (the engine shows
//! the value itself to whoever can inspect the container anyway).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::sandbox::{CAP_ADD, LABEL_EGRESS, NPROC_RESERVE_ENV, PIDS_LIMIT, SandboxSpec};

/// The label holding a sandbox's settings as a JSON object of strings.
pub const LABEL_SETTINGS: &str = "hermes-settings";

/// The prefix of the settings that hold an environment value's
/// fingerprint: their values are never shown.
const ENV_PREFIX: &str = "docker_env.";

/// One setting that differs between the container and the config. `None`:
/// not set on that side. For an environment variable, both sides say only
/// whether it is set (`"(not shown)"`), never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    #[serde(rename = "field")]
    pub field: String,
    #[serde(rename = "old")]
    pub old: Option<String>,
    #[serde(rename = "new")]
    pub new: Option<String>,
}

impl Change {
    /// `container_memory 5120 MB → 2048 MB`; `docker_env.X changed`. The
    /// JSON's `old` and `new` stay the bare values.
    pub fn describe(&self) -> String {
        let show = |v: &Option<String>| match v.as_deref() {
            // A sandbox made without a runtime of its own.
            None | Some("") if self.field == "docker_runtime" => {
                "the engine's default (runc)".to_string()
            }
            None | Some("") => "(none)".to_string(),
            Some(v) => with_unit(&self.field, v),
        };
        if self.field.starts_with(ENV_PREFIX) {
            let how = match (&self.old, &self.new) {
                (None, _) => "added",
                (_, None) => "removed",
                _ => "changed",
            };
            return format!("{} {how}", self.field);
        }
        format!("{} {} → {}", self.field, show(&self.old), show(&self.new))
    }
}

/// A setting's value with its unit, as a person reads it: memory in MB
/// (as `container_memory` is set), CPUs, sizes in bytes as KiB/MiB/GiB.
fn with_unit(field: &str, value: &str) -> String {
    match field {
        "container_memory" => format!("{value} MB"),
        "container_cpu" => {
            let plural = if value == "1" { "" } else { "s" };
            format!("{value} CPU{plural}")
        }
        "docker_shm_size" => match value.parse::<u64>() {
            Ok(bytes) => human_bytes(bytes),
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// `67108864` → `64 MiB`; a size that is no whole unit stays in bytes.
fn human_bytes(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// What stands for a hidden value in a [`Change`].
const HIDDEN: &str = "(not shown)";

impl SandboxSpec {
    /// The shaping settings, by the name a user knows them by.
    pub fn settings(&self) -> BTreeMap<String, String> {
        let mut s = BTreeMap::new();
        s.insert("docker_image".to_string(), self.image.clone());
        s.insert(
            "container_cpu".to_string(),
            format!("{}", self.nano_cpus as f64 / 1e9),
        );
        s.insert(
            "container_memory".to_string(),
            (self.memory_bytes >> 20).to_string(),
        );
        s.insert(
            "docker_shm_size".to_string(),
            self.shm_size_bytes.to_string(),
        );
        s.insert("docker_network".to_string(), self.network.to_string());
        let own: Vec<String> = self
            .data_dir()
            .map(|data| {
                vec![
                    data.join("workspace").display().to_string(),
                    data.join("home").display().to_string(),
                ]
            })
            .unwrap_or_default();
        let runner = self.runner_bind();
        let volumes: Vec<String> = self
            .binds
            .iter()
            .filter(|b| runner.as_ref() != Some(*b) && !own.contains(&b.host))
            .map(|b| b.to_engine())
            .collect();
        s.insert("docker_volumes".to_string(), volumes.join(", "));
        // What a runtime of a kernel of its own implies is not a setting
        // (`SandboxSpec::bound_processes_inside`): the runtime's change
        // says it all.
        let own_kernel = !crate::sandbox::runs_on_host_kernel(self.runtime.as_deref());
        let implied_nproc = ("nproc".to_string(), PIDS_LIMIT, PIDS_LIMIT);
        for (k, v) in &self.env {
            if k == NPROC_RESERVE_ENV {
                continue;
            }
            let mut f = crate::fingerprint::Fingerprint::new();
            f.field(k, v);
            s.insert(format!("{ENV_PREFIX}{k}"), f.finish());
        }
        let extra_caps: Vec<&str> = self
            .cap_add
            .iter()
            .map(String::as_str)
            .filter(|c| !CAP_ADD.contains(c))
            .collect();
        let ulimits: Vec<String> = self
            .ulimits
            .iter()
            .filter(|u| !(own_kernel && **u == implied_nproc))
            .map(|(n, soft, hard)| format!("{n}={soft}:{hard}"))
            .collect();
        let labels: Vec<String> = self
            .labels
            .iter()
            .filter(|(k, _)| !k.starts_with("hermes-"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for (name, list) in [
            ("cap_add", extra_caps.join(",")),
            ("device", self.devices.join(", ")),
            ("add_host", self.add_hosts.join(", ")),
            ("ulimit", ulimits.join(", ")),
            ("label", labels.join(", ")),
        ] {
            s.insert(format!("docker_extra_args.{name}"), list);
        }
        // Kept only when set, so that a sandbox labelled before they
        // existed shows no change of them.
        let extra_security: Vec<&str> = self
            .security_opt
            .iter()
            .map(String::as_str)
            .filter(|o| *o != "no-new-privileges")
            .collect();
        let gpus: Vec<String> = self.gpus.iter().map(ToString::to_string).collect();
        for (name, value) in [
            ("user", self.user.clone().unwrap_or_default()),
            (
                "network_name",
                self.network_name.clone().unwrap_or_default(),
            ),
            ("dns", self.dns.join(", ")),
            ("docker_extra_args.gpus", gpus.join(", ")),
            (
                "docker_extra_args.cpuset_cpus",
                self.cpuset_cpus.clone().unwrap_or_default(),
            ),
            // Set by `terminal.docker_runtime` or a `--runtime` of
            // `docker_extra_args`: one runtime, under the key's name.
            ("docker_runtime", self.runtime.clone().unwrap_or_default()),
            ("docker_extra_args.security_opt", extra_security.join(", ")),
        ] {
            if !value.is_empty() {
                s.insert(name.to_string(), value);
            }
        }
        s.insert(
            "egress".to_string(),
            self.labels
                .get(LABEL_EGRESS)
                .cloned()
                .unwrap_or_else(|| "off".to_string()),
        );
        s
    }

    /// [`Self::settings`] as the label's value.
    pub fn settings_label(&self) -> String {
        // A map of strings always serializes; an empty object is the
        // harmless fallback of a type that cannot fail.
        serde_json::to_string(&self.settings()).unwrap_or_else(|_| "{}".to_string())
    }
}

/// Reads a settings label; `None` when it is not a JSON object of strings
/// (a label written by hand or by another version).
pub fn parse_label(value: &str) -> Option<BTreeMap<String, String>> {
    serde_json::from_str(value).ok()
}

/// The settings that differ, sorted by field name. Environment values are
/// replaced by [`HIDDEN`].
pub fn diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<Change> {
    let mut fields: Vec<&String> = old.keys().chain(new.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| old.get(*f) != new.get(*f))
        .map(|f| {
            let hide = f.starts_with(ENV_PREFIX);
            let side =
                |v: Option<&String>| v.map(|v| if hide { HIDDEN.to_string() } else { v.clone() });
            Change {
                field: f.clone(),
                old: side(old.get(f)),
                new: side(new.get(f)),
            }
        })
        .collect()
}

/// The OCI runtime a container was made with, as its settings label
/// ([`LABEL_SETTINGS`]) records it: `Some(name)` for one hermes asked for,
/// `None` for the engine's default (or no readable label).
pub fn recorded_runtime(label: &str) -> Option<String> {
    let settings: BTreeMap<String, String> = serde_json::from_str(label).ok()?;
    settings
        .get("docker_runtime")
        // Labelled before the key had its own name.
        .or_else(|| settings.get("docker_extra_args.runtime"))
        .filter(|r| !r.is_empty())
        .cloned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::sandbox::{ExtraArgs, SandboxKey};

    fn spec(text: &str) -> SandboxSpec {
        let config = crate::config::load(text).unwrap().config;
        SandboxSpec::new(
            &config,
            SandboxKey::persistent("default", "default"),
            std::path::Path::new("/h"),
            &ExtraArgs::default(),
        )
    }

    #[test]
    fn the_label_round_trips_and_stays_out_of_the_hash() {
        let s = spec("terminal:\n  container_memory: 2048\n");
        let stored = parse_label(&s.labels[LABEL_SETTINGS]).unwrap();
        assert_eq!(stored, s.settings());
        assert_eq!(stored["container_memory"], "2048");
        assert_eq!(stored["docker_volumes"], "");
        let mut without = s.clone();
        without.labels.remove(LABEL_SETTINGS);
        assert_eq!(without.compute_hash(), s.hash());
    }

    #[test]
    fn a_diff_names_fields_old_and_new_and_hides_env_values() {
        let old = spec(
            "terminal:\n  container_memory: 5120\n  docker_env:\n    TOKEN: sekrit-one\n    GONE: x\n",
        );
        let new = spec(
            "terminal:\n  container_memory: 2048\n  docker_image: b:1\n  docker_env:\n    TOKEN: sekrit-two\n    NEW: y\n",
        );
        let changes = diff(&old.settings(), &new.settings());
        let text: Vec<String> = changes.iter().map(Change::describe).collect();
        assert_eq!(
            text,
            [
                "container_memory 5120 MB → 2048 MB".to_string(),
                "docker_env.GONE removed".to_string(),
                "docker_env.NEW added".to_string(),
                "docker_env.TOKEN changed".to_string(),
                format!("docker_image {} → b:1", old.image),
            ]
        );
        let json = serde_json::to_string(&changes).unwrap();
        assert!(!json.contains("sekrit"), "{json}");
        assert!(!old.labels[LABEL_SETTINGS].contains("sekrit"));
        assert!(diff(&old.settings(), &old.settings()).is_empty());
    }

    #[test]
    fn the_recorded_runtime_is_the_label_s_under_either_name() {
        assert_eq!(
            recorded_runtime(r#"{"docker_runtime":"runsc"}"#).as_deref(),
            Some("runsc")
        );
        assert_eq!(
            recorded_runtime(r#"{"docker_extra_args.runtime":"kata"}"#).as_deref(),
            Some("kata")
        );
        assert_eq!(recorded_runtime(r#"{"docker_image":"x"}"#), None);
        assert_eq!(recorded_runtime("not json"), None);
    }
}
