//! `hermes egress` commands through the real binary: the files and their
//! modes, the daemon's pid file, start/stop, status and its warnings.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use hermes_tests::egress::Proxy;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// Whether `pid` runs (a zombie waiting for its reaper does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn setup_writes_the_files_with_their_modes_and_is_idempotent() {
    let proxy = Proxy::setup("");
    let dir = proxy.dir();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("ca.crt")), 0o644);
    for secret in ["ca.key", "tokens.json", "mappings.json", "config.json"] {
        assert_eq!(mode(&dir.join(secret)), 0o600, "{secret}");
    }
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let tokens = std::fs::read(dir.join("tokens.json")).unwrap();
    let again = proxy.hermes(&["egress", "setup"], &[]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("(kept)"), "{}", again.stdout);
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca);
    assert_eq!(std::fs::read(dir.join("tokens.json")).unwrap(), tokens);
    let token = proxy.token("openrouter");
    assert!(token.starts_with("openrouter-") && token.len() == "openrouter-".len() + 32);
}

#[test]
fn start_refuses_a_second_daemon_and_stop_ends_it() {
    let mut proxy = Proxy::setup("");
    proxy.start(&[]);
    let pid: i32 = std::fs::read_to_string(proxy.dir().join("proxy.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(mode(&proxy.dir().join("proxy.pid")), 0o600);
    assert_eq!(mode(&proxy.dir().join("proxy.log")), 0o600);
    let twice = proxy.hermes(&["egress", "start"], &[]);
    assert_eq!(twice.code, 1, "{twice:?}");
    assert!(twice.stderr.contains("already running"), "{twice:?}");
    // A second foreground serve is refused by the pid file itself.
    let serve = proxy.hermes(&["egress", "serve"], &[]);
    assert_eq!(serve.code, 1, "{serve:?}");
    assert!(serve.stderr.contains("already running"), "{serve:?}");

    let stop = proxy.hermes(&["egress", "stop"], &[]);
    assert_eq!(stop.code, 0, "{stop:?}");
    assert!(stop.stdout.contains("stopped"), "{stop:?}");
    assert!(!alive(pid), "pid {pid} still runs");
    assert!(!proxy.dir().join("proxy.pid").exists());
    let again = proxy.hermes(&["egress", "stop"], &[]);
    assert!(again.stdout.contains("not running"), "{again:?}");
}

#[test]
fn a_pid_file_planted_as_a_symlink_is_never_followed() {
    let proxy = Proxy::setup("");
    let victim = proxy.home.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, proxy.dir().join("proxy.pid")).unwrap();
    let serve = proxy.hermes(&["egress", "serve"], &[]);
    assert_eq!(serve.code, 1, "{serve:?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let start = proxy.hermes(&["egress", "start"], &[]);
    assert_eq!(start.code, 1, "{start:?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn a_stale_pid_file_does_not_stop_a_start() {
    let mut proxy = Proxy::setup("");
    // A pid that is no proxy: this test's own.
    std::fs::write(
        proxy.dir().join("proxy.pid"),
        format!("{}\n", std::process::id()),
    )
    .unwrap();
    proxy.start(&[]);
    let pid = std::fs::read_to_string(proxy.dir().join("proxy.pid")).unwrap();
    assert_ne!(pid.trim(), std::process::id().to_string());
}

#[test]
fn start_without_setup_fails_and_a_failed_start_shows_the_log() {
    let home = hermes_tests::cli::TestHome::new();
    let run = home.run(["egress", "start"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("hermes egress setup"), "{run:?}");

    // The tunnel port taken: the daemon cannot bind and start says why.
    let mut proxy = Proxy::setup("  listen: [127.0.0.1]\n");
    let _taken = std::net::TcpListener::bind(("127.0.0.1", proxy.port)).unwrap();
    let start = proxy.hermes(&["egress", "start"], &[]);
    assert_eq!(start.code, 1, "{start:?}");
    assert!(start.stderr.contains("cannot listen on"), "{start:?}");
    assert!(!proxy.dir().join("proxy.pid").exists());
    proxy.port = 0;
}

#[test]
fn status_reports_masked_tokens_keys_listening_and_uncovered_credentials() {
    let mut proxy = Proxy::setup("");
    let env = [
        ("OPENAI_API_KEY", "sk-status-REAL"),
        ("AWS_ACCESS_KEY_ID", "AKIA-status"),
    ];
    let before = proxy.hermes(&["egress", "status", "--output", "json"], &env);
    assert_eq!(before.code, 0, "{before:?}");
    let json: serde_json::Value = serde_json::from_str(&before.stdout).unwrap();
    assert_eq!(json["running"], false);
    assert_eq!(json["listening"], serde_json::json!([]));
    proxy.start(&env);
    let status = proxy.hermes(&["egress", "status", "--output", "json"], &env);
    let json: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    for field in [
        "enabled",
        "binary",
        "binary_version",
        "config",
        "ca_cert",
        "tunnel_port",
        "process",
        "listening",
        "credential_source",
        "docker_enforce",
    ] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    assert_eq!(json["running"], true);
    assert!(
        json["listening"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == &format!("127.0.0.1:{}", proxy.port)),
        "{json}"
    );
    assert_eq!(json["process"]["state"], "running", "{json}");
    assert!(json["process"]["pid"].is_u64(), "{json}");
    assert_eq!(json["tunnel_port"], proxy.port);
    assert!(json["counters"]["requests"].is_u64(), "{json}");
    let openai = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["provider"] == "openai")
        .unwrap();
    let full = proxy.token("openai");
    assert_eq!(openai["key"], "OPENAI_API_KEY");
    assert!(openai["token"].as_str().unwrap().ends_with('…'));
    assert!(!status.stdout.contains(&full));
    assert!(!status.stdout.contains("sk-status-REAL"));
    // Every credential is covered: none to warn of.
    assert!(
        !json["warnings"].as_array().is_some_and(|w| w
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("AWS_")))),
        "{json}"
    );

    let shown = proxy.hermes(&["egress", "status", "--show-tokens", "--all"], &env);
    assert!(shown.stdout.contains(&full), "{}", shown.stdout);
    assert!(
        shown.stdout.contains("Process:         running"),
        "{}",
        shown.stdout
    );
    assert!(!shown.stdout.contains("warning: AWS_"), "{}", shown.stdout);
    // Per credential, how it is covered: text and JSON.
    let credential = |name: &str, coverage: &str| {
        json["credentials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["credential"] == name && r["coverage"] == coverage)
            .unwrap_or_else(|| panic!("no {coverage} row for {name}: {json}"))
            .clone()
    };
    assert_eq!(
        credential("OPENAI_API_KEY", "header-swap")["detail"],
        "authorization: Bearer"
    );
    assert_eq!(
        credential("OPENAI_API_KEY", "header-swap")["provider"],
        "openai"
    );
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        assert_eq!(credential(name, "sigv4-resign")["provider"], "aws");
    }
    let line = |name: &str| -> Vec<String> {
        shown
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{}", shown.stdout))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert!(
        shown
            .stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["CREDENTIAL", "PROVIDER", "COVERAGE", "DETAIL"]),
        "{}",
        shown.stdout
    );
    assert_eq!(
        line("ANTHROPIC_API_KEY")[..5],
        [
            "ANTHROPIC_API_KEY",
            "anthropic",
            "header",
            "swap",
            "x-api-key,"
        ]
    );
    assert_eq!(
        line("GOOGLE_APPLICATION_CREDENTIALS")[..3],
        ["GOOGLE_APPLICATION_CREDENTIALS", "gcp", "OAuth"]
    );
    assert_eq!(
        line("AWS_ACCESS_KEY_ID")[..4],
        ["AWS_ACCESS_KEY_ID", "aws", "SigV4", "re-sign"]
    );
    // The text shows every counter the JSON has.
    for name in json["counters"].as_object().unwrap().keys() {
        assert!(
            shown
                .stdout
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{name} "))),
            "{name} missing: {}",
            shown.stdout
        );
    }
}

