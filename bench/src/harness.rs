//! What every benchmark binary shares: the checks of what it needs (the
//! hermes binary, the engine, the test image, the Docker CLI), a temporary
//! `HERMES_HOME`, a profile name unique to the run, the removal of
//! everything the run made (also after an error or Ctrl-C), and the table
//! of targets with the exit code (0 all met, 2 one missed, 1 error).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hermes_backends::docker::{Engine, is_not_found};

use crate::fleet;
use crate::run::Cmd;
use crate::stats::verdict;

/// How long removing everything at the end may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(600);

/// One target, checked.
#[derive(Debug)]
pub struct Check {
    pub name: String,
    pub figure: String,
    pub met: bool,
}

impl Check {
    pub fn new(name: impl Into<String>, figure: impl Into<String>, met: bool) -> Check {
        Check {
            name: name.into(),
            figure: figure.into(),
            met,
        }
    }
}

/// Runs `bench` on a single-threaded runtime and maps its outcome to the
/// exit code: 0 when every check is met, 2 when one is missed, 1 on error.
pub fn main<F, Fut>(bench: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<Check>>>,
{
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
    match runtime.block_on(bench()) {
        Ok(checks) => {
            println!();
            println!("Targets:");
            for c in &checks {
                println!("  {:<56} {:<34} {}", c.name, c.figure, verdict(c.met));
            }
            if checks.iter().all(|c| c.met) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Ctrl-C or SIGTERM.
pub async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "Ctrl-C";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        _ = term.recv() => "SIGTERM",
    }
}

/// The hermes binary: `path`, or `hermes` beside the running binary. Warns
/// when it does not look like a release build.
pub fn hermes_binary(path: Option<&Path>) -> anyhow::Result<PathBuf> {
    let hermes = match path {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .context("where is this binary?")?
            .with_file_name("hermes"),
    };
    anyhow::ensure!(
        hermes.is_file(),
        "{} is missing: build it with `cargo build --release --bin hermes` (or pass --hermes PATH)",
        hermes.display()
    );
    if !hermes.components().any(|c| c.as_os_str() == "release") {
        eprintln!(
            "warning: {} does not look like a release build; the figures would not mean much",
            hermes.display()
        );
    }
    Ok(hermes)
}

/// The engine, connected, with a line saying what it is and what the
/// machine is (printed under `title`). Says how to get an engine when none
/// answers.
pub async fn connect(title: &str) -> anyhow::Result<Engine> {
    let engine = Engine::connect().await.map_err(|e| {
        anyhow::anyhow!(
            "no Docker engine answers: {e}\n`bash scripts/test` installs docker.io, starts dockerd and builds the test image"
        )
    })?;
    let docker = engine.docker();
    let info = docker.info().await.context("docker info")?;
    let version = docker.version().await.context("docker version")?;
    println!(
        "{title}: engine {} (API {}), storage {}, {} CPUs, {}; load average {}",
        version.version.as_deref().unwrap_or("?"),
        version.api_version.as_deref().unwrap_or("?"),
        info.driver.as_deref().unwrap_or("?"),
        info.ncpu.unwrap_or(0),
        info.operating_system.as_deref().unwrap_or("?"),
        load_average(),
    );
    Ok(engine)
}

/// The first three fields of /proc/loadavg, or `?`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "?".to_string())
}

/// The test image, checked to be present.
pub async fn test_image(engine: &Engine) -> anyhow::Result<String> {
    let image = hermes_tests::test_image();
    match engine.docker().inspect_image(&image).await {
        Ok(_) => Ok(image),
        Err(e) if is_not_found(&e) => anyhow::bail!(
            "the test image {image} is missing: `bash scripts/test` builds it (or set {} to another image)",
            hermes_tests::TEST_IMAGE_ENV
        ),
        Err(e) => Err(anyhow::Error::new(e).context(format!("inspecting image {image}"))),
    }
}

/// Checks that the Docker CLI is there and reaches the engine.
pub async fn docker_cli() -> anyhow::Result<()> {
    let cli = Cmd::new("docker").args(["version", "--format", "{{.Server.APIVersion}}"]);
    match cli.output().await {
        Ok(ran) if ran.code == Some(0) => Ok(()),
        Ok(ran) => anyhow::bail!(
            "the Docker CLI cannot reach the engine: {}",
            ran.stderr.trim()
        ),
        Err(e) => anyhow::bail!(
            "the Docker CLI (`docker`) is needed for the baselines: {e:#}; `bash scripts/test` installs docker.io"
        ),
    }
}

/// A profile name of this run's own: `hbench-<pid><nanos>`. Every
/// container the run makes is named `hermes-<profile>-…`.
pub fn unique_profile() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("hbench-{:x}{:04x}", std::process::id(), nanos & 0xffff)
}

