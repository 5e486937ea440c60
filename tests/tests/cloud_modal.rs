//! The Modal driver against the contract fake of Modal's gRPC API
//! (`hermes_tests::fakes::modal`): real gRPC over loopback, real processes
//! behind every sandbox and exec.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hermes_backends::cloud::{CloudDriver, CloudSpec, CloudState};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest};
use hermes_backends::modal::{ModalDriver, ModalError};
use hermes_tests::fakes::Gate;
use hermes_tests::fakes::modal::FakeModal;
use tokio::io::AsyncWrite;

const TOKEN_ID: &str = "ak-hermes-test-id";
const TOKEN_SECRET: &str = "as-hermes-test-secret-7f3a";

fn driver(url: &str, id: &str, secret: &str) -> Result<ModalDriver, ModalError> {
    let (url, id, secret) = (url.to_string(), id.to_string(), secret.to_string());
    let lookup = move |name: &str| match name {
        "MODAL_SERVER_URL" => Some(url.clone()),
        "MODAL_TOKEN_ID" => Some(id.clone()),
        "MODAL_TOKEN_SECRET" => Some(secret.clone()),
        _ => None,
    };
    ModalDriver::from_env(&lookup, None)
}

async fn setup() -> (FakeModal, ModalDriver) {
    let fake = FakeModal::start(TOKEN_ID, TOKEN_SECRET).await;
    let driver = driver(&fake.url(), TOKEN_ID, TOKEN_SECRET).unwrap();
    (fake, driver)
}

fn spec(task: &str) -> CloudSpec {
    CloudSpec {
        task: task.to_string(),
        profile: "default".to_string(),
        image: "python:3.12-slim".to_string(),
        cpu: 1.0,
        memory_mb: 1024,
        disk_mb: 10240,
        lifetime: Duration::from_secs(600),
        env: Vec::new(),
        transforms: Vec::new(),
    }
}

fn sh(script: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        cmd: vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()],
        env: Vec::new(),
        cwd: None,
        timeout,
    }
}

/// An output sink that remembers when its first byte came.
#[derive(Clone, Default)]
struct Recorder {
    bytes: Arc<Mutex<Vec<u8>>>,
    first: Arc<Mutex<Option<Instant>>>,
}

