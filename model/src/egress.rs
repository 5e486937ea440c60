//! How a Docker sandbox is wired to the egress proxy, as plain data.
//!
//! The sandbox gets the proxy variables (pointing at the proxy by the name
//! `host.docker.internal`, mapped to the address the proxy listens on), the
//! CA mounted read-only with the variables that make curl, Python and Node
//! trust it, each provider variable set to its proxy token (AWS: the
//! placeholder pair and the region, [`aws_env`]), placeholder Google
//! credentials (the `gcp` token only) when there are some, and the label
//! `hermes-egress=<fingerprint>`. No real key is part of any of it. With
//! `proxy.enforce_network` the sandbox sits on an internal network whose
//! only reachable service is the proxy, so the variables are not advice but
//! the only way out.
//!
//! The variables are the container's as well as each command's: every
//! process in the sandbox sees them, a command that `hermes exec` runs and
//! one that Hermes Agent runs with its own `docker exec` alike. The
//! container's environment fixes the proxy variables and the CA trust
//! ([`EgressWiring::container_env`], part of the spec hash: a new proxy
//! port is a planned recreate) and holds the tokens as they were when it
//! was made (their values outside the hash: a rotation recreates
//! nothing). The current tokens are in a script the sandbox reads
//! ([`SANDBOX_ENV_SCRIPT`], bound read-only from the proxy's files and
//! named by `BASH_ENV`), which every `bash` sources as it starts: a
//! rotation reaches the next shell, the agent's included, without a
//! recreate; a program started without bash keeps the container's
//! values, which the proxy refuses once rotated out. `hermes exec` gives
//! each command the current values too ([`EgressWiring::env`]).
//! The fingerprint covers every egress setting that `docker create`
//! fixes (the proxy's address in `/etc/hosts`, the CA's mount, the
//! network): a change of any of them changes the spec hash, and the plan
//! recreates the sandbox (its data kept).

use std::net::IpAddr;
use std::path::PathBuf;

use crate::config::PROXY_HOST_NAME;
use crate::sandbox::{Bind, LABEL_EGRESS, SandboxSpec};

/// Where the CA certificate appears inside a sandbox.
pub const CA_IN_SANDBOX: &str = "/etc/ssl/certs/hermes-egress-ca.crt";

/// Where a Docker sandbox sees the proxy's directory of sandbox files
/// (read-only): [`SANDBOX_ENV_SCRIPT`] is in it.
pub const SANDBOX_ENV_DIR: &str = "/etc/hermes-egress/env";

/// The script of `export` lines holding the current tokens, in a
/// sandbox: `BASH_ENV` names it, so every `bash` started there sources it.
pub const SANDBOX_ENV_SCRIPT: &str = "/etc/hermes-egress/env/tokens.sh";

/// The name of [`SANDBOX_ENV_SCRIPT`] in its directory.
pub const SANDBOX_ENV_SCRIPT_NAME: &str = "tokens.sh";

/// Where a Docker sandbox finds its Google application default
/// credentials: an `authorized_user` file holding only the `gcp` proxy
/// token (as the access token, expiring far ahead, so that google-auth
/// sends it without refreshing), named by `GOOGLE_APPLICATION_CREDENTIALS`.
pub const GCP_ADC_IN_SANDBOX: &str = "/etc/hermes-egress/gcp-credentials.json";

/// A provider's real key as the proxy holds it (or should): whether one is
/// loaded, and its digest (`hermes_egress::tokens::key_digest`, keyed with
/// the management token; `None` for a credential without a key of its
/// own, such as Google's minted tokens). Never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    pub loaded: bool,
    pub digest: Option<String>,
}

/// What stands, in a wiring predicted before the proxy's setup, for what
/// only the setup makes (a new CA's hash, its settings' fingerprint).
pub const AFTER_SETUP: &str = "(known after setup)";

/// Where the proxy's files are bound in a wired sandbox: plumbing, read
/// only, never data a recreate keeps.
pub const WIRING_MOUNTS: &[&str] = &[CA_IN_SANDBOX, SANDBOX_ENV_DIR, GCP_ADC_IN_SANDBOX];

