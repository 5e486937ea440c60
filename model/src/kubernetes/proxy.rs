//! The egress proxy in the cluster, as plain data: the objects hermes
//! wants in the namespace for one home's proxy ([`ProxyWanted`]) and what
//! a pass found of them ([`SeenProxy`]).
//!
//! The proxy runs as a Pod of its own (`hermes egress serve --in-cluster`
//! in `terminal.kubernetes_proxy_image`), reading its CA, tokens, mappings,
//! settings and the real keys from a Secret that only that Pod mounts. The
//! sandbox Pods reach it through a Service by name, trust its CA from a
//! ConfigMap (the certificate only), hold tokens, never a key, and are
//! selected by a NetworkPolicy that lets them reach the proxy's two ports
//! and DNS, nothing else; a second one lets only those sandboxes reach the
//! proxy. Every object carries [`LABEL_PROXY`] with the home's id, so two
//! homes sharing a namespace have proxies (and keys) of their own, and a
//! hash of what it is made of ([`LABEL_SPEC_HASH`]): a difference is an
//! update, or for the Pod a replacement. The Secret's hash is a digest of
//! what it holds (settings, CA, tokens, keyed digests of the keys), never
//! the keys.

use std::collections::BTreeMap;

use super::{KubeEgress, KubeSettings, LABEL_MANAGED_BY, MANAGED_BY, label_value};
use crate::egress::KeyState;
use crate::fingerprint::Fingerprint;
use crate::homes::LABEL_HOME;
use crate::sandbox::{LABEL_AGENT, LABEL_SPEC_HASH};

/// The label of every object of a home's proxy: the home's id.
pub const LABEL_PROXY: &str = "hermes-proxy";

/// The proxy Pod's container.
pub const PROXY_CONTAINER: &str = "proxy";

/// Where the proxy Pod mounts its Secret (read only).
pub const SECRET_MOUNT: &str = "/etc/hermes-proxy";

/// The Secret's entry holding the real keys: a JSON object of variable
/// name to value.
pub const KEYS_FILE: &str = "keys.json";

/// The Secret's entry holding the upstream CA of `proxy.upstream_ca_file`.
pub const UPSTREAM_CA_FILE: &str = "upstream-ca.pem";

/// The CA ConfigMap's entry.
pub const CA_ENTRY: &str = "ca.crt";

/// One of the proxy's objects, in the order they are made: everything the
/// Pod mounts or is reached through before the Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProxyObject {
    Secret,
    CaConfigMap,
    Service,
    SandboxPolicy,
    ProxyPolicy,
    Pod,
}

impl ProxyObject {
    pub const ALL: [ProxyObject; 6] = [
        ProxyObject::Secret,
        ProxyObject::CaConfigMap,
        ProxyObject::Service,
        ProxyObject::SandboxPolicy,
        ProxyObject::ProxyPolicy,
        ProxyObject::Pod,
    ];

    /// The API kind.
    pub fn kind(self) -> &'static str {
        match self {
            ProxyObject::Secret => "Secret",
            ProxyObject::CaConfigMap => "ConfigMap",
            ProxyObject::Service => "Service",
            ProxyObject::SandboxPolicy | ProxyObject::ProxyPolicy => "NetworkPolicy",
            ProxyObject::Pod => "Pod",
        }
    }
}

/// A home's proxy in the namespace, as the config and the proxy's files
/// want it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyWanted {
    pub namespace: String,
    /// The home's id ([`crate::homes::home_id`]): the value of
    /// [`LABEL_PROXY`] and the names' suffix.
    pub home: String,
    /// `terminal.kubernetes_proxy_image`: an image with `hermes` on its
    /// `PATH`; `None` blocks the proxy, with why.
    pub image: Option<String>,
    /// The CONNECT port; plain HTTP is the next one.
    pub tunnel_port: u16,
    /// The digest of what the Secret holds ([`secret_digest`]).
    pub secret_digest: String,
    /// The CA certificate's SHA-256.
    pub ca_sha256: String,
    /// `terminal.kubernetes_labels`, on every object.
    pub extra_labels: BTreeMap<String, String>,
    /// Where the proxy Pod may run: the sandboxes' node selector and
    /// tolerations.
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<super::Toleration>,
}

