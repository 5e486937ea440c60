//! `terminal.container_disk` on Docker: a hard limit on what a persistent
//! sandbox can write to the host.
//!
//! The sandbox's `/workspace` and `/root` are bind mounts of
//! `<data>/workspace` and `<data>/home` (`<data>` is
//! `<sandbox_dir>/docker/<task>`, Hermes Agent's layout). For a sandbox made after this
//! existed, `<data>` is the mount point of a filesystem image of its own:
//! a sparse file of `container_disk` MB beside it, `.<task>.disk` (a task
//! name never starts with a dot, so it is never another task's
//! directory), made with `mkfs.ext4` and mounted by hermes
//! (`mount -o loop,nosuid,nodev`) when it makes or starts the container.
//! Writing past the size is `ENOSPC` inside; the host loses no more than
//! the image. The files stay in the image across a recreate and a reboot:
//! the image is mounted again before the container starts.
//!
//! Where no image can be made (hermes is not root, `mkfs.ext4` or the loop
//! devices are missing) the sandbox gets plain directories, with a warning
//! once per process; [`status`] says why. A sandbox whose plain data
//! directory already holds files keeps it (warned): nothing is moved.
//! Session sandboxes keep their files on tmpfs and have no image.
//! The engine's `--storage-opt size=` limits only the container's own
//! layer, and only on some storage drivers; the sandbox's data is in the
//! bind mounts, so this module is what limits it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use hermes_backends::docker::DockerError;
use hermes_backends::host_dir::{HostDirError, make_below};
use hermes_model::sandbox::SandboxSpec;

/// Whether this process warned already that the limit is not enforced.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The image of a sandbox whose data directory is `data`.
pub fn image_of(data: &Path) -> Option<PathBuf> {
    let name = data.file_name()?.to_str()?;
    Some(data.parent()?.join(format!(".{name}.disk")))
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(d), Some(Ok(p))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    d.is_dir() && d.dev() != p.dev()
}

/// Why no image can be made on this host, if so.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("hermes does not run as root (loop mounts need it)".to_string());
    }
    if find_program("mkfs.ext4").is_none() {
        return Some("mkfs.ext4 is not installed (e2fsprogs)".to_string());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("the host has no loop devices (/dev/loop-control)".to_string());
    }
    None
}

/// One line for `status` and `config check`: how `container_disk` is
/// enforced on Docker, or why it is not.
pub fn status() -> String {
    match unavailable() {
        None => "enforced (a filesystem image per persistent sandbox)".to_string(),
        Some(why) => format!("not enforced: {why}"),
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn warn_once(message: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::notices::warning(format_args!(
            "terminal.container_disk is not enforced: {message}"
        ));
    }
}

fn failed(spec: &SandboxSpec, path: &Path, message: String) -> DockerError {
    DockerError::HostDir {
        container: spec.name.clone(),
        path: path.to_path_buf(),
        source: HostDirError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(message),
        },
    }
}

