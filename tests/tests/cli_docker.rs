//! `hermes reconcile` and `hermes exec` on the Docker backend, end to end:
//! the real binary against the real engine and the test image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

fn docker_home(profile: &str) -> (TestHome, ProfileCleanup) {
    let home = TestHome::with_profile(profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    GREETING: hello\n",
        hermes_tests::test_image()
    ));
    (home, ProfileCleanup(profile.to_string()))
}

#[test]
fn reconcile_creates_reattaches_and_recreates_keeping_the_workspace() {
    let profile = format!("e2e{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "+ sandbox {profile}/default   create      no container with these labels"
        )),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    // Reattach: a second pass has nothing to do.
    let again = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "No changes. The host is converged.\n")
    );

    let write = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo $GREETING > /workspace/marker",
    ]);
    assert_eq!(write.code, 0, "{write:?}");
    // A command left running: the recreate says it stops it.
    let background = std::process::Command::new("docker")
        .args([
            "exec",
            "-d",
            &format!("hermes-{profile}-default"),
            "sleep",
            "1000",
        ])
        .output()
        .unwrap();
    assert!(background.status.success(), "{background:?}");

    assert_eq!(
        hermes(&["config", "set", "terminal.container_memory", "1024"]).code,
        0
    );
    let dry = hermes(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(plan["operations"][0]["action"], "recreate");
    let cause = plan["operations"][0]["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("container_memory 5120 MB → 1024 MB (forces recreate)"),
        "{cause}"
    );
    assert!(
        cause.ends_with("; stops 1 running process; files outside /workspace and /root are lost"),
        "{cause}"
    );
    assert_eq!(hermes(&["reconcile"]).code, 0);
    assert_eq!(hermes(&["reconcile", "--dry-run"]).code, 0);

    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "hello\n"));
}

#[test]
fn exec_streams_exit_codes_and_recovers_once_from_a_removed_container() {
    let profile = format!("e2x{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let run = hermes(&["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    // The create is said on stderr in the plan's words, before the
    // command's own output.
    // (Where hermes makes disk images, the line goes on with the image's
    // cost.)
    let created =
        format!("+ sandbox {profile}/default   create      no container with these labels");
    assert_eq!((run.code, run.stdout.as_str()), (7, "out\n"), "{run:?}");
    let said: Vec<&str> = run.stderr.lines().collect();
    assert!(
        said.len() == 2 && said[0].starts_with(&created) && said[1] == "err",
        "{run:?}"
    );
    docker(&["rm", "-f", &format!("hermes-{profile}-default")]);
    let run = hermes(&["exec", "--", "true"]);
    assert_eq!(run.code, 0, "{run:?}");
    let timed = hermes(&[
        "exec",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        "sleep 1000 & sleep 1000",
    ]);
    assert_eq!(timed.code, 124, "{timed:?}");
    assert!(
        timed.stderr.contains("[Command timed out after 2s]"),
        "{}",
        timed.stderr
    );
    let left = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    ]);
    assert!(!left.stdout.contains("sleep 1000"), "{}", left.stdout);
}

#[test]
fn exec_passes_ten_megabytes_of_output_through_intact() {
    let profile = format!("e2m{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    // 10 MiB of numbered lines on stdout, a few on stderr in between.
    let out = home
        .command([
            "--profile",
            &profile,
            "exec",
            "--",
            "sh",
            "-c",
            "seq 1 1500000 | head -c 10485760; echo err >&2",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 10 * 1024 * 1024);
    let text = String::from_utf8(out.stdout).unwrap();
    for (i, line) in text.lines().take(1_000_000).enumerate() {
        assert_eq!(line, (i + 1).to_string(), "line {}", i + 1);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr.lines().collect();
    assert!(
        said.len() == 2
            && said[0].starts_with(&format!(
                "+ sandbox {profile}/default   create      no container with these labels"
            ))
            && said[1] == "err",
        "{stderr}"
    );
}

#[test]
fn duplicates_of_one_sandbox_are_repaired_to_one() {
    let profile = format!("e2d{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let write = hermes(&["exec", "--", "sh", "-c", "echo kept > /workspace/marker"]);
    assert_eq!(write.code, 0, "{write:?}");

    // A second container with the same labels, as a racing process or a
    // hand-made copy would leave.
    let name = format!("hermes-{profile}-default");
    let labels = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}\n{{end}}",
        &name,
    ]);
    let mut args = vec![
        "run".to_string(),
        "-d".into(),
        "--name".into(),
        format!("{name}-copy"),
    ];
    for label in labels.lines().filter(|l| !l.is_empty()) {
        args.push("--label".into());
        args.push(label.to_string());
    }
    args.extend([
        hermes_tests::test_image(),
        "sleep".into(),
        "infinity".into(),
    ]);
    docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(containers_of(&profile).len(), 2);

    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("remove      duplicate "),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert_eq!(hermes(&["reconcile", "--dry-run"]).code, 0);
    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));
}

