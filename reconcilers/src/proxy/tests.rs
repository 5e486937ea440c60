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
            gcp_adc_host_path: None,
            env_dir_host_path: None,
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
        keys: None,
    }
}

/// The network with `containers` attached, `c1`, `c2`, ….
fn network(containers: usize) -> Option<ProxyNetworkObserved> {
    Some(ProxyNetworkObserved {
        name: "hermes-egress-0a1b2c3d".to_string(),
        exists: true,
        attached: (1..=containers).map(|i| format!("c{i}")).collect(),
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

fn staged(d: &Desired, proxy: ProxyObserved) -> crate::StagedPlan {
    let observed = Observed {
        proxy,
        ..Observed::default()
    };
    crate::plan_stages(d, &observed, UNIX_EPOCH + Duration::from_secs(NOW))
}

#[test]
fn a_proxy_to_set_up_plans_its_start_and_the_sandbox_as_later_stages() {
    let d = desired(
        DOCKER_PROXY,
        Egress::NotSetUp {
            missing: "ca.crt, tokens.json".to_string(),
        },
    );
    let plan = staged(&d, ProxyObserved::default());
    assert_eq!(
        plan.to_string(),
        "Stage 1 of 3:\n\
         + proxy                     setup       not set up: ca.crt, tokens.json\n\
         ! sandbox default/default   blocked     egress proxy not set up (ca.crt, tokens.json) (fail closed); wanted: create (no container with these labels)\n\
         Plan: 1 to create, 0 to change, 0 to remove, 1 blocked.\n\
         \n\
         Stage 2 of 3, once the proxy is set up:\n\
         + proxy   start       enabled in config, not running\n\
         Plan: 1 to create, 0 to change, 0 to remove.\n\
         \n\
         Stage 3 of 3, once the proxy runs, healthy, on the current settings:\n\
         + sandbox default/default   create      no container with these labels\n\
         Plan: 1 to create, 0 to change, 0 to remove."
    );
    let json = serde_json::to_value(plan.to_json()).unwrap();
    assert_eq!(json["operations"].as_array().unwrap().len(), 2);
    assert_eq!(json["converged"], serde_json::Value::Bool(false));
    assert_eq!(json["stages"][0]["stage"], 2);
    assert_eq!(json["stages"][0]["after"], "the proxy is set up");
    assert_eq!(json["stages"][0]["operations"][0]["action"], "start");
    assert_eq!(json["stages"][1]["stage"], 3);
    assert_eq!(
        json["stages"][1]["operations"][0]["target"],
        "sandbox default/default"
    );
    assert_eq!(json["stages"][1]["summary"]["create"], 1);
}

#[test]
fn a_restart_stages_the_recreates_it_blocks_and_nothing_when_nothing_waits() {
    let d = desired(DOCKER_PROXY, on());
    let plan = staged(&d, ProxyObserved::default());
    assert_eq!(plan.later.len(), 1, "{plan}");
    assert_eq!(
        plan.later[0].plan.work(),
        [(
            hermes_model::plan::Kind::Create,
            "sandbox default/default".to_string(),
            "create"
        )]
    );
    // Nothing waits on the proxy: one stage, printed as a plain plan.
    let unenforced = desired(&format!("{DOCKER_PROXY}  enforce_on_docker: false\n"), on());
    let plan = staged(&unenforced, ProxyObserved::default());
    assert!(plan.later.is_empty(), "{plan}");
    assert!(plan.to_string().starts_with("+ proxy "), "{plan}");
    assert!(
        serde_json::to_value(plan.to_json())
            .unwrap()
            .get("stages")
            .is_none()
    );
    // Converged: one stage.
    assert!(staged(&d, healthy()).later.is_empty());
}

#[test]
fn a_network_in_use_is_removed_in_the_stage_after_its_containers_leave_it() {
    let mut proxy = healthy();
    proxy.network = network(1);
    // No container of the profile to move off it: the network waits, and
    // no later stage is promised.
    let plan = staged(&desired(DOCKER_PROXY, on()), proxy.clone());
    assert!(plan.later.is_empty(), "{plan}");
    // The proxy disabled: the stop, then, once nothing moved, still no
    // removal promised while a container is attached.
    let off = desired(
        "terminal:\n  backend: docker\nproxy:\n  enabled: false\n",
        Egress::Off,
    );
    let plan = staged(&off, proxy.clone());
    assert!(plan.later.is_empty(), "{plan}");
    // An empty network: removed in the first stage.
    proxy.network = network(0);
    let plan = staged(&off, proxy);
    assert!(plan.later.is_empty(), "{plan}");
    assert!(plan.first.to_string().contains("remove-network"), "{plan}");
}

#[test]
fn a_network_whose_containers_the_stage_recreates_off_it_is_removed_in_the_next() {
    use hermes_model::observed::{ContainerState, ObservedContainer};
    use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_SPEC_HASH, LABEL_TASK};
    let d = desired(DOCKER_PROXY, on());
    let mut proxy = healthy();
    proxy.network = network(1);
    let labels = [
        (LABEL_AGENT, "1"),
        (LABEL_PROFILE, "default"),
        (LABEL_TASK, "default"),
        (LABEL_SPEC_HASH, "0123456789ab"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let on_the_network = ObservedContainer {
        id: "c1".to_string(),
        name: d.sandboxes[0].name.clone(),
        labels,
        state: ContainerState::Running,
        created: NOW as i64 - 60,
        started_at: Some(NOW as i64 - 60),
        finished_at: None,
        processes: Some(0),
        made_by_agent: None,
        adopted_hash: None,
    };
    let observed = Observed {
        proxy,
        containers: vec![on_the_network],
        ..Observed::default()
    };
    let plan = crate::plan_stages(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW));
    let t = plan.to_string();
    assert!(t.starts_with("Stage 1 of 2:\n? proxy "), "{t}");
    assert!(t.contains("network-in-use"), "{t}");
    assert!(
        t.contains("\n\nStage 2 of 2, once the sandboxes are off the proxy-only network:\n- proxy   remove-network  "),
        "{t}"
    );
    assert_eq!(plan.later[0].plan.work().len(), 1, "{t}");
}

#[test]
fn a_sandbox_made_unwired_before_the_setup_is_recreated_in_the_stage_after() {
    // Not enforced: the sandbox is made at once, unwired; once the proxy
    // is set up and started, it is recreated wired.
    let d = desired(
        &format!("{DOCKER_PROXY}  enforce_on_docker: false\n"),
        Egress::NotSetUp {
            missing: "ca.crt".to_string(),
        },
    );
    let plan = staged(&d, ProxyObserved::default());
    let work: Vec<Vec<(String, &str)>> = plan
        .plans()
        .map(|p| p.work().into_iter().map(|(_, t, v)| (t, v)).collect())
        .collect();
    let sandbox = "sandbox default/default".to_string();
    assert_eq!(
        work,
        [
            vec![("proxy".to_string(), "setup"), (sandbox.clone(), "create")],
            vec![("proxy".to_string(), "start"), (sandbox, "recreate")],
        ],
        "{plan}"
    );
}

#[test]
fn sandboxes_made_on_demand_leave_the_network_by_their_removal_then_it_goes() {
    use hermes_model::observed::{ContainerState, ObservedContainer};
    use hermes_model::sandbox::{
        LABEL_AGENT, LABEL_PROFILE, LABEL_SESSION, LABEL_SPEC_HASH, LABEL_TASK,
    };
    let d = desired(DOCKER_PROXY, on());
    let sandbox = |id: &str, task: &str, session: Option<&str>, processes: u32| {
        let mut labels: std::collections::BTreeMap<String, String> = [
            (LABEL_AGENT, "1"),
            (LABEL_PROFILE, "default"),
            (LABEL_TASK, task),
            (LABEL_SPEC_HASH, "0123456789ab"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut name = format!("hermes-default-{task}");
        if let Some(s) = session {
            labels.insert(LABEL_SESSION.to_string(), s.to_string());
            name = format!("{name}-{s}");
        }
        ObservedContainer {
            id: id.to_string(),
            name,
            labels,
            state: ContainerState::Running,
            created: NOW as i64 - 60,
            started_at: Some(NOW as i64 - 60),
            processes: Some(processes),
            ..ObservedContainer::default()
        }
    };
    let mut proxy = healthy();
    proxy.network = network(3);
    let observed = Observed {
        proxy: proxy.clone(),
        containers: vec![
            sandbox("c1", "default", None, 0),
            sandbox("c2", "other", None, 0),
            sandbox("c3", "default", Some("s1"), 0),
        ],
        ..Observed::default()
    };
    let plan = crate::plan_stages(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW));
    let t = plan.to_string();
    // The warm sandbox is recreated off it, the others removed (the next
    // exec makes them anew), and then the network goes.
    assert!(
        t.contains("- sandbox default/other        remove      on the proxy-only network hermes-egress-0a1b2c3d, which goes (proxy.enforce_network is off); the next exec makes it anew off it; files outside /workspace and /root are lost\n"),
        "{t}"
    );
    assert!(
        t.contains("- sandbox default/default@s1   remove      on the proxy-only network hermes-egress-0a1b2c3d, which goes (proxy.enforce_network is off); the next exec makes it anew off it; every file in it is lost\n"),
        "{t}"
    );
    assert!(t.contains("~ sandbox default/default "), "{t}");
    assert!(
        t.contains("\n\nStage 2 of 2, once the sandboxes are off the proxy-only network:\n- proxy   remove-network  "),
        "{t}"
    );
    // A busy one is kept: the network waits for it, and no removal of the
    // network is promised.
    let busy = Observed {
        proxy,
        containers: vec![
            sandbox("c1", "default", None, 0),
            sandbox("c2", "other", None, 2),
        ],
        ..Observed::default()
    };
    let plan = crate::plan_stages(&d, &busy, UNIX_EPOCH + Duration::from_secs(NOW));
    let t = plan.to_string();
    assert!(!t.contains("sandbox default/other"), "{t}");
    assert!(!t.contains("remove-network"), "{t}");
    assert!(t.contains("network-in-use"), "{t}");
    // The network wanted: nothing leaves it.
    let enforced = desired(&format!("{DOCKER_PROXY}  enforce_network: true\n"), on());
    let plan = crate::plan_all(&enforced, &observed, UNIX_EPOCH + Duration::from_secs(NOW));
    assert!(!plan.to_string().contains("proxy-only network"), "{plan}");
}

/// A running container of `key`'s sandbox as `d` would make it, but with
/// egress label `egress`.
fn made_with_egress(
    d: &Desired,
    key: hermes_model::sandbox::SandboxKey,
    egress: Option<&str>,
) -> hermes_model::observed::ObservedContainer {
    let spec = d.sandbox(key);
    let mut labels = spec.labels.clone();
    match egress {
        Some(e) => labels.insert(
            hermes_model::sandbox::LABEL_EGRESS.to_string(),
            e.to_string(),
        ),
        None => labels.remove(hermes_model::sandbox::LABEL_EGRESS),
    };
    labels.insert(
        hermes_model::sandbox::LABEL_SPEC_HASH.to_string(),
        "0123456789ab".to_string(),
    );
    hermes_model::observed::ObservedContainer {
        id: "s1".to_string(),
        name: spec.name.clone(),
        labels,
        state: hermes_model::observed::ContainerState::Running,
        created: 0,
        started_at: Some(0),
        finished_at: None,
        processes: Some(1),
        made_by_agent: None,
        adopted_hash: None,
    }
}

#[test]
fn a_session_sandbox_made_before_the_proxy_is_recreated_with_its_wiring() {
    use hermes_model::sandbox::SandboxKey;
    let d = desired(
        "terminal:\n  backend: docker\n  container_persistent: false\nproxy:\n  enabled: true\n",
        on(),
    );
    let key = SandboxKey::session("default", "default", "s1");
    let plan = |egress: Option<&str>| {
        let observed = Observed {
            proxy: healthy(),
            containers: vec![made_with_egress(&d, key.clone(), egress)],
            ..Observed::default()
        };
        crate::plan_all(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW)).to_string()
    };
    assert_eq!(
        plan(Some("off")),
        "~ sandbox default/default@s1   recreate    egress wiring changed: made before the egress proxy was on; stops 1 running process; every file in it is lost\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    assert!(plan(None).contains("made before the egress proxy was on"));
    assert!(plan(Some("0badc0ffee00")).contains("wired to other egress proxy settings"));
    // Wired as now: nothing to do.
    let wired = d.sandbox(key.clone());
    let now = wired.labels[hermes_model::sandbox::LABEL_EGRESS].clone();
    assert_eq!(plan(Some(&now)), "No changes. The host is converged.");
    // While the proxy awaits its setup, the setup comes first.
    let pending = desired(
        "terminal:\n  backend: docker\n  container_persistent: false\nproxy:\n  enabled: true\n",
        Egress::NotSetUp {
            missing: "the CA".to_string(),
        },
    );
    let observed = Observed {
        containers: vec![made_with_egress(&pending, key, Some("off"))],
        ..Observed::default()
    };
    let text =
        crate::plan_all(&pending, &observed, UNIX_EPOCH + Duration::from_secs(NOW)).to_string();
    assert!(!text.contains("recreate"), "{text}");
}

#[test]
fn a_setup_that_keeps_the_wiring_plans_no_recreate_in_any_stage() {
    let Egress::On { wiring, .. } = on() else {
        unreachable!()
    };
    let wired = desired(DOCKER_PROXY, on());
    let made = made_with_egress(
        &wired,
        hermes_model::sandbox::SandboxKey::persistent("default", "default"),
        Some(&wired.sandboxes[0].labels[hermes_model::sandbox::LABEL_EGRESS]),
    );
    let mut made = made;
    made.labels.insert(
        hermes_model::sandbox::LABEL_SPEC_HASH.to_string(),
        wired.sandboxes[0].hash().to_string(),
    );
    made.processes = Some(0);
    // The proxy's config is out of date: a setup is due, which keeps the
    // CA, the tokens and the address.
    let mut d = Desired::build(
        load(DOCKER_PROXY).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    d.egress_after_setup = Some(wiring);
    d.set_egress(Egress::NotSetUp {
        missing: "config.json is older than config.yaml's proxy section".to_string(),
    });
    let observed = Observed {
        proxy: healthy(),
        containers: vec![made],
        ..Observed::default()
    };
    let text = crate::plan_stages(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW)).to_string();
    assert!(text.contains("setup"), "{text}");
    assert!(!text.contains("recreate"), "{text}");
    assert!(!text.contains("known after setup"), "{text}");
}

#[test]
fn keys_that_differ_from_the_running_proxy_s_are_reloaded_saying_which() {
    use hermes_model::egress::KeyState;
    let key = |loaded: bool, digest: Option<&str>| KeyState {
        loaded,
        digest: digest.map(str::to_string),
    };
    let mut d = desired(DOCKER_PROXY, on());
    d.sandboxes.clear();
    d.egress_keys = Some(
        [
            ("anthropic".to_string(), key(true, Some("a2"))),
            ("openai".to_string(), key(true, Some("o1"))),
            ("gemini".to_string(), key(false, None)),
            ("gcp".to_string(), key(true, None)),
        ]
        .into(),
    );
    let mut proxy = healthy();
    proxy.keys = Some(
        [
            ("anthropic".to_string(), key(true, Some("a1"))),
            ("openai".to_string(), key(false, None)),
            ("gemini".to_string(), key(true, Some("g1"))),
            ("gcp".to_string(), key(true, None)),
        ]
        .into(),
    );
    assert_eq!(
        text(&d, proxy.clone()),
        "~ proxy   reload      keys: 1 added (openai), 1 changed (anthropic), 1 removed (gemini)\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    // Held as wanted, or not known on one side: nothing to do.
    proxy.keys = d.egress_keys.clone();
    assert_eq!(
        text(&d, proxy.clone()),
        "No changes. The host is converged."
    );
    proxy.keys = None;
    assert_eq!(text(&d, proxy), "No changes. The host is converged.");
}
