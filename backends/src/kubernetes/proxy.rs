//! The egress proxy's objects in the namespace: what a pass sees of them
//! (metadata only for the Secret, ConfigMap, Service and NetworkPolicies:
//! the Secret's contents are never read back), the objects themselves,
//! and their writes (server-side apply with the field manager `hermes`;
//! deletes with a uid precondition; the Pod replaced, then waited for
//! until Ready).
//!
//! The Secret holds the real keys and is mounted by the proxy Pod only
//! (read-only, mode 0440 with the Pod's fsGroup, the proxy's own group:
//! it runs as a user of its own, never root); sandbox Pods mount the CA's ConfigMap, which
//! holds the certificate and nothing else. The sandboxes' NetworkPolicy
//! lets them reach the proxy's two ports and the cluster's DNS
//! (`kube-system` Pods labelled `k8s-app=kube-dns`), nothing else, and
//! no one reach them; the proxy's lets only this home's sandboxes reach
//! it. Those hold only where the cluster's network plugin enforces
//! NetworkPolicy.

use std::collections::BTreeMap;

use hermes_model::kubernetes::proxy::{
    CA_ENTRY, PROXY_CONTAINER, ProxyObject, ProxyWanted, SECRET_MOUNT, SeenObject, SeenProxy,
};
use hermes_model::kubernetes::{FIELD_MANAGER, GRACE_SECONDS, LABEL_MANAGED_BY, SandboxKind};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, Pod,
    PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile, Secret,
    SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction,
    Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use zeroize::Zeroizing;

use super::apply::wait_ready;
use super::observe::seen_pod;
use super::{Cluster, KubeError, call};

/// What the Secret and the CA's ConfigMap hold, read by the caller from
/// the host's proxy files (and the keys' source) when it applies them.
pub struct ProxyFiles {
    /// The Secret's entries: file name → contents.
    pub secret: BTreeMap<String, Zeroizing<Vec<u8>>>,
    /// The CA certificate (public).
    pub ca_pem: String,
}

