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

#[test]
fn list_items_are_named_by_index() {
    let e = errors("terminal:\n  docker_volumes:\n    - /a:/b\n    - nocolon\n");
    assert_eq!(e[0].path, "terminal.docker_volumes[1]");
    assert_eq!(e[0].pos, Some(Pos { line: 4, col: 7 }));
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
    let e = errors(
        "terminal:\n  docker_network: false\n  docker_extra_args: [--cap-add=SYS_PTRACE, --network=host]\n",
    );
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, "terminal.docker_extra_args[1]");
    assert!(e[0].message.contains("line 2"), "{}", e[0]);
    let e = errors("terminal:\n  docker_extra_args: [--network=host]\n");
    assert!(
        e[0].message.starts_with("`--network` is not supported"),
        "{}",
        e[0]
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
                Ok(_) => {
                    let issues =
                        crate::cloud::check_credentials(text, &crate::desired::HostEnv::default());
                    assert!(!issues.is_empty(), "{} loaded", file.display());
                    crate::config::ConfigError(issues).render("config.yaml")
                }
            },
        };
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
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
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
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
