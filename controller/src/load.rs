//! Loading config.yaml into the desired state, under a pass's rules (a
//! bad config keeps the last good one and removes nothing) or a dry run's
//! (a bad config is an error), with the egress proxy's wiring read from
//! its files.

use anyhow::Context;
use hermes_model::desired::{Desired, HostEnv};

use crate::home::Home;
use crate::host::{host_env, read_config_text};

/// Loads config.yaml (errors with file, line and key) and prints its
/// warnings.
pub fn load_config(home: &Home) -> anyhow::Result<hermes_model::config::Config> {
    let file = home.config().display().to_string();
    let text = read_config_text(home)?.unwrap_or_default();
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
    let text = read_config_text(home)?.unwrap_or_default();
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
        None => (home.config(), read_config_text(home)?),
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
    let (problem, detail) = match read_config_text(home) {
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
    if proxy.enabled
        && proxy.enforce_network
        && desired.backend() == hermes_model::config::Backend::Kubernetes
    {
        desired.warnings.push(
            "proxy.enforce_network does nothing on the kubernetes backend: the sandboxes' NetworkPolicy keeps them to the proxy (where the cluster enforces NetworkPolicy)".to_string(),
        );
    }
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
