//! `bench-reap`: reaping exited orphans. One run measures both sides,
//! prints them side by side with the ratio, and checks the target:
//!
//! - hermes: `hermes reconcile` (the release binary, the whole run: it
//!   observes, plans and removes) in a temporary `HERMES_HOME` whose config
//!   (`terminal.backend: docker`, `container_persistent: false`,
//!   `lifetime_seconds: 1`, `docker_orphan_reaper: true`) makes 500 exited
//!   session sandboxes of its profile orphans: exited more than
//!   2 × max(60, 1) = 120 s ago;
//! - baseline: `docker rm -f` of 500 other, equivalent exited containers
//!   (session sandboxes of another profile) through the Docker CLI, all
//!   ids given to one `xargs` call.
//!
//! Target: hermes's time over the CLI's ≤ 0.5 (p50s over `--rounds`, each
//! round with a fresh fleet, the order of the two sides alternating).
//!
//! The 1000 containers are made through the engine as hermes makes
//! session sandboxes (the same labels and spec hash), each started once
//! and killed right away so that it is exited (a few run at a time), and the bench waits until they finished
//! over 120 s ago. Only the removal is timed. Afterwards it checks that
//! hermes planned exactly its 500, that they are gone, and that the CLI's
//! 500 were not touched. While it waits it profiles where the time goes:
//! the engine's own removal through the library at several concurrencies,
//! and hermes's observation (list, inspects) and plan through the library
//! on the same engine state.
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-reap && target/release/bench-reap
//! ```
//!
//! It needs the engine, the Docker CLI and the test image (`bash
//! scripts/test` provisions all three). Every container it makes is named
//! `hermes-hbench-<run>-…` and removed at the end, also after an error or
//! Ctrl-C. Exit code: 0 when the target is met, 2 when it is missed, 1 on
//! error.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bollard::models::ContainerSummaryStateEnum;
use clap::Parser;
use futures_util::StreamExt;
use hermes_backends::docker::Engine;
use hermes_bench::fleet;
use hermes_bench::harness::{self, Check};
use hermes_bench::run::{Cmd, Ran};
use hermes_bench::stats::{Ms, Samples, header, ratio, row};
use hermes_model::config::Config;
use hermes_model::desired::{Desired, HostEnv};
use hermes_model::observed::ContainerState;
use hermes_model::sandbox::SandboxSpec;

/// hermes's time over the CLI's, p50s.
const TARGET: f64 = 0.5;
/// The orphan age this config gives: 2 × max(60, lifetime_seconds = 1).
const ORPHAN_SECONDS: u64 = 120;
/// Beyond the orphan age, for the whole seconds the planner compares.
const ORPHAN_MARGIN: Duration = Duration::from_secs(2);
/// How long the killed containers may take to be seen exited.
const EXIT_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Parser)]
#[command(
    name = "bench-reap",
    about = "hermes reaping exited orphans against `docker rm -f` through the Docker CLI"
)]
struct Args {
    /// Exited containers each side removes.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    containers: u32,
    /// Rounds, each with a fresh fleet and a wait of over 120 s; the side
    /// that goes first alternates.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Engine calls at once while making the fleet (create, start, kill).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// Exited containers the engine profile removes through the library at
    /// each concurrency level, in the first round (0: no engine profile).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1000))]
    engine_sample: u32,
    /// The concurrency levels of the engine profile.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16,32,50")]
    levels: Vec<usize>,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
}

impl Args {
    fn n(&self) -> usize {
        self.containers as usize
    }

    fn concurrency(&self) -> usize {
        self.concurrency as usize
    }
}

/// What the rounds share.
#[derive(Debug)]
struct Bench {
    engine: Engine,
    hermes: PathBuf,
    /// The root every profile's home is in.
    home: harness::TempHome,
    config: Config,
    /// config.yaml of every profile's home.
    config_text: String,
    /// The run's name: every profile is `<base>-…`.
    base: String,
    /// Every container of this run is named with it.
    prefix: String,
}