/// What a sandbox needs to reach the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressWiring {
    /// The address the proxy listens on for sandboxes: the bridge gateway
    /// (or the internal network's gateway with `enforce_network`).
    pub gateway: IpAddr,
    /// The CONNECT port; plain HTTP is the next one.
    pub tunnel_port: u16,
    /// The CA certificate on the host, mounted read-only.
    pub ca_host_path: PathBuf,
    /// The CA certificate's SHA-256, so that a new CA recreates sandboxes.
    pub ca_sha256: String,
    /// `(variable, proxy token)` for every provider variable.
    pub tokens: Vec<(String, String)>,
    /// The internal network the sandbox joins instead of the default bridge
    /// (`proxy.enforce_network`).
    pub network: Option<String>,
    /// The placeholder Google credentials file on the host (holding the
    /// `gcp` token only), mounted read-only at [`GCP_ADC_IN_SANDBOX`].
    pub gcp_adc_host_path: Option<PathBuf>,
    /// The proxy's directory of sandbox files on the host (holding
    /// [`SANDBOX_ENV_SCRIPT_NAME`]), mounted read-only at
    /// [`SANDBOX_ENV_DIR`] in a Docker sandbox.
    pub env_dir_host_path: Option<PathBuf>,
}

impl EgressWiring {
    /// Whether every part of a wiring predicted before the proxy's setup
    /// is known: the CA's hash (a CA kept) and the address sandboxes reach
    /// ([`AFTER_SETUP`] and the unspecified address stand for the parts
    /// only the setup makes).
    pub fn is_known(&self) -> bool {
        self.ca_sha256 != AFTER_SETUP
            && !self.gateway.is_unspecified()
            && self.network.as_deref() != Some(AFTER_SETUP)
    }

    /// The label value: a short hash of the settings above that the
    /// container fixes when it is made (not the port or the tokens, which
    /// each command gets).
    pub fn fingerprint(&self) -> String {
        let mut h = crate::fingerprint::Fingerprint::new();
        let mut field = |name: &str, value: &str| h.field(name, value);
        field("gateway", &self.gateway.to_string());
        field("ca", &self.ca_sha256);
        field("ca_path", &self.ca_host_path.display().to_string());
        field("network", self.network.as_deref().unwrap_or(""));
        // Only when there is one: wirings without it keep their fingerprint.
        if let Some(path) = &self.gcp_adc_host_path {
            field("gcp_adc", &path.display().to_string());
        }
        if let Some(path) = &self.env_dir_host_path {
            field("env_dir", &path.display().to_string());
        }
        h.finish()
    }

    /// The environment a Docker sandbox's container is made with, tokens
    /// aside: the proxy variables, the CA trust and `BASH_ENV`.
    pub fn container_env(&self) -> Vec<(String, String)> {
        let mut env = self.fixed_env();
        if self.env_dir_host_path.is_some() {
            env.push(("BASH_ENV".to_string(), SANDBOX_ENV_SCRIPT.to_string()));
        }
        env
    }

    /// The script [`SANDBOX_ENV_SCRIPT`] holds: an `export` line per
    /// token variable, each value single-quoted.
    pub fn env_script(tokens: &[(String, String)]) -> String {
        let mut text = String::from(
            "# hermes: the egress proxy's tokens (never a key); rewritten on rotation\n",
        );
        for (k, v) in tokens {
            text.push_str(&format!("export {k}='{}'\n", v.replace('\'', "'\\''")));
        }
        text
    }

    /// The environment every command in the sandbox gets, in a fixed
    /// order.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.fixed_env();
        env.extend(self.tokens.iter().cloned());
        env
    }

    /// The proxy variables and the CA trust.
    fn fixed_env(&self) -> Vec<(String, String)> {
        proxy_env(PROXY_HOST_NAME, self.tunnel_port)
    }
}

