//! The kubernetes backend where the cluster serves agent-sandbox's
//! `Sandbox` (`agents.x-k8s.io/v1beta1`): the harness runs agent-sandbox's
//! real controller (v1.0.1) and kube-controller-manager's garbage
//! collector beside the real kube-apiserver. Through the real `hermes`
//! binary: the plan says a Sandbox holds the sandbox; a pass writes the
//! claim and the Sandbox (its Pod template the hardened Pod), the
//! controller makes the Pod and commands run in it; a changed spec makes
//! the Sandbox again and the claim keeps the files; an idle task's Sandbox
//! is suspended (its Pod goes, its claim stays) and its next command
//! resumes it with its files; a session's end and `hermes down` delete
//! the Sandboxes, and their Pods go with them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::kube_harness::Harness;

fn sandboxes_path(h: &Harness) -> String {
    format!(
        "/apis/agents.x-k8s.io/v1beta1/namespaces/{}/sandboxes",
        h.namespace
    )
}

fn pods_path(h: &Harness) -> String {
    format!("/api/v1/namespaces/{}/pods", h.namespace)
}

/// The Sandboxes' names and uids, of those not on their way out.
fn sandboxes(h: &Harness) -> Vec<(String, String)> {
    h.admin_get(&sandboxes_path(h))["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["metadata"]["deletionTimestamp"].is_null())
        .map(|s| {
            (
                s["metadata"]["name"].as_str().unwrap().to_string(),
                s["metadata"]["uid"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_sandbox_holds_the_sandbox_its_controller_runs_it_and_its_claim_keeps_the_files() {
    let h = Harness::with_agent_sandbox();
    let home = TestHome::new();
    home.write_config(h.config(""));

    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("Sandbox (agents.x-k8s.io)"),
        "the plan says which kind it chose: {}",
        dry.stdout
    );
    assert!(sandboxes(&h).is_empty(), "a dry run makes nothing");

    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    let made = sandboxes(&h);
    assert_eq!(made.len(), 1, "{made:?}");
    let (name, first_uid) = made[0].clone();
    let sb = h.admin_get(&format!("{}/{name}", sandboxes_path(&h)));
    assert_eq!(
        sb["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "hermes"
    );
    assert_eq!(sb["metadata"]["labels"]["hermes-agent"], "1");
    assert_eq!(sb["spec"]["operatingMode"], "Running");
    let container = &sb["spec"]["podTemplate"]["spec"]["containers"][0];
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert!(
        sb["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["manager"] == "hermes" && m["operation"] == "Apply"),
        "{sb}"
    );
    // The controller's Pod, under the Sandbox's name, owned by it.
    let pod = h.wait_for(
        &format!("{}/{name}", pods_path(&h)),
        "its Pod running",
        |p| p["status"]["phase"] == "Running",
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "Sandbox");
    assert_eq!(pod["metadata"]["labels"]["hermes-agent"], "1");

    let wrote = home.run(["exec", "--", "echo kept > /workspace/f"]);
    assert_eq!(wrote.code, 0, "{wrote:?}");
    let again = home.run(["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "converged: {again:?}");

    // Another spec: the Sandbox made again, the claim (and the file) kept.
    home.write_config(
        h.config("")
            .replace("kubernetes_memory: 256", "kubernetes_memory: 300"),
    );
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("replace"), "{}", run.stdout);
    let now = sandboxes(&h);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0].1, first_uid, "a new Sandbox");
    let read = home.run(["exec", "--", "cat /workspace/f"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"), "{read:?}");
}

#[test]
fn an_idle_sandbox_is_suspended_resumed_by_its_next_command_and_sessions_and_down_delete() {
    let h = Harness::with_agent_sandbox();
    let home = TestHome::new();
    home.write_config(h.config("  lifetime_seconds: 2\n"));
    let wrote = home.run(["exec", "--task", "t1", "--", "echo t1 > /workspace/f"]);
    assert_eq!(wrote.code, 0, "{wrote:?}");
    let session = home.run(["exec", "--session", "s1", "--", "true"]);
    assert_eq!(session.code, 0, "{session:?}");
    assert_eq!(sandboxes(&h).len(), 2, "{:?}", sandboxes(&h));

    // Idle past the lifetime: the task's Sandbox suspended, not deleted.
    let deadline = Instant::now() + Duration::from_secs(60);
    let dry = loop {
        let dry = home.run(["reconcile", "--dry-run"]);
        if dry.stdout.contains("suspend") {
            break dry;
        }
        assert!(Instant::now() < deadline, "t1 never idle: {}", dry.stdout);
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(dry.stdout.contains("idle for"), "{}", dry.stdout);
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    let t1 = sandboxes(&h)
        .into_iter()
        .find(|(n, _)| n.contains("-t1-"))
        .expect("t1's Sandbox is kept");
    let sb = h.admin_get(&format!("{}/{}", sandboxes_path(&h), t1.0));
    assert_eq!(sb["spec"]["operatingMode"], "Suspended", "{sb}");
    h.wait_for(
        &format!("{}?labelSelector=hermes-task-id%3Dt1", pods_path(&h)),
        "t1's Pod gone",
        |l| l["items"].as_array().is_some_and(Vec::is_empty),
    );

    // Its next command resumes it, on its claim.
    let read = home.run(["exec", "--task", "t1", "--", "cat /workspace/f"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "t1\n"), "{read:?}");
    let sb = h.admin_get(&format!("{}/{}", sandboxes_path(&h), t1.0));
    assert_eq!(sb["spec"]["operatingMode"], "Running", "{sb}");

    // A session's end deletes its Sandbox, and its Pod goes with it.
    let still = home.run(["exec", "--session", "s2", "--", "true"]);
    assert_eq!(still.code, 0, "{still:?}");
    let end = home.run(["session", "end", "s2"]);
    assert_eq!(end.code, 0, "{end:?}");
    assert!(
        !sandboxes(&h).iter().any(|(n, _)| n.contains("-s2-")),
        "{:?}",
        sandboxes(&h)
    );
    h.wait_for(
        &format!("{}?labelSelector=hermes-session%3Ds2", pods_path(&h)),
        "s2's Pod gone",
        |l| l["items"].as_array().is_some_and(Vec::is_empty),
    );

    // Down: every Sandbox of the profile deleted, the claims kept.
    let down = home.run(["down", "--yes"]);
    assert_eq!(down.code, 0, "{down:?}");
    assert!(sandboxes(&h).is_empty(), "{:?}", sandboxes(&h));
    let claims = h.names(&format!(
        "/api/v1/namespaces/{}/persistentvolumeclaims",
        h.namespace
    ));
    assert!(
        claims.iter().any(|(n, _)| n.contains("-t1-")),
        "t1's claim is kept: {claims:?}"
    );
}
