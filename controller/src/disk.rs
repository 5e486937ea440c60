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
//!
//! An image stays mounted while a container of its sandbox exists. A pass
//! sees the images mounted under this home ([`observe`]: the host's mount
//! table, each loop device's backing file, and the containers that bind
//! something inside it), and the plan releases one whose containers are
//! gone ([`release`]: unmounted, its loop device freed, the file kept),
//! under the lock [`prepare`] and [`remount`] take: a container made
//! meanwhile finds its image mounted again before it starts.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use hermes_backends::docker::{DockerError, Engine};
use hermes_backends::host_dir::{HostDirError, make_below};
use hermes_model::observed::MountedDisk;
use hermes_model::sandbox::SandboxSpec;

/// Whether this process warned already that the limit is not enforced.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The image of a sandbox whose data directory is `data`.
pub fn image_of(data: &Path) -> Option<PathBuf> {
    let name = data.file_name()?.to_str()?;
    Some(data.parent()?.join(format!(".{name}.disk")))
}

/// Whether `dir` is a mount point (its device differs from its parent's).
pub(crate) fn is_mount_point(dir: &Path) -> bool {
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

/// Why a disk image could not be released.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The data directory's parent could not be locked.
    #[error("cannot lock {}: {reason}", path.display())]
    Lock { path: PathBuf, reason: String },
    /// A container uses the image again (made since the plan).
    #[error(
        "container {container} uses {} now; nothing done, the next pass plans again",
        mount_point.display()
    )]
    InUse {
        mount_point: PathBuf,
        container: String,
    },
    /// `umount` or `losetup` failed, or could not run.
    #[error("cannot {what}: {message}")]
    Command { what: String, message: String },
    /// The engine could not say which containers use the image.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

/// The most mounts stacked on one data directory that a release takes off.
const MAX_STACKED: usize = 16;

/// The images mounted for this home's persistent sandboxes of `profile`:
/// every loop mount whose mount point is a data directory
/// (`<sandbox_dir>/docker/<task>`) and whose loop device is backed by
/// that directory's image (a file deleted since included), with the
/// containers (any, labelled or not) that bind something inside it.
/// Nothing when the mount table cannot be read or the engine cannot list
/// its containers: a pass in doubt releases nothing.
pub async fn observe(sandbox_dir: &Path, profile: &str, engine: &Engine) -> Vec<MountedDisk> {
    let Ok(root) = std::fs::canonicalize(sandbox_dir.join("docker")) else {
        return Vec::new();
    };
    let Some(table) = mount_table() else {
        return Vec::new();
    };
    let mut disks: Vec<MountedDisk> = Vec::new();
    for (point, device) in table {
        let Some(task) = task_of(&root, &point) else {
            continue;
        };
        let Some(image) = image_of(&point) else {
            continue;
        };
        let Some((backing, deleted)) = backing_file(&device) else {
            continue;
        };
        if backing != image {
            continue;
        }
        match disks.iter_mut().find(|d| d.mount_point == point) {
            Some(disk) => {
                disk.devices.push(device);
                disk.deleted |= deleted;
            }
            None => disks.push(MountedDisk {
                profile: hermes_model::sandbox::sanitize(profile),
                task,
                mount_point: point,
                image,
                devices: vec![device],
                deleted,
                users: Vec::new(),
            }),
        }
    }
    for disk in &mut disks {
        match engine.containers_using(&disk.mount_point).await {
            Ok(users) => disk.users = users,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the containers: no disk image is released");
                return Vec::new();
            }
        }
    }
    disks.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    disks
}

/// The task of a data directory `point`, right below `root`
/// (`<sandbox_dir>/docker`); `None` for any other path.
fn task_of(root: &Path, point: &Path) -> Option<String> {
    if point.parent() != Some(root) {
        return None;
    }
    point.file_name()?.to_str().map(str::to_string)
}

/// The loop mounts of this process's mount table, `(mount point, device)`,
/// in the table's order (a mount stacked on another comes after it).
fn mount_table() -> Option<Vec<(PathBuf, String)>> {
    let bytes = crate::fsio::read_bounded(std::path::Path::new("/proc/self/mountinfo"), 16 << 20)
        .ok()
        .flatten()?;
    let text = String::from_utf8_lossy(&bytes);
    Some(text.lines().filter_map(loop_mount).collect())
}

/// One line of `/proc/self/mountinfo` as `(mount point, /dev/loopN)`,
/// when its source is a loop device.
fn loop_mount(line: &str) -> Option<(PathBuf, String)> {
    let (left, right) = line.split_once(" - ")?;
    let point = left.split(' ').nth(4)?;
    let source = right.split(' ').nth(1)?;
    let n = source.strip_prefix("/dev/loop")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((PathBuf::from(unescape(point)), source.to_string()))
}

