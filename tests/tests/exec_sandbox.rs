//! Only a plan changes a Docker sandbox: `hermes exec` creates a missing
//! one, starts a stopped one, and runs in a running one whatever its spec,
//! saying in one line what differs and that `hermes reconcile` applies it.
//! Per-command values (forwarded variables, the egress proxy's tokens)
//! travel with each command, so neither another value nor a token rotation
//! makes another container, and a background process lives through both,
//! and through a config edit followed by execs. The real binary, engine
//! and proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};
use hermes_tests::egress::{bridge_gateway, free_port_pair};

struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    fn new(tag: &str, extra: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let home = TestHome::with_profile(&profile);
        let host = Host {
            home,
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        };
        host.config(extra);
        host
    }

    fn config(&self, extra: &str) {
        self.home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n  docker_forward_env: [FWD_ME]\n{extra}",
            hermes_tests::test_image()
        ));
    }

    fn hermes_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        let mut cmd = self.home.command(all);
        cmd.env_remove("FWD_ME");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap().into()
    }

    fn hermes(&self, args: &[&str]) -> Run {
        self.hermes_env(args, &[])
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    fn id(&self) -> String {
        docker(&["inspect", "--format", "{{.Id}}", &self.name()])
            .trim()
            .to_string()
    }

    fn processes(&self) -> String {
        docker(&["top", &self.name(), "-eo", "pid,args"])
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // A proxy a test started stops with it.
        let _ = self.home.run(["egress", "stop"]);
    }
}

/// A line of stderr that says the spec is stale.
fn stale_lines(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter(|l| l.contains("runs a stale spec"))
        .collect()
}

#[test]
fn a_stale_spec_gives_one_line_and_no_recreate_until_reconcile() {
    let host = Host::new("exst", "");
    let first = host.hermes(&["exec", "--", "sh", "-c", "echo hi > /workspace/kept"]);
    assert_eq!(first.code, 0, "{first:?}");
    assert!(
        first
            .stderr
            .contains(&format!("+ sandbox {}/default   create", host.profile)),
        "the create is said in the plan's words: {first:?}"
    );
    let id = host.id();
    // Something outside /workspace and /root, which a recreate loses.
    let run = host.hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "touch /usr/local/bin/installed-tool",
    ]);
    assert_eq!(run.code, 0, "{run:?}");

    host.config("  container_memory: 1024\n");
    for _ in 0..2 {
        let run = host.hermes(&["exec", "--", "sh", "-c", "ls /usr/local/bin/installed-tool"]);
        assert_eq!(run.code, 0, "{run:?}");
        let stale = stale_lines(&run);
        assert_eq!(stale.len(), 1, "{run:?}");
        assert!(
            stale[0].contains("container_memory 5120 MB → 1024 MB"),
            "{run:?}"
        );
        assert!(stale[0].contains("`hermes reconcile`"), "{run:?}");
        assert_eq!(host.id(), id, "exec recreated the sandbox");
    }
    assert_eq!(
        containers_of(&host.profile),
        [(host.name(), "running".to_string())]
    );

    // A stopped sandbox is started as it is, said in the plan's words.
    docker(&["stop", "-t", "1", &host.name()]);
    let run = host.hermes(&["exec", "--", "sh", "-c", "cat /workspace/kept"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "hi\n"), "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("~ sandbox {}/default   start", host.profile)),
        "{run:?}"
    );
    assert_eq!(stale_lines(&run).len(), 1, "{run:?}");
    assert_eq!(host.id(), id, "exec recreated the stopped sandbox");

    // `hermes reconcile` applies it: a new container, the workspace kept.
    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_ne!(host.id(), id);
    let run = host.hermes(&["exec", "--", "sh", "-c", "cat /workspace/kept"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "hi\n"), "{run:?}");
    assert!(stale_lines(&run).is_empty(), "{run:?}");
}

