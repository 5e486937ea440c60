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
    pub resolve: BTreeMap<String, IpAddr>,
    pub upstream_ca_file: Option<String>,
    pub upstream_header_timeout_seconds: u64,
    pub credential_source: String,
    /// Also listen on the gateway of the proxy-only network
    /// (`proxy.enforce_network`).
    #[serde(default)]
    pub enforce_network: bool,
    /// The bearer token of the management endpoint.
    pub mgmt_token: String,
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
            resolve: proxy.resolve.iter().cloned().collect(),
            upstream_ca_file: proxy.upstream_ca_file.clone(),
            upstream_header_timeout_seconds: proxy.upstream_header_timeout_seconds,
            credential_source: proxy.credential_source.clone(),
            enforce_network: proxy.enforce_network,
            mgmt_token,
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
            allow: Allowlist::with_defaults(&file.extra_allowed_hosts),
            deny: DenyList::from_config(file.upstream_deny_cidrs.as_deref()),
            resolve: file.resolve.clone(),
            upstream_ca_pem,
            upstream_header_timeout: Duration::from_secs(file.upstream_header_timeout_seconds),
            credentials,
            ca: Arc::new(ca),
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
        let mut weak = file;
        weak.mgmt_token = String::new();
        assert!(ProxyConfigFile::parse(weak.render().as_bytes()).is_err());
    }
}
