//! The proxy planner and fail-closed blocking, each case with its text.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::config::load;
use hermes_model::desired::{Desired, Egress, HostEnv};
use hermes_model::egress::EgressWiring;
use hermes_model::observed::{Observed, ProxyNetworkObserved, ProxyObserved};

const NOW: u64 = 1_800_000_000;

fn desired(config: &str, egress: Egress) -> Desired {
    let mut d = Desired::build(
        load(config).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    d.set_egress(egress);
    d
}

fn on() -> Egress {
    Egress::On {
        wiring: EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 9090,
            ca_host_path: PathBuf::from("/h/proxy/ca.crt"),
            ca_sha256: "ab".repeat(32),
            tokens: Vec::new(),
            network: None,
        },
        settings: "5e771265abcd".to_string(),
    }
}

fn healthy() -> ProxyObserved {
    ProxyObserved {
        running: true,
        healthy: true,
        settings: Some("5e771265abcd".to_string()),
        problem: None,
        network: None,
    }
}

fn network(containers: usize) -> Option<ProxyNetworkObserved> {
    Some(ProxyNetworkObserved {
        name: "hermes-egress-0a1b2c3d".to_string(),
        exists: true,
        containers,
        chain: "HERMES-0a1b2c3d".to_string(),
        chain_exists: true,
    })
}

fn text(d: &Desired, proxy: ProxyObserved) -> String {
    let observed = Observed {
        proxy,
        ..Observed::default()
    };
    crate::plan_all(d, &observed, UNIX_EPOCH + Duration::from_secs(NOW)).to_string()
}

const DOCKER_PROXY: &str = "terminal:\n  backend: docker\nproxy:\n  enabled: true\n";

#[test]
fn a_stopped_proxy_is_started_and_blocks_the_sandbox_meanwhile() {
    let d = desired(DOCKER_PROXY, on());
    assert_eq!(
        text(&d, ProxyObserved::default()),
        "+ proxy                     start       enabled in config, not running\n\
         ! sandbox default/default   blocked     egress proxy not running (fail closed); wanted: create (no container with these labels)\n\
         Plan: 1 to create, 0 to change, 0 to remove, 1 blocked."
    );
}

#[test]
fn a_healthy_proxy_on_the_current_settings_lets_sandboxes_run() {
    let d = desired(DOCKER_PROXY, on());
    assert_eq!(
        text(&d, healthy()),
        "+ sandbox default/default   create      no container with these labels\n\
         Plan: 1 to create, 0 to change, 0 to remove."
    );
}

#[test]
fn new_settings_or_a_failed_health_check_restart_it() {
    let d = desired(DOCKER_PROXY, on());
    let mut old = healthy();
    old.settings = Some("000000000000".to_string());
    let t = text(&d, old);
    assert!(
        t.starts_with("~ proxy                     restart     settings changed: 000000000000 -> 5e771265abcd\n"),
        "{t}"
    );
    assert!(
        t.contains("egress proxy not yet on the current settings (fail closed)"),
        "{t}"
    );
    let mut sick = healthy();
    sick.healthy = false;
    sick.problem = Some("management endpoint: connection refused".to_string());
    let t = text(&d, sick);
    assert!(
        t.starts_with("~ proxy                     restart     running but not healthy: management endpoint: connection refused\n"),
        "{t}"
    );
}

#[test]
fn a_proxy_not_set_up_is_set_up_first() {
    let d = desired(
        DOCKER_PROXY,
        Egress::NotSetUp {
            missing: "ca.crt, tokens.json".to_string(),
        },
    );
    assert_eq!(
        text(&d, ProxyObserved::default()),
        "+ proxy                     setup       not set up: ca.crt, tokens.json\n\
         ! sandbox default/default   blocked     egress proxy not set up (ca.crt, tokens.json) (fail closed); wanted: create (no container with these labels)\n\
         Plan: 1 to create, 0 to change, 0 to remove, 1 blocked."
    );
}

