//! The SSH backend's desired and observed state, as plain data: which host
//! and user the config names, where a task's workspace lives on it, and
//! what a pass found there.

use std::fmt;

use crate::config::{PROXY_HOST_NAME, Terminal};
use crate::desired::HostEnv;
use crate::egress::{CA_IN_SANDBOX, EgressWiring};

/// The remote host the config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    /// A private key file (`~/` expanded); `None`: the agent's keys.
    pub key: Option<String>,
    /// How long the shared connection stays open unused.
    pub persist_seconds: u64,
}

impl fmt::Display for SshTarget {
    /// `user@host`, or `user@host:port` off port 22.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port == 22 {
            write!(f, "{}@{}", self.user, self.host)
        } else {
            write!(f, "{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

impl SshTarget {
    /// The target of the `terminal.ssh_*` keys; the user defaults to the
    /// local one (`$USER`). The error says which key is missing.
    pub fn from_config(t: &Terminal, env: &HostEnv) -> Result<SshTarget, String> {
        let host = t
            .ssh_host
            .clone()
            .filter(|h| !h.trim().is_empty())
            .ok_or_else(|| "terminal.ssh_host is not set".to_string())?;
        let user = t
            .ssh_user
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| env.process.get("USER").cloned().filter(|u| !u.is_empty()))
            .ok_or_else(|| "terminal.ssh_user is not set (and $USER is empty)".to_string())?;
        let key = t.ssh_key.as_ref().map(|k| match k.strip_prefix("~/") {
            Some(rest) => match env.process.get("HOME") {
                Some(home) => format!("{}/{rest}", home.trim_end_matches('/')),
                None => k.clone(),
            },
            None => k.clone(),
        });
        Ok(SshTarget {
            host,
            port: t.ssh_port,
            user,
            key,
            persist_seconds: t.ssh_persist_seconds,
        })
    }
}

/// Why a name cannot be part of a remote path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot name a remote directory: {0}")]
pub struct BadPathName(pub crate::names::NameError);

/// The workspace of a profile's task on the remote host, relative to the
/// remote home: `.hermes-sandbox/<profile>/<task>/workspace`. Both names
/// keep the rule of [`crate::names`], so neither can climb.
pub fn remote_workspace(profile: &str, task: &str) -> Result<String, BadPathName> {
    use crate::names::{NameKind, validate};
    validate(NameKind::Profile, profile).map_err(BadPathName)?;
    validate(NameKind::Task, task).map_err(BadPathName)?;
    Ok(format!(".hermes-sandbox/{profile}/{task}/workspace"))
}

/// Where the egress CA is copied on the remote host, relative to its home:
/// beside the task's workspace.
pub fn remote_ca(profile: &str, task: &str) -> Result<String, BadPathName> {
    let workspace = remote_workspace(profile, task)?;
    let dir = workspace.trim_end_matches("/workspace");
    Ok(format!("{dir}/hermes-egress-ca.crt"))
}

/// What a command on the SSH host gets from the egress wiring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshEgress {
    /// The proxy variables (the proxy at the remote's own loopback, where
    /// the tunnel port and the next are forwarded back to the proxy), the
    /// provider variables with their proxy tokens, `HERMES_EGRESS_PROXY`.
    pub env: Vec<(String, String)>,
    /// The CA trust variables, relative to the remote home.
    pub home_env: Vec<(String, String)>,
    /// The remote ports to forward: the tunnel port and the plain one.
    pub ports: [u16; 2],
}

/// The wiring of a Docker sandbox, made for the SSH host: the same
/// variables, with the proxy at `127.0.0.1` and the CA at `ca` (relative to
/// the remote home). Only proxy tokens, never a real key.
pub fn ssh_egress(wiring: &EgressWiring, ca: &str) -> SshEgress {
    let docker_proxy = format!("http://{PROXY_HOST_NAME}:");
    let mut env = Vec::new();
    let mut home_env = Vec::new();
    for (name, value) in wiring.env() {
        if value == CA_IN_SANDBOX {
            home_env.push((name, ca.to_string()));
        } else if let Some(port) = value.strip_prefix(&docker_proxy) {
            env.push((name, format!("http://127.0.0.1:{port}")));
        } else {
            env.push((name, value));
        }
    }
    SshEgress {
        env,
        home_env,
        ports: [wiring.tunnel_port, wiring.tunnel_port.saturating_add(1)],
    }
}

