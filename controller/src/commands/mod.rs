//! One module per top-level subcommand, and what several of them share:
//! loading config.yaml under a pass's or a dry run's rules, whether a pass
//! needs Docker, observing the containers. A pass itself is
//! [`crate::pass`].

pub mod config;
pub mod describe;
pub mod down;
pub mod egress;
pub mod exec;
pub mod manual;
pub mod process;
pub mod reconcile;
pub mod sandbox;
pub mod session;
pub mod status;

use anyhow::Context;
use hermes_backends::docker::Engine;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::Observed;

use crate::activity::Activity;
use crate::home::Home;

/// Everything there is to see: the labelled containers (one list call,
/// plus an inspect for each that ever started and a `top` for each running
/// one) and the activity records.
pub async fn observe(engine: &Engine, home: &Home) -> anyhow::Result<Observed> {
    let containers = engine.observe().await?;
    with_activity(containers, home).await
}

/// Whether a pass of `desired` needs a Docker engine, and fails without
/// one: the Docker backend, or the proxy's proxy-only network
/// (`proxy.enforce_network`), which lives in Docker. Any other pass looks
/// at an engine only when one answers ([`optional_engine`]).
pub fn needs_docker(desired: &Desired) -> bool {
    let proxy = &desired.config.proxy;
    crate::backend::Seam::of(desired) == crate::backend::Seam::Docker
        || (proxy.enabled && proxy.enforce_network)
}

/// How long a pass that does not need Docker waits for an engine that may
/// not exist.
const OPTIONAL_ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The engine of a pass that does not need one ([`needs_docker`]):
/// containers (and a proxy-only network) left from an earlier Docker
/// config are still looked at when an engine answers, so they are
/// reported (or pruned), never silently forgotten; no engine there is
/// nothing to look at, and no error.
pub async fn optional_engine(home: &Home) -> Option<Engine> {
    match tokio::time::timeout(OPTIONAL_ENGINE_WAIT, Engine::connect()).await {
        Ok(Ok(engine)) => Some(engine.for_home(home.scope())),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "no engine; no containers to look at");
            None
        }
        Err(_) => {
            tracing::debug!("the engine did not answer in time; no containers to look at");
            None
        }
    }
}

/// What a pass planning `desired` sees: as [`observe`] (with the
/// proxy-only network and the sandboxes' disk images mounted under this
/// home), but only its own profile's containers inspected, and the process
/// counts (a `top` each, the engine's slowest read) only of the containers
/// whose count the plan reads ([`hermes_reconcilers::processes_needed`]).
pub async fn observe_for(
    engine: &Engine,
    home: &Home,
    desired: &Desired,
) -> anyhow::Result<Observed> {
    // A pass reads the times of its own profile's containers only.
    let profile = hermes_model::sandbox::sanitize(&desired.profile);
    let containers = engine.observe_profile(&profile).await?;
    let mut observed = with_activity(containers, home).await?;
    merge_exec_activity(engine, &profile, &mut observed).await;
    observed.legacy = crate::migrate::observe_legacy(home, desired);
    let images: std::collections::BTreeSet<&str> =
        desired.sandboxes.iter().map(|s| s.image.as_str()).collect();
    for image in images {
        // An engine that cannot say is no cost to print.
        if let Ok(false) = engine.has_image(image).await {
            observed.missing_images.insert(image.to_string());
        }
    }
    // Whatever the backend: an image left by an earlier Docker config is
    // released as well.
    let dir = hermes_model::sandbox::sandbox_dir(&desired.config, &desired.home);
    observed.disks = crate::disk::observe(&dir, &desired.profile, engine).await;
    observed.proxy.network =
        crate::egress::pass::observe_network(home, engine, &desired.config).await;
    let needed = hermes_reconcilers::processes_needed(desired, &observed);
    if !needed.is_empty() {
        let ids: Vec<&str> = needed.iter().map(String::as_str).collect();
        engine.count_processes(&mut observed.containers, &ids).await;
    }
    Ok(observed)
}

