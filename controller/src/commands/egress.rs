//! `hermes egress …`: the credential proxy's files and daemon.
//!
//! `setup` writes `$HERMES_HOME/proxy/` (0700): `ca.crt` (0644), `ca.key`,
//! `tokens.json`, `mappings.json` and `config.json` (0600), keeping the CA
//! and the tokens unless told to rotate. `serve` runs the proxy in the
//! foreground: it creates `proxy.pid` exclusively (never through a
//! symlink), reads the real keys from the environment and `.env` into
//! memory only, binds, writes `state.json` (where it listens) and serves
//! until SIGTERM. `start` runs `serve` as a daemon logging to `proxy.log`
//! (which the daemon then rotates by size) and waits until it listens;
//! `stop` ends it; `status` reports.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hermes_egress::ca::{self, Ca};
use hermes_egress::logfile::{RotatingLog, SharedLog, own_stdio};
use hermes_egress::settings::{CONFIG_FILE, ProxyConfigFile, Settings};
use hermes_egress::tokens::{
    self, Credentials, MAPPINGS_FILE, MappingsFile, TOKENS_FILE, TokensFile,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::cli::{EgressCommand, Output};
use crate::fsio;
use crate::home::Home;

const DIR_MODE: u32 = 0o700;
const SECRET_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;
/// Large enough for any file the proxy writes; reads stop there.
const MAX_FILE: usize = 1 << 20;
/// How long `start` waits for the daemon to listen.
const START_WAIT: Duration = Duration::from_secs(5);
/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The files of `$HERMES_HOME/proxy/`.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    dir: PathBuf,
}

impl Paths {
    pub(crate) fn new(home: &Home) -> Paths {
        Paths {
            dir: home.root().join("proxy"),
        }
    }
    pub(crate) fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub(crate) fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    pub(crate) fn config(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }
    pub(crate) fn tokens(&self) -> PathBuf {
        self.dir.join(TOKENS_FILE)
    }
    pub(crate) fn mappings(&self) -> PathBuf {
        self.dir.join(MAPPINGS_FILE)
    }
    pub(crate) fn pid(&self) -> PathBuf {
        self.dir.join("proxy.pid")
    }
    pub(crate) fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    fn log(&self) -> PathBuf {
        self.dir.join("proxy.log")
    }
}

pub fn run(home: &Home, command: EgressCommand) -> anyhow::Result<ExitCode> {
    let paths = Paths::new(home);
    match command {
        EgressCommand::Install => install(),
        EgressCommand::Setup { rotate_tokens } => setup(home, &paths, rotate_tokens),
        EgressCommand::Start => start(home, &paths),
        EgressCommand::Stop => stop(&paths),
        EgressCommand::Status {
            show_tokens,
            output,
        } => status(home, &paths, show_tokens, output),
        EgressCommand::Serve => serve(home, &paths),
    }
}

