//! The proxy planner and fail-closed blocking, each case with its text.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::config::load;
use hermes_model::desired::{Desired, Egress, HostEnv};
use hermes_model::egress::EgressWiring;
use hermes_model::observed::{Observed, ProxyObserved};

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
    }
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
