//! A sandbox filling the host's disk through its `/workspace` and `/root`
//! bind mounts (issue 14, finding 3): `terminal.container_disk` is a hard
//! limit on Docker, and the files stay across a recreate and a remount.
//! See the crate doc in `main.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, docker};

const LIMIT_MB: u64 = 64;

fn mounted(dir: &Path) -> bool {
    let d = std::fs::metadata(dir).unwrap();
    let p = std::fs::metadata(dir.parent().unwrap()).unwrap();
    d.dev() != p.dev()
}

#[test]
fn a_sandbox_cannot_write_past_container_disk_and_keeps_its_files() {
    let profile = format!("atk-disk-{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_disk: {LIMIT_MB}\n",
        hermes_tests::test_image()
    ));
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let sh = |script: &str| hermes(&["exec", "--", "sh", "-c", script]);
    let container = format!("hermes-{profile}-default");

    // The plan says what the create costs the host besides the container.
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert!(
        dry.stdout.contains(&format!(
            "no container with these labels; its data on a sparse {LIMIT_MB} MB ext4 image (.default.disk), loop-mounted while it exists"
        )),
        "{}",
        dry.stdout
    );

    let keep = sh("echo kept-w > /workspace/keep && echo kept-r > /root/keep");
    assert_eq!(keep.code, 0, "{keep:?}");
    let data = home.path().join("sandboxes/docker/default");
    let image = data.parent().unwrap().join(".default.disk");

    // Past the limit: ENOSPC, in /workspace and in /root alike.
    for dir in ["/workspace", "/root"] {
        let fill = sh(&format!(
            "dd if=/dev/zero of={dir}/big bs=1M count={} 2>&1; s=$?; rm -f {dir}/big; exit $s",
            LIMIT_MB + 36
        ));
        assert_ne!(fill.code, 0, "{dir}: {fill:?}");
        assert!(
            fill.stdout.contains("No space left on device"),
            "{dir}: {fill:?}"
        );
    }
    // What the host gave the sandbox: its image, no more than the limit.
    assert!(
        mounted(&data),
        "the data directory is the image's mount point"
    );
    let used = std::fs::metadata(&image).unwrap().blocks() * 512;
    assert!(
        used <= LIMIT_MB << 20,
        "the image takes {used} bytes of the host"
    );

    // A change that recreates the container keeps the files, and the limit.
    let before = docker(&["inspect", "-f", "{{.Id}}", &container]);
    assert_eq!(
        hermes(&["config", "set", "terminal.container_memory", "1024"]).code,
        0
    );
    let pass = hermes(&["reconcile"]);
    assert_eq!(pass.code, 0, "{pass:?}");
    let after = docker(&["inspect", "-f", "{{.Id}}", &container]);
    assert_ne!(before, after, "recreated");
    let read = sh("cat /workspace/keep /root/keep");
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept-w\nkept-r\n"));

    // As after a reboot: the container stopped, the image unmounted. The
    // next exec mounts it again before the container starts.
    docker(&["stop", "-t", "1", &container]);
    let out = std::process::Command::new("umount")
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!mounted(&data));
    let read = sh(
        "cat /workspace/keep /root/keep; dd if=/dev/zero of=/workspace/big bs=1M count=100 2>/dev/null",
    );
    assert_ne!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout, "kept-w\nkept-r\n", "{read:?}");
    assert!(mounted(&data));
}

