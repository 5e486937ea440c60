//! The disk images' releases, each case with its text.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::action::{Action, SandboxAction};
use hermes_model::config::load;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::{ContainerState, MountedDisk, Observed, ObservedContainer};
use hermes_model::sandbox::{LABEL_AGENT, LABEL_PROFILE, LABEL_SPEC_HASH, LABEL_TASK};

const NOW: i64 = 1_800_000_000;

fn desired(config: &str) -> Desired {
    Desired::build(
        load(config).unwrap().config,
        "default",
        Path::new("/h"),
        &HostEnv::default(),
    )
    .unwrap()
}

fn disk(task: &str, users: &[&str], deleted: bool) -> MountedDisk {
    MountedDisk {
        profile: "default".to_string(),
        task: task.to_string(),
        mount_point: PathBuf::from(format!("/h/sandboxes/docker/default/{task}")),
        image: PathBuf::from(format!("/h/sandboxes/docker/default/.{task}.disk")),
        devices: vec!["/dev/loop3".to_string()],
        deleted,
        users: users.iter().map(|u| u.to_string()).collect(),
    }
}

fn container(id: &str, task: &str, state: ContainerState, hash: &str) -> ObservedContainer {
    let labels: BTreeMap<String, String> = [
        (LABEL_AGENT, "1"),
        (LABEL_PROFILE, "default"),
        (LABEL_TASK, task),
        (LABEL_SPEC_HASH, hash),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ObservedContainer {
        id: id.to_string(),
        name: format!("hermes-default-{task}"),
        labels,
        state,
        created: NOW - 7200,
        started_at: Some(NOW - 3600),
        finished_at: (state == ContainerState::Exited).then_some(NOW - 60),
        processes: (state == ContainerState::Running).then_some(0),
        ..ObservedContainer::default()
    }
}

fn plan(d: &Desired, containers: Vec<ObservedContainer>, disks: Vec<MountedDisk>) -> String {
    crate::plan_all(
        d,
        &Observed {
            containers,
            disks,
            ..Observed::default()
        },
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    )
    .to_string()
}

const DOCKER: &str = "terminal:\n  backend: docker\n  container_disk: 64\n";

#[test]
fn an_image_whose_container_is_gone_is_released_and_its_file_kept() {
    let d = desired(DOCKER);
    let warm = d.sandboxes[0].hash().to_string();
    let containers = vec![container("w", "default", ContainerState::Running, &warm)];
    let disks = vec![disk("default", &["w"], false), disk("gone", &[], false)];
    assert_eq!(
        plan(&d, containers, disks),
        "- sandbox default/gone   release-disk  its container is gone; its disk image /h/sandboxes/docker/default/.gone.disk is unmounted from /h/sandboxes/docker/default/gone (/dev/loop3); the image and its files are kept\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
}

#[test]
fn a_deleted_image_says_what_goes_with_it_even_before_a_create() {
    let d = desired(DOCKER);
    // The warm sandbox is to be made: its image, deleted, goes first, and
    // the create makes a new one.
    let t = plan(&d, Vec::new(), vec![disk("default", &[], true)]);
    assert_eq!(
        t,
        "+ sandbox default/default   create      no container with these labels\n\
         - sandbox default/default   release-disk  its container is gone; its disk image /h/sandboxes/docker/default/.default.disk was deleted and is still mounted on /h/sandboxes/docker/default/default (/dev/loop3): unmounted, what it holds is lost with it\n\
         Plan: 1 to create, 0 to change, 1 to remove."
    );
    // Not deleted: kept for the create, which mounts nothing again.
    let t = plan(&d, Vec::new(), vec![disk("default", &[], false)]);
    assert!(!t.contains("release-disk"), "{t}");
}

#[test]
fn an_image_in_use_by_a_container_that_stays_is_never_released() {
    let d = desired(DOCKER);
    let warm = d.sandboxes[0].hash().to_string();
    // Stopped or running, made on demand or warm, recreated or started:
    // its container exists, the image stays.
    for (state, hash) in [
        (ContainerState::Exited, warm.as_str()),
        (ContainerState::Running, warm.as_str()),
        (ContainerState::Running, "0123456789ab"),
        (ContainerState::Created, warm.as_str()),
    ] {
        let t = plan(
            &d,
            vec![container("w", "default", state, hash)],
            vec![disk("default", &["w"], false)],
        );
        assert!(!t.contains("release-disk"), "{state:?}: {t}");
    }
    let t = plan(
        &d,
        vec![container("o", "other", ContainerState::Exited, &warm)],
        vec![disk("other", &["o"], true)],
    );
    assert!(!t.contains("release-disk"), "{t}");
    // Used by a container of something else (a bind from inside it).
    let t = plan(&d, Vec::new(), vec![disk("gone", &["stranger"], false)]);
    assert!(!t.contains("release-disk"), "{t}");
}

#[test]
fn removing_the_last_container_of_a_sandbox_releases_its_image_in_the_same_operation() {
    let d = desired(
        "terminal:\n  backend: docker\n  container_disk: 64\n  container_persistent: false\n",
    );
    let containers = vec![container(
        "o",
        "other",
        ContainerState::Exited,
        "0123456789ab",
    )];
    let observed = Observed {
        containers,
        disks: vec![disk("other", &["o"], false)],
        ..Observed::default()
    };
    let mut pruning = d.clone();
    pruning.config.reconcile.prune = true;
    let plan = crate::plan_all(
        &pruning,
        &observed,
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    );
    assert_eq!(
        plan.to_string(),
        "- sandbox default/other   remove      not desired (exited); pruned; then its disk image /h/sandboxes/docker/default/.other.disk is unmounted from /h/sandboxes/docker/default/other (/dev/loop3); the image and its files are kept\n\
         Plan: 0 to create, 0 to change, 1 to remove."
    );
    assert!(matches!(
        &plan.ops[0].action,
        Action::Sandbox(SandboxAction::Remove { id, disk: Some(disk), .. })
            if id == "o" && disk.task == "other"
    ));
    // Not pruned: the container stays, and so does its image.
    let plan = crate::plan_all(&d, &observed, UNIX_EPOCH + Duration::from_secs(NOW as u64));
    assert!(!plan.to_string().contains("disk image"), "{plan}");
}

#[test]
fn a_duplicate_removed_beside_the_kept_container_leaves_the_image_mounted() {
    let d = desired(DOCKER);
    let warm = d.sandboxes[0].hash().to_string();
    let mut dup = container("dup", "default", ContainerState::Exited, &warm);
    dup.name = "hermes-default-default-next-1".to_string();
    let containers = vec![
        container("w", "default", ContainerState::Running, &warm),
        dup,
    ];
    let t = plan(&d, containers, vec![disk("default", &["w", "dup"], false)]);
    assert!(t.contains("remove      duplicate"), "{t}");
    assert!(!t.contains("disk image"), "{t}");
}

#[test]
fn a_plan_made_in_doubt_releases_nothing() {
    let mut d = desired(DOCKER);
    d.doubt = Some("config.yaml is invalid".to_string());
    let warm = d.sandboxes[0].hash().to_string();
    let t = plan(
        &d,
        vec![container("w", "default", ContainerState::Running, &warm)],
        vec![disk("gone", &[], false)],
    );
    assert!(
        t.starts_with(
            "? sandbox default/gone   kept        would release-disk (its container is gone; "
        ),
        "{t}"
    );
    assert!(
        t.ends_with("but config.yaml is invalid\nNo changes. The host is converged."),
        "{t}"
    );
}
