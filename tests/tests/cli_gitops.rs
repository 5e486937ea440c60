//! The GitOps pre-merge check (`examples/gitops/check-plan`) run as it is,
//! against a real home converged on the Docker backend: the candidate is
//! planned against the host's real sandbox, and nothing is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use hermes_tests::cli::{Run, TestHome, hermes_bin};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// The example script, from the repository.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/gitops/check-plan")
        .canonicalize()
        .unwrap()
}

/// Runs `check-plan HOST` in `checkout` with this test's `hermes` first on
/// the PATH and the home given by `HERMES_HOME`, as on the host.
fn check_plan(checkout: &Path, home: &TestHome, profile: &str, host: &str) -> Run {
    let bin_dir = hermes_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(script())
        .arg(host)
        .current_dir(checkout)
        .env("PATH", path)
        .env("HERMES_HOME", home.path())
        .env("HERMES_PROFILE", profile)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
        .into()
}

/// Every file below `dir` with its contents, to show nothing was written.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            } else {
                out.push((path, Vec::new()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn check_plan_says_no_change_plans_a_change_and_fails_a_broken_candidate() {
    let profile = format!("gitops{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let config = format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n",
        hermes_tests::test_image()
    );
    home.write_config(&config);
    let converge = home.run(["--profile", &profile, "reconcile"]);
    assert_eq!(converge.code, 0, "{converge:?}");
    let container = format!("hermes-{profile}-default");
    let id = docker(&["inspect", "-f", "{{.Id}}", &container]);

    // The checkout: the candidate is the same file as the host's.
    let checkout = tempfile::tempdir().unwrap();
    let hosts = checkout.path().join("hosts/build-01");
    std::fs::create_dir_all(&hosts).unwrap();
    let candidate = hosts.join("config.yaml");
    std::fs::write(&candidate, &config).unwrap();
    let before = snapshot(home.path());

    let same = check_plan(checkout.path(), &home, &profile, "build-01");
    assert_eq!(same.code, 0, "{same:?}");
    assert!(same.stdout.contains("No changes"), "{same:?}");
    assert!(same.stderr.contains("no change on build-01"), "{same:?}");

    // A real change: the plan, exit 2.
    std::fs::write(&candidate, format!("{config}  container_memory: 1024\n")).unwrap();
    let changed = check_plan(checkout.path(), &home, &profile, "build-01");
    assert_eq!(changed.code, 2, "{changed:?}");
    assert!(
        changed
            .stdout
            .contains(&format!("~ sandbox {profile}/default")),
        "{changed:?}"
    );
    assert!(changed.stdout.contains("recreate"), "{changed:?}");
    assert!(
        changed.stderr.contains("changes on build-01"),
        "{changed:?}"
    );

    // A broken candidate: the error naming file, line and key, exit 1.
    std::fs::write(&candidate, "terminal:\n  backend: dockr\n").unwrap();
    let broken = check_plan(checkout.path(), &home, &profile, "build-01");
    assert_eq!(broken.code, 1, "{broken:?}");
    assert!(
        broken
            .stderr
            .contains("hosts/build-01/config.yaml:2:12: terminal.backend: unknown value `dockr`"),
        "{broken:?}"
    );
    assert!(!broken.stdout.contains("No changes"), "{broken:?}");

    // A dry run writes nothing, and the host's sandbox is untouched.
    assert_eq!(snapshot(home.path()), before, "the home changed");
    assert_eq!(home.read_config(), config);
    assert_eq!(docker(&["inspect", "-f", "{{.Id}}", &container]), id);
    assert_eq!(
        checkout.path().read_dir().unwrap().count(),
        1,
        "temp files left"
    );
}

#[test]
fn check_plan_fails_a_usage_error_and_a_missing_candidate_with_1() {
    let home = TestHome::new();
    let checkout = tempfile::tempdir().unwrap();
    let missing = check_plan(checkout.path(), &home, "default", "nohost");
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing.stderr.contains("hosts/nohost/config.yaml"),
        "{missing:?}"
    );
    // hermes's usage error (64) is a failure, never "changes".
    let no_args = Command::new(script())
        .current_dir(checkout.path())
        .output()
        .unwrap();
    assert_eq!(no_args.status.code(), Some(1), "{no_args:?}");
}

#[test]
fn a_dry_run_of_a_broken_config_says_so_and_never_converged() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    // A good pass first: its config would stand in for the next pass's.
    let good = home.run(["reconcile"]);
    assert_eq!(good.code, 0, "{good:?}");
    home.write_config("terminal:\n  container_memory: lots\n");
    for output in ["text", "json"] {
        let dry = home.run(["reconcile", "--dry-run", "--output", output]);
        assert_eq!(dry.code, 1, "{dry:?}");
        assert!(
            dry.stderr.contains("config.yaml:2:")
                && dry.stderr.contains("terminal.container_memory"),
            "{dry:?}"
        );
        assert!(!dry.stdout.contains("converged"), "{dry:?}");
    }
    // A pass goes on with the last good config, but does not call the
    // host converged either.
    let pass = home.run(["reconcile"]);
    assert_eq!(pass.code, 1, "{pass:?}");
    assert!(!pass.stdout.contains("converged"), "{pass:?}");
    assert!(
        pass.stdout.contains("config.yaml must be fixed"),
        "{pass:?}"
    );
    // Unreadable: a directory where the file should be.
    std::fs::remove_file(home.config_path()).unwrap();
    std::fs::create_dir(home.config_path()).unwrap();
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 1, "{dry:?}");
    assert!(dry.stderr.contains("config.yaml"), "{dry:?}");
    assert!(!dry.stdout.contains("converged"), "{dry:?}");
    // A --config FILE without --dry-run is a usage error.
    let usage = home.run(["reconcile", "--config", "x.yaml"]);
    assert_eq!(usage.code, 64, "{usage:?}");
}