impl std::fmt::Debug for ProxyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The entries' names, never their contents.
        f.debug_struct("ProxyFiles")
            .field("secret", &self.secret.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The objects of the home `home`'s proxy: those labelled for it, and any
/// holding a name `wanted` would take.
pub async fn observe(
    cluster: &Cluster,
    home: &str,
    wanted: Option<&ProxyWanted>,
) -> Result<SeenProxy, KubeError> {
    let ns = &cluster.namespace;
    let home = hermes_model::kubernetes::label_value(home);
    let lp = ListParams::default().labels(&format!(
        "{}={home}",
        hermes_model::kubernetes::proxy::LABEL_PROXY
    ));
    let client = &cluster.client;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (s, c, v, n, p) = tokio::try_join!(
        call(
            "list",
            format!("secrets in namespace {ns}"),
            secrets.list_metadata(&lp)
        ),
        call(
            "list",
            format!("configmaps in namespace {ns}"),
            maps.list_metadata(&lp)
        ),
        call(
            "list",
            format!("services in namespace {ns}"),
            services.list_metadata(&lp)
        ),
        call(
            "list",
            format!("networkpolicies in namespace {ns}"),
            policies.list_metadata(&lp)
        ),
        call("list", format!("pods in namespace {ns}"), pods.list(&lp)),
    )?;
    let mut seen = SeenProxy::default();
    let of_meta = |meta: &ObjectMeta| seen_object(meta, &home);
    for m in &s.items {
        seen.objects
            .push((ProxyObject::Secret, of_meta(&m.metadata)));
    }
    for m in &c.items {
        seen.objects
            .push((ProxyObject::CaConfigMap, of_meta(&m.metadata)));
    }
    for m in &v.items {
        seen.objects
            .push((ProxyObject::Service, of_meta(&m.metadata)));
    }
    for m in &n.items {
        let name = m.metadata.name.as_deref().unwrap_or_default();
        let object = if name.starts_with("hermes-sandboxes-") {
            ProxyObject::SandboxPolicy
        } else {
            ProxyObject::ProxyPolicy
        };
        seen.objects.push((object, of_meta(&m.metadata)));
    }
    for pod in &p.items {
        seen.objects.push((ProxyObject::Pod, of_pod(pod, &home)));
    }
    let Some(wanted) = wanted else {
        return Ok(seen);
    };
    // A wanted name held by an object without the proxy's label: read by
    // name so that the planner leaves it alone.
    for object in ProxyObject::ALL {
        let name = wanted.object_name(object);
        if seen.get(object, &name).is_some() {
            continue;
        }
        let what = format!("{} {ns}/{name}", object.kind().to_lowercase());
        let meta = match object {
            ProxyObject::Secret => call("get", what, secrets.get_metadata_opt(&name))
                .await?
                .map(|m| m.metadata),
            ProxyObject::CaConfigMap => call("get", what, maps.get_metadata_opt(&name))
                .await?
                .map(|m| m.metadata),
            ProxyObject::Service => call("get", what, services.get_metadata_opt(&name))
                .await?
                .map(|m| m.metadata),
            ProxyObject::SandboxPolicy | ProxyObject::ProxyPolicy => {
                call("get", what, policies.get_metadata_opt(&name))
                    .await?
                    .map(|m| m.metadata)
            }
            ProxyObject::Pod => call("get", what, pods.get_metadata_opt(&name))
                .await?
                .map(|m| m.metadata),
        };
        if let Some(meta) = meta {
            seen.objects.push((object, seen_object(&meta, &home)));
        }
    }
    Ok(seen)
}

fn seen_object(meta: &ObjectMeta, home: &str) -> SeenObject {
    let labels = meta.labels.clone().unwrap_or_default();
    SeenObject {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        hash: labels.get(hermes_model::sandbox::LABEL_SPEC_HASH).cloned(),
        made_by_hermes: labels.get(LABEL_MANAGED_BY).map(String::as_str)
            == Some(hermes_model::kubernetes::MANAGED_BY)
            && labels
                .get(hermes_model::kubernetes::proxy::LABEL_PROXY)
                .map(String::as_str)
                == Some(home),
        deleting: meta.deletion_timestamp.is_some(),
        ..SeenObject::default()
    }
}

fn of_pod(pod: &Pod, home: &str) -> SeenObject {
    let p = seen_pod(pod);
    SeenObject {
        phase: p.phase,
        ready: p.ready,
        waiting: p.waiting,
        ..seen_object(&pod.metadata, home)
    }
}

fn params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER)
}

fn meta(wanted: &ProxyWanted, object: ProxyObject) -> ObjectMeta {
    ObjectMeta {
        name: Some(wanted.object_name(object)),
        namespace: Some(wanted.namespace.clone()),
        labels: Some(wanted.labels(object)),
        ..ObjectMeta::default()
    }
}

/// Writes `object` as `wanted` says; the Pod is replaced (the one of
/// `existing` deleted and gone first) and waited for until Ready. The
/// Secret and the ConfigMap need `files`.
pub async fn apply(
    cluster: &Cluster,
    object: ProxyObject,
    wanted: &ProxyWanted,
    existing: Option<&str>,
    files: Option<&ProxyFiles>,
) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let name = wanted.object_name(object);
    let what = format!("{} {ns}/{name}", object.kind().to_lowercase());
    let files = || {
        files.ok_or_else(|| KubeError::Unreachable {
            verb: "apply",
            resource: what.clone(),
            message: "the proxy's files were not read".to_string(),
        })
    };
    match object {
        ProxyObject::Secret => {
            let body = secret(wanted, files()?);
            write(cluster, what, &name, &body).await
        }
        ProxyObject::CaConfigMap => {
            let body = config_map(wanted, &files()?.ca_pem);
            write(cluster, what, &name, &body).await
        }
        ProxyObject::Service => write(cluster, what, &name, &service(wanted)).await,
        ProxyObject::SandboxPolicy | ProxyObject::ProxyPolicy => {
            write(cluster, what, &name, &policy(wanted, object)).await
        }
        ProxyObject::Pod => {
            if let Some(uid) = existing {
                super::apply::delete_pod(cluster, &name, uid).await?;
                super::apply::wait_gone(cluster, &name, uid).await?;
            }
            write(cluster, what, &name, &pod(wanted)).await?;
            wait_ready(cluster, &name, SandboxKind::Pod).await
        }
    }
}

