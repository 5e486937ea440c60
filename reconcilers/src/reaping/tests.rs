//! Every reaping rule walked across its boundary (just before, at, just
//! after), with the exact cause text.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::config::load;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::{ContainerState, Observed, ObservedContainer};
use hermes_model::sandbox::{
    LABEL_AGENT, LABEL_PROFILE, LABEL_SESSION, LABEL_SPEC_HASH, LABEL_TASK,
};

use crate::HostPlan;

const NOW: i64 = 1_800_000_000;
const CONVERGED: &str = "No changes. The host is converged.";

fn desired(terminal: &str) -> Desired {
    let text = format!("terminal:\n  backend: docker\n{terminal}");
    Desired::build(
        load(&text).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap()
}

/// A managed container of task `task` (and `session`), running and idle
/// unless changed.
fn sandbox(task: &str, session: Option<&str>) -> ObservedContainer {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_AGENT.to_string(), "1".to_string());
    labels.insert(LABEL_PROFILE.to_string(), "default".to_string());
    labels.insert(LABEL_TASK.to_string(), task.to_string());
    labels.insert(LABEL_SPEC_HASH.to_string(), "0123456789ab".to_string());
    let mut name = format!("hermes-default-{task}");
    if let Some(s) = session {
        labels.insert(LABEL_SESSION.to_string(), s.to_string());
        name = format!("{name}-{s}");
    }
    ObservedContainer {
        id: format!("id-{name}"),
        name,
        labels,
        state: ContainerState::Running,
        created: NOW - 86_400,
        started_at: Some(NOW - 86_400),
        finished_at: None,
        processes: Some(0),
        made_by_agent: None,
        adopted_hash: None,
    }
}

fn plan_with(
    d: &Desired,
    containers: Vec<ObservedContainer>,
    activity: &[(&str, i64)],
) -> HostPlan {
    // Only the reaping rules: no warm sandbox to create.
    let mut d = d.clone();
    d.sandboxes.clear();
    crate::plan_all(
        &d,
        &Observed {
            containers,
            activity: activity.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            ..Observed::default()
        },
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    )
}

fn text(d: &Desired, containers: Vec<ObservedContainer>) -> String {
    plan_with(d, containers, &[]).to_string()
}

/// The plan for one session sandbox last used `idle` seconds ago.
fn session_idle(d: &Desired, idle: i64) -> String {
    plan_with(
        d,
        vec![sandbox("t", Some("s1"))],
        &[("hermes-default-t-s1", NOW - idle)],
    )
    .to_string()
}

