#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn errors(text: &str) -> Vec<Issue> {
    load(text).expect_err("the text should be refused").0
}

#[test]
fn an_empty_text_is_all_defaults() {
    let loaded = load("").unwrap();
    assert!(loaded.empty);
    assert_eq!(loaded.config.terminal.backend, Backend::Local);
    assert_eq!(loaded.config.terminal.timeout_seconds, 180);
    assert_eq!(loaded.config.terminal.docker_shm_size_bytes, 1 << 30);
    assert_eq!(
        loaded.config.terminal.singularity_image,
        "docker://nikolaik/python-nodejs:python3.11-nodejs20"
    );
    assert_eq!(loaded.config.proxy.tunnel_port, 9090);
    assert_eq!(loaded.config.proxy.upstream_deny_cidrs, None);
    assert_eq!(loaded.config, Config::default());
}

#[test]
fn file_values_override_defaults_and_the_rest_stay() {
    let loaded = load(
        "terminal:\n  backend: docker\n  container_cpu: 1.5\n  docker_env:\n    A: 1\n    B: x\nproxy:\n  upstream_deny_cidrs: [10.0.0.0/8, 127.0.0.1]\n",
    )
    .unwrap();
    let t = &loaded.config.terminal;
    assert_eq!(t.backend, Backend::Docker);
    assert_eq!(t.container_cpu, 1.5);
    assert_eq!(t.container_memory_mb, 5120);
    assert_eq!(
        t.docker_env,
        vec![("A".into(), "1".into()), ("B".into(), "x".into())]
    );
    assert_eq!(
        loaded
            .config
            .proxy
            .upstream_deny_cidrs
            .as_ref()
            .map(Vec::len),
        Some(2)
    );
    assert!(!loaded.empty);
}

#[test]
fn a_null_section_means_defaults() {
    let loaded = load("terminal:\nproxy: ~\n").unwrap();
    assert_eq!(loaded.config, Config::default());
}

#[test]
fn wrong_types_name_key_line_and_column() {
    let e = errors("terminal:\n  timeout: soon\n");
    assert_eq!(e.len(), 1);
    assert_eq!(
        e[0].render("config.yaml"),
        "config.yaml:2:12: terminal.timeout: expected a positive integer, found a string `soon`"
    );
}

#[test]
fn every_error_is_reported_at_once_in_file_order() {
    let e = errors("terminal:\n  ssh_port: 70000\n  backend: dockr\nproxy:\n  enabled: maybe\n");
    let paths: Vec<_> = e.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        ["terminal.ssh_port", "terminal.backend", "proxy.enabled"]
    );
    assert!(e[1].message.contains("did you mean `docker`"), "{}", e[1]);
}

#[test]
fn unknown_keys_warn_with_a_suggestion() {
    let loaded = load("terminal:\n  backnd: docker\ntermnal: {}\n").unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        [
            "config.yaml:2:3: terminal.backnd: unknown key, ignored; did you mean `backend`?",
            "config.yaml:3:1: termnal: unknown key, ignored; did you mean `terminal`?",
        ]
    );
    assert_eq!(loaded.config.terminal.backend, Backend::Local);
    assert_eq!(
        loaded.merged.get_path("terminal.backnd"),
        Some(&Value::Str("docker".into()))
    );
}

fn sandbox_errors(text: &str) -> Vec<Issue> {
    load(text)
        .expect("errors of docker_extra_args leave the config usable")
        .config
        .sandbox_errors
}

#[test]
fn list_items_are_named_by_index() {
    let e = errors("terminal:\n  docker_volumes:\n    - /a:/b\n    - /c:rel\n");
    assert_eq!(e[0].path, "terminal.docker_volumes[1]");
    assert_eq!(e[0].pos, Some(Pos { line: 4, col: 7 }));
}

