//! The Docker backend against the real engine: hardened create, observe and
//! find, idempotent operations, exec with live output, timeouts that kill
//! the whole process tree, and a container that is gone.
//!
//! Every test makes sandboxes of a profile of its own and removes them at
//! the end, also when it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, KillContainerOptionsBuilder};
use hermes_backends::docker::{
    CreateOutcome, DockerError, EXEC_ID_ENV, Engine, ExecOutcome, ExecRequest, ImageOutcome,
    RemoveOutcome,
};
use hermes_backends::model::config::load;
use hermes_backends::model::observed::{ContainerState, ObservedContainer};
use hermes_backends::model::sandbox::{SandboxKey, SandboxSpec, parse_extra_args};
use hermes_tests::{engine, test_image};
use tokio::io::AsyncReadExt;

/// A name no other test (or run) uses.
fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{:x}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Removes the containers it was told about when dropped, on a runtime of
/// its own, so that a failing test cleans up too.
#[derive(Debug, Default)]
struct Cleanup {
    names: Mutex<Vec<String>>,
}

impl Cleanup {
    fn add(&self, name: &str) {
        self.names.lock().unwrap().push(name.to_string());
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.names.lock().unwrap_or_else(|e| e.into_inner()));
        if names.is_empty() {
            return;
        }
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let engine = Engine::connect().await.unwrap();
                for name in names {
                    if let Err(e) = engine.remove(&name).await {
                        eprintln!("cleanup: {e}");
                    }
                }
            });
        })
        .join();
    }
}

/// One test's engine, home directory and containers. Fields drop in
/// order: the containers go before the home directory they mount.
struct Fixture {
    cleanup: Cleanup,
    engine: Engine,
    docker: Docker,
    profile: String,
    home: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Fixture {
        Fixture {
            cleanup: Cleanup::default(),
            engine: Engine::connect().await.expect("the engine answers"),
            docker: engine().await,
            profile: unique("t"),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// The persistent sandbox of task `task` for a config with the test
    /// image and `terminal_extra` (indented `terminal:` keys).
    fn spec(&self, task: &str, terminal_extra: &str) -> SandboxSpec {
        let text = format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n{terminal_extra}",
            test_image()
        );
        let config = load(&text)
            .unwrap_or_else(|e| panic!("{}", e.render("config.yaml")))
            .config;
        let extra = parse_extra_args(&config.terminal.docker_extra_args).unwrap();
        let spec = SandboxSpec::new(
            &config,
            SandboxKey::persistent(&self.profile, task),
            self.home.path(),
            &extra,
        );
        self.cleanup.add(&spec.name);
        spec
    }

    async fn create(&self, spec: &SandboxSpec) -> String {
        match self.engine.create(spec).await.unwrap() {
            CreateOutcome::Created { id } => id,
            CreateOutcome::AlreadyExists => panic!("{} existed before the test", spec.name),
        }
    }

    async fn running(&self, task: &str, terminal_extra: &str) -> (SandboxSpec, String) {
        let spec = self.spec(task, terminal_extra);
        let id = self.create(&spec).await;
        self.engine.start(&id).await.unwrap();
        (spec, id)
    }

    async fn observed(&self, name: &str) -> Option<ObservedContainer> {
        self.engine
            .observe()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.name == name)
    }
}

