//! What this host gives a pass besides config.yaml's values: the text of
//! config.yaml and `.env`, the process's environment, and the facts of
//! the host that shape a Docker sandbox. Read only, never written.

use anyhow::Context;
use hermes_model::config::Issue;
use hermes_model::desired::HostEnv;
use hermes_model::yaml;

use crate::fsio;
use crate::home::Home;

/// The text of config.yaml, `None` if there is no file.
pub fn read_config_text(home: &Home) -> anyhow::Result<Option<String>> {
    let path = home.config();
    let Some(bytes) = fsio::read_bounded(&path, yaml::MAX_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?
    else {
        return Ok(None);
    };
    let text = yaml::text_from_bytes(&bytes)
        .map_err(|e| anyhow::anyhow!("{}", Issue::from(e).render(&path.display().to_string())))?;
    Ok(Some(text.to_string()))
}

/// The text of `.env`, empty when there is none.
pub fn read_env_text(home: &Home) -> anyhow::Result<String> {
    let path = home.env_file();
    let bytes = fsio::read_bounded(&path, yaml::MAX_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?
        .unwrap_or_default();
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// The environment `docker_forward_env` (and the cloud backends'
/// `*_forward_env` and credentials) may read: this process's, then `.env`;
/// whether `~/.modal.toml` exists; and what of the host shapes a Docker
/// sandbox ([`host_facts`]).
pub fn host_env(home: &Home) -> anyhow::Result<HostEnv> {
    let process: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    // Modal's own credentials file, which its client reads when the token
    // variables are not set.
    let modal_toml = process
        .get("HOME")
        .is_some_and(|h| std::path::Path::new(h).join(".modal.toml").is_file());
    Ok(HostEnv {
        process,
        dotenv: hermes_model::dotenv::parse(&read_env_text(home)?),
        modal_toml,
        facts: host_facts(std::path::Path::new(CGROUP_ROOT)),
    })
}

/// Where the host's cgroup hierarchy is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// This process's `uid:gid`, and whether the cgroups at `cgroup_root`
/// lack the `pids` controller: cgroup v2 lists it in the root's
/// `cgroup.controllers`, v1 mounts a `pids` hierarchy. A root that shows
/// neither layout (no cgroup filesystem here) counts as having it: the
/// engine is then elsewhere, and says so itself if it cannot apply it.
fn host_facts(cgroup_root: &std::path::Path) -> hermes_model::desired::HostFacts {
    let controllers = cgroup_root.join("cgroup.controllers");
    let no_pids_controller = match std::fs::read_to_string(&controllers) {
        Ok(list) => !list.split_whitespace().any(|c| c == "pids"),
        Err(_) if cgroup_root.join("cpu").exists() || cgroup_root.join("memory").exists() => {
            !cgroup_root.join("pids").exists()
        }
        Err(_) => false,
    };
    hermes_model::desired::HostFacts {
        user: Some(format!(
            "{}:{}",
            nix::unistd::getuid(),
            nix::unistd::getgid()
        )),
        no_pids_controller,
        disk_images: crate::disk::unavailable().is_none(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::host_facts;

    #[test]
    fn the_pids_controller_is_read_from_either_cgroup_layout() {
        let root = tempfile::tempdir().unwrap();
        let at = root.path();
        // No cgroup filesystem at all: taken as there.
        assert!(!host_facts(at).no_pids_controller);
        // v1: one hierarchy per controller.
        std::fs::create_dir(at.join("memory")).unwrap();
        assert!(host_facts(at).no_pids_controller);
        std::fs::create_dir(at.join("pids")).unwrap();
        assert!(!host_facts(at).no_pids_controller);
        // v2: the root's list wins.
        std::fs::write(at.join("cgroup.controllers"), "cpuset cpu io memory\n").unwrap();
        assert!(host_facts(at).no_pids_controller);
        std::fs::write(at.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        assert!(!host_facts(at).no_pids_controller);
        let user = host_facts(at).user.unwrap();
        assert_eq!(
            user,
            format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid())
        );
    }
}
