//! The terminal contract of `hermes exec`, one table run against every
//! backend that runs here: `local` (this host), `docker` (the real engine),
//! `ssh` (a real OpenSSH server in a container) and the three cloud
//! services' contract fakes (`modal`, `daytona`, `vercel_sandbox`, which
//! run their sandboxes' commands on this host) and `singularity`, through
//! a stand-in `apptainer` first on hermes's PATH
//! (`tests/fixtures/apptainer-standin/apptainer`: Apptainer's command line
//! for the commands hermes runs, each command run on this host in a mount
//! namespace where the instance's /workspace, /root and /tmp stand; no
//! isolation, no image). The real runtime is `tests/singularity.rs`'s.
//! `kubernetes` runs against a real kube-apiserver
//! ([`hermes_tests::kube_harness`]): each command through the Pod's `exec`
//! subresource over WebSocket, in a container of the test engine.
//!
//! For each backend, through the real `hermes` binary: a single argument
//! is a shell command line and several an argv kept intact; standard input
//! reaches the command; a command not found exits 127; a timeout exits 124
//! with the whole process tree killed; the directory a command line leaves
//! is where the next command (another hermes process) starts, `--cwd`
//! moving only its own command; `--background` starts a command and
//! returns at once; `--env` and forwarded values reach one command only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::ProfileCleanup;
use hermes_tests::fakes::daytona::FakeDaytona;
use hermes_tests::fakes::modal::FakeModal;
use hermes_tests::fakes::vercel::FakeVercel;
use hermes_tests::sshd::Sshd;

const MODAL_ID: &str = "ak-contract-token-id";
const MODAL_SECRET: &str = "as-contract-token-secret-0123";
const DAYTONA_KEY: &str = "dtn_contract_key_0123456789";
const VERCEL_TOKEN: &str = "vercel_contract_token_0123456789";
const VERCEL_TEAM: &str = "team_contract";
const VERCEL_PROJECT: &str = "prj_contract";

/// One backend under test: its config, the environment hermes runs with,
/// and what keeps its server alive.
struct Backend {
    name: &'static str,
    home: TestHome,
    /// Where hermes runs (the local backend's commands start there).
    cwd: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    profile: String,
    /// Whether a forwarded variable is configured (`FWD_ME`).
    forwards: bool,
    /// Whether the backend forwards standard input.
    stdin: bool,
    _keep: Keep,
}

#[allow(dead_code)]
enum Keep {
    Nothing,
    Docker(ProfileCleanup),
    Ssh(Box<Sshd>),
    Modal(FakeModal, tokio::runtime::Runtime),
    Daytona(FakeDaytona),
    Vercel(FakeVercel),
    Singularity(StandIn),
    Kube(Box<hermes_tests::kube_harness::Harness>),
}

