//! The runner's directory forged from inside, a fork bomb against the
//! timeout, and what the sandbox sees of the host through the runner.
//!
//! The sandbox is root in its container and writes `/run/hermes` (the
//! runner's directory) at will: these tests play a process of the sandbox
//! that plants its own request pipe and answers in the runner's place, and
//! a command that fills the pids limit before its timeout.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};

/// One home with a Docker profile of its own, removed when dropped.
struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    fn new(tag: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let host = Host {
            home: TestHome::with_profile(&profile),
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        };
        host.home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n",
            hermes_tests::test_image()
        ));
        host
    }

    fn hermes(&self, args: &[&str]) -> Run {
        self.command(args)
            .output()
            .unwrap_or_else(|e| panic!("running hermes: {e}"))
            .into()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home.command(all)
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    /// `sh -c script` in the sandbox through the engine (not through
    /// hermes), as root.
    fn inside(&self, script: &str) -> String {
        docker(&["exec", &self.name(), "sh", "-c", script])
    }

    /// The command lines of the sandbox's processes, one a line.
    fn command_lines(&self) -> String {
        self.inside("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
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

    /// Waits (bounded) until the sandbox counts `n` processes.
    fn expect_processes(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.processes();
            if now == n {
                return;
            }
            assert!(Instant::now() < deadline, "{now} processes, not {n}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The finding: a process of the sandbox made its own `ctl.*` pipe; hermes
/// opened it and wrote a request into it; the process read the request's
/// environment (a secret passed with `--env`) and answered with forged
/// output and exit code 0, and the real command never ran. Now hermes
/// opens no pipe it did not make: the real command runs, and the planted
/// pipe is never handed a request.
#[test]
fn a_pipe_the_sandbox_makes_is_never_handed_a_request_nor_answers_one() {
    let host = Host::new("atr");
    const SECRET: &str = "per-command-secret-7f3a";
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);

    // The impostor: the genuine runner killed, and in its place a reader of
    // a pipe of the sandbox's own making (named to be found first) that
    // steals the request's environment and answers for the runner.
    let runners = host.inside(
        "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline)\" in \
         'sh -c # hermes-runner'*' serve /run/hermes ctl.'*) echo ${p#/proc/} ;; esac; done",
    );
    assert_eq!(runners.split_whitespace().count(), 1, "{runners}");
    host.inside(&format!("kill -9 {}", runners.trim()));
    let impostor = r#"
        cd /run/hermes && mkfifo ctl.0 && exec 3<>ctl.0 && echo $$ > /tmp/impostor && : > /tmp/ready
        end=$(( $(date +%s) + 300 ))
        while [ "$(date +%s)" -lt "$end" ] && IFS= read -r n <&3; do
          echo "$n" >> /tmp/asked
          cat "$n/env" >> /tmp/stolen 2>/dev/null
          : > "$n/claim"
          printf 's\n' > "$n/status"
          printf 'forged\n' > "$n/out"
          : > "$n/err"
          printf 'e\nx 0\n' > "$n/status"
        done
    "#;
    docker(&["exec", "-d", &host.name(), "sh", "-c", impostor]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while host
        .inside("[ -e /tmp/ready ] && echo ready || true")
        .trim()
        != "ready"
    {
        assert!(Instant::now() < deadline, "the impostor did not start");
        std::thread::sleep(Duration::from_millis(100));
    }

    for round in 0..3 {
        let run = host.hermes(&[
            "exec",
            "--env",
            &format!("TOKEN={SECRET}"),
            "--",
            "sh",
            "-c",
            "echo real; exit 3",
        ]);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (3, "real\n"),
            "round {round}: {run:?}"
        );
    }
    // A line of the test's own, after whatever hermes may have written to
    // the planted pipe: once the impostor has read it, it has read those.
    // Through the impostor's own descriptor: hermes may have removed the
    // pipe's name.
    host.inside(
        "mkdir -p /tmp/sentinel && exec 4<>/proc/$(cat /tmp/impostor)/fd/3 && echo /tmp/sentinel >&4",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let asked = loop {
        let asked = host.inside("cat /tmp/asked 2>/dev/null || true");
        if asked.contains("/tmp/sentinel") {
            break asked;
        }
        assert!(Instant::now() < deadline, "the impostor stopped reading");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stolen = host.inside("cat /tmp/stolen 2>/dev/null || true");
    assert_eq!(
        asked, "/tmp/sentinel\n",
        "the planted pipe got requests: {asked}"
    );
    assert!(!stolen.contains(SECRET), "{stolen}");
}

/// The smaller leaks: the runner's files named after the host's process
/// id, and the runner's whole script on its command lines. Now the names
/// are random and the script is a file; the runner's processes are still
/// told from the commands they run (idleness).
#[test]
fn the_runner_shows_the_sandbox_no_host_pid_and_no_script() {
    let host = Host::new("atl");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    // One process, which waits (at most a minute) until the test lets it
    // go: everything below is looked at while it runs.
    let mut child = host
        .command(&[
            "exec",
            "--",
            "sh",
            "-c",
            "mkfifo /tmp/atl-go && echo ready && exec bash -c 'exec 3<>/tmp/atl-go; read -t 60 -u 3 line'",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();

    let names = host.inside("ls -a /run/hermes; ls -a /run/hermes/x.* 2>/dev/null || true");
    assert!(names.contains("x."), "no request seen: {names}");
    let pid_part = format!(".{pid}.");
    assert!(
        !names.contains(&pid_part),
        "hermes's pid {pid} is in the sandbox's names: {names}"
    );
    let lines = host.command_lines();
    assert!(lines.contains("hermes-runner"), "{lines}");
    for part_of_the_script in ["hermes_check", "hermes_drop", "hermes_boot"] {
        assert!(
            !lines.contains(part_of_the_script),
            "the runner's script is on a command line: {lines}"
        );
    }
    // The command makes the sandbox busy; the runner does not.
    assert_eq!(host.processes(), 1);
    host.inside("echo go > /tmp/atl-go");
    assert!(
        child.wait().unwrap().success(),
        "the command ended before it was let go"
    );
    host.expect_processes(0, Duration::from_secs(30));
}

/// The finding: a fork bomb filled the sandbox's pids limit; the kill of
/// the timeout needed to start a process and fork inside the sandbox,
/// could not, and the bomb outlived its timeout (the sandbox "busy" for
/// ever, never reaped). Now the kill is done from the host: the exec ends
/// with 124 in bounded time, and nothing of the command is left.
#[test]
fn a_fork_bomb_is_killed_at_its_timeout_under_a_full_pids_limit() {
    let host = Host::new("atb");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let limit = docker(&["inspect", "-f", "{{.HostConfig.PidsLimit}}", &host.name()]);
    let limit: u64 = limit.trim().parse().unwrap();
    assert!(limit > 0 && limit <= 4096, "pids limit {limit}");

    // Shells that keep forking sleepers, retrying when the limit is full.
    let bomb =
        "for i in 1 2 3 4; do bash -c 'while :; do sleep 1000 & done' 2>/dev/null & done; wait";
    let started = Instant::now();
    let run = host.hermes(&["exec", "--timeout", "3", "--", "sh", "-c", bomb]);
    let took = started.elapsed();
    assert_eq!(run.code, 124, "{run:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");

    // Seen from the host (the engine's top needs no room in the sandbox).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let top = docker(&["top", &host.name(), "-o", "pid,args"]);
        let left = top
            .lines()
            .filter(|l| l.contains("sleep 1000") || l.contains("bash -c"))
            .count();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} processes of the bomb left:\n{}",
            top.lines().take(20).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Not busy, and it still serves commands.
    host.expect_processes(0, Duration::from_secs(30));
    let run = host.hermes(&["exec", "--", "echo", "alive"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "alive\n"), "{run:?}");
}