/// Server-side applies `body` as the object `name` of its kind.
async fn write<K>(cluster: &Cluster, what: String, name: &str, body: &K) -> Result<(), KubeError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    call(
        "apply",
        what,
        api.patch(name, &params(), &Patch::Apply(body)),
    )
    .await
    .map(drop)
}

/// Deletes the object `name` of `K` with `dp`'s preconditions.
async fn remove<K>(
    cluster: &Cluster,
    what: String,
    name: &str,
    dp: &DeleteParams,
) -> Result<(), KubeError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    call("delete", what, api.delete(name, dp)).await.map(drop)
}

/// Deletes the proxy's `object` `name` if it is still the one of `uid`
/// (one already gone is no error); a Pod is waited for until gone.
pub async fn delete(
    cluster: &Cluster,
    object: ProxyObject,
    name: &str,
    uid: &str,
) -> Result<(), KubeError> {
    let ns = &cluster.namespace;
    let what = format!("{} {ns}/{name}", object.kind().to_lowercase());
    let dp = DeleteParams {
        grace_period_seconds: u32::try_from(GRACE_SECONDS).ok(),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let sent = match object {
        ProxyObject::Secret => remove::<Secret>(cluster, what, name, &dp).await,
        ProxyObject::CaConfigMap => remove::<ConfigMap>(cluster, what, name, &dp).await,
        ProxyObject::Service => remove::<Service>(cluster, what, name, &dp).await,
        ProxyObject::SandboxPolicy | ProxyObject::ProxyPolicy => {
            remove::<NetworkPolicy>(cluster, what, name, &dp).await
        }
        ProxyObject::Pod => {
            super::apply::delete_pod(cluster, name, uid).await?;
            return super::apply::wait_gone(cluster, name, uid).await;
        }
    };
    match sent {
        Err(e) if e.code() == Some(404) => Ok(()),
        other => other,
    }
}

/// The Secret: the proxy's files and keys, for the proxy Pod only.
pub fn secret(wanted: &ProxyWanted, files: &ProxyFiles) -> Secret {
    Secret {
        metadata: meta(wanted, ProxyObject::Secret),
        type_: Some("Opaque".to_string()),
        immutable: Some(false),
        data: Some(
            files
                .secret
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// The CA's ConfigMap: the certificate sandboxes trust.
pub fn config_map(wanted: &ProxyWanted, ca_pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: meta(wanted, ProxyObject::CaConfigMap),
        data: Some(BTreeMap::from([(CA_ENTRY.to_string(), ca_pem.to_string())])),
        ..ConfigMap::default()
    }
}

fn tcp_port(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some("TCP".to_string()),
        port: Some(IntOrString::Int(i32::from(port))),
        end_port: None,
    }
}

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    }
}