struct Ran {
    outcome: ExecOutcome,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Ran {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

fn request(cmd: &[&str]) -> ExecRequest {
    ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: None,
        timeout: Duration::from_secs(60),
    }
}

async fn run(engine: &Engine, container: &str, req: &ExecRequest) -> Ran {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let outcome = engine
        .exec(container, req, &mut stdout, &mut stderr)
        .await
        .unwrap_or_else(|e| panic!("exec {:?}: {e}", req.cmd));
    Ran {
        outcome,
        stdout,
        stderr,
    }
}

/// The command lines of every process in the container, one a line.
async fn command_lines(engine: &Engine, container: &str) -> String {
    let ran = run(
        engine,
        container,
        &request(&[
            "sh",
            "-c",
            r"for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
        ]),
    )
    .await;
    assert_eq!(ran.outcome.exit_code, 0, "{}", ran.err());
    ran.out()
}

#[tokio::test]
async fn a_persistent_sandbox_is_created_hardened_and_its_env_values_stay_off_every_command_line() {
    let f = Fixture::new().await;
    let secret = unique("value-of-the-secret");
    let (spec, id) = f
        .running(
            "default",
            &format!(
                "  container_memory: 512\n  container_cpu: 0.5\n  docker_shm_size: 64m\n  \
                 docker_env:\n    HERMES_TEST_SECRET: {secret}\n"
            ),
        )
        .await;

    let info = f.docker.inspect_container(&id, None).await.unwrap();
    let host = info.host_config.clone().unwrap();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(host.cap_drop, Some(strings(&["ALL"])));
    assert_eq!(
        host.cap_add,
        Some(strings(&[
            "DAC_OVERRIDE",
            "CHOWN",
            "FOWNER",
            "SETUID",
            "SETGID"
        ]))
    );
    assert_eq!(host.security_opt, Some(strings(&["no-new-privileges"])));
    assert_eq!(host.pids_limit, Some(256));
    let tmpfs: BTreeMap<String, String> = host.tmpfs.unwrap().into_iter().collect();
    assert_eq!(
        tmpfs,
        BTreeMap::from([
            ("/run".to_string(), "rw,noexec,nosuid,size=64m".to_string()),
            ("/tmp".to_string(), "rw,nosuid,size=512m".to_string()),
            (
                "/var/tmp".to_string(),
                "rw,noexec,nosuid,size=256m".to_string()
            ),
        ])
    );
    assert_ne!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.memory, Some(512 << 20));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.shm_size, Some(64 << 20));
    assert_eq!(host.init, Some(true));
    assert_eq!(
        host.binds,
        Some(spec.binds.iter().map(|b| b.to_engine()).collect())
    );
    for dir in &spec.host_dirs {
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    }

    let config = info.config.clone().unwrap();
    assert_eq!(config.cmd, Some(strings(&["sleep", "infinity"])));
    assert_eq!(config.working_dir.as_deref(), Some("/workspace"));
    assert_eq!(
        config
            .labels
            .clone()
            .unwrap()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        spec.labels
    );
    // The value is in the environment, where it belongs ...
    let env_line = format!("HERMES_TEST_SECRET={secret}");
    assert!(config.env.clone().unwrap().contains(&env_line));
    // ... and on no command line.
    let command_line_fields = [
        config.cmd.unwrap_or_default(),
        config.entrypoint.unwrap_or_default(),
        info.args.unwrap_or_default(),
        info.path.into_iter().collect(),
    ];
    for field in &command_line_fields {
        assert!(
            !field.iter().any(|a| a.contains(&secret)),
            "the secret is on a command line: {field:?}"
        );
    }

    // The sandbox's processes see it.
    let ran = run(
        &f.engine,
        &id,
        &request(&["sh", "-c", r#"printf %s "$HERMES_TEST_SECRET""#]),
    )
    .await;
    assert_eq!(ran.out(), secret);

    // Not on the host's process list, nor inside the container's.
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .expect("ps runs on the host");
    assert!(ps.status.success());
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(ps.contains("sleep infinity"), "ps sees the sandbox: {ps}");
    assert!(!ps.contains(&secret), "the secret is on the host's ps");
    assert!(!command_lines(&f.engine, &id).await.contains(&secret));

    assert_eq!(f.engine.remove(&id).await.unwrap(), RemoveOutcome::Removed);
}

#[tokio::test]
async fn a_sandbox_without_network_runs_with_network_mode_none_and_only_loopback() {
    let f = Fixture::new().await;
    let (_spec, id) = f.running("offline", "  docker_network: false\n").await;

    let info = f.docker.inspect_container(&id, None).await.unwrap();
    assert_eq!(
        info.host_config.unwrap().network_mode.as_deref(),
        Some("none")
    );
    let ran = run(&f.engine, &id, &request(&["ls", "/sys/class/net"])).await;
    assert_eq!(ran.out().split_whitespace().collect::<Vec<_>>(), ["lo"]);

    f.engine.remove(&id).await.unwrap();
}

#[tokio::test]
async fn observe_and_find_see_the_sandbox_and_create_start_and_remove_are_idempotent() {
    let f = Fixture::new().await;
    let before = now();
    let spec = f.spec("default", "");
    let id = f.create(&spec).await;
    assert_eq!(
        f.engine.create(&spec).await.unwrap(),
        CreateOutcome::AlreadyExists,
        "a second create answers 409 for the name"
    );

    let created = f.observed(&spec.name).await.expect("observe lists it");
    assert_eq!(created.id, id);
    assert_eq!(created.state, ContainerState::Created);
    assert_eq!(created.labels, spec.labels);
    assert_eq!(created.spec_hash(), Some(spec.hash()));
    assert_eq!(created.profile(), Some(f.profile.as_str()));
    assert_eq!(created.task(), Some("default"));
    assert!(
        (before - 5..=now() + 5).contains(&created.created),
        "{created:?}"
    );
    assert_eq!(
        (created.started_at, created.finished_at, created.processes),
        (None, None, None)
    );

    f.engine.start(&id).await.unwrap();
    f.engine.start(&id).await.expect("starting twice is fine");
    let running = f.observed(&spec.name).await.unwrap();
    assert_eq!(running.state, ContainerState::Running);
    let started = running.started_at.expect("a running container started");
    assert!((before - 5..=now() + 5).contains(&started), "{running:?}");
    assert_eq!(running.finished_at, None);
    assert_eq!(running.processes, Some(0), "only the init and the keeper");

    let found = f
        .engine
        .find(&spec.key)
        .await
        .unwrap()
        .expect("found by key");
    assert_eq!(found.id, id);
    assert_eq!(found.name, spec.name);
    assert_eq!(found.state, ContainerState::Running);
    assert_eq!(found.labels, spec.labels);
    assert_eq!(found.created, created.created);
    assert_eq!(found.started_at, Some(started));
    let missing = SandboxKey::persistent(&f.profile, "no-such-task");
    assert_eq!(f.engine.find(&missing).await.unwrap(), None);

    // Background work counts as processes.
    let ran = run(
        &f.engine,
        &id,
        &request(&["sh", "-c", "sleep 30 >/dev/null 2>&1 &"]),
    )
    .await;
    assert_eq!(ran.outcome.exit_code, 0);
    assert_eq!(f.observed(&spec.name).await.unwrap().processes, Some(1));

    // Stopped: exited, with a finish time.
    let kill = KillContainerOptionsBuilder::default()
        .signal("KILL")
        .build();
    f.docker.kill_container(&id, Some(kill)).await.unwrap();
    let exited = f.observed(&spec.name).await.unwrap();
    assert_eq!(exited.state, ContainerState::Exited);
    assert_eq!(exited.started_at, Some(started));
    let finished = exited.finished_at.expect("an exited container finished");
    assert!(finished >= started, "{exited:?}");
    assert_eq!(exited.processes, None);

    assert_eq!(f.engine.remove(&id).await.unwrap(), RemoveOutcome::Removed);
    assert_eq!(
        f.engine.remove(&id).await.unwrap(),
        RemoveOutcome::AlreadyGone
    );
    assert_eq!(
        f.engine.remove(&spec.name).await.unwrap(),
        RemoveOutcome::AlreadyGone
    );
    assert_eq!(f.observed(&spec.name).await, None);
    assert_eq!(f.engine.find(&spec.key).await.unwrap(), None);
    // The data outlives the container.
    assert!(spec.host_dirs.iter().all(|d| d.is_dir()));
}

#[tokio::test]
async fn find_refuses_a_container_of_the_sandbox_name_without_the_hermes_label() {
    let f = Fixture::new().await;
    let key = SandboxKey::persistent(&f.profile, "foreign");
    let name = key.container_name();
    f.cleanup.add(&name);
    let options = CreateContainerOptionsBuilder::default().name(&name).build();
    let body = ContainerCreateBody {
        image: Some(test_image()),
        cmd: Some(vec!["true".to_string()]),
        ..Default::default()
    };
    f.docker
        .create_container(Some(options), body)
        .await
        .unwrap();

    let error = f.engine.find(&key).await.unwrap_err();
    assert!(matches!(error, DockerError::Foreign { .. }), "{error}");
    assert!(error.to_string().contains(&name), "{error}");
    assert_eq!(f.observed(&name).await, None, "observe ignores it");
}

#[tokio::test]
async fn exec_reports_exit_codes_keeps_stdout_and_stderr_apart_and_honours_cwd_and_env() {
    let f = Fixture::new().await;
    let (_spec, id) = f.running("exec", "").await;

    let ran = run(&f.engine, &id, &request(&["sh", "-c", "exit 7"])).await;
    assert_eq!(
        ran.outcome,
        ExecOutcome {
            exit_code: 7,
            timed_out: false
        }
    );
    let ran = run(&f.engine, &id, &request(&["true"])).await;
    assert_eq!(ran.outcome.exit_code, 0);
    let ran = run(&f.engine, &id, &request(&["no-such-program"])).await;
    // The runtime cannot start it: the engine answers 126 (127 from a shell).
    assert!(
        matches!(ran.outcome.exit_code, 126 | 127),
        "{:?} {} {}",
        ran.outcome,
        ran.out(),
        ran.err()
    );
    // The engine writes its own message ("OCI runtime exec failed: …
    // executable file not found") as the command's stdout.
    assert!(ran.out().contains("no-such-program"), "{}", ran.out());

    let ran = run(
        &f.engine,
        &id,
        &request(&["sh", "-c", "echo out; echo err >&2; echo out2; exit 3"]),
    )
    .await;
    assert_eq!(ran.out(), "out\nout2\n");
    assert_eq!(ran.err(), "err\n");
    assert_eq!(ran.outcome.exit_code, 3);

    let ran = run(&f.engine, &id, &request(&["pwd"])).await;
    assert_eq!(ran.out(), "/workspace\n", "the container's working dir");
    let mut req = request(&["pwd"]);
    req.cwd = Some("/tmp".to_string());
    assert_eq!(run(&f.engine, &id, &req).await.out(), "/tmp\n");

    let mut req = request(&["sh", "-c", r#"printf '%s|%s' "$FOO" "$EMPTY""#]);
    req.env = vec![
        ("FOO".to_string(), "bar baz $HOME 'q'".to_string()),
        ("EMPTY".to_string(), String::new()),
    ];
    assert_eq!(run(&f.engine, &id, &req).await.out(), "bar baz $HOME 'q'|");

    // Every exec carries a marker of its own.
    let marker = request(&["sh", "-c", &format!("printf %s \"${EXEC_ID_ENV}\"")]);
    let first = run(&f.engine, &id, &marker).await.out();
    let second = run(&f.engine, &id, &marker).await.out();
    assert_eq!(first.len(), 32, "{first}");
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first}");
    assert_ne!(first, second);

    f.engine.remove(&id).await.unwrap();
}

#[tokio::test]
async fn exec_streams_ten_megabytes_intact_and_output_arrives_while_the_command_runs() {
    let f = Fixture::new().await;
    let (_spec, id) = f.running("big", "").await;

    let ran = run(
        &f.engine,
        &id,
        &request(&[
            "sh",
            "-c",
            r"head -c 10485760 /dev/zero | tr '\0' a; head -c 1048576 /dev/zero | tr '\0' b >&2",
        ]),
    )
    .await;
    assert_eq!(ran.outcome.exit_code, 0);
    assert_eq!(ran.stdout.len(), 10 * 1024 * 1024);
    assert!(ran.stdout.iter().all(|b| *b == b'a'));
    assert_eq!(ran.stderr.len(), 1024 * 1024);
    assert!(ran.stderr.iter().all(|b| *b == b'b'));

    // Live: the first line is read while the command waits (at most a
    // minute) to be let go, which the reader does once it has that line.
    let (mut reader, writer) = tokio::io::duplex(64 * 1024);
    let req = request(&[
        "sh",
        "-c",
        "echo first; i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
         [ -e /tmp/go ] && echo second",
    ]);
    let exec = f.engine.exec(&id, &req, writer, tokio::io::sink());
    let read_first = async {
        let mut seen = Vec::new();
        let mut buf = [0u8; 64];
        while !seen.ends_with(b"first\n") {
            let n = reader.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "the output ended before the first line");
            seen.extend_from_slice(&buf[..n]);
        }
        let go = run(&f.engine, &id, &request(&["touch", "/tmp/go"])).await;
        assert_eq!(go.outcome.exit_code, 0);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        rest
    };
    let (outcome, rest) = tokio::join!(exec, read_first);
    assert_eq!(
        rest, b"second\n",
        "the first line arrived only once the command ended"
    );
    assert_eq!(outcome.unwrap().exit_code, 0);

    f.engine.remove(&id).await.unwrap();
}

#[tokio::test]
async fn a_timed_out_exec_answers_124_and_kills_its_whole_process_tree() {
    let f = Fixture::new().await;
    let (spec, id) = f.running("timeout", "").await;

    let mut req = request(&[
        "sh",
        "-c",
        // A background child, one that clears its environment (caught as a
        // descendant), and the foreground.
        "echo started; sleep 1000 & env -i sleep 1001 & sleep 1002",
    ]);
    // Time for a loaded machine's engine to start the command and pass
    // its first line on before the timeout.
    req.timeout = Duration::from_secs(6);
    let start = Instant::now();
    let ran = run(&f.engine, &id, &req).await;
    let took = start.elapsed();
    assert_eq!(
        ran.outcome,
        ExecOutcome {
            exit_code: 124,
            timed_out: true
        }
    );
    assert_eq!(ran.out(), "started\n", "output before the timeout arrived");
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(40),
        "{took:?}"
    );

    let lines = command_lines(&f.engine, &id).await;
    for left in ["sleep 1000", "sleep 1001", "sleep 1002"] {
        assert!(!lines.contains(left), "{left} is still running:\n{lines}");
    }
    assert!(
        lines.contains("sleep infinity"),
        "the keeper survives:\n{lines}"
    );
    // The engine agrees: nothing runs besides the init and the keeper
    // (killed processes may take a moment to be reaped).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut processes = f.observed(&spec.name).await.unwrap().processes;
    while processes != Some(0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        processes = f.observed(&spec.name).await.unwrap().processes;
    }
    assert_eq!(processes, Some(0));

    // The sandbox still works.
    let ran = run(&f.engine, &id, &request(&["echo", "ok"])).await;
    assert_eq!(ran.out(), "ok\n");

    f.engine.remove(&id).await.unwrap();
}

