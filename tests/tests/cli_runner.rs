//! `hermes exec` through the sandbox's runner, end to end: the real binary,
//! the real engine, the test image. Every behaviour of the engine's exec
//! holds through the runner; anything wrong with the runner falls back to
//! the engine's exec; nothing the container plants in the runner's
//! directory makes hermes touch a host file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// Key-shaped, but no real key of anyone.
const FAKE_KEY: &str = "sk-ant-api03-hermesRUNNERvalueNOTaKEY0123456789abcdef";

/// What a command prints when the runner started it: its parent's command
/// line (under the engine's exec the parent is outside the container).
const PARENT: &str = "head -c 21 /proc/$PPID/cmdline 2>/dev/null | tr '\\0' ' '; echo";

struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    fn new(tag: &str) -> Host {
        Host::with_image(tag, &hermes_tests::test_image())
    }

    fn with_image(tag: &str, image: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let host = Host {
            home: TestHome::with_profile(&profile),
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        };
        host.home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {image}\n  docker_env:\n    ANTHROPIC_API_KEY: {FAKE_KEY}\n    GREETING: hello\n"
        ));
        host
    }

    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home.run(all)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home.command(all)
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    fn runner_dir(&self) -> PathBuf {
        self.home.path().join("run/sandboxes").join(self.name())
    }

    /// Whether `hermes exec` runs its command through the runner.
    fn through_runner(&self) -> bool {
        let run = self.hermes(&["exec", "--", "sh", "-c", PARENT]);
        assert_eq!(run.code, 0, "{run:?}");
        match run.stdout.as_str() {
            "sh -c # hermes-runner\n" => true,
            "\n" => false,
            other => panic!("unexpected parent {other:?}"),
        }
    }

    /// The pids of the runners in the container (not their handlers), read
    /// with the Docker CLI.
    fn runner_pids(&self) -> Vec<String> {
        docker(&[
            "exec",
            &self.name(),
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline)\" in \
             'sh -c # hermes-runner'*' serve /run/hermes ctl.'*) echo ${p#/proc/} ;; esac; done",
        ])
        .split_whitespace()
        .map(str::to_string)
        .collect()
    }

    /// Waits (at most 30 s) until `hermes sandbox list` counts `n`
    /// processes in the sandbox: a command's handler may take a moment to
    /// be reaped after the command's end.
    fn expect_processes(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.processes();
            if now == n {
                return;
            }
            assert!(Instant::now() < deadline, "{now} processes, not {n}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The `processes` of the sandbox in `hermes sandbox list`.
    fn processes(&self) -> u64 {
        let list = self.hermes(&["sandbox", "list", "--output", "json"]);
        assert_eq!(list.code, 0, "{list:?}");
        let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
        list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == self.name().as_str())
            .map(|row| row["processes"].as_u64().unwrap_or(u64::MAX))
            .unwrap_or_else(|| panic!("{} missing from {list}", self.name()))
    }
}