#[test]
fn sandbox_list_shows_spec_match_age_and_idleness() {
    let profile = format!("e2l{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let name = format!("hermes-{profile}-default");
    let mine = |list: &serde_json::Value| {
        list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == name.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from {list}"))
    };
    assert_eq!(hermes(&["exec", "--", "true"]).code, 0);
    let list = hermes(&["sandbox", "list", "--output", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let row = mine(&serde_json::from_str(&list.stdout).unwrap());
    assert_eq!(row["state"], "running");
    assert_eq!(row["spec_matches"], true);
    assert_eq!(row["processes"], 0);
    assert!(row["idle_seconds"].as_i64().unwrap() <= 5, "{row}");

    // A process left running in the background keeps the sandbox busy.
    let bg = hermes(&["exec", "--", "sh", "-c", "nohup sleep 30 >/dev/null 2>&1 &"]);
    assert_eq!(bg.code, 0, "{bg:?}");
    let row = mine(
        &serde_json::from_str(&hermes(&["sandbox", "list", "--output", "json"]).stdout).unwrap(),
    );
    assert_eq!(row["processes"], 1, "{row}");
    assert_eq!(row["idle_seconds"], serde_json::Value::Null, "{row}");
    let text = hermes(&["sandbox", "list"]);
    let line = text
        .stdout
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{}", text.stdout));
    assert!(line.ends_with("busy (1 running)"), "{line}");
    assert!(text.stdout.starts_with("NAME "), "{}", text.stdout);

    // A changed config shows as a spec mismatch.
    assert_eq!(
        hermes(&["config", "set", "terminal.container_memory", "1024"]).code,
        0
    );
    let row = mine(
        &serde_json::from_str(&hermes(&["sandbox", "list", "--output", "json"]).stdout).unwrap(),
    );
    assert_eq!(row["spec_matches"], false);
}

#[test]
fn a_failed_pull_names_the_image_keeps_the_old_sandbox_and_the_rest_of_the_plan_runs() {
    let profile = format!("e2p{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let name = format!("hermes-{profile}-default");
    // A stopped duplicate: the plan removes it whatever else fails.
    let hash = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"hermes-spec-hash\"}}",
        &name,
    ]);
    // Of this home: hermes sees no other home's containers.
    let home_id = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"hermes-home\"}}",
        &name,
    ]);
    docker(&[
        "create",
        "--name",
        &format!("{name}-copy"),
        "--label",
        &format!("hermes-home={}", home_id.trim()),
        "--label",
        "hermes-agent=1",
        "--label",
        &format!("hermes-profile={profile}"),
        "--label",
        "hermes-task-id=default",
        "--label",
        &format!("hermes-spec-hash={}", hash.trim()),
        &hermes_tests::test_image(),
        "true",
    ]);
    // A registry on a closed loopback port: the pull fails at once and
    // nothing leaves the machine.
    let missing = format!("127.0.0.1:9/hermes-missing-{profile}:1");
    assert_eq!(
        hermes(&["config", "set", "terminal.docker_image", &missing]).code,
        0
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 1, "{apply:?}");
    assert!(
        apply
            .stderr
            .contains(&format!("cannot pull image {missing}")),
        "{}",
        apply.stderr
    );
    assert!(
        apply.stdout.contains("- sandbox") && apply.stdout.contains("remove done"),
        "{}",
        apply.stdout
    );
    assert_eq!(containers_of(&profile), [(name, "running".to_string())]);
}