#[test]
fn without_enforcement_sandboxes_are_not_blocked() {
    let d = desired(&format!("{DOCKER_PROXY}  enforce_on_docker: false\n"), on());
    assert_eq!(
        text(&d, ProxyObserved::default()),
        "+ proxy                     start       enabled in config, not running\n\
         + sandbox default/default   create      no container with these labels\n\
         Plan: 2 to create, 0 to change, 0 to remove."
    );
}

#[test]
fn a_disabled_proxy_that_runs_is_stopped() {
    let d = desired("terminal:\n  backend: docker\n", Egress::Off);
    assert_eq!(
        text(&d, healthy()),
        "- proxy                     stop        disabled in config (proxy.enabled: false), running\n\
         + sandbox default/default   create      no container with these labels\n\
         Plan: 1 to create, 0 to change, 1 to remove."
    );
    // Not running: nothing to do.
    let d = desired("", Egress::Off);
    assert_eq!(
        text(&d, ProxyObserved::default()),
        "No changes. The host is converged."
    );
}

#[test]
fn a_wired_sandbox_is_recreated_when_egress_settings_change() {
    let d = desired(DOCKER_PROXY, on());
    let plain = desired("terminal:\n  backend: docker\n", Egress::Off);
    assert_ne!(d.sandboxes[0].hash(), plain.sandboxes[0].hash());
}

#[test]
fn the_network_is_removed_once_enforce_network_is_off() {
    let d = desired(
        DOCKER_PROXY,
        Egress::NotSetUp {
            missing: "config.json is older than config.yaml's proxy section".to_string(),
        },
    );
    let mut proxy = healthy();
    proxy.network = network(0);
    assert_eq!(
        text(&d, proxy),
        "+ proxy                     setup       not set up: config.json is older than config.yaml's proxy section\n\
         - proxy                     remove-network  proxy.enforce_network is off; the network hermes-egress-0a1b2c3d and its firewall chain HERMES-0a1b2c3d still there\n\
         ! sandbox default/default   blocked     egress proxy not set up (config.json is older than config.yaml's proxy section) (fail closed); wanted: create (no container with these labels)\n\
         Plan: 1 to create, 0 to change, 1 to remove, 1 blocked."
    );
    // A chain left without its network goes too; so does a network left
    // by a proxy now disabled.
    let mut proxy = healthy();
    proxy.network = network(0).map(|n| ProxyNetworkObserved { exists: false, ..n });
    let t = text(&desired(DOCKER_PROXY, on()), proxy);
    assert!(
        t.starts_with("- proxy                     remove-network  proxy.enforce_network is off; the firewall chain HERMES-0a1b2c3d still there\n"),
        "{t}"
    );
    let proxy = ProxyObserved {
        network: network(0),
        ..ProxyObserved::default()
    };
    let t = text(
        &desired("terminal:\n  backend: docker\n", Egress::Off),
        proxy,
    );
    assert!(
        t.starts_with(
            "- proxy                     remove-network  the proxy is disabled; the network"
        ),
        "{t}"
    );
}

#[test]
fn the_network_is_kept_while_containers_are_attached_and_while_it_is_wanted() {
    let mut proxy = healthy();
    proxy.network = network(2);
    let t = text(&desired(DOCKER_PROXY, on()), proxy.clone());
    assert!(
        t.starts_with("? proxy                     network-in-use  proxy.enforce_network is off; the network hermes-egress-0a1b2c3d and its firewall chain HERMES-0a1b2c3d are kept while 2 container(s) are attached, removed once they are off it\n"),
        "{t}"
    );
    assert!(!t.contains("remove-network"), "{t}");
    let plan = crate::plan_all(
        &desired(DOCKER_PROXY, on()),
        &Observed {
            proxy: proxy.clone(),
            ..Observed::default()
        },
        UNIX_EPOCH + Duration::from_secs(NOW),
    );
    assert!(
        crate::proxy::has_proxy_work(&plan.ops),
        "a pass plans again"
    );
    let enforced = desired(&format!("{DOCKER_PROXY}  enforce_network: true\n"), on());
    proxy.network = network(0);
    let t = text(&enforced, proxy);
    assert!(!t.contains("network"), "{t}");
}
