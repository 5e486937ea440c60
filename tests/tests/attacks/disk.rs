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
