#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use hermes_model::config::load;
use hermes_model::desired::HostEnv;
use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_SPEC_HASH, LABEL_TASK};

use super::*;

const NOW: i64 = 1_800_000_000;

fn desired(text: &str) -> Desired {
    Desired::build(
        load(text).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap()
}

fn docker() -> Desired {
    desired("terminal:\n  backend: docker\n")
}

fn container(id: &str, state: ContainerState, hash: Option<&str>) -> ObservedContainer {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_AGENT.to_string(), "1".to_string());
    labels.insert(LABEL_PROFILE.to_string(), "default".to_string());
    labels.insert(LABEL_TASK.to_string(), "default".to_string());
    if let Some(h) = hash {
        labels.insert(LABEL_SPEC_HASH.to_string(), h.to_string());
    }
    ObservedContainer {
        id: id.to_string(),
        name: "hermes-default-default".to_string(),
        labels,
        state,
        created: NOW - 3600,
        started_at: (state == ContainerState::Running).then_some(NOW - 1800),
        finished_at: (state == ContainerState::Exited).then_some(NOW - 14 * 60),
        processes: (state == ContainerState::Running).then_some(0),
        made_by_agent: None,
        adopted_hash: None,
    }
}

fn render(d: &Desired, containers: Vec<ObservedContainer>) -> String {
    crate::plan_all(
        d,
        &Observed {
            containers,
            ..Observed::default()
        },
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64),
    )
    .to_string()
}

#[test]
fn no_container_means_create() {
    assert_eq!(
        render(&docker(), vec![]),
        "+ sandbox default/default   create      no container with these labels\n\
         Plan: 1 to create, 0 to change, 0 to remove."
    );
}

#[test]
fn a_create_says_what_it_costs_the_host_an_image_pull_and_a_disk_image() {
    let mut d = desired("terminal:\n  backend: docker\n  docker_image: img:1\n");
    d.host.disk_images = true;
    let observed = Observed {
        missing_images: ["img:1".to_string()].into(),
        ..Observed::default()
    };
    let plan = crate::plan_all(
        &d,
        &observed,
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64),
    )
    .to_string();
    assert_eq!(
        plan,
        "+ sandbox default/default   create      no container with these labels; pulls image img:1 first (not on this engine); \
         its data on a sparse 50 GiB ext4 image (.default.disk), loop-mounted while it exists\n\
         Plan: 1 to create, 0 to change, 0 to remove."
    );
    // A session sandbox keeps its files on tmpfs: no image.
    let session = d.exec_sandbox("default", Some("s1"));
    let observed = Observed::default();
    assert_eq!(
        create_cause(&d, &observed, &session),
        "no container with these labels"
    );
}

#[test]
fn a_running_container_with_the_same_hash_needs_nothing() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    assert_eq!(
        render(
            &d,
            vec![container("a", ContainerState::Running, Some(&hash))]
        ),
        "No changes. The host is converged."
    );
}

