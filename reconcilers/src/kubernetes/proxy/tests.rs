//! The cluster proxy's planner: what a pass plans of the proxy's objects,
//! and when sandbox Pods wait for it.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::config::load;
use hermes_model::desired::{Desired, Egress, HostEnv};
use hermes_model::egress::EgressWiring;
use hermes_model::kubernetes::proxy::{ProxyObject, SeenObject, SeenProxy};
use hermes_model::kubernetes::{KubeObserved, SandboxKind};
use hermes_model::observed::Observed;
use hermes_model::plan::{Describe, Kind, Op, Target};

const CONFIG: &str = "terminal:\n  backend: kubernetes\n  kubernetes_proxy_image: hermes:1\nproxy:\n  enabled: true\n";

const HOME: &str = "0a1b2c3d4e5f6071";

fn desired(config: &str) -> Desired {
    let mut d = Desired::build(
        load(config).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    d.set_home_id(HOME.to_string());
    d.set_egress(Egress::On {
        wiring: EgressWiring {
            gateway: "172.17.0.1".parse().unwrap(),
            tunnel_port: 3128,
            ca_host_path: PathBuf::from("/h/proxy/ca.crt"),
            ca_sha256: "ab".repeat(32),
            tokens: vec![("OPENAI_API_KEY".into(), "openai-tok".into())],
            network: None,
            gcp_adc_host_path: None,
            env_dir_host_path: None,
        },
        settings: "5e771265abcd".to_string(),
    });
    d
}

/// Every object of the wanted proxy as its apply leaves it; the Pod
/// `ready` or not.
fn all_there(d: &Desired, ready: bool) -> SeenProxy {
    let w = d.kube_proxy().unwrap();
    SeenProxy {
        objects: ProxyObject::ALL
            .into_iter()
            .map(|o| {
                (
                    o,
                    SeenObject {
                        name: w.object_name(o),
                        uid: format!("uid-{o:?}"),
                        hash: Some(w.hash(o)),
                        made_by_hermes: true,
                        phase: "Running".into(),
                        ready,
                        waiting: (!ready).then(|| "ErrImagePull: not present".to_string()),
                        ..SeenObject::default()
                    },
                )
            })
            .collect(),
    }
}

fn observed(proxy: SeenProxy) -> Observed {
    Observed {
        kubernetes: Some(KubeObserved::Seen {
            kind: SandboxKind::Pod,
            pods: vec![],
            claims: vec![],
            sandboxes: vec![],
            proxy,
        }),
        ..Observed::default()
    }
}

/// The plan's rows, less the persistent sandbox's claim (made whether or
/// not the proxy is up: it runs nothing).
fn rows(ops: &[Op<hermes_model::action::Action>]) -> Vec<String> {
    ops.iter()
        .filter(|op| op.action.verb() != "create-claim")
        .map(|op| format!("{} {} | {}", op.target, op.action.verb(), op.cause))
        .collect()
}

#[test]
fn a_missing_proxy_is_made_object_by_object_then_the_sandbox_in_the_next_stage() {
    let d = desired(CONFIG);
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let staged = crate::plan_stages(&d, &observed(SeenProxy::default()), now);
    let first = rows(&staged.first.ops);
    let ns = "hermes";
    let made = [
        format!("proxy create | no Secret {ns}/hermes-proxy-{HOME}"),
        format!("proxy create | no ConfigMap {ns}/hermes-proxy-ca-{HOME}"),
        format!("proxy create | no Service {ns}/hermes-proxy-{HOME}"),
        format!("proxy create | no NetworkPolicy {ns}/hermes-sandboxes-{HOME}"),
        format!("proxy create | no NetworkPolicy {ns}/hermes-proxy-{HOME}"),
        format!(
            "proxy create | no Pod {ns}/hermes-proxy-{HOME}; waited for until Ready (120 s at most)"
        ),
    ];
    assert_eq!(first[..6], made, "{first:#?}");
    assert!(first.len() > 6, "{first:#?}");
    for row in &first[6..] {
        assert!(
            row.starts_with(&format!(
                "kubernetes default/default blocked | the egress proxy Pod {ns}/hermes-proxy-{HOME} is not Ready on the current settings until this plan's proxy operations are done (fail closed)"
            )),
            "{first:#?}"
        );
    }
    assert_eq!(staged.later.len(), 1, "{staged:#?}");
    let stage = &staged.later[0];
    assert_eq!(
        stage.after,
        format!("the egress proxy Pod {ns}/hermes-proxy-{HOME} is Ready")
    );
    let later = rows(&stage.plan.ops);
    let pod = &d.pods[0].name;
    assert_eq!(
        later,
        [format!(
            "kubernetes default/default create | no Pod {ns}/{pod}; its claim is made first"
        )],
        "{later:#?}"
    );
    // The sandbox is wired to the proxy by its Service's name.
    assert!(
        d.pods[0].env.contains(&(
            "HTTPS_PROXY".into(),
            format!("http://hermes-proxy-{HOME}:3128")
        )),
        "{:?}",
        d.pods[0].env
    );
}

#[test]
fn a_proxy_pod_that_is_not_ready_blocks_every_sandbox_with_why() {
    let d = desired(CONFIG);
    let ops = crate::kubernetes::plan(&d, &observed(all_there(&d, false)));
    let rows = rows(&ops);
    assert!(!rows.is_empty());
    for row in &rows {
        assert!(
            row.contains(&format!("blocked | the egress proxy Pod hermes/hermes-proxy-{HOME} is not Ready (Running: ErrImagePull: not present) (fail closed); wanted: create")),
            "{rows:#?}"
        );
    }
    // Ready: the sandbox is made, the proxy left alone.
    let ops = crate::kubernetes::plan(&d, &observed(all_there(&d, true)));
    assert!(!ops.is_empty());
    assert!(ops.iter().all(|op| op.target != Target::Proxy));
    assert!(ops.iter().all(|op| op.action.kind() == Kind::Create));
}

#[test]
fn new_keys_update_the_secret_and_replace_the_proxy_pod_only() {
    let d = desired(CONFIG);
    let w = d.kube_proxy().unwrap();
    let mut seen = all_there(&d, true);
    for (o, s) in &mut seen.objects {
        if matches!(o, ProxyObject::Secret | ProxyObject::Pod) {
            s.hash = Some("old".into());
        }
    }
    assert_eq!(
        rows(&super::plan(&d, &seen)),
        [
            format!(
                "proxy update | Secret hermes/hermes-proxy-{HOME} was made with other settings (old -> {})",
                w.hash(ProxyObject::Secret)
            ),
            format!(
                "proxy replace | Pod hermes/hermes-proxy-{HOME} was made with other settings (old -> {}); waited for until Ready (120 s at most)",
                w.hash(ProxyObject::Pod)
            ),
        ]
    );
    // An ended Pod is made again.
    let mut seen = all_there(&d, true);
    seen.objects[5].1.phase = "Failed".into();
    assert_eq!(
        rows(&super::plan(&d, &seen)),
        [format!(
            "proxy replace | Pod hermes/hermes-proxy-{HOME} ended (Failed); waited for until Ready (120 s at most)"
        )]
    );
}

#[test]
fn an_object_hermes_did_not_make_is_left_alone_and_no_sandbox_runs() {
    let d = desired(CONFIG);
    let mut seen = all_there(&d, true);
    seen.objects[2].1.made_by_hermes = false;
    let rows = rows(&crate::kubernetes::plan(&d, &observed(seen)));
    assert!(
        rows[0].starts_with(&format!(
            "proxy blocked | a Service hermes/hermes-proxy-{HOME} that hermes did not make"
        )),
        "{rows:#?}"
    );
    assert!(rows.len() > 1, "{rows:#?}");
    assert!(
        rows[1..]
            .iter()
            .all(|r| r.contains(" blocked | egress proxy: a Service")),
        "{rows:#?}"
    );
}

#[test]
fn without_an_image_or_a_setup_the_sandboxes_wait_and_say_why() {
    let d = desired(&CONFIG.replace("  kubernetes_proxy_image: hermes:1\n", ""));
    let first = rows(&crate::kubernetes::plan(
        &d,
        &observed(SeenProxy::default()),
    ));
    assert!(
        first[0].starts_with("proxy blocked | terminal.kubernetes_proxy_image is not set"),
        "{first:#?}"
    );
    let mut d = desired(CONFIG);
    d.set_egress(Egress::NotSetUp {
        missing: "ca.crt".into(),
    });
    let second = rows(&crate::kubernetes::plan(
        &d,
        &observed(SeenProxy::default()),
    ));
    assert!(!second.is_empty());
    assert!(
        second
            .iter()
            .all(|r| r.contains("blocked | the egress proxy is not set up (ca.crt) (fail closed)")),
        "{second:#?}"
    );
    // Unwired: a Pod made now would hold no proxy variables.
    assert!(d.pods[0].env.is_empty());
}

#[test]
fn a_disabled_proxy_loses_every_object_hermes_made() {
    let on = desired(CONFIG);
    let mut seen = all_there(&on, true);
    seen.objects[0].1.made_by_hermes = false;
    let off = desired(&CONFIG.replace("enabled: true", "enabled: false"));
    let rows = rows(&super::plan(&off, &seen));
    assert_eq!(rows.len(), 5, "{rows:#?}");
    assert!(
        rows.iter()
            .all(|r| r.starts_with("proxy delete | the egress proxy is disabled")),
        "{rows:#?}"
    );
}
