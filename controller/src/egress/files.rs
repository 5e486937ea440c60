//! The proxy's files under `$HERMES_HOME/proxy/` (0700): `ca.crt` and
//! `gcp-credentials.json` (the Docker sandboxes' placeholder Google
//! credentials, holding the `gcp` token only) (0644), `ca.key`, `tokens.json`, `mappings.json` and `config.json` (0600), and
//! what `hermes egress setup` writes there, keeping the CA, the tokens and
//! the management token unless told to rotate. The daemon's own files
//! (`proxy.pid`, `state.json`, `proxy.log`) are named here too and
//! handled by [`super::daemon`] and [`super::state`].

use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use hermes_egress::ca::{self, Ca};
use hermes_egress::settings::{CONFIG_FILE, ProxyConfigFile};
use hermes_egress::tokens::{MAPPINGS_FILE, MappingsFile, TOKENS_FILE, TokensFile};
use hermes_model::config::Config;
use sha2::{Digest, Sha256};

use super::network::ProxyNetwork;
use crate::fsio;
use crate::home::Home;

const DIR_MODE: u32 = 0o700;
pub(crate) const SECRET_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;
/// Large enough for any file the proxy writes; reads stop there.
const MAX_FILE: usize = 1 << 20;

/// The files of `$HERMES_HOME/proxy/`.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    dir: PathBuf,
}

impl Paths {
    pub(crate) fn new(home: &Home) -> Paths {
        Paths {
            dir: home.root().join("proxy"),
        }
    }
    pub(crate) fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub(crate) fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    /// The sandboxes' placeholder Google credentials (the `gcp` token only).
    pub(crate) fn gcp_adc(&self) -> PathBuf {
        self.dir.join("gcp-credentials.json")
    }
    pub(crate) fn config(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }
    /// The directory bound read-only into Docker sandboxes at
    /// `/etc/hermes-egress/env` (0700, like this one).
    pub(crate) fn sandbox_env_dir(&self) -> PathBuf {
        self.dir.join("sandbox-env")
    }
    /// The sandboxes' `BASH_ENV` script: the current tokens.
    pub(crate) fn sandbox_env_script(&self) -> PathBuf {
        self.sandbox_env_dir()
            .join(hermes_model::egress::SANDBOX_ENV_SCRIPT_NAME)
    }
    pub(crate) fn tokens(&self) -> PathBuf {
        self.dir.join(TOKENS_FILE)
    }
    pub(crate) fn mappings(&self) -> PathBuf {
        self.dir.join(MAPPINGS_FILE)
    }
    pub(crate) fn pid(&self) -> PathBuf {
        self.dir.join("proxy.pid")
    }
    pub(crate) fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    /// The proxy's Unix socket, which the `local` backend's bubblewrap
    /// sandboxes reach it through (bound into each at
    /// [`hermes_backends::local::sandbox::PROXY_SOCKET`]).
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("proxy.sock")
    }
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.join("proxy.log")
    }
}

/// A proxy file's bytes, `None` when it does not exist; never more than
/// [`MAX_FILE`] bytes.
pub(crate) fn read_file(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    fsio::read_bounded(path, MAX_FILE).with_context(|| format!("cannot read {}", path.display()))
}