#[test]
fn a_volume_without_a_colon_is_skipped_with_a_warning_naming_the_entry_and_line() {
    let loaded =
        load("terminal:\n  docker_volumes:\n    - /a:/b\n    - nocolon\n    - /c:/d\n").unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        [
            "config.yaml:4:7: terminal.docker_volumes[1]: `nocolon` has no colon, so it is not host:container: skipped, as Hermes Agent skips it"
        ]
    );
    let volumes: Vec<&str> = loaded
        .config
        .terminal
        .docker_volumes
        .iter()
        .map(|v| v.container.as_str())
        .collect();
    assert_eq!(volumes, ["/b", "/d"]);
}

#[test]
fn host_patterns_refuse_a_bare_star_and_schemes() {
    assert!(check_host_pattern("*").is_err());
    assert!(check_host_pattern("*.com").is_err());
    assert!(check_host_pattern("https://api.openai.com").is_err());
    assert!(check_host_pattern("api.openai.com:443").is_err());
    assert!(check_host_pattern("a.*.com").is_err());
    assert!(check_host_pattern("*.openrouter.ai").is_ok());
    assert!(check_host_pattern("api.x.ai").is_ok());
    assert!(check_host_pattern("*-aiplatform.googleapis.com").is_ok());
    assert!(check_host_pattern("*-com").is_err());
    assert!(check_host_pattern("a*-b.example.com").is_err());
}

#[test]
fn sizes_parse_with_units() {
    assert_eq!(parse_size("1g"), Some(1 << 30));
    assert_eq!(parse_size("512m"), Some(512 << 20));
    assert_eq!(parse_size("1.5G"), Some(3 << 29));
    assert_eq!(parse_size("100"), Some(100));
    assert_eq!(parse_size("1x"), None);
    assert_eq!(parse_size("g"), None);
}

#[test]
fn network_options_contradict_no_network() {
    let e = sandbox_errors(
        "terminal:\n  docker_network: false\n  docker_extra_args: [--cap-add=SYS_PTRACE, --network=host, --network=none]\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].path, "terminal.docker_extra_args[1]");
    assert!(e[0].message.contains("line 2"), "{}", e[0]);
    // Without the proxy, the host's network is the host's to give.
    let loaded = load("terminal:\n  docker_extra_args: [--network=host]\n").unwrap();
    assert!(loaded.config.sandbox_errors.is_empty());
    assert!(
        loaded.warnings[0]
            .message
            .starts_with("`--network host` hands the sandbox the host's network"),
        "{:?}",
        loaded.warnings
    );
}

#[test]
fn errors_of_docker_extra_args_leave_the_config_usable_and_are_named_as_the_file_has_them() {
    let loaded = load(
        "terminal:\n  backend: docker\n  docker_extra_args:\n    - --shm-size=2g\n    - --privileged\n    - --label\n    - hermes-egress=on\n",
    )
    .unwrap();
    let e: Vec<String> = loaded
        .config
        .sandbox_errors
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("config.yaml:5:7: terminal.docker_extra_args[1]: `--privileged` gives the sandbox every capability"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with(
            "config.yaml:7:7: terminal.docker_extra_args[3]: `--label hermes-egress=on`"
        ),
        "{e:?}"
    );
    assert_eq!(
        loaded.config.sandbox_errors[0].brief().split(": `").next(),
        Some("terminal.docker_extra_args[1]")
    );
    assert!(
        loaded.config.sandbox_errors[0]
            .brief()
            .ends_with("(config.yaml line 5)")
    );
    // Any other error still makes the whole file unusable, and lists
    // these with it.
    let e = errors("terminal:\n  timeout: soon\n  docker_extra_args: [--privileged]\n");
    let paths: Vec<&str> = e.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, ["terminal.timeout", "terminal.docker_extra_args[0]"]);
}

