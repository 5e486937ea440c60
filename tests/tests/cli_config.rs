//! `hermes config` end to end: the real binary on real files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use hermes_tests::cli::TestHome;

const COMMENTED: &str = "\
# My hermes setup.
terminal:
  # Local until the image is ready.
  backend: local   # see README

  timeout: 300

# Egress stays off for now.
proxy:
  enabled: false
";

#[test]
fn set_then_get_changes_the_value_and_keeps_every_comment() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    let set = home.run(["config", "set", "terminal.backend", "docker"]);
    assert_eq!(set.code, 0, "{set:?}");
    let get = home.run(["config", "get", "terminal.backend"]);
    assert_eq!((get.code, get.stdout.as_str()), (0, "docker\n"));
    assert_eq!(
        home.read_config(),
        COMMENTED.replace(
            "backend: local   # see README",
            "backend: docker   # see README"
        )
    );
}

#[test]
fn set_and_unset_of_a_new_key_round_trip_to_the_same_bytes() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    assert_eq!(
        home.run(["config", "set", "terminal.docker_volumes", "[/srv:/srv:ro]"])
            .code,
        0
    );
    assert!(
        home.read_config()
            .contains("  docker_volumes:\n    - /srv:/srv:ro\n")
    );
    let get = home.run(["config", "get", "terminal.docker_volumes", "--json"]);
    assert_eq!(get.stdout.trim(), "[\n  \"/srv:/srv:ro\"\n]");
    assert_eq!(
        home.run(["config", "unset", "terminal.docker_volumes"])
            .code,
        0
    );
    assert_eq!(home.read_config(), COMMENTED);
}

