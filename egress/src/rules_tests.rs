//! The path matcher and the built-in rules, attacked with the spellings a
//! client may use to reach a denied endpoint.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn paths_are_normalised_or_refused() {
    for (target, want) in [
        ("/v1/chat/completions", Ok("/v1/chat/completions")),
        ("/v1//chat///completions/", Ok("/v1/chat/completions")),
        (
            "/V1/Chat/Completions?stream=true",
            Ok("/v1/chat/completions"),
        ),
        ("/v1/%63hat/completions#x", Ok("/v1/chat/completions")),
        ("/", Ok("/")),
        ("//", Ok("/")),
        ("/v1/files%2Fx", Err(PathError::EncodedSeparator)),
        ("/v1/files%2fx", Err(PathError::EncodedSeparator)),
        ("/v1%5cfiles", Err(PathError::EncodedSeparator)),
        ("/v1/%252Ffiles", Err(PathError::EncodedSeparator)),
        ("/v1/chat/../files", Err(PathError::DotSegment)),
        ("/v1/./files", Err(PathError::DotSegment)),
        ("/v1/%2e%2e/files", Err(PathError::DotSegment)),
        ("/v1/%2E/files", Err(PathError::DotSegment)),
        ("/v1\\files", Err(PathError::BadCharacter)),
        ("/v1/files%00", Err(PathError::BadCharacter)),
        ("/v1/fi\tles", Err(PathError::BadCharacter)),
        ("/v1/files%", Err(PathError::BadEncoding)),
        ("/v1/files%zz", Err(PathError::BadEncoding)),
        ("v1/files", Err(PathError::NotAbsolute)),
        ("*", Err(PathError::NotAbsolute)),
    ] {
        assert_eq!(
            normalize_path(target),
            want.map(str::to_string),
            "{target:?}"
        );
    }
}

#[test]
fn globs_match_segments_and_what_is_below_them() {
    for (glob, path, want) in [
        ("/v1/files/**", "/v1/files", true),
        ("/v1/files/**", "/v1/files/abc/content", true),
        ("/v1/files/**", "/v1/filesx", false),
        ("/v1/files", "/v1/files/abc", false),
        ("/v1/*/completions", "/v1/chat/completions", true),
        ("/v1/*/completions", "/v1/completions", false),
        ("/v1/chat*", "/v1/chat", true),
        ("/v1/chat*", "/v1/chatx", true),
        ("/v1/**/content", "/v1/files/f1/content", true),
        ("/V1/Files/**", "/v1/files/x", true),
        ("/**", "/", true),
        ("/", "/", true),
    ] {
        assert_eq!(glob_matches(glob, path), want, "{glob} {path}");
    }
}

fn set() -> RuleSet {
    RuleSet::new(Vec::new(), true)
}

#[test]
fn the_built_in_rules_allow_inference_and_deny_the_account() {
    let s = set();
    for (method, host, target, allowed) in [
        ("POST", "api.openai.com", "/v1/chat/completions", true),
        ("POST", "api.openai.com", "/v1/responses", true),
        ("GET", "api.openai.com", "/v1/models", true),
        ("GET", "api.openai.com", "/v1/models/gpt-5", true),
        ("POST", "api.openai.com", "/v1/embeddings", true),
        ("POST", "api.openai.com", "/v1/files", false),
        ("GET", "api.openai.com", "/v1/files/file-1/content", false),
        ("DELETE", "api.openai.com", "/v1/files/file-1", false),
        ("POST", "api.openai.com", "/v1/fine_tuning/jobs", false),
        ("POST", "api.openai.com", "/v1/batches", false),
        ("GET", "api.openai.com", "/v1/organization/api_keys", false),
        ("GET", "api.openai.com", "/v1/something-new", false),
        ("POST", "api.anthropic.com", "/v1/messages", true),
        (
            "POST",
            "api.anthropic.com",
            "/v1/messages/count_tokens",
            true,
        ),
        ("POST", "api.anthropic.com", "/v1/messages/batches", false),
        (
            "GET",
            "api.anthropic.com",
            "/v1/organizations/api_keys",
            false,
        ),
        ("POST", "api.anthropic.com", "/v1/files", false),
        ("POST", "openrouter.ai", "/api/v1/chat/completions", true),
        ("GET", "openrouter.ai", "/api/v1/keys", false),
        // A host without built-in rules: the allowlist decides.
        ("POST", "api.mistral.ai", "/v1/files", true),
    ] {
        let d = s.decide(method, host, target);
        assert_eq!(d.allows(), allowed, "{method} {host}{target}: {d}");
    }
    let d = s.decide("POST", "api.openai.com", "/v1/files");
    assert_eq!(
        d.to_string(),
        "denied by built-in: openai account endpoints (files, uploads, fine-tuning, batches, organization, projects, vector stores, keys)"
    );
}

#[test]
fn a_rule_of_the_config_comes_before_the_built_in_ones() {
    let mine = Rule {
        verdict: Verdict::Allow,
        hosts: vec!["api.openai.com".into()],
        methods: vec!["GET".into()],
        paths: vec!["/v1/files/**".into()],
        source: "config.yaml:12".into(),
    };
    let s = RuleSet::new(vec![mine], true);
    let read = s.decide("GET", "api.openai.com", "/v1/files/f1");
    assert!(read.allows());
    assert_eq!(read.to_string(), "allowed by config.yaml:12");
    // Its method only: an upload is still the built-in's.
    assert!(!s.decide("POST", "api.openai.com", "/v1/files").allows());
    let wild = Rule {
        verdict: Verdict::Deny,
        hosts: vec!["*.example.com".into()],
        methods: Vec::new(),
        paths: Vec::new(),
        source: "config.yaml:20".into(),
    };
    let s = RuleSet::new(vec![wild], false);
    assert!(!s.decide("GET", "a.example.com", "/").allows());
    assert!(s.decide("GET", "example.com", "/").allows());
    assert!(s.decide("GET", "aexample.com", "/").allows());
}

/// Every spelling of a denied endpoint that this generator knows (case,
/// doubled and trailing slashes, percent-encoding of any character, dot
/// segments, queries) is denied: either by the rule or as a refused path.
#[test]
fn no_spelling_of_a_denied_path_gets_through() {
    let s = set();
    let denied = [
        "/v1/files",
        "/v1/fine_tuning/jobs",
        "/v1/batches",
        "/v1/organization/users",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut tried = 0;
    for path in denied {
        for _ in 0..2_000 {
            let mut spelled = String::new();
            for segment in path.split('/').filter(|s| !s.is_empty()) {
                spelled.push('/');
                if next() % 4 == 0 {
                    spelled.push('/');
                }
                if next() % 6 == 0 {
                    spelled.push_str(if next() % 2 == 0 { "./" } else { "x/../" });
                }
                for c in segment.chars() {
                    match next() % 5 {
                        0 => spelled.push_str(&format!("%{:02X}", c as u32)),
                        1 => spelled.push_str(&format!("%{:02x}", c as u32)),
                        2 => spelled.push(c.to_ascii_uppercase()),
                        _ => spelled.push(c),
                    }
                }
            }
            if next() % 3 == 0 {
                spelled.push('/');
            }
            if next() % 3 == 0 {
                spelled.push_str("?purpose=fine-tune&x=/v1/chat/completions");
            }
            let d = s.decide("POST", "api.openai.com", &spelled);
            assert!(!d.allows(), "{spelled} got through: {d}");
            tried += 1;
        }
    }
    assert_eq!(tried, 8_000);
}
