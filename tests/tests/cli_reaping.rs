//! Reaping and session lifecycle through the real binary and engine, with
//! lifetimes of seconds: nothing leaks, nothing needed is removed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

/// A test's own home and profile, on the Docker backend with the test
/// image and `terminal_extra` lines.
struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    fn new(tag: &str, terminal_extra: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let host = Host {
            home: TestHome::with_profile(&profile),
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        };
        host.configure(terminal_extra);
        host
    }

    fn configure(&self, terminal_extra: &str) {
        self.home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n{terminal_extra}",
            hermes_tests::test_image()
        ));
    }

    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home.run(all)
    }

    fn name(&self, suffix: &str) -> String {
        format!("hermes-{}-{suffix}", self.profile)
    }

    fn names(&self) -> Vec<String> {
        containers_of(&self.profile)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }
}

#[test]
fn a_session_is_shared_by_its_execs_kept_on_tmpfs_and_gone_when_ended() {
    let host = Host::new("rs", "  container_persistent: false\n");
    let write = host.hermes(&[
        "exec",
        "--session",
        "s1",
        "--",
        "sh",
        "-c",
        "echo shared > /workspace/note",
    ]);
    assert_eq!(write.code, 0, "{write:?}");
    // A sub-agent naming the same session shares the sandbox.
    let read = host.hermes(&[
        "exec",
        "--session",
        "s1",
        "--",
        "sh",
        "-c",
        "cat /workspace/note; grep -E ' /(workspace|root) ' /proc/mounts | cut -d' ' -f2,3 | sort",
    ]);
    assert_eq!(
        (read.code, read.stdout.as_str()),
        (0, "shared\n/root tmpfs\n/workspace tmpfs\n")
    );
    assert_eq!(host.names(), [host.name("default-s1")]);
    let labels = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"hermes-session\"}}",
        &host.name("default-s1"),
    ]);
    assert_eq!(labels.trim(), "s1");

    let list = host.hermes(&["session", "list", "--output", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(list["sessions"][0]["session"], "s1");
    assert_eq!(list["sessions"][0]["task"], "default");

    let end = host.hermes(&["session", "end", "s1"]);
    assert_eq!(end.code, 0, "{end:?}");
    assert!(host.names().is_empty(), "{:?}", host.names());
    let again = host.hermes(&["session", "end", "s1"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("nothing to end"), "{}", again.stdout);

    // Nothing is carried over to the next sandbox of that session.
    let fresh = host.hermes(&[
        "exec",
        "--session",
        "s1",
        "--",
        "sh",
        "-c",
        "ls /workspace | wc -l",
    ]);
    assert_eq!((fresh.code, fresh.stdout.as_str()), (0, "0\n"));
    let bad = host.hermes(&["exec", "--session", "a/b", "--", "true"]);
    // Refused where the flag is parsed: a usage error (EX_USAGE).
    assert_eq!(bad.code, 64);
    assert!(bad.stderr.contains("session id `a/b`"), "{}", bad.stderr);
}

#[test]
fn idle_sandboxes_are_reaped_after_their_limit_and_busy_ones_are_kept() {
    let host = Host::new(
        "ri",
        "  lifetime_seconds: 4\n  persistent_max_idle_seconds: 5\n",
    );
    // A session kept busy by a background process, a persistent sandbox
    // (made on demand: it has an idle limit) and an idle session, made in
    // that order: the idle ones are looked at first right after their
    // last use, well inside their limits whatever the machine's load.
    let bg = host.hermes(&[
        "exec",
        "--session",
        "busy",
        "--background",
        "--",
        "sleep",
        "120",
    ]);
    assert_eq!(bg.code, 0, "{bg:?}");
    assert!(
        bg.stderr.contains("started in the background"),
        "{}",
        bg.stderr
    );
    let marker = host.hermes(&["exec", "--", "sh", "-c", "echo kept > /workspace/marker"]);
    assert_eq!(marker.code, 0, "{marker:?}");
    assert_eq!(
        host.hermes(&["exec", "--session", "idle", "--", "true"])
            .code,
        0
    );
    let last_use = Instant::now();

    let early = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(
        (early.code, early.stdout.as_str()),
        (0, "No changes. The host is converged.\n")
    );
    // Past both limits, whole seconds counted: waiting longer only adds
    // to the idleness.
    std::thread::sleep(Duration::from_secs(7).saturating_sub(last_use.elapsed()));

    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    let p = &host.profile;
    // How idle exactly depends on the machine's load; the rule does not.
    let line = dry
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("- sandbox {p}/default        remove      idle ")))
        .unwrap_or_else(|| panic!("{}", dry.stdout));
    // With `container_disk` enforced, the removal releases its disk image
    // too, said after the idleness.
    assert!(
        line.contains("s (> 5s, terminal.persistent_max_idle_seconds)"),
        "{line}"
    );
    assert!(
        dry.stdout
            .contains(&format!("- sandbox {p}/default@idle   remove      idle ")),
        "{}",
        dry.stdout
    );
    assert!(!dry.stdout.contains("@busy"), "{}", dry.stdout);

    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(host.names(), [host.name("default-busy")]);
    // The persistent sandbox's data outlived its container.
    let read = host.hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));
}

