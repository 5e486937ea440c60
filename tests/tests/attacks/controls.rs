//! The controls around a command: what `hermes exec --env` may set, where
//! the controller's metrics may listen, the modes of the files hermes
//! writes, and what its own logs show.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::ProfileCleanup;
use hermes_tests::egress::{bridge_gateway, free_port_pair};

/// A home on the Docker backend with the egress proxy enabled.
struct ProxiedHome {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl ProxiedHome {
    fn new(tag: &str) -> ProxiedHome {
        let profile = format!("{tag}{}", std::process::id());
        let home = TestHome::with_profile(&profile);
        let port = free_port_pair(Some(bridge_gateway()));
        home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\nproxy:\n  enabled: true\n  tunnel_port: {port}\n",
            hermes_tests::test_image()
        ));
        ProxiedHome {
            home,
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        }
    }

    fn hermes(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        let mut command = self.home.command(all);
        command.env("OPENAI_API_KEY", "sk-attacks-REAL-openai-0001");
        for (k, v) in env {
            command.env(k, v);
        }
        command.output().unwrap().into()
    }

    fn tokens(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.home.path().join("proxy/tokens.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["tokens"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for ProxiedHome {
    fn drop(&mut self) {
        let _ = self.home.run(["egress", "stop"]);
    }
}

/// Finding 9 (Docker): `--env` replaced the proxy variables and the
/// provider tokens without a word. Each such name is refused, naming it,
/// and nothing runs; other names still reach the command.
#[test]
fn exec_env_may_not_replace_the_proxy_variables_or_a_provider_key() {
    let host = ProxiedHome::new("atkenv");
    let up = host.hermes(&["reconcile"], &[]);
    assert_eq!(up.code, 0, "{up:?}");

    for (name, value) in [
        ("HTTPS_PROXY", "http://attacker.invalid:1"),
        ("https_proxy", "http://attacker.invalid:1"),
        ("NODE_EXTRA_CA_CERTS", "/tmp/attacker.pem"),
        ("OPENAI_API_KEY", "sk-attacker-chosen-0001"),
    ] {
        let pair = format!("{name}={value}");
        let run = host.hermes(
            &[
                "exec",
                "--env",
                &pair,
                "--",
                "sh",
                "-c",
                &format!("echo ran:${name}"),
            ],
            &[],
        );
        assert_eq!(run.code, 1, "{name}: {run:?}");
        assert!(
            run.stderr.contains(&format!("--env {name}:")),
            "{name}: {}",
            run.stderr
        );
        assert!(!run.stdout.contains("ran:"), "{name} ran: {run:?}");
    }

    let run = host.hermes(
        &[
            "exec",
            "--env",
            "HERMES_ATTACKS_FREE=mine",
            "--",
            "sh",
            "-c",
            "echo \"$HERMES_ATTACKS_FREE $HTTPS_PROXY\"",
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.starts_with("mine http://"), "{}", run.stdout);
    assert!(!run.stdout.contains("attacker"), "{}", run.stdout);
}

/// Proxy tokens were written in full to `RUST_LOG=trace` output (the
/// sandbox's create body, its environment included).
#[test]
fn trace_logs_never_show_a_proxy_token() {
    let host = ProxiedHome::new("atktrace");
    let run = host.hermes(&["reconcile"], &[("RUST_LOG", "trace")]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let tokens = host.tokens();
    assert!(!tokens.is_empty());
    // The create body was logged: the test looks where a token would be.
    assert!(
        run.stderr.contains("hermes-egress"),
        "no create body in the trace output"
    );
    for token in &tokens {
        assert!(!run.stderr.contains(token.as_str()), "{token} in the logs");
    }
    assert!(!run.stderr.contains("sk-attacks-REAL-openai-0001"));
    // The tokens travel with each command too (the container's env holds
    // them as they were at its create): the command has one, the logs of
    // its exec none.
    let exec = host.hermes(
        &["exec", "--", "printenv", "OPENAI_API_KEY"],
        &[("RUST_LOG", "trace")],
    );
    assert_eq!(exec.code, 0, "{exec:?}");
    assert!(tokens.contains(&exec.stdout.trim().to_string()), "{exec:?}");
    for token in &tokens {
        assert!(!exec.stderr.contains(token.as_str()), "{token} in the logs");
    }
    assert!(!exec.stderr.contains("sk-attacks-REAL-openai-0001"));
}

/// Finding 12: `--metrics-addr 0.0.0.0:…` bound every interface although
/// non-loopback addresses were said to be refused unless asked.
#[test]
fn metrics_refuse_a_non_loopback_address_unless_exposed() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let port = free_port_pair(None);
    let addr = format!("0.0.0.0:{port}");

    let mut child = home
        .command(["controller", "--metrics-addr", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the controller served metrics on {addr}");
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--metrics-expose"), "{stderr}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());

    // Asked for, it serves there.
    let mut child = home
        .command(["controller", "--metrics-addr", &addr, "--metrics-expose"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut served = false;
    while Instant::now() < deadline && !served {
        served = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(served, "nothing served on {addr} with --metrics-expose");
}

/// config.yaml may hold `docker_env` values: it was written 0644, and a
/// home open to other users went unmentioned.
#[test]
fn config_is_written_owner_only_and_an_open_home_is_reported() {
    let home = TestHome::new();
    let set = home.run(["config", "set", "terminal.docker_env.SOME_SETTING", "v"]);
    assert_eq!(set.code, 0, "{set:?}");
    let mode = std::fs::metadata(home.config_path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let check = home.run(["config", "check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert!(!check.stderr.contains("open to other users"), "{check:?}");

    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = home.run(["config", "check"]);
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(
        check.stderr.contains("is open to other users (mode 755)"),
        "{check:?}"
    );
}
