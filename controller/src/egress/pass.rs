//! The egress proxy as a pass sees it: what config.yaml and the proxy's
//! files (`$HERMES_HOME/proxy/`) make of the desired egress — set up or
//! not, the sandbox wiring, the settings the daemon should run with — and
//! what the daemon is doing (pid file, state file, health endpoint).
//!
//! The settings fingerprint covers the files the daemon loads
//! (`config.json`, `tokens.json`, `mappings.json`): the daemon records the
//! one it started with (and updates it when it reloads its tokens), and a
//! difference restarts it.

use std::collections::BTreeMap;

use hermes_backends::docker::Engine;
use hermes_egress::settings::ProxyConfigFile;
use hermes_egress::tokens::{MappingsFile, TokensFile};
use hermes_model::config::Config;
use hermes_model::desired::Egress;
use hermes_model::egress::{EgressWiring, KeyState};
use hermes_model::observed::{ProxyNetworkObserved, ProxyObserved};
use sha2::{Digest, Sha256};

use super::daemon::running_pid;
use super::files::{Paths, hex, mgmt_token, read_file, settings_fingerprint, token_env};
use super::network::{ProxyNetwork, default_listen};
use crate::home::Home;

/// The desired egress for `config`, from the proxy's files.
pub fn desired(home: &Home, config: &Config) -> Egress {
    if !config.proxy.enabled {
        return Egress::Off;
    }
    let paths = Paths::new(home);
    let read = |path: std::path::PathBuf| read_file(&path).ok().flatten();
    let mut missing = Vec::new();
    let ca = read(paths.ca_cert());
    if ca.is_none() {
        missing.push("ca.crt");
    }
    if read(paths.ca_key()).is_none() {
        missing.push("ca.key");
    }
    let tokens = read(paths.tokens()).and_then(|b| TokensFile::parse(&b).ok());
    if tokens.is_none() {
        missing.push("tokens.json");
    }
    let mappings = read(paths.mappings()).and_then(|b| MappingsFile::parse(&b).ok());
    if mappings.is_none() {
        missing.push("mappings.json");
    }
    let file = read(paths.config()).and_then(|b| ProxyConfigFile::parse(&b).ok());
    if file.is_none() {
        missing.push("config.json");
    }
    let (Some(ca), Some(tokens), Some(mappings), Some(file)) = (ca, tokens, mappings, file) else {
        return Egress::NotSetUp {
            missing: missing.join(", "),
        };
    };
    if file != ProxyConfigFile::from_model(&config.proxy, file.mgmt_token.clone()) {
        return Egress::NotSetUp {
            missing: "config.json is older than config.yaml's proxy section".to_string(),
        };
    }
    let network = match enforced_network(home, config) {
        Ok(network) => network,
        Err(missing) => return Egress::NotSetUp { missing },
    };
    let listen = config.proxy.listen.clone().unwrap_or_else(default_listen);
    let gateway = match &network {
        // Sandboxes reach the cluster's proxy by its Service: no address
        // of this host (which may have no Docker at all) stands in.
        _ if in_cluster(config) => Some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
        Some((_, gateway)) => Some(std::net::IpAddr::V4(*gateway)),
        None => listen.into_iter().find(|ip| !ip.is_loopback()),
    };
    let Some(gateway) = gateway else {
        return Egress::NotSetUp {
            missing: "an address sandboxes can reach (no docker0 bridge, and proxy.listen names only loopback)"
                .to_string(),
        };
    };
    let token_env = token_env(&tokens, &mappings, &config.proxy.aws_region);
    if read(paths.sandbox_env_script()).is_none() {
        return Egress::NotSetUp {
            missing: "sandbox-env/tokens.sh (the sandboxes' tokens)".to_string(),
        };
    }
    let Some(settings) = settings_fingerprint(home, &paths) else {
        return Egress::NotSetUp {
            missing: "a proxy file changed while it was read".to_string(),
        };
    };
    Egress::On {
        wiring: EgressWiring {
            gateway,
            tunnel_port: config.proxy.tunnel_port,
            ca_host_path: paths.ca_cert(),
            ca_sha256: hex(&Sha256::digest(&ca)),
            tokens: token_env,
            network: network.map(|(name, _)| name),
            gcp_adc_host_path: Some(paths.gcp_adc()).filter(|p| p.is_file()),
            env_dir_host_path: Some(paths.sandbox_env_dir()),
        },
        settings,
    }
}