fn install() -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find this binary")?;
    println!("Binary:         {}", exe.display());
    println!("Binary version: {}", env!("CARGO_PKG_VERSION"));
    // Everything the proxy needs at run time: a CA, a leaf, a TLS server.
    let new = ca::generate().context("this binary cannot generate a CA")?;
    let ca = Ca::load(&new.cert_pem, &new.key_pem).context("this binary cannot load a CA")?;
    let leaf = hermes_egress::policy::Host::Name("api.openai.com".into());
    ca.mint(&leaf)
        .context("this binary cannot mint a certificate")?;
    println!("The egress proxy is built into this binary: nothing to install.");
    println!("Next: `hermes egress setup`, then `hermes egress start`.");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn read_file(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    fsio::read_bounded(path, MAX_FILE).with_context(|| format!("cannot read {}", path.display()))
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    fsio::write_atomic(path, bytes, mode, true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Creates the proxy directory 0700, or narrows it to 0700.
fn ensure_proxy_dir(home: &Home, paths: &Paths) -> anyhow::Result<()> {
    fsio::ensure_dir(home.root(), DIR_MODE)
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    fsio::ensure_dir(&paths.dir, DIR_MODE)
        .with_context(|| format!("cannot create {}", paths.dir.display()))?;
    let meta = fs::symlink_metadata(&paths.dir)?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        bail!("{} must be a directory, not a link", paths.dir.display());
    }
    if meta.permissions().mode() & 0o777 != DIR_MODE {
        fs::set_permissions(&paths.dir, fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

fn load_ca(paths: &Paths) -> anyhow::Result<Option<Ca>> {
    let (Some(cert), Some(key)) = (read_file(&paths.ca_cert())?, read_file(&paths.ca_key())?)
    else {
        return Ok(None);
    };
    let cert = String::from_utf8(cert).context("ca.crt is not text")?;
    let key = zeroize::Zeroizing::new(String::from_utf8(key).context("ca.key is not text")?);
    Ok(Some(Ca::load(&cert, &key)?))
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn setup(home: &Home, paths: &Paths, rotate: bool) -> anyhow::Result<ExitCode> {
    let config = super::load_config(home)?;
    ensure_proxy_dir(home, paths)?;

    let ca_state = match load_ca(paths) {
        Ok(Some(_)) => "kept",
        Ok(None) | Err(_) => {
            let new = ca::generate()?;
            write_file(&paths.ca_key(), new.key_pem.as_bytes(), SECRET_MODE)?;
            write_file(&paths.ca_cert(), new.cert_pem.as_bytes(), CERT_MODE)?;
            "created"
        }
    };

    let existing = match read_file(&paths.tokens())? {
        Some(bytes) => match TokensFile::parse(&bytes) {
            Ok(file) => Some(file),
            Err(e) => {
                eprintln!("warning: {e}; new tokens are minted");
                None
            }
        },
        None => None,
    };
    let tokens = TokensFile::updated(existing.as_ref(), rotate)
        .map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    let tokens_changed = existing.as_ref() != Some(&tokens);
    write_file(&paths.tokens(), tokens.render().as_bytes(), SECRET_MODE)?;
    write_file(
        &paths.mappings(),
        MappingsFile::builtin().render().as_bytes(),
        SECRET_MODE,
    )?;

    let old_config = read_file(&paths.config())?.and_then(|b| ProxyConfigFile::parse(&b).ok());
    let mgmt_token = match &old_config {
        Some(old) => old.mgmt_token.clone(),
        None => random_hex(32)?,
    };
    let mut proxy_config = ProxyConfigFile::from_model(&config.proxy, mgmt_token);
    // The limits are set by hand in config.json: kept.
    if let Some(old) = &old_config {
        proxy_config.limits = old.limits.clone();
    }
    let config_changed = old_config.as_ref() != Some(&proxy_config);
    write_file(
        &paths.config(),
        proxy_config.render().as_bytes(),
        SECRET_MODE,
    )?;

    println!("CA:       {} ({ca_state})", paths.ca_cert().display());
    let token_state = match (&existing, rotate) {
        (None, _) => "created",
        (Some(_), true) => "rotated",
        (Some(_), false) if tokens_changed => "completed",
        (Some(_), false) => "kept",
    };
    println!(
        "Tokens:   {} ({} providers, {token_state})",
        paths.tokens().display(),
        tokens.tokens.len()
    );
    println!("Mappings: {}", paths.mappings().display());
    println!("Config:   {}", paths.config().display());
    let network_changed = setup_network(home, &config)?;
    if let Some(pid) = running_pid(paths)? {
        if config_changed || network_changed || ca_state == "created" {
            println!("The running proxy is restarted to load the new configuration.");
            stop(paths)?;
            return start(home, paths);
        }
        if tokens_changed {
            reload(paths, pid)?;
            println!("The running proxy reloaded its tokens (pid {pid}).");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// With `proxy.enforce_network`: makes the proxy-only network and its
/// firewall chain; without: removes them when they exist and the network
/// is unused. Returns whether the network's gateway changed (the running
/// proxy must then listen anew).
fn setup_network(home: &Home, config: &hermes_model::config::Config) -> anyhow::Result<bool> {
    let network = crate::egress_network::ProxyNetwork::for_home(home);
    let before = network.gateway();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if config.proxy.enforce_network {
        let (gateway, replaced) = runtime.block_on(async {
            let engine = hermes_backends::docker::Engine::connect().await?;
            network.ensure_network(&engine).await
        })?;
        if replaced {
            println!(
                "Network:  {} made anew: its sandboxes could reach each other (made before enable_icc=false)",
                network.name
            );
        }
        network.install_firewall(config.proxy.tunnel_port)?;
        println!(
            "Network:  {} (internal; gateway {gateway}; only ports {} and {} of the host reachable)",
            network.name,
            config.proxy.tunnel_port,
            config.proxy.tunnel_port.saturating_add(1)
        );
        return Ok(replaced || before.map(IpAddr::V4) != Some(gateway));
    }
    if before.is_some() {
        network.remove_firewall()?;
        let removed = runtime.block_on(async {
            let engine = hermes_backends::docker::Engine::connect().await?;
            let net = engine
                .inspect_internal_network(&network.name, &network.bridge)
                .await?;
            match net {
                Some(net) if net.containers > 0 => anyhow::Ok(false),
                _ => {
                    engine.remove_network(&network.name).await?;
                    anyhow::Ok(true)
                }
            }
        })?;
        if removed {
            println!(
                "Network:  {} removed (proxy.enforce_network is off)",
                network.name
            );
        } else {
            println!(
                "Network:  {} kept while sandboxes are attached (proxy.enforce_network is off)",
                network.name
            );
        }
    }
    Ok(false)
}

/// Asks the running proxy to reload its tokens (SIGHUP) and waits until
/// its management endpoint counts the reload.
fn reload(paths: &Paths, pid: i32) -> anyhow::Result<()> {
    let reloads = || {
        let file = read_file(&paths.config()).ok().flatten()?;
        let token = ProxyConfigFile::parse(&file).ok()?.mgmt_token;
        let addr = read_state(paths)?["mgmt"].as_str()?.parse().ok()?;
        health(addr, &token)?["counters"]["reloads"].as_u64()
    };
    let before = reloads();
    kill(Pid::from_raw(pid), Signal::SIGHUP).with_context(|| format!("cannot signal pid {pid}"))?;
    let deadline = Instant::now() + START_WAIT;
    while Instant::now() < deadline {
        if let (Some(b), Some(now)) = (before, reloads())
            && now > b
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "the proxy (pid {pid}) did not confirm the reload; see {}",
        paths.log().display()
    )
}

/// The pid in the pid file, read without following a symlink.
fn read_pid(paths: &Paths) -> anyhow::Result<Option<i32>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(paths.pid())
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", paths.pid().display())),
    };
    let mut text = String::new();
    file.take(64).read_to_string(&mut text)?;
    Ok(text.trim().parse::<i32>().ok().filter(|p| *p > 1))
}

/// Whether `pid` is a running `hermes … egress serve`.
fn is_proxy_process(pid: i32) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2)
        .any(|w| w[0] == b"egress" && w[1] == b"serve")
        && !fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

/// The pid of the running proxy, if the pid file names one.
pub(crate) fn running_pid(paths: &Paths) -> anyhow::Result<Option<i32>> {
    Ok(read_pid(paths)?.filter(|pid| is_proxy_process(*pid)))
}

/// Creates the pid file with O_EXCL|O_NOFOLLOW, replacing a stale one.
fn create_pid_file(paths: &Paths) -> anyhow::Result<()> {
    for _ in 0..2 {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(SECRET_MODE)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(paths.pid())
        {
            Ok(mut file) => {
                writeln!(file, "{}", std::process::id())?;
                file.sync_all()?;
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if let Some(pid) = running_pid(paths)? {
                    bail!("the egress proxy is already running (pid {pid})");
                }
                let meta = fs::symlink_metadata(paths.pid())?;
                if !meta.is_file() {
                    bail!(
                        "{} is not a regular file; remove it by hand",
                        paths.pid().display()
                    );
                }
                fs::remove_file(paths.pid())?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", paths.pid().display()));
            }
        }
    }
    bail!("another proxy raced for {}", paths.pid().display())
}

/// Removes the pid and state files if they still name this process.
fn remove_own_files(paths: &Paths) {
    if read_pid(paths).ok().flatten() == i32::try_from(std::process::id()).ok() {
        let _ = fs::remove_file(paths.state());
        let _ = fs::remove_file(paths.pid());
    }
}

/// The addresses listened on when config names none: the Docker bridge
/// gateway when there is one, and 127.0.0.1.
pub(crate) fn default_listen() -> Vec<IpAddr> {
    let mut listen = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            if ifa.interface_name == "docker0"
                && let Some(v4) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in())
            {
                listen.push(IpAddr::V4(v4.ip()));
            }
        }
    }
    listen.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    listen
}

fn missing(path: PathBuf) -> anyhow::Error {
    anyhow::anyhow!("{} is missing: run `hermes egress setup`", path.display())
}

/// The tokens and mappings joined with the real keys of this process's
/// environment and `.env`.
fn load_credentials(home: &Home, paths: &Paths) -> anyhow::Result<Credentials> {
    let tokens =
        TokensFile::parse(&read_file(&paths.tokens())?.ok_or_else(|| missing(paths.tokens()))?)?;
    let mappings = MappingsFile::parse(
        &read_file(&paths.mappings())?.ok_or_else(|| missing(paths.mappings()))?,
    )?;
    let env = super::host_env(home)?;
    Ok(Credentials::build(&mappings, &tokens, |name| {
        env.lookup(name).map(str::to_string)
    }))
}

/// Everything `serve` needs from the files, the environment and `.env`.
fn load_settings(home: &Home, paths: &Paths) -> anyhow::Result<Settings> {
    let file = ProxyConfigFile::parse(
        &read_file(&paths.config())?.ok_or_else(|| missing(paths.config()))?,
    )?;
    let credentials = load_credentials(home, paths)?;
    let ca = load_ca(paths)?.ok_or_else(|| missing(paths.ca_key()))?;
    let upstream_ca = match &file.upstream_ca_file {
        Some(path) => Some(
            read_file(Path::new(path))?
                .ok_or_else(|| anyhow::anyhow!("proxy.upstream_ca_file {path} is missing"))?,
        ),
        None => None,
    };
    let mut file = file;
    let mut listen = default_listen();
    if file.enforce_network {
        // Not on the default bridge, where every other container of the
        // host could use the proxy: the network's gateway (below) and
        // loopback (the SSH forwards and singularity instances reach the
        // proxy there).
        listen = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let network = crate::egress_network::ProxyNetwork::for_home(home);
        let gateway = IpAddr::V4(network.gateway().ok_or_else(|| {
            anyhow::anyhow!(
                "proxy.enforce_network: the network {} (bridge {}) does not exist; run `hermes egress setup`",
                network.name,
                network.bridge
            )
        })?);
        // Where that network's sandboxes reach the proxy: listened on
        // whatever proxy.listen names.
        listen.push(gateway);
        if let Some(explicit) = file.listen.as_mut().filter(|l| !l.contains(&gateway)) {
            explicit.push(gateway);
        }
    }
    Ok(Settings::new(&file, listen, credentials, ca, upstream_ca))
}

/// Lets the proxy hold many tunnels: the soft open-files limit up to the hard one.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

fn serve(home: &Home, paths: &Paths) -> anyhow::Result<ExitCode> {
    ensure_proxy_dir(home, paths)?;
    let fingerprint = crate::egress_state::settings_fingerprint(home, paths);
    let settings = load_settings(home, paths)?;
    create_pid_file(paths)?;
    let result = serve_with_pid_file(home, paths, settings, fingerprint);
    remove_own_files(paths);
    result
}

fn serve_with_pid_file(
    home: &Home,
    paths: &Paths,
    settings: Settings,
    fingerprint: Option<String>,
) -> anyhow::Result<ExitCode> {
    raise_open_files_limit();
    // Started by `start`, with its output going to proxy.log: from here on
    // the daemon writes that file itself, rotated by size.
    let own_log = own_log(paths, settings.log_max_bytes, settings.log_files);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("egress")
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let access: Box<dyn Write + Send> = match own_log {
            Some(log) => Box::new(log),
            None => Box::new(std::io::BufWriter::new(std::io::stdout())),
        };
        let server = hermes_egress::server::bind(settings, access).await?;
        let bound = server.bound().clone();
        // What the daemon runs with, for `status` and the proxy planner:
        // `settings` is the fingerprint of the files it loaded.
        let write_state = |settings: Option<String>| {
            let state = json!({
                "pid": std::process::id(),
                "tunnel": bound.tunnel.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "http": bound.http.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "mgmt": bound.mgmt.to_string(),
                "settings": settings,
            });
            write_file(
                &paths.state(),
                format!("{state:#}\n").as_bytes(),
                SECRET_MODE,
            )
        };
        write_state(fingerprint)?;
        eprintln!(
            "hermes egress proxy {} (pid {}): CONNECT on {}, plain HTTP on {}",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            join(&bound.tunnel),
            join(&bound.http)
        );
        let reloader = server.reloader();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        // SIGTERM and SIGINT stop; SIGHUP reloads the tokens, keeping the
        // keys of this process's environment.
        let shutdown = async move {
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                    _ = hup.recv() => match load_credentials(home, paths) {
                        Ok(credentials) => {
                            reloader.reload(credentials);
                            if let Err(e) = write_state(crate::egress_state::settings_fingerprint(home, paths)) {
                                eprintln!("hermes egress proxy: cannot update its state file: {e:#}");
                            }
                            eprintln!("hermes egress proxy reloaded its tokens");
                        }
                        Err(e) => eprintln!(
                            "hermes egress proxy: reload failed, keeping the old tokens: {e:#}"
                        ),
                    },
                }
            }
        };
        server.run(shutdown).await;
        eprintln!("hermes egress proxy stopping");
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(ExitCode::SUCCESS)
}

