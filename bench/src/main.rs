//! `bench-docker`: the Docker benchmark of hermes. One run measures each
//! figure beside its baseline, prints the ratio and checks the target:
//!
//! 1. warm exec: `hermes exec -- true` (the release binary, its sandbox
//!    already running) against `docker exec <id> true` through the Docker
//!    CLI, runs interleaved after a warm-up; target: p50 ratio ≤ 0.7. A
//!    breakdown follows: where the time of one `hermes exec` goes.
//! 2. reattach: finding the sandbox through the library
//!    ([`Engine::find`]) with a connected engine; target: p50 < 5 ms.
//! 3. no-op `hermes reconcile --dry-run` with 500 labelled containers
//!    present (created, never started: the sandboxes of 100 other
//!    profiles, which the plan leaves alone, so it stays a no-op) against
//!    `docker ps -a --filter label=hermes-agent=1` through the CLI; target:
//!    p50 ratio ≤ 1.0.
//!
//! Run it from the workspace root, with both binaries built in release:
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-docker && target/release/bench-docker
//! ```
//!
//! It needs a running engine, the Docker CLI and the test image
//! (`hermes-test-base:bookworm-1`, or `HERMES_TEST_IMAGE`): `bash
//! scripts/test` provisions all three. Everything it makes lives in a
//! temporary `HERMES_HOME` and in containers named `hermes-hbench-<run>-…`
//! of profiles of its own, removed at the end, also after an error or
//! Ctrl-C. Exit code: 0 when every target is met, 2 when one is missed, 1
//! on error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use hermes_backends::docker::{Engine, ExecRequest};
use hermes_bench::fleet;
use hermes_bench::harness::{self, Check};
use hermes_bench::run::Cmd;
use hermes_bench::stats::{Ms, Samples, header, ratio, row};
use hermes_model::config::Config;
use hermes_model::sandbox::SandboxKey;

/// The exec target: hermes's p50 over the Docker CLI's.
const EXEC_TARGET: f64 = 0.7;
/// The reattach target, p50.
const REATTACH_TARGET: Duration = Duration::from_millis(5);
/// The reconcile target: hermes's p50 over the Docker CLI's.
const RECONCILE_TARGET: f64 = 1.0;

#[derive(Debug, Parser)]
#[command(
    name = "bench-docker",
    about = "hermes against the Docker CLI: warm exec, reattach, no-op reconcile with many containers"
)]
struct Args {
    /// Measured runs of each side (interleaved).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Unmeasured runs of each side first.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    warmup: u32,
    /// Labelled containers present for the reconcile benchmark.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(0..=5000))]
    containers: u32,
    /// Engine calls at once while creating and removing them.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
    /// Only these parts (default: all).
    #[arg(long, value_enum)]
    only: Vec<Part>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Exec,
    Reattach,
    Reconcile,
}

impl Args {
    fn wants(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }

    fn runs(&self) -> usize {
        self.runs as usize
    }

    fn warmup(&self) -> usize {
        self.warmup as usize
    }

    fn concurrency(&self) -> usize {
        self.concurrency as usize
    }
}

/// What every part shares.
#[derive(Debug)]
struct Bench {
    engine: Engine,
    hermes: PathBuf,
    home: harness::TempHome,
    config: Config,
    profile: String,
    /// Every container of this run is named with it.
    prefix: String,
}

impl Bench {
    fn hermes<I, S>(&self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Cmd::new(&self.hermes)
            .arg("--home")
            .arg(self.home.path())
            .arg("--profile")
            .arg(&self.profile)
            .args(args)
    }

    fn key(&self) -> SandboxKey {
        SandboxKey::persistent(&self.profile, "default")
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    harness::main(|| bench(&args))
}

async fn bench(args: &Args) -> anyhow::Result<Vec<Check>> {
    let bench = setup(args).await?;
    harness::with_cleanup(
        &bench.engine,
        &bench.prefix,
        args.concurrency(),
        run_parts(&bench, args),
    )
    .await
}

/// Checks what the bench needs, says what is missing and how to get it,
/// and makes the temporary home.
async fn setup(args: &Args) -> anyhow::Result<Bench> {
    let hermes = harness::hermes_binary(args.hermes.as_deref())?;
    let engine = harness::connect("hermes Docker benchmark").await?;
    let image = harness::test_image(&engine).await?;
    harness::docker_cli().await?;
    println!("hermes: {}; image: {image}", hermes.display());

    let text = format!("terminal:\n  backend: docker\n  docker_image: {image}\n");
    let profile = harness::unique_profile();
    let (home, config) = harness::temp_home(&profile, &text)?;
    let prefix = format!("hermes-{profile}-");
    Ok(Bench {
        engine,
        hermes,
        home,
        config,
        profile,
        prefix,
    })
}

async fn run_parts(bench: &Bench, args: &Args) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    println!(
        "{} runs of each side, interleaved, after {} warm-up runs; profile {}",
        args.runs, args.warmup, bench.profile
    );
    // The sandbox, made the way a user makes it; then the pass must be a
    // no-op.
    let made = bench.hermes(["reconcile"]).output().await?;
    anyhow::ensure!(
        made.code == Some(0),
        "`hermes reconcile` exited with {:?}:\n{}{}",
        made.code,
        made.stdout,
        made.stderr
    );
    expect_no_op(bench).await?;
    let sandbox = bench
        .engine
        .find(&bench.key())
        .await?
        .context("the sandbox is not there after `hermes reconcile`")?;

