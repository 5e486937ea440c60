//! Golden tests of the plan as `reconcile --dry-run` prints it, in text and
//! in JSON: whole host plans compared verbatim with the files in `golden/`.
//! After a deliberate change of the output, rewrite them with
//! `HERMES_UPDATE_GOLDEN=1 cargo test -p hermes-reconcilers golden`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hermes_model::cloud::{CloudObserved, CloudSandboxState};
use hermes_model::config::load;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::{ContainerState, MountedDisk, Observed, ObservedContainer};
use hermes_model::sandbox::{
    LABEL_AGENT, LABEL_PROFILE, LABEL_SESSION, LABEL_SPEC_HASH, LABEL_TASK,
};
use hermes_model::singularity::SingularityObserved;

use crate::{StagedPlan, plan_stages};

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

fn container(
    id: &str,
    name: &str,
    task: &str,
    state: ContainerState,
    hash: Option<&str>,
) -> ObservedContainer {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_AGENT.to_string(), "1".to_string());
    labels.insert(LABEL_PROFILE.to_string(), "default".to_string());
    labels.insert(LABEL_TASK.to_string(), task.to_string());
    if let Some(h) = hash {
        labels.insert(LABEL_SPEC_HASH.to_string(), h.to_string());
    }
    let running = state == ContainerState::Running;
    ObservedContainer {
        id: id.to_string(),
        name: name.to_string(),
        labels,
        state,
        created: NOW - 7200,
        started_at: running.then_some(NOW - 3600),
        finished_at: (state == ContainerState::Exited).then_some(NOW - 600),
        processes: running.then_some(3),
        made_by_agent: None,
        adopted_hash: None,
    }
}

fn plan(desired: &Desired, containers: Vec<ObservedContainer>) -> StagedPlan {
    let now = UNIX_EPOCH + Duration::from_secs(NOW as u64);
    plan_stages(
        desired,
        &Observed {
            containers,
            ..Observed::default()
        },
        now,
    )
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/golden")
        .join(name)
}

