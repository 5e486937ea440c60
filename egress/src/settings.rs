//! The proxy's configuration file (`proxy/config.json`, written by
//! `hermes egress setup` from `config.yaml`'s `proxy:` section) and the
//! run-time [`Settings`] the daemon builds from it, the tokens, the
//! mappings, the CA and the real keys.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::ca::Ca;
use crate::policy::{Allowlist, DenyList};
use crate::tokens::{Credentials, FileError};

pub const CONFIG_FILE: &str = "config.json";

/// `proxy/config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyConfigFile {
    pub version: u32,
    /// CONNECT port; plain HTTP is the next one.
    pub tunnel_port: u16,
    /// `None`: the Docker bridge gateway when there is one, and 127.0.0.1.
    pub listen: Option<Vec<IpAddr>>,
    /// `None`: the built-in deny list.
    pub upstream_deny_cidrs: Option<Vec<IpNet>>,
    pub extra_allowed_hosts: Vec<String>,
    /// The hosts that get minted Google access tokens (allowed too).
    #[serde(default = "default_google_oauth_hosts")]
    pub google_oauth_hosts: Vec<String>,
    pub resolve: BTreeMap<String, IpAddr>,
    pub upstream_ca_file: Option<String>,
    pub upstream_header_timeout_seconds: u64,
    pub credential_source: String,
    /// The region the sandboxes' AWS SDKs are told (`proxy.aws_region`).
    #[serde(default)]
    pub aws_region: String,
    /// The AWS endpoints whose SigV4 requests are signed again
    /// (`proxy.aws_hosts`, or the Bedrock runtime endpoint of the region):
    /// allowed, like the default hosts.
    #[serde(default)]
    pub aws_hosts: Vec<String>,
    /// With `credential_source: bitwarden`, the project listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitwarden_project_id: Option<String>,
    /// Also listen on the gateway of the proxy-only network
    /// (`proxy.enforce_network`).
    #[serde(default)]
    pub enforce_network: bool,
    /// The bearer token of the management endpoint.
    pub mgmt_token: String,
    /// Connection limits, idle timeouts and the log's rotation: set by
    /// hand in this file (`egress setup` keeps them); absent, the defaults.
    #[serde(default, skip_serializing_if = "Limits::is_default")]
    pub limits: Limits,
}

fn default_google_oauth_hosts() -> Vec<String> {
    hermes_model::providers::GOOGLE_OAUTH_HOSTS
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The tunable limits of `config.json`'s `limits` object; every field is
/// optional and falls back to the default named on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Connections one client address may hold open
    /// ([`crate::limits::DEFAULT_PER_CLIENT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_client: Option<usize>,
    /// Ceiling of the data plane's connections ([`crate::limits::DEFAULT_TOTAL`]),
    /// lowered further to stay below the descriptor limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// How long a client connection may wait before its first request
    /// and between requests ([`DEFAULT_CLIENT_IDLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_idle_timeout_seconds: Option<u64>,
    /// How long a tunnel may sit idle between requests ([`DEFAULT_TUNNEL_IDLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_idle_timeout_seconds: Option<u64>,
    /// Size at which `proxy.log` is rotated ([`DEFAULT_LOG_MAX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_max_bytes: Option<u64>,
    /// Rotated logs kept, `proxy.log.1` to `proxy.log.N` ([`DEFAULT_LOG_FILES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_files: Option<usize>,
    /// Bytes of signed AWS bodies all clients together may hold while
    /// they are read ([`crate::signed_body::DEFAULT_TOTAL`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_body_bytes: Option<usize>,
    /// Bytes of signed AWS bodies one client address may hold
    /// ([`crate::signed_body::DEFAULT_PER_CLIENT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_body_bytes_per_client: Option<usize>,
    /// How long a signed body may take before its minimum rate applies
    /// ([`crate::signed_body::DEFAULT_GRACE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_body_grace_seconds: Option<u64>,
    /// The bytes that earn a signed body one more second after the grace
    /// ([`crate::signed_body::DEFAULT_MIN_RATE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_body_min_bytes_per_second: Option<u64>,
}

