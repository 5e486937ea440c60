//! A real OpenSSH server for the tests: a container of the sshd image
//! (`HERMES_TEST_SSHD_IMAGE`, built by `scripts/test`) on an internal
//! Docker network of the test's own (no route out), reached from the host
//! at the container's address on that bridge. Its host keys are made when
//! it starts; the test's user `hermes` logs in with a key made for the
//! test. Everything is removed when the value is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::docker_cli::docker;

/// The environment variable naming the sshd image.
pub const SSHD_IMAGE_ENV: &str = "HERMES_TEST_SSHD_IMAGE";

/// The tag `scripts/test` gives the sshd image.
pub const DEFAULT_SSHD_IMAGE: &str = "hermes-test-sshd:bookworm-1";

/// The user the tests log in as.
pub const USER: &str = "hermes";

/// The sshd log inside the container.
const LOG: &str = "/var/log/sshd.log";

/// Sets up the user and the server, then keeps the container alive; sshd
/// itself is started (and restarted) with `docker exec`, so that killing
/// it does not end the container.
const SETUP: &str = r#"set -e
useradd -m -s /bin/bash hermes
usermod -p '*' hermes
mkdir -p /home/hermes/.ssh /run/sshd
printf '%s\n' "$HERMES_TEST_AUTHORIZED_KEY" > /home/hermes/.ssh/authorized_keys
chown -R hermes:hermes /home/hermes/.ssh
chmod 700 /home/hermes/.ssh
chmod 600 /home/hermes/.ssh/authorized_keys
ssh-keygen -q -A
printf 'PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nLogLevel VERBOSE\nMaxSessions 64\nMaxStartups 64\n' > /etc/ssh/sshd_config.d/hermes-test.conf
touch /var/log/sshd.log
echo ready
exec sleep infinity
"#;

/// A running sshd in a container of its own.
#[derive(Debug)]
pub struct Sshd {
    pub container: String,
    pub network: String,
    /// The container's address on the test's network.
    pub host: String,
    pub port: u16,
    /// The private key that logs in as [`USER`].
    pub key: PathBuf,
    _keys: tempfile::TempDir,
}

/// The image the sshd runs from.
pub fn sshd_image() -> String {
    std::env::var(SSHD_IMAGE_ENV)
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| DEFAULT_SSHD_IMAGE.to_owned())
}

impl Sshd {
    /// Starts the server and waits until it takes logins.
    ///
    /// # Panics
    ///
    /// When the image is missing or the server does not come up in 30 s.
    pub fn start() -> Sshd {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "hermes-test-sshd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let key = keys.path().join("id_ed25519");
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "hermes-test", "-f"])
            .arg(&key));
        let public = std::fs::read_to_string(key.with_extension("pub"))
            .unwrap_or_else(|e| panic!("reading the public key: {e}"));
        docker(&["network", "create", "--internal", &name]);
        let mut sshd = Sshd {
            container: name.clone(),
            network: name.clone(),
            host: String::new(),
            port: 22,
            key,
            _keys: keys,
        };
        docker(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &name,
            "--label",
            "hermes-test=sshd",
            "-e",
            &format!("HERMES_TEST_AUTHORIZED_KEY={}", public.trim()),
            &sshd_image(),
            "sh",
            "-c",
            SETUP,
        ]);
        sshd.host = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &name,
        ])
        .trim()
        .to_string();
        assert!(!sshd.host.is_empty(), "the sshd container has no address");
        sshd.wait_for(|s| docker(&["logs", &s.container]).contains("ready"));
        sshd.start_server();
        sshd
    }

    /// Starts sshd inside the container and waits until it listens.
    fn start_server(&self) {
        docker(&[
            "exec",
            "-d",
            &self.container,
            "/usr/sbin/sshd",
            "-D",
            "-E",
            LOG,
        ]);
        self.wait_for(|s| {
            std::net::TcpStream::connect_timeout(
                &format!("{}:{}", s.host, s.port)
                    .parse()
                    .unwrap_or_else(|e| panic!("address: {e}")),
                Duration::from_secs(1),
            )
            .is_ok()
        });
    }

    /// Polls `ready` every 100 ms for at most 30 s.
    fn wait_for(&self, ready: impl Fn(&Sshd) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if ready(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "sshd in {} did not come up within 30s; log:\n{}",
            self.container,
            self.log()
        );
    }

    /// Kills every sshd process (the listener and every connection's), so
    /// every open connection drops, then starts the server again.
    pub fn restart(&self) {
        docker(&["exec", &self.container, "pkill", "-KILL", "-x", "sshd"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && self.exec_ok(&["pgrep", "-x", "sshd"]) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.start_server();
    }

    /// Gives the server new host keys (as a reinstalled or impersonated
    /// host would have) and restarts it.
    pub fn change_host_keys(&self) {
        docker(&[
            "exec",
            &self.container,
            "sh",
            "-c",
            "rm -f /etc/ssh/ssh_host_* && ssh-keygen -q -A",
        ]);
        self.restart();
    }

    /// The server's ed25519 host key fingerprint, as `SHA256:…`.
    pub fn host_key_fingerprint(&self) -> String {
        let out = docker(&[
            "exec",
            &self.container,
            "ssh-keygen",
            "-l",
            "-f",
            "/etc/ssh/ssh_host_ed25519_key.pub",
        ]);
        out.split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("ssh-keygen -l said {out:?}"))
            .to_string()
    }

    /// The server's log.
    pub fn log(&self) -> String {
        Command::new("docker")
            .args(["exec", &self.container, "cat", LOG])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// How many logins the server accepted.
    pub fn logins(&self) -> usize {
        self.log().matches("Accepted publickey for hermes").count()
    }

    /// Runs a command in the container as root (the tests' witness),
    /// returning its stdout.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut all = vec!["exec", self.container.as_str()];
        all.extend_from_slice(args);
        docker(&all)
    }

    fn exec_ok(&self, args: &[&str]) -> bool {
        Command::new("docker")
            .args(["exec", &self.container])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// A config.yaml for the ssh backend on this server, with `extra`
    /// lines appended under `terminal:`.
    pub fn config(&self, extra: &str) -> String {
        format!(
            "terminal:\n  backend: ssh\n  ssh_host: {}\n  ssh_port: {}\n  ssh_user: {USER}\n  ssh_key: {}\n{extra}",
            self.host,
            self.port,
            self.key.display()
        )
    }

    pub fn key_path(&self) -> &Path {
        &self.key
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// Runs a command that must succeed.
fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