/// With no engine at `DOCKER_HOST` (no socket, or a socket nobody
/// listens on), every command says so in one line: the cause once, and
/// what to check.
#[test]
fn an_engine_that_does_not_answer_is_named_once_with_what_to_check() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: docker\n");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let dead = dir.path().join("dead.sock");
    // Bound and closed: the file stays, and connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    for (socket, cause) in [
        (&missing, "No such file or directory (os error 2)"),
        (&dead, "Connection refused (os error 111)"),
    ] {
        let host = format!("unix://{}", socket.display());
        for args in [
            &["reconcile"][..],
            &["reconcile", "--dry-run"],
            &["exec", "--", "true"],
            &["sandbox", "list"],
        ] {
            let run: Run = home
                .command(args)
                .env("DOCKER_HOST", &host)
                .output()
                .unwrap()
                .into();
            assert_eq!(run.code, 1, "{args:?}: {run:?}");
            assert_eq!(
                run.stderr,
                format!(
                    "error: cannot reach the Docker engine at {host}: {cause}; \
                     is dockerd running, and is DOCKER_HOST right?\n"
                ),
                "{args:?}"
            );
        }
    }
}

/// Leaves container `name` dead, as a removal that failed half-way does:
/// a file of its writable layer made immutable makes the engine's removal
/// fail after it has marked the container dead; the file is made mutable
/// again at once, so a later removal succeeds.
fn make_dead(name: &str) {
    let upper = docker(&[
        "inspect",
        "--format",
        "{{.GraphDriver.Data.UpperDir}}",
        name,
    ]);
    let stuck = std::path::Path::new(upper.trim()).join("hermes-test-stuck");
    std::fs::write(&stuck, b"").unwrap_or_else(|e| panic!("{}: {e}", stuck.display()));
    let chattr = |flag: &str| {
        let out = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&stuck)
            .output()
            .unwrap();
        assert!(out.status.success(), "chattr {flag}: {out:?}");
    };
    chattr("+i");
    let removed = std::process::Command::new("docker")
        .args(["rm", name])
        .output()
        .unwrap();
    chattr("-i");
    assert!(!removed.status.success(), "the removal was to fail");
    let state = docker(&["inspect", "--format", "{{.State.Status}}", name]);
    assert_eq!(state.trim(), "dead");
}

/// The lines of a plan's operations, as `symbol target verb`.
fn plan_ops(plan: &str) -> Vec<String> {
    let mut ops: Vec<String> = plan
        .lines()
        .filter(|l| l.starts_with(['+', '-', '~', '!']))
        .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
        .collect();
    ops.sort();
    ops
}

#[test]
fn a_dead_container_holding_the_name_is_removed_by_a_planned_operation() {
    let profile = format!("dh{}", std::process::id());
    let (home, _cleanup) = docker_home(&profile);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };
    let name = format!("hermes-{profile}-default");
    let made = hermes(&["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");
    let hash = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"hermes-spec-hash\"}}",
        &name,
    ]);
    let home_id = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"hermes-home\"}}",
        &name,
    ]);
    docker(&["rm", "-f", &name]);
    // A container of this home and profile, labelled for another task, of
    // another spec, holds the sandbox's name: dead.
    let holder = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        "hermes-agent=1",
        "--label",
        &format!("hermes-home={}", home_id.trim()),
        "--label",
        &format!("hermes-profile={profile}"),
        "--label",
        "hermes-task-id=other",
        "--label",
        "hermes-spec-hash=000000000000",
        &hermes_tests::test_image(),
        "true",
    ]);
    make_dead(&name);

    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "- sandbox {profile}/default   remove      container {name} (dead, task other) holds the name; removed before the create"
        )),
        "{}",
        dry.stdout
    );
    let planned = plan_ops(&dry.stdout);
    assert_eq!(planned.len(), 2, "{}", dry.stdout);

    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    // What apply did is what the dry run printed, nothing more.
    let done: Vec<String> = {
        let mut done: Vec<String> = apply
            .stdout
            .lines()
            .filter(|l| l.contains(" done ("))
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
            .collect();
        done.sort();
        done
    };
    assert_eq!(done, planned, "{}", apply.stdout);
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    let now = docker(&[
        "inspect",
        "--format",
        "{{.Id}} {{.State.Status}} {{index .Config.Labels \"hermes-spec-hash\"}}",
        &name,
    ]);
    let fields: Vec<&str> = now.split_whitespace().collect();
    assert_ne!(fields[0], holder.trim(), "the holder is gone");
    assert_eq!(&fields[1..], ["running", hash.trim()]);
}