/// How long a client connection may wait for its first request, and
/// between requests (hyper's header read timeout covers both).
pub const DEFAULT_CLIENT_IDLE: Duration = Duration::from_secs(30);
/// How long a tunnel may sit idle between requests.
pub const DEFAULT_TUNNEL_IDLE: Duration = Duration::from_secs(300);
/// The size at which `proxy.log` is rotated.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// How many rotated logs are kept.
pub const DEFAULT_LOG_FILES: usize = 5;

impl Limits {
    pub fn is_default(&self) -> bool {
        *self == Limits::default()
    }

    pub fn log_max_bytes(&self) -> u64 {
        self.log_max_bytes.unwrap_or(DEFAULT_LOG_MAX_BYTES)
    }

    pub fn log_files(&self) -> usize {
        self.log_files.unwrap_or(DEFAULT_LOG_FILES)
    }

    /// The signed bodies' limits, the defaults where none is set.
    pub fn signed_bodies(&self) -> crate::signed_body::BodyLimits {
        let default = crate::signed_body::BodyLimits::default();
        crate::signed_body::BodyLimits {
            total: self.signed_body_bytes.unwrap_or(default.total),
            per_client: self
                .signed_body_bytes_per_client
                .unwrap_or(default.per_client),
            grace: self
                .signed_body_grace_seconds
                .map_or(default.grace, Duration::from_secs),
            min_rate: self
                .signed_body_min_bytes_per_second
                .unwrap_or(default.min_rate),
        }
    }

    fn check(&self) -> Result<(), &'static str> {
        if self.max_connections_per_client == Some(0) || self.max_connections == Some(0) {
            return Err("limits: connection limits must be at least 1");
        }
        if self.client_idle_timeout_seconds == Some(0)
            || self.tunnel_idle_timeout_seconds == Some(0)
        {
            return Err("limits: idle timeouts must be at least 1 second");
        }
        if self.log_max_bytes.is_some_and(|b| b < 64 * 1024) {
            return Err("limits: log_max_bytes must be at least 65536");
        }
        if self.log_files.is_some_and(|n| !(1..=100).contains(&n)) {
            return Err("limits: log_files must be 1-100");
        }
        if self.signed_body_bytes.is_some_and(|n| n < 1024)
            || self.signed_body_bytes_per_client.is_some_and(|n| n < 1024)
        {
            return Err(
                "limits: signed_body_bytes and signed_body_bytes_per_client must be at least 1024",
            );
        }
        if self.signed_body_grace_seconds == Some(0) {
            return Err("limits: signed_body_grace_seconds must be at least 1");
        }
        if self.signed_body_min_bytes_per_second == Some(0) {
            return Err("limits: signed_body_min_bytes_per_second must be at least 1");
        }
        Ok(())
    }
}

impl ProxyConfigFile {
    /// The file for `proxy`, keeping `mgmt_token`.
    pub fn from_model(proxy: &hermes_model::config::Proxy, mgmt_token: String) -> ProxyConfigFile {
        ProxyConfigFile {
            version: 1,
            tunnel_port: proxy.tunnel_port,
            listen: proxy.listen.clone(),
            upstream_deny_cidrs: proxy.upstream_deny_cidrs.clone(),
            extra_allowed_hosts: proxy.extra_allowed_hosts.clone(),
            google_oauth_hosts: proxy.google_oauth_hosts.clone(),
            resolve: proxy.resolve.iter().cloned().collect(),
            upstream_ca_file: proxy.upstream_ca_file.clone(),
            upstream_header_timeout_seconds: proxy.upstream_header_timeout_seconds,
            credential_source: proxy.credential_source.clone(),
            aws_region: proxy.aws_region.clone(),
            aws_hosts: proxy.aws_hosts.clone(),
            bitwarden_project_id: proxy.bitwarden_project_id.clone(),
            enforce_network: proxy.enforce_network,
            mgmt_token,
            limits: Limits::default(),
        }
    }

