//! Running Hermes Agent's own CLI (`hermes` of the `hermes-agent` package
//! from PyPI) with the plugin of `integrations/hermes-agent-plugin`, which
//! hands the controller's commands to `hermesctl`.
//!
//! `scripts/test` makes the agent's venv once under `target/` (the version
//! it pins), installs the plugin into it on every run and exports its path
//! as [`AGENT_VENV_ENV`]. Without it the tests fail, saying to run
//! `scripts/test`: they never skip.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::{CLOUD_CREDENTIALS, Run, hermesctl_bin};

/// The environment variable naming the agent's venv.
pub const AGENT_VENV_ENV: &str = "HERMES_AGENT_VENV";

/// The plugin's name: its entry point in the group `hermes_agent.plugins`,
/// and what `plugins.enabled` lists.
pub const PLUGIN: &str = "hermes-sandbox";

/// The variable the plugin reads hermesctl's path from.
pub const HERMESCTL_ENV: &str = "HERMESCTL";

/// The agent's `hermes` in the venv of [`AGENT_VENV_ENV`].
///
/// # Panics
///
/// When the variable is unset, or the venv has no `bin/hermes` or no
/// plugin installed: the tests need the real agent.
pub fn agent_hermes() -> PathBuf {
    let Some(venv) = std::env::var_os(AGENT_VENV_ENV).filter(|v| !v.is_empty()) else {
        panic!(
            "{AGENT_VENV_ENV} is not set: these tests run Hermes Agent's real CLI with the \
             plugin installed; run scripts/test, which makes that venv under target/ and \
             exports {AGENT_VENV_ENV}"
        )
    };
    let venv = PathBuf::from(venv);
    let hermes = venv.join("bin").join("hermes");
    assert!(
        hermes.is_file(),
        "{AGENT_VENV_ENV}={}: no bin/hermes in it; run scripts/test, which makes the venv",
        venv.display()
    );
    static CHECKED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    CHECKED.get_or_init(|| assert_plugin_installed(&venv));
    hermes
}

/// Panics unless the venv's Python lists [`PLUGIN`] in the entry-point
/// group the agent loads plugins from.
fn assert_plugin_installed(venv: &Path) {
    let check = format!(
        "import importlib.metadata as m, sys; \
         sys.exit(0 if any(e.name == {PLUGIN:?} for e in m.entry_points(group='hermes_agent.plugins')) else 1)"
    );
    let python = venv.join("bin").join("python");
    let status = Command::new(&python)
        .args(["-c", &check])
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(
        status.success(),
        "the plugin {PLUGIN} is not installed in {}: run scripts/test, which installs \
         integrations/hermes-agent-plugin into it",
        venv.display()
    );
}

/// `config` (YAML sections, each line ending in a newline) with the plugin
/// enabled, as the agent requires of a pip-installed plugin.
pub fn with_plugin(config: &str) -> String {
    format!("{config}plugins:\n  enabled:\n    - {PLUGIN}\n")
}

/// `$PATH` without any directory that holds a `hermesctl`.
pub fn path_without_hermesctl() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).filter(|dir| !dir.join("hermesctl").exists());
    std::env::join_paths(dirs).unwrap_or_else(|e| panic!("PATH: {e}"))
}

/// `$PATH` with the `hermesctl` under test ([`hermesctl_bin`]) found first,
/// and no other.
pub fn path_with_hermesctl() -> OsString {
    let bin = hermesctl_bin();
    let dir = bin
        .parent()
        .unwrap_or_else(|| panic!("{} has no directory", bin.display()));
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path_without_hermesctl()));
    std::env::join_paths(dirs).unwrap_or_else(|e| panic!("PATH: {e}"))
}

/// The agent's `hermes ARGS…` with `HERMES_HOME=home`, run in `home`,
/// hermesctl on `PATH` ([`path_with_hermesctl`]), `HERMESCTL` unset, and
/// none of the variables either program reads from the test's own
/// environment.
pub fn agent<I, S>(home: &Path, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(agent_hermes());
    cmd.args(args)
        .current_dir(home)
        .env("HERMES_HOME", home)
        .env("PATH", path_with_hermesctl());
    clean_env(&mut cmd);
    cmd.env_remove(HERMESCTL_ENV)
        .env_remove("HERMES_SAFE_MODE")
        .env_remove("HERMES_ENABLE_PROJECT_PLUGINS");
    cmd
}

/// Runs [`agent`] to completion.
pub fn run_agent<I, S>(home: &Path, args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    output(agent(home, args), "the agent's hermes")
}

/// Runs `hermesctl ARGS…` itself with `HERMES_HOME=home`, as the plugin
/// would, for its output to compare with the agent's.
pub fn run_hermesctl<I, S>(home: &Path, args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(hermesctl_bin());
    cmd.args(args).current_dir(home).env("HERMES_HOME", home);
    clean_env(&mut cmd);
    output(cmd, "hermesctl")
}

/// Removes what hermesctl reads from the environment besides the home.
fn clean_env(cmd: &mut Command) {
    cmd.env_remove("HERMES_PROFILE").env_remove("RUST_LOG");
    for name in CLOUD_CREDENTIALS {
        cmd.env_remove(name);
    }
}

fn output(mut cmd: Command, what: &str) -> Run {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"))
        .into()
}