/// The sandboxes' wiring once `hermes egress setup` has run for `config`,
/// as far as it is known before: the setup keeps a loadable CA and the
/// tokens there are (minting those missing, whose values alone are not
/// known, and a token's value is no part of a sandbox's spec), writes the
/// built-in mappings and the Google credentials file, and the address
/// sandboxes reach is the one they reach now. What only the setup makes
/// (a new CA's hash, a proxy-only network's gateway) stands as
/// [`hermes_model::egress::AFTER_SETUP`] (the unspecified address for
/// the gateway). `None` when no address would be reachable.
pub fn after_setup(home: &Home, config: &Config) -> Option<EgressWiring> {
    let paths = Paths::new(home);
    let ca = super::files::load_ca(&paths)
        .ok()
        .flatten()
        .and_then(|_| read_file(&paths.ca_cert()).ok().flatten());
    let existing = read_file(&paths.tokens())
        .ok()
        .flatten()
        .and_then(|b| TokensFile::parse(&b).ok());
    let tokens = TokensFile::updated(existing.as_ref(), false).ok()?;
    let mappings = MappingsFile::with_aws_hosts(&config.proxy.aws_hosts);
    let unknown = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let network = match enforced_network(home, config) {
        Ok(network) => network.map(|(name, gateway)| (name, std::net::IpAddr::V4(gateway))),
        // The setup does not make the network: a pass does, before.
        Err(_) => Some((ProxyNetwork::for_home(home).name, unknown)),
    }
    .filter(|_| config.proxy.enforce_network);
    let listen = config.proxy.listen.clone().unwrap_or_else(default_listen);
    let gateway = match &network {
        _ if in_cluster(config) => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        Some((_, gateway)) => *gateway,
        None => listen.into_iter().find(|ip| !ip.is_loopback())?,
    };
    Some(EgressWiring {
        gateway,
        tunnel_port: config.proxy.tunnel_port,
        ca_host_path: paths.ca_cert(),
        ca_sha256: ca.map_or_else(
            || hermes_model::egress::AFTER_SETUP.to_string(),
            |ca| hex(&Sha256::digest(&ca)),
        ),
        tokens: token_env(&tokens, &mappings, &config.proxy.aws_region),
        network: network.map(|(name, _)| name),
        gcp_adc_host_path: tokens
            .tokens
            .contains_key(hermes_egress::google::PROVIDER)
            .then(|| paths.gcp_adc()),
        env_dir_host_path: Some(paths.sandbox_env_dir()),
    })
}

/// Whether the proxy runs in the cluster (the kubernetes backend), not
/// as a daemon of this host.
fn in_cluster(config: &Config) -> bool {
    config.terminal.backend == hermes_model::config::Backend::Kubernetes
}

/// With `proxy.enforce_network`: the proxy-only network's name and
/// gateway, once the network and its firewall are in place; otherwise
/// what is missing. `Ok(None)` without `enforce_network`, and on the
/// kubernetes backend (its NetworkPolicies stand for that network).
fn enforced_network(
    home: &Home,
    config: &Config,
) -> Result<Option<(String, std::net::Ipv4Addr)>, String> {
    if !config.proxy.enforce_network || in_cluster(config) {
        return Ok(None);
    }
    let network = ProxyNetwork::for_home(home);
    let Some(gateway) = network.gateway() else {
        return Err(format!(
            "the proxy-only network {} (proxy.enforce_network)",
            network.name
        ));
    };
    match network.firewall_in_place(config.proxy.tunnel_port) {
        Ok(true) => Ok(Some((network.name, gateway))),
        Ok(false) => Err(format!(
            "the firewall chain {} that admits only the proxy from {}",
            network.chain, network.bridge
        )),
        Err(e) => Err(format!(
            "the firewall of {}: {}",
            network.bridge,
            crate::chain::Chain(&e)
        )),
    }
}

/// What the daemon is doing: whether it runs (pid file), the settings it
/// loaded (state file), and whether its health endpoint answers (asked
/// asynchronously, within [`super::health::PROBE_TIMEOUT`]) and, with
/// `proxy.enforce_network`, its DNS responder too.
pub async fn observe(home: &Home) -> ProxyObserved {
    let paths = Paths::new(home);
    let running = matches!(running_pid(&paths), Ok(Some(_)));
    if !running {
        return ProxyObserved {
            problem: Some("not running".to_string()),
            ..ProxyObserved::default()
        };
    }
    let state = match super::state::read(&paths) {
        Ok(state) => state,
        Err(e) => {
            return ProxyObserved {
                running,
                problem: Some(format!("its state file: {e}")),
                ..ProxyObserved::default()
            };
        }
    };
    let settings = state.as_ref().and_then(|s| s.settings.clone());
    let mut keys = None;
    let (healthy, problem) = match (state.map(|s| s.mgmt), mgmt_token(&paths)) {
        (Some(addr), Some(token)) => match super::health::probe(addr, &token).await {
            Ok(health) => {
                keys = keys_held(&health);
                // With transparent egress, its DNS responder is part of it.
                let dns = if enforces_network(&paths) {
                    super::health::dns_problem(&health).await
                } else {
                    None
                };
                match dns {
                    Some(problem) => (false, Some(problem)),
                    None => (true, None),
                }
            }
            Err(e) => {
                tracing::debug!(%addr, error = %e, "the proxy's health endpoint");
                (
                    false,
                    Some(format!("its health endpoint {addr} does not answer")),
                )
            }
        },
        _ => (
            false,
            Some("its state file names no health endpoint".to_string()),
        ),
    };
    ProxyObserved {
        running,
        healthy,
        settings,
        problem,
        network: None,
        keys,
    }
}

