//! Adopting a sandbox Hermes Agent made: comparing what its inspect shows
//! ([`AgentMade`]) with the sandbox hermes wants for the same task, by the
//! names a user knows the settings by ([`SandboxSpec::settings`]), plus
//! the hardening both programs apply (tmpfs mounts, the pids limit, the
//! init).
//!
//! What cannot be read back is not compared: the image's own environment
//! is in the container's too, so only the variables hermes sets are
//! looked at; `ulimit`s are taken as wanted. A container whose settings
//! all match is adopted as it is; any difference is a recreate that keeps
//! the agent's bind mounts, which are the task's data.

use std::collections::BTreeMap;

use crate::observed::{AgentMade, ObservedContainer};
use crate::sandbox::{CAP_ADD, LABEL_EGRESS, SandboxSpec};
use crate::settings::{self, Change};

/// What differs between the container the agent made and `spec`, empty
/// when it can be adopted as it is. `None` when the container was not
/// inspected (still `created`): nothing is known, so it is recreated.
pub fn differences(spec: &SandboxSpec, c: &ObservedContainer) -> Option<Vec<Change>> {
    let made = c.made_by_agent.as_ref()?;
    // Hardening as it is for this image (an s6-overlay `/init`'s).
    let spec = &spec.for_entrypoint(&made.entrypoint);
    let mut wanted = spec.settings();
    let mut seen = observed_settings(spec, c, made);
    for (k, v) in hardening(spec) {
        wanted.insert(k, v);
    }
    for (k, v) in hardening_of(made) {
        seen.insert(k, v);
    }
    Some(settings::diff(&seen, &wanted))
}

/// The container's settings, named as [`SandboxSpec::settings`] names them.
fn observed_settings(
    spec: &SandboxSpec,
    c: &ObservedContainer,
    made: &AgentMade,
) -> BTreeMap<String, String> {
    let wanted = spec.settings();
    let mut s = BTreeMap::new();
    s.insert("docker_image".to_string(), made.image.clone());
    s.insert(
        "container_cpu".to_string(),
        format!("{}", made.nano_cpus as f64 / 1e9),
    );
    s.insert(
        "container_memory".to_string(),
        (made.memory_bytes >> 20).to_string(),
    );
    s.insert(
        "docker_shm_size".to_string(),
        made.shm_size_bytes.to_string(),
    );
    s.insert(
        "docker_network".to_string(),
        (made.network_mode != "none").to_string(),
    );
    let own: Vec<String> = spec
        .data_dir()
        .map(|d| {
            vec![
                d.join("workspace").display().to_string(),
                d.join("home").display().to_string(),
            ]
        })
        .unwrap_or_default();
    let volumes: Vec<&str> = made
        .binds
        .iter()
        .map(String::as_str)
        .filter(|b| !own.iter().any(|o| b.split(':').next() == Some(o.as_str())))
        .collect();
    s.insert("docker_volumes".to_string(), volumes.join(", "));
    // Only the variables hermes sets: the image's own are there too.
    for (k, _) in &spec.env {
        if let Some((_, seen)) = made.env.iter().find(|(name, _)| name == k) {
            let mut f = crate::fingerprint::Fingerprint::new();
            f.field(k, seen);
            s.insert(format!("docker_env.{k}"), f.finish());
        }
    }
    let caps: Vec<String> = made
        .cap_add
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .filter(|c| !CAP_ADD.contains(&c.as_str()))
        .collect();
    s.insert("docker_extra_args.cap_add".to_string(), caps.join(","));
    s.insert(
        "docker_extra_args.device".to_string(),
        made.devices.join(", "),
    );
    s.insert(
        "docker_extra_args.add_host".to_string(),
        made.extra_hosts.join(", "),
    );
    if let Some(ulimit) = wanted.get("docker_extra_args.ulimit") {
        s.insert("docker_extra_args.ulimit".to_string(), ulimit.clone());
    }
    let labels: Vec<String> = c
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with("hermes-"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    s.insert("docker_extra_args.label".to_string(), labels.join(", "));
    s.insert(
        "egress".to_string(),
        c.label(LABEL_EGRESS).unwrap_or("off").to_string(),
    );
    if !made.user.is_empty() {
        s.insert("user".to_string(), made.user.clone());
    }
    s
}

/// The hardening hermes applies, by name.
fn hardening(spec: &SandboxSpec) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = spec
        .tmpfs
        .iter()
        .map(|(at, opts)| (format!("tmpfs {at}"), opts.clone()))
        .collect();
    v.push((
        "pids_limit".to_string(),
        if spec.pids_limit > 0 {
            spec.pids_limit.to_string()
        } else {
            "none".to_string()
        },
    ));
    v.push(("init".to_string(), spec.init.to_string()));
    v
}