    if args.wants(Part::Exec) {
        checks.push(exec(bench, args, &sandbox.id).await?);
    }
    if args.wants(Part::Reattach) {
        checks.push(reattach(bench, args, &sandbox.id).await?);
    }
    if args.wants(Part::Reconcile) {
        checks.push(reconcile(bench, args).await?);
    }
    Ok(checks)
}

/// `hermes reconcile --dry-run` must exit 0: nothing to do. Returns the
/// plan's last line.
async fn expect_no_op(bench: &Bench) -> anyhow::Result<String> {
    let dry = bench.hermes(["reconcile", "--dry-run"]).output().await?;
    if dry.code != Some(0) {
        let plan: Vec<&str> = dry.stdout.lines().take(20).collect();
        anyhow::bail!(
            "`hermes reconcile --dry-run` exited with {:?} instead of 0 (no-op):\n{}\n{}",
            dry.code,
            plan.join("\n"),
            dry.stderr.trim()
        );
    }
    Ok(dry.stdout.lines().last().unwrap_or_default().to_string())
}

/// One thing to time: a run of a program, or an exec through the library.
enum Probe<'a> {
    Run(Cmd),
    Exec {
        engine: &'a Engine,
        id: &'a str,
        request: ExecRequest,
    },
}

impl Probe<'_> {
    async fn time(&self) -> anyhow::Result<Duration> {
        match self {
            Probe::Run(cmd) => cmd.time().await,
            Probe::Exec {
                engine,
                id,
                request,
            } => {
                let started = Instant::now();
                let outcome = engine
                    .exec(id, request, tokio::io::sink(), tokio::io::sink())
                    .await?;
                let elapsed = started.elapsed();
                anyhow::ensure!(
                    outcome.exit_code == 0,
                    "{:?} exited with {}",
                    request.cmd,
                    outcome.exit_code
                );
                Ok(elapsed)
            }
        }
    }
}