/// The proxy variables of a sandbox that reaches the proxy at `host`
/// (CONNECT on `tunnel_port`, plain HTTP on the next), and the CA trust
/// at [`CA_IN_SANDBOX`].
pub fn proxy_env(host: &str, tunnel_port: u16) -> Vec<(String, String)> {
    let https = format!("http://{host}:{tunnel_port}");
    let http = format!("http://{host}:{}", tunnel_port.saturating_add(1));
    [
        ("HTTPS_PROXY", https.as_str()),
        ("https_proxy", https.as_str()),
        ("HTTP_PROXY", http.as_str()),
        ("http_proxy", http.as_str()),
        ("NO_PROXY", "127.0.0.1,localhost,::1"),
        ("no_proxy", "127.0.0.1,localhost,::1"),
        ("SSL_CERT_FILE", CA_IN_SANDBOX),
        ("REQUESTS_CA_BUNDLE", CA_IN_SANDBOX),
        ("CURL_CA_BUNDLE", CA_IN_SANDBOX),
        ("NODE_EXTRA_CA_CERTS", CA_IN_SANDBOX),
        ("NODE_USE_ENV_PROXY", "1"),
        ("HERMES_EGRESS_PROXY", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl SandboxSpec {
    /// The spec wired to the proxy: the CA mount, the proxy's host name,
    /// the network, the label, the variables and tokens of the container
    /// (see the module doc), and a new hash.
    #[must_use]
    pub fn with_egress(mut self, wiring: &EgressWiring) -> SandboxSpec {
        for (k, v) in wiring.container_env() {
            self.env.retain(|(name, _)| *name != k);
            self.env.push((k, v));
        }
        self.egress_tokens = wiring.tokens.clone();
        if let Some(dir) = &wiring.env_dir_host_path {
            self.binds.push(Bind {
                host: dir.display().to_string(),
                container: SANDBOX_ENV_DIR.to_string(),
                options: Some("ro".to_string()),
            });
        }
        self.binds.push(Bind {
            host: wiring.ca_host_path.display().to_string(),
            container: CA_IN_SANDBOX.to_string(),
            options: Some("ro".to_string()),
        });
        if let Some(adc) = &wiring.gcp_adc_host_path {
            let name = crate::providers::GOOGLE_SERVICE_ACCOUNT_VARIABLE;
            self.env.retain(|(k, _)| k != name);
            self.env
                .push((name.to_string(), GCP_ADC_IN_SANDBOX.to_string()));
            self.binds.push(Bind {
                host: adc.display().to_string(),
                container: GCP_ADC_IN_SANDBOX.to_string(),
                options: Some("ro".to_string()),
            });
        }
        self.add_hosts
            .retain(|h| h.split(':').next() != Some(PROXY_HOST_NAME));
        self.add_hosts
            .push(format!("{PROXY_HOST_NAME}:{}", wiring.gateway));
        if wiring.network.is_some() && self.network {
            self.network_name = wiring.network.clone();
            // The proxy's DNS responder on the network's gateway: names
            // resolve to the proxy, so programs that ignore HTTPS_PROXY
            // reach it too (transparent egress).
            self.dns = vec![wiring.gateway.to_string()];
            self.own_resolv_conf();
        }
        self.labels
            .insert(LABEL_EGRESS.to_string(), wiring.fingerprint());
        self.rehash();
        self
    }
}

/// The variables besides the tokens that let a sandbox's AWS SDK sign
/// with the placeholder pair: the placeholder secret (the access key id
/// is the `aws` token) and the region. No session token: the proxy adds
/// the real one. And the CA, where the AWS SDK for Python looks for it.
pub fn aws_env(placeholder_secret: &str, region: &str) -> Vec<(String, String)> {
    vec![
        (
            "AWS_SECRET_ACCESS_KEY".to_string(),
            placeholder_secret.to_string(),
        ),
        ("AWS_REGION".to_string(), region.to_string()),
        ("AWS_DEFAULT_REGION".to_string(), region.to_string()),
        // botocore trusts its own bundle, not SSL_CERT_FILE.
        ("AWS_CA_BUNDLE".to_string(), CA_IN_SANDBOX.to_string()),
    ]
}

/// Why a command may not be given its own value of `name` (`hermes exec
/// --env NAME=…`) while the egress proxy is enabled, on any backend: the
/// proxy's variables route and trust the proxy, and a provider variable
/// holds the proxy token, so a value of the command's own would take it
/// around the proxy or hand it a real key. `None`: the name is free.
pub fn exec_env_refusal(name: &str) -> Option<String> {
    if crate::config::PROXY_VARIABLES.contains(&name) || name == "NODE_USE_ENV_PROXY" {
        Some(format!(
            "--env {name}: hermes sets {name} so that every command goes through the egress \
             proxy (proxy.enabled); it cannot be set per command"
        ))
    } else if crate::providers::key_variables().any(|v| v == name) {
        Some(format!(
            "--env {name}: the command gets the egress proxy's token in {name} (proxy.enabled), \
             which the proxy swaps for the real key; a key cannot be set per command"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use super::*;
    use crate::config::load;
    use crate::sandbox::{ExtraArgs, SandboxKey};

    fn wiring() -> EgressWiring {
        EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 9090,
            ca_host_path: PathBuf::from("/h/proxy/ca.crt"),
            ca_sha256: "ab".repeat(32),
            tokens: vec![(
                "OPENAI_API_KEY".to_string(),
                "openai-0123456789abcdef0123456789abcdef".to_string(),
            )],
            network: None,
            gcp_adc_host_path: None,
            env_dir_host_path: None,
        }
    }

    fn spec(config: &str) -> SandboxSpec {
        SandboxSpec::new(
            &load(config).unwrap().config,
            SandboxKey::persistent("p", "t"),
            Path::new("/h"),
            &ExtraArgs::default(),
        )
    }

    #[test]
    fn a_wired_sandbox_gets_the_ca_and_a_new_hash_and_each_command_the_proxy_and_tokens() {
        let plain = spec("");
        let mut w = wiring();
        w.env_dir_host_path = Some(PathBuf::from("/h/proxy/sandbox-env"));
        let wired = spec("").with_egress(&w);
        // The container holds the proxy variables, the CA trust and
        // BASH_ENV; the tokens beside them.
        let container = |k: &str| {
            wired
                .env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            container("HTTPS_PROXY"),
            Some("http://host.docker.internal:9090")
        );
        assert_eq!(
            container("https_proxy"),
            Some("http://host.docker.internal:9090")
        );
        assert_eq!(container("NODE_EXTRA_CA_CERTS"), Some(CA_IN_SANDBOX));
        assert_eq!(container("BASH_ENV"), Some(SANDBOX_ENV_SCRIPT));
        assert_eq!(container("OPENAI_API_KEY"), None);
        assert_eq!(wired.egress_tokens, w.tokens);
        let per_command = w.env();
        let env = |k: &str| {
            per_command
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(env("HTTPS_PROXY"), Some("http://host.docker.internal:9090"));
        assert_eq!(env("HTTP_PROXY"), Some("http://host.docker.internal:9091"));
        assert_eq!(env("NODE_EXTRA_CA_CERTS"), Some(CA_IN_SANDBOX));
        assert_eq!(
            env("OPENAI_API_KEY"),
            Some("openai-0123456789abcdef0123456789abcdef")
        );
        for bind in [
            "/h/proxy/ca.crt:/etc/ssl/certs/hermes-egress-ca.crt:ro",
            "/h/proxy/sandbox-env:/etc/hermes-egress/env:ro",
        ] {
            assert!(wired.binds.iter().any(|b| b.to_engine() == bind), "{bind}");
        }
        assert_eq!(wired.add_hosts, ["host.docker.internal:172.17.0.1"]);
        assert_eq!(wired.labels[LABEL_EGRESS], w.fingerprint());
        assert_ne!(wired.hash(), plain.hash());
        assert_eq!(wired.hash(), wired.compute_hash());
    }

    #[test]
    fn a_rotated_token_leaves_the_hash_and_a_new_port_or_provider_changes_it() {
        let hash = |w: &EgressWiring| spec("").with_egress(w).hash().to_string();
        let before = wiring();
        let mut rotated = wiring();
        rotated.tokens[0].1 = "openai-ffffffffffffffffffffffffffffffff".to_string();
        assert_eq!(hash(&rotated), hash(&before));
        let mut port = wiring();
        port.tunnel_port = 9100;
        assert_ne!(hash(&port), hash(&before));
        let mut provider = wiring();
        provider
            .tokens
            .push(("ANTHROPIC_API_KEY".to_string(), "anthropic-x".to_string()));
        assert_ne!(hash(&provider), hash(&before));
    }

    #[test]
    fn the_token_script_exports_each_value_quoted() {
        let script = EgressWiring::env_script(&[
            ("OPENAI_API_KEY".to_string(), "openai-abc".to_string()),
            ("ODD".to_string(), "a'b".to_string()),
        ]);
        assert!(
            script.contains("export OPENAI_API_KEY='openai-abc'\n"),
            "{script}"
        );
        assert!(script.contains("export ODD='a'\\''b'\n"), "{script}");
    }

    #[test]
    fn the_placeholder_google_credentials_are_mounted_and_named_when_there_are_some() {
        let plain = spec("").with_egress(&wiring());
        assert!(
            !plain
                .env
                .iter()
                .any(|(k, _)| k == "GOOGLE_APPLICATION_CREDENTIALS")
        );
        let mut w = wiring();
        w.gcp_adc_host_path = Some(PathBuf::from("/h/proxy/gcp-credentials.json"));
        assert_ne!(w.fingerprint(), wiring().fingerprint());
        let wired = spec("").with_egress(&w);
        assert!(wired.env.contains(&(
            "GOOGLE_APPLICATION_CREDENTIALS".to_string(),
            GCP_ADC_IN_SANDBOX.to_string()
        )));
        assert!(wired.binds.iter().any(|b| b.to_engine()
            == "/h/proxy/gcp-credentials.json:/etc/hermes-egress/gcp-credentials.json:ro"));
        assert_ne!(wired.hash(), plain.hash());
    }

    #[test]
    fn what_the_container_fixes_changes_the_fingerprint_and_what_each_command_gets_does_not() {
        let base = wiring().fingerprint();
        let mut w = wiring();
        w.ca_sha256 = "cd".repeat(32);
        assert_ne!(w.fingerprint(), base);
        let mut w = wiring();
        w.gateway = "172.18.0.1".parse().unwrap();
        assert_ne!(w.fingerprint(), base);
        let mut w = wiring();
        w.network = Some("hermes-egress".into());
        assert_ne!(w.fingerprint(), base);
        // A token rotation or another port reaches the next command.
        let mut w = wiring();
        w.tokens[0].1 = "openai-ffffffffffffffffffffffffffffffff".into();
        assert_eq!(w.fingerprint(), base);
        assert_eq!(
            spec("").with_egress(&w).hash(),
            spec("").with_egress(&wiring()).hash()
        );
        let mut w = wiring();
        w.tunnel_port = 9190;
        assert_eq!(w.fingerprint(), base);
    }

    #[test]
    fn the_network_is_joined_only_by_sandboxes_that_have_one() {
        let mut w = wiring();
        w.network = Some("hermes-egress".into());
        assert_eq!(
            spec("").with_egress(&w).network_name.as_deref(),
            Some("hermes-egress")
        );
        let offline = spec("terminal:\n  docker_network: false\n").with_egress(&w);
        assert_eq!(offline.network_name, None);
        assert!(!offline.network);
        assert!(offline.dns.is_empty());
    }

    #[test]
    fn on_the_network_the_name_server_is_the_proxy_and_the_hash_says_so() {
        let mut w = wiring();
        assert!(spec("").with_egress(&w).dns.is_empty());
        let before = spec("").with_egress(&w).hash().to_string();
        w.network = Some("hermes-egress".into());
        let enforced = spec("").with_egress(&w);
        assert_eq!(enforced.dns, ["172.17.0.1"]);
        let mut without_dns = enforced.clone();
        without_dns.dns.clear();
        without_dns.rehash();
        assert_ne!(enforced.hash(), without_dns.hash());
        assert_ne!(enforced.hash(), before);
    }

    #[test]
    fn aws_sandboxes_get_the_placeholder_secret_the_region_and_the_ca_never_a_session() {
        let env = aws_env("aws-secret-0123", "eu-west-1");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("AWS_SECRET_ACCESS_KEY"), Some("aws-secret-0123"));
        assert_eq!(get("AWS_REGION"), Some("eu-west-1"));
        assert_eq!(get("AWS_DEFAULT_REGION"), Some("eu-west-1"));
        assert_eq!(get("AWS_CA_BUNDLE"), Some(CA_IN_SANDBOX));
        assert_eq!(get("AWS_SESSION_TOKEN"), None);
        assert!(exec_env_refusal("AWS_SECRET_ACCESS_KEY").is_some());
        assert!(exec_env_refusal("AWS_SESSION_TOKEN").is_some());
    }

    #[test]
    fn a_command_may_not_set_the_proxy_variables_or_a_provider_key() {
        for name in [
            "HTTPS_PROXY",
            "no_proxy",
            "NODE_EXTRA_CA_CERTS",
            "NODE_USE_ENV_PROXY",
        ] {
            let why = exec_env_refusal(name).unwrap();
            assert!(why.starts_with(&format!("--env {name}: ")), "{why}");
        }
        let why = exec_env_refusal("OPENAI_API_KEY").unwrap();
        assert!(why.contains("proxy's token"), "{why}");
        assert_eq!(exec_env_refusal("PATH"), None);
        assert_eq!(exec_env_refusal("https_proxy_x"), None);
    }
}