/// The hardening a container has, by the same names.
fn hardening_of(made: &AgentMade) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = made
        .tmpfs
        .iter()
        .map(|(at, opts)| (format!("tmpfs {at}"), opts.clone()))
        .collect();
    v.push((
        "pids_limit".to_string(),
        made.pids_limit
            .map_or_else(|| "none".to_string(), |p| p.to_string()),
    ));
    v.push(("init".to_string(), made.init.to_string()));
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use super::*;
    use crate::config::load;
    use crate::observed::ContainerState;
    use crate::sandbox::{ExtraArgs, SandboxKey};

    fn spec(config: &str) -> SandboxSpec {
        SandboxSpec::new(
            &load(config).unwrap().config,
            SandboxKey::persistent("default", "default"),
            Path::new("/h"),
            &ExtraArgs::default(),
        )
    }

    /// What the agent makes for the default task with its defaults.
    fn agent_container(image: &str, shm: i64) -> ObservedContainer {
        let tmpfs = [
            ("/tmp", "rw,nosuid,size=512m"),
            ("/var/tmp", "rw,noexec,nosuid,size=256m"),
            ("/run", "rw,noexec,nosuid,size=64m"),
        ];
        ObservedContainer {
            id: "a1".to_string(),
            name: "hermes-0a1b2c3d".to_string(),
            labels: [
                ("hermes-agent", "1"),
                ("hermes-task-id", "default"),
                ("hermes-profile", "default"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            state: ContainerState::Running,
            created: 0,
            started_at: Some(0),
            finished_at: None,
            processes: Some(0),
            made_by_agent: Some(AgentMade {
                image: image.to_string(),
                nano_cpus: 1_000_000_000,
                memory_bytes: 5120 << 20,
                shm_size_bytes: shm,
                pids_limit: Some(256),
                network_mode: "bridge".to_string(),
                binds: vec![
                    "/h/sandboxes/docker/default/home:/root".to_string(),
                    "/h/sandboxes/docker/default/workspace:/workspace".to_string(),
                ],
                tmpfs: tmpfs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                env: vec![("PATH".to_string(), "/usr/bin".to_string())],
                cap_add: ["DAC_OVERRIDE", "CHOWN", "FOWNER", "SETUID", "SETGID"]
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
                devices: Vec::new(),
                extra_hosts: Vec::new(),
                init: true,
                user: String::new(),
                entrypoint: Vec::new(),
            }),
            adopted_hash: None,
        }
    }

    #[test]
    fn the_agent_s_container_on_the_same_settings_is_adopted_as_it_is() {
        let s = spec("terminal:\n  docker_image: img:1\n  docker_shm_size: 64m\n");
        let c = agent_container("img:1", 64 << 20);
        assert_eq!(differences(&s, &c), Some(vec![]));
    }

    #[test]
    fn what_differs_is_named_field_by_field() {
        let s = spec("terminal:\n  docker_image: img:2\n");
        let c = agent_container("img:1", 64 << 20);
        let changes: Vec<String> = differences(&s, &c)
            .unwrap()
            .iter()
            .map(Change::describe)
            .collect();
        assert_eq!(
            changes,
            [
                "docker_image img:1 → img:2",
                "docker_shm_size 64 MiB → 1 GiB"
            ]
        );
    }

    #[test]
    fn an_s6_overlay_image_s_container_without_init_and_with_an_exec_run_is_adopted_as_it_is() {
        let s = spec("terminal:\n  docker_image: img:1\n  docker_shm_size: 64m\n");
        let mut c = agent_container("img:1", 64 << 20);
        let made = c.made_by_agent.as_mut().unwrap();
        made.entrypoint = vec!["/init".to_string()];
        made.init = false;
        made.tmpfs
            .insert("/run".to_string(), "rw,exec,nosuid,size=64m".to_string());
        assert_eq!(differences(&s, &c), Some(vec![]));
        // The same container of an image without that init differs.
        c.made_by_agent.as_mut().unwrap().entrypoint.clear();
        let changes: Vec<String> = differences(&s, &c)
            .unwrap()
            .iter()
            .map(Change::describe)
            .collect();
        assert_eq!(
            changes,
            [
                "init false → true",
                "tmpfs /run rw,exec,nosuid,size=64m → rw,noexec,nosuid,size=64m"
            ]
        );
    }

    #[test]
    fn the_agent_s_container_run_as_the_host_user_is_adopted_as_it_is() {
        let config = "terminal:\n  docker_image: img:1\n  docker_shm_size: 64m\n  docker_run_as_host_user: true\n";
        let host = crate::desired::HostFacts {
            user: Some("1000:1000".to_string()),
            no_pids_controller: false,
            disk_images: false,
        };
        let s = spec(config).with_host(&load(config).unwrap().config, &host);
        let mut c = agent_container("img:1", 64 << 20);
        let made = c.made_by_agent.as_mut().unwrap();
        made.user = "1000:1000".to_string();
        made.cap_add.retain(|c| c != "SETUID" && c != "SETGID");
        assert_eq!(differences(&s, &c), Some(vec![]));
        c.made_by_agent.as_mut().unwrap().user.clear();
        let changes: Vec<String> = differences(&s, &c)
            .unwrap()
            .iter()
            .map(Change::describe)
            .collect();
        assert_eq!(changes, ["user (none) → 1000:1000"]);
    }

    #[test]
    fn a_container_not_inspected_is_not_known_to_match() {
        let mut c = agent_container("img:1", 64 << 20);
        c.made_by_agent = None;
        assert_eq!(differences(&spec(""), &c), None);
    }
}
