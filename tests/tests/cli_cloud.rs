//! The cloud backends (modal, daytona, vercel_sandbox) end to end: the real
//! `hermes` binary against the contract fakes of their APIs
//! (`hermes_tests::fakes`), pointed there with `MODAL_SERVER_URL`,
//! `DAYTONA_API_URL` and `VERCEL_API_URL` (plain http to loopback).
//!
//! For each service: the dry run plans the create and changes nothing on
//! the service (its request log says so), `reconcile` creates one sandbox
//! and the next dry run is converged, `hermes exec` streams output with the
//! command's exit code (124 on `--timeout`), runs every command in that one
//! sandbox, a file survives `hermes session end` and the next exec, a
//! snapshot that cannot be restored is dropped with a warning for the base
//! image (once), wrong credentials are an error that names the variable
//! without printing it, and a provider key reaches the service only when
//! `<backend>_forward_env` names it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::fakes::daytona::FakeDaytona;
use hermes_tests::fakes::modal::FakeModal;
use hermes_tests::fakes::vercel::FakeVercel;

const MODAL_ID: &str = "ak-cli-token-id";
const MODAL_SECRET: &str = "as-cli-token-secret-0123";
const DAYTONA_KEY: &str = "dtn_cli_key_0123456789";
const VERCEL_TOKEN: &str = "vercel_cli_token_0123456789";
const VERCEL_TEAM: &str = "team_cli";
const VERCEL_PROJECT: &str = "prj_cli";

/// A provider key that must never reach a cloud sandbox unless named.
const PROVIDER_KEY: &str = "sk-cli-provider-key-must-stay-home-42";
/// A value `<backend>_forward_env` names, which must reach it.
const FORWARDED: &str = "forwarded-value-7";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Modal,
    Daytona,
    Vercel,
}

/// One service's fake and how hermes reaches it.
struct Service {
    kind: Kind,
    fake: Fake,
    /// Owns the Modal fake's server tasks; dropped after the fake.
    _runtime: Option<tokio::runtime::Runtime>,
}

enum Fake {
    Modal(FakeModal),
    Daytona(FakeDaytona),
    Vercel(FakeVercel),
}