/// The stand-in `apptainer` in a directory of its own (its instances
/// beside it); every instance it started is stopped at the end.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    fn new() -> StandIn {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let program = bin.join("apptainer");
        std::fs::write(
            &program,
            include_str!("../fixtures/apptainer-standin/apptainer"),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        StandIn { dir }
    }

    fn program(&self) -> std::path::PathBuf {
        self.dir.path().join("bin").join("apptainer")
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.program())
            .args(["instance", "stop", "--all"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Backend {
    fn new(
        name: &'static str,
        config: String,
        env: Vec<(&'static str, String)>,
        keep: Keep,
    ) -> Backend {
        let profile = format!("ec{}{}", name.replace('_', ""), std::process::id());
        let home = TestHome::with_profile(&profile);
        home.write_config(config);
        let forwards = !matches!(name, "local" | "local_bwrap" | "ssh");
        Backend {
            name,
            home,
            cwd: tempfile::tempdir().unwrap(),
            env,
            profile,
            forwards,
            // Daytona's and Vercel's exec APIs take no input.
            stdin: !matches!(name, "daytona" | "vercel_sandbox"),
            _keep: keep,
        }
    }

    /// The local backend with each command under bubblewrap.
    fn local_bwrap() -> Backend {
        Backend::new(
            "local_bwrap",
            "terminal:\n  backend: local\n  local_sandbox: bwrap\n".into(),
            Vec::new(),
            Keep::Nothing,
        )
    }

    fn local() -> Backend {
        Backend::new(
            "local",
            "terminal:\n  backend: local\n".into(),
            Vec::new(),
            Keep::Nothing,
        )
    }

    fn docker() -> Backend {
        let mut b = Backend::new(
            "docker",
            format!(
                "terminal:\n  backend: docker\n  docker_image: {}\n  docker_forward_env: [FWD_ME]\n",
                hermes_tests::test_image()
            ),
            Vec::new(),
            Keep::Nothing,
        );
        b._keep = Keep::Docker(ProfileCleanup(b.profile.clone()));
        b
    }

    /// The docker backend with its sandbox under gVisor's runsc.
    fn docker_runsc() -> Backend {
        let mut b = Backend::new(
            "docker_runsc",
            format!(
                "terminal:\n  backend: docker\n  docker_image: {}\n  docker_runtime: {}\n  docker_forward_env: [FWD_ME]\n",
                hermes_tests::test_image(),
                hermes_tests::runsc_runtime(),
            ),
            Vec::new(),
            Keep::Nothing,
        );
        b._keep = Keep::Docker(ProfileCleanup(b.profile.clone()));
        b
    }

    fn ssh() -> Backend {
        let sshd = Sshd::start();
        Backend::new(
            "ssh",
            sshd.config(""),
            Vec::new(),
            Keep::Ssh(Box::new(sshd)),
        )
    }

    fn modal() -> Backend {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fake = runtime.block_on(FakeModal::start(MODAL_ID, MODAL_SECRET));
        let env = vec![
            ("MODAL_SERVER_URL", fake.url()),
            ("MODAL_TOKEN_ID", MODAL_ID.into()),
            ("MODAL_TOKEN_SECRET", MODAL_SECRET.into()),
        ];
        Backend::new(
            "modal",
            "terminal:\n  backend: modal\n  modal_image: python:3.12\n  modal_forward_env: [FWD_ME]\n"
                .into(),
            env,
            Keep::Modal(fake, runtime),
        )
    }

    fn daytona() -> Backend {
        let fake = FakeDaytona::start(DAYTONA_KEY);
        let env = vec![
            ("DAYTONA_API_URL", fake.api_url()),
            ("DAYTONA_API_KEY", DAYTONA_KEY.into()),
        ];
        Backend::new(
            "daytona",
            "terminal:\n  backend: daytona\n  daytona_image: python:3.12\n  container_disk: 8192\n  daytona_forward_env: [FWD_ME]\n".into(),
            env,
            Keep::Daytona(fake),
        )
    }

    fn vercel() -> Backend {
        let fake = FakeVercel::start(VERCEL_TOKEN, VERCEL_TEAM, VERCEL_PROJECT);
        let env = vec![
            ("VERCEL_API_URL", fake.api_url()),
            ("VERCEL_TOKEN", VERCEL_TOKEN.into()),
            ("VERCEL_TEAM_ID", VERCEL_TEAM.into()),
            ("VERCEL_PROJECT_ID", VERCEL_PROJECT.into()),
        ];
        Backend::new(
            "vercel_sandbox",
            "terminal:\n  backend: vercel_sandbox\n  vercel_runtime: python3.13\n  vercel_forward_env: [FWD_ME]\n".into(),
            env,
            Keep::Vercel(fake),
        )
    }

    fn singularity() -> Backend {
        let standin = StandIn::new();
        let path = format!(
            "{}:{}",
            standin.program().parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Backend::new(
            "singularity",
            "terminal:\n  backend: singularity\n  docker_forward_env: [FWD_ME]\n".into(),
            vec![("PATH", path)],
            Keep::Singularity(standin),
        )
    }

    fn kubernetes() -> Backend {
        let harness = hermes_tests::kube_harness::Harness::start();
        Backend::new(
            "kubernetes",
            harness.config("  docker_forward_env: [FWD_ME]\n"),
            Vec::new(),
            Keep::Kube(Box::new(harness)),
        )
    }

    /// `hermes --profile P exec ARGS…` with `input` on its standard input
    /// (closed at its end) and `extra` in its environment.
    fn exec_with(&self, args: &[&str], input: Option<&str>, extra: &[(&str, &str)]) -> Run {
        self.spawn(args, input, extra, Stdio::piped())
    }

    /// `exec` with its stdout a pipe whose reader is already gone, as
    /// under `| head` once head has read enough.
    fn exec_closed_stdout(&self, args: &[&str]) -> Run {
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        self.spawn(args, None, &[], Stdio::from(writer))
    }

    fn spawn(
        &self,
        args: &[&str],
        input: Option<&str>,
        extra: &[(&str, &str)],
        stdout: Stdio,
    ) -> Run {
        let mut all = vec!["--profile", self.profile.as_str(), "exec"];
        // A command given without options: after `--`.
        if args.first().is_some_and(|a| !a.starts_with("--")) {
            all.push("--");
        }
        all.extend_from_slice(args);
        let mut cmd = self.home.command(all);
        cmd.current_dir(self.cwd.path())
            .env_remove("FWD_ME")
            .env_remove("MODAL_SERVER_URL")
            .env_remove("DAYTONA_API_URL")
            .env_remove("VERCEL_API_URL");
        if !self.name.starts_with("local") {
            cmd.env("HOME", self.home.path());
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(stdout)
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(text) = input {
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(text.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap().into()
    }

    fn exec(&self, args: &[&str]) -> Run {
        self.exec_with(args, None, &[])
    }

    /// `hermes --profile P process ARGS…`, as `exec` runs.
    fn process(&self, args: &[&str]) -> Run {
        let mut all = vec!["process"];
        all.extend_from_slice(args);
        self.hermes(&all)
    }

    /// `hermes --profile P ARGS…`, as `exec` runs.
    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        let mut cmd = self.home.command(all);
        cmd.current_dir(self.cwd.path())
            .env_remove("MODAL_SERVER_URL")
            .env_remove("DAYTONA_API_URL")
            .env_remove("VERCEL_API_URL")
            .stdin(Stdio::null());
        if !self.name.starts_with("local") {
            cmd.env("HOME", self.home.path());
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output().unwrap().into()
    }

    /// `process list --output json`: (id, state, exit code) of each.
    fn processes(&self) -> Vec<(String, String, Option<i64>)> {
        let run = self.process(&["list", "--output", "json"]);
        assert_eq!(run.code, 0, "{}: {run:?}", self.name);
        let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        doc["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().unwrap().to_string(),
                    p["state"].as_str().unwrap().to_string(),
                    p["exit_code"].as_i64(),
                )
            })
            .collect()
    }

    /// Waits (30 s at most) until `process list` gives `id` `state`.
    fn await_process(&self, id: &str, state: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let all = self.processes();
            if all.iter().any(|(i, s, _)| i == id && s == state) {
                return;
            }
            assert!(
                Instant::now() < until,
                "{}: {id} never {state}: {all:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `exec` that must succeed: its stdout.
    /// `found` for each process whose command line starts with `what`,
    /// where the backend's commands run: under bwrap each command has a
    /// sandbox (and processes) of its own, so there it is this host's.
    fn running(&self, what: &str) -> String {
        if self.name == "local_bwrap" {
            let out = std::process::Command::new("sh")
                .args(["-c", FIND_PROC, "-", what])
                .output()
                .unwrap();
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        self.out(&["sh", "-c", FIND_PROC, "-", what])
    }

    fn out(&self, args: &[&str]) -> String {
        let run = self.exec(args);
        assert_eq!(run.code, 0, "{}: {args:?}: {run:?}", self.name);
        run.stdout
    }
}

/// A shell loop that prints `found` for every process whose command line
/// starts with `$1 ` (`sleep 3123 `; the loop's own does not).
const FIND_PROC: &str = r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); case $c in "$1 "*) echo found ;; esac; done"#;

/// Checks every line of the contract on `b`.
fn contract(b: &Backend) {
    let name = b.name;

    // A single argument is a shell command line.
    assert_eq!(
        b.out(&["X=1; echo \"$X and $((1+2))\" | tr a-z A-Z"]),
        "1 AND 3\n",
        "{name}"
    );
    // Several arguments are an argv, kept intact (never re-split or
    // expanded).
    assert_eq!(
        b.out(&[
            "sh",
            "-c",
            "printf '<%s>' \"$@\"",
            "-",
            "a  b",
            "$HOME",
            "*"
        ]),
        "<a  b><$HOME><*>",
        "{name}"
    );

    // Standard input reaches the command, as a line or an argv.
    if b.stdin {
        let run = b.exec_with(&["--", "cat"], Some("piped in\n"), &[]);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, "piped in\n"),
            "{name}: {run:?}"
        );
        let run = b.exec_with(&["--", "tr a-z A-Z"], Some("loud\n"), &[]);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, "LOUD\n"),
            "{name}: {run:?}"
        );
    }

    // A command that is not found exits 127, as an argv or a line.
    let run = b.exec(&["--", "no-such-command-x", "arg"]);
    assert_eq!(run.code, 127, "{name}: {run:?}");
    assert!(run.stderr.contains("no-such-command-x"), "{name}: {run:?}");
    let run = b.exec(&["--", "no-such-command-x --flag"]);
    assert_eq!(run.code, 127, "{name}: {run:?}");
    // The command's own exit code.
    assert_eq!(b.exec(&["--", "exit 7"]).code, 7, "{name}");

    // A timeout exits 124 and kills the whole tree.
    let long = format!("31{}", std::process::id() % 10_000);
    let started = Instant::now();
    let run = b.exec(&[
        "--timeout",
        "2",
        "--",
        &format!("sleep {long} & sleep {long}; echo never"),
    ]);
    assert_eq!(run.code, 124, "{name}: {run:?}");
    assert!(
        run.stderr.contains("[Command timed out after 2s]"),
        "{name}: {run:?}"
    );
    assert!(!run.stdout.contains("never"), "{name}: {run:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "{name}");
    let sleeping = format!("sleep {long}");
    let left = eventually_empty(|| b.running(&sleeping));
    assert_eq!(left, "", "{name}: the timed-out tree survived");

    // A closed standard output (`| head` done reading) ends hermes
    // quietly with 141, 128 + SIGPIPE, as a pipeline's writer ends.
    // (A config warning may come first: nothing else.)
    let quiet = |run: &Run| !run.stderr.lines().any(|l| !l.starts_with("warning: "));
    let run = b.exec_closed_stdout(&["--timeout", "60", "--", "seq 1 200000"]);
    assert!(run.code == 141 && quiet(&run), "{name}: {run:?}");
    // Where the output streams as it comes, the command is ended with it:
    // an endless writer does not run on to its timeout.
    if matches!(
        name,
        "local" | "local_bwrap" | "docker" | "docker_runsc" | "ssh" | "singularity" | "kubernetes"
    ) {
        let writer = format!("yes closed-{long}");
        let started = Instant::now();
        let run = b.exec_closed_stdout(&["--timeout", "60", "--", &writer]);
        assert!(run.code == 141 && quiet(&run), "{name}: {run:?}");
        assert!(started.elapsed() < Duration::from_secs(30), "{name}");
        let left = eventually_empty(|| b.running(&writer));
        assert_eq!(left, "", "{name}: the writer outlived its closed output");
    }

    // The directory a command line leaves carries over to the next
    // command (a new hermes process each); --cwd moves one command only;
    // an argv's own `cd` ends with it.
    let start = b.out(&["pwd"]);
    let start = start.trim_end();
    assert_eq!(
        b.out(&["mkdir -p carried/deeper && cd carried"]),
        "",
        "{name}"
    );
    let here = format!("{start}/carried\n");
    assert_eq!(b.out(&["pwd"]), here, "{name}");
    // (Vercel's fake keeps a sandbox's files under a directory of this
    // host, and its `pwd` prints that: an absolute --cwd is checked on the
    // others.)
    if name != "vercel_sandbox" {
        assert_eq!(b.out(&["--cwd", "/", "--", "pwd"]), "/\n", "{name}");
    }
    // A --cwd that is not there: one line and 126, the command not run.
    let run = b.exec(&["--cwd", "/no/such/dir-x", "--", "echo ran"]);
    let said: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.starts_with("warning: "))
        .collect();
    assert_eq!(
        (run.code, run.stdout.as_str(), said),
        (
            126,
            "",
            vec!["hermes: --cwd /no/such/dir-x: no such directory in the sandbox"]
        ),
        "{name}: {run:?}"
    );
    assert_eq!(b.out(&["sh", "-c", "cd deeper"]), "", "{name}");
    assert_eq!(b.out(&["pwd"]), here, "{name}");
    let run = b.exec(&["cd deeper; exit 3; echo no"]);
    assert_eq!((run.code, run.stdout.as_str()), (3, ""), "{name}: {run:?}");
    assert_eq!(
        b.out(&["pwd"]),
        format!("{start}/carried/deeper\n"),
        "{name}"
    );
    assert_eq!(b.out(&["cd .."]), "", "{name}");

    {
        // --background starts the command and returns at once, leaving it
        // running: here it runs until the test lets it go (at most a minute),
        // and says whether it was let go.
        let started = Instant::now();
        let run = b.exec(&[
            "--background",
            "--",
            "echo waiting; i=0; while [ ! -e bg-go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
             if [ -e bg-go ]; then echo done; else echo gave up; fi > bg-marker; echo let go >&2; exit 5",
        ]);
        assert_eq!(run.code, 0, "{name}: {run:?}");
        assert!(
            run.stderr.contains("started in the background"),
            "{name}: {run:?}"
        );
        // Its id alone on stdout, for `hermes process`.
        let id = run.stdout.trim_end().to_string();
        assert!(
            id.len() == 8 && id.bytes().all(|c| c.is_ascii_hexdigit()),
            "{name}: {run:?}"
        );
        b.await_process(&id, "running");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{name}: {:?}",
            started.elapsed()
        );
        assert_eq!(
            b.out(&["cat bg-marker 2>/dev/null || echo not yet"]),
            "not yet\n",
            "{name}"
        );
        assert_eq!(b.out(&["touch bg-go"]), "", "{name}");
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let now = b.out(&["cat bg-marker 2>/dev/null || echo not yet"]);
            if now == "done\n" {
                break;
            }
            assert_ne!(
                now, "gave up\n",
                "{name}: the background command was not let go"
            );
            assert!(
                Instant::now() < until,
                "{name}: the background command did not run"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        // Its exit code and output are kept: list and logs read them.
        b.await_process(&id, "exited");
        assert!(
            b.processes()
                .contains(&(id.clone(), "exited".to_string(), Some(5))),
            "{name}: {:?}",
            b.processes()
        );
        let logs = b.process(&["logs", &id]);
        assert_eq!(
            (logs.code, logs.stdout.as_str()),
            (0, "waiting\nlet go\n"),
            "{name}: {logs:?}"
        );
        assert!(
            logs.stderr.contains(&format!("process {id} exited 5")),
            "{name}: {logs:?}"
        );
        let tail = b.process(&["logs", "--tail", "1", &id]);
        assert_eq!(tail.stdout, "let go\n", "{name}: {tail:?}");
        // Kill stops it and what it started; an unknown id is an error.
        let run = b.exec(&["--background", "--", "sleep 3124 & sleep 3125"]);
        assert_eq!(run.code, 0, "{name}: {run:?}");
        let sleeper = run.stdout.trim_end().to_string();
        b.await_process(&sleeper, "running");
        let killed = b.process(&["kill", &sleeper]);
        assert_eq!(
            (killed.code, killed.stdout.starts_with("Killed process")),
            (0, true),
            "{name}: {killed:?}"
        );
        b.await_process(&sleeper, "killed");
        for left in ["sleep 3124", "sleep 3125"] {
            let still = eventually_empty(|| b.running(left));
            assert_eq!(still, "", "{name}: {left} outlived the kill");
        }
        let again = b.process(&["kill", "--output", "json", &sleeper]);
        assert!(
            again.stdout.contains("\"not running\""),
            "{name}: {again:?}"
        );
        let unknown = b.process(&["logs", "0badc0de"]);
        assert_eq!(unknown.code, 1, "{name}: {unknown:?}");
        assert!(
            unknown.stderr.contains("no background process 0badc0de"),
            "{name}: {unknown:?}"
        );

        let run = b.exec(&["--background", "--", "no-such-command-x", "a"]);
        assert_eq!(run.code, 127, "{name}: {run:?}");
    }

    // The per-command environment: --env reaches that command only, and a
    // forwarded variable has this process's value each time.
    let run = b.exec(&["--env", "ONE_ONLY=here", "--", "echo ${ONE_ONLY-unset}"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "here\n"),
        "{name}: {run:?}"
    );
    assert_eq!(b.out(&["echo ${ONE_ONLY-unset}"]), "unset\n", "{name}");
    if b.forwards {
        for value in ["first", "second"] {
            let run = b.exec_with(&["--", "echo ${FWD_ME-unset}"], None, &[("FWD_ME", value)]);
            assert_eq!(
                (run.code, run.stdout.trim_end()),
                (0, value),
                "{name}: {run:?}"
            );
        }
    }
}

/// Runs `look` until it prints nothing (at most 30 s); its last output.
fn eventually_empty(look: impl Fn() -> String) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = look();
        if now.is_empty() || Instant::now() >= until {
            return now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_terminal_contract_on_local() {
    contract(&Backend::local());
}

#[test]
fn the_terminal_contract_on_local_under_bubblewrap() {
    contract(&Backend::local_bwrap());
}

#[test]
fn the_terminal_contract_on_docker() {
    let b = Backend::docker();
    contract(&b);
    // One container for all of it.
    let containers = hermes_tests::docker_cli::containers_of(&b.profile);
    assert_eq!(containers.len(), 1, "{containers:?}");
}

#[test]
fn the_terminal_contract_on_docker_under_gvisor() {
    let b = Backend::docker_runsc();
    contract(&b);
    let containers = hermes_tests::docker_cli::containers_of(&b.profile);
    assert_eq!(containers.len(), 1, "{containers:?}");
    let runtime = hermes_tests::docker_cli::docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.Runtime}}",
        &containers[0].0,
    ]);
    assert_eq!(runtime.trim(), hermes_tests::runsc_runtime());
}

