//! The operations of a plan, each idempotent: create (a name conflict means
//! another process got there first), start (already running is started),
//! remove (already gone is removed), and making sure an image is there.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, RemoveContainerOptionsBuilder,
    RenameContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;
use hermes_model::sandbox::SandboxSpec;

use super::Engine;
use super::error::{DockerError, is_conflict, is_not_found, server_message};

/// How long a removal waits for another process's removal of the same
/// container to finish.
pub const REMOVAL_WAIT: Duration = Duration::from_secs(15);

/// How often that wait looks.
const REMOVAL_POLL: Duration = Duration::from_millis(20);

/// What [`Engine::create`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// A new container, with the engine's id.
    Created { id: String },
    /// A container of that name exists (the engine answered 409): another
    /// process created it first, which counts as done.
    AlreadyExists,
}

/// What [`Engine::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveOutcome {
    Removed,
    /// There was no such container (404), or its removal was already in
    /// progress (and it is gone now): counts as done.
    AlreadyGone,
}

/// What [`Engine::ensure_image`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageOutcome {
    /// The engine had the image.
    Present,
    /// The image was pulled.
    Pulled,
}

/// A device of `--device host[:container[:perms]]`.
pub type DeviceMapping = bollard::models::DeviceMapping;

/// Writes a file of the spec's (in a directory hermes made, bound
/// read-only): beside it, then renamed over it, never through a link.
fn write_host_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