/// When this process's stdout is `proxy.log` (as `start` arranges), the
/// log rotated by size, with stdout and stderr following it.
fn own_log(paths: &Paths, max_bytes: u64, keep: usize) -> Option<SharedLog> {
    use std::os::unix::fs::MetadataExt;
    let out = nix::sys::stat::fstat(std::io::stdout()).ok()?;
    let log = fs::symlink_metadata(paths.log()).ok()?;
    if !log.is_file() || out.st_dev != log.dev() || out.st_ino != log.ino() {
        return None;
    }
    let shared = SharedLog::new(RotatingLog::open(&paths.log(), max_bytes, keep).ok()?);
    match own_stdio(&shared) {
        Ok(()) => Some(shared),
        Err(e) => {
            eprintln!(
                "hermes egress proxy: cannot rotate {}: {e}",
                paths.log().display()
            );
            None
        }
    }
}

fn join(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Opens the daemon's log for appending: 0600, never through a symlink.
fn open_log(paths: &Paths) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(SECRET_MODE)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(paths.log())
        .with_context(|| format!("cannot open {}", paths.log().display()))?;
    file.set_permissions(fs::Permissions::from_mode(SECRET_MODE))?;
    Ok(file)
}

fn last_lines(path: &Path, n: usize) -> Vec<String> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// What `state.json` says, if it names `pid`.
pub(crate) fn read_state(paths: &Paths) -> Option<serde_json::Value> {
    let bytes = read_file(&paths.state()).ok().flatten()?;
    serde_json::from_slice(&bytes).ok()
}