#[test]
fn two_shells_with_different_forwarded_values_share_one_container() {
    let host = Host::new("exfw", "");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let id = host.id();
    // Two shells at once, each with its own value, and one without.
    let spawn = |value: Option<&str>| {
        let mut cmd = host.home.command([
            "--profile",
            host.profile.as_str(),
            "exec",
            "--",
            "sh",
            "-c",
            "sleep 1; echo ${FWD_ME-unset}",
        ]);
        cmd.env_remove("FWD_ME")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(v) = value {
            cmd.env("FWD_ME", v);
        }
        cmd.spawn().unwrap()
    };
    let shells = [spawn(Some("from-a")), spawn(Some("from-b")), spawn(None)];
    let outs: Vec<Run> = shells
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().into())
        .collect();
    for (run, want) in outs.iter().zip(["from-a\n", "from-b\n", "unset\n"]) {
        assert_eq!((run.code, run.stdout.as_str()), (0, want), "{run:?}");
        assert!(stale_lines(run).is_empty(), "{run:?}");
    }
    assert_eq!(host.id(), id);
    assert_eq!(
        containers_of(&host.profile),
        [(host.name(), "running".to_string())]
    );
    // The value is nowhere in the container's own environment.
    let run = host.hermes_env(&["exec", "--", "true"], &[("FWD_ME", "from-c")]);
    assert_eq!(run.code, 0, "{run:?}");
    let env = docker(&[
        "inspect",
        "--format",
        "{{range .Config.Env}}{{println .}}{{end}}",
        &host.name(),
    ]);
    assert!(!env.contains("FWD_ME"), "{env}");
}

#[test]
fn a_background_process_survives_a_token_rotation_and_a_config_edit_followed_by_execs() {
    let port = free_port_pair(Some(bridge_gateway()));
    let proxy = format!("proxy:\n  enabled: true\n  tunnel_port: {port}\n");
    let host = Host::new("exbg", &proxy);
    let made = host.hermes(&["reconcile"]);
    assert_eq!(made.code, 0, "{made:?}");
    let id = host.id();
    let token = |host: &Host| {
        let run = host.hermes(&["exec", "--", "sh", "-c", "printenv OPENAI_API_KEY"]);
        assert_eq!(run.code, 0, "{run:?}");
        run.stdout.trim().to_string()
    };
    let before = token(&host);
    assert!(before.len() > 10, "{before}");

    let bg = host.hermes(&["exec", "--background", "--", "sleep", "4242"]);
    assert_eq!(bg.code, 0, "{bg:?}");
    assert!(
        host.processes().contains("sleep 4242"),
        "{}",
        host.processes()
    );

    // A token rotation: the next command has the new token, in the same
    // container; the background process runs on (with the token it
    // started with).
    let rotate = host.hermes(&["egress", "setup", "--rotate-tokens"]);
    assert_eq!(rotate.code, 0, "{rotate:?}");
    let after = token(&host);
    assert_ne!(after, before);
    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert!(!dry.stdout.contains("recreate"), "{dry:?}");
    assert_eq!(host.id(), id, "a token rotation recreated the sandbox");
    assert!(
        host.processes().contains("sleep 4242"),
        "{}",
        host.processes()
    );

    // A config edit followed by execs: a warning each time, no recreate,
    // the background process alive.
    host.config(&format!("  container_memory: 1024\n{proxy}"));
    for _ in 0..3 {
        let run = host.hermes(&["exec", "--", "true"]);
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(stale_lines(&run).len(), 1, "{run:?}");
    }
    assert_eq!(host.id(), id);
    assert!(
        host.processes().contains("sleep 4242"),
        "{}",
        host.processes()
    );
    assert_eq!(
        containers_of(&host.profile),
        [(host.name(), "running".to_string())]
    );
}

