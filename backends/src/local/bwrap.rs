//! `terminal.local_sandbox: bwrap`: a `local` command under bubblewrap.
//!
//! Each command runs in namespaces of its own (user, pid, ipc, uts, net,
//! cgroup), with `--die-with-parent` (a command ends with the hermes
//! process that waits for it), no capability (`--cap-drop ALL`, even when
//! hermes runs as root), no new privileges (setuid programs gain
//! nothing), and the seccomp
//! filters of [`super::seccomp`]. What it sees of the files:
//!
//! - the host's root, read-only; a fresh `/dev`, `/proc` (its own
//!   processes only) and `/run` (no host socket: no ssh or gpg agent, no
//!   engine);
//! - writable: the directory it starts in (the task's workspace), `/tmp`
//!   (the task's own, kept between its commands), and
//!   `terminal.local_sandbox_writable`;
//! - invisible: the hermes home, `~/.ssh`, the cloud and registry
//!   credentials of [`SECRET_PATHS`], and `terminal.local_sandbox_hidden`
//!   (an empty directory or an empty file in their place), what the paths
//!   name and, for a symbolic link, where it leads;
//! - `/run/hermes/state`: the task's working directory and background
//!   processes' files (the exec contract's state), which hermes reads.
//!
//! Its only network is its own loopback. With the egress proxy on, the
//! sandbox's init ([`super::init`]) listens on `127.0.0.1:`[`PROXY_PORT`]
//! there and carries each connection to the proxy's Unix socket, bound in
//! at [`PROXY_SOCKET`]; the command gets the proxy's variables, its
//! tokens for the providers' keys, and the proxy's CA at [`CA_PATH`].
//!
//! A command's sandbox ends with it: what it leaves running is killed
//! then (stricter than the unsandboxed `local` backend, where it stays).
//! A `hermes exec --background` command gets a sandbox of its own that
//! outlives the exec ([`super::launch`]): no `--die-with-parent`, hermes's
//! init as its PID 1, alive while any of its processes is; hermes keeps
//! its record outside every sandbox, and `hermes process` reads and stops
//! it from the host ([`super::jobs`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the proxy's Unix socket is bound in the sandbox.
pub const PROXY_SOCKET: &str = "/run/hermes/proxy.sock";
/// Where the proxy's CA certificate is bound in the sandbox.
pub const CA_PATH: &str = "/run/hermes/egress-ca.crt";
/// Where the task's exec state is bound in the sandbox.
pub const STATE_DIR: &str = "/run/hermes/state";
/// The port the sandbox's init listens on for the proxy, on the
/// sandbox's own loopback (the tunnel port; plain HTTP is the next).
pub const PROXY_PORT: u16 = 3128;

/// Paths under the user's home directory that hold credentials: hidden
/// from every bwrap sandbox, when they exist.
pub const SECRET_PATHS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".password-store",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".local/share/keyrings",
];

/// What a command's sandbox is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bwrap {
    /// The `bwrap` program.
    pub program: PathBuf,
    /// The program run as the sandbox's init (this hermes binary).
    pub init: PathBuf,
    /// The task's `/tmp` on the host.
    pub tmp: PathBuf,
    /// The task's exec state on the host, bound at [`STATE_DIR`].
    pub state: PathBuf,
    /// Where hermes records the task's background sandboxes, on the host
    /// and in no sandbox ([`super::jobs`]).
    pub launched: PathBuf,
    /// Writable besides the starting directory and `/tmp`.
    pub writable: Vec<PathBuf>,
    /// Hidden: each an existing path on the host, its links resolved
    /// (both the link and its target are listed).
    pub hidden: Vec<PathBuf>,
    /// The egress proxy, when it is on.
    pub proxy: Option<ProxyWiring>,
}

/// The proxy's side of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyWiring {
    /// The proxy's Unix socket on the host.
    pub socket: PathBuf,
    /// The proxy's CA certificate on the host.
    pub ca: PathBuf,
}

/// Why a command cannot run in its sandbox: it does not start at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "terminal.local_sandbox is bwrap, but bwrap cannot make a sandbox here: {0}; install bubblewrap (apt install bubblewrap) and allow unprivileged user namespaces, or set terminal.local_sandbox: none to run commands unsandboxed"
    )]
    Unavailable(String),
    #[error(
        "the command would start in {}, which is inside {} that bwrap hides: start it elsewhere", dir.display(), hidden.display()
    )]
    StartsInHidden { dir: PathBuf, hidden: PathBuf },
    #[error(
        "terminal.local_sandbox_writable: {} would expose {}, which bwrap hides", writable.display(), hidden.display()
    )]
    WritableHolds { writable: PathBuf, hidden: PathBuf },
}

impl Bwrap {
    /// Its task's background sandboxes, as the host sees them.
    pub fn jobs(&self) -> super::jobs::Jobs {
        super::jobs::Jobs {
            launched: self.launched.clone(),
            state: self.state.clone(),
        }
    }