    pub fn parse(bytes: &[u8]) -> Result<ProxyConfigFile, FileError> {
        let file: ProxyConfigFile =
            serde_json::from_slice(bytes).map_err(|source| FileError::Json {
                file: CONFIG_FILE,
                source,
            })?;
        if file.version != 1 {
            return Err(FileError::Version {
                file: CONFIG_FILE,
                version: file.version,
            });
        }
        let invalid = |what: &str| FileError::Invalid {
            file: CONFIG_FILE,
            what: what.to_string(),
        };
        if file.tunnel_port == 0 || file.tunnel_port == u16::MAX {
            return Err(invalid(
                "tunnel_port must be 1-65534 (plain HTTP is the next port)",
            ));
        }
        if file
            .listen
            .iter()
            .flatten()
            .any(|ip| ip.is_unspecified() || ip.is_multicast())
        {
            return Err(invalid("listen must name addresses, never 0.0.0.0 or ::"));
        }
        if file.mgmt_token.len() < 32 {
            return Err(invalid("mgmt_token is missing or too short"));
        }
        file.limits.check().map_err(invalid)?;
        Ok(file)
    }

    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The plain-HTTP port.
    pub fn http_port(&self) -> u16 {
        self.tunnel_port.saturating_add(1)
    }
}

/// Everything the running proxy needs.
#[derive(Debug)]
pub struct Settings {
    /// Addresses to listen on, each with the tunnel and the plain port.
    pub listen: Vec<IpAddr>,
    pub tunnel_port: u16,
    pub http_port: u16,
    /// Where the management endpoint listens (127.0.0.1:0 picks a port).
    pub mgmt_addr: std::net::SocketAddr,
    pub mgmt_token: String,
    pub allow: Allowlist,
    pub deny: DenyList,
    /// Host → address, used instead of DNS.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Extra roots for upstream TLS (PEM), besides the system's.
    pub upstream_ca_pem: Option<Vec<u8>>,
    pub upstream_header_timeout: Duration,
    pub credentials: Credentials,
    pub ca: Arc<Ca>,
    /// Connections one client address may hold open.
    pub max_connections_per_client: usize,
    /// Ceiling of the data plane's connections (see [`crate::limits::budget`]).
    pub max_connections: usize,
    /// Before the first request and between requests, outside tunnels.
    pub client_idle_timeout: Duration,
    /// Between requests inside a tunnel.
    pub tunnel_idle_timeout: Duration,
    /// The size at which `proxy.log` is rotated.
    pub log_max_bytes: u64,
    /// How many rotated logs are kept.
    pub log_files: usize,
    /// The proxy-only network's DNS responder, when there is one.
    pub dns: Option<DnsSettings>,
    /// A Unix socket where CONNECT and plain HTTP are served too (the
    /// `local` backend's bubblewrap sandboxes, which have no network of
    /// the host's, reach the proxy through it). Made anew, mode 0600.
    pub unix_listen: Option<std::path::PathBuf>,
    /// What signed AWS bodies may hold while they are read, and how fast
    /// they must arrive.
    pub signed_bodies: crate::signed_body::BodyLimits,
}

/// Where the DNS responder listens (UDP) and the address it answers for
/// allowlisted names: the proxy's, on the proxy-only network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsSettings {
    pub listen: std::net::SocketAddr,
    pub answer: Ipv4Addr,
}