/// The loop devices attached to `image` (a file deleted since included),
/// as the kernel lists them.
fn loop_devices_of(image: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim_end();
        let file = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        if Path::new(file) == image {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// The loop devices still on `image` once the kernel had its chance to
/// free them: a device mounted with autoclear is detached after its last
/// unmount, asynchronously, so a check right after the unmount can still
/// see it. Waits (10 s at most) for none; returns what is left.
fn loop_devices_freed(image: &Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = loop_devices_of(image);
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Whether the host's mount table has a mount on `dir`.
fn mount_on(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|point| Path::new(point) == dir)
}

#[test]
fn a_disk_image_is_released_once_its_sandbox_is_gone_and_its_files_come_back() {
    let profile = format!("atk-rel-{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_disk: {LIMIT_MB}\n",
        hermes_tests::test_image()
    ));
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dir = std::fs::canonicalize(home.path())
        .unwrap()
        .join("sandboxes/docker");
    let (kept, gone) = (dir.join("kept"), dir.join("gone"));
    let gone_image = dir.join(".gone.disk");
    for task in ["kept", "gone"] {
        let made = hermes(&[
            "exec",
            "--task",
            task,
            "--",
            "sh",
            "-c",
            &format!("echo {task} > /workspace/file"),
        ]);
        assert_eq!(made.code, 0, "{made:?}");
    }
    assert!(mount_on(&kept) && mount_on(&gone));
    assert_eq!(loop_devices_of(&gone_image).len(), 1);

    // Removed by hand, and the other one stopped: only the first is
    // released, as the dry run says, and its image file stays.
    docker(&["rm", "-f", &format!("hermes-{profile}-gone")]);
    docker(&["stop", "-t", "1", &format!("hermes-{profile}-kept")]);
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let row = dry
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("- sandbox {profile}/gone ")))
        .unwrap_or_else(|| panic!("no release in the plan:\n{}", dry.stdout));
    assert!(
        row.contains("release-disk")
            && row.contains(&gone_image.display().to_string())
            && row.contains("the image and its files are kept"),
        "{row}"
    );
    assert!(
        !dry.stdout.contains(&format!("{profile}/kept")),
        "{}",
        dry.stdout
    );
    let pass = hermes(&["reconcile"]);
    assert_eq!(pass.code, 0, "{pass:?}");
    assert!(
        pass.done().contains(&(
            format!("sandbox {profile}/gone"),
            "release-disk".to_string()
        )),
        "{pass:?}"
    );
    assert!(!mount_on(&gone), "still mounted");
    assert_eq!(loop_devices_freed(&gone_image), Vec::<String>::new());
    assert!(gone_image.is_file(), "the image file is kept");
    assert!(mount_on(&kept), "a stopped sandbox's image stays mounted");
    let again = hermes(&["reconcile", "--dry-run"]);
    assert!(!again.stdout.contains("release-disk"), "{again:?}");

    // Its next exec mounts the image again: the file is there.
    let read = hermes(&["exec", "--task", "gone", "--", "cat", "/workspace/file"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "gone\n"), "{read:?}");
    assert!(mount_on(&gone));
}

#[test]
fn a_disk_image_whose_file_was_deleted_is_released_and_a_removal_releases_its_own() {
    let profile = format!("atk-del-{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_disk: {LIMIT_MB}\n",
        hermes_tests::test_image()
    ));
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dir = std::fs::canonicalize(home.path())
        .unwrap()
        .join("sandboxes/docker");
    for task in ["deleted", "pruned"] {
        let made = hermes(&["exec", "--task", task, "--", "true"]);
        assert_eq!(made.code, 0, "{made:?}");
    }
    // As a home removed by hand leaves it: the container gone, the image
    // file deleted, the mount (and its loop device) still there.
    docker(&["rm", "-f", &format!("hermes-{profile}-deleted")]);
    let deleted_image = dir.join(".deleted.disk");
    std::fs::remove_file(&deleted_image).unwrap();
    assert_eq!(loop_devices_of(&deleted_image).len(), 1);
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert!(
        dry.stdout
            .lines()
            .any(|l| l.starts_with(&format!("- sandbox {profile}/deleted "))
                && l.contains("release-disk")
                && l.contains("was deleted")
                && l.contains("what it holds is lost with it")),
        "{dry:?}"
    );

    // The other one no longer desired (sandboxes not kept), and pruned:
    // its removal releases its image in the same operation.
    assert_eq!(
        hermes(&["config", "set", "terminal.container_persistent", "false"]).code,
        0
    );
    let dry = hermes(&["reconcile", "--dry-run", "--prune"]);
    let row = dry
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("- sandbox {profile}/pruned ")))
        .unwrap_or_else(|| panic!("no removal in the plan:\n{}", dry.stdout));
    assert!(
        row.contains("   remove   ") && row.contains("then its disk image"),
        "{row}"
    );
    let pass = hermes(&["reconcile", "--prune"]);
    assert_eq!(pass.code, 0, "{pass:?}");
    let pruned = dir.join("pruned");
    for (point, image) in [
        (dir.join("deleted"), deleted_image),
        (pruned.clone(), dir.join(".pruned.disk")),
    ] {
        assert!(!mount_on(&point), "{} still mounted", point.display());
        assert_eq!(loop_devices_freed(&image), Vec::<String>::new());
    }
    assert!(dir.join(".pruned.disk").is_file(), "the image file is kept");
    // Nothing holds the directories any more: they can go.
    std::fs::remove_dir_all(&dir).unwrap();
}
