//! The warm pool's rules, each with its cause, and what a claimed member
//! is to the other planners.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::action::{Action, SandboxAction};
use hermes_model::config::load;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::{ContainerState, Observed, ObservedContainer, PoolReady};
use hermes_model::plan::{Describe, Target};
use hermes_model::sandbox::SandboxSpec;

const NOW: i64 = 1_800_000_000;

fn desired(terminal: &str) -> Desired {
    let text = format!("terminal:\n  backend: docker\n  container_persistent: false\n{terminal}");
    Desired::build(
        load(&text).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap()
}

/// The container a member's create leaves, running since `started`.
fn member(spec: &SandboxSpec, started: i64) -> ObservedContainer {
    ObservedContainer {
        id: format!("id-{}", spec.name),
        name: spec.name.clone(),
        labels: spec.labels.clone(),
        state: ContainerState::Running,
        created: started,
        started_at: Some(started),
        finished_at: None,
        processes: None,
        made_by_agent: None,
        adopted_hash: None,
    }
}

fn ready(observed: &mut Observed, c: &ObservedContainer) {
    observed.pool_ready.insert(
        c.name.clone(),
        PoolReady {
            id: c.id.clone(),
            started_at: c.started_at.unwrap(),
        },
    );
}

fn plan(desired: &Desired, observed: &Observed) -> Vec<(String, &'static str, String)> {
    let plan = crate::plan_all(
        desired,
        observed,
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    );
    plan.ops
        .iter()
        .map(|op| (op.target.to_string(), op.action.verb(), op.cause.clone()))
        .collect()
}

#[test]
fn an_empty_pool_is_filled_with_members_that_answer_first() {
    let d = desired("  warm_pool: 2\n");
    let ops = crate::plan_all(
        &d,
        &Observed::default(),
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    )
    .ops;
    assert_eq!(ops.len(), 2, "{ops:?}");
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(
            op.target,
            Target::Pool {
                profile: "default".into(),
                task: "default".into()
            }
        );
        let Action::Sandbox(SandboxAction::Warm(spec)) = &op.action else {
            panic!("{op:?}");
        };
        assert_eq!(spec.name, format!("hermes_pool-default-default-{i}"));
        assert_eq!(
            op.cause,
            format!("{}: pool of 2: 0 ready, 2 to make", spec.name)
        );
        // No session's label: the name is what a claim gives it.
        assert!(
            !spec
                .labels
                .contains_key(hermes_model::sandbox::LABEL_SESSION)
        );
        assert_eq!(
            spec.hash(),
            d.pool_member(0).hash(),
            "one hash for every member"
        );
        assert!(spec.runner_dir.as_ref().unwrap().ends_with(&spec.name));
    }
}

#[test]
fn a_full_ready_pool_is_left_alone_and_one_claimed_is_made_again_under_a_free_name() {
    let d = desired("  warm_pool: 2\n");
    let mut o = Observed::default();
    for i in 0..2 {
        let c = member(&d.pool_member(i), NOW - 600);
        ready(&mut o, &c);
        o.containers.push(c);
    }
    assert_eq!(plan(&d, &o), []);
    // Member 0 claimed by session s1: its name is the session's now, its
    // runner's directory still held under the name it was made with.
    o.containers[0].name = "hermes-default-default-s1".into();
    o.pool_names_held
        .insert("hermes_pool-default-default-0".into());
    let ops = plan(&d, &o);
    assert_eq!(
        ops,
        [(
            "pool default/default".to_string(),
            "create",
            "hermes_pool-default-default-2: pool of 2: 1 ready, 1 to make".to_string()
        )]
    );
    let claimed = &o.containers[0];
    assert_eq!(claimed.session(), Some("s1"));
    assert_eq!(claimed.task(), Some("default"));
    assert!(!claimed.is_unclaimed_pool_member());
}