#[test]
fn exec_through_the_runner_behaves_as_the_engines_exec() {
    let host = Host::new("rn");
    // The first exec starts the runner; from then on commands go through it.
    let first = host.hermes(&["exec", "--", "sh", "-c", "echo $GREETING"]);
    assert_eq!(
        (first.code, first.stdout.as_str()),
        (0, "hello\n"),
        "{first:?}"
    );
    assert!(host.through_runner());
    assert_eq!(host.runner_pids().len(), 1);

    // Output apart, exit code, arguments as given.
    let run = host.hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; printf '%s\\n' \"$1\"; exit 7",
        "zero",
        "it's \"quoted\" $HOME `x`",
    ]);
    assert_eq!(
        (run.code, run.stdout.as_str(), run.stderr.as_str()),
        (7, "out\nit's \"quoted\" $HOME `x`\n", "err\n")
    );
    // --cwd, --env, and the container's working directory by default.
    let run = host.hermes(&[
        "exec",
        "--cwd",
        "/tmp",
        "--env",
        "A=one two",
        "--env",
        "B=",
        "--",
        "sh",
        "-c",
        "pwd; echo \"$A|${B-unset}\"",
    ]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "/tmp\none two|\n"));
    let run = host.hermes(&["exec", "--", "pwd"]);
    assert_eq!(run.stdout, "/workspace\n");
    // The environment is the container's and the request's: nothing the
    // runner's shell would add.
    let run = host.hermes(&["exec", "--env", "A=1", "--", "env"]);
    let mut names: Vec<&str> = run
        .stdout
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "A",
            "ANTHROPIC_API_KEY",
            "GREETING",
            "HERMES_EXEC_ID",
            "HOME",
            "HOSTNAME",
            "PATH",
            // The terminal contract's shell, as in a terminal.
            "PWD"
        ],
        "{}",
        run.stdout
    );
    // A program that is not found is 127, as in a terminal, on every
    // backend (it was the engine's 126).
    let run = host.hermes(&["exec", "--", "no-such-program"]);
    assert_eq!(run.code, 127, "{run:?}");
    assert!(
        run.stderr
            .contains("hermes: no-such-program: command not found"),
        "{run:?}"
    );
    // A --cwd that is not there: one line on stderr, not runc's words on
    // stdout.
    let run = host.hermes(&["exec", "--cwd", "/no/such", "--", "true"]);
    assert_eq!(run.code, 126, "{run:?}");
    assert_eq!(run.stdout, "", "{run:?}");
    assert!(
        run.stderr
            .ends_with("hermes: --cwd /no/such: no such directory in the sandbox\n"),
        "{run:?}"
    );
    // The redactor masks what comes through the runner.
    let run = host.hermes(&["exec", "--", "printenv", "ANTHROPIC_API_KEY"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "sk-ant-ap…[redacted]\n")
    );
    // A signal's exit code, and the runner outlives a command that kills
    // its own process group.
    let run = host.hermes(&["exec", "--", "sh", "-c", "kill 0"]);
    assert_eq!((run.code, run.stderr.as_str()), (143, ""));
    assert_eq!(host.runner_pids().len(), 1);
    assert!(host.through_runner());
}