impl Engine {
    /// Creates the container of `spec` (not started). Makes the host
    /// directories the binds need first (mode 0700, parents included),
    /// from the home down without following a symbolic link: a bind source
    /// that is or passes through one is refused and no container is made
    /// ([`crate::host_dir`]). Every field of the spec goes into the create
    /// call's body: environment values never appear on a command line.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<CreateOutcome, DockerError> {
        for dir in &spec.host_dirs {
            let (home, path) = (spec.base_of(dir).to_path_buf(), dir.clone());
            tokio::task::spawn_blocking(move || crate::host_dir::make_below(&home, &path))
                .await
                .map_err(|e| DockerError::HostDir {
                    container: spec.name.clone(),
                    path: dir.clone(),
                    source: crate::host_dir::HostDirError::Io {
                        path: dir.clone(),
                        source: std::io::Error::other(e),
                    },
                })?
                .map_err(|source| DockerError::HostDir {
                    container: spec.name.clone(),
                    path: dir.clone(),
                    source,
                })?;
        }
        if let Some((path, text)) = &spec.host_file {
            write_host_file(path, text).map_err(|source| DockerError::HostDir {
                container: spec.name.clone(),
                path: path.clone(),
                source: crate::host_dir::HostDirError::Io {
                    path: path.clone(),
                    source,
                },
            })?;
        }
        // As the image wants it started (an s6-overlay `/init`).
        let spec = &spec.for_entrypoint(&self.image_entrypoint(&spec.image).await);
        let body = create_body(spec)?;
        let options = CreateContainerOptionsBuilder::default()
            .name(&spec.name)
            .build();
        match self.docker.create_container(Some(options), body).await {
            Ok(created) => Ok(CreateOutcome::Created { id: created.id }),
            Err(e) if is_conflict(&e) => Ok(CreateOutcome::AlreadyExists),
            Err(e) if is_not_found(&e) => Err(DockerError::engine(
                "create container (image missing?)",
                &format!("{} from image {}", spec.name, spec.image),
                e,
            )),
            Err(e) => Err(DockerError::engine(
                "create container",
                &format!("{} from image {}", spec.name, spec.image),
                e,
            )),
        }
    }

    /// The entrypoint of a local image; empty when it has none or cannot
    /// be inspected (the create then says what is wrong).
    async fn image_entrypoint(&self, image: &str) -> Vec<String> {
        match self.docker.inspect_image(image).await {
            Ok(info) => info.config.and_then(|c| c.entrypoint).unwrap_or_default(),
            Err(e) => {
                tracing::debug!(image, error = %e, "cannot inspect the image's entrypoint");
                Vec::new()
            }
        }
    }

    /// Starts a container (by id or name). An already running one counts as
    /// started (the engine's 304); a missing one is [`DockerError::Gone`].
    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        // bollard passes 304 Not Modified through as success.
        match self.docker.start_container(id, None).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::Gone {
                container: id.to_string(),
                reason: "no such container".to_string(),
            }),
            Err(e) => Err(DockerError::engine("start container", id, e)),
        }
    }

    /// Stops a container (by id or name) at once (`SIGKILL`, as a forced
    /// removal does). A stopped one counts as stopped (the engine's 304); a
    /// missing one is [`DockerError::Gone`].
    pub async fn stop(&self, id: &str) -> Result<(), DockerError> {
        let options = StopContainerOptionsBuilder::default().t(0).build();
        // bollard passes 304 Not Modified through as success.
        match self.docker.stop_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::Gone {
                container: id.to_string(),
                reason: "no such container".to_string(),
            }),
            Err(e) => Err(DockerError::engine("stop container", id, e)),
        }
    }

    /// Renames the container `id` to `name` (the engine's rename). A
    /// missing container is [`DockerError::Gone`]; a name held by another
    /// container is the engine's refusal.
    pub async fn rename(&self, id: &str, name: &str) -> Result<(), DockerError> {
        let options = RenameContainerOptionsBuilder::default().name(name).build();
        match self.docker.rename_container(id, options).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::Gone {
                container: id.to_string(),
                reason: "no such container".to_string(),
            }),
            Err(e) => Err(DockerError::engine(
                "rename container",
                &format!("{id} to {name}"),
                e,
            )),
        }
    }

    /// Removes a container (by id or name), running or not, keeping its
    /// volumes (the bind-mounted data outlives the container). A missing
    /// container counts as removed, and so does one whose removal another
    /// process started, once the engine no longer has it (waited for, up
    /// to [`REMOVAL_WAIT`]; then [`DockerError::StillRemoving`]).
    pub async fn remove(&self, id: &str) -> Result<RemoveOutcome, DockerError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(false)
            .build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(RemoveOutcome::Removed),
            Err(e) if is_not_found(&e) => Ok(RemoveOutcome::AlreadyGone),
            Err(e)
                if is_conflict(&e)
                    && server_message(&e).is_some_and(|m| m.contains("already in progress")) =>
            {
                // Another process's removal: the engine answers this while
                // it still reports the container (running, even, until its
                // processes are dead). Done only once it is really gone, so
                // that a create of its name that follows does not meet it.
                self.wait_gone(id).await?;
                Ok(RemoveOutcome::AlreadyGone)
            }
            Err(e) => Err(DockerError::engine("remove container", id, e)),
        }
    }

    /// Waits until the engine no longer knows the container `id` (a
    /// removal in progress elsewhere), up to [`REMOVAL_WAIT`].
    async fn wait_gone(&self, id: &str) -> Result<(), DockerError> {
        let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
        loop {
            match self.docker.inspect_container(id, None).await {
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => return Err(DockerError::engine("inspect container", id, e)),
                Ok(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(DockerError::StillRemoving {
                        container: id.to_string(),
                        waited: REMOVAL_WAIT,
                    });
                }
                Ok(_) => tokio::time::sleep(REMOVAL_POLL).await,
            }
        }
    }

    /// The OCI runtimes the engine lists (`docker info`'s `Runtimes`).
    pub async fn runtimes(&self) -> Result<std::collections::BTreeSet<String>, DockerError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| DockerError::engine("info", "the engine", e))?;
        Ok(info.runtimes.unwrap_or_default().into_keys().collect())
    }

    /// The runtime of a container made without one (`docker info`'s
    /// `DefaultRuntime`; `runc` when the engine does not say).
    pub async fn default_runtime(&self) -> Result<String, DockerError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| DockerError::engine("info", "the engine", e))?;
        Ok(info
            .default_runtime
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "runc".to_string()))
    }

    /// Whether the engine has `image` (no pull).
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(DockerError::engine("inspect image", image, e)),
        }
    }

    /// Makes sure the engine has `image`, pulling it when the engine answers
    /// 404, and handing each progress line of the pull to `progress`.
    pub async fn ensure_image(
        &self,
        image: &str,
        mut progress: impl FnMut(&str),
    ) -> Result<ImageOutcome, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(ImageOutcome::Present),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(DockerError::engine("inspect image", image, e)),
        }
        let (from_image, tag) = split_reference(image);
        let mut options = CreateImageOptionsBuilder::default().from_image(from_image);
        if let Some(tag) = tag {
            options = options.tag(tag);
        }
        let mut pull = self.docker.create_image(Some(options.build()), None, None);
        while let Some(item) = pull.next().await {
            match item {
                Ok(info) => {
                    let line = match (info.id.as_deref(), info.status.as_deref()) {
                        (Some(id), Some(status)) if !id.is_empty() => format!("{id}: {status}"),
                        (_, Some(status)) => status.to_string(),
                        _ => continue,
                    };
                    progress(&line);
                }
                Err(e) => {
                    let message = match e {
                        bollard::errors::Error::DockerStreamError { error } => error,
                        bollard::errors::Error::DockerResponseServerError { message, .. } => {
                            message
                        }
                        other => other.to_string(),
                    };
                    return Err(DockerError::Pull {
                        image: image.to_string(),
                        message,
                    });
                }
            }
        }
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(ImageOutcome::Pulled),
            Err(e) => Err(DockerError::Pull {
                image: image.to_string(),
                message: format!("the pull ended but the image is still missing: {e}"),
            }),
        }
    }
}