#[test]
fn the_management_endpoint_wants_its_bearer_token() {
    let mut proxy = Proxy::setup("");
    proxy.start(&[]);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.dir().join("state.json")).unwrap())
            .unwrap();
    let mgmt = state["mgmt"].as_str().unwrap();
    assert!(mgmt.starts_with("127.0.0.1:"), "{mgmt}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.dir().join("config.json")).unwrap())
            .unwrap();
    let token = config["mgmt_token"].as_str().unwrap();
    let curl = |auth: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "--max-time", "5", "-H", auth])
            .arg(format!("http://{mgmt}/health"))
            .args(["-w", "\n%{http_code}"])
            .env_remove("http_proxy")
            .env_remove("HTTP_PROXY")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(curl("X-None: 1").ends_with("\n401"));
    assert!(curl("Authorization: Bearer wrong").ends_with("\n401"));
    let ok = curl(&format!("Authorization: Bearer {token}"));
    assert!(ok.ends_with("\n200"), "{ok}");
    assert!(ok.contains(r#""status":"ok""#), "{ok}");
}

#[test]
fn install_reports_the_binary_and_its_version() {
    let home = hermes_tests::cli::TestHome::new();
    let run = home.run(["egress", "install"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("Binary version: "), "{}", run.stdout);
    assert!(
        run.stdout.contains("built into this binary"),
        "{}",
        run.stdout
    );
}

/// The pid of the running proxy, if one runs.
fn proxy_pid(proxy: &Proxy) -> Option<i32> {
    std::fs::read_to_string(proxy.dir().join("proxy.pid"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|&pid| alive(pid))
}

/// `egress start` while `proxy.enabled` is false and `egress stop` while it
/// is true say that the next pass undoes them, and the next pass does.
#[test]
fn start_stop_and_config_check_say_when_the_next_pass_undoes_them() {
    // Proxy::setup leaves proxy.enabled at its default, false; a local
    // backend keeps the pass to the proxy.
    let mut proxy = Proxy::setup("");
    let text = proxy.home.read_config();
    proxy
        .home
        .write_config(format!("terminal:\n  backend: local\n{text}"));
    let reconcile = |proxy: &Proxy| {
        let run = proxy.hermes(&["reconcile"], &[]);
        assert_eq!(run.code, 0, "{run:?}");
    };
    let start = proxy.start_run(&[]);
    assert_eq!(start.code, 0, "{start:?}");
    assert!(
        start.stderr.contains("warning: proxy.enabled is false")
            && start.stderr.contains(
                "the next pass (`hermes reconcile` or a running controller) stops the proxy again"
            ),
        "{start:?}"
    );
    let check = proxy.hermes(&["config", "check"], &[]);
    assert_eq!(check.code, 0, "{check:?}");
    assert!(
        check.stderr.contains("the egress proxy runs (pid ")
            && check.stderr.contains("while proxy.enabled is false"),
        "{check:?}"
    );
    // What the warning said: the next pass stops it.
    let pid = proxy_pid(&proxy).expect("the proxy runs");
    reconcile(&proxy);
    assert!(!alive(pid), "the pass left the disabled proxy running");
    let check = proxy.hermes(&["config", "check"], &[]);
    assert!(!check.stderr.contains("the egress proxy runs"), "{check:?}");

    // Stopping a proxy the config disables: nothing to say.
    let start = proxy.start_run(&[]);
    assert_eq!(start.code, 0, "{start:?}");
    let stop = proxy.hermes(&["egress", "stop"], &[]);
    assert_eq!(stop.code, 0, "{stop:?}");
    assert!(!stop.stderr.contains("warning"), "{stop:?}");

    // Enabled: a start is what the config wants, a stop is undone.
    let text = proxy.home.read_config();
    proxy
        .home
        .write_config(text.replace("proxy:\n", "proxy:\n  enabled: true\n"));
    let start = proxy.start_run(&[]);
    assert_eq!(start.code, 0, "{start:?}");
    assert!(!start.stderr.contains("warning"), "{start:?}");
    let stop = proxy.hermes(&["egress", "stop"], &[]);
    assert_eq!(stop.code, 0, "{stop:?}");
    assert!(
        stop.stderr.contains("warning: proxy.enabled is true")
            && stop.stderr.contains(
                "the next pass (`hermes reconcile` or a running controller) starts the proxy again"
            ),
        "{stop:?}"
    );
    // What the warning said: the next pass starts it.
    assert_eq!(proxy_pid(&proxy), None);
    reconcile(&proxy);
    assert!(
        proxy_pid(&proxy).is_some(),
        "the pass left the proxy stopped"
    );
}

#[test]
fn the_key_column_is_what_the_running_proxy_holds_not_the_callers_environment() {
    let mut proxy = Proxy::setup("");
    let row = |text: &str, provider: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("{provider} ")))
            .unwrap_or_else(|| panic!("no row for {provider}:\n{text}"))
            .to_string()
    };
    // Not running: the column says so, whatever the caller holds.
    let idle = proxy.hermes(
        &["egress", "status"],
        &[("OPENAI_API_KEY", "sk-caller-REAL")],
    );
    assert_eq!(idle.code, 0, "{idle:?}");
    assert!(
        row(&idle.stdout, "openai").ends_with(" proxy not running"),
        "{}",
        idle.stdout
    );
    // The proxy holds the key; the caller's environment has none.
    proxy.start(&[("OPENAI_API_KEY", "sk-proxy-REAL")]);
    let text = proxy.hermes(&["egress", "status"], &[]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        row(&text.stdout, "openai").ends_with(" from OPENAI_API_KEY"),
        "{}",
        text.stdout
    );
    // The caller holds a key the proxy does not: still missing.
    let other = proxy.hermes(
        &["egress", "status"],
        &[("ANTHROPIC_API_KEY", "sk-ant-caller-REAL")],
    );
    assert!(
        row(&other.stdout, "anthropic").ends_with(" missing"),
        "{}",
        other.stdout
    );
    let json = proxy.hermes(&["egress", "status", "--output", "json"], &[]);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let tokens = report["tokens"].as_array().unwrap();
    let openai = tokens.iter().find(|t| t["provider"] == "openai").unwrap();
    assert_eq!(openai["key_loaded"], true, "{openai}");
    assert_eq!(openai["key"], "OPENAI_API_KEY", "{openai}");
    let anthropic = tokens
        .iter()
        .find(|t| t["provider"] == "anthropic")
        .unwrap();
    assert_eq!(anthropic["key_loaded"], false, "{anthropic}");
    // Never the key itself.
    for run in [&text, &other, &json] {
        assert!(!run.stdout.contains("REAL"), "{run:?}");
        assert!(!run.stderr.contains("REAL"), "{run:?}");
    }
}

