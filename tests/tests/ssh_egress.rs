//! Egress over SSH, end to end: with the proxy enabled, a command on the
//! SSH host reaches an allowlisted provider (`api.openai.com`, resolved by
//! `proxy.resolve` to a TLS upstream of the test's own on this host's
//! loopback) through the proxy's tunnel port, forwarded from the remote's
//! own `127.0.0.1` over the held connection; the upstream receives the
//! real key while the remote holds only the proxy token and has no other
//! route out. The proxy not ready refuses the command (exit 3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::egress::{bridge_gateway, free_port_pair};
use hermes_tests::sshd::Sshd;
use hermes_tests::upstream::Upstream;

const OPENAI_KEY: &str = "sk-e2e-REAL-openai-over-ssh-0001";

/// Stops a home's proxy however the test ends.
struct Guard<'a>(&'a TestHome);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(["egress", "stop"]);
    }
}

fn hermes(home: &TestHome, args: &[&str]) -> Run {
    home.command(args)
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .output()
        .unwrap()
        .into()
}

#[test]
fn commands_on_the_ssh_host_reach_providers_through_the_tunnel_with_only_a_token() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["api.openai.com"]);
    let sshd = Sshd::start();
    let home = TestHome::new();
    let _stop = Guard(&home);
    let upstream_ca = home.path().join("upstream-ca.pem");
    std::fs::write(&upstream_ca, &upstream.ca_pem).unwrap();
    let port = free_port_pair(Some(bridge_gateway()));
    // Redaction off: the upstream's echo shows the real key arrived, and
    // its absence on the remote owes nothing to masking.
    home.write_config(format!(
        "{}proxy:\n  enabled: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    api.openai.com: 127.0.0.1\nsecurity:\n  redact_secrets: false\n",
        sshd.config(""),
        upstream_ca.display()
    ));

    // Not set up yet: fail closed, nothing runs.
    let refused = hermes(&home, &["exec", "--", "touch", "ran"]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(refused.stderr.contains("(fail closed)"), "{refused:?}");
    let dry = hermes(&home, &["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "! ssh hermes@{}   blocked     egress proxy not set up",
            sshd.host
        )),
        "{dry:?}"
    );

    // reconcile sets the proxy up, starts it, then prepares the host.
    let applied = hermes(&home, &["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        applied.stdout.contains("The host is converged."),
        "{applied:?}"
    );
    let token = {
        let text = std::fs::read_to_string(home.path().join("proxy/tokens.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["tokens"]["openai"].as_str().unwrap().to_string()
    };
    assert!(token.starts_with("openai-"), "{token}");

    // curl on the remote, through the forwarded tunnel port.
    let script = format!(
        "curl -sS --max-time 20 https://api.openai.com:{}/echo -H \"Authorization: Bearer $OPENAI_API_KEY\"",
        upstream.addr.port()
    );
    let run = hermes(&home, &["exec", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    let echo: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {OPENAI_KEY}"),
        "{echo}"
    );

    // The remote's environment: the token, the proxy at its loopback, the
    // CA copied beside the workspace; never the real key.
    let env = hermes(&home, &["exec", "--", "printenv"]);
    assert_eq!(env.code, 0, "{env:?}");
    assert!(
        env.stdout.contains(&format!("OPENAI_API_KEY={token}\n")),
        "{}",
        env.stdout
    );
    assert!(
        env.stdout
            .contains(&format!("HTTPS_PROXY=http://127.0.0.1:{port}\n")),
        "{}",
        env.stdout
    );
    let ca = "/home/hermes/.hermes-sandbox/default/default/hermes-egress-ca.crt";
    assert!(
        env.stdout.contains(&format!("CURL_CA_BUNDLE={ca}\n")),
        "{}",
        env.stdout
    );
    assert!(!env.stdout.contains(OPENAI_KEY), "{}", env.stdout);
    let copied = sshd.exec(&["cat", ca]);
    let local = std::fs::read_to_string(home.path().join("proxy/ca.crt")).unwrap();
    assert_eq!(copied, local);
    // Nowhere on the remote: not in any file of the user, not in any
    // process's environment.
    let grep = sshd.exec(&[
        "sh",
        "-c",
        &format!("grep -rls -- '{OPENAI_KEY}' /home /tmp /proc/[0-9]*/environ 2>/dev/null; true"),
    ]);
    assert_eq!(grep.trim(), "", "the real key is on the remote: {grep}");

    // No other route out: the remote's only network is an internal one
    // (the engine drops whatever it would send beyond the bridge).
    let networks = hermes_tests::docker_cli::docker(&[
        "inspect",
        "-f",
        "{{range $name, $n := .NetworkSettings.Networks}}{{$name}} {{end}}",
        &sshd.container,
    ]);
    assert_eq!(networks.trim(), sshd.network);
    let internal = hermes_tests::docker_cli::docker(&[
        "network",
        "inspect",
        "-f",
        "{{.Internal}}",
        &sshd.network,
    ]);
    assert_eq!(internal.trim(), "true");

    // The proxy stopped: fail closed again.
    let stop = hermes(&home, &["egress", "stop"]);
    assert_eq!(stop.code, 0, "{stop:?}");
    let refused = hermes(&home, &["exec", "--", "true"]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(refused.stderr.contains("not running"), "{refused:?}");
}