impl Service {
    fn start(kind: Kind) -> Service {
        match kind {
            Kind::Modal => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                let fake = runtime.block_on(FakeModal::start(MODAL_ID, MODAL_SECRET));
                Service {
                    kind,
                    fake: Fake::Modal(fake),
                    _runtime: Some(runtime),
                }
            }
            Kind::Daytona => Service {
                kind,
                fake: Fake::Daytona(FakeDaytona::start(DAYTONA_KEY)),
                _runtime: None,
            },
            Kind::Vercel => Service {
                kind,
                fake: Fake::Vercel(FakeVercel::start(VERCEL_TOKEN, VERCEL_TEAM, VERCEL_PROJECT)),
                _runtime: None,
            },
        }
    }

    fn backend(&self) -> &'static str {
        match self.kind {
            Kind::Modal => "modal",
            Kind::Daytona => "daytona",
            Kind::Vercel => "vercel_sandbox",
        }
    }

    /// config.yaml: the backend, its image, and `FORWARD_ME` forwarded.
    fn config(&self) -> String {
        match self.kind {
            Kind::Modal => "terminal:\n  backend: modal\n  modal_image: python:3.12\n  modal_forward_env: [FORWARD_ME]\n".into(),
            Kind::Daytona => "terminal:\n  backend: daytona\n  daytona_image: python:3.12\n  container_disk: 8192\n  daytona_forward_env: [FORWARD_ME]\n".into(),
            Kind::Vercel => "terminal:\n  backend: vercel_sandbox\n  vercel_runtime: python3.13\n  vercel_forward_env: [FORWARD_ME]\n".into(),
        }
    }

    /// The URL variable and the credentials, `secret` as the key.
    fn vars(&self, secret: &str) -> Vec<(&'static str, String)> {
        match &self.fake {
            Fake::Modal(f) => vec![
                ("MODAL_SERVER_URL", f.url()),
                ("MODAL_TOKEN_ID", MODAL_ID.into()),
                ("MODAL_TOKEN_SECRET", secret.into()),
            ],
            Fake::Daytona(f) => vec![
                ("DAYTONA_API_URL", f.api_url()),
                ("DAYTONA_API_KEY", secret.into()),
            ],
            Fake::Vercel(f) => vec![
                ("VERCEL_API_URL", f.api_url()),
                ("VERCEL_TOKEN", secret.into()),
                ("VERCEL_TEAM_ID", VERCEL_TEAM.into()),
                ("VERCEL_PROJECT_ID", VERCEL_PROJECT.into()),
            ],
        }
    }

    fn secret(&self) -> &'static str {
        match self.kind {
            Kind::Modal => MODAL_SECRET,
            Kind::Daytona => DAYTONA_KEY,
            Kind::Vercel => VERCEL_TOKEN,
        }
    }

    /// The variable a wrong secret must be blamed on.
    fn secret_var(&self) -> &'static str {
        match self.kind {
            Kind::Modal => "MODAL_TOKEN",
            Kind::Daytona => "DAYTONA_API_KEY",
            Kind::Vercel => "VERCEL_TOKEN",
        }
    }

    /// Every request that changes something on the service, in order.
    fn mutating(&self) -> Vec<String> {
        match &self.fake {
            Fake::Modal(f) => f
                .calls()
                .into_iter()
                .filter(|c| !matches!(c.as_str(), "AppGetOrCreate" | "SandboxList"))
                .collect(),
            Fake::Daytona(f) => non_get(f.requests.all()),
            Fake::Vercel(f) => non_get(f.requests.all()),
        }
    }

    /// How many sandboxes were asked for.
    fn creates(&self) -> usize {
        match &self.fake {
            Fake::Modal(f) => f.calls().iter().filter(|c| *c == "SandboxCreate").count(),
            Fake::Daytona(f) => f.requests.count("POST", "/api/sandbox"),
            Fake::Vercel(f) => f.requests.count("POST", "/v1/sandboxes"),
        }
    }

    /// How many sandboxes the service made.
    fn made(&self) -> usize {
        match &self.fake {
            // Only calls with good credentials are admitted.
            Fake::Modal(f) => f.calls().iter().filter(|c| *c == "SandboxCreate").count(),
            Fake::Daytona(f) => f.sandbox_count(),
            Fake::Vercel(f) => f.sandbox_count(),
        }
    }

    /// Whether `needle` reached the service in anything it was sent.
    fn received(&self, needle: &str) -> bool {
        let bytes = match &self.fake {
            Fake::Modal(f) => f.received(),
            Fake::Daytona(f) => f.received(),
            Fake::Vercel(f) => f.received(),
        };
        String::from_utf8_lossy(&bytes).contains(needle)
    }

    /// Snapshots of modal and vercel are records; Daytona keeps the stopped
    /// sandbox.
    fn snapshots(&self) -> bool {
        self.kind != Kind::Daytona
    }

    fn book(&self, home: &TestHome) -> PathBuf {
        home.path()
            .join(format!("{}_snapshots.json", self.backend()))
    }
}

fn non_get(requests: Vec<(String, String)>) -> Vec<String> {
    requests
        .into_iter()
        .filter(|(m, _)| m != "GET")
        .map(|(m, p)| format!("{m} {p}"))
        .collect()
}