#[test]
fn orphans_and_stuck_creations_are_removed_after_their_limits() {
    // lifetime 1 → orphans after 2 × max(60, 1) = 120 s; stuck after 60 s.
    let host = Host::new(
        "ro",
        "  lifetime_seconds: 1\n  container_persistent: false\n",
    );
    assert_eq!(
        host.hermes(&["exec", "--session", "gone", "--", "true"])
            .code,
        0
    );
    docker(&["stop", "-t", "1", &host.name("default-gone")]);
    // A sandbox whose start never happened: its labels, created only.
    assert_eq!(
        host.hermes(&["exec", "--session", "stuck", "--", "true"])
            .code,
        0
    );
    let labels = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}\n{{end}}",
        &host.name("default-stuck"),
    ]);
    docker(&["rm", "-f", &host.name("default-stuck")]);
    let mut args = vec![
        "create".to_string(),
        "--name".into(),
        host.name("default-stuck"),
    ];
    for label in labels.lines().filter(|l| !l.is_empty()) {
        args.push("--label".into());
        args.push(label.to_string());
    }
    args.extend([hermes_tests::test_image(), "true".into()]);
    docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let started = Instant::now();

    // Before their limits, both stay.
    let early = host.hermes(&["reconcile"]);
    assert_eq!(early.code, 0, "{early:?}");
    assert_eq!(
        containers_of(&host.profile),
        [
            (host.name("default-gone"), "exited".to_string()),
            (host.name("default-stuck"), "created".to_string()),
        ]
    );

    std::thread::sleep(Duration::from_secs(122).saturating_sub(started.elapsed()));
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains("remove      orphan: exited 2m"),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains("(> 2m)"), "{}", dry.stdout);
    assert!(
        dry.stdout.contains("remove      stuck in created for 2m"),
        "{}",
        dry.stdout
    );
    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(host.names().is_empty(), "{:?}", host.names());
}

#[test]
fn sandboxes_no_longer_desired_are_kept_until_pruned_and_their_data_stays() {
    let host = Host::new("rp", "");
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    assert_eq!(
        host.hermes(&["exec", "--", "sh", "-c", "echo data > /workspace/f"])
            .code,
        0
    );
    assert_eq!(
        host.hermes(&["config", "set", "terminal.backend", "local"])
            .code,
        0
    );
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "? container {}   kept        not desired (running), kept; `hermes reconcile --prune` removes it",
            host.name("default")
        )),
        "{}",
        dry.stdout
    );
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    assert_eq!(host.names(), [host.name("default")]);

    let prune = host.hermes(&["reconcile", "--prune"]);
    assert_eq!(prune.code, 0, "{prune:?}");
    assert!(host.names().is_empty());

    // The data comes back with the sandbox (from its disk image, with
    // `container_disk` enforced: released with its container, mounted
    // again by the create). reconcile.prune: true removes it without the
    // flag.
    host.configure("");
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    let data = host
        .home
        .path()
        .join("sandboxes/docker/default/workspace/f");
    assert_eq!(std::fs::read_to_string(data).unwrap(), "data\n");
    host.home
        .write_config("terminal:\n  backend: local\nreconcile:\n  prune: true\n");
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    assert!(host.names().is_empty());
}