fn start(home: &Home, paths: &Paths) -> anyhow::Result<ExitCode> {
    if let Some(pid) = running_pid(paths)? {
        eprintln!("error: the egress proxy is already running (pid {pid})");
        return Ok(ExitCode::from(1));
    }
    // Fail here, not in the daemon's log, when set-up is missing.
    load_settings(home, paths)?;
    let log = open_log(paths)?;
    let exe = std::env::current_exe().context("cannot find this binary")?;
    let root = std::path::absolute(home.root())?;
    let mut child = Command::new(exe)
        .arg("--home")
        .arg(&root)
        .args(["egress", "serve"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a terminal's Ctrl-C does not reach it.
        .process_group(0)
        .spawn()
        .context("cannot start the proxy")?;
    let child_pid = child.id();
    let deadline = Instant::now() + START_WAIT;
    let failure = loop {
        if let Some(status) = child.try_wait()? {
            break format!("the proxy exited ({status})");
        }
        let listening = read_state(paths)
            .filter(|s| s["pid"] == child_pid)
            .and_then(|s| {
                s["tunnel"][0]
                    .as_str()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
            })
            .is_some_and(|addr| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            });
        if listening {
            let state = read_state(paths).unwrap_or_default();
            println!(
                "egress proxy started (pid {child_pid}); CONNECT on {}; log: {}",
                state["tunnel"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_default(),
                paths.log().display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break format!("the proxy did not listen within {} s", START_WAIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("error: {failure}; last lines of {}:", paths.log().display());
    for line in last_lines(&paths.log(), 20) {
        eprintln!("  {line}");
    }
    Ok(ExitCode::from(1))
}

fn stop(paths: &Paths) -> anyhow::Result<ExitCode> {
    let Some(pid) = read_pid(paths)? else {
        println!("The egress proxy is not running.");
        return Ok(ExitCode::SUCCESS);
    };
    if !is_proxy_process(pid) {
        let _ = fs::remove_file(paths.pid());
        let _ = fs::remove_file(paths.state());
        println!("The egress proxy is not running (removed a stale pid file naming {pid}).");
        return Ok(ExitCode::SUCCESS);
    }
    let target = Pid::from_raw(pid);
    kill(target, Signal::SIGTERM).with_context(|| format!("cannot signal pid {pid}"))?;
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if !is_proxy_process(pid) {
            println!("egress proxy stopped (pid {pid}).");
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Checked again just before: the pid must still be the proxy.
    if is_proxy_process(pid) {
        let _ = kill(target, Signal::SIGKILL);
    }
    let _ = fs::remove_file(paths.pid());
    let _ = fs::remove_file(paths.state());
    println!(
        "egress proxy killed after {} s (pid {pid}).",
        STOP_GRACE.as_secs()
    );
    Ok(ExitCode::SUCCESS)
}

/// Asks the management endpoint for `/health`.
pub(crate) fn health(addr: SocketAddr, token: &str) -> Option<serde_json::Value> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.take(1 << 20).read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| serde_json::from_str(body).ok())?
}

fn status(
    home: &Home,
    paths: &Paths,
    show_tokens: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let config = super::load_config(home)?;
    let proxy = &config.proxy;
    let file = read_file(&paths.config())?.and_then(|b| ProxyConfigFile::parse(&b).ok());
    let ca_ok = load_ca(paths).ok().flatten().is_some();
    let pid = read_pid(paths)?;
    let running = pid.filter(|p| is_proxy_process(*p));
    let health = match (&file, running, read_state(paths)) {
        (Some(file), Some(_), Some(state)) => state["mgmt"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .and_then(|addr| health(addr, &file.mgmt_token)),
        _ => None,
    };
    let env = super::host_env(home)?;
    let tokens = read_file(&paths.tokens())?.and_then(|b| TokensFile::parse(&b).ok());
    let mappings = read_file(&paths.mappings())?
        .and_then(|b| MappingsFile::parse(&b).ok())
        .unwrap_or_else(MappingsFile::builtin);
    let rows: Vec<serde_json::Value> = mappings
        .mappings
        .iter()
        .map(|m| {
            let token = tokens.as_ref().and_then(|t| t.tokens.get(&m.provider));
            let key_from = m
                .env
                .iter()
                .find(|n| env.lookup(n).is_some_and(|v| !v.is_empty()));
            json!({
                "provider": m.provider,
                "env": m.env,
                "token": token.map(|t| if show_tokens { t.clone() } else { tokens::mask(t) }),
                "key": key_from,
            })
        })
        .collect();
    let mut warnings: Vec<String> = tokens::UNCOVERED
        .iter()
        .filter(|(name, _)| env.lookup(name).is_some_and(|v| !v.is_empty()))
        .map(|(name, why)| {
            format!("{name} is set but cannot go through the proxy ({why}); it is not passed to sandboxes")
        })
        .collect();
    // The cloud services' sandboxes reach the internet directly: the proxy
    // cannot stand between them and a provider.
    let uncovered = hermes_model::cloud::uncovered_backends(&config);
    if hermes_model::cloud::is_cloud(config.terminal.backend) {
        warnings.push(format!(
            "terminal.backend is {}: its sandboxes reach the internet directly, not through this proxy",
            config.terminal.backend
        ));
    }
    for (backend, keys) in &uncovered {
        for key in keys {
            warnings.push(format!(
                "terminal.{}_forward_env names {key}: the real key goes into {backend} sandboxes",
                backend.as_str().trim_end_matches("_sandbox")
            ));
        }
    }
    let uncovered_json: Vec<serde_json::Value> = uncovered
        .iter()
        .map(|(backend, keys)| json!({"backend": backend.as_str(), "forwarded_keys": keys}))
        .collect();
    let uncovered_names: Vec<&str> = uncovered.iter().map(|(b, _)| b.as_str()).collect();
    let process = match (pid, running) {
        (_, Some(p)) => format!("running (pid {p})"),
        (Some(p), None) => format!("not running (stale pid file naming {p})"),
        (None, None) => "not running".to_string(),
    };
    let listening = health.as_ref().map(|h| {
        h["tunnel"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    });
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let report = json!({
        "enabled": proxy.enabled,
        "binary": exe,
        "binary_version": env!("CARGO_PKG_VERSION"),
        "config": file.as_ref().map(|_| paths.config().display().to_string()),
        "ca_cert": ca_ok.then(|| paths.ca_cert().display().to_string()),
        "tunnel_port": proxy.tunnel_port,
        "process": process,
        "running": running.is_some(),
        "listening": listening,
        "credential_source": proxy.credential_source,
        "docker_enforce": proxy.enforce_on_docker,
        "uncovered_backends": uncovered_json,
        "counters": health.as_ref().map(|h| h["counters"].clone()),
        "tokens": rows,
        "warnings": warnings,
    });
    if output == Output::Json {
        println!("{report:#}");
        return Ok(ExitCode::SUCCESS);
    }
    let or = |v: Option<String>, none: &str| v.unwrap_or_else(|| none.to_string());
    println!("Enabled:         {}", proxy.enabled);
    println!("Binary:          {exe}");
    println!("Binary version:  {}", env!("CARGO_PKG_VERSION"));
    println!(
        "Config:          {}",
        or(
            file.map(|_| paths.config().display().to_string()),
            "missing (run `hermes egress setup`)"
        )
    );
    println!(
        "CA cert:         {}",
        or(
            ca_ok.then(|| paths.ca_cert().display().to_string()),
            "missing"
        )
    );
    println!(
        "Tunnel port:     {} (plain HTTP {})",
        proxy.tunnel_port,
        proxy.tunnel_port.saturating_add(1)
    );
    println!("Process:         {process}");
    println!("Listening:       {}", or(listening, "no"));
    println!("Credential src:  {}", proxy.credential_source);
    println!(
        "Docker enforce:  {} (singularity too)",
        proxy.enforce_on_docker
    );
    println!(
        "Uncovered:       {} (their sandboxes reach the internet directly; a key goes there only when named in terminal.<backend>_forward_env)",
        uncovered_names.join(", ")
    );
    println!();
    println!("{:<12} {:<44} {:<24} KEY", "PROVIDER", "TOKEN", "VARIABLES");
    for row in &rows {
        println!(
            "{:<12} {:<44} {:<24} {}",
            row["provider"].as_str().unwrap_or_default(),
            row["token"].as_str().unwrap_or("-"),
            row["env"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default(),
            row["key"]
                .as_str()
                .map_or("missing".to_string(), |n| format!("from {n}")),
        );
    }
    for w in &warnings {
        println!("warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}
