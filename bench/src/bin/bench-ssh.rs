//! `bench-ssh`: hermes's SSH backend against OpenSSH, side by side in one
//! run, on a real sshd (the tests' container of `hermes-test-sshd`, on an
//! internal Docker network of the run's own):
//!
//! 1. warm `hermes exec -- true` (the release binary; its connection holder
//!    already up) against `ssh host true` without multiplexing (a new
//!    connection, key exchange and login each time); target: p50 ratio
//!    ≤ 0.2;
//! 2. the same against `ssh host true` through an OpenSSH ControlMaster
//!    already open (`ControlPersist`); target: p50 ratio ≤ 1.0.
//!
//! The three run interleaved after a warm-up. Run it from the workspace
//! root with both binaries built in release:
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-ssh && target/release/bench-ssh
//! ```
//!
//! It needs the Docker engine, the sshd image (`bash scripts/test` builds
//! it) and OpenSSH's client. Exit code: 0 when both targets are met, 2
//! when one is missed, 1 on error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use hermes_bench::run::Cmd;
use hermes_bench::stats::{Samples, header, ratio, row, verdict};
use hermes_tests::sshd::{Sshd, USER};

/// hermes's p50 over a new OpenSSH connection's.
const PLAIN_TARGET: f64 = 0.2;
/// hermes's p50 over OpenSSH's through an open ControlMaster.
const MASTER_TARGET: f64 = 1.0;

#[derive(Debug, Parser)]
#[command(
    name = "bench-ssh",
    about = "hermes exec over SSH against OpenSSH, with and without a ControlMaster"
)]
struct Args {
    /// Measured runs of each side (interleaved).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Unmeasured runs of each side first.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    warmup: u32,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(bench(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn bench(args: &Args) -> anyhow::Result<bool> {
    let hermes = match &args.hermes {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory above this binary")?
            .join("hermes"),
    };
    anyhow::ensure!(
        hermes.exists(),
        "{} is missing: cargo build --release --bin hermes",
        hermes.display()
    );
    eprintln!("starting sshd in a container");
    let sshd = Sshd::start();
    let home = tempfile::tempdir()?;
    std::fs::write(home.path().join("config.yaml"), sshd.config(""))?;
    let known_hosts = home.path().join("openssh_known_hosts");
    let control = home.path().join("cm.sock");
    let dest = format!("{USER}@{}", sshd.host);
    let openssh = |extra: &[&str]| {
        Cmd::new("ssh")
            .args(["-F", "/dev/null", "-i"])
            .arg(sshd.key_path())
            .args([
                "-p",
                &sshd.port.to_string(),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=accept-new",
                "-o",
            ])
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .args(extra)
    };
    let hermes_exec = Cmd::new(&hermes)
        .arg("--home")
        .arg(home.path())
        .args(["exec", "--", "true"]);
    let plain = openssh(&["-o", "ControlMaster=no", "-o", "ControlPath=none"])
        .arg(&dest)
        .arg("true");
    let control_path = format!("ControlPath={}", control.display());
    let muxed = openssh(&["-o", "ControlMaster=no", "-o", &control_path])
        .arg(&dest)
        .arg("true");

    // The master: opened once, persists, closed at the end. It goes to the
    // background holding no pipe of ours.
    let status = tokio::process::Command::new("ssh")
        .args(["-F", "/dev/null", "-i"])
        .arg(sshd.key_path())
        .args(["-p", &sshd.port.to_string(), "-o", "BatchMode=yes"])
        .args(["-o", "StrictHostKeyChecking=accept-new", "-o"])
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args(["-o", "ControlMaster=yes", "-o", &control_path])
        .args(["-o", "ControlPersist=300", "-f", "-N", &dest])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .context("opening the OpenSSH ControlMaster")?;
    anyhow::ensure!(
        status.success(),
        "the OpenSSH ControlMaster did not open: {status}"
    );

    let result = measure(args, &hermes_exec, &plain, &muxed).await;
    let _ = openssh(&["-o", &control_path, "-O", "exit"])
        .arg(&dest)
        .output()
        .await;
    drop(sshd);
    let (h, p, m) = result?;

    println!(
        "exec of `true` over SSH, {} runs each, interleaved",
        h.len()
    );
    println!("{}", header());
    println!("{}", row("hermes exec -- true (warm holder)", &h));
    println!("{}", row("ssh host true (new connection)", &p));
    println!("{}", row("ssh host true (ControlMaster open)", &m));
    let vs_plain = ratio(h.p50(), p.p50());
    let vs_master = ratio(h.p50(), m.p50());
    let plain_met = vs_plain <= PLAIN_TARGET;
    let master_met = vs_master <= MASTER_TARGET;
    println!();
    println!("Targets:");
    println!(
        "  hermes / ssh without multiplexing (p50)      {vs_plain:>6.3}  (≤ {PLAIN_TARGET})   {}",
        verdict(plain_met)
    );
    println!(
        "  hermes / ssh with a ControlMaster (p50)      {vs_master:>6.3}  (≤ {MASTER_TARGET})   {}",
        verdict(master_met)
    );
    Ok(plain_met && master_met)
}

/// Warm-up, then the three commands in turn, `runs` times.
async fn measure(
    args: &Args,
    hermes: &Cmd,
    plain: &Cmd,
    muxed: &Cmd,
) -> anyhow::Result<(Samples, Samples, Samples)> {
    for _ in 0..args.warmup.max(1) {
        for cmd in [hermes, plain, muxed] {
            cmd.time().await?;
        }
    }
    let runs = args.runs as usize;
    let (mut h, mut p, mut m) = (
        Samples::with_capacity(runs),
        Samples::with_capacity(runs),
        Samples::with_capacity(runs),
    );
    for _ in 0..runs {
        h.push(hermes.time().await?);
        p.push(plain.time().await?);
        m.push(muxed.time().await?);
        // Let the server settle between rounds.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((h, p, m))
}