#[test]
fn the_proxy_only_network_leaves_no_room_for_a_network_or_name_server_of_the_sandboxs_own() {
    let e = sandbox_errors(
        "proxy:\n  enabled: true\n  enforce_network: true\nterminal:\n  docker_extra_args: [--network, ml, --dns=1.1.1.1, --network=none]\n",
    );
    let e: Vec<(&str, &str)> = e
        .iter()
        .map(|i| (i.path.as_str(), i.message.as_str()))
        .collect();
    assert_eq!(e.len(), 2, "{e:?}");
    assert_eq!(e[0].0, "terminal.docker_extra_args[0]");
    assert!(
        e[0].1
            .starts_with("`--network ml` gives the sandbox a network of its own"),
        "{e:?}"
    );
    assert_eq!(e[1].0, "terminal.docker_extra_args[2]");
    assert!(e[1].1.contains("a name server of its own"), "{e:?}");
    // Without it, both are the sandbox's to have.
    assert!(
        sandbox_errors("terminal:\n  docker_extra_args: [--network, ml, --dns=1.1.1.1]\n")
            .is_empty()
    );
}

#[test]
fn a_list_written_as_json_text_as_the_agents_config_set_writes_it_is_that_list() {
    let loaded = load(
        "terminal:\n  docker_forward_env: '[\"FOO\", \"BAR\"]'\n  docker_volumes: '[\"/srv:/srv:ro\"]'\n  docker_extra_args: '[\"--shm-size=2g\"]'\n  docker_env: '{\"A\": \"1\", \"B\": 2}'\n",
    )
    .unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let t = &loaded.config.terminal;
    assert_eq!(t.docker_forward_env, ["FOO", "BAR"]);
    assert_eq!(t.docker_volumes[0].container, "/srv");
    assert_eq!(t.docker_extra_args, ["--shm-size=2g"]);
    assert_eq!(
        t.docker_env,
        [
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "2".to_string())
        ]
    );
    // A bad item is named by its index in the text, at the text's line.
    let e = errors("terminal:\n  docker_forward_env: '[\"OK\", \"BAD-NAME\"]'\n");
    assert_eq!(
        e[0].to_string(),
        "config.yaml:2:23: terminal.docker_forward_env[1]: `BAD-NAME` is not a valid environment variable name"
    );
    // A string that is no JSON list is no list, for the agent either.
    let e = errors("terminal:\n  docker_forward_env: FOO\n");
    assert!(e[0].message.starts_with("expected a list"), "{}", e[0]);
}

#[test]
fn limits_of_0_mean_no_limit_and_below_0_are_refused() {
    let t = load("terminal:\n  container_cpu: 0\n  container_memory: 0\n  container_disk: 0\n")
        .unwrap()
        .config
        .terminal;
    assert_eq!(
        (t.container_cpu, t.container_memory_mb, t.container_disk_mb),
        (0.0, 0, 0)
    );
    let e = errors("terminal:\n  container_cpu: -0.5\n  container_memory: -1\n");
    assert!(
        e[0].message.starts_with("must be at least 0 (0: no limit)"),
        "{}",
        e[0]
    );
    assert_eq!(e[1].path, "terminal.container_memory");
}

#[test]
fn the_agents_own_default_config_loads_without_a_word_and_means_hermes_defaults() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/agent-default-config.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let loaded = load(&text).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.sandbox_errors.is_empty());
    assert_eq!(loaded.config, Config::default());
}

#[test]
fn the_agents_sections_and_keys_are_its_business_and_typos_still_warn() {
    let loaded = load(
        "model:\n  default: x\nmax_concurrent_sessions: 8\nsecurity:\n  tirith_enabled: false\n  redact_secrets: false\nmodle: {}\n",
    )
    .unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        ["config.yaml:7:1: modle: unknown key, ignored; did you mean `model`?"]
    );
    assert!(!loaded.config.security.redact_secrets);
}

