//! The kubernetes backend against a real kube-apiserver (the harness of
//! `tests/kube-harness/`: real TLS, a service account's token, RBAC with
//! only the verbs the README lists; each Pod run as a container of the
//! test engine). Through the real `hermes` binary: the dry run shows what
//! a pass makes and makes nothing; a pass writes the claim and the Pod
//! (server-side apply, field manager `hermes`, the hardening as the Pod's
//! security context) and a second changes nothing; a changed spec replaces
//! the Pod keeping its claim and so its files; an object hermes did not
//! make is never touched; a refusal names the verb and the resource; a
//! session's end deletes that session's Pods only; 429 and 503 are asked
//! again after their Retry-After and a 403 never (through the harness's
//! front); a command started after a plan keeps its Pod from the idle
//! reaper.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::kube_harness::Harness;

fn pods_path(h: &Harness) -> String {
    format!("/api/v1/namespaces/{}/pods", h.namespace)
}

/// The Pod hermes made, as the admin reads it, once it runs (it may not
/// be there yet).
fn running_pod(h: &Harness, name: &str) -> serde_json::Value {
    h.wait_for(
        &format!("{}/{name}", pods_path(h)),
        &format!("Pod {name} running"),
        |p| p["status"]["phase"] == "Running",
    )
}

/// The Pod's name, as the plan printed it (`no Pod NS/NAME`).
fn pod_name(plan: &str, ns: &str) -> String {
    let at = plan
        .find(&format!("no Pod {ns}/"))
        .unwrap_or_else(|| panic!("the plan names no Pod to make:\n{plan}"));
    plan[at + format!("no Pod {ns}/").len()..]
        .split(|c: char| c == ';' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_pass_makes_the_claim_and_the_hardened_pod_and_a_second_pass_changes_nothing() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));

    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "changes are pending: {dry:?}");
    assert_eq!(
        dry.planned(),
        [
            (
                "kubernetes default/default".to_string(),
                "create-claim".to_string()
            ),
            (
                "kubernetes default/default".to_string(),
                "create".to_string()
            ),
        ],
        "{}",
        dry.stdout
    );
    let name = pod_name(&dry.stdout, &h.namespace);
    assert!(
        h.names(&pods_path(&h)).is_empty(),
        "the dry run made something"
    );

    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.done().into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        ["create-claim", "create"],
        "{}",
        run.stdout
    );
    let pod = running_pod(&h, &name);
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/managed-by"], "hermes");
    assert_eq!(labels["hermes-agent"], "1");
    assert_eq!(labels["hermes-task-id"], "default");
    assert!(labels["hermes-spec-hash"].is_string());
    let managers: Vec<&str> = pod["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["operation"] == "Apply")
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["hermes"], "{}", pod["metadata"]["managedFields"]);
    let spec = &pod["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    let sc = &spec["containers"][0]["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(
        spec["containers"][0]["resources"]["limits"]["memory"],
        "256Mi"
    );
    let claims = h.names(&format!(
        "/api/v1/namespaces/{}/persistentvolumeclaims",
        h.namespace
    ));
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].0, format!("{name}-data"));

    let again = home.run(["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.planned().is_empty(), "{}", again.stdout);
}

#[test]
fn a_changed_spec_replaces_the_pod_and_its_claim_keeps_the_files() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    let wrote = home.run([
        "exec",
        "--",
        "echo kept > /workspace/note && echo home > /root/note",
    ]);
    assert_eq!(wrote.code, 0, "{wrote:?}");
    let before = h.names(&pods_path(&h));
    assert_eq!(before.len(), 1, "{before:?}");

    home.write_config(
        h.config("")
            .replace("kubernetes_memory: 256", "kubernetes_memory: 320"),
    );
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert_eq!(
        dry.planned(),
        [(
            "kubernetes default/default".to_string(),
            "replace".to_string()
        )],
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("claim (its files) is kept"),
        "{}",
        dry.stdout
    );
    // An exec before the pass runs in the stale Pod, and says so.
    let stale = home.run(["exec", "--", "true"]);
    assert_eq!(stale.code, 0, "{stale:?}");
    assert!(stale.stderr.contains("stale spec"), "{}", stale.stderr);

    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    let after = h.names(&pods_path(&h));
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].0, before[0].0, "the same name");
    assert_ne!(after[0].1, before[0].1, "a new Pod");
    let pod = running_pod(&h, &after[0].0);
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "320Mi"
    );
    let read = home.run(["exec", "--", "cat /workspace/note /root/note"]);
    assert_eq!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout, "kept\nhome\n");
}