#[test]
fn large_output_timeouts_and_background_commands_through_the_runner() {
    let host = Host::new("rl");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    assert!(host.through_runner());

    let out = host
        .command(&[
            "exec",
            "--",
            "sh",
            "-c",
            "seq 1 1500000 | head -c 10485760; echo err >&2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout.len(), 10 * 1024 * 1024);
    let text = String::from_utf8(out.stdout).unwrap();
    for (i, line) in text.lines().take(1_000_000).enumerate() {
        assert_eq!(line, (i + 1).to_string(), "line {}", i + 1);
    }
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    // Output is live: the first line is there while the command waits to
    // be let go (at most a minute), which the test does only once it read
    // that line.
    let mut child = host
        .command(&[
            "exec",
            "--",
            "sh",
            "-c",
            "echo first; i=0; while [ ! -e /tmp/rn-go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
             if [ -e /tmp/rn-go ]; then echo second; else echo gave up; fi",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"first\n");
    // While it runs the sandbox is busy; the runner itself is not.
    assert!(host.processes() >= 1);
    docker(&["exec", &host.name(), "touch", "/tmp/rn-go"]);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(
        rest, "second\n",
        "the first line came only once the command ended"
    );
    assert!(child.wait().unwrap().success());
    host.expect_processes(0);

    // A timeout kills the whole tree inside the container.
    let started = Instant::now();
    let timed = host.hermes(&[
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
    assert!(started.elapsed() < Duration::from_secs(20));
    let left = docker(&[
        "exec",
        &host.name(),
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    ]);
    assert!(!left.contains("sleep 1000"), "{left}");
    host.expect_processes(0);

    // A background command keeps the sandbox busy, and its errors show.
    let bg = host.hermes(&["exec", "--background", "--", "sleep", "30"]);
    assert_eq!(bg.code, 0, "{bg:?}");
    assert!(bg.stderr.contains("started in the background"), "{bg:?}");
    host.expect_processes(1);
    let bad = host.hermes(&["exec", "--background", "--", "no-such-program"]);
    assert_eq!(bad.code, 127, "{bad:?}");
    assert!(bad.stderr.contains("no-such-program"), "{bad:?}");
}

#[test]
fn concurrent_execs_of_several_hermes_processes_share_one_runner() {
    let host = Host::new("rc");
    // Started together on a sandbox without a runner yet: one runner.
    let children: Vec<_> = (0..8)
        .map(|i| {
            host.command(&[
                "exec",
                "--",
                "sh",
                "-c",
                "sleep 0.$1; echo out $1; echo err $1 >&2; exit $1",
                "-",
                &i.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(i as i32), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("out {i}\n"));
        // (One of them says the sandbox's create first.)
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.ends_with(&format!("err {i}\n")), "{err}");
        assert!(
            err.lines().count() == 1 || err.contains("+ sandbox"),
            "{err}"
        );
    }
    assert_eq!(host.runner_pids().len(), 1);
    assert!(host.through_runner());
    // Every request's directory is gone.
    let left: Vec<String> = std::fs::read_dir(host.runner_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with("ctl."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn secrets_stay_off_command_lines_inspect_and_disk() {
    let host = Host::new("rs");
    const SECRET: &str = "runner-secret-value-41";
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    assert!(host.through_runner());
    let mut child = host
        .command(&[
            "exec",
            "--env",
            &format!("TOKEN={SECRET}"),
            "--",
            "sh",
            "-c",
            "echo ready; i=0; while [ ! -e /tmp/rs-go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
             [ -e /tmp/rs-go ]",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Everything below is looked at while the command runs: it waits (at
    // most a minute) until the test lets it go.
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
    // Inside the container: on no command line.
    let inside = docker(&[
        "exec",
        &host.name(),
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    ]);
    assert!(!inside.contains(SECRET), "{inside}");
    // On the host: on no command line either (but hermes's own, which
    // was given it).
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let leaks: Vec<&str> = ps
        .lines()
        .filter(|l| l.contains(SECRET) && !l.contains("--env TOKEN="))
        .collect();
    assert!(leaks.is_empty(), "{leaks:?}");
    // Not in inspect, nor in the runner's engine exec.
    let inspect = docker(&["inspect", &host.name()]);
    assert!(!inspect.contains(SECRET));
    // On disk: the environment file is gone once the runner read it.
    let on_disk = files_containing(&host.runner_dir(), SECRET);
    assert!(on_disk.is_empty(), "{on_disk:?}");
    docker(&["exec", &host.name(), "touch", "/tmp/rs-go"]);
    assert!(
        child.wait().unwrap().success(),
        "the command ended before it was let go"
    );
    assert!(files_containing(&host.runner_dir(), SECRET).is_empty());
}

/// The regular files under `dir` (not following links) that contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                stack.push(e.path());
            } else if kind.is_file()
                && std::fs::read(e.path())
                    .is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
            {
                found.push(e.path());
            }
        }
    }
    found
}

#[test]
fn a_gone_or_restarted_container_or_runner_is_started_again() {
    let host = Host::new("rg");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    assert!(host.through_runner());

    // The runner killed from inside: the next command starts another.
    let pid = host.runner_pids().pop().unwrap();
    docker(&["exec", &host.name(), "sh", "-c", &format!("kill -9 {pid}")]);
    let run = host.hermes(&["exec", "--", "echo", "again"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "again\n"));
    assert!(host.through_runner());
    assert_eq!(host.runner_pids().len(), 1);

    // A restarted container has no runner: one is started.
    docker(&["restart", "-t", "1", &host.name()]);
    let run = host.hermes(&["exec", "--", "echo", "restarted"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "restarted\n"));
    assert!(host.through_runner());
    assert_eq!(host.runner_pids().len(), 1);

    // A container removed under hermes: recreated, the command retried once.
    docker(&["rm", "-f", &host.name()]);
    let run = host.hermes(&["exec", "--", "echo", "recreated"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "recreated\n"),
        "{run:?}"
    );
    assert!(host.through_runner());
}

#[test]
fn a_runner_that_does_not_answer_is_withdrawn_and_the_engine_runs_the_command() {
    let host = Host::new("rw");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let pid = host.runner_pids().pop().unwrap();
    // Stopped: it holds its pipe but takes nothing.
    docker(&[
        "exec",
        &host.name(),
        "sh",
        "-c",
        &format!("kill -STOP {pid}"),
    ]);
    let started = Instant::now();
    let run = host.hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        &format!("echo fallback; {PARENT}"),
    ]);
    // Through the engine's exec (no runner parent), after the runner's
    // time to answer; the command ran once.
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "fallback\n\n"),
        "{run:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(30),
        "{took:?}"
    );
    // The stopped runner's pipe is retired: the next command starts a new
    // runner and goes through it.
    assert!(host.through_runner());
    docker(&[
        "exec",
        &host.name(),
        "sh",
        "-c",
        &format!("kill -CONT {pid}"),
    ]);
    // The old runner reads its request to stop and goes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while host.runner_pids().len() > 1 {
        assert!(Instant::now() < deadline, "{:?}", host.runner_pids());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_image_without_setsid_runs_everything_through_the_engine() {
    // The test image without setsid, made here.
    let image = format!("hermes-test-nosetsid:{}", std::process::id());
    let maker = format!("hermes-nosetsid-{}", std::process::id());
    docker(&[
        "run",
        "--name",
        &maker,
        &hermes_tests::test_image(),
        "rm",
        "/usr/bin/setsid",
    ]);
    docker(&["commit", &maker, &image]);
    docker(&["rm", "-f", &maker]);
    struct RemoveImage(String);
    impl Drop for RemoveImage {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
        }
    }
    let _image = RemoveImage(image.clone());

    let host = Host::with_image("rx", &image);
    let run = host.hermes(&["exec", "--", "sh", "-c", "echo works; exit 3"]);
    assert_eq!((run.code, run.stdout.as_str()), (3, "works\n"), "{run:?}");
    assert!(!host.through_runner());
    let id = docker(&["inspect", "-f", "{{.Id}}", &host.name()]);
    let marker = host.runner_dir().join(format!("unsupported.{}", id.trim()));
    let why = std::fs::read_to_string(&marker).unwrap();
    assert!(why.contains("setsid"), "{why}");
    // Not asked again: the mark is read, no runner is started.
    let out = host
        .command(&["exec", "--", "true"])
        .env("RUST_LOG", "hermes_backends=debug")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(
        logs.contains("the runner does not work in this container"),
        "{logs}"
    );
    assert!(!logs.contains("runner started"), "{logs}");
}

#[test]
fn a_sandbox_made_before_the_runner_keeps_the_engines_exec_and_is_not_recreated() {
    let host = Host::new("ro");
    assert_eq!(host.hermes(&["reconcile"]).code, 0);
    let name = host.name();
    // Its twin as an older hermes made it: same labels and hash, but no
    // runner mount and no hermes-runner label.
    let labels = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}\n{{end}}",
        &name,
    ]);
    docker(&["rm", "-f", &name]);
    let mut args = vec![
        "run".to_string(),
        "-d".into(),
        "--init".into(),
        "--name".into(),
        name.clone(),
        "-w".into(),
        "/workspace".into(),
    ];
    for label in labels
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("hermes-runner="))
    {
        args.push("--label".into());
        args.push(label.to_string());
    }
    // Its data binds, as that hermes made them: without them its disk image
    // would be no container's, and released.
    let data = host.home.path().join("sandboxes/docker/default");
    for (dir, at) in [("workspace", "/workspace"), ("home", "/root")] {
        args.push("-v".into());
        args.push(format!("{}:{at}", data.join(dir).display()));
    }
    args.extend([
        hermes_tests::test_image(),
        "sleep".into(),
        "infinity".into(),
    ]);
    docker(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let dry = host.hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    let run = host.hermes(&["exec", "--", "sh", "-c", "echo old; exit 4"]);
    assert_eq!((run.code, run.stdout.as_str()), (4, "old\n"), "{run:?}");
    assert!(!host.through_runner());
}

#[test]
fn a_session_sandbox_uses_the_runner_and_its_directory_goes_with_it() {
    let host = Host::new("rt");
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
    let read = host.hermes(&[
        "exec",
        "--session",
        "s1",
        "--",
        "sh",
        "-c",
        &format!("cat /workspace/note; {PARENT}"),
    ]);
    assert_eq!(
        (read.code, read.stdout.as_str()),
        (0, "shared\nsh -c # hermes-runner\n")
    );
    let dir = host
        .home
        .path()
        .join("run/sandboxes")
        .join(format!("{}-s1", host.name()));
    assert!(dir.is_dir());
    let end = host.hermes(&["session", "end", "s1"]);
    assert_eq!(end.code, 0, "{end:?}");
    assert!(!dir.exists());
}

#[test]
fn what_the_container_plants_in_the_runners_directory_touches_no_host_file() {
    let host = Host::new("rp");
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "host file\n").unwrap();
    let victim_dir = outside.path().join("dir");
    std::fs::create_dir(&victim_dir).unwrap();
    let v = victim.display().to_string();
    let vd = victim_dir.display().to_string();
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let id = docker(&["inspect", "-f", "{{.Id}}", &host.name()]);

    // The runner killed, and in its place: symlinks to host paths where
    // hermes looks for pipes and marks, a regular file, a directory, and a
    // pipe some process of the container reads without answering.
    let pid = host.runner_pids().pop().unwrap();
    let plant = format!(
        "kill -9 {pid}; cd /run/hermes && rm -f ctl.* && \
         ln -s {v} ctl.00aa && ln -s {vd} ctl.00bb && echo x > ctl.00cc && mkdir ctl.00dd && \
         ln -s {v} unsupported.{id} && ln -s {vd} x.999999999.00ee && \
         mkfifo ctl.00ff && (exec 3<>ctl.00ff; exec setsid sleep 300 <&3 >/dev/null 2>&1 &)",
        id = id.trim()
    );
    let run = host.hermes(&["exec", "--", "sh", "-c", &plant]);
    assert_eq!(run.code, 0, "{run:?}");

    // Commands still give the right result (the planted pipe is asked,
    // does not answer, and the engine's exec runs the command; then a new
    // runner is started).
    for _ in 0..3 {
        let run = host.hermes(&["exec", "--", "echo", "fine"]);
        assert_eq!((run.code, run.stdout.as_str()), (0, "fine\n"), "{run:?}");
    }
    assert!(host.through_runner());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file\n");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);

    // A container racing every request: whatever hermes makes is swapped
    // for links to host paths as fast as the container can.
    let racer = format!(
        "cd /run/hermes; end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do \
         for d in x.*; do [ -d \"$d\" ] || continue; for f in out err status cmd env claim; do \
         ln -sfn {v} \"$d/$f\" 2>/dev/null; done; done; done"
    );
    let race = host
        .command(&["exec", "--background", "--", "sh", "-c", &racer])
        .output()
        .unwrap();
    assert!(race.status.success(), "{race:?}");
    let until = Instant::now() + Duration::from_secs(6);
    let mut runs = 0;
    while Instant::now() < until {
        // Whatever the result, nothing outside the sandbox is touched.
        let _ = host
            .command(&[
                "exec",
                "--timeout",
                "10",
                "--env",
                "K=v",
                "--",
                "echo",
                "raced",
            ])
            .output()
            .unwrap();
        runs += 1;
    }
    assert!(runs > 0);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file\n");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 2);
}
