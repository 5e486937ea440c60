//! `bench-kube`: the kubernetes backend against kubectl, on the API server
//! of `tests/kube-harness/` (a real kube-apiserver with etcd; see
//! docs/kubernetes.md). One run prints each figure beside its baseline:
//!
//! 1. a no-op `hermes reconcile --dry-run` with 500 sandbox Pods of other
//!    profiles in the namespace (bound to a node that does not exist, so
//!    none runs; the plan leaves them alone) against `kubectl get pods -l
//!    hermes-agent=1` (the real kubectl of k8s.io/kubectl v0.37.2, built
//!    into the harness), runs interleaved; target: p50 ratio ≤ 1.5
//!    (hermes also reads the claims and the activity records, and plans);
//! 2. create-to-first-command: `hermes exec --session S -- true` for a
//!    session whose Pod does not exist yet (made, run by the harness's node
//!    agent as a container of the test engine, waited for, exec'd),
//!    beside `docker run --rm IMAGE true`, the floor of what that node
//!    agent does; reported, no target.
//!
//! Run from the workspace root with release binaries and the harness
//! (`scripts/kube-harness-build`):
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-kube && \
//!   HERMES_KUBE_HARNESS=$(scripts/kube-harness-build | tail -n 1) target/release/bench-kube
//! ```
//!
//! Needs the engine and the test image of `bash scripts/test`. Everything
//! lives in the harness (stopped at the end) and a temporary home.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hermes_bench::harness::{self, Check};
use hermes_bench::run::Cmd;
use hermes_bench::stats::{Ms, Samples, header, ratio, row};
use hermes_tests::kube_harness::{Harness, harness_binary};

/// The dry run's target: hermes's p50 over kubectl's.
const RECONCILE_TARGET: f64 = 1.5;

#[derive(Debug, Parser)]
#[command(
    name = "bench-kube",
    about = "hermes on kubernetes against kubectl: a no-op dry run among 500 Pods, create-to-first-command"
)]
struct Args {
    /// Sandbox Pods of other profiles in the namespace.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pods: u32,
    /// Measured runs of each side of the dry run (interleaved).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    runs: u32,
    /// New sessions timed from create to first command.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    sessions: u32,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let hermes = match harness::hermes_binary(args.hermes.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(1);
        }
    };
    // The harness and its Pods are set up before the measuring runtime
    // starts: their helpers block.
    let h = Harness::start();
    let home = match tempfile::Builder::new().prefix("hermes-kbench-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: a temporary home: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = std::fs::write(home.path().join("config.yaml"), h.config("")) {
        eprintln!("error: config.yaml: {e}");
        return ExitCode::from(1);
    }
    eprintln!("making {} Pods of other profiles …", args.pods);
    let image = hermes_tests::test_image();
    for i in 0..args.pods {
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("hermes-bench{}-t{i}", i % 100),
                "labels": {
                    "hermes-agent": "1",
                    "app.kubernetes.io/managed-by": "hermes",
                    "hermes-profile": format!("bench{}", i % 100),
                    "hermes-task-id": format!("t{i}"),
                },
            },
            "spec": {
                "nodeName": "hermes-bench-absent",
                "containers": [{"name": "main", "image": image, "command": ["sleep", "infinity"]}],
            },
        });
        if let Err(e) = h.try_admin(
            "POST",
            &format!("/api/v1/namespaces/{}/pods", h.namespace),
            Some(pod),
        ) {
            eprintln!("error: making Pod {i}: {e}");
            return ExitCode::from(1);
        }
    }
    harness::main(|| bench(args, hermes, h, home))
}

async fn bench(
    args: Args,
    hermes: PathBuf,
    h: Harness,
    home: tempfile::TempDir,
) -> anyhow::Result<Vec<Check>> {
    let with_home = |cmd: Cmd| cmd.arg("--home").arg(home.path());
    // The warm Pod first: the dry run after it is a no-op.
    let made = with_home(Cmd::new(&hermes))
        .arg("reconcile")
        .output()
        .await?;
    anyhow::ensure!(made.code == Some(0), "hermes reconcile: {}", made.stderr);
    let dry = with_home(Cmd::new(&hermes)).args(["reconcile", "--dry-run"]);
    let kubectl = Cmd::new(harness_binary()).args([
        "kubectl".as_ref(),
        "--kubeconfig".as_ref(),
        h.hermes_kubeconfig.as_os_str(),
        "get".as_ref(),
        "pods".as_ref(),
        "-n".as_ref(),
        h.namespace.as_ref(),
        "-l".as_ref(),
        "hermes-agent=1".as_ref(),
    ]);
    let listed = kubectl.output().await?;
    let count = listed.stdout.lines().count().saturating_sub(1);
    anyhow::ensure!(
        count == args.pods as usize + 1,
        "kubectl lists {count} Pods, not {}: {}",
        args.pods + 1,
        listed.stderr
    );
    println!(
        "bench-kube: kube-apiserver v1.37.2 of the harness, {} sandbox Pods (1 of this profile, running); load average {}",
        count,
        harness::load_average()
    );
    for _ in 0..3 {
        dry.time().await?;
        kubectl.time().await?;
    }
    let (mut ours, mut theirs) = (Samples::with_capacity(64), Samples::with_capacity(64));
    for i in 0..args.runs {
        if i % 2 == 0 {
            ours.push(dry.time().await?);
            theirs.push(kubectl.time().await?);
        } else {
            theirs.push(kubectl.time().await?);
            ours.push(dry.time().await?);
        }
    }
    println!();
    println!("1. no-op dry run among {} Pods", count);
    println!("{}", header());
    println!("{}", row("hermes reconcile --dry-run", &ours));
    println!("{}", row("kubectl get pods -l hermes-agent=1", &theirs));
    let r = ratio(ours.p50(), theirs.p50());
    println!("  ratio (p50): {r:.2}");

    let docker = Cmd::new("docker").args([
        "run",
        "--rm",
        "--network",
        "none",
        &hermes_tests::test_image(),
        "true",
    ]);
    let (mut create, mut floor) = (Samples::with_capacity(16), Samples::with_capacity(16));
    for i in 0..args.sessions {
        let session = format!("kb{i}");
        create.push(
            with_home(Cmd::new(&hermes))
                .args(["exec", "--session", &session, "--", "true"])
                .time()
                .await?,
        );
        floor.push(docker.time().await?);
    }
    println!();
    println!("2. create-to-first-command (a new session's Pod)");
    println!("{}", header());
    println!("{}", row("hermes exec --session NEW -- true", &create));
    println!("{}", row("docker run --rm IMAGE true (the floor)", &floor));
    println!("  ratio (p50): {:.2}", ratio(create.p50(), floor.p50()));
    drop(h);
    Ok(vec![Check::new(
        format!("no-op dry run among {count} Pods / kubectl get (p50) ≤ {RECONCILE_TARGET}"),
        format!("{r:.2} ({} vs {})", Ms(ours.p50()), Ms(theirs.p50())),
        r <= RECONCILE_TARGET,
    )])
}
