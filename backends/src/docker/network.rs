//! The internal network of `proxy.enforce_network`: a bridge network with
//! no route out (`Internal`) and no traffic between its containers
//! (`enable_icc=false`), whose host-side bridge has a name hermes chose, so
//! that the proxy can find its gateway address on the host and listen
//! there.
//!
//! A network made before inter-container traffic was turned off is
//! replaced in place: its containers are disconnected (each is then on no
//! network at all), the network is made anew with the option, and the
//! same containers are connected to it again. A sandbox whose wiring the
//! new network changes (another gateway address) is then recreated by the
//! plan, as any drift is.

use std::collections::HashMap;
use std::net::IpAddr;

use bollard::models::{NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest};

use super::Engine;
use super::error::{DockerError, is_conflict, is_not_found};

/// The Docker option that names a bridge network's host interface.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// The Docker option that turns traffic between a bridge network's
/// containers on or off.
const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// An internal network as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalNetwork {
    pub name: String,
    /// The bridge's address on the host (the network's gateway).
    pub gateway: Option<IpAddr>,
    /// The ids of the containers attached.
    pub attached: Vec<String>,
    /// Whether its containers can reach each other (a network made before
    /// hermes turned that off).
    pub icc: bool,
    /// Whether [`Engine::ensure_internal_network`] replaced it just now.
    pub replaced: bool,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

impl Engine {
    /// Makes sure the internal network `name` exists with the host bridge
    /// `bridge` and `labels`: created when missing (a creation that lost a
    /// race to another hermes counts as done). A network of that name that
    /// is not internal, or has another bridge, is an error naming it: it
    /// was made by someone else and hermes leaves it alone. One whose
    /// containers can reach each other is replaced, its containers
    /// connected to the new one (`replaced` says so).
    pub async fn ensure_internal_network(
        &self,
        name: &str,
        bridge: &str,
        labels: &HashMap<String, String>,
    ) -> Result<InternalNetwork, DockerError> {
        let mut attached = Vec::new();
        let mut replacing = false;
        if let Some(found) = self.inspect_internal_network(name, bridge).await? {
            if !found.icc {
                return Ok(found);
            }
            tracing::info!(
                network = name,
                containers = found.attached.len(),
                "replacing the network: its containers can reach each other"
            );
            attached = self.detach_all(name).await?;
            self.remove_network(name).await?;
            replacing = true;
        }
        let request = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".to_string()),
            internal: Some(true),
            attachable: Some(false),
            enable_ipv6: Some(false),
            options: Some(HashMap::from([
                (BRIDGE_NAME_OPTION.to_string(), bridge.to_string()),
                (ICC_OPTION.to_string(), "false".to_string()),
            ])),
            labels: Some(labels.clone()),
            ..NetworkCreateRequest::default()
        };
        match self.docker.create_network(request).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {}
            Err(source) => return Err(DockerError::engine("create network", name, source)),
        }
        for container in &attached {
            let request = NetworkConnectRequest {
                container: container.clone(),
                endpoint_config: None,
            };
            match self.docker.connect_network(name, request).await {
                Ok(()) => {}
                // Removed in between: nothing to connect.
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(DockerError::engine("connect to network", container, source));
                }
            }
        }
        let mut made = self
            .inspect_internal_network(name, bridge)
            .await?
            .ok_or_else(|| DockerError::ForeignNetwork {
                network: name.to_string(),
                reason: "it vanished right after its creation".to_string(),
            })?;
        made.replaced = replacing;
        Ok(made)
    }

    /// Disconnects every container from the network `name`; returns their
    /// ids.
    async fn detach_all(&self, name: &str) -> Result<Vec<String>, DockerError> {
        let net = self
            .docker
            .inspect_network(name, None)
            .await
            .map_err(|source| DockerError::engine("inspect network", name, source))?;
        let ids: Vec<String> = net.containers.unwrap_or_default().into_keys().collect();
        for id in &ids {
            let request = NetworkDisconnectRequest {
                container: id.clone(),
                force: Some(true),
            };
            match self.docker.disconnect_network(name, request).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(DockerError::engine("disconnect from network", id, source));
                }
            }
        }
        Ok(ids)
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
        let icc = net
            .options
            .as_ref()
            .and_then(|o| o.get(ICC_OPTION))
            .is_none_or(|v| v != "false");
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
            attached: {
                let mut ids: Vec<String> = net.containers.unwrap_or_default().into_keys().collect();
                ids.sort();
                ids
            },
            icc,
            replaced: false,
            labels: net.labels.unwrap_or_default(),
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