#[test]
fn concurrent_commands_of_one_task_leave_the_directory_of_the_last_to_finish() {
    let host = Host::new("excc", "");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let spawn = |line: &str| {
        host.home
            .command(["--profile", host.profile.as_str(), "exec", "--", line])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The slow one started first and finishes last: its directory stays.
    // It runs until the test lets it go (at most a minute).
    let slow = spawn(
        "cd /tmp && touch /tmp/slow-started && i=0; \
         while [ ! -e /tmp/slow-go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; pwd",
    );
    let in_the_sandbox = |script: &str| {
        std::process::Command::new("docker")
            .args(["exec", &host.name(), "sh", "-c", script])
            .status()
            .unwrap()
            .success()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !in_the_sandbox("[ -e /tmp/slow-started ]") {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow command never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let quick = host.hermes(&["exec", "--", "cd /etc; pwd"]);
    assert_eq!(
        (quick.code, quick.stdout.as_str()),
        (0, "/etc\n"),
        "{quick:?}"
    );
    // While the slow one runs, the next command starts where the quick
    // one left the task.
    let between = host.hermes(&["exec", "--", "pwd"]);
    assert_eq!(between.stdout, "/etc\n", "{between:?}");
    // Let go through the engine, not hermes: no other command of the
    // task ends meanwhile.
    assert!(in_the_sandbox("touch /tmp/slow-go"));
    let slow: Run = slow.wait_with_output().unwrap().into();
    assert_eq!((slow.code, slow.stdout.as_str()), (0, "/tmp\n"), "{slow:?}");
    let after = host.hermes(&["exec", "--", "pwd"]);
    assert_eq!(after.stdout, "/tmp\n", "{after:?}");
    // A session's sandbox carries its own.
    let run = host.hermes(&["exec", "--session", "s1", "--", "cd /var; pwd"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        host.hermes(&["exec", "--session", "s1", "--", "pwd"])
            .stdout,
        "/var\n"
    );
    assert_eq!(host.hermes(&["exec", "--", "pwd"]).stdout, "/tmp\n");
}

/// The seed's walk-through (shared/seeds/000_…), verbatim, on the default
/// Docker backend: the backend set with `config set`, the version checks,
/// the marker written by one `hermes exec` and read by another, and one
/// container for the profile, also after a token rotation and after a
/// config edit followed by more execs.
#[test]
fn the_seed_walk_through_works_verbatim_on_docker() {
    let port = free_port_pair(Some(bridge_gateway()));
    let host = Host::new("exsd", "");
    host.home.write_config(format!(
        "terminal:\n  docker_image: {}\nproxy:\n  enabled: true\n  tunnel_port: {port}\n",
        hermes_tests::test_image()
    ));
    let get = host.hermes(&["config", "get", "terminal.backend"]);
    assert_eq!((get.code, get.stdout.as_str()), (0, "local\n"), "{get:?}");
    let set = host.hermes(&["config", "set", "terminal.backend", "docker"]);
    assert_eq!(set.code, 0, "{set:?}");
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    for cmd in ["python3 --version", "node --version"] {
        let run = host.hermes(&["exec", "--", cmd]);
        assert_eq!(run.code, 0, "{cmd}: {run:?}");
        assert!(!run.stdout.trim().is_empty(), "{cmd}: {run:?}");
    }
    let write = host.hermes(&[
        "exec",
        "--",
        "echo \"hermes-container-test\" > /workspace/marker.txt",
    ]);
    assert_eq!(write.code, 0, "{write:?}");
    let read = host.hermes(&["exec", "--", "cat /workspace/marker.txt"]);
    assert_eq!(
        (read.code, read.stdout.as_str()),
        (0, "hermes-container-test\n"),
        "{read:?}"
    );
    let one = || {
        let ps = docker(&[
            "ps",
            "--filter",
            "label=hermes-agent=1",
            "--filter",
            &format!("label=hermes-profile={}", host.profile),
            "--format",
            "{{.Names}}",
        ]);
        assert_eq!(ps, format!("{}\n", host.name()));
    };
    one();
    let id = host.id();
    assert_eq!(host.hermes(&["egress", "setup", "--rotate-tokens"]).code, 0);
    assert_eq!(
        host.hermes(&["exec", "--", "cat /workspace/marker.txt"])
            .code,
        0
    );
    one();
    let edit = host.hermes(&["config", "set", "terminal.container_memory", "2048"]);
    assert_eq!(edit.code, 0, "{edit:?}");
    for _ in 0..2 {
        let run = host.hermes(&["exec", "--", "cat /workspace/marker.txt"]);
        assert_eq!(run.stdout, "hermes-container-test\n", "{run:?}");
    }
    one();
    assert_eq!(host.id(), id);
    // Until `hermes reconcile`: then one new container, the marker kept.
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    one();
    assert_ne!(host.id(), id);
    let read = host.hermes(&["exec", "--", "cat /workspace/marker.txt"]);
    assert_eq!(read.stdout, "hermes-container-test\n", "{read:?}");
    let back = host.hermes(&["config", "set", "terminal.backend", "local"]);
    assert_eq!(back.code, 0, "{back:?}");
}