/// The create call's body for `spec`.
fn create_body(spec: &SandboxSpec) -> Result<ContainerCreateBody, DockerError> {
    let devices = spec
        .devices
        .iter()
        .map(|d| {
            parse_device(d).map_err(|message| DockerError::InvalidSpec {
                container: spec.name.clone(),
                message,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let host_config = HostConfig {
        binds: Some(spec.binds.iter().map(|b| b.to_engine()).collect()),
        tmpfs: Some(
            spec.tmpfs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        cap_drop: Some(spec.cap_drop.clone()),
        cap_add: Some(spec.cap_add.clone()),
        security_opt: Some(spec.security_opt.clone()),
        // 0: no limit (a host without the pids controller).
        pids_limit: (spec.pids_limit > 0).then_some(spec.pids_limit),
        // 0: no limit (terminal.container_cpu, container_memory: 0).
        nano_cpus: (spec.nano_cpus > 0).then_some(spec.nano_cpus),
        memory: (spec.memory_bytes > 0).then_some(spec.memory_bytes),
        shm_size: Some(spec.shm_size_bytes),
        cpuset_cpus: spec.cpuset_cpus.clone(),
        runtime: spec.runtime.clone(),
        device_requests: (!spec.gpus.is_empty()).then(|| {
            spec.gpus
                .iter()
                .map(|g| DeviceRequest {
                    driver: g.driver.clone(),
                    count: g.count,
                    device_ids: (!g.device_ids.is_empty()).then(|| g.device_ids.clone()),
                    capabilities: Some(vec![g.capabilities.clone()]),
                    options: None,
                })
                .collect()
        }),
        init: Some(spec.init),
        network_mode: if spec.network {
            spec.network_name.clone()
        } else {
            Some("none".to_string())
        },
        devices: Some(devices),
        extra_hosts: Some(spec.add_hosts.clone()),
        dns: (!spec.dns.is_empty()).then(|| spec.dns.clone()),
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|(name, soft, hard)| ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(*soft),
                    hard: Some(*hard),
                })
                .collect(),
        ),
        ..Default::default()
    };
    Ok(ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(spec.cmd.clone()),
        working_dir: Some(spec.working_dir.clone()),
        user: spec.user.clone(),
        env: Some(
            spec.env
                .iter()
                .chain(&spec.egress_tokens)
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
        labels: Some(
            spec.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        ),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// Parses `host[:container[:perms]]` the way the Docker CLI does: the
/// container path defaults to the host path, the permissions to `rwm`; a
/// second field that reads as permissions (`/dev/fuse:rw`) is permissions.
pub fn parse_device(text: &str) -> Result<DeviceMapping, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let (host, container, perms) = match parts.as_slice() {
        [host] => (*host, *host, "rwm"),
        [host, second] if valid_device_mode(second) => (*host, *host, *second),
        [host, container] => (*host, *container, "rwm"),
        [host, container, perms] => (*host, *container, *perms),
        _ => return Err(format!("device `{text}` must be host[:container[:perms]]")),
    };
    if host.is_empty() || container.is_empty() {
        return Err(format!("device `{text}` must be host[:container[:perms]]"));
    }
    if !valid_device_mode(perms) {
        return Err(format!(
            "device `{text}`: permissions `{perms}` must be made of r, w and m"
        ));
    }
    if !container.starts_with('/') {
        return Err(format!(
            "device `{text}`: the container path `{container}` must be absolute"
        ));
    }
    Ok(DeviceMapping {
        path_on_host: Some(host.to_string()),
        path_in_container: Some(container.to_string()),
        cgroup_permissions: Some(perms.to_string()),
    })
}

fn valid_device_mode(mode: &str) -> bool {
    !mode.is_empty()
        && mode.len() <= 3
        && mode.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        && ['r', 'w', 'm']
            .iter()
            .all(|c| mode.chars().filter(|m| m == c).count() <= 1)
}

/// Splits an image reference into `fromImage` and `tag` for the pull. A
/// reference without a tag pulls `latest` (the engine would pull every tag
/// otherwise); a digest reference is passed whole.
fn split_reference(image: &str) -> (&str, Option<&str>) {
    if image.contains('@') {
        return (image, None);
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(colon) => {
            let at = last_slash + colon;
            (&image[..at], Some(&image[at + 1..]))
        }
        None => (image, Some("latest")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use hermes_model::config::load;
    use hermes_model::sandbox::{SandboxKey, parse_extra_args};

    use super::*;

    #[test]
    fn devices_parse_like_the_docker_cli() {
        let d = parse_device("/dev/fuse").unwrap();
        assert_eq!(d.path_on_host.as_deref(), Some("/dev/fuse"));
        assert_eq!(d.path_in_container.as_deref(), Some("/dev/fuse"));
        assert_eq!(d.cgroup_permissions.as_deref(), Some("rwm"));
        let d = parse_device("/dev/sda:/dev/xvda").unwrap();
        assert_eq!(d.path_in_container.as_deref(), Some("/dev/xvda"));
        assert_eq!(d.cgroup_permissions.as_deref(), Some("rwm"));
        let d = parse_device("/dev/sda:r").unwrap();
        assert_eq!(d.path_in_container.as_deref(), Some("/dev/sda"));
        assert_eq!(d.cgroup_permissions.as_deref(), Some("r"));
        let d = parse_device("/dev/sda:/dev/xvda:rw").unwrap();
        assert_eq!(d.cgroup_permissions.as_deref(), Some("rw"));
        assert!(parse_device("/dev/sda:/dev/xvda:rx").is_err());
        assert!(parse_device("/dev/sda:/dev/xvda:rr").is_err());
        assert!(parse_device("a:b:c:d").is_err());
        assert!(parse_device("").is_err());
        assert!(parse_device("/dev/sda:xvda").is_err());
    }

    #[test]
    fn image_references_split_into_name_and_tag() {
        assert_eq!(split_reference("debian"), ("debian", Some("latest")));
        assert_eq!(split_reference("debian:12"), ("debian", Some("12")));
        assert_eq!(
            split_reference("localhost:5000/team/img"),
            ("localhost:5000/team/img", Some("latest"))
        );
        assert_eq!(
            split_reference("localhost:5000/team/img:v1"),
            ("localhost:5000/team/img", Some("v1"))
        );
        assert_eq!(
            split_reference("debian@sha256:abcd"),
            ("debian@sha256:abcd", None)
        );
    }

    #[test]
    fn the_whole_spec_goes_into_the_create_body() {
        let config = load(
            "terminal:\n  docker_network: false\n  docker_env: {SECRET: s3cr3t}\n  \
             docker_extra_args: [--device=/dev/fuse, --add-host=db:10.0.0.5, \
             --ulimit=nofile=1024:2048, --cap-add=SYS_PTRACE]\n",
        )
        .unwrap()
        .config;
        let extra = parse_extra_args(&config.terminal.docker_extra_args).unwrap();
        let spec = SandboxSpec::new(
            &config,
            SandboxKey::persistent("p", "t"),
            Path::new("/h"),
            &extra,
        );
        let body = create_body(&spec).unwrap();
        assert_eq!(body.image.as_deref(), Some(spec.image.as_str()));
        assert_eq!(
            body.cmd.as_deref(),
            Some(&["sleep".to_string(), "infinity".to_string()][..])
        );
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(
            body.env.as_deref(),
            Some(&["SECRET=s3cr3t".to_string()][..])
        );
        assert_eq!(body.entrypoint, None);
        assert_eq!(body.labels.as_ref().unwrap()["hermes-agent"], "1");
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.init, Some(true));
        assert_eq!(host.cap_drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(host.cap_add.unwrap().contains(&"SYS_PTRACE".to_string()));
        assert_eq!(host.pids_limit, Some(256));
        assert_eq!(host.memory, Some(spec.memory_bytes));
        assert_eq!(host.nano_cpus, Some(spec.nano_cpus));
        assert_eq!(host.shm_size, Some(spec.shm_size_bytes));
        assert_eq!(host.tmpfs.unwrap()["/tmp"], "rw,nosuid,size=512m");
        // /workspace, /root and the runner's directory.
        assert_eq!(host.binds.unwrap().len(), 3);
        assert_eq!(body.labels.as_ref().unwrap()["hermes-runner"], "1");
        assert_eq!(
            host.extra_hosts.as_deref(),
            Some(&["db:10.0.0.5".to_string()][..])
        );
        let ulimit = &host.ulimits.unwrap()[0];
        assert_eq!(
            (ulimit.name.as_deref(), ulimit.soft, ulimit.hard),
            (Some("nofile"), Some(1024), Some(2048))
        );
        let device = &host.devices.unwrap()[0];
        assert_eq!(device.path_on_host.as_deref(), Some("/dev/fuse"));
    }

    #[test]
    fn the_flags_of_docker_extra_args_and_no_limits_reach_the_create_body() {
        let config = load(
            "terminal:\n  container_cpu: 0\n  container_memory: 0\n  \
             docker_extra_args: [--gpus, all, --user=1000:1000, --cpuset-cpus=0-1, \
             --runtime=runsc, -v, \"/srv/data:/data:ro\", --network, ml, --dns=1.1.1.1, \
             --security-opt, apparmor=docker-default, --label, team=ml, --shm-size=2g]\n",
        )
        .unwrap()
        .config;
        assert!(
            config.sandbox_errors.is_empty(),
            "{:?}",
            config.sandbox_errors
        );
        let extra = parse_extra_args(&config.terminal.docker_extra_args).unwrap();
        let spec = SandboxSpec::new(
            &config,
            SandboxKey::persistent("p", "t"),
            Path::new("/h"),
            &extra,
        );
        let body = create_body(&spec).unwrap();
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(body.labels.as_ref().unwrap()["team"], "ml");
        let host = body.host_config.unwrap();
        // 0: no --cpus, no --memory.
        assert_eq!((host.nano_cpus, host.memory), (None, None));
        assert_eq!(host.cpuset_cpus.as_deref(), Some("0-1"));
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
        assert_eq!(host.network_mode.as_deref(), Some("ml"));
        assert_eq!(host.dns.as_deref(), Some(&["1.1.1.1".to_string()][..]));
        assert_eq!(host.shm_size, Some(2 << 30));
        assert_eq!(
            host.security_opt.as_deref(),
            Some(
                &[
                    "no-new-privileges".to_string(),
                    "apparmor=docker-default".to_string()
                ][..]
            )
        );
        assert!(
            host.binds
                .unwrap()
                .contains(&"/srv/data:/data:ro".to_string())
        );
        let gpu = &host.device_requests.unwrap()[0];
        assert_eq!(gpu.count, Some(-1));
        assert_eq!(gpu.capabilities, Some(vec![vec!["gpu".to_string()]]));
    }

    #[test]
    fn a_bad_device_names_the_container() {
        let config = load("").unwrap().config;
        let mut spec = SandboxSpec::new(
            &config,
            SandboxKey::persistent("p", "t"),
            Path::new("/h"),
            &Default::default(),
        );
        spec.devices = vec!["/dev/x:/y:bad".to_string()];
        let e = create_body(&spec).unwrap_err();
        assert!(e.to_string().contains("hermes-p-t"), "{e}");
    }
}