    /// Refuses a sandbox that would expose what it hides: a start
    /// directory or a writable path inside, or holding, a hidden one.
    pub fn check(&self, start: &Path) -> Result<(), Refusal> {
        for hidden in &self.hidden {
            if start.starts_with(hidden) {
                return Err(Refusal::StartsInHidden {
                    dir: start.to_path_buf(),
                    hidden: hidden.clone(),
                });
            }
            for w in &self.writable {
                if w.starts_with(hidden) || hidden.starts_with(w) {
                    return Err(Refusal::WritableHolds {
                        writable: w.clone(),
                        hidden: hidden.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// bwrap's arguments for a command starting in `start`, before the
    /// init's. `seccomp_fds`: the descriptors its filters are read from.
    /// `life`: whether the sandbox ends with the hermes that runs it.
    /// No value of the command's environment is among them (bwrap passes
    /// its own environment on).
    pub fn args(&self, start: &Path, seccomp_fds: &[i32], life: Life) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push =
            |parts: &[&std::ffi::OsStr]| a.extend(parts.iter().map(|p| p.to_os_string()));
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        match life {
            Life::WithItsExec => push(&[os("--die-with-parent")]),
            // hermes's init is PID 1, the sandbox ends with its last
            // process; bwrap says which process that is on the host.
            Life::Background { info_fd } => {
                let fd = OsString::from(info_fd.to_string());
                push(&[os("--as-pid-1"), os("--info-fd"), &fd]);
            }
        }
        push(&[
            // Run as root, bwrap would keep every capability.
            os("--cap-drop"),
            os("ALL"),
            os("--unshare-user"),
            os("--unshare-pid"),
            os("--unshare-ipc"),
            os("--unshare-uts"),
            os("--unshare-net"),
            os("--unshare-cgroup-try"),
            os("--new-session"),
            os("--hostname"),
            os("hermes-sandbox"),
            os("--ro-bind"),
            os("/"),
            os("/"),
            os("--dev"),
            os("/dev"),
            os("--tmpfs"),
            os("/dev/shm"),
            os("--proc"),
            os("/proc"),
            os("--tmpfs"),
            os("/run"),
            os("--bind"),
            self.tmp.as_os_str(),
            os("/tmp"),
        ]);
        // Writable: the start directory, then the configured ones; what
        // is hidden goes over them.
        if start != Path::new("/") {
            push(&[os("--bind"), start.as_os_str(), start.as_os_str()]);
        }
        for w in &self.writable {
            push(&[os("--bind-try"), w.as_os_str(), w.as_os_str()]);
        }
        for hidden in &self.hidden {
            if hidden.is_dir() {
                push(&[os("--tmpfs"), hidden.as_os_str()]);
            } else {
                push(&[os("--ro-bind"), os("/dev/null"), hidden.as_os_str()]);
            }
        }
        push(&[os("--bind"), self.state.as_os_str(), os(STATE_DIR)]);
        if let Some(proxy) = &self.proxy {
            push(&[
                os("--bind"),
                proxy.socket.as_os_str(),
                os(PROXY_SOCKET),
                os("--ro-bind"),
                proxy.ca.as_os_str(),
                os(CA_PATH),
            ]);
        }
        push(&[os("--chdir"), start.as_os_str()]);
        for fd in seccomp_fds {
            a.push("--add-seccomp-fd".into());
            a.push(fd.to_string().into());
        }
        a
    }
}

/// How long a sandbox lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// It ends with the hermes that runs its command (`--die-with-parent`).
    WithItsExec,
    /// A background command's: it ends with its last process; bwrap
    /// writes its PID 1's host pid on `info_fd`.
    Background { info_fd: i32 },
}

/// The paths to hide under `user_home`, the hermes home and `extra`: each
/// that exists, and, for a symbolic link, where it leads too.
pub fn hidden_paths(
    user_home: Option<&Path>,
    hermes_home: &Path,
    extra: &[PathBuf],
) -> Vec<PathBuf> {
    let mut wanted: Vec<PathBuf> = vec![hermes_home.to_path_buf()];
    if let Some(home) = user_home {
        wanted.extend(SECRET_PATHS.iter().map(|p| home.join(p)));
    }
    wanted.extend(extra.iter().cloned());
    let mut out: Vec<PathBuf> = Vec::new();
    for path in wanted {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            // The link is left as it is (a dangling link shows nothing);
            // where it leads is hidden.
            if let Ok(target) = std::fs::canonicalize(&path) {
                out.push(target);
            }
        } else if let Ok(real) = std::fs::canonicalize(&path) {
            out.push(real);
        }
    }
    out.sort();
    out.dedup();
    // A path inside another hidden one is hidden with it.
    let all = out.clone();
    out.retain(|p| !all.iter().any(|o| o != p && p.starts_with(o)));
    out
}

/// Whether bwrap can make a sandbox here: `Ok` or why not (not
/// installed, user namespaces off), from one run of `bwrap … true`.
pub fn probe(program: &Path) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match out {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim();
            Err(if said.is_empty() {
                format!("{} exited with {}", program.display(), out.status)
            } else {
                format!(
                    "{}: {}",
                    program.display(),
                    said.chars().take(300).collect::<String>()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{} is not installed", program.display()))
        }
        Err(e) => Err(format!("cannot run {}: {e}", program.display())),
    }
}

/// The `bwrap` program: the first on `PATH`, else `/usr/bin/bwrap`.
pub fn program() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("bwrap"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/bwrap"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sandbox(dir: &Path) -> Bwrap {
        Bwrap {
            program: PathBuf::from("/usr/bin/bwrap"),
            init: PathBuf::from("/usr/bin/hermes"),
            tmp: dir.join("tmp"),
            state: dir.join("state"),
            launched: dir.join("launched"),
            writable: vec![PathBuf::from("/srv/out")],
            hidden: vec![dir.join("hermes-home")],
            proxy: None,
        }
    }

    #[test]
    fn a_start_or_writable_path_inside_a_hidden_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let b = sandbox(dir.path());
        assert!(b.check(Path::new("/srv/project")).is_ok());
        assert!(matches!(
            b.check(&dir.path().join("hermes-home/sandboxes")),
            Err(Refusal::StartsInHidden { .. })
        ));
        let mut w = b.clone();
        w.writable = vec![dir.path().to_path_buf()];
        assert!(matches!(
            w.check(Path::new("/srv")),
            Err(Refusal::WritableHolds { .. })
        ));
    }

    #[test]
    fn hidden_paths_are_the_existing_ones_with_links_followed() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".aws")).unwrap();
        let real_ssh = dir.path().join("elsewhere-ssh");
        std::fs::create_dir_all(&real_ssh).unwrap();
        std::os::unix::fs::symlink(&real_ssh, home.join(".ssh")).unwrap();
        std::fs::write(home.join(".netrc"), "machine x").unwrap();
        let hermes = dir.path().join("hermes");
        std::fs::create_dir_all(hermes.join("sandboxes")).unwrap();
        let hidden = hidden_paths(Some(&home), &hermes, &[hermes.join("sandboxes")]);
        let real = |p: &Path| std::fs::canonicalize(p).unwrap();
        assert!(hidden.contains(&real(&home.join(".aws"))), "{hidden:?}");
        assert!(hidden.contains(&real(&real_ssh)), "{hidden:?}");
        assert!(hidden.contains(&real(&home.join(".netrc"))), "{hidden:?}");
        assert!(hidden.contains(&real(&hermes)), "{hidden:?}");
        // Inside the hidden home: covered by it.
        assert!(
            !hidden.contains(&real(&hermes.join("sandboxes"))),
            "{hidden:?}"
        );
        assert!(!hidden.iter().any(|p| p.ends_with(".gnupg")), "{hidden:?}");
    }

    #[test]
    fn the_arguments_hide_after_they_bind_and_carry_no_environment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("hermes-home")).unwrap();
        let mut b = sandbox(dir.path());
        b.proxy = Some(ProxyWiring {
            socket: dir.path().join("proxy.sock"),
            ca: dir.path().join("ca.crt"),
        });
        let args: Vec<String> = b
            .args(Path::new("/srv/project"), &[5, 6], Life::WithItsExec)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let at = |word: &str| args.iter().position(|a| a == word).unwrap();
        assert_eq!(args[0], "--die-with-parent");
        assert!(at("--unshare-net") < at("--ro-bind"));
        let bind = args.iter().position(|a| a == "/srv/project").unwrap();
        let hide = args
            .iter()
            .position(|a| a.ends_with("hermes-home"))
            .unwrap();
        assert!(bind < hide, "{args:?}");
        assert!(args.contains(&PROXY_SOCKET.to_string()));
        assert_eq!(args.iter().filter(|a| *a == "--add-seccomp-fd").count(), 2);
        assert!(!args.iter().any(|a| a == "--setenv"), "{args:?}");
        assert!(!args.iter().any(|a| a == "--as-pid-1"), "{args:?}");
        // A background command's sandbox outlives its exec.
        let bg: Vec<String> = b
            .args(
                Path::new("/srv/project"),
                &[],
                Life::Background { info_fd: 9 },
            )
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert!(!bg.iter().any(|a| a == "--die-with-parent"), "{bg:?}");
        let info = bg.iter().position(|a| a == "--info-fd").unwrap();
        assert_eq!(bg[info + 1], "9");
        assert!(bg.iter().any(|a| a == "--as-pid-1"), "{bg:?}");
    }
}