#[test]
fn a_value_the_agent_falls_back_from_is_a_warning_and_the_default_stands_in() {
    let loaded = load(
        "terminal:\n  modal_mode: sometimes\n  daemon_term_grace_seconds: soon\n  shell_init_files: [~/.zshrc, 5]\n  persistent_shell: false\n",
    )
    .unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        w[0].starts_with("config.yaml:2:15: terminal.modal_mode: unknown value `sometimes`"),
        "{w:?}"
    );
    assert!(
        w[0].ends_with("Hermes Agent falls back to its default (auto), and so does hermes"),
        "{w:?}"
    );
    assert!(
        w[1].contains("terminal.daemon_term_grace_seconds: expected a number"),
        "{w:?}"
    );
    assert!(
        w[2].starts_with("config.yaml:4:32: terminal.shell_init_files[1]: expected a string; Hermes Agent skips it"),
        "{w:?}"
    );
    let a = &loaded.config.terminal.agent;
    assert_eq!(a.modal_mode, "auto");
    assert_eq!(a.daemon_term_grace_seconds, 2.0);
    assert_eq!(a.shell_init_files, ["~/.zshrc"]);
    assert!(!a.persistent_shell);
}

#[test]
fn env_passthrough_is_a_list_of_names_without_the_agents_provider_credentials() {
    let loaded =
        load("terminal:\n  env_passthrough: [NOTION_TOKEN_FILE, OPENAI_API_KEY, PIP_INDEX_URL]\n")
            .unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("config.yaml:2:40: terminal.env_passthrough[1]: `OPENAI_API_KEY` is a credential Hermes Agent never passes through"),
        "{w:?}"
    );
    // As a string the agent ignores it; so does hermes, saying so.
    let loaded = load("terminal:\n  env_passthrough: '[\"PIP_INDEX_URL\"]'\n").unwrap();
    assert!(loaded.config.terminal.env_passthrough.is_empty());
    assert!(
        loaded.warnings[0]
            .message
            .contains("only as a list, and ignores this string"),
        "{:?}",
        loaded.warnings
    );
    // A secret the agent would pass is the sandbox rule's, as in
    // docker_forward_env: refused while the proxy is enforced.
    let e = errors("proxy:\n  enabled: true\nterminal:\n  env_passthrough: [STRIPE_API_KEY]\n");
    assert_eq!(e[0].path, "terminal.env_passthrough[0]");
    assert!(e[0].message.contains("looks like a secret"), "{}", e[0]);
}

#[test]
fn docker_run_as_host_user_is_carried_and_the_cwd_mount_is_said_not_to_be_honoured() {
    let loaded =
        load("terminal:\n  docker_run_as_host_user: true\n  docker_mount_cwd_to_workspace: true\n")
            .unwrap();
    assert!(loaded.config.terminal.docker_run_as_host_user);
    assert!(loaded.config.terminal.docker_mount_cwd_to_workspace);
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        [format!(
            "config.yaml:3:34: terminal.docker_mount_cwd_to_workspace: {}",
            agent::MOUNT_CWD_UNSUPPORTED
        )]
    );
    assert!(
        load("terminal:\n  docker_mount_cwd_to_workspace: false\n")
            .unwrap()
            .warnings
            .is_empty()
    );
}

#[test]
fn a_document_that_is_not_a_mapping_is_refused() {
    let e = errors("- a\n- b\n");
    assert!(e[0].message.contains("must be a mapping"), "{}", e[0]);
    let e = errors("just words\n");
    assert!(e[0].message.contains("found a string"), "{}", e[0]);
}

#[test]
fn the_aws_hosts_default_to_the_bedrock_runtime_of_the_region() {
    let c = load("").unwrap().config;
    assert_eq!(c.proxy.aws_region, "us-east-1");
    assert_eq!(
        c.proxy.aws_hosts,
        ["bedrock-runtime.us-east-1.amazonaws.com"]
    );
    let c = load("proxy:\n  aws_region: eu-west-3\n").unwrap().config;
    assert_eq!(
        c.proxy.aws_hosts,
        ["bedrock-runtime.eu-west-3.amazonaws.com"]
    );
    let c = load("proxy:\n  aws_hosts: [Bedrock-Runtime.ap-south-1.amazonaws.com]\n")
        .unwrap()
        .config;
    assert_eq!(
        c.proxy.aws_hosts,
        ["bedrock-runtime.ap-south-1.amazonaws.com"]
    );
    let e = errors("proxy:\n  aws_region: \"us east 1\"\n");
    assert!(e[0].message.contains("not an AWS region"), "{}", e[0]);
    assert_eq!(e[0].path, "proxy.aws_region");
}