/// A home for `service`, its credentials in the environment (Daytona's in
/// `.env`, 0600, to cover that road too).
fn home_for(service: &Service) -> TestHome {
    let home = TestHome::new();
    home.write_config(service.config());
    if service.kind == Kind::Daytona {
        let env: String = service
            .vars(service.secret())
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        let path = home.path().join(".env");
        std::fs::write(&path, env).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    home
}

/// Runs hermes in `home` with `service`'s credentials (the key `secret`),
/// a provider key and a value to forward in its environment.
fn hermes(service: &Service, home: &TestHome, secret: &str, args: &[&str]) -> Run {
    let mut cmd = home.command(args);
    cmd.env("HOME", home.path())
        .env("OPENAI_API_KEY", PROVIDER_KEY)
        .env("FORWARD_ME", FORWARDED)
        .env_remove("MODAL_SERVER_URL")
        .env_remove("DAYTONA_API_URL")
        .env_remove("VERCEL_API_URL");
    if service.kind != Kind::Daytona || secret != service.secret() {
        for (k, v) in service.vars(secret) {
            cmd.env(k, v);
        }
    }
    let run: Run = cmd.output().unwrap().into();
    for out in [&run.stdout, &run.stderr] {
        assert!(!out.contains(secret), "the secret was printed: {run:?}");
        assert!(
            !out.contains(PROVIDER_KEY),
            "the provider key was printed: {run:?}"
        );
    }
    run
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn records(service: &Service, home: &TestHome) -> serde_json::Value {
    let path = service.book(home);
    assert_eq!(mode(&path), 0o600, "{}", path.display());
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The whole life of the default task's sandbox through the binary.
fn life_cycle(kind: Kind) {
    let service = Service::start(kind);
    let backend = service.backend();
    let home = home_for(&service);
    let run = |args: &[&str]| hermes(&service, &home, service.secret(), args);

    // The dry run plans the create and changes nothing there.
    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    let create = format!("+ {backend} default/default");
    assert!(plan.stdout.contains(&create), "{}", plan.stdout);
    assert!(
        plan.stdout.contains("create") && plan.stdout.contains("from the base image"),
        "{}",
        plan.stdout
    );
    assert_eq!(service.mutating(), Vec::<String>::new());
    if let Fake::Modal(f) = &service.fake {
        // AppGetOrCreate only looked the app up.
        assert_eq!(f.apps(), Vec::<String>::new());
    }
    assert!(!service.book(&home).exists());

    // reconcile creates it; the next dry run is converged.
    let applied = run(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(service.creates(), 1);
    let record = records(&service, &home);
    assert!(record["default"]["sandbox"].is_string(), "{record}");
    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(!plan.stdout.contains(&create), "{}", plan.stdout);
    assert_eq!(service.creates(), 1);
    // list and status only look.
    let id = record["default"]["sandbox"].as_str().unwrap().to_owned();
    let before = service.mutating();
    let list = run(&["sandbox", "list", "--output", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let listed: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(listed["sandboxes"][0]["id"], id.as_str(), "{listed}");
    assert_eq!(listed["sandboxes"][0]["state"], "running", "{listed}");
    let status = run(&["status"]);
    assert!(status.stdout.contains(backend), "{status:?}");
    assert_eq!(status.code, 0, "{status:?}");
    assert_eq!(service.mutating(), before);

    // Output and exit codes.
    let exec = run(&["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(exec.code, 3, "{exec:?}");
    assert_eq!(exec.stdout, "out\n");
    assert!(exec.stderr.contains("err\n"), "{exec:?}");

    // Only the named variable goes there, not the provider key.
    let exec = run(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo fwd=$FORWARD_ME key=${OPENAI_API_KEY:-unset}",
    ]);
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(exec.stdout, format!("fwd={FORWARDED} key=unset\n"));
    assert!(
        service.received(FORWARDED),
        "{backend}: the forwarded value"
    );
    assert!(
        !service.received(PROVIDER_KEY),
        "{backend}: the provider key reached the service"
    );

    // --timeout: 124, and long before the command would have ended.
    let started = Instant::now();
    let exec = run(&["exec", "--timeout", "1", "--", "sh", "-c", "sleep 300"]);
    assert_eq!(exec.code, 124, "{exec:?}");
    assert!(started.elapsed() < Duration::from_secs(60), "{exec:?}");
    assert!(exec.stderr.contains("timed out"), "{exec:?}");

    // A file, in the one sandbox every exec used.
    let exec = run(&["exec", "--", "sh", "-c", "echo kept > keep.txt"]);
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(service.creates(), 1, "{backend}: every exec in one sandbox");

    // The session ends: the filesystem is kept, the sandbox forgotten. A
    // plan, printed, then carried out as printed and nothing more.
    let end = run(&["session", "end", "s1"]);
    assert_eq!(end.code, 0, "{end:?}");
    let target = format!("{backend} default/default");
    assert_eq!(
        end.planned(),
        [(target.clone(), "suspend".to_string())],
        "{end:?}"
    );
    assert_eq!(end.done(), end.planned(), "{end:?}");
    // Nothing left to end: no plan, nothing asked of the service but a look.
    let before = service.mutating();
    let again = run(&["session", "end", "s1"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("nothing to end"), "{again:?}");
    assert!(again.done().is_empty(), "{again:?}");
    assert_eq!(service.mutating(), before);
    let record = records(&service, &home);
    assert!(record["default"].get("sandbox").is_none(), "{record}");
    if service.snapshots() {
        // Back to the reference's format: the snapshot id alone.
        assert!(record["default"].is_string(), "{record}");
        assert!(end.stdout.contains("snapshot"), "{end:?}");
    }

    // The next exec finds the file (restored, or resumed), and the one
    // after it the same sandbox.
    let exec = run(&["exec", "--", "cat", "keep.txt"]);
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(exec.stdout, "kept\n");
    let after = if service.snapshots() { 2 } else { 1 };
    assert_eq!(service.creates(), after);
    let exec = run(&["exec", "--", "cat", "keep.txt"]);
    assert_eq!((exec.code, exec.stdout.as_str()), (0, "kept\n"), "{exec:?}");
    assert_eq!(service.creates(), after);
    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");

    // `hermes down` suspends it as a session's end does, by its plan; the
    // next exec finds the file again.
    let down = run(&["down", "--dry-run"]);
    assert_eq!(down.code, 2, "{down:?}");
    assert_eq!(
        down.planned(),
        [(target.clone(), "suspend".to_string())],
        "{down:?}"
    );
    let down = run(&["down", "--yes"]);
    assert_eq!(down.code, 0, "{down:?}");
    assert_eq!(down.done(), down.planned(), "{down:?}");
    let again = run(&["down", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
    let exec = run(&["exec", "--", "cat", "keep.txt"]);
    assert_eq!((exec.code, exec.stdout.as_str()), (0, "kept\n"), "{exec:?}");
}

/// A snapshot the service cannot restore: dropped with a warning, the
/// sandbox made from the base image in the same pass, and no loop.
fn bad_snapshot(kind: Kind) {
    let service = Service::start(kind);
    let backend = service.backend();
    let home = home_for(&service);
    let run = |args: &[&str]| hermes(&service, &home, service.secret(), args);
    std::fs::write(service.book(&home), "{\"default\": \"snap-gone-404\"}\n").unwrap();

    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.contains("from snapshot snap-gone-404"),
        "{}",
        plan.stdout
    );
    let applied = run(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        applied.stderr.contains("warning")
            && applied
                .stderr
                .contains("snapshot snap-gone-404 failed to restore"),
        "{applied:?}"
    );
    assert_eq!(
        service.creates(),
        2,
        "{backend}: one failed create, one good"
    );
    let record = records(&service, &home);
    assert!(record["default"].get("snapshot").is_none(), "{record}");
    assert!(record["default"]["sandbox"].is_string(), "{record}");

    // Converged: no second attempt, and exec runs in that sandbox.
    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    let exec = run(&["exec", "--", "true"]);
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(service.creates(), 2);
}

/// A wrong key: an error naming the variable (or the service's refusal),
/// never the key, and nothing made.
fn wrong_credentials(kind: Kind) {
    let service = Service::start(kind);
    let home = home_for(&service);
    let wrong = "wrong-secret-value-0000";
    if kind == Kind::Daytona {
        // The wrong key in .env.
        let env: String = service
            .vars(wrong)
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        std::fs::write(home.path().join(".env"), env).unwrap();
    }
    let exec = hermes(&service, &home, wrong, &["exec", "--", "true"]);
    assert_eq!(exec.code, 1, "{exec:?}");
    let names = exec.stderr.contains(service.secret_var())
        || exec.stderr.contains("401")
        || exec.stderr.contains("403");
    assert!(names, "{exec:?}");
    assert_eq!(service.made(), 0);
    let plan = hermes(&service, &home, wrong, &["reconcile"]);
    assert_ne!(plan.code, 0, "{plan:?}");
    assert_eq!(service.made(), 0);
}

/// A provider key named in `<backend>_forward_env` on a service that sets
/// outbound headers itself: the sandbox holds the proxy-style token, the
/// create request's policy sets the real key's header towards the
/// provider's host only, and the real key is in no environment or command
/// the service received; `egress status` names the coverage.
fn service_side_transform(kind: Kind) {
    let service = Service::start(kind);
    let backend = service.backend();
    let home = home_for(&service);
    let short = backend.trim_end_matches("_sandbox");
    let image = match kind {
        Kind::Vercel => "vercel_runtime: python3.13",
        _ => "modal_image: python:3.12",
    };
    home.write_config(format!(
        "terminal:\n  backend: {backend}\n  {image}\n  {short}_forward_env: [FORWARD_ME, OPENAI_API_KEY]\n"
    ));
    let run = |args: &[&str]| hermes(&service, &home, service.secret(), args);

    let applied = run(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        !applied.stderr.contains("is a real credential"),
        "{applied:?}"
    );
    assert_eq!(service.creates(), 1);
    let exec = run(&[
        "exec",
        "--",
        "sh",
        "-c",
        "echo fwd=$FORWARD_ME key=$OPENAI_API_KEY",
    ]);
    assert_eq!(exec.code, 0, "{exec:?}");
    let token = exec
        .stdout
        .strip_prefix(&format!("fwd={FORWARDED} key=openai-"))
        .and_then(|t| t.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("{backend}: not the token: {exec:?}"));
    assert!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{exec:?}"
    );

    let bearer = format!("Bearer {PROVIDER_KEY}");
    match &service.fake {
        Fake::Vercel(f) => {
            assert_eq!(
                f.network_policies(),
                [serde_json::json!({
                    "mode": "custom",
                    "allowedDomains": ["api.openai.com", "*"],
                    "injectionRules": [
                        { "domain": "api.openai.com", "headers": { "authorization": bearer } },
                    ],
                })]
            );
            let commands = serde_json::to_string(&f.command_requests()).unwrap();
            assert!(commands.contains(FORWARDED), "{commands}");
            assert!(
                !commands.contains(PROVIDER_KEY),
                "the key in a command: {commands}"
            );
            // Every body the service got: the key only in that one rule.
            let received = String::from_utf8_lossy(&f.received()).into_owned();
            assert_eq!(received.matches(PROVIDER_KEY).count(), 1, "{received}");
        }
        Fake::Modal(f) => {
            let policies = f.outbound_policies();
            assert_eq!(policies.len(), 1, "{policies:?}");
            let rules = &policies[0].header_replacements;
            assert_eq!(rules.len(), 1, "{policies:?}");
            assert_eq!(rules[0].domain, "api.openai.com");
            assert_eq!(rules[0].secret_id, "");
            assert_eq!(
                rules[0].headers,
                [("authorization".to_string(), bearer.clone())].into()
            );
            let received = String::from_utf8_lossy(&f.received()).into_owned();
            assert!(received.contains("OPENAI_API_KEY=openai-"), "{received}");
            assert!(
                !received.contains(PROVIDER_KEY),
                "the key in an environment: {received}"
            );
            let commands = format!("{:?}", f.commands());
            assert!(
                !commands.contains(PROVIDER_KEY),
                "the key in a command: {commands}"
            );
        }
        Fake::Daytona(_) => unreachable!("Daytona has no transforms"),
    }

    let status = run(&["egress", "status"]);
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("OPENAI_API_KEY") && l.contains("service-side"))
        .unwrap_or_else(|| panic!("no service-side row: {status:?}"));
    assert!(
        row.contains(&format!("service-side transform ({short})")),
        "{row}"
    );
    assert!(
        !status.stdout.contains(&format!(
            "names OPENAI_API_KEY: the real key goes into {backend}"
        )),
        "{status:?}"
    );
    let _ = run(&["session", "end"]);
}

#[test]
fn vercel_sets_a_forwarded_provider_key_as_a_header_outside_the_sandbox() {
    service_side_transform(Kind::Vercel);
}

#[test]
fn modal_sets_a_forwarded_provider_key_as_a_header_outside_the_sandbox() {
    service_side_transform(Kind::Modal);
}

/// Daytona has no transform: a provider key named there still goes in as
/// it is, and `egress status` says so.
#[test]
fn daytona_still_reports_a_forwarded_provider_key_as_uncovered() {
    let service = Service::start(Kind::Daytona);
    let home = home_for(&service);
    home.write_config(
        "terminal:\n  backend: daytona\n  daytona_image: python:3.12\n  container_disk: 8192\n  daytona_forward_env: [OPENAI_API_KEY]\n",
    );
    let status = hermes(&service, &home, service.secret(), &["egress", "status"]);
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.starts_with("OPENAI_API_KEY")
                && l.contains("uncovered")
                && l.contains("Daytona offers no outbound header transform")),
        "{status:?}"
    );
    assert!(
        status
            .stdout
            .contains("names OPENAI_API_KEY: the real key goes into daytona"),
        "{status:?}"
    );
}

#[test]
fn modal_life_cycle_through_the_binary() {
    life_cycle(Kind::Modal);
}

#[test]
fn daytona_life_cycle_through_the_binary() {
    life_cycle(Kind::Daytona);
}

#[test]
fn vercel_life_cycle_through_the_binary() {
    life_cycle(Kind::Vercel);
}

#[test]
fn modal_bad_snapshot_is_dropped_for_the_base_image() {
    bad_snapshot(Kind::Modal);
}

#[test]
fn daytona_bad_snapshot_is_dropped_for_the_base_image() {
    bad_snapshot(Kind::Daytona);
}

#[test]
fn vercel_bad_snapshot_is_dropped_for_the_base_image() {
    bad_snapshot(Kind::Vercel);
}

#[test]
fn modal_wrong_credentials_are_named_never_shown() {
    wrong_credentials(Kind::Modal);
}

#[test]
fn daytona_wrong_credentials_are_named_never_shown() {
    wrong_credentials(Kind::Daytona);
}

#[test]
fn vercel_wrong_credentials_are_named_never_shown() {
    wrong_credentials(Kind::Vercel);
}

/// Execs started at the same moment with no sandbox yet: one is made, all
/// run in it (Vercel keeps every sandbox it is asked for, so a race
/// between two hermes processes would leave one behind, running).
#[test]
fn racing_execs_make_one_vercel_sandbox() {
    let service = Service::start(Kind::Vercel);
    let home = home_for(&service);
    let runs: Vec<Run> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    hermes(
                        &service,
                        &home,
                        service.secret(),
                        &["exec", "--", "sh", "-c", "echo ran"],
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for run in &runs {
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(run.stdout, "ran\n", "{run:?}");
    }
    assert_eq!(service.creates(), 1, "four racing execs, one sandbox");
}