impl ProxyWanted {
    pub fn new(
        settings: &KubeSettings,
        home: &str,
        tunnel_port: u16,
        secret_digest: String,
        ca_sha256: String,
    ) -> ProxyWanted {
        ProxyWanted {
            namespace: settings.namespace.clone(),
            home: label_value(home),
            image: settings.proxy_image.clone(),
            tunnel_port,
            secret_digest,
            ca_sha256,
            extra_labels: settings.labels.clone(),
            node_selector: settings.node_selector.clone(),
            tolerations: settings.tolerations.clone(),
        }
    }

    /// The Pod's, Service's, Secret's and the proxy's NetworkPolicy's
    /// name; the Service's name is the host name sandboxes reach.
    pub fn name(&self) -> String {
        format!("hermes-proxy-{}", self.home)
    }

    /// An object's name.
    pub fn object_name(&self, object: ProxyObject) -> String {
        match object {
            ProxyObject::CaConfigMap => format!("hermes-proxy-ca-{}", self.home),
            ProxyObject::SandboxPolicy => format!("hermes-sandboxes-{}", self.home),
            ProxyObject::Secret
            | ProxyObject::Service
            | ProxyObject::ProxyPolicy
            | ProxyObject::Pod => self.name(),
        }
    }

    /// The ports the proxy serves sandboxes on: CONNECT, then plain HTTP.
    pub fn ports(&self) -> [u16; 2] {
        [self.tunnel_port, self.tunnel_port.saturating_add(1)]
    }

    /// The labels that select the proxy Pod.
    pub fn pod_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(LABEL_PROXY.to_string(), self.home.clone())])
    }

    /// The labels that select this home's sandbox Pods.
    pub fn sandbox_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_AGENT.to_string(), "1".to_string()),
            (LABEL_HOME.to_string(), self.home.clone()),
        ])
    }

    /// The hash of what `object` is made of: a difference updates it (the
    /// Pod: replaces it).
    pub fn hash(&self, object: ProxyObject) -> String {
        let mut f = Fingerprint::new();
        f.field("object", object.kind());
        f.field("home", &self.home);
        for (k, v) in &self.extra_labels {
            f.field("label", &format!("{k}={v}"));
        }
        let ports = format!("{}", self.tunnel_port);
        match object {
            ProxyObject::Secret => f.field("secret", &self.secret_digest),
            ProxyObject::CaConfigMap => f.field("ca", &self.ca_sha256),
            ProxyObject::Service | ProxyObject::SandboxPolicy | ProxyObject::ProxyPolicy => {
                f.field("ports", &ports)
            }
            ProxyObject::Pod => {
                f.field("image", self.image.as_deref().unwrap_or(""));
                f.field("ports", &ports);
                for (k, v) in &self.node_selector {
                    f.field("node_selector", &format!("{k}={v}"));
                }
                for t in &self.tolerations {
                    f.field("toleration", &t.fingerprint());
                }
                // The Pod reads its Secret when it starts: new contents,
                // a new Pod.
                f.field("secret", &self.secret_digest);
            }
        }
        f.finish()
    }

    /// An object's labels: hermes's own over the configured extra ones.
    pub fn labels(&self, object: ProxyObject) -> BTreeMap<String, String> {
        let mut labels = self.extra_labels.clone();
        labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
        labels.insert(LABEL_PROXY.to_string(), self.home.clone());
        labels.insert(LABEL_HOME.to_string(), self.home.clone());
        labels.insert(LABEL_SPEC_HASH.to_string(), self.hash(object));
        labels
    }

    /// What a sandbox Pod of this home gets: the proxy variables naming
    /// the Service, the CA's ConfigMap, and `tokens` (never a key).
    pub fn sandbox_egress(&self, tokens: &[(String, String)]) -> KubeEgress {
        let mut env = crate::egress::proxy_env(&self.name(), self.tunnel_port);
        env.extend(tokens.iter().cloned());
        let mut f = Fingerprint::new();
        f.field("host", &self.name());
        f.field("port", &self.tunnel_port.to_string());
        f.field("ca", &self.ca_sha256);
        KubeEgress {
            env,
            ca_config_map: self.object_name(ProxyObject::CaConfigMap),
            fingerprint: f.finish(),
        }
    }
}

