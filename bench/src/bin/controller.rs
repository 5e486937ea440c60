//! `bench-controller`: what `hermes controller` costs. One run measures
//! both figures, prints each beside its baseline or target, and checks
//! the targets:
//!
//! 1. latency: from the rename of an edited config.yaml
//!    (`terminal.container_memory` changed, written to a temporary file in
//!    the same directory and renamed over it) to the recreated sandbox
//!    running, with `hermes controller` running, against the floor: the
//!    same change applied by `hermes reconcile` started right after the
//!    rename. Both sides are timed the same way: the engine is polled
//!    through the library every few milliseconds (an inspect of the
//!    sandbox by name) until the sandbox carries the new spec hash and
//!    runs. Rounds interleave the two sides, the order alternating; the
//!    controller is started afresh for each of its rounds (and stopped for
//!    the floor's, so that nothing else converges the change). Target: the
//!    overhead, controller p50 − floor p50, < 100 ms.
//! 2. idle cost: a controller with nothing to do, over 60 s: its resident
//!    memory (VmRSS of /proc/<pid>/status, sampled every second, the
//!    maximum) < 25 MiB, and its CPU time (utime + stime of
//!    /proc/<pid>/stat over the window) < 1 % of one core.
//! 3. with `--restart-engine` only (it stops and starts the local
//!    `dockerd`, with the command line it runs with, as root): recovery,
//!    from the engine answering again after a restart to the sandbox (which
//!    the engine stopped) running again, with a controller running through
//!    the restart, against the floor: `hermes reconcile` started the moment
//!    the engine answers. Target: the controller's p50 < 2 s.
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-controller && target/release/bench-controller
//! ```
//!
//! It needs the engine and the test image (`bash scripts/test` provisions
//! both). It works in a temporary `HERMES_HOME` with a profile of its own,
//! its sandbox named `hermes-hbench-<run>-…` and removed at the end, also
//! after an error or Ctrl-C (which also stops the controller). Exit code: 0
//! when every target is met, 2 when one is missed, 1 on error.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use hermes_backends::docker::Engine;
use hermes_bench::harness::{self, Check};
use hermes_bench::run::Cmd;
use hermes_bench::stats::{Ms, Samples, header, row};
use hermes_model::desired::{DEFAULT_TASK, Desired, HostEnv};
use hermes_model::observed::ContainerState;
use hermes_model::sandbox::SandboxKey;

/// The latency target: controller p50 − floor p50.
const OVERHEAD_TARGET: Duration = Duration::from_millis(100);
/// The recovery target: engine answering → sandbox running, p50.
const RECOVERY_TARGET: Duration = Duration::from_secs(2);
/// How long dockerd may take to stop or to answer again.
const ENGINE_WAIT: Duration = Duration::from_secs(60);
/// The idle targets.
const RSS_TARGET_MIB: f64 = 25.0;
const CPU_TARGET_PERCENT: f64 = 1.0;
/// How long a change may take to show before the round fails.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a controller may take to make its first pass, or to stop.
const CONTROLLER_WAIT: Duration = Duration::from_secs(30);
/// How long a started controller is left alone after its first pass, so
/// that the events of its start have settled before a round begins.
const SETTLE: Duration = Duration::from_millis(500);

#[derive(Debug, Parser)]
#[command(
    name = "bench-controller",
    about = "hermes controller: config-change latency against `hermes reconcile` by hand, and its idle cost"
)]
struct Args {
    /// Measured changes of each side (interleaved).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Unmeasured changes of each side first.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=10))]
    warmup: u32,
    /// How often the engine is polled for the recreated sandbox, in ms.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    poll_ms: u64,
    /// The idle window, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=3600))]
    idle_seconds: u64,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
    /// Only these parts (default: latency and idle).
    #[arg(long, value_enum)]
    only: Vec<Part>,
    /// Also measure recovery from an engine restart: stops and starts the
    /// local dockerd (root only) `--restart-rounds` times for each side.
    #[arg(long)]
    restart_engine: bool,
    /// Engine restarts of each side, with --restart-engine.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    restart_rounds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Latency,
    Idle,
    Restart,
}

impl Args {
    fn wants(&self, part: Part) -> bool {
        match part {
            Part::Restart => self.restart_engine || self.only.contains(&part),
            _ => self.only.is_empty() || self.only.contains(&part),
        }
    }
}

