//! config.yaml as Hermes Agent writes it, end to end: the agent's own
//! defaults, a file its `hermes config set` wrote (the real CLI when
//! `HERMES_AGENT_VENV` names its venv, as `scripts/test` sets it; else the
//! very text it writes), `docker_extra_args` hermes cannot honour blocking
//! the Docker sandbox alone, and the mapped flags as the engine has them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

/// Hermes Agent 0.19.0's `DEFAULT_CONFIG` written out as YAML.
const AGENT_DEFAULTS: &str = include_str!("../fixtures/agent-default-config.yaml");

/// Writes `config.yaml` (and `.env`, when given) where `hermes --profile
/// PROFILE` reads them, whether the profile's home is the root or
/// `<root>/profiles/PROFILE`.
fn place(home: &TestHome, profile: &str, config: &str, dotenv: Option<&str>) {
    let dirs = [
        home.path().to_path_buf(),
        home.path().join("profiles").join(profile),
    ];
    for dir in dirs {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), config).unwrap();
        if let Some(dotenv) = dotenv {
            std::fs::write(dir.join(".env"), dotenv).unwrap();
        }
    }
}

/// `hermes --profile PROFILE ARGS…` with `extra` in its environment.
fn hermes(home: &TestHome, profile: &str, args: &[&str], extra: &[(&str, &str)]) -> Run {
    let mut all = vec!["--profile", profile];
    all.extend_from_slice(args);
    let mut cmd = home.command(all);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().unwrap().into()
}

#[test]
fn the_agents_own_default_config_is_valid_and_plans_without_an_error() {
    let home = TestHome::new();
    home.write_config(AGENT_DEFAULTS);
    let check = home.run(["config", "check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert!(check.stdout.contains("is valid (0 warnings)"), "{check:?}");
    assert_eq!(check.stderr, "", "{check:?}");
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(
        (dry.code, dry.stdout.as_str(), dry.stderr.as_str()),
        (0, "No changes. The host is converged.\n", ""),
        "{dry:?}"
    );
}

/// What Hermes Agent 0.19.0's `hermes config set` wrote for
/// `terminal.backend docker`, `terminal.docker_image IMAGE` and
/// `terminal.docker_forward_env '["FOO"]'` (run with `HERMES_HOME` on an
/// empty directory): config.yaml, and the `TERMINAL_*` variables it keeps
/// in `.env` beside it.
fn as_the_agent_writes_it(image: &str) -> (String, String) {
    (
        format!(
            "terminal:\n  backend: docker\n  docker_image: {image}\n  docker_forward_env: '[\"FOO\"]'\n"
        ),
        format!(
            "TERMINAL_ENV=docker\nTERMINAL_DOCKER_IMAGE={image}\nTERMINAL_DOCKER_FORWARD_ENV=\"[\\\"FOO\\\"]\"\n"
        ),
    )
}

/// The agent's `hermes config set` run on a home of its own, when its venv
/// is there: what it wrote.
fn written_by_the_agent(image: &str) -> (String, String) {
    let Some(venv) = std::env::var_os("HERMES_AGENT_VENV").filter(|v| !v.is_empty()) else {
        return as_the_agent_writes_it(image);
    };
    let agent_home = tempfile::tempdir().unwrap();
    for (key, value) in [
        ("terminal.backend", "docker"),
        ("terminal.docker_image", image),
        ("terminal.docker_forward_env", "[\"FOO\"]"),
    ] {
        let out = Command::new(Path::new(&venv).join("bin").join("hermes"))
            .args(["config", "set", key, value])
            .env("HERMES_HOME", agent_home.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the agent's hermes config set {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let read = |name: &str| std::fs::read_to_string(agent_home.path().join(name)).unwrap();
    let written = (read("config.yaml"), read(".env"));
    // The agent still writes what the fallback above says it does.
    assert_eq!(written, as_the_agent_writes_it(image));
    written
}

#[test]
fn a_config_the_agents_config_set_wrote_converges_and_forwards_its_variable() {
    let profile = format!("agset{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::new();
    let (config, dotenv) = written_by_the_agent(&hermes_tests::test_image());
    place(&home, &profile, &config, Some(&dotenv));
    let check = hermes(&home, &profile, &["config", "check"], &[]);
    assert_eq!(check.code, 0, "{check:?}");
    let apply = hermes(&home, &profile, &["reconcile"], &[]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{apply:?}"
    );
    assert_eq!(
        containers_of(&profile),
        [(format!("hermes-{profile}-default"), "running".to_string())]
    );
    // `docker_forward_env: '["FOO"]'` is the list ["FOO"].
    let run = hermes(
        &home,
        &profile,
        &["exec", "--", "sh", "-c", "echo \"FOO=$FOO\""],
        &[("FOO", "from-the-host")],
    );
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "FOO=from-the-host\n"),
        "{run:?}"
    );
}

#[test]
fn an_extra_arg_hermes_cannot_map_blocks_only_the_docker_sandbox_and_the_rest_converges() {
    let profile = format!("agblk{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::new();
    let good = format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  lifetime_seconds: 1\n",
        hermes_tests::test_image()
    );
    place(&home, &profile, &good, None);
    // A session's sandbox, soon idle past its lifetime.
    let made = hermes(
        &home,
        &profile,
        &["exec", "--session", "s1", "--", "true"],
        &[],
    );
    assert_eq!(made.code, 0, "{made:?}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    place(
        &home,
        &profile,
        &format!("{good}  docker_extra_args:\n    - --shm-size=1g\n    - --privileged\n"),
        None,
    );
    let reason = "terminal.docker_extra_args[1]: `--privileged` gives the sandbox every capability and device of the host";

    let check = hermes(&home, &profile, &["config", "check"], &[]);
    assert_eq!(check.code, 1, "{check:?}");
    assert!(
        check.stderr.contains(&format!("config.yaml:7:7: {reason}")),
        "{check:?}"
    );

    let dry = hermes(&home, &profile, &["reconcile", "--dry-run"], &[]);
    assert_eq!(dry.code, 1, "{dry:?}");
    let row = dry
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("! sandbox {profile}/default ")))
        .unwrap_or_else(|| panic!("no blocked row: {dry:?}"));
    let (_, rest) = row.split_once(" blocked ").unwrap();
    assert!(rest.trim_start().starts_with(reason), "{row}");
    assert!(
        dry.stdout
            .contains(&format!("- sandbox {profile}/default@s1")),
        "{dry:?}"
    );

    let apply = hermes(&home, &profile, &["reconcile"], &[]);
    assert_eq!(apply.code, 1, "{apply:?}");
    // The rest converged: the idle session's sandbox is gone; the warm
    // one was never made other than as the config says.
    assert_eq!(containers_of(&profile), Vec::<(String, String)>::new());

    let status = hermes(&home, &profile, &["status", "--output", "json"], &[]);
    assert_eq!(status.code, 1, "{status:?}");
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let blocked: Vec<&str> = report["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b.as_str())
        .collect();
    assert!(
        blocked
            .iter()
            .any(|b| b.starts_with(&format!("sandbox {profile}/default: {reason}"))),
        "{blocked:?}"
    );
    assert_eq!(report["config"]["valid"], true, "{report}");

    let exec = hermes(&home, &profile, &["exec", "--", "true"], &[]);
    assert_eq!(exec.code, 1, "{exec:?}");
    assert!(
        exec.stderr
            .contains("the Docker sandboxes are blocked by config.yaml"),
        "{exec:?}"
    );
}

#[test]
fn a_create_with_mapped_flags_reaches_docker_inspect_and_a_change_is_a_planned_recreate() {
    let profile = format!("agmap{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::new();
    let config = |shm: &str| {
        format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n  container_cpu: 0\n  container_memory: 0\n  docker_extra_args:\n    - --shm-size={shm}\n    - --label\n    - team=ml\n    - --ulimit\n    - nofile=1024:2048\n    - --cpuset-cpus=0\n    - --dns=9.9.9.9\n",
            hermes_tests::test_image()
        )
    };
    place(&home, &profile, &config("256m"), None);
    let apply = hermes(&home, &profile, &["reconcile"], &[]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let name = format!("hermes-{profile}-default");
    let inspect = docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.ShmSize}} {{index .Config.Labels \"team\"}} {{json .HostConfig.Ulimits}} {{.HostConfig.CpusetCpus}} {{json .HostConfig.Dns}} {{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}",
        &name,
    ]);
    assert_eq!(
        inspect.trim(),
        "268435456 ml [{\"Hard\":2048,\"Name\":\"nofile\",\"Soft\":1024}] 0 [\"9.9.9.9\"] 0 0"
    );
    place(&home, &profile, &config("512m"), None);
    let dry = hermes(&home, &profile, &["reconcile", "--dry-run"], &[]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "~ sandbox {profile}/default   recreate    docker_shm_size 256 MiB → 512 MiB (forces recreate)"
        )),
        "{dry:?}"
    );
}