/// What a pass found on the remote host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshObserved {
    /// Logged in over a trusted key; whether the default task's workspace
    /// exists.
    Ready { workspace: bool },
    /// Never seen: its key (`SHA256:…`) would be trusted on first use.
    NewHost { fingerprint: String },
    /// The host offers a key other than the recorded one: the whole story,
    /// with both fingerprints and how to accept the new key.
    HostKeyChanged { detail: String },
    /// No connection or no login: why.
    Unreachable { reason: String },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::load;

    fn terminal(text: &str) -> Terminal {
        load(text).unwrap().config.terminal
    }

    #[test]
    fn the_target_needs_a_host_and_takes_the_local_user_by_default() {
        let mut env = HostEnv::default();
        assert_eq!(
            SshTarget::from_config(&terminal("terminal:\n  backend: ssh\n"), &env).unwrap_err(),
            "terminal.ssh_host is not set"
        );
        env.process.insert("USER".into(), "me".into());
        env.process.insert("HOME".into(), "/home/me/".into());
        let t = SshTarget::from_config(
            &terminal("terminal:\n  ssh_host: h\n  ssh_port: 2222\n  ssh_key: ~/.ssh/k\n"),
            &env,
        )
        .unwrap();
        assert_eq!(t.to_string(), "me@h:2222");
        assert_eq!(t.key.as_deref(), Some("/home/me/.ssh/k"));
        assert_eq!(t.persist_seconds, 300);
        let t =
            SshTarget::from_config(&terminal("terminal:\n  ssh_host: h\n  ssh_user: u\n"), &env)
                .unwrap();
        assert_eq!(t.to_string(), "u@h");
        assert_eq!(t.key, None);
    }

    #[test]
    fn the_egress_wiring_points_at_the_forwarded_loopback_and_the_copied_ca() {
        let wiring = EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 9090,
            ca_host_path: "/h/proxy/ca.crt".into(),
            ca_sha256: "ab".repeat(32),
            tokens: vec![(
                "OPENAI_API_KEY".into(),
                "openai-0123456789abcdef0123456789abcdef".into(),
            )],
            network: None,
            gcp_adc_host_path: None,
            env_dir_host_path: None,
        };
        let ca = remote_ca("p", "t").unwrap();
        assert_eq!(ca, ".hermes-sandbox/p/t/hermes-egress-ca.crt");
        let e = ssh_egress(&wiring, &ca);
        let get = |k: &str| e.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:9090"));
        assert_eq!(get("http_proxy"), Some("http://127.0.0.1:9091"));
        assert_eq!(get("NO_PROXY"), Some("127.0.0.1,localhost,::1"));
        assert_eq!(
            get("OPENAI_API_KEY"),
            Some("openai-0123456789abcdef0123456789abcdef")
        );
        assert_eq!(get("HERMES_EGRESS_PROXY"), Some("1"));
        assert!(e.env.iter().all(|(_, v)| !v.contains(PROXY_HOST_NAME)));
        let names: Vec<&str> = e.home_env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "NODE_EXTRA_CA_CERTS"
            ]
        );
        assert!(e.home_env.iter().all(|(_, v)| v == &ca));
        assert_eq!(e.ports, [9090, 9091]);
    }

    #[test]
    fn workspaces_are_per_profile_and_task_and_never_climb() {
        assert_eq!(
            remote_workspace("default", "t-1").unwrap(),
            ".hermes-sandbox/default/t-1/workspace"
        );
        for bad in ["..", ".", "", "a/b", "a b"] {
            assert!(remote_workspace("p", bad).is_err(), "{bad:?}");
            assert!(remote_workspace(bad, "t").is_err(), "{bad:?}");
        }
    }
}