/// Writes a proxy file atomically with `mode`.
pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    fsio::write_atomic(path, bytes, mode, true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The error for a file that `setup` writes and that is not there.
pub(crate) fn missing(path: PathBuf) -> anyhow::Error {
    anyhow::anyhow!("{} is missing: run `hermes egress setup`", path.display())
}

/// `config.json`, when it is there and parses.
pub(crate) fn read_config(paths: &Paths) -> anyhow::Result<Option<ProxyConfigFile>> {
    Ok(read_file(&paths.config())?.and_then(|b| ProxyConfigFile::parse(&b).ok()))
}

/// The management endpoint's bearer token, from `config.json`.
pub(crate) fn mgmt_token(paths: &Paths) -> Option<String> {
    read_config(paths).ok().flatten().map(|f| f.mgmt_token)
}

/// Creates the proxy directory 0700, or narrows it to 0700.
pub(crate) fn ensure_proxy_dir(home: &Home, paths: &Paths) -> anyhow::Result<()> {
    fsio::ensure_dir(home.root(), DIR_MODE)
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    fsio::ensure_dir(&paths.dir, DIR_MODE)
        .with_context(|| format!("cannot create {}", paths.dir.display()))?;
    let meta = fs::symlink_metadata(&paths.dir)?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        bail!("{} must be a directory, not a link", paths.dir.display());
    }
    if meta.permissions().mode() & 0o777 != DIR_MODE {
        fs::set_permissions(&paths.dir, fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// The CA, when both its files are there.
pub(crate) fn load_ca(paths: &Paths) -> anyhow::Result<Option<Ca>> {
    let (Some(cert), Some(key)) = (read_file(&paths.ca_cert())?, read_file(&paths.ca_key())?)
    else {
        return Ok(None);
    };
    let cert = String::from_utf8(cert).context("ca.crt is not text")?;
    let key = zeroize::Zeroizing::new(String::from_utf8(key).context("ca.key is not text")?);
    Ok(Some(Ca::load(&cert, &key)?))
}

/// Application default credentials for google-auth that hold only the
/// `gcp` proxy token: an `authorized_user` file whose access token is the
/// token, expiring far ahead, so that the client sends it as it is.
fn gcp_adc(token: &str) -> String {
    let mut text = serde_json::to_string_pretty(&serde_json::json!({
        "type": "authorized_user",
        "client_id": "hermes-egress-placeholder",
        "client_secret": "hermes-egress-placeholder",
        "refresh_token": token,
        "token": token,
        "expiry": "2999-12-31T00:00:00Z",
    }))
    .unwrap_or_default();
    text.push('\n');
    text
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// What became of the CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaChange {
    Kept,
    Created,
}

/// What became of the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokensChange {
    Created,
    Rotated,
    /// Tokens minted for the providers that had none.
    Completed,
    Kept,
}

impl fmt::Display for CaChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaChange::Kept => "kept",
            CaChange::Created => "created",
        })
    }
}

impl fmt::Display for TokensChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokensChange::Created => "created",
            TokensChange::Rotated => "rotated",
            TokensChange::Completed => "completed",
            TokensChange::Kept => "kept",
        })
    }
}

/// What [`write_setup`] did.
#[derive(Debug)]
pub(crate) struct SetupFiles {
    pub ca: CaChange,
    pub tokens: TokensChange,
    /// Whether `tokens.json` now holds other tokens than before.
    pub tokens_changed: bool,
    /// How many providers have a token.
    pub providers: usize,
    /// Whether `config.json` now says something else than before.
    pub config_changed: bool,
    /// What was found broken and replaced.
    pub warnings: Vec<String>,
}

