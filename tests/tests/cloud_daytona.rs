//! The Daytona driver against the contract fake of Daytona's API
//! (`hermes_tests::fakes::daytona`): life cycle, exec (streamed, exit
//! codes, timeouts that kill), files, stop and start keeping files,
//! credentials, service errors and retries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_backends::cloud::{CloudDriver, CloudSpec, CloudState, RETRY_ATTEMPTS};
use hermes_backends::daytona::{DaytonaDriver, DaytonaError};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest};
use hermes_tests::fakes::daytona::FakeDaytona;
use hermes_tests::fakes::{Capture, Gate, process_alive};

const KEY: &str = "dtn_test_key_0123456789";

fn driver(fake: &FakeDaytona, key: &str) -> DaytonaDriver {
    let url = fake.api_url();
    DaytonaDriver::from_env(&|name| match name {
        "DAYTONA_API_KEY" => Some(key.to_owned()),
        "DAYTONA_API_URL" => Some(url.clone()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("driver: {e}"))
}

fn spec(task: &str) -> CloudSpec {
    CloudSpec {
        task: task.to_owned(),
        profile: "default".to_owned(),
        image: "debian:bookworm".to_owned(),
        cpu: 1.0,
        memory_mb: 2048,
        disk_mb: 51200,
        lifetime: Duration::from_secs(300),
        env: vec![("FROM_SPEC".to_owned(), "spec-value".to_owned())],
        transforms: Vec::new(),
    }
}

fn req(cmd: &[&str], timeout: Duration) -> ExecRequest {
    ExecRequest {
        cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
        env: Vec::new(),
        cwd: None,
        timeout,
    }
}

async fn run(d: &DaytonaDriver, id: &str, req: &ExecRequest) -> (ExecOutcome, Capture, Capture) {
    let (mut out, mut err) = (Capture::default(), Capture::default());
    let outcome = d
        .exec(
            id,
            req,
            ExecIo {
                stdin: None,
                stdout: &mut out,
                stderr: &mut err,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("exec {:?}: {e}", req.cmd));
    (outcome, out, err)
}

#[tokio::test]
async fn create_exec_files_stop_and_start_again() {
    let fake = FakeDaytona::start(KEY);
    let d = driver(&fake, KEY);
    assert_eq!(d.find("default", "t1", None).await.unwrap(), None);

    let sandbox = d.create(&spec("t1"), None).await.unwrap();
    assert_eq!(sandbox.state, CloudState::Running);
    let labels = fake.sandbox_labels(&sandbox.id).unwrap();
    assert_eq!(labels["hermes-agent"], "1");
    assert_eq!(labels["hermes-profile"], "default");
    assert_eq!(labels["hermes-task"], "t1");
    assert_eq!(
        d.find("default", "t1", None).await.unwrap(),
        Some(sandbox.clone())
    );
    assert_eq!(d.find("other", "t1", None).await.unwrap(), None);

    // Exit codes, stdout and stderr apart, the environment from the spec
    // and from the request, none of it on the command line.
    let mut r = req(
        &[
            "sh",
            "-c",
            "echo out:$FROM_SPEC:$SECRET_ONE; echo err >&2; exit 3",
        ],
        Duration::from_secs(20),
    );
    r.env = vec![("SECRET_ONE".to_owned(), "s3cr3t 'quoted' value".to_owned())];
    let (outcome, out, err) = run(&d, &sandbox.id, &r).await;
    assert_eq!(
        outcome,
        ExecOutcome {
            exit_code: 3,
            timed_out: false
        }
    );
    assert_eq!(out.text(), "out:spec-value:s3cr3t 'quoted' value\n");
    assert_eq!(err.text(), "err\n");
    assert!(
        fake.commands().iter().all(|c| !c.contains("s3cr3t")),
        "an environment value reached a command string: {:?}",
        fake.commands()
    );
    // The values went up in a folder only its owner can enter, gone once
    // the command started.
    let env_folders: Vec<(String, String)> = fake
        .folders()
        .into_iter()
        .filter(|(path, _)| path.starts_with("/tmp/.hermes-"))
        .collect();
    assert!(!env_folders.is_empty(), "{:?}", fake.folders());
    for (path, mode) in &env_folders {
        assert_eq!(mode, "700", "{path}");
        assert!(
            !std::path::Path::new(path).exists(),
            "{path} was left behind"
        );
    }

    // No input: a command reading its input gets end of input at once.
    let (outcome, out, _) = run(&d, &sandbox.id, &req(&["cat"], Duration::from_secs(20))).await;
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(out.text(), "");

    // Files both ways, parents made; a working directory.
    d.write_file(&sandbox.id, "work/notes/a.txt", b"hello\x00bytes")
        .await
        .unwrap();
    assert_eq!(
        d.read_file(&sandbox.id, "work/notes/a.txt").await.unwrap(),
        b"hello\x00bytes"
    );
    let mut r = req(&["cat", "notes/a.txt"], Duration::from_secs(20));
    r.cwd = Some(
        fake.sandbox_dir(&sandbox.id)
            .unwrap()
            .join("work")
            .display()
            .to_string(),
    );
    let (outcome, out, _) = run(&d, &sandbox.id, &r).await;
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(out.bytes(), b"hello\x00bytes");
    let (_, out, _) = run(
        &d,
        &sandbox.id,
        &req(
            &["sh", "-c", "echo made > made.txt"],
            Duration::from_secs(20),
        ),
    )
    .await;
    assert_eq!(out.text(), "");
    assert_eq!(
        d.read_file(&sandbox.id, "made.txt").await.unwrap(),
        b"made\n"
    );
    let missing = d.read_file(&sandbox.id, "nope.txt").await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");

    // Session 1 ends: the sandbox stops, keeping its files.
    assert_eq!(d.suspend(&sandbox.id).await.unwrap(), None);
    assert_eq!(fake.sandbox_state(&sandbox.id).as_deref(), Some("stopped"));
    let found = d.find("default", "t1", None).await.unwrap().unwrap();
    assert_eq!(found.state, CloudState::Stopped);

    // Session 2 starts it again and finds the file.
    let resumed = d.resume(&found.id).await.unwrap();
    assert_eq!(resumed.state, CloudState::Running);
    assert_eq!(
        d.read_file(&resumed.id, "work/notes/a.txt").await.unwrap(),
        b"hello\x00bytes"
    );
    let (outcome, out, _) = run(
        &d,
        &resumed.id,
        &req(&["cat", "made.txt"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!((outcome.exit_code, out.text().as_str()), (0, "made\n"));

    // Destroy is idempotent.
    d.destroy(&resumed.id).await.unwrap();
    d.destroy(&resumed.id).await.unwrap();
    d.destroy("never-existed").await.unwrap();
    assert_eq!(fake.sandbox_count(), 0);
    assert_eq!(d.find("default", "t1", None).await.unwrap(), None);
}

#[tokio::test]
async fn output_streams_before_the_command_ends() {
    let fake = FakeDaytona::start(KEY);
    let d = driver(&fake, KEY);
    let sandbox = d.create(&spec("stream"), None).await.unwrap();
    // The command waits until the test has seen its first line.
    let gate = Gate::default();
    let r = req(
        &[
            "sh",
            "-c",
            &format!(
                "echo first; {} && {{ echo second >&2; echo third; }}",
                gate.shell()
            ),
        ],
        Duration::from_secs(20),
    );
    let (mut out, mut err) = (Capture::default(), Capture::default());
    let seen = out.clone();
    let exec = d.exec(
        &sandbox.id,
        &r,
        ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        },
    );
    let (outcome, ()) = tokio::join!(exec, gate.open_once(|| seen.arrived("first").is_some()));
    assert_eq!(
        out.text(),
        "first\nthird\n",
        "the first line came only once the command ended"
    );
    assert_eq!(err.text(), "second\n");
    assert_eq!(outcome.unwrap().exit_code, 0);
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_answers_124() {
    let fake = FakeDaytona::start(KEY);
    let d = driver(&fake, KEY);
    let sandbox = d.create(&spec("slow"), None).await.unwrap();
    let started = Instant::now();
    let r = req(
        &["sh", "-c", "echo $$ > pid; echo started; sleep 30 & wait"],
        Duration::from_secs(2),
    );
    let (outcome, out, _) = run(&d, &sandbox.id, &r).await;
    assert_eq!(
        outcome,
        ExecOutcome {
            exit_code: 124,
            timed_out: true
        }
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(out.text(), "started\n");
    let pid: u32 = String::from_utf8(d.read_file(&sandbox.id, "pid").await.unwrap())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !process_alive(pid),
        "the timed-out command {pid} still runs"
    );
    // The sandbox still serves commands.
    let (outcome, out, _) = run(
        &d,
        &sandbox.id,
        &req(&["echo", "ok"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!((outcome.exit_code, out.text().as_str()), (0, "ok\n"));
}

#[tokio::test]
async fn credentials_missing_or_wrong_are_clear_errors() {
    let fake = FakeDaytona::start(KEY);
    let url = fake.api_url();
    let missing = DaytonaDriver::from_env(&|name| (name == "DAYTONA_API_URL").then(|| url.clone()))
        .unwrap_err();
    assert!(missing.to_string().contains("DAYTONA_API_KEY"), "{missing}");

    let wrong_key = "dtn_wrong_key_abcdef";
    let d = driver(&fake, wrong_key);
    let e = d.find("default", "x", None).await.unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let text = format!("{e} {e:?} {d:?}");
    assert!(text.contains("DAYTONA_API_KEY"), "{text}");
    assert!(!text.contains(wrong_key), "the key leaked: {text}");
    assert!(matches!(e, DaytonaError::Unauthorized { .. }));
}

#[tokio::test]
async fn service_errors_and_retries() {
    let fake = FakeDaytona::start(KEY);
    let d = driver(&fake, KEY);

    // 503 twice, then the call goes through.
    fake.faults.fail_next(2, 503, None);
    assert_eq!(d.find("default", "r", None).await.unwrap(), None);
    assert_eq!(fake.requests.count("GET", "/api/sandbox"), 3);

    // 429 with Retry-After is honoured.
    fake.faults.fail_next(1, 429, Some(1));
    let started = Instant::now();
    d.find("default", "r", None).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));

    // 503 forever: a clear error after every attempt.
    fake.faults.fail_forever(503);
    let before = fake.requests.count("GET", "/api/sandbox");
    let e = d.find("default", "r", None).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert!(e.to_string().contains("503"), "{e}");
    assert_eq!(
        fake.requests.count("GET", "/api/sandbox") - before,
        RETRY_ATTEMPTS as usize
    );
    fake.faults.clear();

    // 400 is not retried: an injected one, and the service's own limit.
    fake.faults.fail_next(1, 400, None);
    let before = fake.requests.count("GET", "/api/sandbox");
    assert_eq!(
        d.find("default", "r", None).await.unwrap_err().status(),
        Some(400)
    );
    assert_eq!(fake.requests.count("GET", "/api/sandbox") - before, 1);

    let mut big = spec("big");
    big.cpu = 8.0;
    let e = d.create(&big, None).await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");
    assert!(e.to_string().contains("CPU"), "{e}");
    assert_eq!(fake.requests.count("POST", "/api/sandbox"), 1);

    // The disk is capped at 10 GiB, so the default 50 GB spec is accepted.
    let sandbox = d.create(&spec("capped"), None).await.unwrap();
    // A second create of the same task finds the first (409 from the name).
    let again = d.create(&spec("capped"), None).await.unwrap();
    assert_eq!(again.id, sandbox.id);
    assert_eq!(fake.sandbox_count(), 1);
}
