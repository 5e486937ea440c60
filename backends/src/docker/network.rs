//! The internal network of `proxy.enforce_network`: a bridge network with
//! no route out (`Internal`), whose host-side bridge has a name hermes
//! chose, so that the proxy can find its gateway address on the host and
//! listen there.

use std::collections::HashMap;
use std::net::IpAddr;

use bollard::models::NetworkCreateRequest;

use super::Engine;
use super::error::{DockerError, is_conflict, is_not_found};

/// The Docker option that names a bridge network's host interface.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// An internal network as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalNetwork {
    pub name: String,
    /// The bridge's address on the host (the network's gateway).
    pub gateway: Option<IpAddr>,
    /// How many containers are attached.
    pub containers: usize,
}

impl Engine {
    /// Makes sure the internal network `name` exists with the host bridge
    /// `bridge` and `labels`: created when missing (a creation that lost a
    /// race to another hermes counts as done). A network of that name that
    /// is not internal, or has another bridge, is an error naming it: it
    /// was made by someone else and hermes leaves it alone.
    pub async fn ensure_internal_network(
        &self,
        name: &str,
        bridge: &str,
        labels: &HashMap<String, String>,
    ) -> Result<InternalNetwork, DockerError> {
        if let Some(found) = self.inspect_internal_network(name, bridge).await? {
            return Ok(found);
        }
        let request = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".to_string()),
            internal: Some(true),
            attachable: Some(false),
            enable_ipv6: Some(false),
            options: Some(HashMap::from([(
                BRIDGE_NAME_OPTION.to_string(),
                bridge.to_string(),
            )])),
            labels: Some(labels.clone()),
            ..NetworkCreateRequest::default()
        };
        match self.docker.create_network(request).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {}
            Err(source) => return Err(DockerError::engine("create network", name, source)),
        }
        self.inspect_internal_network(name, bridge)
            .await?
            .ok_or_else(|| DockerError::ForeignNetwork {
                network: name.to_string(),
                reason: "it vanished right after its creation".to_string(),
            })
    }

    /// The internal network `name`, if it exists; an error when it exists
    /// but is not what hermes makes.
    pub async fn inspect_internal_network(
        &self,
        name: &str,
        bridge: &str,
    ) -> Result<Option<InternalNetwork>, DockerError> {
        let net = match self.docker.inspect_network(name, None).await {
            Ok(net) => net,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(source) => return Err(DockerError::engine("inspect network", name, source)),
        };
        let bridge_found = net
            .options
            .as_ref()
            .and_then(|o| o.get(BRIDGE_NAME_OPTION))
            .map(String::as_str);
        if net.internal != Some(true) || bridge_found != Some(bridge) {
            return Err(DockerError::ForeignNetwork {
                network: name.to_string(),
                reason: format!(
                    "it is not the internal network hermes makes (internal: {}, bridge: {})",
                    net.internal.unwrap_or(false),
                    bridge_found.unwrap_or("docker's choice")
                ),
            });
        }
        let gateway = net
            .ipam
            .and_then(|i| i.config)
            .into_iter()
            .flatten()
            .filter_map(|c| c.gateway)
            .find_map(|g| g.parse().ok());
        Ok(Some(InternalNetwork {
            name: name.to_string(),
            gateway,
            containers: net.containers.map_or(0, |c| c.len()),
        }))
    }

    /// Removes the network `name`; one that does not exist is success.
    pub async fn remove_network(&self, name: &str) -> Result<(), DockerError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(DockerError::engine("remove network", name, source)),
        }
    }
}