#[test]
fn an_exited_or_created_container_with_the_same_hash_is_started() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    assert_eq!(
        render(
            &d,
            vec![container("a", ContainerState::Exited, Some(&hash))]
        ),
        "~ sandbox default/default   start       exited 14m ago\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    let mut created = container("a", ContainerState::Created, Some(&hash));
    created.created = NOW - 30;
    assert_eq!(
        render(&d, vec![created]),
        "~ sandbox default/default   start       created 30s ago, never started\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
}

#[test]
fn a_changed_hash_recreates_and_says_what_it_costs() {
    let d = docker();
    let new = d.sandboxes[0].hash().to_string();
    let mut c = container("a", ContainerState::Running, Some("0123456789ab"));
    c.processes = Some(2);
    assert_eq!(
        render(&d, vec![c]),
        format!(
            "~ sandbox default/default   recreate    spec changed: 0123456789ab -> {new}; stops 2 running processes; files outside /workspace and /root are lost\n\
             Plan: 0 to create, 1 to change, 0 to remove."
        )
    );
}

/// A running container made from `old`'s spec, as the engine reports it.
fn made_from(old: &Desired) -> ObservedContainer {
    let spec = &old.sandboxes[0];
    let mut c = container("a", ContainerState::Running, Some(spec.hash()));
    c.labels = spec.labels.clone();
    c.processes = Some(1);
    c
}

#[test]
fn a_recreate_names_the_settings_that_changed_old_and_new() {
    let old =
        desired("terminal:\n  backend: docker\n  container_memory: 5120\n  docker_image: a:1\n");
    let new = desired(
        "terminal:\n  backend: docker\n  container_memory: 2048\n  docker_image: b:2\n  docker_volumes:\n    - /srv/data:/data\n",
    );
    assert_eq!(
        render(&new, vec![made_from(&old)]),
        "~ sandbox default/default   recreate    container_memory 5120 MB → 2048 MB, docker_image a:1 → b:2, \
         docker_volumes (none) → /srv/data:/data (forces recreate); stops 1 running process; \
         files outside /workspace, /root and /data are lost\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    let ops = plan(
        &new,
        &Observed {
            containers: vec![made_from(&old)],
            ..Observed::default()
        },
        NOW,
    )
    .ops;
    assert_eq!(
        ops[0].changes,
        [
            Change {
                field: "container_memory".into(),
                old: Some("5120".into()),
                new: Some("2048".into()),
            },
            Change {
                field: "docker_image".into(),
                old: Some("a:1".into()),
                new: Some("b:2".into()),
            },
            Change {
                field: "docker_volumes".into(),
                old: Some(String::new()),
                new: Some("/srv/data:/data".into()),
            },
        ]
    );
}

#[test]
fn an_env_value_change_names_the_variable_never_the_value() {
    let old = desired("terminal:\n  backend: docker\n  docker_env:\n    API_TOKEN: old-sekrit\n");
    let new = desired("terminal:\n  backend: docker\n  docker_env:\n    API_TOKEN: new-sekrit\n");
    let text = render(&new, vec![made_from(&old)]);
    assert!(
        text.contains("recreate    docker_env.API_TOKEN changed (forces recreate)"),
        "{text}"
    );
    assert!(!text.contains("sekrit"), "{text}");
    let ops = plan(
        &new,
        &Observed {
            containers: vec![made_from(&old)],
            ..Observed::default()
        },
        NOW,
    )
    .ops;
    let json = serde_json::to_string(&ops[0].changes).unwrap();
    assert!(!json.contains("sekrit"), "{json}");
    assert!(json.contains("API_TOKEN"), "{json}");
}

#[test]
fn a_container_without_the_settings_label_keeps_the_hash_wording() {
    let old = desired("terminal:\n  backend: docker\n  container_memory: 5120\n");
    let new = desired("terminal:\n  backend: docker\n  container_memory: 2048\n");
    let mut c = made_from(&old);
    c.labels.remove(LABEL_SETTINGS);
    let text = render(&new, vec![c.clone()]);
    assert!(
        text.contains(&format!(
            "spec changed: {} -> {}",
            old.sandboxes[0].hash(),
            new.sandboxes[0].hash()
        )),
        "{text}"
    );
    // An unreadable label is no better than none: no guessed diff.
    c.labels
        .insert(LABEL_SETTINGS.to_string(), "not json".to_string());
    assert!(render(&new, vec![c]).contains("spec changed: "));
}

#[test]
fn duplicates_keep_the_running_one_started_last() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    let mut older = container("old", ContainerState::Running, Some(&hash));
    older.started_at = Some(NOW - 7200);
    older.name = "hermes-default-default-x".into();
    let newer = container("new", ContainerState::Running, Some(&hash));
    let mut exited = container("ex", ContainerState::Exited, Some(&hash));
    exited.created = NOW;
    exited.name = "hermes-default-default-y".into();
    let ops = plan(
        &d,
        &Observed {
            containers: vec![older, newer, exited],
            ..Observed::default()
        },
        NOW,
    )
    .ops;
    let removed: Vec<_> = ops
        .iter()
        .filter_map(|op| match &op.action {
            Action::Sandbox(SandboxAction::Remove { id, .. }) => Some(id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(removed, ["old", "ex"]);
    assert_eq!(ops.len(), 2, "the keeper needs nothing: {ops:?}");
    assert!(ops[0].cause.contains(
        "duplicate hermes-default-default-x (running); running hermes-default-default is kept"
    ));
}

#[test]
fn without_a_running_duplicate_the_one_created_last_is_kept() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    let mut a = container("a", ContainerState::Exited, Some(&hash));
    a.created = NOW - 100;
    let mut b = container("b", ContainerState::Exited, Some(&hash));
    b.created = NOW - 50;
    b.name = "other".into();
    let ops = plan(
        &d,
        &Observed {
            containers: vec![a, b],
            ..Observed::default()
        },
        NOW,
    )
    .ops;
    assert!(
        matches!(&ops[0].action, Action::Sandbox(SandboxAction::Remove { id, .. }) if id == "a"),
        "{ops:?}"
    );
    // The keeper has another name than the spec's: it is recreated.
    assert!(
        matches!(&ops[1].action, Action::Sandbox(SandboxAction::Recreate { old_id, .. }) if old_id == "b"),
        "{ops:?}"
    );
}

/// A container as Hermes Agent makes the default task's, with its
/// defaults: its labels, no spec hash, the shared data layout.
fn agent_made(id: &str, image: &str, shm: i64) -> ObservedContainer {
    let mut c = container(id, ContainerState::Running, None);
    c.name = format!("hermes-{id}0000000");
    c.made_by_agent = Some(hermes_model::observed::AgentMade {
        image: image.to_string(),
        nano_cpus: 1_000_000_000,
        memory_bytes: 5120 << 20,
        shm_size_bytes: shm,
        pids_limit: Some(256),
        network_mode: "bridge".to_string(),
        binds: vec![
            "/h/sandboxes/docker/default/home:/root".to_string(),
            "/h/sandboxes/docker/default/workspace:/workspace".to_string(),
        ],
        tmpfs: [
            ("/tmp", "rw,nosuid,size=512m"),
            ("/var/tmp", "rw,noexec,nosuid,size=256m"),
            ("/run", "rw,noexec,nosuid,size=64m"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        env: Vec::new(),
        cap_add: ["DAC_OVERRIDE", "CHOWN", "FOWNER", "SETUID", "SETGID"]
            .iter()
            .map(|c| c.to_string())
            .collect(),
        devices: Vec::new(),
        extra_hosts: Vec::new(),
        init: true,
        user: String::new(),
        entrypoint: Vec::new(),
    });
    c
}

#[test]
fn a_container_hermes_agent_made_on_the_config_s_settings_is_adopted_as_it_is() {
    let d =
        desired("terminal:\n  backend: docker\n  docker_image: img:1\n  docker_shm_size: 64m\n");
    let plan = crate::plan_all(
        &d,
        &Observed {
            containers: vec![agent_made("a", "img:1", 64 << 20)],
            ..Observed::default()
        },
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64),
    );
    assert_eq!(
        plan.to_string(),
        "~ sandbox default/default   adopt       container hermes-a0000000 made by Hermes Agent has the config's settings: managed as it is\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    let ops = plan_all_ops(&d, vec![agent_made("a", "img:1", 64 << 20)]);
    assert!(
        matches!(&ops[0].action, Action::Sandbox(SandboxAction::Adopt { id, spec }) if id == "a" && spec.hash() == d.sandboxes[0].hash()),
        "{ops:?}"
    );
}

#[test]
fn a_container_hermes_agent_made_otherwise_is_recreated_keeping_its_data() {
    let d = desired("terminal:\n  backend: docker\n  docker_image: img:2\n");
    assert_eq!(
        render(&d, vec![agent_made("a", "img:1", 64 << 20)]),
        "~ sandbox default/default   recreate    container hermes-a0000000 made by Hermes Agent: docker_image img:1 → img:2, docker_shm_size 64 MiB → 1 GiB (forces recreate; its binds of /workspace and /root are the task's data and are kept); no command running; files outside /workspace and /root are lost\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
}

#[test]
fn beside_hermes_s_own_the_agent_s_idle_container_goes_and_a_busy_one_waits() {
    let d = docker();
    let ours = container("h", ContainerState::Running, Some(d.sandboxes[0].hash()));
    let mut busy = agent_made("b", "img:1", 64 << 20);
    busy.processes = Some(2);
    let idle = agent_made("i", "img:1", 64 << 20);
    let text = render(&d, vec![ours, busy, idle]);
    assert!(
        text.contains("- sandbox default/default   remove      duplicate hermes-i0000000 (running) made by Hermes Agent; hermes-default-default is kept, on the same data"),
        "{text}"
    );
    assert!(
        text.contains("? sandbox default/default   busy        duplicate hermes-b0000000 made by Hermes Agent runs a command; removed once it is idle (hermes-default-default is kept)"),
        "{text}"
    );
    assert!(
        text.ends_with("Plan: 0 to create, 0 to change, 1 to remove."),
        "{text}"
    );
}

#[test]
fn the_agent_s_container_with_its_workspace_elsewhere_blocks_the_sandbox() {
    let d = docker();
    let mut c = agent_made("a", "img:1", 64 << 20);
    if let Some(m) = c.made_by_agent.as_mut() {
        m.binds = vec!["/elsewhere/docker/default/workspace:/workspace".to_string()];
    }
    let text = render(&d, vec![c]);
    assert!(
        text.starts_with("! sandbox default/default   blocked     container hermes-a0000000 made by Hermes Agent binds /workspace from /elsewhere/docker/default/workspace, not from /h/sandboxes/docker/default/workspace"),
        "{text}"
    );
}

#[test]
fn data_in_the_earlier_layout_moves_with_the_recreate_and_is_never_merged() {
    let d = docker();
    let data = hermes_model::migration::DataMove::of(
        Path::new("/h"),
        Path::new("/h/sandboxes"),
        "default",
        "default",
    )
    .unwrap();
    let old = container("o", ContainerState::Running, Some("0123456789ab"));
    let observed = |new_has_files| Observed {
        containers: vec![old.clone()],
        legacy: vec![hermes_model::migration::LegacyData {
            data: data.clone(),
            new_has_files,
            has_image: false,
        }],
        ..Observed::default()
    };
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64);
    let text = crate::plan_all(&d, &observed(false), at).to_string();
    assert_eq!(
        text,
        "~ sandbox default/default   migrate     its files move (renamed, never copied) from /h/sandboxes/docker/default/default to /h/sandboxes/docker/default, the layout Hermes Agent shares; no command running; files outside /workspace and /root are lost\n\
         Plan: 0 to create, 1 to change, 0 to remove."
    );
    let text = crate::plan_all(&d, &observed(true), at).to_string();
    assert!(
        text.starts_with("! sandbox default/default   blocked     the task's files are in /h/sandboxes/docker/default/default (hermes's earlier layout) and in /h/sandboxes/docker/default"),
        "{text}"
    );
}

fn plan_all_ops(d: &Desired, containers: Vec<ObservedContainer>) -> Vec<Op<Action>> {
    plan(
        d,
        &Observed {
            containers,
            ..Observed::default()
        },
        NOW,
    )
    .ops
}

#[test]
fn other_profiles_are_not_touched() {
    let d = docker();
    let mut c = container("a", ContainerState::Exited, Some("0123456789ab"));
    c.labels
        .insert(LABEL_PROFILE.to_string(), "work".to_string());
    assert_eq!(
        render(&d, vec![c]),
        "+ sandbox default/default   create      no container with these labels\n\
         Plan: 1 to create, 0 to change, 0 to remove."
    );
}

#[test]
fn a_dead_container_is_recreated() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    let ops = plan(
        &d,
        &Observed {
            containers: vec![container("a", ContainerState::Dead, Some(&hash))],
            ..Observed::default()
        },
        NOW,
    )
    .ops;
    assert!(matches!(
        ops[0].action,
        Action::Sandbox(SandboxAction::Recreate { .. })
    ));
}

#[test]
fn a_container_stuck_in_created_is_recreated_after_a_minute() {
    let d = docker();
    let hash = d.sandboxes[0].hash().to_string();
    let at = |created_ago: i64| {
        let mut c = container("a", ContainerState::Created, Some(&hash));
        c.created = NOW - created_ago;
        plan(
            &d,
            &Observed {
                containers: vec![c],
                ..Observed::default()
            },
            NOW,
        )
        .ops
    };
    assert!(matches!(
        at(59)[0].action,
        Action::Sandbox(SandboxAction::Start { .. })
    ));
    assert!(matches!(
        at(60)[0].action,
        Action::Sandbox(SandboxAction::Start { .. })
    ));
    let ops = at(61);
    assert!(
        matches!(
            ops[0].action,
            Action::Sandbox(SandboxAction::Recreate { .. })
        ),
        "{ops:?}"
    );
    assert_eq!(
        ops[0].cause,
        "stuck in created for 1m1s (> 1m): a start that failed"
    );
}

/// A container named as the default sandbox but labelled for another task.
fn holder(state: ContainerState, hash: Option<&str>) -> ObservedContainer {
    let mut c = container("h", state, hash);
    c.labels.insert(LABEL_TASK.to_string(), "other".to_string());
    c
}

#[test]
fn a_holder_of_the_name_on_its_way_out_is_removed_before_the_create() {
    let d = docker();
    for state in [
        ContainerState::Exited,
        ContainerState::Dead,
        ContainerState::Removing,
    ] {
        let text = render(&d, vec![holder(state, Some("000000000000"))]);
        assert_eq!(
            text,
            format!(
                "+ sandbox default/default   create      no container with these labels\n\
                 - sandbox default/default   remove      container hermes-default-default ({}, task other) holds the name; removed before the create\n\
                 Plan: 1 to create, 0 to change, 1 to remove.",
                state.as_str()
            )
        );
    }
    // A create left stale too; a fresh one may still be starting.
    let mut stale = holder(ContainerState::Created, Some("000000000000"));
    assert!(
        render(&d, vec![stale.clone()])
            .contains("remove      container hermes-default-default (created, task other)")
    );
    stale.created = NOW - 5;
    assert!(render(&d, vec![stale]).starts_with("! sandbox default/default   blocked"));
}

#[test]
fn a_running_or_unmanaged_holder_of_the_name_blocks_the_sandbox() {
    let d = docker();
    assert_eq!(
        render(
            &d,
            vec![holder(ContainerState::Running, Some("000000000000"))]
        ),
        "! sandbox default/default   blocked     container hermes-default-default (running, task other) holds the name; remove it by hand\n\
         Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
    );
    let text = render(&d, vec![holder(ContainerState::Dead, None)]);
    assert!(
        text.starts_with("! sandbox default/default   blocked     container hermes-default-default (dead, task other) holds the name; remove it by hand\n"),
        "{text}"
    );
    assert!(!text.contains("remove      "), "{text}");
}

#[test]
fn a_runtime_the_engine_lacks_blocks_the_sandbox_and_says_how_to_register_it() {
    let d = desired("terminal:\n  backend: docker\n  docker_runtime: runsc\n");
    assert_eq!(d.sandboxes[0].runtime.as_deref(), Some("runsc"));
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64);
    let observed = |runtimes: &[&str]| Observed {
        runtimes: Some(runtimes.iter().map(|r| r.to_string()).collect()),
        ..Observed::default()
    };
    let plan = crate::plan_all(&d, &observed(&["runc"]), now).to_string();
    assert!(
        plan.contains("blocked     the Docker engine has no runtime runsc (it has: runc); register it in /etc/docker/daemon.json"),
        "{plan}"
    );
    let plan = crate::plan_all(&d, &observed(&["runc", "runsc"]), now).to_string();
    assert!(plan.contains("+ sandbox default/default"), "{plan}");
    assert!(!plan.contains("blocked"), "{plan}");
    // runc, the default, is the spec of before the key: nothing recreated.
    let runc = desired("terminal:\n  backend: docker\n  docker_runtime: runc\n");
    assert_eq!(runc.sandboxes[0].runtime, None);
    assert_eq!(runc.sandboxes[0].hash(), docker().sandboxes[0].hash());
    assert_ne!(d.sandboxes[0].hash(), docker().sandboxes[0].hash());
}

#[test]
fn an_exited_gvisor_sandbox_s_start_says_its_root_s_changes_ended_with_it() {
    let d = desired("terminal:\n  backend: docker\n  docker_runtime: runsc\n");
    let spec = &d.sandboxes[0];
    let mut c = container("a", ContainerState::Exited, Some(spec.hash()));
    c.labels.insert(
        LABEL_SETTINGS.to_string(),
        spec.labels[LABEL_SETTINGS].clone(),
    );
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW as u64);
    let observed = Observed {
        containers: vec![c],
        runtimes: Some(["runc", "runsc"].iter().map(|r| r.to_string()).collect()),
        ..Observed::default()
    };
    let plan = crate::plan_all(&d, &observed, now).to_string();
    assert!(
        plan.contains("start       exited 14m ago; under runsc its files outside /workspace and /root ended with it"),
        "{plan}"
    );
}