/// The real keys a running proxy says it holds, by provider.
fn keys_held(health: &super::health::Health) -> Option<BTreeMap<String, KeyState>> {
    health.keys.as_ref().map(|held| {
        held.iter()
            .map(|k| {
                let state = KeyState {
                    loaded: k.loaded,
                    digest: k.digest.clone(),
                };
                (k.provider.clone(), state)
            })
            .collect()
    })
}

/// The real keys the running proxy should hold for `config`, by
/// provider: those a reload would load now (its own environment, read
/// from `/proc`, then `.env`, as the daemon reads them; on the kubernetes
/// backend `.env` alone, what the proxy's Secret is written from, so that
/// every process of the home agrees), with their digests under the
/// management token; held in memory only. `None` when that is not known
/// here: no proxy running (a start loads what it finds), not set up, or
/// its keys coming from a secret manager.
pub fn desired_keys(home: &Home, config: &Config) -> Option<BTreeMap<String, KeyState>> {
    if !config.proxy.enabled {
        return None;
    }
    let paths = Paths::new(home);
    let process: BTreeMap<String, String> = if in_cluster(config) {
        // Not this process's environment: the controller's, a shell's and
        // an agent's differ, and each would rewrite the Secret.
        BTreeMap::new()
    } else {
        let pid = running_pid(&paths).ok().flatten()?;
        let environ = zeroize::Zeroizing::new(std::fs::read(format!("/proc/{pid}/environ")).ok()?);
        environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect()
    };
    let read = |path: std::path::PathBuf| read_file(&path).ok().flatten();
    let tokens = TokensFile::parse(&read(paths.tokens())?).ok()?;
    let mappings = MappingsFile::parse(&read(paths.mappings())?).ok()?;
    let file = ProxyConfigFile::parse(&read(paths.config())?).ok()?;
    if file.credential_source == super::bitwarden::SOURCE {
        return None;
    }
    let env = hermes_model::desired::HostEnv {
        process,
        ..crate::host::host_env(home).ok()?
    };
    let lookup = |name: &str| {
        env.lookup(name)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let service_account = lookup(hermes_egress::google::KEY_FILE_VARIABLE).is_some();
    let mut keys = BTreeMap::new();
    for m in &mappings.mappings {
        if !tokens.tokens.contains_key(&m.provider) {
            continue;
        }
        let key = m.env.iter().find_map(|name| lookup(name));
        let oauth = m.provider == hermes_egress::google::PROVIDER && service_account;
        let state = KeyState {
            loaded: key.is_some() || oauth,
            digest: key.map(|k| hermes_egress::tokens::key_digest(&file.mgmt_token, &k)),
        };
        keys.insert(m.provider.clone(), state);
    }
    Some(keys)
}

/// Whether the proxy's config file says `enforce_network` (transparent
/// egress, with its DNS responder).
fn enforces_network(paths: &Paths) -> bool {
    read_file(&paths.config())
        .ok()
        .flatten()
        .and_then(|b| ProxyConfigFile::parse(&b).ok())
        .is_some_and(|f| f.enforce_network)
}

/// This home's proxy-only network and its firewall chains, when any is
/// there: the Docker network counts only with hermes's labels and this
/// home's `hermes-home` label (a network of that name made by anyone else
/// is never touched), with the containers attached to it; the chains
/// (`HERMES-<h>`, in the filter or the nat table) are this home's own, and
/// count without the network too (one removed by hand, or a removal cut
/// short between the chains and the network). Asked only when
/// `proxy.enforce_network` is off (or the proxy disabled), the one case a
/// pass plans from it: its removal.
pub async fn observe_network(
    home: &Home,
    engine: &Engine,
    config: &Config,
) -> Option<ProxyNetworkObserved> {
    if config.proxy.enabled && config.proxy.enforce_network {
        return None;
    }
    let network = ProxyNetwork::for_home(home);
    let found = match engine
        .inspect_internal_network(&network.name, &network.bridge)
        .await
    {
        Ok(found) => found.filter(|net| {
            net.labels
                .get(hermes_model::sandbox::LABEL_AGENT)
                .map(String::as_str)
                == Some("1")
                && net.labels.get("hermes-egress-network").map(String::as_str) == Some("1")
                && net.labels.get(hermes_model::homes::LABEL_HOME) == Some(&network.home_id)
        }),
        Err(e) => {
            tracing::debug!(network = %network.name, error = %e, "not the proxy-only network hermes makes");
            None
        }
    };
    let chain_exists =
        chain_exists(&network.chain, "filter").await || chain_exists(&network.chain, "nat").await;
    if found.is_none() && !chain_exists {
        return None;
    }
    Some(ProxyNetworkObserved {
        name: network.name,
        exists: found.is_some(),
        attached: found.map(|net| net.attached).unwrap_or_default(),
        chain: network.chain,
        chain_exists,
    })
}

/// Whether the host firewall's `table` has the chain `chain`
/// (`iptables -S`).
async fn chain_exists(chain: &str, table: &str) -> bool {
    let out = tokio::process::Command::new("iptables")
        .args(["-w", "-t", table, "-S", chain])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(5), out).await,
        Ok(Ok(status)) if status.success()
    )
}