#[test]
fn a_pod_hermes_did_not_make_is_left_alone_and_the_plan_says_why() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    let dry = home.run(["reconcile", "--dry-run"]);
    let name = pod_name(&dry.stdout, &h.namespace);
    let foreign = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"team": "theirs"}},
        "spec": {"containers": [{
            "name": "main",
            "image": hermes_tests::test_image(),
            "command": ["sleep", "infinity"],
        }]},
    });
    let made = h.admin("POST", &pods_path(&h), Some(foreign));
    let uid = made["metadata"]["uid"].as_str().unwrap().to_string();

    let run = home.run(["reconcile"]);
    assert!(
        run.stdout.contains("that hermes did not make"),
        "{}",
        run.stdout
    );
    let pods = h.names(&pods_path(&h));
    assert_eq!(pods, [(name, uid)], "the foreign Pod is untouched");
}

#[test]
fn a_refusal_names_the_verb_and_the_resource_and_changes_nothing() {
    let h = Harness::start();
    let home = TestHome::new();
    // The service account may use its own namespace only.
    home.write_config(h.config("").replace(
        &format!("kubernetes_namespace: {}", h.namespace),
        "kubernetes_namespace: default",
    ));
    let run = home.run(["reconcile"]);
    assert_ne!(run.code, 0, "{run:?}");
    let all = format!("{}{}", run.stdout, run.stderr);
    // Pods and claims are listed at once: whichever answered first.
    assert!(
        ["pods", "persistentvolumeclaims"]
            .iter()
            .any(|r| all.contains(&format!("refused to list {r} in namespace default"))),
        "{all}"
    );
    assert!(all.contains("(403 Forbidden)"), "{all}");
    assert!(run.stdout.contains("blocked"), "{}", run.stdout);
    assert!(h.names("/api/v1/namespaces/default/pods").is_empty());
    let status = home.run(["status", "--output", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(doc["backend"], "kubernetes");
}

/// The front's record of the requests whose path starts with `prefix`
/// (its query aside), from the `from`th on.
fn seen_at(h: &Harness, from: usize, method: &str, prefix: &str) -> Vec<(i64, u16)> {
    h.front_requests()
        .into_iter()
        .skip(from)
        .filter(|r| r.method == method && r.path.split('?').next() == Some(prefix))
        .map(|r| (r.at_ms, r.status))
        .collect()
}

#[test]
fn a_429_or_503_is_asked_again_after_its_retry_after_and_a_403_never_is() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.front_config(""));
    let pods = pods_path(&h);
    let claims = format!("/api/v1/namespaces/{}/persistentvolumeclaims", h.namespace);

    // The list of Pods pushed back twice: asked again after the second
    // the server named, each time, and the plan made as if nothing was.
    h.fail_next("GET", &pods, 2, 429, Some("1"));
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(dry.stdout.contains("no Pod"), "{}", dry.stdout);
    let lists = seen_at(&h, 0, "GET", &pods);
    let statuses: Vec<u16> = lists.iter().map(|(_, s)| *s).collect();
    assert_eq!(&statuses[..3], [429, 429, 200], "{lists:?}");
    for pair in lists[..3].windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= 950,
            "asked again before Retry-After: 1 had passed: {lists:?}"
        );
    }

    // A write pushed back (503): the same apply sent again, and done.
    let before = h.front_requests().len();
    h.fail_next("PATCH", &claims, 1, 503, Some("1"));
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    let patches = seen_at(
        &h,
        before,
        "PATCH",
        &format!("{claims}/{}", claim_of_plan(&dry.stdout)),
    );
    let statuses: Vec<u16> = patches.iter().map(|(_, s)| *s).collect();
    assert_eq!(statuses, [503, 201], "{patches:?}");
    assert!(patches[1].0 - patches[0].0 >= 950, "{patches:?}");
    assert_eq!(h.names(&claims).len(), 1);

    // A refusal is asked once: an error naming the verb and resource.
    let before = h.front_requests().len();
    h.fail_next("GET", &pods, 1, 403, None);
    let refused = home.run(["reconcile", "--dry-run"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    let all = format!("{}{}", refused.stdout, refused.stderr);
    assert!(
        all.contains(&format!(
            "refused to list pods in namespace {}",
            h.namespace
        )),
        "{all}"
    );
    assert!(all.contains("403"), "{all}");
    assert_eq!(
        seen_at(&h, before, "GET", &pods)
            .iter()
            .map(|(_, s)| *s)
            .collect::<Vec<_>>(),
        [403],
        "a refusal is never asked again"
    );
}

/// The claim's name, as the plan printed it (`no claim NS/NAME:`).
fn claim_of_plan(plan: &str) -> String {
    let at = plan
        .find("no claim ")
        .unwrap_or_else(|| panic!("the plan names no claim to make:\n{plan}"));
    plan[at + "no claim ".len()..]
        .split(':')
        .next()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_session_s_end_deletes_that_session_s_pods_only() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    for session in ["s1", "s2"] {
        let run = home.run(["exec", "--session", session, "--", "echo in > /workspace/f"]);
        assert_eq!(run.code, 0, "{run:?}");
    }
    let sessions = |h: &Harness| {
        h.admin_get(&format!("{}?labelSelector=hermes-session", pods_path(h)))["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| {
                p["metadata"]["labels"]["hermes-session"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    let mut seen = sessions(&h);
    seen.sort();
    assert_eq!(seen, ["s1", "s2"]);
    let end = home.run(["session", "end", "s1"]);
    assert_eq!(end.code, 0, "{end:?}");
    assert!(end.stdout.contains("delete"), "{}", end.stdout);
    assert_eq!(sessions(&h), ["s2"]);
    // A session's Pod keeps no claim.
    let claims = h.names(&format!(
        "/api/v1/namespaces/{}/persistentvolumeclaims",
        h.namespace
    ));
    assert!(claims.is_empty(), "{claims:?}");
}

/// Whether a process whose command line starts with `prefix ` runs in
/// the sandbox, asked with one more exec.
fn runs_in_pod(home: &TestHome, prefix: &str) -> bool {
    let script = format!(
        r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); case $c in "{prefix} "*) echo found ;; esac; done"#
    );
    let run = home.run(["exec", "--", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    run.stdout.contains("found")
}

#[test]
fn a_killed_exec_ends_its_command_in_the_pod() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    let made = home.run(["exec", "--", "true"]);
    assert_eq!(made.code, 0, "{made:?}");

    let mut exec = home
        .command(["exec", "--", "sleep 3123; echo never"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now() + Duration::from_secs(60);
    while !runs_in_pod(&home, "sleep 3123") {
        assert!(Instant::now() < started, "the command never started");
        std::thread::sleep(Duration::from_millis(300));
    }
    // kill -9: no chance to say anything to the API server.
    exec.kill().unwrap();
    exec.wait().unwrap();
    let ended = Instant::now() + Duration::from_secs(30);
    while runs_in_pod(&home, "sleep 3123") {
        assert!(
            Instant::now() < ended,
            "the command outlived its hermes exec by 30 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn the_controller_follows_the_cluster_and_makes_a_deleted_pod_again() {
    let h = Harness::start();
    let home = TestHome::new();
    // A timer pass every 10 minutes only: what the test sees is the watch's.
    home.write_config(format!(
        "{}reconcile:\n  resync_seconds: 600\n",
        h.config("")
    ));
    let dry = home.run(["reconcile", "--dry-run"]);
    let name = pod_name(&dry.stdout, &h.namespace);
    let log = std::fs::File::create(home.path().join("controller.log")).unwrap();
    let mut controller = home
        .command(["controller"])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let first = running_pod(&h, &name);
    let uid = first["metadata"]["uid"].as_str().unwrap().to_string();

    // Deleted at once, from outside (as `kubectl delete --force` does).
    h.admin(
        "DELETE",
        &format!("{}/{name}?gracePeriodSeconds=0", pods_path(&h)),
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let pods = h.names(&pods_path(&h));
        if let Some((_, new)) = pods.iter().find(|(n, u)| n == &name && u != &uid) {
            break new.clone();
        }
        let log = std::fs::read_to_string(home.path().join("controller.log")).unwrap();
        assert!(
            Instant::now() < deadline,
            "no new Pod {name} a minute after the delete: {pods:?}\n{log}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let pod = running_pod(&h, &name);
    assert_eq!(pod["metadata"]["uid"], again.as_str());
    controller.kill().unwrap();
    controller.wait().unwrap();
    let log = std::fs::read_to_string(home.path().join("controller.log")).unwrap();
    assert!(log.contains("backend event"), "{log}");
}

#[test]
fn down_deletes_the_profile_s_pods_keeps_the_claim_and_reconcile_brings_the_files_back() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    let wrote = home.run(["exec", "--", "echo kept > /workspace/note"]);
    assert_eq!(wrote.code, 0, "{wrote:?}");
    let session = home.run(["exec", "--session", "s1", "--", "true"]);
    assert_eq!(session.code, 0, "{session:?}");
    assert_eq!(h.names(&pods_path(&h)).len(), 2);

    let dry = home.run(["down", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert_eq!(
        dry.planned(),
        [
            (
                "kubernetes default/default".to_string(),
                "delete".to_string()
            ),
            (
                "kubernetes default/default@s1".to_string(),
                "delete".to_string()
            ),
        ],
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("its claim (its files) is kept"),
        "{}",
        dry.stdout
    );
    assert_eq!(h.names(&pods_path(&h)).len(), 2, "the dry run deleted");

    let down = home.run(["down", "--yes"]);
    assert_eq!(down.code, 0, "{down:?}");
    let live = |h: &Harness| {
        h.admin_get(&pods_path(h))["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count()
    };
    assert_eq!(live(&h), 0, "{}", down.stdout);
    let claims = h.names(&format!(
        "/api/v1/namespaces/{}/persistentvolumeclaims",
        h.namespace
    ));
    assert_eq!(claims.len(), 1, "the claim is kept: {claims:?}");

    let again = home.run(["reconcile"]);
    assert_eq!(again.code, 0, "{again:?}");
    let read = home.run(["exec", "--", "cat /workspace/note"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"), "{read:?}");
}

#[test]
fn an_idle_session_pod_is_reaped_by_a_planned_delete_and_a_busy_one_is_kept() {
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config("  lifetime_seconds: 2\n"));
    for (session, cmd) in [
        ("s1", vec!["true"]),
        ("s2", vec!["--background", "sleep 300"]),
    ] {
        let mut args = vec!["exec", "--session", session];
        if cmd[0] == "--background" {
            args.push("--background");
        }
        args.push("--");
        args.push(cmd[cmd.len() - 1]);
        let run = home.run(&args);
        assert_eq!(run.code, 0, "{run:?}");
    }
    let target = |s: &str| format!("kubernetes default/default@{s}");
    // Idle only once lifetime_seconds has passed: asked until it has.
    let deadline = Instant::now() + Duration::from_secs(60);
    let dry = loop {
        let dry = home.run(["reconcile", "--dry-run"]);
        if dry
            .planned()
            .contains(&(target("s1"), "delete".to_string()))
        {
            break dry;
        }
        assert!(Instant::now() < deadline, "s1 never reaped: {}", dry.stdout);
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(dry.stdout.contains("idle for"), "{}", dry.stdout);
    assert!(
        !dry.planned().iter().any(|(t, _)| t == &target("s2")),
        "a Pod with a background process is busy: {}",
        dry.stdout
    );
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    let sessions: Vec<String> = h
        .admin_get(&format!("{}?labelSelector=hermes-session", pods_path(&h)))["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["metadata"]["labels"]["hermes-session"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(sessions, ["s2"], "{}", run.stdout);
}

/// `hermes --home H ARGS…` on a terminal (a pty made by util-linux's
/// `script`), its output read as it comes: the child, its stdin, and what
/// it printed so far.
fn on_a_terminal(
    home: &TestHome,
    args: &[&str],
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    use std::io::Read;
    let cmd = home.command(args);
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &line, "/dev/null"]);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    let mut child = script
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("script (util-linux) runs");
    let stdin = child.stdin.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = shown.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, stdin, shown)
}

/// The uid of the Pod of session `session`, if one is there and not on
/// its way out.
fn session_pod_uid(h: &Harness, session: &str) -> Option<String> {
    h.admin_get(&format!(
        "{}?labelSelector=hermes-session%3D{session}",
        pods_path(h)
    ))["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["uid"].as_str().unwrap().to_string())
}

#[test]
fn a_command_started_after_the_plan_keeps_its_pod_from_the_idle_reaper() {
    use std::io::Write;
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config("  lifetime_seconds: 2\n"));
    let run = home.run(["exec", "--session", "s1", "--", "true"]);
    assert_eq!(run.code, 0, "{run:?}");
    let uid = session_pod_uid(&h, "s1").expect("the session's Pod is there");
    let target = "kubernetes default/default@s1".to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !home
        .run(["reconcile", "--dry-run"])
        .planned()
        .contains(&(target.clone(), "delete".to_string()))
    {
        assert!(Instant::now() < deadline, "s1 never planned for reaping");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The plan is made and shown; it waits for a yes. A command of the
    // session starts and ends in between.
    let (mut child, mut stdin, shown) = on_a_terminal(&home, &["reconcile"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shown.lock().unwrap().contains("[y/N]") {
        assert!(
            Instant::now() < deadline,
            "no question: {}",
            shown.lock().unwrap()
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "{}",
            shown.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        shown.lock().unwrap().contains("idle for"),
        "{}",
        shown.lock().unwrap()
    );
    let used = home.run(["exec", "--session", "s1", "--", "echo used > /workspace/f"]);
    assert_eq!(used.code, 0, "{used:?}");
    stdin.write_all(b"y\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let text = shown.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(text.contains("kept, not reaped"), "{text}");
    assert_eq!(
        session_pod_uid(&h, "s1").as_deref(),
        Some(uid.as_str()),
        "{text}"
    );
    let read = home.run(["exec", "--session", "s1", "--", "cat /workspace/f"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "used\n"), "{read:?}");
}

#[test]
fn status_sandbox_list_session_list_and_the_plan_validate_against_their_schemas() {
    use hermes_tests::json_schema::document;
    let h = Harness::start();
    let home = TestHome::new();
    home.write_config(h.config(""));
    let json = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        home.run(all)
    };
    let dry = document(&json(&["reconcile", "--dry-run"]), "reconcile");
    assert!(
        dry.to_string().contains("\"create-claim\""),
        "the plan's JSON names the claim: {dry}"
    );
    document(&json(&["reconcile"]), "reconcile");
    let made = home.run(["exec", "--session", "s1", "--", "true"]);
    assert_eq!(made.code, 0, "{made:?}");

    let list = document(&json(&["sandbox", "list"]), "sandbox-list");
    assert_eq!(list["backend"], "kubernetes");
    let rows = list["sandboxes"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    let warm = rows.iter().find(|r| r["session"].is_null()).unwrap();
    assert_eq!(warm["spec_matches"], true, "{list}");
    assert_eq!(warm["state"], "running", "{list}");
    let session = rows.iter().find(|r| r["session"] == "s1").unwrap();
    assert!(
        session["idle_seconds"].is_i64(),
        "a command ran in it: {list}"
    );
    assert!(session["age_seconds"].as_i64().unwrap() < 600, "{list}");

    let status = document(&json(&["status"]), "status");
    assert_eq!(status["backend"], "kubernetes");
    document(&json(&["session", "list"]), "session-list");
}