#[test]
fn the_tunnel_port_leaves_room_for_the_http_port() {
    let e = errors("proxy:\n  tunnel_port: 65535\n");
    assert!(e[0].message.contains("65534"), "{}", e[0]);
}

/// The malformed-config corpus shared with the end-to-end tests: each file's
/// first line says which error it must produce (`# expect: LINE:COL PATH: …`).
#[test]
fn every_malformed_fixture_fails_with_its_expected_key_and_line() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/invalid-configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 30, "only {} fixtures", files.len());
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let first = bytes.split(|&b| b == b'\n').next().unwrap();
        let expect = std::str::from_utf8(first)
            .unwrap()
            .strip_prefix("# expect: ")
            .unwrap();
        let needle = expected_render(expect);
        // Hostile input must fail fast, never hang: a generous bound.
        let started = std::time::Instant::now();
        let rendered = match yaml::text_from_bytes(&bytes) {
            Err(e) => Issue {
                path: String::new(),
                pos: e.pos,
                message: e.message,
            }
            .render("config.yaml"),
            // With no credential anywhere: a cloud backend's missing
            // credential is an error too.
            Ok(text) => match load(text) {
                Err(e) => e.render("config.yaml"),
                // Errors of the Docker sandboxes' create call: the file
                // loads, and `config check` reports them.
                Ok(loaded) if !loaded.config.sandbox_errors.is_empty() => {
                    crate::config::ConfigError(loaded.config.sandbox_errors).render("config.yaml")
                }
                Ok(_) => {
                    let issues =
                        crate::cloud::check_credentials(text, &crate::desired::HostEnv::default());
                    assert!(!issues.is_empty(), "{} loaded", file.display());
                    crate::config::ConfigError(issues).render("config.yaml")
                }
            },
        };
        // Never hang: a bound only a hang misses, on a loaded machine too.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{}",
            file.display()
        );
        assert!(
            rendered.contains(&needle),
            "{}:\nwanted: {needle}\ngot:    {rendered}",
            file.display()
        );
    }
}

/// `3:12 terminal.timeout: msg` → `config.yaml:3:12: terminal.timeout: msg`.
pub(crate) fn expected_render(expect: &str) -> String {
    let (loc, rest) = expect.split_once(' ').unwrap_or((expect, ""));
    if loc.starts_with(|c: char| c.is_ascii_digit()) {
        if loc.ends_with(':') {
            format!("config.yaml:{loc}")
        } else {
            format!("config.yaml:{loc}: {rest}")
        }
    } else {
        expect.to_string()
    }
}

#[test]
fn a_multi_megabyte_file_is_refused_at_once() {
    let big = "a: 1\n".repeat(700_000);
    let started = std::time::Instant::now();
    let e = yaml::text_from_bytes(big.as_bytes()).unwrap_err();
    assert!(e.message.contains("at most"), "{e}");
    assert!(load(&big).is_err());
    // Never hang: a bound only a hang misses, on a loaded machine too.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn proxy_listen_resolve_and_reconcile_keys_are_typed() {
    let loaded = load(
        "proxy:\n  listen: [127.0.0.1, \"::1\"]\n  resolve:\n    API.example.com: 127.0.0.2\n  upstream_ca_file: /etc/up.pem\nreconcile:\n  prune: true\n  resync_seconds: 5\nterminal:\n  persistent_max_idle_seconds: 600\n",
    )
    .unwrap();
    let c = loaded.config;
    assert_eq!(
        c.proxy.listen,
        Some(vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()])
    );
    assert_eq!(
        c.proxy.resolve,
        vec![("api.example.com".to_string(), "127.0.0.2".parse().unwrap())]
    );
    assert_eq!(c.proxy.upstream_ca_file.as_deref(), Some("/etc/up.pem"));
    assert_eq!(c.proxy.upstream_header_timeout_seconds, 300);
    assert!(c.reconcile.prune);
    assert_eq!(c.reconcile.resync_seconds, 5);
    assert_eq!(c.terminal.persistent_max_idle_seconds, Some(600));
    let d = Config::default();
    assert_eq!(d.proxy.listen, None);
    assert!(!d.reconcile.prune);
    assert!(d.proxy.enforce_on_ssh);
    assert!(!d.proxy.enforce_network);
    assert_eq!(d.terminal.persistent_max_idle_seconds, None);
}

