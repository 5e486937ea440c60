//! Isolation between sandboxes, between homes, and from the host: config
//! that would hand a sandbox the host (`config check`, `reconcile`).

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// A profile name of this test's own.
fn profile(tag: &str) -> String {
    format!("iso{tag}{}", std::process::id())
}

/// `hermes --profile P ARGS…` in `home`.
fn hermes(home: &TestHome, profile: &str, args: &[&str]) -> hermes_tests::cli::Run {
    let mut all = vec!["--profile", profile];
    all.extend_from_slice(args);
    home.run(all)
}

fn docker_config(extra: &str) -> String {
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n{extra}",
        hermes_tests::test_image()
    )
}

#[test]
fn config_check_refuses_what_hands_the_sandbox_the_host_while_the_proxy_is_enforced() {
    let home = TestHome::new();
    let home_dir = home.path().display().to_string();
    let enforced = "proxy:\n  enabled: true\n  enforce_network: true\n";
    // (terminal lines, the key, its line in the file)
    let cases = [
        (
            "  docker_volumes:\n    - /var/run/docker.sock:/var/run/docker.sock\n".to_string(),
            "terminal.docker_volumes[0]",
            5,
        ),
        (
            format!("  docker_volumes:\n    - {home_dir}:/h:ro\n"),
            "terminal.docker_volumes[0]",
            5,
        ),
        (
            "  docker_extra_args: [--cap-add, SYS_ADMIN]\n".to_string(),
            "terminal.docker_extra_args[1]",
            4,
        ),
        (
            "  docker_extra_args: [--add-host=Host.Docker.Internal:10.9.9.9]\n".to_string(),
            "terminal.docker_extra_args[0]",
            4,
        ),
        (
            "  docker_env:\n    GITHUB_TOKEN: ghp_x\n".to_string(),
            "terminal.docker_env.GITHUB_TOKEN",
            5,
        ),
        (
            "  docker_forward_env: [AWS_SECRET_ACCESS_KEY]\n".to_string(),
            "terminal.docker_forward_env[0]",
            4,
        ),
    ];
    for (terminal, key, line) in &cases {
        home.write_config(format!("{}{terminal}{enforced}", docker_config("")));
        let run = home.run(["config", "check"]);
        assert_eq!(run.code, 1, "{terminal}: {run:?}");
        let file = home.config_path().display().to_string();
        assert!(
            run.stderr
                .lines()
                .any(|l| l.starts_with(&format!("error: {file}:{line}:"))
                    && l.contains(&format!(": {key}: "))),
            "{terminal}: {}",
            run.stderr
        );
        // Without the proxy: a warning, and the check passes.
        home.write_config(format!("{}{terminal}", docker_config("")));
        let run = home.run(["config", "check"]);
        assert_eq!(run.code, 0, "{terminal}: {run:?}");
        assert!(
            run.stderr
                .lines()
                .any(|l| l.starts_with("warning: ") && l.contains(&format!(": {key}: "))),
            "{terminal}: {}",
            run.stderr
        );
    }
    // A mount onto hermes's own mount points is an error without the proxy
    // too.
    home.write_config(docker_config("  docker_volumes: [\"/srv:/run/hermes\"]\n"));
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("terminal.docker_volumes[0]: `/srv:/run/hermes`"),
        "{}",
        run.stderr
    );
}

#[test]
fn reconcile_refuses_such_a_config_and_changes_no_sandbox() {
    let profile = profile("cfg");
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::new();
    home.write_config(docker_config(""));
    let made = hermes(&home, &profile, &["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");
    let name = format!("hermes-{profile}-default");
    let id = || {
        docker(&["inspect", "-f", "{{.Id}}", &name])
            .trim()
            .to_string()
    };
    let before = id();
    let mounts = || docker(&["inspect", "-f", "{{json .Mounts}}", &name]);
    for extra in [
        // Refused in every mode: the engine would refuse it too.
        "  docker_volumes: [\"/srv:/workspace\"]\n".to_string(),
        // Refused while the proxy is enforced: the engine's socket.
        "  docker_volumes: [\"/var/run/docker.sock:/var/run/docker.sock\"]\nproxy:\n  enabled: true\n"
            .to_string(),
        format!(
            "  docker_volumes: [\"{}:/h\"]\nproxy:\n  enabled: true\n",
            home.path().display()
        ),
    ] {
        home.write_config(docker_config(&extra));
        let run = hermes(&home, &profile, &["reconcile"]);
        assert_eq!(run.code, 1, "{extra}: {run:?}");
        assert!(
            run.stderr.contains("terminal.docker_volumes[0]"),
            "{extra}: {}",
            run.stderr
        );
        assert_eq!(id(), before, "{extra}: the sandbox was replaced");
        let now = mounts();
        assert!(
            !now.contains("docker.sock") && !now.contains("\"/h\""),
            "{now}"
        );
    }
}
