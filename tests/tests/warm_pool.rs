//! `terminal.warm_pool` on a real engine: new sessions claim ready
//! members, never one twice, across concurrent processes and claimers
//! killed mid-claim; the plan refills the pool and replaces a stale
//! member instead of handing it out; and `terminal.idle_action: stop`'s
//! cycle (stopped when idle, started again by the next command).
//!
//! The engine is the witness: which containers exist, under which name,
//! with which labels, is read with `docker`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// A home on the Docker backend with no warm task sandbox (sessions
/// only) and `extra` under `terminal:`.
fn pool_home(tag: &str, extra: &str) -> (TestHome, String, ProfileCleanup) {
    let profile = format!("{tag}{}", std::process::id());
    let cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_persistent: false\n{extra}",
        hermes_tests::test_image()
    ));
    (home, profile, cleanup)
}

/// Every container of `profile`: name → (id, its pool label).
fn containers(profile: &str) -> BTreeMap<String, (String, Option<String>)> {
    let filter = format!("label=hermes-profile={profile}");
    docker(&[
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        &filter,
        "--format",
        "{{.Names}}\t{{.ID}}\t{{.Label \"hermes-pool\"}}",
    ])
    .lines()
    .filter_map(|l| {
        let mut f = l.split('\t');
        let name = f.next()?.to_string();
        let id = f.next()?.to_string();
        let pool = f.next().filter(|p| !p.is_empty()).map(str::to_string);
        Some((name, (id, pool)))
    })
    .collect()
}