impl Recorder {
    fn text(&self) -> String {
        String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
    }
    fn first(&self) -> Option<Instant> {
        *self.first.lock().unwrap()
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.first.lock().unwrap().get_or_insert_with(Instant::now);
        self.bytes.lock().unwrap().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

async fn run(
    driver: &ModalDriver,
    id: &str,
    req: &ExecRequest,
    stdin: Option<&[u8]>,
) -> (ExecOutcome, Recorder, Recorder) {
    let (mut out, mut err) = (Recorder::default(), Recorder::default());
    let mut input = stdin.unwrap_or_default();
    let io = ExecIo {
        stdin: stdin.map(|_| &mut input as &mut (dyn tokio::io::AsyncRead + Unpin + Send)),
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = driver.exec(id, req, io).await.unwrap();
    (outcome, out, err)
}

#[tokio::test]
async fn create_makes_one_running_sandbox_that_find_returns() {
    let (fake, driver) = setup().await;
    assert_eq!(driver.find("default", "t1", None).await.unwrap(), None);
    assert!(fake.apps().is_empty(), "find created the app");
    assert!(!fake.calls().iter().any(|c| c == "SandboxCreate"));

    let sandbox = driver.create(&spec("t1"), None).await.unwrap();
    assert_eq!(sandbox.state, CloudState::Running);
    assert_eq!(
        driver.find("default", "t1", None).await.unwrap(),
        Some(sandbox.clone())
    );
    assert_eq!(driver.find("default", "other", None).await.unwrap(), None);
    assert_eq!(driver.find("work", "t1", None).await.unwrap(), None);

    // A second create for the same task (a racing process) ends with the
    // first sandbox, not a second one.
    let again = driver.create(&spec("t1"), None).await.unwrap();
    assert_eq!(again.id, sandbox.id);
    assert_eq!(fake.running(), 1);
    assert_eq!(fake.apps(), ["hermes-agent"]);
}

#[tokio::test]
async fn exec_streams_output_live_and_returns_the_exit_code() {
    let (_fake, driver) = setup().await;
    let sandbox = driver.create(&spec("stream"), None).await.unwrap();

    // The command waits until the test has seen its first line.
    let gate = Gate::default();
    let req = sh(
        &format!(
            "echo first; {} && {{ echo second >&2; exit 3; }}",
            gate.shell()
        ),
        Duration::from_secs(30),
    );
    let (mut out, mut err) = (Recorder::default(), Recorder::default());
    let seen = out.clone();
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let exec = driver.exec(&sandbox.id, &req, io);
    let (outcome, ()) = tokio::join!(exec, gate.open_once(|| seen.first().is_some()));

    assert_eq!(out.text(), "first\n");
    assert_eq!(
        err.text(),
        "second\n",
        "the first line came only once the command ended"
    );
    assert_eq!(
        outcome.unwrap(),
        ExecOutcome {
            exit_code: 3,
            timed_out: false
        }
    );

    let (outcome, _, _) = run(
        &driver,
        &sandbox.id,
        &sh("exit 0", Duration::from_secs(10)),
        None,
    )
    .await;
    assert_eq!(outcome.exit_code, 0);
    let (outcome, _, _) = run(
        &driver,
        &sandbox.id,
        &sh("kill -9 $$", Duration::from_secs(10)),
        None,
    )
    .await;
    assert_eq!(outcome.exit_code, 137);
}

#[tokio::test]
async fn environment_working_directory_and_input_reach_the_command_off_its_command_line() {
    let (fake, driver) = setup().await;
    let mut s = spec("env");
    s.env = vec![("SANDBOX_WIDE".to_string(), "from-the-spec".to_string())];
    let sandbox = driver.create(&s, None).await.unwrap();
    driver
        .write_file(&sandbox.id, "sub/marker", b"")
        .await
        .unwrap();

    let secret_value = "tok-123 with spaces\nand a second line";
    let mut req = sh(
        "printf '%s|%s|%s|' \"$REQ_VALUE\" \"$SANDBOX_WIDE\" \"$(basename \"$PWD\")\"; cat",
        Duration::from_secs(10),
    );
    req.env = vec![("REQ_VALUE".to_string(), secret_value.to_string())];
    req.cwd = Some("sub".to_string());
    let (outcome, out, _) = run(&driver, &sandbox.id, &req, Some(b"piped input")).await;
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(
        out.text(),
        format!("{secret_value}|from-the-spec|sub|piped input")
    );

    for command in fake.commands() {
        for arg in command {
            assert!(!arg.contains("tok-123"), "a value on a command line: {arg}");
        }
    }
}

#[tokio::test]
async fn a_timed_out_command_is_killed_in_the_sandbox_with_exit_124() {
    let (fake, driver) = setup().await;
    let sandbox = driver.create(&spec("timeout"), None).await.unwrap();
    let dir = fake.sandbox_dir(&sandbox.id).unwrap();

    let started = Instant::now();
    let req = sh(
        "echo $$ > main.pid; sleep 300 & echo $! > child.pid; echo started; wait",
        Duration::from_secs(2),
    );
    let (outcome, out, _) = run(&driver, &sandbox.id, &req, None).await;
    assert_eq!(
        outcome,
        ExecOutcome {
            exit_code: 124,
            timed_out: true
        }
    );
    assert_eq!(out.text(), "started\n");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    for file in ["main.pid", "child.pid"] {
        let pid = std::fs::read_to_string(dir.join(file)).unwrap();
        let pid = pid.trim();
        assert!(
            gone(pid).await,
            "process {pid} ({file}) still runs after the timeout"
        );
    }
}

/// Whether a process has ended (gone, or a zombie nobody reaped yet).
async fn gone(pid: &str) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
                if matches!(state, Some('Z' | 'X')) {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn files_go_both_ways_byte_for_byte() {
    let (fake, driver) = setup().await;
    let sandbox = driver.create(&spec("files"), None).await.unwrap();

    let contents: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    driver
        .write_file(&sandbox.id, "deep/er/data.bin", &contents)
        .await
        .unwrap();
    let on_disk = std::fs::read(
        fake.sandbox_dir(&sandbox.id)
            .unwrap()
            .join("deep/er/data.bin"),
    )
    .unwrap();
    assert_eq!(on_disk, contents);
    assert_eq!(
        driver
            .read_file(&sandbox.id, "deep/er/data.bin")
            .await
            .unwrap(),
        contents
    );

    driver.write_file(&sandbox.id, "empty", b"").await.unwrap();
    assert_eq!(driver.read_file(&sandbox.id, "empty").await.unwrap(), b"");

    let err = driver
        .read_file(&sandbox.id, "missing.txt")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ModalError::File { .. }), "{err:?}");
    assert!(
        text.contains("missing.txt") && text.contains("No such file"),
        "{text}"
    );
}

#[tokio::test]
async fn a_snapshot_carries_the_filesystem_into_the_next_session() {
    let fake = FakeModal::start(TOKEN_ID, TOKEN_SECRET).await;

    // Session one: work, then suspend.
    let first = driver(&fake.url(), TOKEN_ID, TOKEN_SECRET).unwrap();
    let sandbox = first.create(&spec("persist"), None).await.unwrap();
    first
        .write_file(
            &sandbox.id,
            "workspace/notes.txt",
            b"kept across sessions\n",
        )
        .await
        .unwrap();
    let snapshot = first
        .suspend(&sandbox.id)
        .await
        .unwrap()
        .expect("an image id");
    assert_eq!(fake.running(), 0);
    assert_eq!(first.find("default", "persist", None).await.unwrap(), None);
    let gone = first
        .exec(&sandbox.id, &sh("true", Duration::from_secs(5)), io_sink())
        .await;
    assert!(
        matches!(gone, Err(ModalError::SandboxGone { .. })),
        "{gone:?}"
    );
    drop(first);

    // Session two: a new driver restores from the image id.
    let second = driver(&fake.url(), TOKEN_ID, TOKEN_SECRET).unwrap();
    let restored = second
        .create(&spec("persist"), Some(&snapshot))
        .await
        .unwrap();
    assert_ne!(restored.id, sandbox.id);
    assert_eq!(
        second
            .read_file(&restored.id, "workspace/notes.txt")
            .await
            .unwrap(),
        b"kept across sessions\n"
    );
    assert_eq!(
        second
            .find("default", "persist", None)
            .await
            .unwrap()
            .map(|s| s.id),
        Some(restored.id)
    );
}

fn io_sink() -> ExecIo<'static> {
    ExecIo {
        stdin: None,
        stdout: Box::leak(Box::new(tokio::io::sink())),
        stderr: Box::leak(Box::new(tokio::io::sink())),
    }
}

#[tokio::test]
async fn missing_credentials_name_the_variables() {
    let home = tempfile::tempdir().unwrap();
    let err = ModalDriver::from_env(&|_| None, Some(home.path())).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ModalError::MissingCredentials { .. }),
        "{err:?}"
    );
    assert!(
        text.contains("MODAL_TOKEN_ID") && text.contains("MODAL_TOKEN_SECRET"),
        "{text}"
    );
}

