//! The Vercel Sandbox driver against the contract fake of its API
//! (`hermes_tests::fakes::vercel`): life cycle, exec (NDJSON streamed,
//! exit codes, timeouts that kill), files as gzipped tars, snapshot and
//! restore across sessions, credentials, service errors and retries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use hermes_backends::cloud::{CloudDriver, CloudSpec, CloudState, RETRY_ATTEMPTS};
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest};
use hermes_backends::vercel::{VercelDriver, VercelError};
use hermes_tests::fakes::vercel::FakeVercel;
use hermes_tests::fakes::{Capture, Gate, process_alive};

const TOKEN: &str = "vercel_test_token_0123456789";
const TEAM: &str = "team_fake";
const PROJECT: &str = "prj_fake";

fn driver_with(fake: &FakeVercel, token: &str) -> VercelDriver {
    let url = fake.api_url();
    let token = token.to_owned();
    VercelDriver::from_env(&|name| match name {
        "VERCEL_TOKEN" => Some(token.clone()),
        "VERCEL_PROJECT_ID" => Some(PROJECT.to_owned()),
        "VERCEL_TEAM_ID" => Some(TEAM.to_owned()),
        "VERCEL_API_URL" => Some(url.clone()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("driver: {e}"))
}

fn driver(fake: &FakeVercel) -> VercelDriver {
    driver_with(fake, TOKEN)
}

fn spec(runtime: &str) -> CloudSpec {
    CloudSpec {
        task: "default".to_owned(),
        profile: "default".to_owned(),
        image: runtime.to_owned(),
        cpu: 1.0,
        memory_mb: 4096,
        disk_mb: 51200,
        lifetime: Duration::from_secs(60),
        env: Vec::new(),
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

async fn run(d: &VercelDriver, id: &str, req: &ExecRequest) -> (ExecOutcome, Capture, Capture) {
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
async fn create_exec_files_snapshot_and_restore() {
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let d = driver(&fake);
    let sandbox = d.create(&spec("node24"), None).await.unwrap();
    assert_eq!(sandbox.state, CloudState::Running);
    let create = fake
        .requests
        .all()
        .into_iter()
        .filter(|(m, p)| m == "POST" && p == "/v1/sandboxes")
        .count();
    assert_eq!(create, 1);
    assert_eq!(d.find("default", "default", None).await.unwrap(), None);

    // Exit codes, stdout and stderr apart, the environment in the body.
    let mut r = req(
        &["sh", "-c", "echo out:$SECRET_ONE; echo err >&2; exit 7"],
        Duration::from_secs(20),
    );
    r.env = vec![("SECRET_ONE".to_owned(), "s3cr3t value".to_owned())];
    let (outcome, out, err) = run(&d, &sandbox.id, &r).await;
    assert_eq!(
        outcome,
        ExecOutcome {
            exit_code: 7,
            timed_out: false
        }
    );
    assert_eq!(out.text(), "out:s3cr3t value\n");
    assert_eq!(err.text(), "err\n");
    let bodies = fake.command_requests();
    let last = bodies.last().unwrap();
    assert_eq!(last["env"]["SECRET_ONE"], "s3cr3t value");
    assert!(!last["args"].to_string().contains("s3cr3t"));
    assert!(!last["command"].to_string().contains("s3cr3t"));

    // No input.
    let (outcome, out, _) = run(&d, &sandbox.id, &req(&["cat"], Duration::from_secs(20))).await;
    assert_eq!((outcome.exit_code, out.text().as_str()), (0, ""));

    // Files both ways: relative to /vercel/sandbox, and absolute.
    d.write_file(&sandbox.id, "notes/a.txt", b"session one\n")
        .await
        .unwrap();
    d.write_file(&sandbox.id, "/vercel/sandbox/abs.txt", b"abs")
        .await
        .unwrap();
    assert_eq!(
        d.read_file(&sandbox.id, "/vercel/sandbox/notes/a.txt")
            .await
            .unwrap(),
        b"session one\n"
    );
    assert_eq!(d.read_file(&sandbox.id, "abs.txt").await.unwrap(), b"abs");
    let (outcome, out, _) = run(
        &d,
        &sandbox.id,
        &req(&["cat", "notes/a.txt"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!(
        (outcome.exit_code, out.text().as_str()),
        (0, "session one\n")
    );
    let missing = d.read_file(&sandbox.id, "nope").await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");

    // Session 1 ends: a snapshot, which stops the sandbox.
    let snapshot = d.suspend(&sandbox.id).await.unwrap().unwrap();
    assert_eq!(fake.sandbox_status(&sandbox.id).as_deref(), Some("stopped"));
    let e = d.resume(&sandbox.id).await.unwrap_err();
    assert!(matches!(e, VercelError::NotResumable { .. }), "{e}");

    // Session 2 restores from it and finds the file.
    let restored = d.create(&spec("node24"), Some(&snapshot)).await.unwrap();
    assert_ne!(restored.id, sandbox.id);
    let (outcome, out, _) = run(
        &d,
        &restored.id,
        &req(&["cat", "notes/a.txt"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!(
        (outcome.exit_code, out.text().as_str()),
        (0, "session one\n")
    );
    let last = fake.requests.all();
    assert!(
        last.iter()
            .any(|(m, p)| m == "POST" && p == "/v1/sandboxes")
    );

    // Destroy (stop) is idempotent.
    d.destroy(&restored.id).await.unwrap();
    d.destroy(&restored.id).await.unwrap();
    d.destroy("sbx_unknown").await.unwrap();
    assert_eq!(
        fake.sandbox_status(&restored.id).as_deref(),
        Some("stopped")
    );
}

#[tokio::test]
async fn find_knows_only_the_recorded_sandbox_and_says_where_it_is() {
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let d = driver(&fake);
    // Nothing recorded: nothing to ask.
    assert_eq!(d.find("default", "default", None).await.unwrap(), None);
    assert!(fake.requests.all().is_empty());
    let sandbox = d.create(&spec("node24"), None).await.unwrap();
    let found = |id: &str| {
        let d = &d;
        let id = id.to_owned();
        async move { d.find("default", "default", Some(&id)).await.unwrap() }
    };
    assert_eq!(found(&sandbox.id).await, Some(sandbox.clone()));
    // An id the service does not know (404) is none.
    assert_eq!(found("sbx_gone").await, None);
    // The service at work is pending; stopped or failed, it is over.
    fake.set_status(&sandbox.id, "snapshotting");
    assert_eq!(
        found(&sandbox.id).await.map(|s| s.state),
        Some(CloudState::Pending)
    );
    fake.set_status(&sandbox.id, "running");
    d.suspend(&sandbox.id).await.unwrap().unwrap();
    assert_eq!(
        found(&sandbox.id).await.map(|s| s.state),
        Some(CloudState::Dead)
    );
    fake.set_status(&sandbox.id, "failed");
    assert_eq!(
        found(&sandbox.id).await.map(|s| s.state),
        Some(CloudState::Dead)
    );
    // Finding never changes anything.
    let mutating = fake
        .requests
        .all()
        .into_iter()
        .filter(|(m, p)| m == "POST" && !p.ends_with("/snapshot") && p != "/v1/sandboxes")
        .count();
    assert_eq!(mutating, 0);
    // Refused credentials are an error naming the variable, not "none".
    let wrong = driver_with(&fake, "vercel_wrong_token");
    let e = wrong
        .find("default", "default", Some(&sandbox.id))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("VERCEL_TOKEN"), "{e}");
    assert!(!e.to_string().contains("vercel_wrong_token"), "{e}");
}

#[tokio::test]
async fn output_streams_before_the_command_ends() {
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let d = driver(&fake);
    let sandbox = d.create(&spec("python3.13"), None).await.unwrap();
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
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let d = driver(&fake);
    let sandbox = d.create(&spec("node22"), None).await.unwrap();
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
    assert!(fake.requests.count("POST", "/kill") >= 1);
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
}

#[tokio::test]
async fn credentials_missing_or_wrong_are_clear_errors() {
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let e = VercelDriver::from_env(&|name| (name == "VERCEL_TOKEN").then(|| TOKEN.to_owned()))
        .unwrap_err();
    assert!(e.to_string().contains("VERCEL_PROJECT_ID"), "{e}");

    let wrong = "vercel_wrong_token_abcdef";
    let d = driver_with(&fake, wrong);
    let e = d.create(&spec("node24"), None).await.unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    let text = format!("{e} {e:?} {d:?}");
    assert!(text.contains("VERCEL_TOKEN"), "{text}");
    assert!(!text.contains(wrong), "the token leaked: {text}");

    // An OIDC token names its team and project itself.
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(
        r#"{{"owner_id":"{TEAM}","project_id":"{PROJECT}"}}"#
    ));
    let oidc = format!("eyJhbGciOiJSUzI1NiJ9.{payload}.sig");
    let oidc_fake = FakeVercel::start(&oidc, TEAM, PROJECT);
    let url = oidc_fake.api_url();
    let d = VercelDriver::from_env(&|name| match name {
        "VERCEL_OIDC_TOKEN" => Some(oidc.clone()),
        "VERCEL_API_URL" => Some(url.clone()),
        _ => None,
    })
    .unwrap();
    let sandbox = d.create(&spec("node24"), None).await.unwrap();
    assert_eq!(sandbox.state, CloudState::Running);

    // A runtime Vercel does not offer is refused before any call.
    let e = d.create(&spec("ruby3"), None).await.unwrap_err();
    assert!(matches!(e, VercelError::Runtime(_)), "{e}");
}

#[tokio::test]
async fn service_errors_and_retries() {
    let fake = FakeVercel::start(TOKEN, TEAM, PROJECT);
    let d = driver(&fake);
    let sandbox = d.create(&spec("node24"), None).await.unwrap();
    d.write_file(&sandbox.id, "f", b"x").await.unwrap();

    // 503 twice, then the (idempotent) read goes through.
    fake.faults.fail_next(2, 503, None);
    assert_eq!(d.read_file(&sandbox.id, "f").await.unwrap(), b"x");
    assert_eq!(fake.requests.count("POST", "/fs/read"), 3);

    // 429 with Retry-After is honoured, even on create.
    fake.faults.fail_next(1, 429, Some(1));
    let started = Instant::now();
    let second = d.create(&spec("node24"), None).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(fake.requests.count("POST", "/v1/sandboxes"), 3);
    d.destroy(&second.id).await.unwrap();

    // A 503 on create is not retried: it might have made a sandbox.
    fake.faults.fail_next(1, 503, None);
    let e = d.create(&spec("node24"), None).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert_eq!(fake.requests.count("POST", "/v1/sandboxes"), 4);

    // 503 forever: a clear error after every attempt.
    fake.faults.fail_forever(503);
    let before = fake.requests.count("POST", "/fs/read");
    let e = d.read_file(&sandbox.id, "f").await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert!(e.to_string().contains("503"), "{e}");
    assert_eq!(
        fake.requests.count("POST", "/fs/read") - before,
        RETRY_ATTEMPTS as usize
    );
    fake.faults.clear();

    // 400 is not retried: injected, and the service's own vCPU limit.
    fake.faults.fail_next(1, 400, None);
    let before = fake.requests.count("POST", "/fs/read");
    assert_eq!(
        d.read_file(&sandbox.id, "f").await.unwrap_err().status(),
        Some(400)
    );
    assert_eq!(fake.requests.count("POST", "/fs/read") - before, 1);
    let mut big = spec("node24");
    big.cpu = 16.0;
    big.memory_mb = 64 * 1024;
    // The driver caps vCPUs at 8, which the service accepts.
    let capped = d.create(&big, None).await.unwrap();
    d.destroy(&capped.id).await.unwrap();
}