/// The names of the unclaimed members `hermes sandbox list` calls ready.
fn ready_members(home: &TestHome) -> Vec<String> {
    let list = home.run(["sandbox", "list", "--output", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pool"] == "ready")
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

fn reconcile(home: &TestHome) -> Run {
    let run = home.run(["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
    run
}

fn session_name(profile: &str, session: &str) -> String {
    format!("hermes-{profile}-default-{session}")
}

fn spawn(home: &TestHome, args: &[&str]) -> Child {
    home.command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn twenty_new_sessions_at_once_each_get_a_sandbox_of_their_own_four_from_the_pool() {
    let (home, profile, _cleanup) = pool_home("wpc", "  warm_pool: 4\n");
    let made = reconcile(&home);
    assert_eq!(
        made.stdout
            .matches(&format!("+ pool {profile}/default   create      "))
            .count(),
        4,
        "{made:?}"
    );
    let ready = ready_members(&home);
    assert_eq!(ready.len(), 4, "{ready:?}");
    let members: BTreeSet<String> = containers(&profile)
        .into_iter()
        .filter(|(_, (_, pool))| pool.is_some())
        .map(|(_, (id, _))| id)
        .collect();
    assert_eq!(members.len(), 4);

    let started = Instant::now();
    let children: Vec<(String, Child)> = (0..20)
        .map(|i| {
            let session = format!("c{i}");
            let child = spawn(
                &home,
                &["exec", "--session", &session, "--", "cat", "/etc/hostname"],
            );
            (session, child)
        })
        .collect();
    let mut hostnames = BTreeSet::new();
    let mut claims = 0;
    for (session, child) in children {
        let out = child.wait_with_output().unwrap();
        let run: Run = out.into();
        assert_eq!(run.code, 0, "{session}: {run:?}");
        if run.stderr.contains("   claim  ") {
            claims += 1;
        }
        assert!(
            hostnames.insert(run.stdout.trim().to_string()),
            "{session}: a hostname twice: {run:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(240),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(hostnames.len(), 20);
    let now = containers(&profile);
    // One container per session, each named for it; the four members are
    // four of them, each claimed once (never two sessions on one).
    let mut claimed = 0;
    for i in 0..20 {
        let name = session_name(&profile, &format!("c{i}"));
        let (id, pool) = now
            .get(&name)
            .unwrap_or_else(|| panic!("no {name}: {now:?}"));
        assert!(hostnames.contains(&id[..12]), "{name}'s hostname");
        if pool.is_some() {
            assert!(
                members.contains(id),
                "{name} has a pool label but was no member"
            );
            claimed += 1;
        }
    }
    assert_eq!(claimed, 4, "{now:#?}");
    assert_eq!(claims, 4, "each claim said so on stderr");
    assert_eq!(now.len(), 20, "{now:#?}");

    // The next pass refills the pool to four, under new names.
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert_eq!(
        dry.stdout.matches("pool of 4: 0 ready, 4 to make").count(),
        4,
        "{}",
        dry.stdout
    );
    reconcile(&home);
    assert_eq!(ready_members(&home).len(), 4);
    assert_eq!(containers(&profile).len(), 24);
    // The sessions are sessions: listed, and ended, with their names.
    let sessions = home.run(["session", "list", "--output", "json"]);
    assert_eq!(sessions.code, 0, "{sessions:?}");
    let v: serde_json::Value = serde_json::from_str(&sessions.stdout).unwrap();
    let listed: BTreeSet<String> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed.len(), 20, "{}", sessions.stdout);
    let claimed_one = (0..20)
        .map(|i| format!("c{i}"))
        .find(|s| now[&session_name(&profile, s)].1.is_some())
        .unwrap();
    let end = home.run(["session", "end", &claimed_one]);
    assert_eq!(end.code, 0, "{end:?}");
    assert!(!containers(&profile).contains_key(&session_name(&profile, &claimed_one)));
}

#[test]
fn a_claimer_killed_at_any_moment_leaves_one_sandbox_per_session_and_loses_no_member() {
    let (home, profile, _cleanup) = pool_home("wpk", "  warm_pool: 2\n");
    reconcile(&home);
    let mut sessions = Vec::new();
    // kill -9 after 0 to 90 ms: before, during and after the claim.
    for (round, delay) in (0..10).map(|r| (r, r * 10)).collect::<Vec<_>>() {
        if ready_members(&home).len() < 2 {
            reconcile(&home);
        }
        let session = format!("k{round}");
        let mut child = spawn(&home, &["exec", "--session", &session, "--", "sleep", "5"]);
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        sessions.push(session);
    }
    let seen = containers(&profile);
    for (name, (_, pool)) in &seen {
        // A member is unclaimed (its own name) or a session's, by name.
        if let Some(member) = pool {
            assert!(
                name == member || name.starts_with(&format!("hermes-{profile}-default-k")),
                "{name} ({member})"
            );
        }
    }
    // Every session that has a sandbox has one, and a command there runs
    // in it (the claim held); the others get one now.
    for session in &sessions {
        let name = session_name(&profile, session);
        let before = containers(&profile).get(&name).map(|(id, _)| id.clone());
        let run = home.run(["exec", "--session", session, "--", "cat", "/etc/hostname"]);
        assert_eq!(run.code, 0, "{session}: {run:?}");
        let after = containers(&profile);
        let (id, _) = after.get(&name).unwrap();
        if let Some(before) = before {
            assert_eq!(&before, id, "{session}: its sandbox was replaced");
        }
        assert_eq!(run.stdout.trim(), &id[..12], "{session}");
    }
    let after = containers(&profile);
    let members = after
        .iter()
        .filter(|(name, (_, pool))| pool.as_deref() == Some(name.as_str()))
        .count();
    assert_eq!(after.len(), sessions.len() + members, "{after:#?}");
    reconcile(&home);
    assert_eq!(ready_members(&home).len(), 2);
}

#[test]
fn a_stale_member_is_never_claimed_and_the_pass_replaces_it() {
    let (home, profile, _cleanup) = pool_home("wps", "  warm_pool: 1\n");
    reconcile(&home);
    let old: Vec<String> = ready_members(&home);
    assert_eq!(old.len(), 1);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_persistent: false\n  warm_pool: 1\n  docker_env:\n    GENERATION: \"2\"\n",
        hermes_tests::test_image()
    ));
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!("- pool {profile}/default"))
            && dry
                .stdout
                .contains("its spec is stale (docker_env.GENERATION")
            && dry.stdout.contains("a member is replaced, never claimed")
            && dry.stdout.contains("pool of 1: 0 ready, 1 to make"),
        "{}",
        dry.stdout
    );
    // A session now makes its own sandbox: the stale member is no one's.
    let run = home.run(["exec", "--session", "s1", "--", "printenv", "GENERATION"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "2\n"), "{run:?}");
    assert!(!run.stderr.contains("claim"), "{run:?}");
    let seen = containers(&profile);
    assert_eq!(seen[&session_name(&profile, "s1")].1, None, "{seen:#?}");
    assert!(
        seen.contains_key(&old[0]),
        "the stale member went before its pass"
    );
    reconcile(&home);
    let new = ready_members(&home);
    assert_eq!(new.len(), 1);
    assert!(!containers(&profile).contains_key(&old[0]));
    let run = home.run(["exec", "--session", "s2", "--", "printenv", "GENERATION"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "2\n"), "{run:?}");
    assert!(run.stderr.contains("claim"), "{run:?}");
    assert_eq!(ready_members(&home).len(), 0);
    // A pool of 0 takes the rest away.
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  container_persistent: false\n  docker_env:\n    GENERATION: \"2\"\n",
        hermes_tests::test_image()
    ));
    reconcile(&home);
    let left = containers(&profile);
    assert!(
        left.iter()
            .all(|(name, (_, pool))| pool.as_deref() != Some(name.as_str())),
        "{left:#?}"
    );
    assert!(
        left.contains_key(&session_name(&profile, "s2")),
        "a claimed member is its session's"
    );
}

/// `terminal.idle_action: stop`: the task's sandbox, idle past
/// `lifetime_seconds`, is stopped by a planned operation; its files stay,
/// its background process does not (a stop ends every process); the next
/// command starts it again and says so.
#[test]
fn an_idle_sandbox_is_stopped_and_the_next_command_starts_it_again_with_its_files() {
    let profile = format!("wpi{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  lifetime_seconds: 2\n  idle_action: stop\n",
        hermes_tests::test_image()
    ));
    reconcile(&home);
    let name = format!("hermes-{profile}-default");
    let id = containers(&profile)[&name].0.clone();
    let run = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "echo kept > /workspace/f; echo lost > /tmp/t",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let bg = home.run(["exec", "--background", "--", "sleep 1"]);
    assert_eq!(bg.code, 0, "{bg:?}");
    let job = bg.stdout.trim().to_string();
    // Busy, then idle past its lifetime.
    std::thread::sleep(Duration::from_secs(4));
    let dry = home.run(["reconcile", "--dry-run"]);
    assert!(
        dry.stdout
            .contains(&format!("~ sandbox {profile}/default   stop "))
            && dry.stdout.contains("stopped, as terminal.idle_action says"),
        "{dry:?}"
    );
    reconcile(&home);
    let state = docker(&["inspect", "-f", "{{.State.Status}}", &name]);
    assert_eq!(state.trim(), "exited");
    // Left stopped by the next pass: no orphan, no start.
    let again = home.run(["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
    let t = Instant::now();
    let run = home.run([
        "exec",
        "--",
        "sh",
        "-c",
        "cat /workspace/f; cat /tmp/t 2>/dev/null || echo no-tmp",
    ]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "kept\nno-tmp\n"),
        "{run:?}"
    );
    assert!(run.stderr.contains("start"), "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(20));
    // The same container, started again.
    assert_eq!(containers(&profile)[&name].0, id);
    let list = home.run(["process", "list", "--output", "json"]);
    let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let proc = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == job.as_str())
        .cloned();
    // /tmp is a tmpfs: the background process's record went with the stop.
    assert!(proc.is_none_or(|p| p["state"] != "running"), "{list:?}");
}
