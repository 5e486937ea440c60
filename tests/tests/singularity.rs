//! The singularity backend end to end: the real `hermes` binary against a
//! real Apptainer (or SingularityCE). Where neither binary is on the PATH
//! (no registry we reach packages Apptainer) the test says that it did
//! not run, and why, and passes: the command lines are asserted exactly in
//! the unit tests of `hermes_backends::singularity::argv`.
//!
//! The image is `docker://` + `HERMES_SINGULARITY_IMAGE` when set (a
//! `docker-archive:` or SIF path works too), else `docker://debian:bookworm-slim`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::TestHome;

fn runtime() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| [dir.join("apptainer"), dir.join("singularity")])
        .find(|p| p.is_file())
}

#[test]
fn an_instance_keeps_its_files_runs_commands_and_kills_them_on_timeout() {
    let Some(bin) = runtime() else {
        eprintln!(
            "singularity end-to-end test NOT RUN: neither apptainer nor singularity is on the PATH \
             (none can be installed on this machine); the command lines are covered by the unit tests"
        );
        return;
    };
    eprintln!("running against {}", bin.display());
    let image = std::env::var("HERMES_SINGULARITY_IMAGE")
        .unwrap_or_else(|_| "docker://debian:bookworm-slim".to_string());
    let home = TestHome::new();
    home.write_config(format!(
        "terminal:\n  backend: singularity\n  singularity_image: {image}\n  container_memory: 512\n"
    ));
    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout
            .contains("+ singularity default/default   start"),
        "{}",
        plan.stdout
    );
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let converged = home.run(["reconcile", "--dry-run"]);
    assert_eq!(converged.code, 0, "{converged:?}");

    let write = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "echo kept > /workspace/marker; echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(write.code, 3, "{write:?}");
    assert_eq!(write.stdout, "out\n");
    assert!(write.stderr.contains("err\n"), "{}", write.stderr);

    // A value passed with --env reaches the command, and not the host's own.
    let env = home
        .command([
            "exec",
            "--env",
            "GREETING=hello",
            "--",
            "sh",
            "-c",
            "echo $GREETING ${HOST_ONLY:-unset}",
        ])
        .env("HOST_ONLY", "leaked")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&env.stdout), "hello unset\n");

    // A restart (a new memory limit) keeps the overlay's files.
    home.write_config(format!(
        "terminal:\n  backend: singularity\n  singularity_image: {image}\n  container_memory: 768\n"
    ));
    let restart = home.run(["reconcile"]);
    assert_eq!(restart.code, 0, "{restart:?}");
    assert!(restart.stdout.contains("restart"), "{}", restart.stdout);
    let read = home.run(["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!(read.stdout, "kept\n", "{read:?}");

    let started = std::time::Instant::now();
    let timeout = home.run([
        "exec",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        "sleep 60 & sleep 60",
    ]);
    assert_eq!(timeout.code, 124, "{timeout:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let left = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
    ]);
    assert_eq!(left.stdout.trim(), "0", "{left:?}");

    let list = home.run(["sandbox", "list"]);
    assert!(list.stdout.contains("hermes-default-default"), "{list:?}");
    let stop = std::process::Command::new(&bin)
        .args(["instance", "stop", "hermes-default-default"])
        .status()
        .unwrap();
    assert!(stop.success());
}