#[test]
fn terminal_variables_lay_values_over_the_file_and_show_and_check_say_so() {
    let home = TestHome::new();
    home.write_config("proxy:\n  enabled: false\n");
    let with = |args: &[&str], vars: &[(&str, &str)]| -> Run {
        let mut cmd = home.command(args);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap().into()
    };
    let image = [("TERMINAL_DOCKER_IMAGE", "debian:12")];
    let show = with(&["config", "show"], &image);
    assert_eq!(show.code, 0, "{show:?}");
    assert!(
        show.stdout
            .contains("\n  docker_image: debian:12  # from TERMINAL_DOCKER_IMAGE\n"),
        "{show:?}"
    );
    let json = with(&["config", "show", "--output", "json"], &image);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["terminal"]["docker_image"], "debian:12");
    assert!(
        json.stderr
            .contains("note: terminal.docker_image is TERMINAL_DOCKER_IMAGE's value"),
        "{json:?}"
    );
    let check = with(&["config", "check"], &image);
    assert_eq!(check.code, 0, "{check:?}");
    assert!(
        check
            .stderr
            .contains("note: terminal.docker_image is TERMINAL_DOCKER_IMAGE's value (debian:12)"),
        "{check:?}"
    );
    let bad = with(&["config", "check"], &[("TERMINAL_TIMEOUT", "5m")]);
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(
        bad.stderr
            .contains("error: TERMINAL_TIMEOUT: `5m` is not an integer\n"),
        "{bad:?}"
    );
    // A `terminal:` mapping in the file wins for the agent's own keys.
    home.write_config("terminal:\n  timeout: 30\n");
    let show = with(&["config", "get", "terminal.docker_image"], &image);
    assert_eq!(
        show.stdout,
        format!("{}\n", hermes_backends::model::schema::DEFAULT_DOCKER_IMAGE),
        "{show:?}"
    );
}