/// Before a persistent sandbox's container is made: its data directory
/// on its own image, made (of `spec.disk_mb`) or mounted again, or kept
/// plain as described in the module doc.
pub async fn prepare(spec: &SandboxSpec) -> Result<(), DockerError> {
    if spec.disk_mb == 0 {
        return Ok(());
    }
    let Some(data) = spec.data_dir() else {
        return Ok(());
    };
    let Some(image) = image_of(&data) else {
        return Ok(());
    };
    if is_mount_point(&data) {
        return Ok(());
    }
    // One process at a time per profile: two execs racing to make one
    // sandbox must not both make, mount or remove its image.
    let parent = data.parent().unwrap_or(&data);
    let dir = make_below(spec.base_of(parent), parent).map_err(|source| DockerError::HostDir {
        container: spec.name.clone(),
        path: parent.to_path_buf(),
        source,
    })?;
    let _lock = lock(dir).map_err(|e| failed(spec, parent, format!("cannot lock: {e}")))?;
    if is_mount_point(&data) {
        return Ok(());
    }
    if image.exists() {
        make_below(spec.base_of(&data), &data).map_err(|source| DockerError::HostDir {
            container: spec.name.clone(),
            path: data.clone(),
            source,
        })?;
        return mount(spec, &image, &data).await;
    }
    let has_files = std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some());
    if has_files {
        warn_once(&format!(
            "{} was made before it was, and keeps its plain directory",
            spec.name
        ));
        return Ok(());
    }
    if let Some(why) = unavailable() {
        warn_once(&why);
        return Ok(());
    }
    make_below(spec.base_of(&data), &data).map_err(|source| DockerError::HostDir {
        container: spec.name.clone(),
        path: data.clone(),
        source,
    })?;
    let made = make_image(&image, spec.disk_mb).await;
    let made = match made {
        Ok(()) => mount(spec, &image, &data).await,
        Err(e) => Err(failed(spec, &image, e)),
    };
    if let Err(e) = made {
        // The image is new, made under the lock and never mounted: it holds
        // nothing. Without it, plain directories.
        let _ = std::fs::remove_file(&image);
        warn_once(&e.to_string());
    }
    Ok(())
}

/// Before a container starts: the image of its data directory mounted
/// again when it is not (after a reboot, say). The data directory comes
/// from the container's `/workspace` bind.
pub async fn remount(
    engine: &hermes_backends::docker::Engine,
    id: &str,
) -> Result<(), DockerError> {
    let Ok(inspect) = engine.docker().inspect_container(id, None).await else {
        return Ok(());
    };
    let mounts = inspect.mounts.unwrap_or_default();
    let Some(source) = mounts
        .iter()
        .find(|m| m.destination.as_deref() == Some("/workspace"))
        .and_then(|m| m.source.clone())
    else {
        return Ok(());
    };
    let Some(data) = Path::new(&source).parent().map(Path::to_path_buf) else {
        return Ok(());
    };
    let Some(image) = image_of(&data) else {
        return Ok(());
    };
    let plain_dir = std::fs::symlink_metadata(&data).is_ok_and(|m| m.is_dir());
    if !image.is_file() || !plain_dir || is_mount_point(&data) {
        return Ok(());
    }
    let parent = data.parent().unwrap_or(&data);
    let locked = std::fs::File::open(parent)
        .map_err(|e| e.to_string())
        .and_then(|f| lock(f.into()));
    let _lock = match locked {
        Ok(lock) => lock,
        Err(e) => {
            return Err(DockerError::HostDir {
                container: id.to_string(),
                path: data.clone(),
                source: HostDirError::Io {
                    path: data.clone(),
                    source: std::io::Error::other(format!("cannot lock: {e}")),
                },
            });
        }
    };
    if is_mount_point(&data) {
        return Ok(());
    }
    mount_image(&image, &data)
        .await
        .map_err(|message| DockerError::HostDir {
            container: id.to_string(),
            path: data.clone(),
            source: HostDirError::Io {
                path: data.clone(),
                source: std::io::Error::other(message),
            },
        })
}

/// An exclusive lock on a directory (held until dropped).
fn lock(dir: std::os::fd::OwnedFd) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    nix::fcntl::Flock::lock(
        std::fs::File::from(dir),
        nix::fcntl::FlockArg::LockExclusive,
    )
    .map_err(|(_, e)| e.to_string())
}