/// The Service sandboxes reach the proxy through, by its name.
pub fn service(wanted: &ProxyWanted) -> Service {
    let [tunnel, http] = wanted.ports();
    let port = |name: &str, p: u16| ServicePort {
        name: Some(name.to_string()),
        port: i32::from(p),
        target_port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    };
    Service {
        metadata: meta(wanted, ProxyObject::Service),
        spec: Some(ServiceSpec {
            selector: Some(wanted.pod_selector()),
            ports: Some(vec![port("connect", tunnel), port("http", http)]),
            type_: Some("ClusterIP".to_string()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// A NetworkPolicy: the sandboxes' (egress to the proxy and DNS only, no
/// ingress) or the proxy's (ingress from this home's sandboxes only).
pub fn policy(wanted: &ProxyWanted, object: ProxyObject) -> NetworkPolicy {
    let ports: Vec<NetworkPolicyPort> = wanted.ports().into_iter().map(tcp_port).collect();
    let spec = if object == ProxyObject::SandboxPolicy {
        let dns = [("UDP", 53), ("TCP", 53)]
            .into_iter()
            .map(|(protocol, port)| NetworkPolicyPort {
                protocol: Some(protocol.to_string()),
                port: Some(IntOrString::Int(port)),
                end_port: None,
            })
            .collect();
        NetworkPolicySpec {
            pod_selector: Some(selector(wanted.sandbox_selector())),
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            ingress: Some(Vec::new()),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(selector(wanted.pod_selector())),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(ports),
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(selector(BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_string(),
                            "kube-system".to_string(),
                        )]))),
                        pod_selector: Some(selector(BTreeMap::from([(
                            "k8s-app".to_string(),
                            "kube-dns".to_string(),
                        )]))),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(dns),
                },
            ]),
        }
    } else {
        NetworkPolicySpec {
            pod_selector: Some(selector(wanted.pod_selector())),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(selector(wanted.sandbox_selector())),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(ports),
            }]),
            egress: None,
        }
    };
    NetworkPolicy {
        metadata: meta(wanted, object),
        spec: Some(spec),
    }
}

/// The proxy's user and group (and the Pod's fsGroup): no one's in any
/// image, never root.
const PROXY_UID: i64 = 65532;

/// Where the proxy Pod's scratch directory is (its root file system is
/// read-only).
const SCRATCH: &str = "/tmp";

/// The proxy Pod: `hermes egress serve --in-cluster` on the Secret,
/// Ready once it accepts on the CONNECT port.
pub fn pod(wanted: &ProxyWanted) -> Pod {
    let [tunnel, http] = wanted.ports();
    let port = |name: &str, p: u16| ContainerPort {
        name: Some(name.to_string()),
        container_port: i32::from(p),
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    };
    let container = Container {
        name: PROXY_CONTAINER.to_string(),
        image: wanted.image.clone(),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(
            ["hermes", "egress", "serve", "--in-cluster", SECRET_MOUNT]
                .into_iter()
                .map(str::to_string)
                .collect(),
        ),
        env: Some(vec![EnvVar {
            name: "HERMES_HOME".to_string(),
            value: Some(format!("{SCRATCH}/hermes")),
            value_from: None,
        }]),
        ports: Some(vec![port("connect", tunnel), port("http", http)]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(tunnel)),
                host: None,
            }),
            period_seconds: Some(1),
            timeout_seconds: Some(1),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".to_string())),
                ("memory".to_string(), Quantity("64Mi".to_string())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("512Mi".to_string()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            // Not root: it reads its Secret through its group (the Pod's
            // fsGroup, mode 0440) and binds ports above 1023.
            run_as_user: Some(PROXY_UID),
            run_as_group: Some(PROXY_UID),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "secret".to_string(),
                mount_path: SECRET_MOUNT.to_string(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "scratch".to_string(),
                mount_path: SCRATCH.to_string(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    };
    Pod {
        metadata: meta(wanted, ProxyObject::Pod),
        spec: Some(PodSpec {
            containers: vec![container],
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                fs_group: Some(PROXY_UID),
                ..PodSecurityContext::default()
            }),
            node_selector: (!wanted.node_selector.is_empty()).then(|| wanted.node_selector.clone()),
            tolerations: (!wanted.tolerations.is_empty()).then(|| {
                wanted
                    .tolerations
                    .iter()
                    .map(super::objects::toleration)
                    .collect()
            }),
            restart_policy: Some("Always".to_string()),
            termination_grace_period_seconds: Some(GRACE_SECONDS),
            volumes: Some(vec![
                Volume {
                    name: "secret".to_string(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(wanted.object_name(ProxyObject::Secret)),
                        default_mode: Some(0o440),
                        ..SecretVolumeSource::default()
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "scratch".to_string(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        medium: Some("Memory".to_string()),
                        size_limit: Some(Quantity("64Mi".to_string())),
                        ..EmptyDirVolumeSource::default()
                    }),
                    ..Volume::default()
                },
            ]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}