/// The example config documents every key with its default.
#[test]
fn the_example_config_holds_every_key_at_its_default() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/config.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let loaded = load(&text).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.config, Config::default());
    for spec in crate::schema::KEYS {
        assert!(
            loaded.user.get_path(spec.path).is_some(),
            "{} is missing from examples/config.yaml",
            spec.path
        );
    }
}

#[test]
fn environment_names_are_letters_digits_and_underscores_not_led_by_a_digit() {
    assert!(is_env_name("_A1"));
    assert!(is_env_name("OPENAI_API_KEY"));
    assert!(!is_env_name("1A"));
    assert!(!is_env_name("A-B"));
    assert!(!is_env_name("A B"));
    assert!(!is_env_name(""));
}

#[test]
fn an_aws_host_pattern_spanning_a_partition_is_warned_about_with_its_line() {
    let loaded = load(
        "proxy:\n  aws_hosts:\n    - bedrock-runtime.us-east-1.amazonaws.com\n    - '*.amazonaws.com'\n    - '*.s3.us-east-1.amazonaws.com'\n    - '*.amazonaws.com.cn'\n",
    )
    .unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with(
            "config.yaml:4:7: proxy.aws_hosts[1]: `*.amazonaws.com` lets the real AWS credentials sign"
        ),
        "{w:?}"
    );
    assert!(
        w[1].starts_with("config.yaml:6:7: proxy.aws_hosts[3]: `*.amazonaws.com.cn`"),
        "{w:?}"
    );
    // Still a valid config: the host may mean it.
    assert_eq!(loaded.config.proxy.aws_hosts.len(), 4);
}