#[test]
fn a_stale_a_stopped_and_a_never_ready_member_are_replaced_and_a_surplus_removed() {
    let old = desired("  warm_pool: 3\n  docker_env:\n    GEN: \"1\"\n");
    let d = desired("  warm_pool: 1\n");
    let mut o = Observed::default();
    let stale = member(&old.pool_member(0), NOW - 600);
    ready(&mut o, &stale);
    let mut stopped = member(&d.pool_member(1), NOW - 600);
    ready(&mut o, &stopped);
    stopped.state = ContainerState::Exited;
    let slow = member(&d.pool_member(2), NOW - 61);
    let young = member(&d.pool_member(3), NOW - 5);
    let good = member(&d.pool_member(4), NOW - 300);
    ready(&mut o, &good);
    o.containers = vec![stale, stopped, slow, young, good];
    let ops = plan(&d, &o);
    let causes: Vec<&str> = ops.iter().map(|(_, _, c)| c.as_str()).collect();
    assert_eq!(ops.len(), 4, "{ops:#?}");
    assert!(ops.iter().all(|(_, verb, _)| *verb == "remove"), "{ops:#?}");
    assert!(
        causes[0].starts_with("hermes_pool-default-default-0: its spec is stale (")
            && causes[0].ends_with("): a member is replaced, never claimed"),
        "{causes:?}"
    );
    assert_eq!(
        causes[1],
        "hermes_pool-default-default-1: exited: a member that is not running is never claimed"
    );
    assert_eq!(
        causes[2],
        "hermes_pool-default-default-2: started 1m1s ago and never answered a command (> 1m): a start that never became ready"
    );
    // One kept: the ready one; the one still starting is the surplus.
    assert_eq!(
        causes[3],
        "hermes_pool-default-default-3: the pool keeps 1 (terminal.warm_pool)"
    );
}

#[test]
fn a_pool_of_zero_removes_its_members_and_the_idle_reaper_never_sees_them() {
    let d = desired("  warm_pool: 1\n  lifetime_seconds: 60\n");
    let mut o = Observed::default();
    let c = member(&d.pool_member(0), NOW - 86_400);
    ready(&mut o, &c);
    o.containers.push(c);
    // Idle a day, far past lifetime_seconds: a member is no session's.
    assert_eq!(plan(&d, &o), []);
    let none = desired("  warm_pool: 0\n");
    assert_eq!(
        plan(&none, &o),
        [(
            "pool default/default".to_string(),
            "remove",
            "hermes_pool-default-default-0: terminal.warm_pool is 0".to_string()
        )]
    );
    // Claimed, it is a session's sandbox, reaped as one.
    o.containers[0].name = "hermes-default-default-s9".into();
    o.containers[0].processes = Some(0);
    o.pool_names_held
        .insert("hermes_pool-default-default-0".into());
    let ops = plan(&d, &o);
    assert_eq!(ops.len(), 2, "{ops:#?}");
    assert!(
        ops.iter()
            .any(|(t, verb, _)| t == "pool default/default" && *verb == "create")
    );
    assert!(
        ops.iter()
            .any(|(t, verb, cause)| t == "sandbox default/default@s9"
                && *verb == "remove"
                && cause.starts_with("idle ")),
        "{ops:#?}"
    );
}

#[test]
fn members_wait_for_the_proxy_as_every_sandbox_does() {
    let mut d = desired("  warm_pool: 1\nproxy:\n  enabled: true\n");
    d.set_egress(hermes_model::desired::Egress::NotSetUp {
        missing: "ca.crt".to_string(),
    });
    let ops = plan(&d, &Observed::default());
    assert!(
        ops.iter()
            .any(|(t, verb, _)| t == "pool default/default" && *verb == "blocked"),
        "{ops:#?}"
    );
}

#[test]
fn a_claimed_member_is_found_by_its_session_and_only_then() {
    let d = desired("  warm_pool: 1\n");
    let mut c = member(&d.pool_member(0), NOW);
    assert_eq!(c.session(), None);
    assert!(c.is_unclaimed_pool_member());
    c.name = "hermes-default-default-a.b-c".into();
    assert_eq!(c.claimed_by(), Some("a.b-c"));
    // Renamed to anything else, it is no session's.
    c.name = "elsewhere".into();
    assert_eq!(c.claimed_by(), None);
    let mut labels = BTreeMap::new();
    labels.insert("hermes-pool".to_string(), "x".to_string());
    let other = ObservedContainer {
        name: "x".into(),
        labels,
        ..ObservedContainer::default()
    };
    assert!(other.claimed_by().is_none());
}

#[test]
fn down_removes_the_members_under_the_pool_s_name() {
    let d = desired("  warm_pool: 1\n");
    let o = Observed {
        containers: vec![member(&d.pool_member(0), NOW)],
        ..Observed::default()
    };
    let plan = crate::down::plan(&o, Vec::new());
    let text = plan.to_string();
    assert!(
        text.contains("- pool default/default   remove      hermes down: hermes_pool-default-default-0 (running), a warm-pool member no session claimed"),
        "{text}"
    );
}