#[test]
fn the_terminal_contract_on_ssh() {
    contract(&Backend::ssh());
}

#[test]
fn the_terminal_contract_on_modal() {
    contract(&Backend::modal());
}

#[test]
fn the_terminal_contract_on_daytona() {
    contract(&Backend::daytona());
}

#[test]
fn the_terminal_contract_on_vercel_sandbox() {
    contract(&Backend::vercel());
}

#[test]
fn the_terminal_contract_on_kubernetes() {
    let b = Backend::kubernetes();
    contract(&b);
    // One Pod for all of it, made by hermes, with its claim.
    let Keep::Kube(harness) = &b._keep else {
        unreachable!()
    };
    let ns = &harness.namespace;
    let pods = harness.names(&format!(
        "/api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io/managed-by%3Dhermes"
    ));
    assert_eq!(pods.len(), 1, "{pods:?}");
    let claims = harness.names(&format!("/api/v1/namespaces/{ns}/persistentvolumeclaims"));
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].0, format!("{}-data", pods[0].0));
}

#[test]
fn the_terminal_contract_on_singularity_s_stand_in() {
    let b = Backend::singularity();
    contract(&b);
    // One instance for all of it, its files in its overlay.
    let Keep::Singularity(standin) = &b._keep else {
        unreachable!()
    };
    let list = std::process::Command::new(standin.program())
        .args(["instance", "list", "--json"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let names: Vec<&str> = list["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"].as_str().unwrap())
        .collect();
    assert_eq!(names, [format!("hermes-{}-default", b.profile)]);
    let marker = b
        .home
        .path()
        .join("sandboxes/singularity")
        .join(&b.profile)
        .join("default/overlay/upper/workspace/carried/bg-marker");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "done\n");

    // `hermes down` stops the instance by its plan, its overlay kept; the
    // next exec starts it again with its files.
    let target = format!("singularity {}/default", b.profile);
    let planned = b.hermes(&["down", "--dry-run"]);
    assert_eq!(planned.code, 2, "{planned:?}");
    assert_eq!(
        planned.planned(),
        [(target, "stop".to_string())],
        "{planned:?}"
    );
    let down = b.hermes(&["down", "--yes"]);
    assert_eq!(down.code, 0, "{down:?}");
    assert_eq!(down.done(), planned.planned(), "{down:?}");
    let list = std::process::Command::new(standin.program())
        .args(["instance", "list", "--json"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["instances"], serde_json::json!([]), "{list}");
    assert_eq!(b.hermes(&["down", "--dry-run"]).code, 0);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "done\n");
    assert_eq!(b.out(&["cat carried/bg-marker"]), "done\n");
}