#[test]
fn set_writes_the_file_0600_and_leaves_no_temporary_file() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    std::fs::set_permissions(home.config_path(), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(home.run(["config", "set", "proxy.enabled", "yes"]).code, 0);
    let mode = std::fs::metadata(home.config_path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    // config.yaml may hold docker_env values: owner only, whatever it was.
    assert_eq!(mode, 0o600);
    let names: Vec<_> = std::fs::read_dir(home.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["config.yaml"]);
    assert_eq!(
        home.run(["config", "get", "proxy.enabled"]).stdout,
        "true\n"
    );
}

#[test]
fn a_value_that_breaks_the_key_is_refused_and_the_file_kept() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    let run = home.run(["config", "set", "terminal.timeout", "-5"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("terminal.timeout: must be at least 1"),
        "{}",
        run.stderr
    );
    assert_eq!(home.read_config(), COMMENTED);
}

#[test]
fn replacing_a_section_needs_force() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    let run = home.run(["config", "set", "proxy", "off"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert_eq!(home.read_config(), COMMENTED);
}

#[test]
fn a_misspelt_key_or_section_is_refused_with_a_suggestion_unless_forced() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    for (key, said) in [
        ("terminal.backnd", "did you mean `terminal.backend`?"),
        ("termnal.backend", "did you mean `terminal.backend`?"),
        ("proxxy.enabled", "did you mean `proxy.enabled`?"),
        ("nosuchsection.x", "unknown section `nosuchsection`"),
    ] {
        let run = home.run(["config", "set", key, "docker"]);
        assert_eq!(run.code, 1, "{key}: {run:?}");
        assert!(run.stderr.contains(said), "{key}: {}", run.stderr);
        assert!(run.stderr.contains("--force"), "{key}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{key}: {run:?}");
        assert_eq!(home.read_config(), COMMENTED, "{key}");
    }
    // Hermes Agent's own sections and keys are saved without a word.
    for key in ["model.default", "terminal.persistent_shell", "display.skin"] {
        let run = home.run(["config", "set", key, "x"]);
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{key}: {run:?}");
    }
    // --force saves a misspelt key, with the warning; `config check` then
    // names it with its line.
    let run = home.run(["config", "set", "--force", "terminal.backnd", "docker"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("did you mean `terminal.backend`?"),
        "{}",
        run.stderr
    );
    assert_eq!(
        home.run(["config", "get", "terminal.backnd"]).stdout,
        "docker\n"
    );
    let check = home.run(["config", "check"]);
    assert_eq!(check.code, 0);
    assert!(
        check.stderr.contains("terminal.backnd: unknown key"),
        "{}",
        check.stderr
    );
}

#[test]
fn unset_of_a_section_s_last_key_leaves_no_empty_section() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    assert_eq!(
        home.run(["config", "set", "reconcile.resync_seconds", "60"])
            .code,
        0
    );
    let run = home.run(["config", "unset", "reconcile.resync_seconds"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(home.read_config(), COMMENTED);
}

#[test]
fn credential_keys_go_to_a_0600_env_file_and_never_to_stdout() {
    let home = TestHome::new();
    let run = home.run(["config", "set", "OPENROUTER_API_KEY", "sk-or-secret-value"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        !run.stdout.contains("sk-or-secret-value") && !run.stderr.contains("sk-or-secret-value")
    );
    let env = home.path().join(".env");
    assert_eq!(
        std::fs::read_to_string(&env).unwrap(),
        "OPENROUTER_API_KEY=sk-or-secret-value\n"
    );
    assert_eq!(
        std::fs::metadata(&env).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!home.config_path().exists());
    assert_eq!(home.run(["config", "unset", "OPENROUTER_API_KEY"]).code, 0);
    assert_eq!(std::fs::read_to_string(&env).unwrap(), "");
}

#[test]
fn every_secret_family_goes_to_the_env_file_not_to_config_yaml() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    let names = [
        // The cloud backends' credentials.
        "MODAL_TOKEN_ID",
        "MODAL_TOKEN_SECRET",
        "DAYTONA_API_KEY",
        "VERCEL_TOKEN",
        "VERCEL_PROJECT_ID",
        "VERCEL_TEAM_ID",
        // AWS's.
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        // Anything named like a secret.
        "STRIPE_API_KEY",
        "GITHUB_TOKEN",
        "CLIENT_SECRET",
        "DB_PASSWORD",
    ];
    for (i, name) in names.iter().enumerate() {
        let value = format!("value-{i}-never-printed");
        let run = home.run(["config", "set", name, &value]);
        assert_eq!(run.code, 0, "{name}: {run:?}");
        assert!(run.stdout.contains(".env (0600)"), "{name}: {run:?}");
        assert!(
            !run.stdout.contains(&value) && !run.stderr.contains(&value),
            "{name}: {run:?}"
        );
    }
    let env = std::fs::read_to_string(home.path().join(".env")).unwrap();
    for (i, name) in names.iter().enumerate() {
        assert!(
            env.contains(&format!("{name}=value-{i}-never-printed\n")),
            "{name}: {env}"
        );
    }
    assert_eq!(
        std::fs::metadata(home.path().join(".env"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(home.read_config(), COMMENTED);
    for name in names {
        assert_eq!(home.run(["config", "unset", name]).code, 0, "{name}");
    }
    assert_eq!(
        std::fs::read_to_string(home.path().join(".env")).unwrap(),
        ""
    );
}

#[test]
fn get_of_a_key_that_is_not_set_exits_1() {
    let home = TestHome::new();
    let run = home.run(["config", "get", "terminal.ssh_host"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.stderr, "Config key not set: terminal.ssh_host\n");
    assert_eq!(home.run(["config", "get", "terminal.nothing"]).code, 1);
}

#[test]
fn show_prints_the_merged_config() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: docker\n");
    let yaml = home.run(["config", "show"]);
    assert!(
        yaml.stdout.starts_with(
            "terminal:\n  backend: docker\n  modal_mode: auto\n  cwd: .\n  timeout: 180\n"
        ),
        "{}",
        yaml.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&home.run(["config", "show", "--json"]).stdout).unwrap();
    assert_eq!(json["terminal"]["backend"], "docker");
    assert_eq!(json["proxy"]["tunnel_port"], 9090);
    assert_eq!(json["security"]["redact_secrets"], true);
}

#[test]
fn path_and_env_path_name_files_in_the_home() {
    let home = TestHome::new();
    assert_eq!(
        home.run(["config", "path"]).stdout.trim(),
        home.config_path().to_str().unwrap()
    );
    assert_eq!(
        home.run(["config", "env-path"]).stdout.trim(),
        home.path().join(".env").to_str().unwrap()
    );
    let via_env = home
        .command(["config", "path"])
        .env("HERMES_HOME", "/nonexistent/elsewhere")
        .output()
        .unwrap();
    // --home wins over HERMES_HOME.
    assert_eq!(
        String::from_utf8_lossy(&via_env.stdout).trim(),
        home.config_path().to_str().unwrap()
    );
}

#[test]
fn check_exits_1_on_every_malformed_fixture_naming_key_and_line() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/invalid-configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 30);
    for file in files {
        let home = TestHome::new();
        let bytes = std::fs::read(&file).unwrap();
        home.write_config(&bytes);
        let first = bytes.split(|&b| b == b'\n').next().unwrap();
        let expect = std::str::from_utf8(first)
            .unwrap()
            .strip_prefix("# expect: ")
            .unwrap();
        let (loc, rest) = expect.split_once(' ').unwrap_or((expect, ""));
        let needle = if loc.starts_with(|c: char| c.is_ascii_digit()) {
            let loc = loc.trim_end_matches(':');
            let prefix = format!("{}:{loc}", home.config_path().display());
            if rest.is_empty() {
                prefix
            } else {
                format!("{prefix}: {rest}")
            }
        } else {
            expect.to_string()
        };
        let run = home.run(["config", "check"]);
        assert_eq!(run.code, 1, "{}: {run:?}", file.display());
        assert!(
            run.stderr.contains(&needle),
            "{}:\nwanted: {needle}\ngot: {}",
            file.display(),
            run.stderr
        );
        // The config was not touched.
        assert_eq!(std::fs::read(home.config_path()).unwrap(), bytes);
    }
}

#[test]
fn check_on_a_missing_file_says_defaults_apply() {
    let home = TestHome::new();
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("built-in defaults"), "{}", run.stdout);
}

#[test]
fn check_of_a_cloud_backend_wants_its_credential_from_the_environment_or_dotenv() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: daytona\n  container_disk: 4096\n");
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(
            "config.yaml:2:12: terminal.backend: DAYTONA_API_KEY is not set: the daytona backend needs it"
        ),
        "{}",
        run.stderr
    );
    let run: hermes_tests::cli::Run = home
        .command(["config", "check"])
        .env("DAYTONA_API_KEY", "dtn-test")
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 0, "{run:?}");
    std::fs::write(home.path().join(".env"), "DAYTONA_API_KEY=dtn-test\n").unwrap();
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stdout.contains("dtn-test") && !run.stderr.contains("dtn-test"));
}