#[tokio::test]
async fn wrong_credentials_are_refused_and_never_shown() {
    let fake = FakeModal::start(TOKEN_ID, TOKEN_SECRET).await;
    let wrong = driver(&fake.url(), TOKEN_ID, "as-wrong-secret-9c1d").unwrap();
    let err = wrong.find("default", "t", None).await.unwrap_err();
    assert!(
        matches!(
            err,
            ModalError::Unauthenticated {
                call: "AppGetOrCreate",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("MODAL_TOKEN_SECRET"), "{err}");
    for shown in [err.to_string(), format!("{err:?}"), format!("{wrong:?}")] {
        assert!(!shown.contains("as-wrong-secret-9c1d"), "{shown}");
        assert!(!shown.contains(TOKEN_ID), "{shown}");
    }
    assert!(
        fake.calls().is_empty(),
        "a call was admitted: {:?}",
        fake.calls()
    );
}

/// A log sink for one test.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn no_log_line_holds_a_credential_even_at_trace_level() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (fake, driver) = setup().await;
    fake.fail_next(1);
    let sandbox = driver.create(&spec("logs"), None).await.unwrap();
    let (outcome, _, _) = run(
        &driver,
        &sandbox.id,
        &sh("echo hi", Duration::from_secs(5)),
        None,
    )
    .await;
    assert_eq!(outcome.exit_code, 0);
    let wrong = driver_for_wrong_secret(&fake.url());
    assert!(wrong.find("default", "logs", None).await.is_err());
    driver.destroy(&sandbox.id).await.unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("modal sandbox created"),
        "the logs were not captured"
    );
    for secret in [TOKEN_ID, TOKEN_SECRET, "as-wrong-secret-9c1d"] {
        assert!(!text.contains(secret), "{secret} in the logs");
    }
}

