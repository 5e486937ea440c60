//! What the host should look like: derived from the config, the active
//! profile, the home directory and the environment by a pure function.
//! Observed state is compared against this.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Backend, Config};
use crate::sandbox::{self, ExtraArgs, SandboxKey, SandboxSpec};

/// The task of the one warm persistent sandbox per profile.
pub const DEFAULT_TASK: &str = "default";

/// The environment values a desired state may read: the host process's
/// environment and the `.env` file, for `docker_forward_env`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    pub process: BTreeMap<String, String>,
    pub dotenv: Vec<(String, String)>,
}

impl HostEnv {
    /// A forwarded name's value: the host environment first, then `.env`.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.process
            .get(name)
            .map(String::as_str)
            .or_else(|| crate::dotenv::get(&self.dotenv, name))
    }
}

/// The desired state of one host for one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub profile: String,
    pub config: Config,
    pub home: PathBuf,
    /// The persistent sandboxes that should be running.
    pub sandboxes: Vec<SandboxSpec>,
    /// The `docker_forward_env` values that were found.
    pub forward_env: Vec<(String, String)>,
    /// `docker_extra_args`, mapped.
    pub extra_args: ExtraArgs,
    /// Things worth a word that do not stop the plan (a forwarded variable
    /// that is set nowhere, say).
    pub warnings: Vec<String>,
}

/// Why a profile name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("profile `{0}` must be 1 to 63 characters of letters, digits, `_`, `.` and `-`")]
pub struct BadProfile(pub String);

/// Checks a profile name: it becomes part of labels and container names.
pub fn check_profile(profile: &str) -> Result<(), BadProfile> {
    let ok = !profile.is_empty()
        && profile.len() <= 63
        && profile
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(BadProfile(profile.to_string()))
    }
}

impl Desired {
    pub fn build(
        config: Config,
        profile: &str,
        home: &Path,
        env: &HostEnv,
    ) -> Result<Desired, BadProfile> {
        check_profile(profile)?;
        let mut warnings = Vec::new();
        let t = &config.terminal;
        let mut forward_env = Vec::new();
        for name in &t.docker_forward_env {
            match env.lookup(name) {
                Some(value) => forward_env.push((name.clone(), value.to_string())),
                None => warnings.push(format!(
                    "terminal.docker_forward_env: {name} is set neither in the environment nor in .env; not forwarded"
                )),
            }
        }
        // Validation has refused unsupported options already.
        let extra_args = sandbox::parse_extra_args(&t.docker_extra_args).unwrap_or_default();
        let wants_sandbox = t.backend == Backend::Docker && t.container_persistent;
        let mut desired = Desired {
            profile: profile.to_string(),
            config,
            home: home.to_path_buf(),
            sandboxes: Vec::new(),
            forward_env,
            extra_args,
            warnings,
        };
        if wants_sandbox {
            desired
                .sandboxes
                .push(desired.sandbox_for_task(DEFAULT_TASK));
        }
        Ok(desired)
    }

    /// The persistent sandbox of one task of the active profile.
    pub fn sandbox_for_task(&self, task: &str) -> SandboxSpec {
        SandboxSpec::persistent(
            &self.config,
            SandboxKey::persistent(&self.profile, task),
            &self.home,
            &self.forward_env,
            &self.extra_args,
        )
    }

    pub fn backend(&self) -> Backend {
        self.config.terminal.backend
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    fn build(text: &str, env: &HostEnv) -> Desired {
        Desired::build(load(text).unwrap().config, "default", Path::new("/h"), env).unwrap()
    }

    #[test]
    fn profiles_are_label_safe_names() {
        assert!(check_profile("default").is_ok());
        assert!(check_profile("work-2.a_b").is_ok());
        assert!(check_profile("").is_err());
        assert!(check_profile("a/b").is_err());
        assert!(check_profile(&"x".repeat(64)).is_err());
    }

    #[test]
    fn the_local_backend_wants_no_sandbox() {
        assert!(build("", &HostEnv::default()).sandboxes.is_empty());
    }

    #[test]
    fn docker_wants_one_persistent_sandbox_of_the_default_task() {
        let d = build("terminal:\n  backend: docker\n", &HostEnv::default());
        assert_eq!(d.sandboxes.len(), 1);
        assert_eq!(
            d.sandboxes[0].key,
            SandboxKey::persistent("default", "default")
        );
        let d = build(
            "terminal:\n  backend: docker\n  container_persistent: false\n",
            &HostEnv::default(),
        );
        assert!(d.sandboxes.is_empty());
    }

    #[test]
    fn forwarded_variables_come_from_the_environment_then_dotenv() {
        let env = HostEnv {
            process: [("A".to_string(), "from-env".to_string())].into(),
            dotenv: vec![
                ("A".to_string(), "from-dotenv".to_string()),
                ("B".to_string(), "b".to_string()),
            ],
        };
        let d = build(
            "terminal:\n  backend: docker\n  docker_forward_env: [A, B, C]\n",
            &env,
        );
        let spec_env = &d.sandboxes[0].env;
        assert!(spec_env.contains(&("A".to_string(), "from-env".to_string())));
        assert!(spec_env.contains(&("B".to_string(), "b".to_string())));
        assert_eq!(d.warnings.len(), 1);
        assert!(
            d.warnings[0].contains("C is set neither"),
            "{}",
            d.warnings[0]
        );
    }
}