#[test]
fn a_fresh_home_s_status_fits_a_screen_and_names_what_is_set() {
    let home = hermes_tests::cli::TestHome::new();
    let fresh = home.run(["egress", "status"]);
    assert_eq!(fresh.code, 0, "{fresh:?}");
    assert!(fresh.stdout.lines().count() <= 20, "{}", fresh.stdout);
    assert!(
        fresh.stdout.contains("Tokens:          none yet"),
        "{}",
        fresh.stdout
    );
    assert!(
        !fresh.stdout.contains("SigV4 re-sign (as above)"),
        "{}",
        fresh.stdout
    );
    // A key set in .env is shown with its coverage; --all shows them all.
    std::fs::write(home.path().join(".env"), "ANTHROPIC_API_KEY=sk-ant-test\n").unwrap();
    let set = home.run(["egress", "status"]);
    assert!(
        set.stdout
            .lines()
            .any(|l| l.starts_with("ANTHROPIC_API_KEY ") && l.contains("header swap")),
        "{}",
        set.stdout
    );
    assert!(!set.stdout.contains("OPENAI_API_KEY"), "{}", set.stdout);
    let all = home.run(["egress", "status", "--all"]);
    assert!(all.stdout.contains("OPENAI_API_KEY"), "{}", all.stdout);
    assert!(all.stdout.contains("AWS_SESSION_TOKEN"), "{}", all.stdout);
}
