//! The proxy daemon's life: `serve` runs the proxy in the foreground: it
//! creates `proxy.pid` exclusively (never through a symlink), reads the
//! real keys from the environment and `.env` into memory only, binds,
//! writes `state.json` (where it listens, [`super::state`]) and serves
//! until SIGTERM, reloading its tokens on SIGHUP. `start` runs `serve` as
//! a daemon logging to `proxy.log` (which the daemon then rotates by size)
//! and waits until it listens; `stop` ends it; [`reload`] signals it and
//! waits until its management endpoint counts the reload.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hermes_egress::google;
use hermes_egress::logfile::{RotatingLog, SharedLog, own_stdio};
use hermes_egress::settings::{DnsSettings, ProxyConfigFile, Settings};
use hermes_egress::tokens::{Credentials, MappingsFile, TokensFile};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::files::{self, Paths, SECRET_MODE, load_ca, missing, read_file};
use super::network::{ProxyNetwork, default_listen};
use super::state::{self, ProxyState, STATE_VERSION};
use crate::home::Home;

/// How long `start` waits for the daemon to listen.
const START_WAIT: Duration = Duration::from_secs(5);
/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The pid in the pid file, read without following a symlink.
pub(crate) fn read_pid(paths: &Paths) -> anyhow::Result<Option<i32>> {
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
pub(crate) fn is_proxy_process(pid: i32) -> bool {
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

/// The tokens and mappings joined with the real keys: those of this
/// process's environment and `.env`, or with `credential_source:
/// bitwarden` those Bitwarden Secrets Manager lists (read now, in memory
/// only).
fn load_credentials(home: &Home, paths: &Paths) -> anyhow::Result<Credentials> {
    let tokens =
        TokensFile::parse(&read_file(&paths.tokens())?.ok_or_else(|| missing(paths.tokens()))?)?;
    let mappings = MappingsFile::parse(
        &read_file(&paths.mappings())?.ok_or_else(|| missing(paths.mappings()))?,
    )?;
    let file = ProxyConfigFile::parse(
        &read_file(&paths.config())?.ok_or_else(|| missing(paths.config()))?,
    )?;
    let env = crate::host::host_env(home)?;
    let (mut credentials, service_account) = if file.credential_source == super::bitwarden::SOURCE {
        let keys = super::bitwarden::fetch(&env, file.bitwarden_project_id.as_deref())?;
        let lookup = |name: &str| keys.get(name).map(|k| k.to_string());
        (
            Credentials::build(&mappings, &tokens, lookup),
            lookup(google::KEY_FILE_VARIABLE).map(zeroize::Zeroizing::new),
        )
    } else {
        let lookup = |name: &str| env.lookup(name).map(str::to_string);
        (
            Credentials::build(&mappings, &tokens, lookup),
            lookup(google::KEY_FILE_VARIABLE).map(zeroize::Zeroizing::new),
        )
    };
    // The service account's key is read here, into memory only; a key
    // file that cannot be used stops the proxy with the reason.
    let account = match service_account.filter(|v| !v.trim().is_empty()) {
        Some(value) => Some(
            google::ServiceAccount::from_variable(&value)
                .with_context(|| format!("{} (Google OAuth minting)", google::KEY_FILE_VARIABLE))?,
        ),
        None => None,
    };
    credentials.configure_google(Some(&file.google_oauth_hosts), account);
    Ok(credentials)
}

/// With `credential_source: bitwarden`, the key variables Bitwarden holds
/// now (read and dropped: `egress setup`'s check before the proxy reads
/// them); `None` for another source.
pub(crate) fn check_source(home: &Home, paths: &Paths) -> anyhow::Result<Option<Vec<String>>> {
    let file = ProxyConfigFile::parse(
        &read_file(&paths.config())?.ok_or_else(|| missing(paths.config()))?,
    )?;
    if file.credential_source != super::bitwarden::SOURCE {
        return Ok(None);
    }
    let env = crate::host::host_env(home)?;
    let keys = super::bitwarden::fetch(&env, file.bitwarden_project_id.as_deref())?;
    Ok(Some(
        hermes_model::providers::key_variables()
            .filter(|name| keys.get(*name).is_some_and(|k| !k.is_empty()))
            .map(str::to_string)
            .collect(),
    ))
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
        let network = ProxyNetwork::for_home(home);
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
    let mut settings = Settings::new(&file, listen, credentials, ca, upstream_ca);
    // A Unix socket's path has room for 107 bytes; a home deeper than
    // that has no socket, and its bubblewrap sandboxes say so.
    let socket = paths.socket();
    if socket.as_os_str().len() < 100 {
        settings.unix_listen = Some(socket);
    }
    if file.enforce_network
        && let Some(gateway) = ProxyNetwork::for_home(home).gateway()
    {
        // The network's name server (its port 53/udp is redirected here):
        // allowlisted names resolve to the proxy, nothing is forwarded.
        settings.dns = Some(DnsSettings {
            listen: std::net::SocketAddr::new(IpAddr::V4(gateway), file.tunnel_port),
            answer: gateway,
        });
    }
    Ok(settings)
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

/// `hermes egress serve`: the proxy in the foreground until SIGTERM.
pub(crate) fn serve(home: &Home, paths: &Paths) -> anyhow::Result<ExitCode> {
    files::ensure_proxy_dir(home, paths)?;
    let fingerprint = files::settings_fingerprint(home, paths);
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
            state::write(
                paths,
                &ProxyState {
                    version: STATE_VERSION,
                    pid: std::process::id(),
                    tunnel: bound.tunnel.clone(),
                    http: bound.http.clone(),
                    mgmt: bound.mgmt,
                    settings,
                },
            )
        };
        write_state(fingerprint)?;
        eprintln!(
            "hermes egress proxy {} (pid {}): CONNECT on {}, plain HTTP on {}",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            state::join(&bound.tunnel),
            state::join(&bound.http)
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
                            if let Err(e) = write_state(files::settings_fingerprint(home, paths)) {
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

/// `hermes egress start`: runs `serve` as a daemon and waits until it
/// listens.
pub(crate) fn start(home: &Home, paths: &Paths) -> anyhow::Result<ExitCode> {
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
        // Until the child writes its own, the file may be a stale one
        // (or, in between, one being replaced): only the child's counts.
        let listening = state::read(paths)
            .ok()
            .flatten()
            .filter(|s| s.pid == child_pid)
            .filter(|s| {
                s.tunnel.first().is_some_and(|addr| {
                    TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_ok()
                })
            });
        if let Some(state) = listening {
            println!(
                "egress proxy started (pid {child_pid}); CONNECT on {}; log: {}",
                state.tunnel_list(),
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

/// `hermes egress stop`: SIGTERM, then SIGKILL after [`STOP_GRACE`].
pub(crate) fn stop(paths: &Paths) -> anyhow::Result<ExitCode> {
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

/// Asks the running proxy to reload its tokens (SIGHUP) and waits until
/// its management endpoint counts the reload. For the command line: it
/// runs the health probe on a current-thread runtime of its own.
pub(crate) fn reload(paths: &Paths, pid: i32) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reloads = || {
        let token = files::mgmt_token(paths)?;
        let addr = state::read(paths).ok().flatten()?.mgmt;
        let health = runtime.block_on(super::health::probe(addr, &token)).ok()?;
        Some(health.counters.reloads)
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