/// How far back a pass asks the engine for the commands run in the
/// sandboxes (the engine holds fewer events than this in practice).
const EXEC_EVENTS_WINDOW_SECONDS: i64 = 7 * 86_400;

/// Adds to the activity records the commands the engine saw start or end
/// in the profile's containers, whoever ran them (Hermes Agent's `docker
/// exec` leaves no record of hermes's): the later of the two times counts.
/// An engine that cannot replay its events leaves the records as they are.
async fn merge_exec_activity(engine: &Engine, profile: &str, observed: &mut Observed) {
    let now = hermes_reconcilers::unix_seconds(std::time::SystemTime::now());
    match engine
        .exec_activity(profile, now - EXEC_EVENTS_WINDOW_SECONDS, now + 1)
        .await
    {
        Ok(seen) => {
            for (name, at) in seen {
                let record = observed.activity.entry(name).or_insert(at);
                *record = (*record).max(at);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the engine's exec events; idleness counts hermes's own commands only");
        }
    }
}

async fn with_activity(
    containers: Vec<hermes_model::observed::ObservedContainer>,
    home: &Home,
) -> anyhow::Result<Observed> {
    let activity = Activity::new(home)
        .read_all()
        .context("reading the sandboxes' activity records")?;
    let mut containers = containers;
    crate::migrate::read_adoptions(home.root(), &mut containers);
    Ok(Observed {
        containers,
        activity,
        proxy: crate::egress::pass::observe(home).await,
        ..Observed::default()
    })
}

/// Loads config.yaml (errors with file, line and key) and prints its
/// warnings.
pub fn load_config(home: &Home) -> anyhow::Result<hermes_model::config::Config> {
    let file = home.config().display().to_string();
    let text = config::read_config_text(home)?.unwrap_or_default();
    let loaded = load_text(home, &text, &host_env(home)?)
        .map_err(|e| anyhow::anyhow!("{}", e.render(&file)))?;
    for w in &loaded.warnings {
        crate::notices::warning(w.render(&file));
    }
    Ok(loaded.config)
}

/// Loads config.yaml (errors with file, line and key), prints its warnings
/// and builds the desired state of `profile`.
pub fn load_desired(home: &Home, profile: &str) -> anyhow::Result<Desired> {
    let file = home.config().display().to_string();
    let text = config::read_config_text(home)?.unwrap_or_default();
    let loaded = load_text(home, &text, &host_env(home)?)
        .map_err(|e| anyhow::anyhow!("{}", e.render(&file)))?;
    desired_of(home, profile, loaded)
}

/// Loads config text knowing this home, as given and with symlinks
/// resolved, so that a volume of it is refused; with the `TERMINAL_*`
/// variables of `env` over it, as Hermes Agent lays them.
pub fn load_text(
    home: &Home,
    text: &str,
    env: &HostEnv,
) -> Result<hermes_model::config::Loaded, hermes_model::config::ConfigError> {
    let canonical = std::fs::canonicalize(home.root()).ok();
    let mut spellings = vec![home.root()];
    spellings.extend(canonical.as_deref());
    hermes_model::config::load_with(text, &spellings, &env.terminal_vars())
}

/// The desired state of a dry run: from `file` when given (a candidate
/// checked before it merges), else from config.yaml. Unlike a pass, a
/// config that cannot be used is an error — the person who asked must hear
/// that the file is broken, not a plan made from the last good one — and
/// nothing is written (not even the last good copy).
pub fn load_for_dry_run(
    home: &Home,
    profile: &str,
    file: Option<&std::path::Path>,
) -> anyhow::Result<Desired> {
    hermes_model::desired::check_profile(profile)?;
    let (path, text) = match file {
        Some(path) => {
            let bytes = crate::fsio::read_bounded(path, hermes_model::yaml::MAX_BYTES)
                .with_context(|| format!("cannot read {}", path.display()))?
                .with_context(|| format!("{} does not exist", path.display()))?;
            let text = hermes_model::yaml::text_from_bytes(&bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}",
                    hermes_model::config::Issue::from(e).render(&path.display().to_string())
                )
            })?;
            (path.to_path_buf(), Some(text.to_string()))
        }
        None => (home.config(), config::read_config_text(home)?),
    };
    let shown = path.display().to_string();
    let Some(text) = text else {
        // No config.yaml on a host that never had one: the defaults.
        return load_desired(home, profile);
    };
    let loaded = load_text(home, &text, &host_env(home)?)
        .map_err(|e| anyhow::anyhow!("{}", e.render(&shown)))?;
    anyhow::ensure!(
        !loaded.empty,
        "{shown} is empty: a pass would keep the last good config and remove nothing"
    );
    desired_from(home, profile, loaded, &shown)
}