/// A sparse file of `mb` MB, 0600, made anew, with an ext4 filesystem
/// (the journal is not zeroed: the sparse file reads as zeros already).
async fn make_image(image: &Path, mb: u64) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(image)
        .map_err(|e| format!("cannot make {}: {e}", image.display()))?;
    file.set_len(mb.saturating_mul(1 << 20))
        .map_err(|e| format!("cannot size {}: {e}", image.display()))?;
    drop(file);
    let mkfs = find_program("mkfs.ext4").ok_or("mkfs.ext4 is not installed")?;
    let out = tokio::process::Command::new(mkfs)
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
        ])
        .arg(image)
        .output()
        .await
        .map_err(|e| format!("cannot run mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mkfs.ext4 {} failed: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

async fn mount(spec: &SandboxSpec, image: &Path, data: &Path) -> Result<(), DockerError> {
    mount_image(image, data)
        .await
        .map_err(|message| failed(spec, data, message))
}

/// `mount -o loop,nosuid,nodev,noatime IMAGE DATA`, and the filesystem's
/// root made 0700 like every sandbox directory.
async fn mount_image(image: &Path, data: &Path) -> Result<(), String> {
    let out = tokio::process::Command::new("mount")
        .args(["-o", "loop,nosuid,nodev,noatime"])
        .arg(image)
        .arg(data)
        .output()
        .await
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cannot mount the sandbox's disk {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot set the mode of {}: {e}", data.display()))
}

/// The disk images mounted below `<sandbox_dir>/docker` (this home's
/// persistent sandboxes of `profile`), from the host's mount table, with
/// the containers (by id, from `sources`: each container's bind sources)
/// that bind something from inside each.
pub fn observe(
    sandbox_dir: &Path,
    profile: &str,
    sources: &std::collections::HashMap<String, Vec<String>>,
) -> Vec<hermes_model::observed::MountedDisk> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let below = sandbox_dir.join("docker");
    let mut disks: Vec<hermes_model::observed::MountedDisk> = Vec::new();
    for line in table.lines() {
        // `id parent major:minor root mount-point options … - fstype source …`
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype), Some(source)) =
            (fields.get(4), fields.get(dash + 1), fields.get(dash + 2))
        else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if *fstype != "ext4" || !source.starts_with("/dev/loop") || point.parent() != Some(&below)
        {
            continue;
        }
        let Some(image) = image_of(&point) else {
            continue;
        };
        let Some(task) = point.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let deleted = std::fs::read_to_string(format!(
            "/sys/block/{}/loop/backing_file",
            source.trim_start_matches("/dev/")
        ))
        .is_ok_and(|f| f.trim_end().ends_with("(deleted)"));
        match disks.iter_mut().find(|d| d.mount_point == point) {
            Some(d) => d.devices.push((*source).to_string()),
            None => {
                let users = sources
                    .iter()
                    .filter(|(_, binds)| binds.iter().any(|b| Path::new(b).starts_with(&point)))
                    .map(|(id, _)| id.clone())
                    .collect();
                disks.push(hermes_model::observed::MountedDisk {
                    profile: hermes_model::sandbox::sanitize(profile),
                    task: task.to_string(),
                    mount_point: point.clone(),
                    image,
                    devices: vec![(*source).to_string()],
                    deleted,
                    users,
                });
            }
        }
    }
    disks
}

/// A mount table path: `\040` and its kin back to their bytes.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(char::from(b)),
                Err(_) => {
                    out.push(c);
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Releases a disk image: unmounts every mount of it from its data
/// directory (a loop mount frees its device as it goes). The image file
/// stays.
pub async fn release(disk: &hermes_model::observed::MountedDisk) -> Result<(), DockerError> {
    for _ in &disk.devices {
        if !is_mount_point(&disk.mount_point) {
            break;
        }
        let out = tokio::process::Command::new("umount")
            .arg(&disk.mount_point)
            .output()
            .await;
        let failed_with = match out {
            Ok(out) if out.status.success() => continue,
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) => format!("cannot run umount: {e}"),
        };
        return Err(DockerError::HostFiles {
            container: format!("{}/{}", disk.profile, disk.task),
            message: format!(
                "cannot unmount its disk image from {}: {failed_with}",
                disk.mount_point.display()
            ),
        });
    }
    // A device the mount did not free (mounted without autoclear).
    for device in &disk.devices {
        let _ = tokio::process::Command::new("losetup")
            .arg("-d")
            .arg(device)
            .output()
            .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_sits_beside_the_data_under_a_name_no_task_has() {
        assert_eq!(
            image_of(Path::new("/h/sandboxes/docker/p/t-1")),
            Some(PathBuf::from("/h/sandboxes/docker/p/.t-1.disk"))
        );
    }
}
