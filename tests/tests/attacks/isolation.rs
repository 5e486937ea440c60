//! Isolation between sandboxes, between homes, and from the host: config
//! that would hand a sandbox the host (`config check`, `reconcile`).

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, docker};
use hermes_tests::egress::network_gateway;

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
            // A secret the proxy does not stand in for (AWS keys are now
            // its business: re-signed, like any provider key).
            "  docker_forward_env: [GOOGLE_APPLICATION_CREDENTIALS]\n".to_string(),
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
    let home = TestHome::with_profile(&profile);
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

/// The container's id, `None` when there is none of that name.
fn container_id(name: &str) -> Option<String> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", name])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn names_listed(home: &TestHome, profile: &str) -> Vec<String> {
    let run = hermes(home, profile, &["sandbox", "list", "--output", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let list: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn two_homes_with_one_profile_name_never_touch_each_others_sandboxes() {
    let profile = profile("homes");
    let _cleanup = ProfileCleanup(profile.clone());
    let (a, b) = (
        TestHome::with_profile(&profile),
        TestHome::with_profile(&profile),
    );
    a.write_config(docker_config(""));
    // B wants something else of the same names: another environment (a
    // recreate) and no warm sandbox at all (a removal, with --prune).
    b.write_config(docker_config(
        "  container_persistent: false\n  docker_env: {FROM: b}\n",
    ));
    let made = hermes(&a, &profile, &["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");
    let name = format!("hermes-{profile}-default");
    let a_id = container_id(&name).unwrap();

    let run = hermes(&b, &profile, &["reconcile", "--prune"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(container_id(&name).as_deref(), Some(a_id.as_str()));
    assert!(!names_listed(&b, &profile).contains(&name));

    // B's own sandboxes live beside A's, and A does not see them.
    let own = hermes(
        &b,
        &profile,
        &["exec", "--task", "mine", "--", "sh", "-c", "echo $FROM"],
    );
    assert_eq!((own.code, own.stdout.as_str()), (0, "b\n"), "{own:?}");
    let b_name = format!("hermes-{profile}-mine-default");
    let b_id = container_id(&b_name).unwrap();
    assert_eq!(names_listed(&b, &profile), std::slice::from_ref(&b_name));
    assert_eq!(names_listed(&a, &profile), std::slice::from_ref(&name));
    let run = hermes(&a, &profile, &["reconcile", "--prune"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(container_id(&b_name).as_deref(), Some(b_id.as_str()));

    // A home that wants a name another home's container holds gets an
    // error naming it, and the container stays.
    b.write_config(docker_config("  docker_env: {FROM: b}\n"));
    let run = hermes(&b, &profile, &["reconcile"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains(&format!("container {name} is not this home's"))
            || run
                .stderr
                .contains(&format!("container {name} is not this home's")),
        "{run:?}"
    );
    let exec = hermes(&b, &profile, &["exec", "--", "true"]);
    assert_ne!(exec.code, 0, "{exec:?}");
    assert!(exec.stderr.contains("is not this home's"), "{exec:?}");
    assert_eq!(container_id(&name).as_deref(), Some(a_id.as_str()));
    let inside = docker(&["exec", &name, "sh", "-c", "echo ${FROM:-unset}"]);
    assert_eq!(inside, "unset\n");
}

#[test]
fn a_container_from_before_the_home_label_is_adopted_by_its_home_only() {
    let profile = profile("adopt");
    let _cleanup = ProfileCleanup(profile.clone());
    let (a, b) = (
        TestHome::with_profile(&profile),
        TestHome::with_profile(&profile),
    );
    a.write_config(docker_config(""));
    b.write_config(docker_config(""));
    let made = hermes(&a, &profile, &["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");
    let name = format!("hermes-{profile}-default");
    // Make it again as an older hermes did: the same labels but the home's,
    // the same binds.
    let labels: std::collections::BTreeMap<String, String> = serde_json::from_str(&docker(&[
        "inspect",
        "-f",
        "{{json .Config.Labels}}",
        &name,
    ]))
    .unwrap();
    assert!(labels.contains_key("hermes-home"), "{labels:?}");
    let binds: Vec<String> = serde_json::from_str(&docker(&[
        "inspect",
        "-f",
        "{{json .HostConfig.Binds}}",
        &name,
    ]))
    .unwrap();
    docker(&["rm", "-f", &name]);
    let legacy = |name: &str,
                  binds: &[String],
                  labels: &std::collections::BTreeMap<String, String>| {
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.into()];
        for (k, v) in labels.iter().filter(|(k, _)| *k != "hermes-home") {
            args.extend(["--label".to_string(), format!("{k}={v}")]);
        }
        for bind in binds {
            args.extend(["-v".to_string(), bind.clone()]);
        }
        args.extend([
            hermes_tests::test_image(),
            "sleep".into(),
            "infinity".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args).trim().to_string()
    };
    let old_id = legacy(&name, &binds, &labels);

    // A adopts it as it is: no recreate, and it is listed.
    let dry = hermes(&a, &profile, &["reconcile", "--dry-run"]);
    assert_eq!(
        (dry.code, dry.stdout.as_str()),
        (0, "No changes. The host is converged.\n"),
        "{dry:?}"
    );
    assert_eq!(names_listed(&a, &profile), std::slice::from_ref(&name));
    // B leaves it alone.
    assert!(names_listed(&b, &profile).is_empty());
    let run = hermes(&b, &profile, &["reconcile", "--prune"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert_eq!(container_id(&name).as_deref(), Some(old_id.as_str()));

    // One without the label whose binds are elsewhere is nobody's here.
    let stray_dir = tempfile::tempdir().unwrap();
    let mut stray_labels = labels.clone();
    stray_labels.insert("hermes-task-id".into(), "stray".into());
    let stray = format!("hermes-{profile}-stray");
    let stray_id = legacy(
        &stray,
        &[format!("{}:/workspace", stray_dir.path().display())],
        &stray_labels,
    );
    assert_eq!(names_listed(&a, &profile), std::slice::from_ref(&name));
    assert!(names_listed(&b, &profile).is_empty());
    for home in [&a, &b] {
        hermes(home, &profile, &["reconcile", "--prune"]);
    }
    assert_eq!(container_id(&stray).as_deref(), Some(stray_id.as_str()));
    assert_eq!(container_id(&name).as_deref(), Some(old_id.as_str()));
}

/// Whether `container` connects to `ip:port` (3 s at most): `Ok`, or the
/// kind of the failure, as Python names it (`ConnectionRefusedError`: a
/// refusal; `TimeoutError`: silence).
pub(super) fn connects(container: &str, ip: &str, port: u16) -> Result<(), String> {
    let probe = format!(
        "import socket\ns = socket.socket()\ns.settimeout(3)\ntry:\n    s.connect(('{ip}', {port}))\n    print('CONNECTED')\nexcept Exception as e:\n    print('FAILED', type(e).__name__, e)\n"
    );
    let out = std::process::Command::new("docker")
        .args(["exec", container, "python3", "-c", &probe])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("CONNECTED") {
        return Ok(());
    }
    let kind = text
        .lines()
        .find_map(|l| l.strip_prefix("FAILED "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out:?}"));
    Err(kind.to_string())
}

/// Starts an HTTP server on port 8000 in `container` and waits (10 s at
/// most) until it answers there; returns its address on `network`.
pub(super) fn serve_on(container: &str, network: &str) -> String {
    docker(&[
        "exec",
        "-d",
        container,
        "python3",
        "-m",
        "http.server",
        "8000",
        "--bind",
        "0.0.0.0",
    ]);
    let ip = address_on(container, network);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while connects(container, &ip, 8000).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ip
}

/// The address of `container` on `network`.
fn address_on(container: &str, network: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        container,
    ])
    .trim()
    .to_string()
}

/// The proxy-only network of one test, and everything that goes with it:
/// the proxy stops, the sandboxes, the network and the firewall rules go.
pub(super) struct EnforcedCleanup<'a> {
    pub(super) home: &'a TestHome,
    pub(super) profile: String,
    pub(super) network: String,
}

impl Drop for EnforcedCleanup<'_> {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
        drop(ProfileCleanup(self.profile.clone()));
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let suffix = self.network.trim_start_matches("hermes-egress-");
        let (bridge, chain) = (format!("hermes-{suffix}"), format!("HERMES-{suffix}"));
        let forward = [
            "-i",
            &bridge,
            "-o",
            &bridge,
            "-j",
            "REJECT",
            "--reject-with",
            "icmp-port-unreachable",
        ];
        for parent in ["DOCKER-USER", "FORWARD"] {
            let mut args = vec!["-w", "-D", parent];
            args.extend(forward);
            let _ = std::process::Command::new("iptables").args(args).output();
        }
        for args in [
            vec!["-w", "-D", "INPUT", "-i", &bridge, "-j", &chain],
            vec!["-w", "-F", &chain],
            vec!["-w", "-X", &chain],
        ] {
            let _ = std::process::Command::new("iptables").args(args).output();
        }
        hermes_tests::egress::remove_transparent_rules(&bridge, &chain);
    }
}

#[test]
fn sandboxes_on_the_proxy_only_network_reach_neither_each_other_nor_is_the_proxy_on_docker0() {
    let profile = profile("icc");
    let home = TestHome::with_profile(&profile);
    let docker0 = hermes_tests::egress::bridge_gateway();
    let port = hermes_tests::egress::free_port_pair(Some(docker0));
    home.write_config(docker_config(&format!(
        "reconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n"
    )));
    let made = hermes(&home, &profile, &["reconcile"]);
    let a = format!("hermes-{profile}-default");
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &a,
    ])
    .trim()
    .to_string();
    let _cleanup = EnforcedCleanup {
        home: &home,
        profile: profile.clone(),
        network: network.clone(),
    };
    assert_eq!(made.code, 0, "{made:?}");
    assert!(network.starts_with("hermes-egress-"), "{network}");

    // Another sandbox of the same profile, and a server in the first.
    let other = hermes(&home, &profile, &["exec", "--task", "other", "--", "true"]);
    assert_eq!(other.code, 0, "{other:?}");
    let b = format!("hermes-{profile}-other");
    let a_ip = serve_on(&a, &network);
    // Refused (the bridge's reject), not dropped into a timeout.
    assert_eq!(
        connects(&b, &a_ip, 8000),
        Err("ConnectionRefusedError".to_string()),
        "a sandbox reached another one, or was not refused"
    );
    // The proxy answers on the network's gateway, and nowhere on docker0.
    let gateway = network_gateway(&network).to_string();
    assert!(
        connects(&b, &gateway, port).is_ok(),
        "the proxy is not on the gateway"
    );
    assert_eq!(
        docker(&[
            "network",
            "inspect",
            "--format",
            "{{index .Options \"com.docker.network.bridge.enable_icc\"}}",
            &network,
        ])
        .trim(),
        "false"
    );
    let plain = std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            &hermes_tests::test_image(),
            "python3",
            "-c",
            &format!(
                "import socket\nfor p in ({port}, {}):\n    s = socket.socket(); s.settimeout(3)\n    try:\n        s.connect(('{docker0}', p)); print('CONNECTED', p)\n    except Exception as e:\n        print('FAILED', p, e)\n",
                port + 1
            ),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(
        text.matches("FAILED").count() == 2 && !text.contains("CONNECTED"),
        "a container on the default bridge reached the proxy: {text} {}",
        String::from_utf8_lossy(&plain.stderr)
    );
}

#[test]
fn a_proxy_only_network_made_before_icc_was_off_is_replaced_with_its_sandboxes_on_it() {
    let profile = profile("old");
    let home = TestHome::with_profile(&profile);
    let port = hermes_tests::egress::free_port_pair(Some(hermes_tests::egress::bridge_gateway()));
    home.write_config(docker_config(&format!(
        "reconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n"
    )));
    let made = hermes(&home, &profile, &["reconcile"]);
    let a = format!("hermes-{profile}-default");
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &a,
    ])
    .trim()
    .to_string();
    let _cleanup = EnforcedCleanup {
        home: &home,
        profile: profile.clone(),
        network: network.clone(),
    };
    assert_eq!(made.code, 0, "{made:?}");
    // Both sandboxes, made on the network...
    let run = hermes(&home, &profile, &["exec", "--task", "other", "--", "true"]);
    assert_eq!(run.code, 0, "{run:?}");
    let b = format!("hermes-{profile}-other");
    // ...then moved onto the network as an older hermes made it: no
    // enable_icc option, and no rule of hermes's own between its
    // containers.
    let bridge = format!("hermes-{}", network.trim_start_matches("hermes-egress-"));
    for name in [&a, &b] {
        docker(&["network", "disconnect", "-f", &network, name]);
    }
    docker(&["network", "rm", &network]);
    docker(&[
        "network",
        "create",
        "--internal",
        "-o",
        &format!("com.docker.network.bridge.name={bridge}"),
        "--label",
        "hermes-agent=1",
        "--label",
        "hermes-egress-network=1",
        &network,
    ]);
    for name in [&a, &b] {
        docker(&["network", "connect", &network, name]);
    }
    // Nor the rules of hermes's own that refuse what a sandbox sends to be
    // forwarded (between its containers, or anywhere).
    let rules: [&[&str]; 3] = [
        &[
            "-o",
            &bridge,
            "-j",
            "REJECT",
            "--reject-with",
            "icmp-port-unreachable",
        ],
        &["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        &["-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
    ];
    for parent in ["DOCKER-USER", "FORWARD"] {
        for rule in rules {
            let _ = std::process::Command::new("iptables")
                .args(["-w", "-D", parent, "-i", &bridge])
                .args(rule)
                .output();
        }
    }
    // The hole, as it was.
    let serve = |a: &str| {
        docker(&[
            "exec",
            "-d",
            a,
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "0.0.0.0",
        ]);
        let a_ip = address_on(a, &network);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while connects(a, &a_ip, 8000).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        a_ip
    };
    let a_ip = serve(&a);
    assert!(
        connects(&b, &a_ip, 8000).is_ok(),
        "the old network should let them talk"
    );

    let again = hermes(&home, &profile, &["reconcile"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        docker(&[
            "network",
            "inspect",
            "--format",
            "{{index .Options \"com.docker.network.bridge.enable_icc\"}}",
            &network,
        ])
        .trim(),
        "false"
    );
    // Both sandboxes are on the new network (the one made before it moved
    // over, or was recreated by the plan), and cannot reach each other.
    assert!(container_id(&b).is_some());
    for name in [&a, &b] {
        let on = docker(&[
            "inspect",
            "--format",
            "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
            name,
        ]);
        assert_eq!(on.trim(), network, "{name}");
    }
    // A sandbox that was moved over keeps its processes; one recreated
    // serves anew.
    let a_ip = address_on(&a, &network);
    let a_ip = if connects(&a, &a_ip, 8000).is_ok() {
        a_ip
    } else {
        serve(&a)
    };
    assert!(
        connects(&b, &a_ip, 8000).is_err(),
        "a sandbox reached another one"
    );
}