#[test]
fn keys_holding_dots_round_trip_through_set_get_and_unset() {
    let home = TestHome::new();
    home.write_config(COMMENTED);
    let key = "proxy.resolve.\"api.openai.com\"";
    let set = home.run(["config", "set", key, "203.0.113.7"]);
    assert_eq!(set.code, 0, "{set:?}");
    // A known key: no "unknown key" warning for a host of proxy.resolve.
    assert_eq!(set.stderr, "", "{set:?}");
    assert!(
        set.stdout.starts_with(&format!("Set {key} = 203.0.113.7")),
        "{set:?}"
    );
    assert!(
        home.read_config()
            .ends_with("  enabled: false\n  resolve:\n    api.openai.com: 203.0.113.7\n"),
        "{}",
        home.read_config()
    );
    let get = home.run(["config", "get", key]);
    assert_eq!(
        (get.code, get.stdout.as_str()),
        (0, "203.0.113.7\n"),
        "{get:?}"
    );
    let json = home.run(["config", "get", "proxy.resolve", "--output", "json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json.stdout).unwrap(),
        serde_json::json!({"api.openai.com": "203.0.113.7"})
    );
    // Unquoted, the dots separate keys: not that host.
    let plain = home.run(["config", "get", "proxy.resolve.api.openai.com"]);
    assert_eq!(plain.code, 1, "{plain:?}");
    // An error about the entry names it the way set takes it.
    let bad = home.run(["config", "set", "proxy.resolve.\"b.example\"", "not-an-ip"]);
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(
        bad.stderr
            .contains("proxy.resolve.\"b.example\": expected an IP address"),
        "{}",
        bad.stderr
    );
    let unset = home.run(["config", "unset", key]);
    assert_eq!(unset.code, 0, "{unset:?}");
    // The emptied `resolve:` goes with its last host.
    assert_eq!(home.read_config(), COMMENTED);
    assert_eq!(home.run(["config", "get", key]).code, 1);
    let malformed = home.run(["config", "get", "proxy.resolve.\"api"]);
    assert_eq!(malformed.code, 1, "{malformed:?}");
    assert!(
        malformed.stderr.contains("not closed"),
        "{}",
        malformed.stderr
    );
}

#[test]
fn a_value_that_makes_the_file_invalid_elsewhere_is_refused() {
    // A GITHUB_TOKEN in docker_env is a warning without the proxy and an
    // error once it is enforced: turning the proxy on breaks the file.
    let text = "terminal:\n  backend: docker\n  docker_env:\n    GITHUB_TOKEN: x\n";
    let home = TestHome::new();
    home.write_config(text);
    let run = home.run(["config", "set", "proxy.enabled", "true"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("error: setting proxy.enabled: terminal.docker_env.GITHUB_TOKEN:"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("was left unchanged"), "{}", run.stderr);
    assert_eq!(home.read_config(), text);
    // An error the file had already does not block another key.
    let broken = "terminal:\n  timeout: -1\n";
    home.write_config(broken);
    let other = home.run(["config", "set", "terminal.backend", "docker"]);
    assert_eq!(other.code, 0, "{other:?}");
    assert!(other.stderr.contains("warning:"), "{}", other.stderr);
}

#[test]
fn get_of_a_null_value_prints_null_as_json_and_says_not_set_otherwise() {
    let home = TestHome::new();
    for flag in ["--json", "--output=json"] {
        let json = home.run(["config", "get", "terminal.ssh_host", flag]);
        assert_eq!((json.code, json.stdout.as_str()), (0, "null\n"), "{json:?}");
    }
    let show: serde_json::Value =
        serde_json::from_str(&home.run(["config", "show", "--output", "json"]).stdout).unwrap();
    assert_eq!(show["terminal"]["ssh_host"], serde_json::Value::Null);
    let text = home.run(["config", "get", "terminal.ssh_host"]);
    assert_eq!(
        (text.code, text.stdout.as_str(), text.stderr.as_str()),
        (1, "", "Config key not set: terminal.ssh_host\n")
    );
    // A key that is not there at all is not set in either form; in JSON
    // the error is a document (docs/json.md).
    let absent = home.run(["config", "get", "terminal.nothing", "--json"]);
    assert_eq!(absent.code, 1, "{absent:?}");
    let error: serde_json::Value = serde_json::from_str(&absent.stdout).unwrap();
    assert_eq!(
        error["error"]["message"],
        "config key not set: terminal.nothing"
    );
}

#[test]
fn check_warns_about_a_resolve_entry_into_the_deny_list() {
    let home = TestHome::new();
    home.write_config(
        "proxy:\n  resolve:\n    api.openai.com: 10.1.2.3\n    api.anthropic.com: 203.0.113.7\n",
    );
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains(
            "config.yaml:3:21: proxy.resolve.\"api.openai.com\": 10.1.2.3 lies in 10.0.0.0/8 \
             of the built-in upstream deny list: every request to api.openai.com would be refused"
        ),
        "{run:?}"
    );
    assert!(!run.stderr.contains("anthropic"), "{run:?}");
    assert!(run.stdout.contains("is valid (1 warning)"), "{run:?}");
    // A deny list that leaves the range out: no warning.
    home.write_config(
        "proxy:\n  upstream_deny_cidrs: [169.254.0.0/16]\n  resolve:\n    api.openai.com: 10.1.2.3\n",
    );
    let run = home.run(["config", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("deny"), "{run:?}");
}