/// The digest of what a proxy's Secret holds: the fingerprint of the
/// proxy's settings files (config, tokens, mappings), the CA's hash, and
/// the keyed digest of each real key the proxy should hold (`keys`,
/// `None` when not known). Never a key.
pub fn secret_digest(
    settings: &str,
    ca_sha256: &str,
    keys: Option<&BTreeMap<String, KeyState>>,
) -> String {
    let mut f = Fingerprint::new();
    f.field("settings", settings);
    f.field("ca", ca_sha256);
    match keys {
        None => f.field("keys", "unknown"),
        Some(keys) => {
            for (provider, state) in keys {
                let value = match (&state.digest, state.loaded) {
                    (Some(d), true) => d.as_str(),
                    (None, true) => "loaded",
                    (_, false) => "none",
                };
                f.field(provider, value);
            }
        }
    }
    f.finish()
}

/// One object of a proxy as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenObject {
    pub name: String,
    pub uid: String,
    /// Its [`LABEL_SPEC_HASH`], when it has one.
    pub hash: Option<String>,
    /// It carries [`LABEL_MANAGED_BY`]` = hermes` and this home's
    /// [`LABEL_PROXY`].
    pub made_by_hermes: bool,
    pub deleting: bool,
    /// A Pod's phase (`Pending`, `Running`, …); empty for other kinds.
    pub phase: String,
    /// A Pod's Ready condition.
    pub ready: bool,
    /// Why a Pod's container waits, when it does.
    pub waiting: Option<String>,
}

/// What a pass found of one home's proxy: its objects by kind (those
/// labelled for the home, and any holding a wanted name).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenProxy {
    pub objects: Vec<(ProxyObject, SeenObject)>,
}

impl SeenProxy {
    /// The object of `kind` named `name`.
    pub fn get(&self, object: ProxyObject, name: &str) -> Option<&SeenObject> {
        self.objects
            .iter()
            .find(|(o, s)| *o == object && s.name == name)
            .map(|(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn wanted() -> ProxyWanted {
        let settings = KubeSettings {
            namespace: "ns".into(),
            proxy_image: Some("hermes:1".into()),
            ..KubeSettings::default()
        };
        ProxyWanted::new(
            &settings,
            "0a1b2c3d4e5f6071",
            3128,
            "d1".into(),
            "ca1".into(),
        )
    }

    #[test]
    fn names_fit_the_api_and_the_sandboxes_reach_the_service_by_name() {
        let w = wanted();
        for o in ProxyObject::ALL {
            super::super::check_dns_label(&w.object_name(o)).unwrap();
        }
        let egress = w.sandbox_egress(&[("OPENAI_API_KEY".into(), "tok".into())]);
        assert!(egress.env.contains(&(
            "HTTPS_PROXY".into(),
            "http://hermes-proxy-0a1b2c3d4e5f6071:3128".into()
        )));
        assert!(egress.env.contains(&(
            "HTTP_PROXY".into(),
            "http://hermes-proxy-0a1b2c3d4e5f6071:3129".into()
        )));
        assert_eq!(egress.ca_config_map, "hermes-proxy-ca-0a1b2c3d4e5f6071");
    }

    #[test]
    fn new_secret_contents_replace_the_pod_and_update_only_the_secret() {
        let a = wanted();
        let b = ProxyWanted {
            secret_digest: "d2".into(),
            ..a.clone()
        };
        assert_ne!(a.hash(ProxyObject::Pod), b.hash(ProxyObject::Pod));
        assert_ne!(a.hash(ProxyObject::Secret), b.hash(ProxyObject::Secret));
        assert_eq!(a.hash(ProxyObject::Service), b.hash(ProxyObject::Service));
        assert_eq!(
            a.hash(ProxyObject::CaConfigMap),
            b.hash(ProxyObject::CaConfigMap)
        );
        // A token rotation changes no sandbox's fixed wiring.
        assert_eq!(
            a.sandbox_egress(&[]).fingerprint,
            b.sandbox_egress(&[("X".into(), "y".into())]).fingerprint
        );
    }

    #[test]
    fn the_secret_digest_follows_each_key_and_never_holds_one() {
        let key = |d: &str| {
            BTreeMap::from([(
                "openai".to_string(),
                KeyState {
                    loaded: true,
                    digest: Some(d.to_string()),
                },
            )])
        };
        let a = secret_digest("s", "c", Some(&key("k1")));
        assert_ne!(a, secret_digest("s", "c", Some(&key("k2"))));
        assert_ne!(a, secret_digest("s", "c", None));
        assert_ne!(a, secret_digest("s2", "c", Some(&key("k1"))));
        assert!(!a.contains("k1"));
    }
}
