//! The objects hermes writes for a [`PodWanted`]: its claim and its Pod,
//! with the Docker sandbox's hardening as the Pod's security context.
//! Pure functions of the wanted state; the API calls are in `apply.rs`.

use std::collections::BTreeMap;

use hermes_model::kubernetes::{
    CONTAINER, DATA_PATHS, GRACE_SECONDS, PodWanted, SCRATCH, Toleration,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecurityContext,
    Toleration as KubeToleration, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The container's PID 1, as Docker's `--init` is a sandbox's: it reaps
/// the orphans commands leave, and ends at once on SIGTERM (a bare `sleep`
/// as PID 1 ignores it, so every delete would wait out the whole grace).
/// `exec.rs`'s process count knows its `sleep 86400`.
const PID1: &str = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done";

/// Where the proxy's CA is mounted in a wired sandbox (the directory of
/// [`hermes_model::egress::CA_IN_SANDBOX`]).
const CA_VOLUME: &str = "hermes-proxy-ca";

fn meta(wanted: &PodWanted, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(wanted.namespace.clone()),
        labels: Some(wanted.labels.clone()),
        ..ObjectMeta::default()
    }
}

/// The persistent sandbox's claim; `None` for a session's sandbox.
pub fn claim(wanted: &PodWanted) -> Option<PersistentVolumeClaim> {
    let name = wanted.claim.as_deref()?;
    Some(PersistentVolumeClaim {
        metadata: meta(wanted, name),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: wanted.storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(format!("{}Mi", wanted.claim_size_mb())),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    })
}

/// The sandbox's Pod.
pub fn pod(wanted: &PodWanted) -> Pod {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    match &wanted.claim {
        Some(claim) => {
            volumes.push(Volume {
                name: "data".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: None,
                }),
                ..Volume::default()
            });
            for (sub, path) in DATA_PATHS {
                mounts.push(VolumeMount {
                    name: "data".to_string(),
                    mount_path: path.to_string(),
                    sub_path: Some(sub.to_string()),
                    ..VolumeMount::default()
                });
            }
        }
        None => {
            for (sub, path) in DATA_PATHS {
                volumes.push(Volume {
                    name: sub.to_string(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                });
                mounts.push(VolumeMount {
                    name: sub.to_string(),
                    mount_path: path.to_string(),
                    ..VolumeMount::default()
                });
            }
        }
    }
    for (name, path, size) in SCRATCH {
        volumes.push(Volume {
            name: name.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_string()),
                size_limit: Some(Quantity(size.to_string())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: name.to_string(),
            mount_path: path.to_string(),
            ..VolumeMount::default()
        });
    }
    if let Some(ca) = &wanted.ca_config_map {
        volumes.push(Volume {
            name: CA_VOLUME.to_string(),
            config_map: Some(ConfigMapVolumeSource {
                name: ca.clone(),
                default_mode: Some(0o444),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        // The one file, where a Docker sandbox has it: the image's own
        // certificates beside it stay.
        mounts.push(VolumeMount {
            name: CA_VOLUME.to_string(),
            mount_path: hermes_model::egress::CA_IN_SANDBOX.to_string(),
            sub_path: Some(hermes_model::kubernetes::proxy::CA_ENTRY.to_string()),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    let mut limits = BTreeMap::new();
    if wanted.cpu_millis > 0 {
        limits.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", wanted.cpu_millis)),
        );
    }
    if wanted.memory_mb > 0 {
        limits.insert(
            "memory".to_string(),
            Quantity(format!("{}Mi", wanted.memory_mb)),
        );
    }
    if wanted.disk_mb > 0 {
        limits.insert(
            "ephemeral-storage".to_string(),
            Quantity(format!("{}Mi", wanted.disk_mb)),
        );
    }
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(wanted.image.clone()),
        command: Some(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            PID1.to_string(),
        ]),
        working_dir: Some("/workspace".to_string()),
        env: (!wanted.env.is_empty()).then(|| {
            wanted
                .env
                .iter()
                .map(|(k, v)| EnvVar {
                    name: k.clone(),
                    value: Some(v.clone()),
                    value_from: None,
                })
                .collect()
        }),
        image_pull_policy: Some("IfNotPresent".to_string()),
        resources: (!limits.is_empty()).then(|| ResourceRequirements {
            limits: Some(limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            // As on Docker: the image's root file system stays writable;
            // the scratch directories are size-limited memory.
            read_only_root_filesystem: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: Some(wanted.cap_add.clone()),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    Pod {
        metadata: meta(wanted, &wanted.name),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(volumes),
            restart_policy: Some("Always".to_string()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            service_account_name: wanted.service_account.clone(),
            runtime_class_name: wanted.runtime_class.clone(),
            node_selector: (!wanted.node_selector.is_empty()).then(|| wanted.node_selector.clone()),
            tolerations: (!wanted.tolerations.is_empty())
                .then(|| wanted.tolerations.iter().map(toleration).collect()),
            termination_grace_period_seconds: Some(GRACE_SECONDS),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_string(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

pub(super) fn toleration(t: &Toleration) -> KubeToleration {
    KubeToleration {
        key: Some(t.key.clone()),
        operator: Some(if t.value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value: t.value.clone(),
        effect: t.effect.clone(),
        toleration_seconds: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_model::kubernetes::KubeSettings;
    use hermes_model::sandbox::SandboxKey;

    fn settings() -> KubeSettings {
        KubeSettings {
            namespace: "hermes".into(),
            image: "debian:bookworm".into(),
            cpu: 0.5,
            memory_mb: 512,
            disk_mb: 2048,
            tolerations: vec![Toleration::parse("gpu:NoSchedule").unwrap()],
            ..KubeSettings::default()
        }
    }

    #[test]
    fn the_pod_carries_the_docker_sandbox_s_hardening() {
        let w = PodWanted::new(
            &settings(),
            SandboxKey::persistent("default", "t"),
            None,
            None,
        );
        let p = pod(&w);
        let spec = p.spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(caps.add.as_ref().unwrap().contains(&"CHOWN".to_string()));
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["cpu"].0, "500m");
        assert_eq!(limits["memory"].0, "512Mi");
        let mounts: Vec<_> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.mount_path.as_str(), m.sub_path.as_deref()))
            .collect();
        assert!(mounts.contains(&("/workspace", Some("workspace"))));
        assert!(mounts.contains(&("/root", Some("home"))));
        assert_eq!(
            spec.tolerations.unwrap()[0].operator.as_deref(),
            Some("Exists")
        );
        let claim = claim(&w).unwrap();
        assert_eq!(claim.metadata.name, w.claim);
        assert_eq!(
            claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "2048Mi"
        );
    }

    #[test]
    fn a_session_s_pod_keeps_its_files_in_empty_dirs_and_has_no_claim() {
        let w = PodWanted::new(
            &settings(),
            SandboxKey::session("default", "t", "s"),
            None,
            None,
        );
        assert!(claim(&w).is_none());
        let spec = pod(&w).spec.unwrap();
        let vols = spec.volumes.unwrap();
        assert!(vols.iter().all(|v| v.persistent_volume_claim.is_none()));
        assert!(
            vols.iter()
                .any(|v| v.name == "workspace" && v.empty_dir.is_some())
        );
    }
}