/// A temporary root of `HERMES_HOME`s, removed when dropped, and the home
/// of one profile in it: `<root>/profiles/NAME`, where `hermes --profile
/// NAME` points from the root, and whose containers are NAME's.
#[derive(Debug)]
pub struct TempHome {
    root: tempfile::TempDir,
    home: PathBuf,
}

impl TempHome {
    /// The profile's home.
    pub fn path(&self) -> &Path {
        &self.home
    }

    /// The root the profile's home is in.
    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

/// The home of `profile` under a new temporary root, holding
/// `config_text` as config.yaml, and the config it loads to.
pub fn temp_home(
    profile: &str,
    config_text: &str,
) -> anyhow::Result<(TempHome, hermes_model::config::Config)> {
    let root = tempfile::Builder::new()
        .prefix("hermes-bench-")
        .tempdir()
        .context("creating a temporary HERMES_HOME")?;
    let home = profile_home(root.path(), profile, config_text)?;
    let config = hermes_model::config::load(config_text)
        .map_err(|e| anyhow::anyhow!("{}", e.render("config.yaml")))?
        .config;
    Ok((TempHome { root, home }, config))
}

/// The home of `profile` under `root`, `<root>/profiles/NAME`, made if
/// need be, with `config_text` as its config.yaml.
pub fn profile_home(root: &Path, profile: &str, config_text: &str) -> anyhow::Result<PathBuf> {
    let home = root.join("profiles").join(profile);
    std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    std::fs::write(home.join("config.yaml"), config_text).context("writing config.yaml")?;
    Ok(home)
}

/// Runs `work`, stopping it at Ctrl-C or SIGTERM, then removes every
/// labelled container named with `prefix` (a second signal leaves them,
/// saying how to remove them by hand). Returns what `work` returned.
pub async fn with_cleanup<T>(
    engine: &Engine,
    prefix: &str,
    concurrency: usize,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let outcome = tokio::select! {
        result = work => result,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted ({signal})")),
    };
    let failed = outcome.is_err();
    let cleanup = async {
        let mut removed = fleet::remove_all(engine, prefix, concurrency).await?;
        if failed {
            // A create cut short may still land in the engine: sweep again.
            tokio::time::sleep(Duration::from_secs(2)).await;
            removed += fleet::remove_all(engine, prefix, concurrency).await?;
        }
        anyhow::Ok(removed)
    };
    let manual = format!(
        "docker ps -aq --filter label=hermes-agent=1 --filter name={prefix} | xargs -r docker rm -f"
    );
    eprintln!("cleaning up: removing the containers named {prefix}* (Ctrl-C again to leave them)");
    tokio::select! {
        removed = tokio::time::timeout(CLEANUP_TIMEOUT, cleanup) => match removed {
            Ok(Ok(n)) => eprintln!("removed {n} containers"),
            Ok(Err(e)) => eprintln!("error: cleanup failed: {e:#}; remove them with: {manual}"),
            Err(_) => eprintln!("error: cleanup timed out; remove them with: {manual}"),
        },
        signal = interrupted() => eprintln!("cleanup interrupted ({signal}); remove them with: {manual}"),
    }
    outcome
}
