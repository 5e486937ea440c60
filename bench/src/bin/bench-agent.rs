//! `bench-agent`: a warm command in one sandbox, through Hermes Agent's own
//! Docker backend (`DockerEnvironment.execute` of the real `hermes-agent`
//! package, in one agent process) against `hermes exec` (a whole process
//! each, reattaching every time), side by side in one run; and the agent's
//! reattach (a new agent process's `DockerEnvironment` finding the running
//! sandbox) against hermes's (`hermes exec -- true` of a new process).
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-agent && target/release/bench-agent
//! ```
//!
//! It needs the Docker engine, the test image and the agent's venv, both
//! made by `bash scripts/test` (`target/hermes-agent-venv-0.19.0`, or
//! `$HERMES_AGENT_VENV`). Exit code: 0 when hermes's warm p50 is at most the
//! agent's, 2 when it is not, 1 on error.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use hermes_bench::stats::{Samples, header, ratio, row, verdict};

#[derive(Debug, Parser)]
#[command(
    name = "bench-agent",
    about = "a warm command through Hermes Agent's DockerEnvironment against hermes exec"
)]
struct Args {
    /// Measured runs of each side.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=500))]
    runs: u32,
    /// Agent processes started to measure the reattach.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    reattaches: u32,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<bool> {
    let hermes = match &args.hermes {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("hermes"),
    };
    let venv = std::env::var_os("HERMES_AGENT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/hermes-agent-venv-0.19.0"));
    let python = venv.join("bin/python");
    if !python.is_file() {
        bail!(
            "{}: no agent venv; run `bash scripts/test` first",
            python.display()
        );
    }
    let driver =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/agent-docker-env.py");
    let image = std::env::var("HERMES_TEST_IMAGE")
        .unwrap_or_else(|_| "hermes-test-base:bookworm-1".to_string());
    let profile = format!("benchagent{}", std::process::id());
    let root = tempfile::tempdir()?;
    let home = root.path().join("profiles").join(&profile);
    std::fs::create_dir_all(&home)?;
    std::fs::write(
        home.join("config.yaml"),
        // No disk image: the run's home is a temporary directory, removed
        // at the end, and an image mounted in it would outlive it.
        format!("terminal:\n  backend: docker\n  docker_image: {image}\n  container_disk: 0\n"),
    )?;
    let _cleanup = hermes_tests::docker_cli::ProfileCleanup(profile.clone());
    let hermes_cmd = |extra: &[&str]| {
        let mut c = Command::new(&hermes);
        c.arg("--home")
            .arg(&home)
            .args(extra)
            .env_remove("HERMES_PROFILE");
        c
    };
    let made = hermes_cmd(&["reconcile"]).output()?;
    if !made.status.success() {
        bail!(
            "hermes reconcile: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    // The agent: one process, the warm command N times.
    let agent = |times: u32| -> anyhow::Result<serde_json::Value> {
        let out = Command::new(&python)
            .arg(&driver)
            .args([
                "default",
                &image,
                "--execute-times",
                &times.to_string(),
                "true",
            ])
            .env("HERMES_HOME", &home)
            .output()?;
        if !out.status.success() {
            bail!("the agent: {}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("the agent's driver printed no JSON")
    };
    let warm = agent(args.runs)?;
    let mut agent_warm = Samples::with_capacity(args.runs as usize);
    for ms in warm["samples_ms"].as_array().into_iter().flatten() {
        agent_warm.push(Duration::from_secs_f64(ms.as_f64().unwrap_or(0.0) / 1000.0));
    }
    let mut hermes_warm = Samples::with_capacity(args.runs as usize);
    for _ in 0..args.runs {
        let started = Instant::now();
        let out = hermes_cmd(&["exec", "--", "true"]).output()?;
        hermes_warm.push(started.elapsed());
        if !out.status.success() {
            bail!("hermes exec: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let mut agent_attach = Samples::with_capacity(args.reattaches as usize);
    for _ in 0..args.reattaches {
        let v = agent(0)?;
        let ms = v["attach_ms"].as_f64().unwrap_or(0.0);
        agent_attach.push(Duration::from_secs_f64(ms / 1000.0));
    }
    println!("{}", header());
    println!(
        "{}",
        row("agent DockerEnvironment.execute (warm)", &agent_warm)
    );
    println!(
        "{}",
        row("hermes exec -- true (a process each)", &hermes_warm)
    );
    println!("{}", row("agent reattach (new process)", &agent_attach));
    let warm_ratio = ratio(hermes_warm.p50(), agent_warm.p50());
    let attach_ratio = ratio(hermes_warm.p50(), agent_attach.p50());
    let met = warm_ratio <= 1.0;
    println!(
        "hermes exec / agent execute (p50): {warm_ratio:.2} (target ≤ 1.0) {}",
        verdict(met)
    );
    println!("hermes exec (reattach included) / agent reattach (p50): {attach_ratio:.2}");
    Ok(met)
}