fn driver_for_wrong_secret(url: &str) -> ModalDriver {
    driver(url, TOKEN_ID, "as-wrong-secret-9c1d").unwrap()
}

#[tokio::test]
async fn credentials_come_from_modal_toml_when_the_environment_has_none() {
    let fake = FakeModal::start(TOKEN_ID, TOKEN_SECRET).await;
    let home = tempfile::tempdir().unwrap();
    write_modal_toml(home.path(), &fake.url());
    let driver = ModalDriver::from_env(&|_| None, Some(home.path())).unwrap();
    assert_eq!(driver.server_url(), fake.url());
    assert_eq!(driver.find("default", "t", None).await.unwrap(), None);
    assert!(!fake.calls().is_empty());
}

fn write_modal_toml(home: &Path, url: &str) {
    std::fs::write(
        home.join(".modal.toml"),
        format!(
            "[old]\ntoken_id = \"ak-old\"\ntoken_secret = \"as-old\"\n\n\
             [current]\ntoken_id = \"{TOKEN_ID}\"\ntoken_secret = \"{TOKEN_SECRET}\"\n\
             server_url = \"{url}\"\nactive = true\n"
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn two_unavailable_answers_are_retried_to_success() {
    let (fake, driver) = setup().await;
    fake.fail_next(2);
    let sandbox = driver.create(&spec("flaky"), None).await.unwrap();
    assert_eq!(fake.faults_left(), 0);
    assert_eq!(fake.running(), 1);

    fake.fail_next(2);
    assert_eq!(
        driver
            .find("default", "flaky", None)
            .await
            .unwrap()
            .map(|s| s.id),
        Some(sandbox.id)
    );
}

#[tokio::test]
async fn an_unavailable_service_fails_after_the_retries_and_a_command_is_never_sent_twice() {
    let (fake, driver) = setup().await;
    let sandbox = driver.create(&spec("down"), None).await.unwrap();

    fake.fail_next(10);
    let err = driver.find("default", "down", None).await.unwrap_err();
    assert!(
        matches!(
            err,
            ModalError::Rpc {
                code: tonic::Code::Unavailable,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(fake.faults_left(), 6, "four attempts in all");

    // Starting a command is not repeated: it might have run.
    fake.fail_next(1);
    let before = fake.commands().len();
    let err = driver
        .exec(
            &sandbox.id,
            &sh("echo once >> ran", Duration::from_secs(5)),
            io_sink(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModalError::Rpc {
                code: tonic::Code::Unavailable,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(fake.commands().len(), before);
}

#[tokio::test]
async fn a_failed_image_build_is_reported_with_the_services_reason() {
    let (fake, driver) = setup().await;
    let mut s = spec("broken");
    s.image = "broken/no-such-image:1".to_string();
    let err = driver.create(&s, None).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ModalError::Failed { .. }), "{err:?}");
    assert!(
        text.contains("broken/no-such-image:1") && text.contains("pull access denied"),
        "{text}"
    );
    assert_eq!(fake.running(), 0);
}

#[tokio::test]
async fn destroy_is_idempotent() {
    let (fake, driver) = setup().await;
    let sandbox = driver.create(&spec("gone"), None).await.unwrap();
    driver.destroy(&sandbox.id).await.unwrap();
    driver.destroy(&sandbox.id).await.unwrap();
    driver.destroy("sb-never-existed").await.unwrap();
    assert_eq!(fake.running(), 0);
    assert_eq!(driver.find("default", "gone", None).await.unwrap(), None);
}

#[tokio::test]
async fn a_sandbox_that_ended_on_the_service_is_reported_gone() {
    let (fake, driver) = setup().await;
    let sandbox = driver.create(&spec("ended"), None).await.unwrap();
    fake.end_sandbox(&sandbox.id);
    let err = driver.resume(&sandbox.id).await.unwrap_err();
    assert!(matches!(err, ModalError::SandboxGone { .. }), "{err:?}");
    let err = driver
        .exec(&sandbox.id, &sh("true", Duration::from_secs(5)), io_sink())
        .await
        .unwrap_err();
    assert!(matches!(err, ModalError::SandboxGone { .. }), "{err:?}");
}