impl Settings {
    /// Run-time settings from the files' contents; `listen` is the list to
    /// use when the file names none.
    pub fn new(
        file: &ProxyConfigFile,
        default_listen: Vec<IpAddr>,
        credentials: Credentials,
        ca: Ca,
        upstream_ca_pem: Option<Vec<u8>>,
    ) -> Settings {
        Settings {
            listen: file.listen.clone().unwrap_or(default_listen),
            tunnel_port: file.tunnel_port,
            http_port: file.http_port(),
            mgmt_addr: (Ipv4Addr::LOCALHOST, 0).into(),
            mgmt_token: file.mgmt_token.clone(),
            allow: Allowlist::with_defaults(
                &[
                    file.extra_allowed_hosts.as_slice(),
                    file.aws_hosts.as_slice(),
                    file.google_oauth_hosts.as_slice(),
                ]
                .concat(),
            ),
            deny: DenyList::from_config(file.upstream_deny_cidrs.as_deref()),
            resolve: file.resolve.clone(),
            upstream_ca_pem,
            upstream_header_timeout: Duration::from_secs(file.upstream_header_timeout_seconds),
            credentials,
            ca: Arc::new(ca),
            max_connections_per_client: file
                .limits
                .max_connections_per_client
                .unwrap_or(crate::limits::DEFAULT_PER_CLIENT),
            max_connections: file
                .limits
                .max_connections
                .unwrap_or(crate::limits::DEFAULT_TOTAL),
            client_idle_timeout: file
                .limits
                .client_idle_timeout_seconds
                .map_or(DEFAULT_CLIENT_IDLE, Duration::from_secs),
            tunnel_idle_timeout: file
                .limits
                .tunnel_idle_timeout_seconds
                .map_or(DEFAULT_TUNNEL_IDLE, Duration::from_secs),
            log_max_bytes: file.limits.log_max_bytes(),
            log_files: file.limits.log_files(),
            dns: None,
            unix_listen: None,
            signed_bodies: file.limits.signed_bodies(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_file_carries_the_model_section_and_refuses_wildcard_listening() {
        let config = hermes_model::config::load(
            "proxy:\n  tunnel_port: 9100\n  resolve:\n    api.openai.com: 127.0.0.2\n",
        )
        .unwrap()
        .config;
        let file = ProxyConfigFile::from_model(&config.proxy, "m".repeat(32));
        assert_eq!(file.http_port(), 9101);
        let parsed = ProxyConfigFile::parse(file.render().as_bytes()).unwrap();
        assert_eq!(parsed, file);
        assert_eq!(
            parsed.resolve["api.openai.com"],
            IpAddr::from([127, 0, 0, 2])
        );
        let mut wild = file.clone();
        wild.listen = Some(vec!["0.0.0.0".parse().unwrap()]);
        assert!(ProxyConfigFile::parse(wild.render().as_bytes()).is_err());
        let mut weak = file.clone();
        weak.mgmt_token = String::new();
        assert!(ProxyConfigFile::parse(weak.render().as_bytes()).is_err());
        // No limits set: none written, the defaults used.
        assert!(!file.render().contains("limits"));
        let mut tuned = file;
        tuned.limits.max_connections_per_client = Some(8);
        tuned.limits.log_files = Some(2);
        let parsed = ProxyConfigFile::parse(tuned.render().as_bytes()).unwrap();
        assert_eq!(parsed.limits, tuned.limits);
        tuned.limits.max_connections_per_client = Some(0);
        assert!(ProxyConfigFile::parse(tuned.render().as_bytes()).is_err());
        tuned.limits.max_connections_per_client = None;
        tuned.limits.log_files = Some(0);
        assert!(ProxyConfigFile::parse(tuned.render().as_bytes()).is_err());
        tuned.limits.log_files = None;
        tuned.limits.signed_body_bytes_per_client = Some(1 << 20);
        tuned.limits.signed_body_grace_seconds = Some(2);
        let parsed = ProxyConfigFile::parse(tuned.render().as_bytes()).unwrap();
        assert_eq!(parsed.limits.signed_bodies().per_client, 1 << 20);
        assert_eq!(parsed.limits.signed_bodies().grace, Duration::from_secs(2));
        assert_eq!(
            parsed.limits.signed_bodies().total,
            crate::signed_body::DEFAULT_TOTAL
        );
        tuned.limits.signed_body_min_bytes_per_second = Some(0);
        assert!(ProxyConfigFile::parse(tuned.render().as_bytes()).is_err());
    }
}