/// Prints a loaded config's warnings and builds the desired state.
fn desired_of(
    home: &Home,
    profile: &str,
    loaded: hermes_model::config::Loaded,
) -> anyhow::Result<Desired> {
    desired_from(home, profile, loaded, &home.config().display().to_string())
}

/// [`desired_of`] for a config read from `file`.
fn desired_from(
    home: &Home,
    profile: &str,
    loaded: hermes_model::config::Loaded,
    file: &str,
) -> anyhow::Result<Desired> {
    for w in &loaded.warnings {
        crate::notices::warning(w.render(file));
    }
    for e in &loaded.config.sandbox_errors {
        crate::notices::error(format!(
            "{} (the Docker sandboxes are blocked; the rest of the host converges)",
            e.render(file)
        ));
    }
    if let Some(w) = home.exposure_warning() {
        crate::notices::warning(w);
    }
    let mut desired = Desired::build(loaded.config, profile, home.root(), &host_env(home)?)?;
    wire_egress(home, &mut desired);
    for w in &desired.warnings {
        crate::notices::warning(w);
    }
    Ok(desired)
}

/// The desired state of one pass, and the config error to report if the
/// file could not be used.
#[derive(Debug)]
pub struct PassDesired {
    pub desired: Desired,
    /// What was wrong with config.yaml; the pass then plans with the last
    /// good config (or the defaults) and removes nothing.
    pub config_error: Option<String>,
}

/// Where the last config that loaded cleanly is kept.
fn last_good_path(home: &Home) -> std::path::PathBuf {
    home.root().join("state").join("last-good-config.yaml")
}

/// Loads the desired state for a reconcile pass. Never reaps on doubt: a
/// config that is invalid, unreadable or empty — or missing after a good
/// one was seen — is reported, and the last good config stands in with
/// every removal held back. A host that never had a config runs on the
/// defaults.
pub fn load_for_pass(home: &Home, profile: &str) -> anyhow::Result<PassDesired> {
    hermes_model::desired::check_profile(profile)?;
    let file = home.config().display().to_string();
    let last_good = last_good_path(home);
    let env = host_env(home)?;
    let (problem, detail) = match config::read_config_text(home) {
        Ok(Some(text)) => match load_text(home, &text, &env) {
            Ok(loaded) if !loaded.empty => {
                remember_good(&last_good, &text);
                return Ok(PassDesired {
                    desired: desired_of(home, profile, loaded)?,
                    config_error: None,
                });
            }
            Ok(_) => ("empty", format!("{file} is empty")),
            Err(e) => ("invalid", e.render(&file)),
        },
        Ok(None) if !last_good.exists() => {
            return Ok(PassDesired {
                desired: load_desired(home, profile)?,
                config_error: None,
            });
        }
        Ok(None) => ("missing", format!("{file} is missing")),
        Err(e) => ("unreadable", crate::chain::Chain(&e).to_string()),
    };
    let good = crate::fsio::read_bounded(&last_good, hermes_model::yaml::MAX_BYTES)
        .ok()
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| hermes_model::config::load_with(&text, &[], &env.terminal_vars()).ok());
    let (config, stands_in) = match good {
        Some(loaded) => (loaded.config, "the last good config stands in"),
        None => (
            hermes_model::config::Config::default(),
            "no good config was ever seen: the defaults stand in",
        ),
    };
    let mut desired = Desired::build(config, profile, home.root(), &env)?;
    wire_egress(home, &mut desired);
    desired.doubt = Some(format!(
        "config.yaml is {problem} ({stands_in}; nothing is removed)"
    ));
    Ok(PassDesired {
        desired,
        config_error: Some(format!(
            "{detail}\nconfig.yaml is {problem}: {stands_in}, and nothing is removed until it is fixed"
        )),
    })
}