/// Compares `actual` with the golden file, or rewrites the file when asked.
fn check(name: &str, actual: &str) {
    let path = golden(name);
    if std::env::var_os("HERMES_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (HERMES_UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        actual == expected,
        "{} differs\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

/// The staged plan, as the dry run prints it (one stage where nothing
/// waits on the proxy).
fn check_both(stem: &str, plan: &StagedPlan) {
    check(&format!("{stem}.txt"), &format!("{plan}\n"));
    let json = serde_json::to_string_pretty(&plan.to_json()).unwrap();
    check(&format!("{stem}.json"), &format!("{json}\n"));
}

/// Every kind of operation of a Docker host at once: a recreate with its
/// cost, duplicates removed, a container of a task no longer desired, and
/// one without a spec hash.
#[test]
fn a_docker_host_with_drift_duplicates_and_strays() {
    let d = desired("terminal:\n  backend: docker\n  container_memory: 2048\n");
    let containers = vec![
        container(
            "c1",
            "hermes-default-default",
            "default",
            ContainerState::Running,
            Some("0123456789ab"),
        ),
        container(
            "c2",
            "hermes-default-default-2",
            "default",
            ContainerState::Exited,
            Some("0123456789ab"),
        ),
        container(
            "c3",
            "hermes-default-review",
            "review",
            ContainerState::Exited,
            Some("ba9876543210"),
        ),
        container("c4", "hand-made", "scratch", ContainerState::Running, None),
    ];
    check_both("docker-drift", &plan(&d, containers));
}

/// A recreate of a container whose settings label is known: the cause and
/// the JSON's `changes` name each setting that changed, old and new, an
/// environment variable by its name only.
#[test]
fn a_docker_host_whose_settings_changed() {
    let old = desired(
        "terminal:\n  backend: docker\n  container_memory: 5120\n  docker_image: a:1\n  docker_env:\n    API_TOKEN: one\n",
    );
    let d = desired(
        "terminal:\n  backend: docker\n  container_memory: 2048\n  docker_image: b:2\n  docker_env:\n    API_TOKEN: two\n  docker_volumes:\n    - /srv/data:/data\n",
    );
    let mut c = container(
        "c1",
        "hermes-default-default",
        "default",
        ContainerState::Running,
        None,
    );
    c.labels = old.sandboxes[0].labels.clone();
    check_both("docker-settings-diff", &plan(&d, vec![c]));
}

/// The reaping rules at once, with sessions instead of persistent
/// sandboxes: an idle session, a busy one, a stuck creation, an orphan, and
/// a persistent sandbox the config no longer wants.
#[test]
fn a_session_host_with_idle_busy_stuck_orphaned_and_unwanted_sandboxes() {
    let d = desired(
        "terminal:\n  backend: docker\n  container_persistent: false\n  lifetime_seconds: 60\n",
    );
    let session = |id: &str, name: &str, state: ContainerState| {
        let mut c = container(id, name, "default", state, Some("0123456789ab"));
        c.labels.insert(
            LABEL_SESSION.to_string(),
            name.rsplit('-').next().unwrap().to_string(),
        );
        c
    };
    let idle = session("c1", "hermes-default-default-idle", ContainerState::Running);
    let mut idle = idle;
    idle.processes = Some(0);
    let busy = session("c2", "hermes-default-default-busy", ContainerState::Running);
    let mut stuck = session(
        "c3",
        "hermes-default-default-stuck",
        ContainerState::Created,
    );
    stuck.created = NOW - 90;
    let orphan = session("c4", "hermes-default-default-gone", ContainerState::Exited);
    let unwanted = container(
        "c5",
        "hermes-default-default",
        "default",
        ContainerState::Running,
        Some("ba9876543210"),
    );
    let observed = Observed {
        containers: vec![idle, busy, stuck, orphan, unwanted],
        activity: [("hermes-default-default-idle".to_string(), NOW - 61)].into(),
        ..Observed::default()
    };
    let now = UNIX_EPOCH + Duration::from_secs(NOW as u64);
    check_both("docker-reaping", &plan_stages(&d, &observed, now));
}

/// The sandboxes' disk images: one whose container was removed by hand
/// (released, its file kept), one whose file was deleted too (released,
/// saying what goes), one whose idle container is reaped (released by the
/// removal), and the warm sandbox's, in use (kept).
#[test]
fn a_docker_host_with_disk_images_left_mounted() {
    let d = desired("terminal:\n  backend: docker\n  container_disk: 1024\n");
    let hash = d.sandboxes[0].hash().to_string();
    let warm = container(
        "c1",
        "hermes-default-default",
        "default",
        ContainerState::Running,
        Some(&hash),
    );
    let mut idle = container(
        "c2",
        "hermes-default-review",
        "review",
        ContainerState::Running,
        Some(&hash),
    );
    idle.processes = Some(0);
    let disk = |task: &str, users: &[&str], deleted: bool, loop_n: u32| MountedDisk {
        profile: "default".to_string(),
        task: task.to_string(),
        mount_point: PathBuf::from(format!("/h/sandboxes/docker/default/{task}")),
        image: PathBuf::from(format!("/h/sandboxes/docker/default/.{task}.disk")),
        devices: vec![format!("/dev/loop{loop_n}")],
        deleted,
        users: users.iter().map(|u| u.to_string()).collect(),
    };
    let observed = Observed {
        containers: vec![warm, idle],
        activity: [("hermes-default-review".to_string(), NOW - 400)].into(),
        disks: vec![
            disk("default", &["c1"], false, 0),
            disk("gone", &[], false, 1),
            disk("home-removed", &[], true, 2),
            disk("review", &["c2"], false, 3),
        ],
        ..Observed::default()
    };
    check_both("docker-disks", &plan_observed(&d, observed));
}

#[test]
fn a_fresh_docker_host() {
    let d = desired("terminal:\n  backend: docker\n");
    check_both("docker-fresh", &plan(&d, Vec::new()));
}

#[test]
fn a_converged_docker_host() {
    let d = desired("terminal:\n  backend: docker\n");
    let hash = d.sandboxes[0].hash().to_string();
    let keeper = container(
        "c1",
        "hermes-default-default",
        "default",
        ContainerState::Running,
        Some(&hash),
    );
    check_both("docker-converged", &plan(&d, vec![keeper]));
}

fn desired_with(config: &str, env: &[(&str, &str)]) -> Desired {
    let env = HostEnv {
        process: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostEnv::default()
    };
    Desired::build(
        load(config).unwrap().config,
        "default",
        Path::new("/h"),
        &env,
    )
    .unwrap()
}

fn plan_observed(desired: &Desired, observed: Observed) -> StagedPlan {
    plan_stages(
        desired,
        &observed,
        UNIX_EPOCH + Duration::from_secs(NOW as u64),
    )
}

/// A cloud backend without its credentials: blocked, naming the variables.
#[test]
fn a_cloud_backend_without_credentials_is_blocked() {
    let d = desired("terminal:\n  backend: modal\n");
    check_both("modal-blocked", &plan(&d, Vec::new()));
}

/// Modal with its credentials, no sandbox, a snapshot of the task from the
/// last session, and the Docker sandbox of an earlier config, reported.
#[test]
fn a_modal_host_restores_the_tasks_snapshot() {
    let d = desired_with(
        "terminal:\n  backend: modal\n  modal_image: python:3.12\n",
        &[("MODAL_TOKEN_ID", "ak-1"), ("MODAL_TOKEN_SECRET", "as-1")],
    );
    let observed = Observed {
        containers: vec![container(
            "c1",
            "hermes-default-default",
            "default",
            ContainerState::Exited,
            Some("0123456789ab"),
        )],
        cloud: Some(CloudObserved::Seen {
            sandbox: None,
            snapshot: Some("im-5Yq2c0ffee".to_string()),
        }),
        ..Observed::default()
    };
    check_both("modal-from-snapshot", &plan_observed(&d, observed));
}

/// Daytona keeps a stopped sandbox as its snapshot: it is resumed.
#[test]
fn a_daytona_host_resumes_its_stopped_sandbox() {
    let d = desired_with(
        "terminal:\n  backend: daytona\n  container_disk: 8192\n",
        &[("DAYTONA_API_KEY", "dtn-1")],
    );
    let observed = Observed {
        cloud: Some(CloudObserved::Seen {
            sandbox: Some(("0c4f-sandbox".to_string(), CloudSandboxState::Stopped)),
            snapshot: None,
        }),
        ..Observed::default()
    };
    check_both("daytona-resume", &plan_observed(&d, observed));
}

/// A fresh singularity host: the image built, the instance started.
#[test]
fn a_fresh_singularity_host() {
    let d = desired("terminal:\n  backend: singularity\n");
    let observed = Observed {
        singularity: Some(SingularityObserved::Seen {
            instances: Vec::new(),
            cached: Vec::new(),
        }),
        ..Observed::default()
    };
    check_both("singularity-fresh", &plan_observed(&d, observed));
}

/// A Docker host whose `docker_extra_args` hermes will not honour: the
/// warm sandbox is blocked with the reason and where it is, and the rest
/// of the host converges (an exited session sandbox is still reaped).
#[test]
fn a_docker_host_whose_extra_args_hermes_cannot_honour() {
    let d = desired(
        "terminal:\n  backend: docker\n  lifetime_seconds: 60\n  docker_extra_args: [--shm-size=2g, --privileged]\n",
    );
    let mut gone = container(
        "c4",
        "hermes-default-default-gone",
        "default",
        ContainerState::Exited,
        Some("0123456789ab"),
    );
    gone.labels
        .insert(LABEL_SESSION.to_string(), "gone".to_string());
    check_both("docker-refused", &plan(&d, vec![gone]));
}