#[test]
fn an_aws_host_of_a_credential_service_is_an_error_saying_why_with_its_line() {
    let e = errors(
        "proxy:\n  aws_hosts:\n    - bedrock-runtime.us-east-1.amazonaws.com\n    - sts.amazonaws.com\n    - IAM.amazonaws.com\n    - portal.sso.us-east-1.amazonaws.com\n    - sts-fips.us-east-1.amazonaws.com\n    - '*.sso.eu-west-1.amazonaws.com'\n    - cognito-identity.us-east-1.amazonaws.com\n    - oidc.us-east-1.amazonaws.com\n",
    );
    let e: Vec<String> = e.iter().map(ToString::to_string).collect();
    assert_eq!(e.len(), 7, "{e:?}");
    assert!(
        e[0].starts_with(
            "config.yaml:4:7: proxy.aws_hosts[1]: `sts.amazonaws.com` is a host of STS, which issues temporary credentials"
        ),
        "{e:?}"
    );
    assert!(
        e[0].contains("the proxy never signs requests to it with the real AWS credentials"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with(
            "config.yaml:5:7: proxy.aws_hosts[2]: `IAM.amazonaws.com` is a host of IAM"
        ),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("config.yaml:6:7: proxy.aws_hosts[3]: `portal.sso.us-east-1.amazonaws.com` is a host of IAM Identity Center"),
        "{e:?}"
    );
    assert!(
        e[3].starts_with("config.yaml:7:7: proxy.aws_hosts[4]: `sts-fips."),
        "{e:?}"
    );
    assert!(
        e[4].starts_with(
            "config.yaml:8:7: proxy.aws_hosts[5]: `*.sso.eu-west-1.amazonaws.com` covers only hosts of IAM Identity Center"
        ),
        "{e:?}"
    );
    assert!(
        e[5].contains("proxy.aws_hosts[6]: `cognito-identity."),
        "{e:?}"
    );
    assert!(e[6].contains("proxy.aws_hosts[7]: `oidc."), "{e:?}");
}

#[test]
fn a_wildcard_covering_the_credential_services_is_accepted_with_a_warning_that_the_proxy_refuses_them()
 {
    let loaded = load(
        "proxy:\n  aws_hosts:\n    - '*.amazonaws.com'\n    - '*.us-east-1.amazonaws.com'\n    - '*-fips.us-east-1.amazonaws.com'\n    - '*.s3.us-east-1.amazonaws.com'\n    - '*.us-east-1.api.aws'\n",
    )
    .unwrap();
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(w.len(), 4, "{w:?}");
    // The partition's warning, and the credential services' in the same line.
    assert!(
        w[0].starts_with("config.yaml:3:7: proxy.aws_hosts[0]: `*.amazonaws.com` lets the real AWS credentials sign"),
        "{w:?}"
    );
    assert!(
        w[0].contains("it also covers the hosts of AWS's credential services (sts, iam, sso,"),
        "{w:?}"
    );
    assert!(
        w[0].contains("the proxy refuses those services, and credential-minting actions such as GetSessionToken"),
        "{w:?}"
    );
    assert!(
        w[1].starts_with(
            "config.yaml:4:7: proxy.aws_hosts[1]: `*.us-east-1.amazonaws.com` covers the hosts of AWS's credential services"
        ),
        "{w:?}"
    );
    assert!(
        w[2].contains("proxy.aws_hosts[2]: `*-fips.us-east-1.amazonaws.com` covers"),
        "{w:?}"
    );
    // A bucket's hosts hold no credential service: nothing said.
    assert!(
        w[3].contains("proxy.aws_hosts[4]: `*.us-east-1.api.aws` covers"),
        "{w:?}"
    );
    assert_eq!(loaded.config.proxy.aws_hosts.len(), 5);
}

#[test]
fn kubernetes_keys_are_read_and_checked_with_key_and_line() {
    let loaded = load(
        "terminal:\n  backend: kubernetes\n  kubernetes_namespace: agents\n  kubernetes_node_selector:\n    pool: sandboxes\n  kubernetes_tolerations: [\"dedicated=agents:NoSchedule\"]\n  kubernetes_labels:\n    team: ml\n",
    )
    .unwrap();
    let k = &loaded.config.terminal.kubernetes;
    assert_eq!(loaded.config.terminal.backend, Backend::Kubernetes);
    assert_eq!(k.namespace, "agents");
    assert_eq!(k.image, loaded.config.terminal.docker_image);
    assert_eq!(k.node_selector["pool"], "sandboxes");
    assert_eq!(k.tolerations[0].effect.as_deref(), Some("NoSchedule"));
    assert_eq!(k.labels["team"], "ml");

    let e = errors(
        "terminal:\n  kubernetes_namespace: My_NS\n  kubernetes_storage_class: Fast!\n  kubernetes_tolerations: [\"gpu:Always\"]\n  kubernetes_labels:\n    hermes-agent: \"0\"\n    -bad: x\n  kubernetes_node_selector:\n    pool: \"no spaces\"\n",
    );
    let rendered: Vec<String> = e.iter().map(|i| i.render("config.yaml")).collect();
    let expect = [
        "config.yaml:2:25: terminal.kubernetes_namespace: `My_NS` is not a namespace name",
        "config.yaml:3:29: terminal.kubernetes_storage_class: `Fast!` is not a DNS-1123 name",
        "config.yaml:4:28: terminal.kubernetes_tolerations[0]: `Always` is not a taint effect",
        "config.yaml:6:5: terminal.kubernetes_labels.hermes-agent: `hermes-agent` is a label hermes sets itself",
        "config.yaml:7:5: terminal.kubernetes_labels.-bad: not a label key",
        "config.yaml:9:11: terminal.kubernetes_node_selector.pool: not a label value",
    ];
    assert_eq!(rendered.len(), expect.len(), "{rendered:#?}");
    for (got, want) in rendered.iter().zip(expect) {
        assert!(got.starts_with(want), "{got}\n  wanted: {want}…");
    }
}
