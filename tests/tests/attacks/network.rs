//! The proxy-only network once `proxy.enforce_network` is turned off: a
//! pass removes it, with its firewall chains, and neither `egress setup`
//! nor `egress stop` makes it again. A network left behind keeps a bridge
//! whose firewall admits the proxy's ports, and piles up with every home;
//! a sandbox left on it reaches nothing, the proxy no longer listening
//! there. The sandboxes on it are the warm one and one made on demand
//! (another task's, as an agent makes them): the pass moves both off it.

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// How many times the whole sequence runs: a leftover that depends on the
/// order things happen in shows within a few.
const ROUNDS: usize = 3;

fn hermes(home: &TestHome, profile: &str, args: &[&str]) -> Run {
    let mut all = vec!["--profile", profile];
    all.extend_from_slice(args);
    home.run(all)
}

/// Every line of the host firewall (both tables) that names `word`.
fn firewall_lines(word: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for table in ["filter", "nat"] {
        let out = std::process::Command::new("iptables-save")
            .args(["-t", table])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains(word))
                .map(|l| format!("{table}: {l}")),
        );
    }
    lines
}

fn network_exists(network: &str) -> bool {
    std::process::Command::new("docker")
        .args(["network", "inspect", network])
        .output()
        .unwrap()
        .status
        .success()
}

/// The network, its rules, the proxy and the sandboxes go with the test.
struct Cleanup<'a> {
    home: &'a TestHome,
    profile: String,
    network: Option<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
        drop(ProfileCleanup(self.profile.clone()));
        let Some(network) = &self.network else {
            return;
        };
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", network])
            .output();
        let suffix = network.trim_start_matches("hermes-egress-");
        let (bridge, chain) = (format!("hermes-{suffix}"), format!("HERMES-{suffix}"));
        for parent in ["DOCKER-USER", "FORWARD"] {
            let mut args = vec!["-w", "-D", parent, "-i", &bridge, "-o", &bridge];
            args.extend(["-j", "REJECT", "--reject-with", "icmp-port-unreachable"]);
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
fn turning_enforce_network_off_leaves_no_network_and_no_chain_behind_setup_and_stop() {
    let profile = format!("atk-net-{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let port = hermes_tests::egress::free_port_pair(Some(hermes_tests::egress::bridge_gateway()));
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\nreconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n",
        hermes_tests::test_image()
    ));
    let mut cleanup = Cleanup {
        home: &home,
        profile: profile.clone(),
        network: None,
    };
    let sandbox = format!("hermes-{profile}-default");
    for round in 1..=ROUNDS {
        let on = hermes(
            &home,
            &profile,
            &["config", "set", "proxy.enforce_network", "true"],
        );
        assert_eq!(on.code, 0, "round {round}: {on:?}");
        let made = hermes(&home, &profile, &["reconcile"]);
        assert_eq!(made.code, 0, "round {round}: {made:?}");
        let network = docker(&[
            "inspect",
            "--format",
            "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
            &sandbox,
        ])
        .trim()
        .to_string();
        assert!(
            network.starts_with("hermes-egress-"),
            "round {round}: the sandbox is on {network:?}\n{made:?}"
        );
        cleanup.network = Some(network.clone());
        let task = hermes(&home, &profile, &["exec", "--task", "other", "--", "true"]);
        assert_eq!(task.code, 0, "round {round}: {task:?}");
        let on_it = docker(&[
            "network",
            "inspect",
            "--format",
            "{{len .Containers}}",
            &network,
        ]);
        assert_eq!(on_it.trim(), "2", "round {round}: both sandboxes on it");
        let chain = format!("HERMES-{}", network.trim_start_matches("hermes-egress-"));
        let bridge = format!("hermes-{}", network.trim_start_matches("hermes-egress-"));
        assert!(
            !firewall_lines(&chain).is_empty(),
            "round {round}: no chain"
        );

        let off = hermes(
            &home,
            &profile,
            &["config", "set", "proxy.enforce_network", "false"],
        );
        assert_eq!(off.code, 0, "round {round}: {off:?}");
        let pass = hermes(&home, &profile, &["reconcile"]);
        assert_eq!(pass.code, 0, "round {round}: {pass:?}");
        assert!(
            pass.stdout.contains("remove-network done"),
            "round {round}: the network's removal is not an operation of the pass:\n{}",
            pass.stdout
        );
        let setup = home.run(["egress", "setup"]);
        assert_eq!(setup.code, 0, "round {round}: {setup:?}");
        let stop = home.run(["egress", "stop"]);
        assert_eq!(stop.code, 0, "round {round}: {stop:?}");

        assert!(
            !network_exists(&network),
            "round {round}: the network {network} is still there\nreconcile: {pass:?}\nsetup: {setup:?}"
        );
        let mut left = firewall_lines(&chain);
        left.extend(firewall_lines(&bridge));
        assert!(
            left.is_empty(),
            "round {round}: the firewall still holds:\n{}\nreconcile: {pass:?}",
            left.join("\n")
        );
    }
    // The task's sandbox is made anew, off the network, by its next exec
    // (once a pass has started the proxy again).
    let pass = hermes(&home, &profile, &["reconcile"]);
    assert_eq!(pass.code, 0, "{pass:?}");
    let again = hermes(&home, &profile, &["exec", "--task", "other", "--", "true"]);
    assert_eq!(again.code, 0, "{again:?}");
    let on = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &format!("hermes-{profile}-other"),
    ]);
    assert_eq!(on.trim(), "bridge");
}