#[test]
fn a_session_idle_longer_than_its_lifetime_is_removed() {
    let d = desired("  container_persistent: false\n  lifetime_seconds: 300\n");
    assert_eq!(session_idle(&d, 299), CONVERGED);
    assert_eq!(session_idle(&d, 300), CONVERGED);
    assert_eq!(
        session_idle(&d, 301),
        "- sandbox default/t@s1   remove      idle 5m1s (> 5m, terminal.lifetime_seconds)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn sessions_are_reaped_by_lifetime_whatever_the_persistence() {
    let d = desired("  lifetime_seconds: 300\n");
    assert!(session_idle(&d, 301).contains("idle 5m"));
}

#[test]
fn a_busy_or_unknown_sandbox_is_never_idle() {
    let d = desired("  lifetime_seconds: 60\n");
    let mut busy = sandbox("t", Some("s1"));
    busy.processes = Some(1);
    assert_eq!(text(&d, vec![busy]), CONVERGED);
    let mut unknown = sandbox("t", Some("s1"));
    unknown.processes = None;
    assert_eq!(text(&d, vec![unknown]), CONVERGED);
}

#[test]
fn idleness_counts_from_the_later_of_the_last_exec_and_the_start() {
    let d = desired("  lifetime_seconds: 60\n");
    let mut restarted = sandbox("t", Some("s1"));
    restarted.started_at = Some(NOW - 30);
    assert_eq!(
        plan_with(&d, vec![restarted], &[("hermes-default-t-s1", NOW - 1000)]).to_string(),
        CONVERGED
    );
}

#[test]
fn persistent_sandboxes_are_not_reaped_for_idleness_by_default() {
    let d = desired("  lifetime_seconds: 60\n");
    // Another task's persistent sandbox, idle for a day.
    assert_eq!(text(&d, vec![sandbox("review", None)]), CONVERGED);
}

#[test]
fn persistent_max_idle_seconds_reaps_persistent_sandboxes_across_its_boundary() {
    let d = desired("  persistent_max_idle_seconds: 600\n");
    let at = |idle: i64| {
        plan_with(
            &d,
            vec![sandbox("default", None)],
            &[("hermes-default-default", NOW - idle)],
        )
        .to_string()
    };
    assert_eq!(at(599), CONVERGED);
    assert_eq!(at(600), CONVERGED);
    assert_eq!(
        at(601),
        "- sandbox default/default   remove      idle 10m1s (> 10m, terminal.persistent_max_idle_seconds)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn without_persist_across_processes_the_lifetime_reaps_persistent_sandboxes() {
    let d = desired("  docker_persist_across_processes: false\n  lifetime_seconds: 120\n");
    let at = |idle: i64| {
        plan_with(
            &d,
            vec![sandbox("default", None)],
            &[("hermes-default-default", NOW - idle)],
        )
        .to_string()
    };
    assert_eq!(at(119), CONVERGED);
    assert_eq!(at(120), CONVERGED);
    assert_eq!(
        at(121),
        "- sandbox default/default   remove      idle 2m1s (> 2m, terminal.lifetime_seconds)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn orphans_are_exited_containers_finished_twice_the_lifetime_ago() {
    // lifetime 300 → 600 s.
    let d = desired("  lifetime_seconds: 300\n");
    let at = |finished_ago: i64| {
        let mut c = sandbox("old-task", None);
        c.state = ContainerState::Exited;
        c.processes = None;
        c.finished_at = Some(NOW - finished_ago);
        text(&d, vec![c])
    };
    assert_eq!(at(599), CONVERGED);
    assert_eq!(at(600), CONVERGED);
    assert_eq!(
        at(601),
        "- sandbox default/old-task   remove      orphan: exited 10m1s ago (> 10m)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn the_orphan_limit_has_a_floor_of_two_minutes() {
    let d = desired("  lifetime_seconds: 10\n");
    let at = |finished_ago: i64| {
        let mut c = sandbox("t", Some("s"));
        c.state = ContainerState::Exited;
        c.finished_at = Some(NOW - finished_ago);
        text(&d, vec![c])
    };
    assert_eq!(at(119), CONVERGED);
    assert_eq!(at(120), CONVERGED);
    assert_eq!(
        at(121),
        "- sandbox default/t@s   remove      orphan: exited 2m1s ago (> 2m)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn without_the_orphan_reaper_exited_containers_stay() {
    let d = desired("  docker_orphan_reaper: false\n");
    let mut c = sandbox("old-task", None);
    c.state = ContainerState::Exited;
    c.finished_at = Some(NOW - 86_400);
    assert_eq!(text(&d, vec![c]), CONVERGED);
}

#[test]
fn a_container_stuck_in_created_is_removed_after_a_minute() {
    let d = desired("");
    let at = |created_ago: i64| {
        let mut c = sandbox("t", Some("s"));
        c.state = ContainerState::Created;
        c.started_at = None;
        c.processes = None;
        c.created = NOW - created_ago;
        text(&d, vec![c])
    };
    assert_eq!(at(59), CONVERGED);
    assert_eq!(at(60), CONVERGED);
    assert_eq!(
        at(61),
        "- sandbox default/t@s   remove      stuck in created for 1m1s (> 1m): a start that failed\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn containers_no_longer_desired_are_kept_unless_pruning() {
    let local = Desired::build(
        load("").unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    assert_eq!(
        text(&local, vec![sandbox("default", None)]),
        "? container hermes-default-default   kept        not desired (running), kept; `hermes reconcile --prune` removes it\n\
         No changes. The host is converged."
    );
    let mut pruning = local.clone();
    pruning.config.reconcile.prune = true;
    assert_eq!(
        text(
            &pruning,
            vec![sandbox("default", None), sandbox("t", Some("s"))]
        ),
        "- sandbox default/default   remove      not desired (running); pruned\n\
         - sandbox default/t@s       remove      not desired (running); pruned\n\
         Plan: 0 to create, 0 to change, 2 to remove."
    );
    // Persistent sandboxes are not desired once container_persistent is
    // false; the sessions that replace them are.
    let sessions = desired("  container_persistent: false\n");
    let mut busy_session = sandbox("t", Some("s"));
    busy_session.processes = Some(1);
    assert_eq!(
        text(&sessions, vec![sandbox("default", None), busy_session]),
        "? container hermes-default-default   kept        not desired (running), kept; `hermes reconcile --prune` removes it\n\
         No changes. The host is converged."
    );
}

#[test]
fn a_plan_in_doubt_removes_nothing_and_says_why() {
    let mut d = desired("  lifetime_seconds: 60\n");
    d.config.reconcile.prune = true;
    d.doubt = Some("config.yaml is invalid; the last good config stands".to_string());
    let plan = plan_with(
        &d,
        vec![sandbox("t", Some("s"))],
        &[("hermes-default-t-s", NOW - 3600)],
    );
    assert_eq!(
        plan.to_string(),
        "? sandbox default/t@s   kept        would remove (idle 1h (> 1m, terminal.lifetime_seconds)), but config.yaml is invalid; the last good config stands\n\
         No changes. The host is converged."
    );
}

#[test]
fn other_profiles_and_unlabelled_containers_are_never_touched() {
    let mut d = desired("  lifetime_seconds: 60\n");
    d.config.reconcile.prune = true;
    let mut other = sandbox("t", Some("s"));
    other
        .labels
        .insert(LABEL_PROFILE.to_string(), "work".to_string());
    other.state = ContainerState::Exited;
    other.finished_at = Some(NOW - 86_400);
    let mut unmanaged = sandbox("t", Some("u"));
    unmanaged.labels.remove(LABEL_SPEC_HASH);
    unmanaged.state = ContainerState::Exited;
    unmanaged.finished_at = Some(NOW - 86_400);
    assert_eq!(
        text(&d, vec![other, unmanaged]),
        "? container hermes-default-t-u   unmanaged   no hermes-spec-hash label; left alone\n\
         No changes. The host is converged."
    );
}

#[test]
fn ending_a_session_removes_its_containers_of_every_task_and_nothing_else() {
    let mut other_profile = sandbox("default", Some("s1"));
    other_profile
        .labels
        .insert(LABEL_PROFILE.to_string(), "other".to_string());
    other_profile.id = "id-other".to_string();
    let observed = Observed {
        containers: vec![
            sandbox("default", Some("s1")),
            sandbox("build", Some("s1")),
            sandbox("default", Some("s2")),
            sandbox("default", None),
            other_profile,
        ],
        ..Observed::default()
    };
    let plan = HostPlan::new(super::end_session("default", "s1", &observed));
    assert_eq!(
        plan.to_string(),
        "- sandbox default/build@s1     remove      session s1 ended by hand\n\
         - sandbox default/default@s1   remove      session s1 ended by hand\n\
         Plan: 0 to create, 0 to change, 2 to remove."
    );
    assert!(super::end_session("default", "s3", &observed).is_empty());
}

#[test]
fn ending_a_session_or_pruning_says_what_runs_in_what_goes() {
    let with = |processes: Option<u32>| {
        let mut c = sandbox("default", Some("s1"));
        c.processes = processes;
        c
    };
    let cause = |c: ObservedContainer| {
        let observed = Observed {
            containers: vec![c],
            ..Observed::default()
        };
        super::end_session("default", "s1", &observed)[0]
            .cause
            .clone()
    };
    assert_eq!(cause(with(Some(0))), "session s1 ended by hand");
    assert_eq!(
        cause(with(Some(1))),
        "session s1 ended by hand; waits up to 10s for the 1 process running in it, then stops it"
    );
    assert_eq!(
        cause(with(Some(3))),
        "session s1 ended by hand; waits up to 10s for the 3 processes running in it, then stops them"
    );
    assert_eq!(
        cause(with(None)),
        "session s1 ended by hand; waits up to 10s for what runs in it, then stops it"
    );
    let mut exited = with(Some(2));
    exited.state = ContainerState::Exited;
    assert_eq!(cause(exited), "session s1 ended by hand");
    let mut pruning = Desired::build(
        load("").unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    pruning.config.reconcile.prune = true;
    let mut busy = sandbox("default", None);
    busy.processes = Some(2);
    assert_eq!(
        text(&pruning, vec![busy]),
        "- sandbox default/default   remove      not desired (running); pruned; waits up to 10s for the 2 processes running in it, then stops them\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

/// A container Hermes Agent made for `task`: its three labels only.
fn agents(task: &str) -> ObservedContainer {
    let mut c = sandbox(task, None);
    c.labels.remove(LABEL_SPEC_HASH);
    c.name = "hermes-1a2b3c4d".to_string();
    c.id = format!("id-agent-{task}");
    c
}

#[test]
fn the_agent_s_exited_containers_go_by_its_own_orphan_rule_across_the_boundary() {
    // lifetime 300 → 600 s, as the agent's reaper computes it.
    let d = desired("  lifetime_seconds: 300\n");
    let at = |finished_ago: i64| {
        let mut c = agents("other");
        c.state = ContainerState::Exited;
        c.processes = None;
        c.finished_at = Some(NOW - finished_ago);
        text(&d, vec![c])
    };
    let kept = "? sandbox default/other   unmanaged   made by Hermes Agent for task other (not kept warm here), exited; removed once exited for 10m (2 × terminal.lifetime_seconds)\n\
         No changes. The host is converged.";
    assert_eq!(at(599), kept);
    assert_eq!(at(600), kept);
    assert_eq!(
        at(601),
        "- sandbox default/other   remove      made by Hermes Agent for task other (not kept warm here): exited 10m1s ago (> 10m, the agent's orphan rule: 2 × terminal.lifetime_seconds)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
    // Never started (a `docker run` that failed after its create): the
    // same limit, from its creation.
    let mut created = agents("other");
    created.state = ContainerState::Created;
    created.started_at = None;
    created.processes = None;
    created.created = NOW - 601;
    let plan = text(&d, vec![created]);
    assert!(
        plan.contains("remove      made by Hermes Agent for task other (not kept warm here): created, never started, 10m1s ago (> 10m"),
        "{plan}"
    );
}

#[test]
fn the_agent_s_running_containers_of_other_tasks_are_left_to_it() {
    let d = desired("  lifetime_seconds: 60\n");
    // Idle for a day: the agent's, so not hermes's to reap while it runs.
    assert_eq!(
        plan_with(
            &d,
            vec![agents("other")],
            &[("hermes-1a2b3c4d", NOW - 86_400)]
        )
        .to_string(),
        "? sandbox default/other   unmanaged   made by Hermes Agent for task other (not kept warm here), running; removed once exited for 2m (2 × terminal.lifetime_seconds)\n\
         No changes. The host is converged."
    );
}

#[test]
fn the_agent_s_backend_probe_goes_once_idle_for_the_lifetime_and_never_while_busy() {
    let d = desired("  lifetime_seconds: 300\n");
    let at = |idle: i64| {
        plan_with(
            &d,
            vec![agents("prompt-backend-probe")],
            &[("hermes-1a2b3c4d", NOW - idle)],
        )
        .to_string()
    };
    let kept = "? sandbox default/prompt-backend-probe   unmanaged   Hermes Agent's backend probe, running; removed once idle for 5m (terminal.lifetime_seconds)\n\
         No changes. The host is converged.";
    assert_eq!(at(299), kept);
    assert_eq!(at(300), kept);
    assert_eq!(
        at(301),
        "- sandbox default/prompt-backend-probe   remove      Hermes Agent's backend probe, idle 5m1s (> 5m, terminal.lifetime_seconds)\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
    // A command inside, or an unknown count: kept.
    let mut busy = agents("prompt-backend-probe");
    busy.processes = Some(2);
    assert_eq!(
        plan_with(&d, vec![busy], &[("hermes-1a2b3c4d", NOW - 86_400)]).to_string(),
        "? sandbox default/prompt-backend-probe   busy        Hermes Agent's backend probe runs 2 commands; removed once idle for 5m (terminal.lifetime_seconds)\n\
         No changes. The host is converged."
    );
    let mut unknown = agents("prompt-backend-probe");
    unknown.processes = None;
    assert!(!plan_with(&d, vec![unknown], &[("hermes-1a2b3c4d", NOW - 86_400)]).is_pending());
}

#[test]
fn without_the_orphan_reaper_the_agent_s_containers_stay() {
    let d = desired("  docker_orphan_reaper: false\n  lifetime_seconds: 60\n");
    let mut exited = agents("other");
    exited.state = ContainerState::Exited;
    exited.finished_at = Some(NOW - 86_400);
    let probe = agents("prompt-backend-probe");
    let plan = plan_with(
        &d,
        vec![exited, probe],
        &[("hermes-1a2b3c4d", NOW - 86_400)],
    );
    assert!(!plan.is_pending(), "{plan}");
    assert!(
        plan.to_string()
            .contains("left alone (terminal.docker_orphan_reaper is off)")
    );
}

#[test]
fn a_container_with_agent_labels_and_one_of_hermes_s_own_is_not_the_agent_s() {
    // A session's container whose spec hash label is gone: unmanaged,
    // however old, never reaped as the agent's.
    let d = desired("  lifetime_seconds: 60\n");
    let mut c = sandbox("t", Some("s"));
    c.labels.remove(LABEL_SPEC_HASH);
    c.state = ContainerState::Exited;
    c.finished_at = Some(NOW - 86_400);
    assert!(text(&d, vec![c]).contains("no hermes-spec-hash label; left alone"));
}

#[test]
fn while_the_network_is_enforced_the_agent_s_idle_containers_off_it_go_at_once() {
    use hermes_model::observed::ProxyNetworkObserved;
    let text = "proxy:\n  enabled: true\n  enforce_network: true\nterminal:\n  backend: docker\n  lifetime_seconds: 300\n";
    let mut d = Desired::build(
        load(text).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap();
    d.sandboxes.clear();
    let plan = |c: ObservedContainer, attached: bool| {
        let mut observed = Observed {
            activity: [("hermes-1a2b3c4d".to_string(), NOW - 1)].into(),
            ..Observed::default()
        };
        observed.proxy.network = Some(ProxyNetworkObserved {
            name: "hermes-egress-x".to_string(),
            exists: true,
            attached: if attached {
                vec![c.id.clone()]
            } else {
                Vec::new()
            },
            chain: "HERMES-x".to_string(),
            chain_exists: true,
        });
        observed.containers = vec![c];
        crate::plan_all(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW as u64))
    };
    let off = plan(agents("prompt-backend-probe"), false);
    assert!(
        off.to_string().contains(
            "remove      Hermes Agent's backend probe, idle, off the proxy-only network while proxy.enforce_network is on"
        ),
        "{off}"
    );
    let other = plan(agents("other"), false);
    assert!(
        other
            .to_string()
            .contains("remove      made by Hermes Agent for task other"),
        "{other}"
    );
    let mut busy = agents("other");
    busy.processes = Some(1);
    let busy = plan(busy, false);
    assert!(
        busy.to_string().contains("busy        made by Hermes Agent for task other (not kept warm here) runs 1 command; removed once idle: off the proxy-only network"),
        "{busy}"
    );
    // On the network: the usual rules (the probe used a second ago).
    let on = plan(agents("prompt-backend-probe"), true);
    assert!(!on.to_string().contains("remove "), "{on}");
}

#[test]
fn with_idle_action_stop_an_idle_persistent_sandbox_is_stopped_and_stays_stopped() {
    let d = desired("  lifetime_seconds: 300\n  idle_action: stop\n");
    let idle = |secs: i64| {
        plan_with(
            &d,
            vec![sandbox("t", None)],
            &[("hermes-default-t", NOW - secs)],
        )
        .to_string()
    };
    assert_eq!(idle(300), CONVERGED);
    assert_eq!(
        idle(301),
        "~ sandbox default/t   stop        idle 5m1s (> 5m, terminal.lifetime_seconds); stopped, as terminal.idle_action says: its files stay, the next command starts it\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    // Stopped long ago: no orphan, left for the next command.
    let mut stopped = sandbox("t", None);
    stopped.state = ContainerState::Exited;
    stopped.finished_at = Some(NOW - 86_400);
    assert_eq!(text(&d, vec![stopped]), CONVERGED);
    // A session's files are on tmpfs: it is removed, as before.
    assert!(session_idle(&d, 301).contains("- sandbox default/t@s1   remove"));
}

#[test]
fn with_idle_action_stop_the_warm_sandbox_is_stopped_when_idle_and_never_started_by_a_pass() {
    let d = desired("  lifetime_seconds: 60\n  idle_action: stop\n");
    let warm = d.sandboxes[0].clone();
    let c = |state: ContainerState| ObservedContainer {
        id: "w".into(),
        name: warm.name.clone(),
        labels: warm.labels.clone(),
        state,
        created: NOW - 3_600,
        started_at: Some(NOW - 3_600),
        finished_at: Some(NOW - 60),
        processes: Some(0),
        made_by_agent: None,
        adopted_hash: None,
    };
    let plan = |state| {
        crate::plan_all(
            &d,
            &Observed {
                containers: vec![c(state)],
                activity: [(warm.name.clone(), NOW - 61)].into_iter().collect(),
                ..Observed::default()
            },
            UNIX_EPOCH + Duration::from_secs(NOW as u64),
        )
        .to_string()
    };
    assert!(
        plan(ContainerState::Running).starts_with(
            "~ sandbox default/default   stop        idle 1m1s (> 1m, terminal.lifetime_seconds); stopped"
        ),
        "{}",
        plan(ContainerState::Running)
    );
    assert_eq!(plan(ContainerState::Exited), CONVERGED);
    // Without it, a pass starts a stopped warm sandbox.
    let plain = desired("  lifetime_seconds: 60\n");
    let observed = Observed {
        containers: vec![c(ContainerState::Exited)],
        ..Observed::default()
    };
    assert!(
        crate::plan_all(
            &plain,
            &observed,
            UNIX_EPOCH + Duration::from_secs(NOW as u64)
        )
        .to_string()
        .contains("start"),
    );
}