impl Bench {
    fn hermes_profile(&self, round: usize) -> String {
        format!("{}-h{round}", self.base)
    }

    fn cli_profile(&self, round: usize) -> String {
        format!("{}-c{round}", self.base)
    }

    fn engine_profile(&self) -> String {
        format!("{}-e", self.base)
    }

    /// `count` session sandboxes of `profile`, whose home (under the
    /// root) is made if need be.
    fn sessions(&self, profile: &str, count: usize) -> anyhow::Result<Vec<SandboxSpec>> {
        let home = harness::profile_home(self.home.root(), profile, &self.config_text)?;
        fleet::sessions(&self.config, &home, profile, &self.prefix, count)
    }

    /// `hermes --home ROOT --profile P reconcile <args>`.
    fn reconcile(&self, profile: &str, args: &[&str]) -> Cmd {
        Cmd::new(&self.hermes)
            .arg("--home")
            .arg(self.home.root())
            .arg("--profile")
            .arg(profile)
            .arg("reconcile")
            .args(args)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    harness::main(|| bench(&args))
}

async fn bench(args: &Args) -> anyhow::Result<Vec<Check>> {
    anyhow::ensure!(
        args.levels.iter().all(|l| (1..=256).contains(l)),
        "--levels: each level is 1 to 256"
    );
    let hermes = harness::hermes_binary(args.hermes.as_deref())?;
    let engine = harness::connect("hermes reaping benchmark").await?;
    let image = harness::test_image(&engine).await?;
    harness::docker_cli().await?;
    println!("hermes: {}; image: {image}", hermes.display());
    let text = format!(
        "terminal:\n  backend: docker\n  docker_image: {image}\n  container_persistent: false\n  lifetime_seconds: 1\n  docker_orphan_reaper: true\n"
    );
    let base = harness::unique_profile();
    let (home, config) = harness::temp_home(&base, &text)?;
    let prefix = format!("hermes-{base}-");
    let bench = Bench {
        engine,
        hermes,
        home,
        config,
        config_text: text,
        base,
        prefix,
    };
    harness::with_cleanup(
        &bench.engine,
        &bench.prefix,
        args.concurrency(),
        run(&bench, args),
    )
    .await
}

async fn run(bench: &Bench, args: &Args) -> anyhow::Result<Vec<Check>> {
    let n = args.n();
    println!(
        "{} round(s); each: {n} exited orphans reaped by `hermes reconcile` against {n} others removed by `docker rm -f` (one xargs call)",
        args.rounds
    );
    let mut hermes_times = Samples::default();
    let mut cli_times = Samples::default();
    for round in 0..args.rounds as usize {
        println!();
        println!("Round {} of {}", round + 1, args.rounds);
        let (h, c) = self::round(bench, args, round).await?;
        hermes_times.push(h);
        cli_times.push(c);
    }
    let r = ratio(hermes_times.p50(), cli_times.p50());
    println!();
    println!("Reaping {n} exited orphans ({} round(s)):", args.rounds);
    println!("{}", header());
    println!(
        "{}",
        row("hermes reconcile (observe, plan, remove)", &hermes_times)
    );
    println!("{}", row("xargs docker rm -f (the CLI)", &cli_times));
    println!("  ratio of the p50s: {r:.2} (target ≤ {TARGET})");
    Ok(vec![Check::new(
        format!("reap {n} orphans: hermes reconcile / docker rm -f, p50"),
        format!("{r:.2} (≤ {TARGET})"),
        r <= TARGET,
    )])
}

/// One round: makes the two fleets (and, in the first round, the engine
/// profile's), waits until they are orphans, times both sides and checks
/// what each removed.
async fn round(bench: &Bench, args: &Args, round: usize) -> anyhow::Result<(Duration, Duration)> {
    let n = args.n();
    let h_profile = bench.hermes_profile(round);
    let c_profile = bench.cli_profile(round);
    let h_specs = bench.sessions(&h_profile, n)?;
    let c_specs = bench.sessions(&c_profile, n)?;
    let sample = if round == 0 && !args.levels.is_empty() {
        args.engine_sample as usize
    } else {
        0
    };
    let e_specs = bench.sessions(&bench.engine_profile(), sample * args.levels.len())?;

    let all: Vec<SandboxSpec> = h_specs
        .iter()
        .chain(&c_specs)
        .chain(&e_specs)
        .cloned()
        .collect();
    let t = Instant::now();
    let ids = fleet::create(&bench.engine, &all, args.concurrency()).await?;
    let created = t.elapsed();
    let t = Instant::now();
    fleet::run_once(&bench.engine, &ids, args.concurrency()).await?;
    wait_exited(bench, ids.len()).await?;
    let ran = t.elapsed();
    // Every container finished by now: from here the orphan age runs.
    let exited_at = SystemTime::now();
    println!(
        "  made {} session sandboxes ({n} of {h_profile}, {n} of {c_profile}, {} for the engine profile), {} at a time: created in {:.1}s, started and killed in {:.1}s",
        ids.len(),
        e_specs.len(),
        args.concurrency,
        created.as_secs_f64(),
        ran.as_secs_f64(),
    );
    let h_ids: BTreeSet<String> = ids[..n].iter().cloned().collect();
    let c_ids: Vec<String> = ids[n..2 * n].to_vec();
    let e_ids: Vec<String> = ids[2 * n..].to_vec();

    if !e_ids.is_empty() {
        engine_profile(bench, args, e_ids).await?;
    }
    let orphan_at = exited_at + Duration::from_secs(ORPHAN_SECONDS) + ORPHAN_MARGIN;
    if let Ok(left) = orphan_at.duration_since(SystemTime::now()) {
        println!(
            "  waiting {:.0}s until they finished over {ORPHAN_SECONDS}s ago",
            left.as_secs_f64()
        );
        tokio::time::sleep(left).await;
    }

    // hermes must plan exactly its own 500 as orphans, and nothing else.
    let expected: BTreeSet<String> = h_specs.iter().map(|s| target_of(&h_profile, s)).collect();
    let dry = bench
        .reconcile(&h_profile, &["--dry-run", "--output", "json"])
        .output()
        .await?;
    anyhow::ensure!(
        dry.code == Some(2),
        "`hermes reconcile --dry-run` exited with {:?} instead of 2 (changes pending): {}",
        dry.code,
        dry.stderr.trim()
    );
    check_plan(&dry.stdout, &expected)?;
    println!("  `hermes reconcile --dry-run`: {n} removals planned, all orphans of {h_profile}");
    observe_profile(bench, &h_profile).await?;

    let hermes = bench.reconcile(&h_profile, &["--output", "json"]);
    let cli = Cmd::new("xargs")
        .args(["-r", "docker", "rm", "-f"])
        .input(c_ids.join("\n") + "\n");
    let hermes_first = round % 2 == 0;
    let (h_ran, c_ran) = if hermes_first {
        let h = hermes.output().await?;
        check_hermes(bench, &h, &expected, &h_ids, &c_ids, true).await?;
        let c = cli.output().await?;
        (h, c)
    } else {
        let c = cli.output().await?;
        let h = hermes.output().await?;
        check_hermes(bench, &h, &expected, &h_ids, &c_ids, false).await?;
        (h, c)
    };
    anyhow::ensure!(
        c_ran.code == Some(0),
        "`xargs docker rm -f` exited with {:?}: {}",
        c_ran.code,
        c_ran.stderr.trim()
    );
    let removed_by_cli = c_ran.stdout.lines().filter(|l| !l.is_empty()).count();
    anyhow::ensure!(
        removed_by_cli == n,
        "`docker rm -f` named {removed_by_cli} removed containers instead of {n}"
    );
    let left = fleet::summaries(&bench.engine, &bench.prefix).await?;
    anyhow::ensure!(
        left.is_empty(),
        "{} of the round's containers are still there after both sides ran",
        left.len()
    );
    println!(
        "  {}: hermes reconcile {}, docker rm -f {} (ratio {:.2}); all {} gone, the other side's {n} untouched while hermes ran",
        if hermes_first {
            "hermes first"
        } else {
            "the CLI first"
        },
        Ms(h_ran.elapsed),
        Ms(c_ran.elapsed),
        ratio(h_ran.elapsed, c_ran.elapsed),
        2 * n
    );
    Ok((h_ran.elapsed, c_ran.elapsed))
}

/// Polls the list until `count` containers of the run are exited.
async fn wait_exited(bench: &Bench, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        let summaries = fleet::summaries(&bench.engine, &bench.prefix).await?;
        let exited = summaries
            .iter()
            .filter(|s| s.state == Some(ContainerSummaryStateEnum::EXITED))
            .count();
        if exited == count {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{exited} of {count} containers exited {}s after they were killed",
            EXIT_WAIT.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How a session sandbox's removal reads in the plan's JSON.
fn target_of(profile: &str, spec: &SandboxSpec) -> String {
    format!(
        "sandbox {profile}/{}@{}",
        spec.key.task,
        spec.key.session.as_deref().unwrap_or_default(),
    )
}

/// The plan (JSON) must remove exactly `expected`, each as an orphan.
fn check_plan(json: &str, expected: &BTreeSet<String>) -> anyhow::Result<()> {
    let plan: serde_json::Value =
        serde_json::from_str(json).context("reading the plan hermes printed as JSON")?;
    let ops = plan["operations"]
        .as_array()
        .context("the plan has no operations")?;
    let mut removed = BTreeSet::new();
    for op in ops {
        let target = op["target"].as_str().unwrap_or_default();
        let action = op["action"].as_str().unwrap_or_default();
        let cause = op["cause"].as_str().unwrap_or_default();
        anyhow::ensure!(
            action == "remove" && cause.starts_with("orphan:"),
            "unexpected operation in the plan: {action} {target} ({cause})"
        );
        removed.insert(target.to_string());
    }
    anyhow::ensure!(
        &removed == expected,
        "the plan removes {} sandboxes, {} of them not the expected orphans; {} expected orphans not planned",
        removed.len(),
        removed.difference(expected).count(),
        expected.difference(&removed).count()
    );
    Ok(())
}

/// After `hermes reconcile`: it exited 0, planned exactly its orphans, and
/// they are gone; the CLI's containers are all still there (and still
/// exited) unless the CLI already ran.
async fn check_hermes(
    bench: &Bench,
    ran: &Ran,
    expected: &BTreeSet<String>,
    h_ids: &BTreeSet<String>,
    c_ids: &[String],
    cli_pending: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        ran.code == Some(0),
        "`hermes reconcile` exited with {:?}: {}",
        ran.code,
        ran.stderr.trim()
    );
    // `--output json` prints the plan it applies, then nothing else.
    check_plan(&ran.stdout, expected)?;
    let left = fleet::summaries(&bench.engine, &bench.prefix).await?;
    let h_left: Vec<String> = left
        .iter()
        .filter(|s| s.id.as_ref().is_some_and(|id| h_ids.contains(id)))
        .map(|s| {
            format!(
                "{} ({})",
                s.names
                    .iter()
                    .flatten()
                    .next()
                    .map_or("?", |n| n.trim_start_matches('/')),
                s.status.as_deref().unwrap_or("?")
            )
        })
        .collect();
    anyhow::ensure!(
        h_left.is_empty(),
        "{} of the orphans are still there after `hermes reconcile`: {}\nits stderr: {}",
        h_left.len(),
        h_left.join(", "),
        ran.stderr.trim()
    );
    if cli_pending {
        let exited: BTreeSet<&str> = left
            .iter()
            .filter(|s| s.state == Some(ContainerSummaryStateEnum::EXITED))
            .filter_map(|s| s.id.as_deref())
            .collect();
        let untouched = c_ids
            .iter()
            .filter(|id| exited.contains(id.as_str()))
            .count();
        anyhow::ensure!(
            untouched == c_ids.len() && left.len() == c_ids.len(),
            "hermes touched containers it must not: {untouched} of the other profile's {} left exited, {} of the run's containers left",
            c_ids.len(),
            left.len()
        );
    }
    Ok(())
}

/// The engine's own removal cost: `sample` exited containers removed
/// through the library ([`Engine::remove`]) at each concurrency level.
async fn engine_profile(bench: &Bench, args: &Args, ids: Vec<String>) -> anyhow::Result<()> {
    let sample = args.engine_sample as usize;
    println!();
    println!(
        "  the engine's removal of exited containers through the library, {sample} at each concurrency:"
    );
    println!(
        "    {:>11} {:>12} {:>15} {:>16}",
        "concurrency", "total", "per container", "500 would take"
    );
    for (level, chunk) in args.levels.iter().zip(ids.chunks(sample)) {
        let t = Instant::now();
        let results: Vec<_> = futures_util::stream::iter(chunk)
            .map(|id| bench.engine.remove(id))
            .buffer_unordered(*level)
            .collect()
            .await;
        let took = t.elapsed();
        for result in results {
            result.context("removing through the library")?;
        }
        let each = took / chunk.len().max(1) as u32;
        println!(
            "    {level:>11} {:>12} {:>15} {:>16}",
            Ms(took),
            Ms(each),
            Ms(each * 500),
        );
    }
    println!();
    Ok(())
}

/// Where hermes's time goes before it removes anything, measured through
/// the library on the engine state the measured run will see: the list,
/// the observation (the list and an inspect of each container that ever
/// started), and the plan.
async fn observe_profile(bench: &Bench, profile: &str) -> anyhow::Result<()> {
    const RUNS: usize = 3;
    let home = bench.home.root().join("profiles").join(profile);
    let desired = Desired::build(bench.config.clone(), profile, &home, &HostEnv::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut list = Samples::default();
    let mut observe = Samples::default();
    let mut plan = Samples::default();
    let mut listed = 0;
    let mut inspected = 0;
    let mut removals = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        listed = bench
            .engine
            .docker()
            .list_containers(Some(
                bollard::query_parameters::ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&std::collections::HashMap::from([(
                        "label",
                        vec!["hermes-agent=1".to_string()],
                    )]))
                    .build(),
            ))
            .await
            .context("listing the labelled containers")?
            .len();
        list.push(t.elapsed());

        let t = Instant::now();
        let containers = bench.engine.observe_states().await?;
        observe.push(t.elapsed());
        inspected = containers
            .iter()
            .filter(|c| c.state != ContainerState::Created)
            .count();

        let observed = hermes_model::observed::Observed {
            containers,
            ..Default::default()
        };
        let t = Instant::now();
        let planned = hermes_reconcilers::plan_all_with(
            &desired,
            &observed,
            SystemTime::now(),
            hermes_reconcilers::host_only,
        );
        plan.push(t.elapsed());
        removals = planned.summary().remove;
    }
    println!("  hermes's steps before the removals, through the library (p50 of {RUNS}):");
    println!(
        "{}",
        row(&format!("list ({listed} labelled containers)"), &list)
    );
    println!(
        "{}",
        row(
            &format!("observe: list + inspects ({inspected} inspected)"),
            &observe
        )
    );
    println!("{}", row(&format!("plan ({removals} removals)"), &plan));
    Ok(())
}