/// A mount table path with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(out)
        .to_string_lossy()
        .into_owned()
}

/// The file behind the loop device `device` (`/dev/loopN`), and whether it
/// was deleted; `None` when the device is attached to nothing.
fn backing_file(device: &str) -> Option<(PathBuf, bool)> {
    let name = device.strip_prefix("/dev/")?;
    let path = format!("/sys/block/{name}/loop/backing_file");
    let bytes = crate::fsio::read_bounded(std::path::Path::new(&path), 8192)
        .ok()
        .flatten()?;
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim_end_matches('\n');
    Some(match text.strip_suffix(" (deleted)") {
        Some(file) => (PathBuf::from(file), true),
        None => (PathBuf::from(text), false),
    })
}

/// Releases `disk`: under the lock of its data directory's parent, and
/// only while no container uses it, unmounts each image mount on the data
/// directory, then detaches its loop devices that are still attached to
/// the image and mounted nowhere. The image file is left as it is.
pub async fn release(engine: &Engine, disk: &MountedDisk) -> Result<(), DiskError> {
    let parent = disk
        .mount_point
        .parent()
        .unwrap_or(&disk.mount_point)
        .to_path_buf();
    let _lock = std::fs::File::open(&parent)
        .map_err(|e| e.to_string())
        .and_then(|f| lock(f.into()))
        .map_err(|reason| DiskError::Lock {
            path: parent.clone(),
            reason,
        })?;
    if let Some(container) = engine
        .containers_using(&disk.mount_point)
        .await?
        .into_iter()
        .next()
    {
        return Err(DiskError::InUse {
            mount_point: disk.mount_point.clone(),
            container,
        });
    }
    for _ in 0..MAX_STACKED {
        let on_top = mount_table()
            .unwrap_or_default()
            .into_iter()
            .rfind(|(point, _)| *point == disk.mount_point);
        let Some((_, device)) = on_top else {
            break;
        };
        if backing_file(&device).map(|(file, _)| file) != Some(disk.image.clone()) {
            break;
        }
        run("umount", [disk.mount_point.as_os_str()]).await?;
    }
    for device in &disk.devices {
        let still = backing_file(device).is_some_and(|(file, _)| file == disk.image);
        let mounted = mount_table()
            .unwrap_or_default()
            .iter()
            .any(|(_, d)| d == device);
        if still && !mounted {
            run(
                "losetup",
                [std::ffi::OsStr::new("-d"), std::ffi::OsStr::new(device)],
            )
            .await?;
        }
    }
    Ok(())
}

/// Runs `program ARGS` to its end; its standard error is the failure.
async fn run<'a>(
    program: &str,
    args: impl IntoIterator<Item = &'a std::ffi::OsStr>,
) -> Result<(), DiskError> {
    let args: Vec<&std::ffi::OsStr> = args.into_iter().collect();
    let what = format!(
        "{program} {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = tokio::process::Command::new(program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), out)
        .await
        .map_err(|_| DiskError::Command {
            what: what.clone(),
            message: "took longer than 30 s".to_string(),
        })?
        .map_err(|e| DiskError::Command {
            what: what.clone(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(DiskError::Command {
            what,
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_mount_line_gives_its_mount_point_and_device() {
        let line = "612 29 7:3 / /h/sandboxes/docker/my\\040task rw,nosuid,nodev,noatime shared:339 - ext4 /dev/loop3 rw";
        assert_eq!(
            loop_mount(line),
            Some((
                PathBuf::from("/h/sandboxes/docker/my task"),
                "/dev/loop3".to_string()
            ))
        );
        let other = "30 29 0:26 / /sys rw,nosuid shared:2 - sysfs sysfs rw";
        assert_eq!(loop_mount(other), None);
        let mapper = "31 29 253:0 / /data rw - ext4 /dev/loop-control rw";
        assert_eq!(loop_mount(mapper), None);
    }

    #[test]
    fn only_a_data_directory_right_below_the_root_is_a_sandbox() {
        let root = Path::new("/h/sandboxes/docker");
        assert_eq!(
            task_of(root, Path::new("/h/sandboxes/docker/t")),
            Some("t".to_string())
        );
        for other in [
            "/h/sandboxes/docker",
            "/h/sandboxes/docker/t/workspace",
            "/elsewhere/t",
        ] {
            assert_eq!(task_of(root, Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn the_image_sits_beside_the_data_under_a_name_no_task_has() {
        assert_eq!(
            image_of(Path::new("/h/sandboxes/docker/p/t-1")),
            Some(PathBuf::from("/h/sandboxes/docker/p/.t-1.disk"))
        );
    }
}