/// Reads the proxy's files again (after a pass set the proxy up).
pub fn refresh_egress(home: &Home, desired: &mut Desired) {
    let egress = crate::egress::pass::desired(home, &desired.config);
    set_egress(home, desired, egress);
}

/// Sets the desired egress, and while it awaits the proxy's setup, the
/// wiring the setup will leave ([`crate::egress::pass::after_setup`]).
fn set_egress(home: &Home, desired: &mut Desired, egress: hermes_model::desired::Egress) {
    desired.egress_after_setup = match egress {
        hermes_model::desired::Egress::NotSetUp { .. } if desired.config.proxy.enabled => {
            crate::egress::pass::after_setup(home, &desired.config)
        }
        _ => None,
    };
    desired.egress_keys = crate::egress::pass::desired_keys(home, &desired.config);
    desired.set_egress(egress);
}

/// Sets the desired egress from the proxy's files, with the warnings
/// worth a word.
fn wire_egress(home: &Home, desired: &mut Desired) {
    // Every sandbox this home makes carries its identity.
    desired.set_home_id(home.scope().id);
    let egress = crate::egress::pass::desired(home, &desired.config);
    let proxy = &desired.config.proxy;
    if proxy.enabled && !proxy.enforce_on_docker {
        desired.warnings.push(
            "proxy.enforce_on_docker is false: Docker sandboxes run while the egress proxy is down (without it, they reach no provider)".to_string(),
        );
    }
    if proxy.enabled {
        for name in &desired.config.terminal.docker_forward_env {
            if let Some((_, why)) = hermes_model::providers::UNCOVERED
                .iter()
                .find(|(v, _)| v == name)
            {
                desired.warnings.push(format!(
                    "terminal.docker_forward_env: {name} goes to the sandbox as it is: the egress proxy cannot stand in for it ({why})"
                ));
            }
        }
    }
    set_egress(home, desired, egress);
}

/// Keeps a copy of a config that loaded cleanly (0600: it may hold
/// values of docker_env), written only when it changed.
fn remember_good(path: &std::path::Path, text: &str) {
    let same = crate::fsio::read_bounded(path, hermes_model::yaml::MAX_BYTES)
        .ok()
        .flatten()
        .is_some_and(|old| old == text.as_bytes());
    if same {
        return;
    }
    let saved = path
        .parent()
        .map_or(Ok(()), |dir| crate::fsio::ensure_dir(dir, 0o700))
        .and_then(|()| crate::fsio::write_atomic(path, text.as_bytes(), 0o600, true));
    if let Err(e) = saved {
        tracing::warn!(path = %path.display(), error = %e, "cannot keep the last good config");
    }
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
        dotenv: hermes_model::dotenv::parse(&config::read_env_text(home)?),
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

/// The width of the terminal stdout is, if it is one: a plan printed
/// there wraps its long causes to it.
pub(crate) fn terminal_columns() -> Option<usize> {
    terminal_size::terminal_size().map(|(terminal_size::Width(w), _)| usize::from(w))
}

/// `plan` as text: wrapped to the terminal's width on a terminal, one
/// line per operation elsewhere.
pub(crate) fn plan_text(plan: &impl std::fmt::Display) -> String {
    match terminal_columns() {
        Some(columns) => format!("{plan:columns$}"),
        None => plan.to_string(),
    }
}

/// On a terminal (stdin and stderr both): says `what`, asks `Carry it
/// out? [y/N]` and reads the answer (yes only for `y`/`yes`). Without a
/// terminal it never asks: yes.
pub(crate) fn ask(what: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return true;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{what}");
    let _ = write!(err, "Carry it out? [y/N] ");
    let _ = err.flush();
    drop(err);
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
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