/// Times every probe once a round, in an order that rotates from round to
/// round (AB, BA, … for two), after `warmup` unmeasured rounds.
async fn interleave(probes: &[Probe<'_>], args: &Args) -> anyhow::Result<Vec<Samples>> {
    let n = probes.len();
    let mut samples = vec![Samples::with_capacity(args.runs()); n];
    for round in 0..args.warmup() + args.runs() {
        for k in 0..n {
            let i = (round + k) % n;
            let t = probes[i].time().await?;
            if round >= args.warmup() {
                samples[i].push(t);
            }
        }
    }
    Ok(samples)
}

async fn exec(bench: &Bench, args: &Args, id: &str) -> anyhow::Result<Check> {
    println!();
    println!("1. warm exec of `true` in the running sandbox");
    let probes = [
        Probe::Run(bench.hermes(["exec", "--", "true"])),
        Probe::Run(Cmd::new("docker").args(["exec", id, "true"])),
        // The part both sides wait for: the engine's exec (create, start,
        // output until its end, exit code), measured in the same rounds.
        Probe::Exec {
            engine: &bench.engine,
            id,
            request: ExecRequest {
                cmd: vec!["true".to_string()],
                env: Vec::new(),
                cwd: None,
                timeout: Duration::from_secs(60),
            },
        },
    ];
    let samples = interleave(&probes, args).await?;
    let [h, d, e] = [&samples[0], &samples[1], &samples[2]];
    let r = ratio(h.p50(), d.p50());
    println!("{}", header());
    println!("{}", row("hermes exec -- true", h));
    println!("{}", row("docker exec <id> true (CLI)", d));
    println!("  ratio of the p50s: {r:.2} (target ≤ {EXEC_TARGET})");
    println!();
    println!("  where the time goes:");
    println!("{}", row("the engine's exec, through the library", e));
    println!(
        "  the CLI waits for it and adds {}; hermes runs the command through the sandbox's runner, \
         no engine exec (p50s)",
        Ms(d.p50().saturating_sub(e.p50())),
    );
    breakdown(bench, args).await?;
    Ok(Check::new(
        "warm exec: hermes / docker CLI, p50",
        format!("{r:.2} (≤ {EXEC_TARGET})"),
        r <= EXEC_TARGET,
    ))
}

/// hermes's own steps around the exec, one by one, and the Docker CLI's
/// start for comparison.
async fn breakdown(bench: &Bench, args: &Args) -> anyhow::Result<()> {
    let start = bench.hermes(["config", "path"]);
    let cli_start = Cmd::new("docker").arg("--version");
    let key = bench.key();
    let mut s_start = Samples::with_capacity(args.runs());
    let mut s_cli = Samples::with_capacity(args.runs());
    let mut s_connect = Samples::with_capacity(args.runs());
    let mut s_find = Samples::with_capacity(args.runs());
    for i in 0..args.warmup() + args.runs() {
        let measured = i >= args.warmup();
        let t_start = start.time().await?;
        let t_cli = cli_start.time().await?;
        let t0 = Instant::now();
        let engine = Engine::connect().await?;
        let t_connect = t0.elapsed();
        let t1 = Instant::now();
        let found = engine.find(&key).await?;
        let t_find = t1.elapsed();
        anyhow::ensure!(found.is_some(), "the sandbox went away");
        if measured {
            s_start.push(t_start);
            s_cli.push(t_cli);
            s_connect.push(t_connect);
            s_find.push(t_find);
        }
    }
    println!(
        "{}",
        row("hermes: process start (`hermes config path`)", &s_start)
    );
    println!(
        "{}",
        row("hermes: Engine::connect (API version)", &s_connect)
    );
    println!("{}", row("hermes: Engine::find (inspect by name)", &s_find));
    println!(
        "{}",
        row("CLI: `docker --version` (start, no engine)", &s_cli)
    );
    Ok(())
}

async fn reattach(bench: &Bench, args: &Args, id: &str) -> anyhow::Result<Check> {
    println!();
    println!("2. reattach: Engine::find of the running sandbox, engine connected");
    let key = bench.key();
    let runs = args.runs().max(50);
    let mut s = Samples::with_capacity(runs);
    for i in 0..args.warmup() + runs {
        let t = Instant::now();
        let found = bench.engine.find(&key).await?;
        let elapsed = t.elapsed();
        match found {
            Some(c) if c.id == id => {}
            other => anyhow::bail!(
                "find returned {:?} instead of the sandbox {id}",
                other.map(|c| c.id)
            ),
        }
        if i >= args.warmup() {
            s.push(elapsed);
        }
    }
    println!("{}", header());
    println!("{}", row("Engine::find(&SandboxKey)", &s));
    println!("  p50 {} (target < {})", Ms(s.p50()), Ms(REATTACH_TARGET));
    Ok(Check::new(
        "reattach: Engine::find, p50",
        format!("{} (< {})", Ms(s.p50()), Ms(REATTACH_TARGET)),
        s.p50() < REATTACH_TARGET,
    ))
}

async fn reconcile(bench: &Bench, args: &Args) -> anyhow::Result<Check> {
    println!();
    let n = args.containers as usize;
    println!(
        "3. no-op `hermes reconcile --dry-run` with {n} labelled containers present (created, not started)"
    );
    let specs = fleet::specs(
        &bench.config,
        bench.home.root(),
        &bench.profile,
        &bench.prefix,
        n,
    )?;
    let t = Instant::now();
    let ids = fleet::create(&bench.engine, &specs, args.concurrency()).await?;
    let took = t.elapsed();
    let ours = fleet::list(&bench.engine, &bench.prefix).await?.len();
    anyhow::ensure!(
        ours == n + 1,
        "{ours} containers named {}* instead of {}",
        bench.prefix,
        n + 1
    );
    let labelled = Cmd::new("docker")
        .args(["ps", "-aq", "--filter", "label=hermes-agent=1"])
        .output()
        .await?
        .stdout
        .lines()
        .count();
    println!(
        "  created {n} in {:.1}s ({} at a time); {labelled} labelled containers on the engine",
        took.as_secs_f64(),
        args.concurrency
    );
    // They must not make the pass do anything.
    let footer = expect_no_op(bench).await?;
    println!("  `hermes reconcile --dry-run` exits 0: {footer}");

    let probes = [
        Probe::Run(bench.hermes(["reconcile", "--dry-run"])),
        Probe::Run(Cmd::new("docker").args(["ps", "-a", "--filter", "label=hermes-agent=1"])),
    ];
    let samples = interleave(&probes, args).await?;
    let [h, d] = [&samples[0], &samples[1]];
    let r = ratio(h.p50(), d.p50());
    println!("{}", header());
    println!("{}", row("hermes reconcile --dry-run (exit 0)", h));
    println!("{}", row("docker ps -a --filter label=hermes-agent=1", d));
    println!("  ratio of the p50s: {r:.2} (target ≤ {RECONCILE_TARGET})");

    let t = Instant::now();
    let removed = fleet::remove(&bench.engine, ids, args.concurrency()).await?;
    println!(
        "  removed {removed} containers in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(Check::new(
        "no-op reconcile --dry-run / docker ps, p50",
        format!("{r:.2} (≤ {RECONCILE_TARGET})"),
        r <= RECONCILE_TARGET,
    ))
}