#[derive(Debug)]
struct Bench {
    engine: Engine,
    hermes: PathBuf,
    home: harness::TempHome,
    /// The controller's logs, outside the watched directory.
    logs: tempfile::TempDir,
    image: String,
    profile: String,
    prefix: String,
    /// Changes made so far: each gives the next `container_memory`.
    changes: std::cell::Cell<u32>,
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
        SandboxKey::persistent(&self.profile, DEFAULT_TASK)
    }

    fn config_text(&self, memory_mb: u32) -> String {
        format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n  container_memory: {memory_mb}\n",
            self.image
        )
    }

    /// The spec hash the sandbox has under this config text.
    fn hash_of(&self, text: &str) -> anyhow::Result<String> {
        let config = hermes_model::config::load(text)
            .map_err(|e| anyhow::anyhow!("{}", e.render("config.yaml")))?
            .config;
        let desired = Desired::build(config, &self.profile, self.home.path(), &HostEnv::default())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(desired.sandbox_for_task(DEFAULT_TASK).hash().to_string())
    }

    /// Writes the next config to a temporary file beside config.yaml and
    /// returns it with its spec hash; [`Bench::rename`] puts it in place.
    fn prepare_change(&self) -> anyhow::Result<(PathBuf, String)> {
        let n = self.changes.get() + 1;
        self.changes.set(n);
        let text = self.config_text(2048 + n);
        let tmp = self.home.path().join(".config.yaml.bench-tmp");
        std::fs::write(&tmp, &text).context("writing the edited config")?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .context("syncing the edited config")?;
        Ok((tmp, self.hash_of(&text)?))
    }

    fn rename(&self, tmp: &Path) -> anyhow::Result<Instant> {
        let at = Instant::now();
        std::fs::rename(tmp, self.home.path().join("config.yaml"))
            .context("renaming the edited config over config.yaml")?;
        Ok(at)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    harness::main(|| bench(&args))
}

async fn bench(args: &Args) -> anyhow::Result<Vec<Check>> {
    let hermes = harness::hermes_binary(args.hermes.as_deref())?;
    let engine = harness::connect("hermes controller benchmark").await?;
    let image = harness::test_image(&engine).await?;
    println!("hermes: {}; image: {image}", hermes.display());
    let profile = harness::unique_profile();
    let prefix = format!("hermes-{profile}-");
    let text = format!(
        "terminal:\n  backend: docker\n  docker_image: {image}\n  container_memory: 2048\n"
    );
    let (home, _) = harness::temp_home(&profile, &text)?;
    let logs = tempfile::Builder::new()
        .prefix("hermes-bench-logs-")
        .tempdir()
        .context("creating a directory for the controller's logs")?;
    let bench = Bench {
        engine,
        hermes,
        home,
        logs,
        image,
        profile,
        prefix,
        changes: std::cell::Cell::new(0),
    };
    harness::with_cleanup(&bench.engine, &bench.prefix, 4, run(&bench, args)).await
}

async fn run(bench: &Bench, args: &Args) -> anyhow::Result<Vec<Check>> {
    // The sandbox, made the way a user makes it.
    let made = bench.hermes(["reconcile"]).output().await?;
    anyhow::ensure!(
        made.code == Some(0),
        "`hermes reconcile` exited with {:?}:\n{}{}",
        made.code,
        made.stdout,
        made.stderr
    );
    let mut checks = Vec::new();
    if args.wants(Part::Latency) {
        checks.push(latency(bench, args).await?);
    }
    if args.wants(Part::Idle) {
        checks.extend(idle(bench, args).await?);
    }
    if args.wants(Part::Restart) {
        checks.push(recovery(bench, args).await?);
    }
    Ok(checks)
}

/// A running `hermes controller`, killed when dropped.
struct Controller {
    child: tokio::process::Child,
    pid: u32,
}

impl Controller {
    /// Starts the controller and waits until it has made its first pass
    /// and settled.
    async fn start(bench: &Bench, log_name: &str) -> anyhow::Result<Controller> {
        let status = bench.home.path().join("run").join("controller.json");
        let _ = std::fs::remove_file(&status);
        let log = std::fs::File::create(bench.logs.path().join(log_name))
            .context("creating the controller's log")?;
        let err = log.try_clone().context("sharing the controller's log")?;
        let child = tokio::process::Command::new(&bench.hermes)
            .arg("--home")
            .arg(bench.home.path())
            .arg("--profile")
            .arg(&bench.profile)
            .arg("controller")
            .env_remove("HERMES_HOME")
            .env_remove("HERMES_PROFILE")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} controller", bench.hermes.display()))?;
        let pid = child.id().context("the controller exited at once")?;
        let mut controller = Controller { child, pid };
        let deadline = Instant::now() + CONTROLLER_WAIT;
        loop {
            if let Some(status) = controller.child.try_wait()? {
                anyhow::bail!(
                    "the controller exited with {status} before its first pass; see {}",
                    bench.logs.path().join(log_name).display()
                );
            }
            if passes(&status).is_some_and(|n| n >= 1) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the controller made no pass in {}s",
                CONTROLLER_WAIT.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(SETTLE).await;
        Ok(controller)
    }

