//! The egress proxy as it runs in a Kubernetes cluster
//! (`terminal.backend: kubernetes`): what its Secret holds, read from the
//! host's proxy files and the real keys' source when a pass applies it
//! ([`files`]), and `hermes egress serve --in-cluster DIR` ([`serve`]),
//! the proxy Pod's command, serving from that Secret's mount.
//!
//! The Secret's entries are the proxy's own files (`config.json`,
//! `tokens.json`, `mappings.json`, `ca.crt`, `ca.key`), the upstream CA
//! of `proxy.upstream_ca_file` when set, and `keys.json`: the key
//! variables of the providers that have a token, with the value this home
//! has for each (its `.env`, never the environment of whichever process
//! runs, so that every process of the home writes the same Secret; or
//! Bitwarden Secrets Manager), held in memory only on the way. A Google
//! service account key given as a file path is shipped as the file's
//! contents (the path means nothing in the Pod).
//! The proxy in the Pod listens on each address of the Pod's interfaces
//! (the NetworkPolicies decide who reaches it), logs to stdout, and
//! writes nothing.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hermes_backends::kubernetes::proxy::ProxyFiles;
use hermes_egress::ca::Ca;
use hermes_egress::google;
use hermes_egress::settings::{CONFIG_FILE, ProxyConfigFile, Settings};
use hermes_egress::tokens::{Credentials, MAPPINGS_FILE, MappingsFile, TOKENS_FILE, TokensFile};
use hermes_model::desired::Desired;
use hermes_model::kubernetes::proxy::{KEYS_FILE, ProxyWanted, UPSTREAM_CA_FILE};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::files::{Paths, hex, missing, read_file};
use crate::home::Home;

/// The Secret's and the CA ConfigMap's contents for `wanted`, from the
/// host's proxy files and keys as they are now; an error when they are
/// not what the plan saw (another `egress setup`, a key changed since):
/// the next pass plans them anew.
pub fn files(home: &Home, desired: &Desired, wanted: &ProxyWanted) -> anyhow::Result<ProxyFiles> {
    let paths = Paths::new(home);
    let read = |path: std::path::PathBuf| -> anyhow::Result<Zeroizing<Vec<u8>>> {
        Ok(Zeroizing::new(
            read_file(&path)?.ok_or_else(|| missing(path))?,
        ))
    };
    let config = read(paths.config())?;
    let tokens = read(paths.tokens())?;
    let mappings = read(paths.mappings())?;
    let ca_cert = read(paths.ca_cert())?;
    let ca_key = read(paths.ca_key())?;
    let file = ProxyConfigFile::parse(&config)?;
    let mut secret = BTreeMap::new();
    if let Some(path) = &file.upstream_ca_file {
        let pem = read_file(Path::new(path))?
            .ok_or_else(|| anyhow::anyhow!("proxy.upstream_ca_file {path} is missing"))?;
        secret.insert(UPSTREAM_CA_FILE.to_string(), Zeroizing::new(pem));
    }
    let keys = keys(
        home,
        &file,
        &MappingsFile::parse(&mappings)?,
        &TokensFile::parse(&tokens)?,
    )?;
    let borrowed: BTreeMap<&str, &str> =
        keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let keys_json = Zeroizing::new(serde_json::to_vec(&borrowed)?);
    secret.insert(KEYS_FILE.to_string(), keys_json);
    // What the plan's digest was made of, read again now.
    let settings = super::files::settings_fingerprint(home, &paths).ok_or_else(|| {
        anyhow::anyhow!(
            "the egress proxy's files under {} changed while they were read",
            home.root().join("proxy").display()
        )
    })?;
    let ca_sha256 = hex(&Sha256::digest(&*ca_cert));
    let digest = hermes_model::kubernetes::proxy::secret_digest(
        &settings,
        &ca_sha256,
        super::pass::desired_keys(home, &desired.config).as_ref(),
    );
    if digest != wanted.secret_digest || ca_sha256 != wanted.ca_sha256 {
        anyhow::bail!(
            "the egress proxy's files or keys changed since the plan (Secret {} planned, {digest} now); the next pass plans them",
            wanted.secret_digest
        );
    }
    let ca_pem = String::from_utf8(ca_cert.to_vec())
        .with_context(|| format!("{} is not text", paths.ca_cert().display()))?;
    secret.insert(CONFIG_FILE.to_string(), config);
    secret.insert(TOKENS_FILE.to_string(), tokens);
    secret.insert(MAPPINGS_FILE.to_string(), mappings);
    secret.insert("ca.crt".to_string(), ca_cert);
    secret.insert("ca.key".to_string(), ca_key);
    Ok(ProxyFiles { secret, ca_pem })
}