#[test]
fn an_invalid_empty_or_missing_config_reaps_nothing_and_the_next_valid_one_converges() {
    let host = Host::new(
        "rv",
        "  lifetime_seconds: 1\n  container_persistent: false\n",
    );
    assert_eq!(
        host.hermes(&["exec", "--session", "s", "--", "true"]).code,
        0
    );
    assert_eq!(host.hermes(&["reconcile"]).code, 0); // the last good config
    std::thread::sleep(Duration::from_millis(2_200));

    for (what, text) in [
        (
            "invalid",
            Some("terminal:\n  backend: docker\n  lifetime_seconds: soon\n"),
        ),
        ("empty", Some("")),
        ("missing", None),
    ] {
        match text {
            Some(text) => host.home.write_config(text),
            None => std::fs::remove_file(host.home.config_path()).unwrap(),
        }
        let run = host.hermes(&["reconcile", "--prune"]);
        assert_eq!(run.code, 1, "{what}: {run:?}");
        assert!(
            run.stderr.contains(&format!("config.yaml is {what}")),
            "{what}: {}",
            run.stderr
        );
        if what == "invalid" {
            assert!(
                run.stderr
                    .contains("config.yaml:3:21: terminal.lifetime_seconds:"),
                "{}",
                run.stderr
            );
        }
        assert!(
            run.stdout.contains("kept        would remove (idle "),
            "{what}: {}",
            run.stdout
        );
        assert_eq!(host.names(), [host.name("default-s")], "{what}");
    }

    host.configure("  lifetime_seconds: 1\n  container_persistent: false\n");
    let run = host.hermes(&["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(host.names().is_empty(), "{:?}", host.names());
}

#[test]
fn containers_removed_by_hand_mid_pass_count_as_removed() {
    let host = Host::new(
        "rh",
        "  lifetime_seconds: 1\n  container_persistent: false\n",
    );
    let sessions: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for s in &sessions {
        assert_eq!(host.hermes(&["exec", "--session", s, "--", "true"]).code, 0);
    }
    std::thread::sleep(Duration::from_millis(2_200));
    let names: Vec<String> = sessions
        .iter()
        .map(|s| host.name(&format!("default-{s}")))
        .collect();
    let reconcile = host
        .home
        .command(["--profile", &host.profile, "reconcile"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Meanwhile, by hand.
    let mut rm = vec!["rm", "-f"];
    rm.extend(names.iter().map(String::as_str));
    let _ = std::process::Command::new("docker").args(&rm).output();
    let out: Run = reconcile.wait_with_output().unwrap().into();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!out.stderr.contains("error"), "{}", out.stderr);
    assert!(host.names().is_empty());
}

#[test]
fn foreign_containers_and_other_profiles_survive_prune_and_reapers() {
    let host = Host::new("rf", "  lifetime_seconds: 1\n");
    let other = Host::new("rg", "  lifetime_seconds: 1\n");
    assert_eq!(
        other.hermes(&["exec", "--session", "x", "--", "true"]).code,
        0
    );
    // Looks like ours, but without hermes-agent=1.
    let foreign = format!("hermes-{}-default-lookalike", host.profile);
    let _foreign_cleanup = ForeignCleanup(foreign.clone());
    docker(&[
        "run",
        "-d",
        "--name",
        &foreign,
        "--label",
        &format!("hermes-profile={}", host.profile),
        "--label",
        "hermes-session-task=default",
        "--label",
        "hermes-session=lookalike",
        "--label",
        "hermes-spec-hash=0123456789ab",
        &hermes_tests::test_image(),
        "sleep",
        "60",
    ]);
    std::thread::sleep(Duration::from_millis(2_200));
    host.home.write_config("terminal:\n  backend: local\n");
    assert_eq!(host.hermes(&["reconcile", "--prune"]).code, 0);
    let state = docker(&["inspect", "--format", "{{.State.Status}}", &foreign]);
    assert_eq!(state.trim(), "running");
    assert_eq!(other.names(), [other.name("default-x")]);
}

/// Removes a container the test made without hermes's labels.
struct ForeignCleanup(String);

impl Drop for ForeignCleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

#[test]
fn session_end_prints_its_plan_then_carries_out_exactly_that() {
    let host = Host::new("se", "  container_persistent: false\n");
    for (task, session) in [("default", "s1"), ("build", "s1"), ("default", "s2")] {
        let run = host.hermes(&["exec", "--task", task, "--session", session, "--", "true"]);
        assert_eq!(run.code, 0, "{run:?}");
    }
    let (default_s1, build_s1, default_s2) = (
        host.name("default-s1"),
        host.name("build-s1"),
        host.name("default-s2"),
    );
    let mut before = vec![default_s1.clone(), build_s1.clone(), default_s2.clone()];
    before.sort();
    assert_eq!(host.names(), before);

    let end = host.hermes(&["session", "end", "s1"]);
    assert_eq!(end.code, 0, "{end:?}");
    let profile = &host.profile;
    let plan = format!(
        "- sandbox {profile}/build@s1     remove      session s1 ended by hand\n\
         - sandbox {profile}/default@s1   remove      session s1 ended by hand\n\
         Plan: 0 to create, 0 to change, 2 to remove.\n"
    );
    assert!(end.stdout.starts_with(&plan), "{}", end.stdout);
    // What was carried out is what the plan printed first.
    let mut done: Vec<&str> = end
        .stdout
        .lines()
        .filter(|l| l.contains(" done ("))
        .map(|l| l.split(" done (").next().unwrap_or_default())
        .collect();
    done.sort_unstable();
    assert_eq!(
        done,
        [
            format!("- sandbox {profile}/build@s1   remove"),
            format!("- sandbox {profile}/default@s1   remove"),
        ],
        "{}",
        end.stdout
    );
    assert_eq!(host.names(), [default_s2]);
}