/// Writes the proxy's files for `config`: a CA unless a loadable one is
/// there, a token for each provider and the AWS placeholder secret (all
/// new with `rotate`), the built-in mappings (AWS's hosts from
/// `proxy.aws_hosts`), and `config.json` from config.yaml's proxy section (keeping
/// the management token and the limits set by hand).
pub(crate) fn write_setup(
    home: &Home,
    paths: &Paths,
    config: &Config,
    rotate: bool,
) -> anyhow::Result<SetupFiles> {
    ensure_proxy_dir(home, paths)?;
    let mut warnings = Vec::new();

    let ca = match load_ca(paths) {
        Ok(Some(_)) => CaChange::Kept,
        Ok(None) | Err(_) => {
            let new = ca::generate()?;
            write_file(&paths.ca_key(), new.key_pem.as_bytes(), SECRET_MODE)?;
            write_file(&paths.ca_cert(), new.cert_pem.as_bytes(), CERT_MODE)?;
            CaChange::Created
        }
    };

    let existing = match read_file(&paths.tokens())? {
        Some(bytes) => match TokensFile::parse(&bytes) {
            Ok(file) => Some(file),
            Err(e) => {
                warnings.push(format!("{e}; new tokens are minted"));
                None
            }
        },
        None => None,
    };
    let tokens = TokensFile::updated(existing.as_ref(), rotate)
        .map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    let tokens_changed = existing.as_ref() != Some(&tokens);
    write_file(&paths.tokens(), tokens.render().as_bytes(), SECRET_MODE)?;
    write_file(
        &paths.mappings(),
        MappingsFile::with_aws_hosts(&config.proxy.aws_hosts)
            .render()
            .as_bytes(),
        SECRET_MODE,
    )?;
    // The tokens as the sandboxes' shells read them (`BASH_ENV`): in a
    // directory of their own, bound read-only, which a rename inside
    // reaches (a bound file would keep its old inode).
    let mappings = MappingsFile::with_aws_hosts(&config.proxy.aws_hosts);
    let env = token_env(&tokens, &mappings, &config.proxy.aws_region);
    fsio::ensure_dir(&paths.sandbox_env_dir(), DIR_MODE)
        .with_context(|| format!("cannot create {}", paths.sandbox_env_dir().display()))?;
    write_file(
        &paths.sandbox_env_script(),
        hermes_model::egress::EgressWiring::env_script(&env).as_bytes(),
        SECRET_MODE,
    )?;
    if let Some(token) = tokens.tokens.get(hermes_egress::google::PROVIDER) {
        // Mounted into Docker sandboxes (readable there, like the CA): it
        // holds the proxy token only, never a key.
        write_file(&paths.gcp_adc(), gcp_adc(token).as_bytes(), CERT_MODE)?;
    }

    let old_config = read_config(paths)?;
    let mgmt_token = match &old_config {
        Some(old) => old.mgmt_token.clone(),
        None => random_hex(32)?,
    };
    let mut proxy_config = ProxyConfigFile::from_model(&config.proxy, mgmt_token);
    // The limits are set by hand in config.json: kept.
    if let Some(old) = &old_config {
        proxy_config.limits = old.limits.clone();
    }
    let config_changed = old_config.as_ref() != Some(&proxy_config);
    write_file(
        &paths.config(),
        proxy_config.render().as_bytes(),
        SECRET_MODE,
    )?;

    let token_change = match (&existing, rotate) {
        (None, _) => TokensChange::Created,
        (Some(_), true) => TokensChange::Rotated,
        (Some(_), false) if tokens_changed => TokensChange::Completed,
        (Some(_), false) => TokensChange::Kept,
    };
    Ok(SetupFiles {
        ca,
        tokens: token_change,
        tokens_changed,
        providers: tokens.tokens.len(),
        config_changed,
        warnings,
    })
}

/// The fingerprint of the files the daemon loads, and, with
/// `proxy.enforce_network`, of the proxy-only network's gateway it listens
/// on (a network made anew restarts the proxy); `None` while a file is
/// missing.
pub fn settings_fingerprint(home: &Home, paths: &Paths) -> Option<String> {
    let mut h = Sha256::new();
    let mut enforce_network = false;
    for path in [paths.config(), paths.tokens(), paths.mappings()] {
        let bytes = read_file(&path).ok().flatten()?;
        if path == paths.config() {
            enforce_network = ProxyConfigFile::parse(&bytes).is_ok_and(|f| f.enforce_network);
        }
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let fingerprint = hex(&h.finalize()[..6]);
    if enforce_network {
        let gateway = ProxyNetwork::for_home(home).gateway();
        let gateway = gateway.map_or_else(|| "none".to_string(), |g| g.to_string());
        // `only`: the proxy listens on the gateway and loopback only (a
        // proxy started when it listened on docker0 too is restarted).
        return Some(format!("{fingerprint}@{gateway}/only"));
    }
    Some(fingerprint)
}

/// `bytes` in lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every provider variable with its proxy token, and the AWS
/// placeholder's variables: what a sandbox's commands get.
pub fn token_env(
    tokens: &TokensFile,
    mappings: &MappingsFile,
    aws_region: &str,
) -> Vec<(String, String)> {
    let mut token_env: Vec<(String, String)> = Vec::new();
    for mapping in &mappings.mappings {
        if let Some(token) = tokens.tokens.get(&mapping.provider) {
            for name in &mapping.env {
                token_env.push((name.clone(), token.clone()));
            }
        }
    }
    if let Some(secret) = tokens.tokens.get(hermes_egress::tokens::AWS_SECRET_TOKEN) {
        token_env.extend(hermes_model::egress::aws_env(secret, aws_region));
    }
    token_env.sort();
    token_env.dedup_by(|a, b| a.0 == b.0);
    token_env
}