    /// SIGTERM, and the wait for its exit (0).
    async fn stop(mut self) -> anyhow::Result<()> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = i32::try_from(self.pid).context("the controller's pid")?;
        kill(Pid::from_raw(pid), Signal::SIGTERM).context("signalling the controller")?;
        match tokio::time::timeout(CONTROLLER_WAIT, self.child.wait()).await {
            Ok(status) => {
                let status = status.context("waiting for the controller")?;
                anyhow::ensure!(
                    status.success(),
                    "the controller exited with {status} on SIGTERM"
                );
                Ok(())
            }
            Err(_) => {
                let _ = self.child.start_kill();
                anyhow::bail!(
                    "the controller did not stop within {}s of SIGTERM",
                    CONTROLLER_WAIT.as_secs()
                )
            }
        }
    }
}

/// The number of passes the controller's status file reports.
fn passes(status: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["passes"].as_u64()
}

/// Polls the engine until the sandbox runs with spec hash `hash`; returns
/// when it saw that.
async fn recreated(bench: &Bench, hash: &str, poll: Duration) -> anyhow::Result<Instant> {
    let key = bench.key();
    let deadline = Instant::now() + CHANGE_TIMEOUT;
    loop {
        if let Some(c) = bench.engine.find(&key).await? {
            if c.spec_hash() == Some(hash) && c.state == ContainerState::Running {
                return Ok(Instant::now());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sandbox was not recreated with spec hash {hash} within {}s",
            CHANGE_TIMEOUT.as_secs()
        );
        tokio::time::sleep(poll).await;
    }
}

/// One change with the controller running: rename, then wait for the
/// recreated sandbox.
async fn with_controller(bench: &Bench, args: &Args, n: usize) -> anyhow::Result<Duration> {
    let controller = Controller::start(bench, &format!("controller-{n}.log")).await?;
    let (tmp, hash) = bench.prepare_change()?;
    let renamed = bench.rename(&tmp)?;
    let seen = recreated(bench, &hash, Duration::from_millis(args.poll_ms)).await?;
    controller.stop().await?;
    Ok(seen - renamed)
}

/// One change applied by `hermes reconcile` started right after the
/// rename; returns the latency and how long the reconcile ran.
async fn by_hand(bench: &Bench, args: &Args) -> anyhow::Result<(Duration, Duration)> {
    let (tmp, hash) = bench.prepare_change()?;
    let reconcile = bench.hermes(["reconcile"]);
    let renamed = bench.rename(&tmp)?;
    let (ran, seen) = tokio::join!(
        reconcile.output(),
        recreated(bench, &hash, Duration::from_millis(args.poll_ms))
    );
    let ran = ran?;
    let seen = seen?;
    anyhow::ensure!(
        ran.code == Some(0),
        "`hermes reconcile` exited with {:?}:\n{}{}",
        ran.code,
        ran.stdout,
        ran.stderr
    );
    Ok((seen - renamed, ran.elapsed))
}

async fn latency(bench: &Bench, args: &Args) -> anyhow::Result<Check> {
    println!();
    println!(
        "1. config change (container_memory, renamed over config.yaml) to the recreated sandbox running; {} rounds of each side, interleaved, after {} warm-up; polled every {} ms",
        args.rounds, args.warmup, args.poll_ms
    );
    let total = (args.warmup + args.rounds) as usize;
    let mut controller = Samples::default();
    let mut floor = Samples::default();
    let mut reconcile_runs = Samples::default();
    let mut differences = Vec::new();
    for round in 0..total {
        let measured = round >= args.warmup as usize;
        let (c, (f, r)) = if round % 2 == 0 {
            let c = with_controller(bench, args, round).await?;
            (c, by_hand(bench, args).await?)
        } else {
            let f = by_hand(bench, args).await?;
            (with_controller(bench, args, round).await?, f)
        };
        eprintln!(
            "  round {}{}: controller {}, reconcile by hand {} (its run {})",
            round + 1,
            if measured { "" } else { " (warm-up)" },
            Ms(c),
            Ms(f),
            Ms(r)
        );
        if measured {
            controller.push(c);
            floor.push(f);
            reconcile_runs.push(r);
            differences.push(c.as_secs_f64() - f.as_secs_f64());
        }
    }
    let overhead = controller.p50().saturating_sub(floor.p50());
    differences.sort_by(f64::total_cmp);
    let paired = differences
        .get(differences.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default();
    println!("{}", header());
    println!(
        "{}",
        row("hermes controller: rename → running", &controller)
    );
    println!(
        "{}",
        row("floor: hermes reconcile by hand: rename → running", &floor)
    );
    println!(
        "{}",
        row(
            "  (the reconcile's whole run, spawn to exit)",
            &reconcile_runs
        )
    );
    println!(
        "  overhead (controller p50 − floor p50): {} (target < {}); median of the paired differences {:.2} ms",
        Ms(overhead),
        Ms(OVERHEAD_TARGET),
        paired * 1000.0
    );
    Ok(Check::new(
        "config change → recreated: controller − reconcile, p50",
        format!("{} (< {})", Ms(overhead), Ms(OVERHEAD_TARGET)),
        overhead < OVERHEAD_TARGET,
    ))
}

/// The pid and command line of the local dockerd.
fn dockerd() -> anyhow::Result<(i32, Vec<String>)> {
    let out = std::process::Command::new("pidof")
        .arg("dockerd")
        .output()
        .context("running pidof dockerd")?;
    let pid: i32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .context("no local dockerd to restart (--restart-engine needs one, and root)")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("reading dockerd's command line (/proc/{pid}/cmdline)"))?;
    let args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Ok((pid, args))
}

/// Stops dockerd (SIGTERM, which stops the sandboxes with it), starts it
/// again with the same command line, and returns when it answers.
async fn restart_engine(bench: &Bench) -> anyhow::Result<Instant> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let (pid, args) = dockerd()?;
    kill(Pid::from_raw(pid), Signal::SIGTERM).context("signalling dockerd (root only)")?;
    let deadline = Instant::now() + ENGINE_WAIT;
    while Path::new(&format!("/proc/{pid}")).exists() {
        anyhow::ensure!(Instant::now() < deadline, "dockerd did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(bench.logs.path().join("dockerd.log"))
        .context("opening dockerd's log")?;
    // `setsid --fork`: the engine outlives this benchmark.
    let forked = std::process::Command::new("setsid")
        .arg("--fork")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("sharing dockerd's log")?)
        .stderr(log)
        .status()
        .context("starting dockerd again")?;
    anyhow::ensure!(forked.success(), "setsid --fork {args:?}: {forked}");
    loop {
        if bench.engine.docker().ping().await.is_ok() {
            return Ok(Instant::now());
        }
        anyhow::ensure!(Instant::now() < deadline, "dockerd did not answer again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls until the sandbox runs again.
async fn running(bench: &Bench, poll: Duration) -> anyhow::Result<Instant> {
    let key = bench.key();
    let deadline = Instant::now() + CHANGE_TIMEOUT;
    loop {
        if let Ok(Some(c)) = bench.engine.find(&key).await
            && c.state == ContainerState::Running
        {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sandbox did not run again within {}s",
            CHANGE_TIMEOUT.as_secs()
        );
        tokio::time::sleep(poll).await;
    }
}

async fn recovery(bench: &Bench, args: &Args) -> anyhow::Result<Check> {
    println!();
    println!(
        "3. dockerd restarted (SIGTERM, started again): from the engine answering to the sandbox running again; {} rounds of each side, interleaved",
        args.restart_rounds
    );
    let poll = Duration::from_millis(args.poll_ms);
    let mut controller = Samples::default();
    let mut floor = Samples::default();
    for round in 0..args.restart_rounds {
        let running_controller = Controller::start(bench, &format!("restart-{round}.log")).await?;
        let answered = restart_engine(bench).await?;
        let c = running(bench, poll).await? - answered;
        running_controller.stop().await?;

        let answered = restart_engine(bench).await?;
        let ran = bench.hermes(["reconcile"]).output().await?;
        let f = running(bench, poll).await? - answered;
        anyhow::ensure!(
            ran.code == Some(0),
            "`hermes reconcile` after the restart exited with {:?}:\n{}{}",
            ran.code,
            ran.stdout,
            ran.stderr
        );
        eprintln!(
            "  round {}: controller {}, reconcile by hand {}",
            round + 1,
            Ms(c),
            Ms(f)
        );
        controller.push(c);
        floor.push(f);
    }
    println!("{}", header());
    println!(
        "{}",
        row("hermes controller: engine answers → running", &controller)
    );
    println!(
        "{}",
        row("floor: hermes reconcile at once: → running", &floor)
    );
    let p50 = controller.p50();
    println!(
        "  controller p50 {} (target < {}), {:.2}× the floor's",
        Ms(p50),
        Ms(RECOVERY_TARGET),
        p50.as_secs_f64() / floor.p50().as_secs_f64().max(1e-9)
    );
    Ok(Check::new(
        "engine restart → sandbox running again, controller p50",
        format!("{} (< {})", Ms(p50), Ms(RECOVERY_TARGET)),
        p50 < RECOVERY_TARGET,
    ))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name is in parentheses and may hold spaces: the fields
    // that follow it start with the state (field 3); utime and stime are
    // fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("no command name in /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("field {} of /proc/{pid}/stat", i + 3))
    };
    Ok(field(11)? + field(12)?)
}

/// A `kB` line of /proc/<pid>/status (`VmRSS`, `VmHWM`), in KiB.
fn status_kib(pid: u32, name: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix(':')?;
            value.trim().strip_suffix("kB")?.trim().parse().ok()
        })
        .with_context(|| format!("no {name} in /proc/{pid}/status"))
}

fn clock_ticks_per_second() -> anyhow::Result<u64> {
    use nix::unistd::{SysconfVar, sysconf};
    let ticks = sysconf(SysconfVar::CLK_TCK)
        .context("sysconf(CLK_TCK)")?
        .context("sysconf(CLK_TCK) has no value")?;
    u64::try_from(ticks).context("sysconf(CLK_TCK) is negative")
}

async fn idle(bench: &Bench, args: &Args) -> anyhow::Result<Vec<Check>> {
    println!();
    println!(
        "2. an idle controller over {} s (its sandbox converged; resync every 30 s)",
        args.idle_seconds
    );
    let hz = clock_ticks_per_second()?;
    let controller = Controller::start(bench, "controller-idle.log").await?;
    let pid = controller.pid;
    let status = bench.home.path().join("run").join("controller.json");
    let passes_before = passes(&status).unwrap_or(0);
    let window = Duration::from_secs(args.idle_seconds);
    let started = Instant::now();
    let ticks_before = cpu_ticks(pid)?;
    let mut rss_max = status_kib(pid, "VmRSS")?;
    let mut rss_samples = 1u32;
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        rss_max = rss_max.max(status_kib(pid, "VmRSS")?);
        rss_samples += 1;
    }
    let ticks_after = cpu_ticks(pid)?;
    let wall = started.elapsed();
    let hwm = status_kib(pid, "VmHWM")?;
    let passes_after = passes(&status).unwrap_or(0);
    controller.stop().await?;

    let cpu_seconds = (ticks_after - ticks_before) as f64 / hz as f64;
    let cpu_percent = cpu_seconds / wall.as_secs_f64() * 100.0;
    let rss_mib = rss_max as f64 / 1024.0;
    println!(
        "  RSS, max of {rss_samples} samples: {rss_mib:.1} MiB (target < {RSS_TARGET_MIB} MiB); peak over its life (VmHWM): {:.1} MiB",
        hwm as f64 / 1024.0
    );
    println!(
        "  CPU: {cpu_seconds:.2} s over {:.1} s = {cpu_percent:.3} % of one core (target < {CPU_TARGET_PERCENT} %); {} passes in the window",
        wall.as_secs_f64(),
        passes_after.saturating_sub(passes_before)
    );
    Ok(vec![
        Check::new(
            format!("idle controller, {} s: RSS (max)", args.idle_seconds),
            format!("{rss_mib:.1} MiB (< {RSS_TARGET_MIB} MiB)"),
            rss_mib < RSS_TARGET_MIB,
        ),
        Check::new(
            format!("idle controller, {} s: CPU", args.idle_seconds),
            format!("{cpu_percent:.3} % (< {CPU_TARGET_PERCENT} %)"),
            cpu_percent < CPU_TARGET_PERCENT,
        ),
    ])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn proc_of_this_process_reads() {
        let pid = std::process::id();
        assert!(cpu_ticks(pid).is_ok());
        assert!(status_kib(pid, "VmRSS").unwrap() > 0);
        assert!(status_kib(pid, "VmHWM").unwrap() > 0);
        assert!(status_kib(pid, "NoSuchLine").is_err());
        assert!(clock_ticks_per_second().unwrap() > 0);
    }
}