#[tokio::test]
async fn exec_into_a_removed_or_stopped_container_is_gone() {
    let f = Fixture::new().await;
    let sink = || (tokio::io::sink(), tokio::io::sink());

    let stopped = f.spec("stopped", "");
    let stopped_id = f.create(&stopped).await;
    let (o, e) = sink();
    let error = f
        .engine
        .exec(&stopped_id, &request(&["true"]), o, e)
        .await
        .unwrap_err();
    assert!(error.is_gone(), "created, never started: {error}");

    let (spec, id) = f.running("removed", "").await;
    f.engine.remove(&id).await.unwrap();
    for target in [id.as_str(), spec.name.as_str()] {
        let (o, e) = sink();
        let error = f
            .engine
            .exec(target, &request(&["true"]), o, e)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, DockerError::Gone { container, .. } if container == target),
            "{error}"
        );
        assert!(error.to_string().contains(target), "{error}");
    }
    let error = f.engine.start(&id).await.unwrap_err();
    assert!(error.is_gone(), "{error}");

    f.engine.remove(&stopped_id).await.unwrap();
}

#[tokio::test]
async fn observing_containers_left_in_created_costs_one_list_call() {
    const COUNT: usize = 500;
    let f = Fixture::new().await;
    let base = f.spec("base", "");
    let specs: Vec<SandboxSpec> = (0..COUNT)
        .map(|i| {
            let mut spec = base.clone();
            spec.key.task = format!("created-{i}");
            spec.name = spec.key.container_name();
            spec.labels
                .insert("hermes-task-id".to_string(), spec.key.task.clone());
            f.cleanup.add(&spec.name);
            spec
        })
        .collect();
    // At most 32 calls in flight, to spare the engine.
    let permits = Arc::new(tokio::sync::Semaphore::new(32));
    let mut creating = tokio::task::JoinSet::new();
    for spec in specs {
        let engine = f.engine.clone();
        let permits = permits.clone();
        creating.spawn(async move {
            let _permit = permits.acquire().await;
            engine.create(&spec).await
        });
    }
    let mut ids = Vec::new();
    while let Some(outcome) = creating.join_next().await {
        match outcome.unwrap().unwrap() {
            CreateOutcome::Created { id } => ids.push(id),
            CreateOutcome::AlreadyExists => panic!("a fresh name existed"),
        }
    }

    let requests = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = requests.clone();
    let counted = Engine::from_docker(engine().await.with_request_modifier(move |req| {
        log.lock()
            .unwrap()
            .push(format!("{} {}", req.method(), req.uri().path()));
        req
    }));
    let start = Instant::now();
    let seen = counted.observe().await.unwrap();
    let took = start.elapsed();

    let ours: Vec<&ObservedContainer> = seen
        .iter()
        .filter(|c| c.profile() == Some(f.profile.as_str()))
        .collect();
    assert_eq!(ours.len(), COUNT);
    for c in &ours {
        assert_eq!(c.state, ContainerState::Created);
        assert_eq!((c.started_at, c.processes), (None, None));
        assert!(c.created > 0);
    }
    let requests = requests.lock().unwrap().clone();
    let lists = requests
        .iter()
        .filter(|r| r.ends_with("/containers/json"))
        .count();
    assert_eq!(lists, 1, "{requests:#?}");
    for id in &ids {
        assert!(
            !requests.iter().any(|r| r.contains(id.as_str())),
            "a per-container call for a created container: {requests:#?}"
        );
    }
    // What it costs is the calls counted above; the time is for the eye
    // (a loaded machine's engine answers that one list slowly too).
    eprintln!(
        "observed {} containers ({COUNT} of them in created) in {took:?}",
        seen.len()
    );

    let mut removing = tokio::task::JoinSet::new();
    for id in ids {
        let engine = f.engine.clone();
        let permits = permits.clone();
        removing.spawn(async move {
            let _permit = permits.acquire().await;
            engine.remove(&id).await
        });
    }
    while let Some(removed) = removing.join_next().await {
        assert_eq!(removed.unwrap().unwrap(), RemoveOutcome::Removed);
    }
}

#[tokio::test]
async fn ensure_image_keeps_a_present_image_and_names_an_image_it_cannot_pull() {
    let f = Fixture::new().await;
    let mut lines = Vec::new();
    let outcome = f
        .engine
        .ensure_image(&test_image(), |l| lines.push(l.to_string()))
        .await
        .unwrap();
    assert_eq!(outcome, ImageOutcome::Present);
    assert!(lines.is_empty(), "{lines:?}");

    // A registry on a closed loopback port: the pull fails at once and
    // nothing leaves the machine.
    let missing = format!("127.0.0.1:9/{}:1", unique("hermes-missing"));
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        f.engine.ensure_image(&missing, |_| {}),
    )
    .await
    .expect("a failing pull ends")
    .unwrap_err();
    assert!(
        matches!(&error, DockerError::Pull { image, .. } if *image == missing),
        "{error}"
    );
    assert!(error.to_string().contains(&missing), "{error}");
}