/// Every key variable of the mappings (and Google's service account
/// key) with the value this host has for it, from the configured source.
fn keys(
    home: &Home,
    file: &ProxyConfigFile,
    mappings: &MappingsFile,
    tokens: &TokensFile,
) -> anyhow::Result<BTreeMap<String, Zeroizing<String>>> {
    let names = mappings
        .mappings
        .iter()
        .filter(|m| tokens.tokens.contains_key(&m.provider))
        .flat_map(|m| m.env.iter().map(String::as_str))
        .chain([google::KEY_FILE_VARIABLE]);
    // `.env` alone (see the module's doc).
    let env = hermes_model::desired::HostEnv {
        process: BTreeMap::new(),
        ..crate::host::host_env(home)?
    };
    let mut keys = BTreeMap::new();
    if file.credential_source == super::bitwarden::SOURCE {
        let found = super::bitwarden::fetch(&env, file.bitwarden_project_id.as_deref())?;
        for name in names {
            if let Some(v) = found.get(name).filter(|v| !v.is_empty()) {
                keys.insert(name.to_string(), Zeroizing::new(v.to_string()));
            }
        }
    } else {
        for name in names {
            if let Some(v) = env.lookup(name).filter(|v| !v.is_empty()) {
                keys.insert(name.to_string(), Zeroizing::new(v.to_string()));
            }
        }
    }
    if let Some(value) = keys.get_mut(google::KEY_FILE_VARIABLE)
        && !value.trim_start().starts_with('{')
    {
        let path = Path::new(value.trim()).to_path_buf();
        let bytes = read_file(&path)?.ok_or_else(|| {
            anyhow::anyhow!(
                "{} names {}, which is missing",
                google::KEY_FILE_VARIABLE,
                path.display()
            )
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!(
                "{} names {}, which is not text",
                google::KEY_FILE_VARIABLE,
                path.display()
            )
        })?;
        *value = Zeroizing::new(text);
    }
    Ok(keys)
}

/// `hermes egress serve --in-cluster DIR`: the proxy in the foreground on
/// the files of `dir` (the proxy Pod's Secret), until SIGTERM.
pub fn serve(dir: &Path) -> anyhow::Result<ExitCode> {
    let settings = load(dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("egress")
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let access: Box<dyn std::io::Write + Send> =
            Box::new(std::io::LineWriter::new(std::io::stdout()));
        let server = hermes_egress::server::bind(settings, access).await?;
        let bound = server.bound().clone();
        eprintln!(
            "hermes egress proxy {} in the cluster: CONNECT on {}, plain HTTP on {}",
            env!("CARGO_PKG_VERSION"),
            super::state::join(&bound.tunnel),
            super::state::join(&bound.http)
        );
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        server.run(shutdown).await;
        eprintln!("hermes egress proxy stopping");
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(ExitCode::SUCCESS)
}

/// The proxy's settings from the files of `dir`: on every address, with
/// neither the proxy-only network nor its DNS responder (the cluster's
/// NetworkPolicies stand for them).
fn load(dir: &Path) -> anyhow::Result<Settings> {
    let read = |name: &str| -> anyhow::Result<Zeroizing<Vec<u8>>> {
        let path = dir.join(name);
        Ok(Zeroizing::new(
            read_file(&path)?.ok_or_else(|| missing(path))?,
        ))
    };
    let mut file = ProxyConfigFile::parse(&read(CONFIG_FILE)?)?;
    let tokens = TokensFile::parse(&read(TOKENS_FILE)?)?;
    let mappings = MappingsFile::parse(&read(MAPPINGS_FILE)?)?;
    let keys: BTreeMap<String, String> =
        serde_json::from_slice(&read(KEYS_FILE)?).with_context(|| KEYS_FILE.to_string())?;
    let keys: BTreeMap<String, Zeroizing<String>> = keys
        .into_iter()
        .map(|(k, v)| (k, Zeroizing::new(v)))
        .collect();
    let lookup = |name: &str| keys.get(name).map(|v| v.to_string());
    let mut credentials = Credentials::build(&mappings, &tokens, lookup);
    let account = match lookup(google::KEY_FILE_VARIABLE).map(Zeroizing::new) {
        Some(value) if !value.trim().is_empty() => Some(
            google::ServiceAccount::from_variable(&value)
                .with_context(|| format!("{} (Google OAuth minting)", google::KEY_FILE_VARIABLE))?,
        ),
        _ => None,
    };
    credentials.configure_google(Some(&file.google_oauth_hosts), account);
    let text = |name: &str| -> anyhow::Result<Zeroizing<String>> {
        Ok(Zeroizing::new(
            String::from_utf8(read(name)?.to_vec())
                .with_context(|| format!("{} is not text", dir.join(name).display()))?,
        ))
    };
    let cert = text("ca.crt")?;
    let key = text("ca.key")?;
    let ca = Ca::load(&cert, &key)?;
    let upstream_ca = match file.upstream_ca_file {
        Some(_) => Some(read(UPSTREAM_CA_FILE)?.to_vec()),
        None => None,
    };
    file.enforce_network = false;
    let listen = pod_addresses()?;
    file.listen = Some(listen.clone());
    Ok(Settings::new(&file, listen, credentials, ca, upstream_ca))
}

/// Every address of the Pod's interfaces (its network namespace has
/// only its own; IPv6 link-local ones aside), loopback included: the
/// proxy never listens on the unspecified address.
fn pod_addresses() -> anyhow::Result<Vec<IpAddr>> {
    let mut listen = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let addrs = nix::ifaddrs::getifaddrs().context("the Pod's addresses (getifaddrs)")?;
    for ifa in addrs {
        let Some(address) = ifa.address.as_ref() else {
            continue;
        };
        let ip = if let Some(v4) = address.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = address.as_sockaddr_in6() {
            // Link-local (fe80::/10) needs a scope the proxy's socket
            // addresses do not carry.
            if (v6.ip().segments()[0] & 0xffc0) == 0xfe80 {
                continue;
            }
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !listen.contains(&ip) {
            listen.push(ip);
        }
    }
    Ok(listen)
}
