//! Egress rules past host names (`proxy.rules`), decided without IO: a
//! request the host allowlist lets through is then allowed or denied by
//! the first rule that matches its host, method and path.
//!
//! - **Host patterns** are exact names or `*.domain` (a subdomain, not the
//!   domain itself), matched on the host as [`crate::policy::parse_host`]
//!   gives it (lowercase, no trailing dot).
//! - **Methods**: any of the listed (uppercase), or any method when none.
//! - **Path globs**: `/`-separated segments; `*` matches one segment or
//!   the rest of one (`/v1/chat/*`, `/v1/x*`), `**` any number of whole
//!   segments, none included (`/v1/files/**` matches `/v1/files` and
//!   everything below it). Matched without regard to ASCII case: an
//!   upstream that takes `/V1/Files` as `/v1/files` must not be a way
//!   around a deny.
//! - **Paths are normalised before they are matched**, and refused where
//!   an upstream could read them otherwise than the matcher does
//!   ([`normalize_path`]): the query and fragment go; an encoded `/`, `\`
//!   or `%`, a `.` or `..` segment (however encoded), a backslash, a
//!   control character or an encoding that is not valid is refused; `//`
//!   is one `/`; a trailing `/` goes.
//!
//! Built-in rules ([`builtin`]) cover the providers of the default
//! allowlist whose APIs split cleanly into inference and account-level
//! endpoints (OpenAI, Anthropic, OpenRouter): inference is allowed,
//! everything account-level (files, fine-tuning, batches, the
//! organisation's and admin endpoints, key management) is denied, and on
//! those hosts a path no rule names is denied. The rules of `config.yaml`
//! come first: they may allow what a built-in rule denies.

use std::fmt;

/// What a rule does with a request it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub verdict: Verdict,
    /// Exact names or `*.domain`; any host when empty.
    pub hosts: Vec<String>,
    /// Uppercase; any method when empty.
    pub methods: Vec<String>,
    /// Path globs; any path when empty.
    pub paths: Vec<String>,
    /// Where it comes from, for the denial a client gets and `hermes egress
    /// check`: `config.yaml:12` or `built-in: openai files`.
    pub source: String,
}

/// Why a request's path cannot be matched: it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path does not start with /")]
    NotAbsolute,
    #[error("the path holds an encoded /, \\ or %: refused")]
    EncodedSeparator,
    #[error("the path holds a . or .. segment: refused")]
    DotSegment,
    #[error("the path holds a backslash or a control character: refused")]
    BadCharacter,
    #[error("the path holds a % that is no valid encoding: refused")]
    BadEncoding,
}

/// The path of a request target as rules match it ([`normalize_path`]'s
/// rules above): e.g. `/v1//chat/%63ompletions/?stream=1` →
/// `/v1/chat/completions`.
pub fn normalize_path(target: &str) -> Result<String, PathError> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEncoding)?;
            let text = std::str::from_utf8(hex).map_err(|_| PathError::BadEncoding)?;
            let value = u8::from_str_radix(text, 16).map_err(|_| PathError::BadEncoding)?;
            if matches!(value, b'/' | b'\\' | b'%') {
                return Err(PathError::EncodedSeparator);
            }
            if value < 0x20 || value == 0x7f {
                return Err(PathError::BadCharacter);
            }
            decoded.push(value);
            i += 3;
            continue;
        }
        if b == b'\\' || b < 0x20 || b == 0x7f {
            return Err(PathError::BadCharacter);
        }
        decoded.push(b);
        i += 1;
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut out = String::with_capacity(decoded.len());
    for segment in decoded.split('/').filter(|s| !s.is_empty()) {
        if segment == "." || segment == ".." {
            return Err(PathError::DotSegment);
        }
        out.push('/');
        out.push_str(&segment.to_ascii_lowercase());
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Whether path glob `glob` matches the normalised `path`.
pub fn glob_matches(glob: &str, path: &str) -> bool {
    let glob = glob.to_ascii_lowercase();
    let pattern: Vec<&str> = glob.split('/').filter(|s| !s.is_empty()).collect();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    segments_match(&pattern, &segments)
}

fn segments_match(pattern: &[&str], segments: &[&str]) -> bool {
    match pattern.split_first() {
        None => segments.is_empty(),
        Some((&"**", rest)) => {
            (0..=segments.len()).any(|skip| segments_match(rest, &segments[skip..]))
        }
        Some((p, rest)) => match segments.split_first() {
            Some((s, more)) => segment_matches(p, s) && segments_match(rest, more),
            None => false,
        },
    }
}

/// One segment against one pattern segment, `*` any run of characters.
fn segment_matches(pattern: &str, segment: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == segment,
        Some((head, tail)) => {
            let Some(rest) = segment.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|i| rest.is_char_boundary(*i))
                .any(|i| segment_matches(tail, &rest[i..]))
        }
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
        None => pattern.eq_ignore_ascii_case(host),
    }
}

impl Rule {
    /// Whether the rule applies to `method` on `host` at the normalised
    /// `path`.
    pub fn matches(&self, method: &str, host: &str, path: &str) -> bool {
        (self.hosts.is_empty() || self.hosts.iter().any(|h| host_matches(h, host)))
            && (self.methods.is_empty()
                || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && (self.paths.is_empty() || self.paths.iter().any(|g| glob_matches(g, path)))
    }
}

/// What decides a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// The first rule that matched.
    Rule(&'a Rule),
    /// No rule matched: the host allowlist's answer stands.
    NoRule,
    /// The path could not be matched: refused.
    BadPath(PathError),
}

impl Decision<'_> {
    /// Whether the request goes on.
    pub fn allows(&self) -> bool {
        match self {
            Decision::Rule(rule) => rule.verdict == Verdict::Allow,
            Decision::NoRule => true,
            Decision::BadPath(_) => false,
        }
    }
}

impl fmt::Display for Decision<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Rule(rule) => write!(
                f,
                "{} by {}",
                match rule.verdict {
                    Verdict::Allow => "allowed",
                    Verdict::Deny => "denied",
                },
                rule.source
            ),
            Decision::NoRule => f.write_str("allowed: no rule names it (the host is allowed)"),
            Decision::BadPath(e) => write!(f, "denied: {e}"),
        }
    }
}

/// The rules in the order they are tried: `proxy.rules` first, then the
/// built-in ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    pub fn new(configured: Vec<Rule>, with_builtin: bool) -> RuleSet {
        let mut rules = configured;
        if with_builtin {
            rules.extend(builtin());
        }
        RuleSet { rules }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The decision for `method` on `host` (as parsed: lowercase, no
    /// trailing dot) at request target `target` (its path and query).
    pub fn decide(&self, method: &str, host: &str, target: &str) -> Decision<'_> {
        let path = match normalize_path(target) {
            Ok(path) => path,
            Err(e) => return Decision::BadPath(e),
        };
        self.rules
            .iter()
            .find(|r| r.matches(method, host, &path))
            .map_or(Decision::NoRule, Decision::Rule)
    }
}

/// The built-in rules: per provider, its inference endpoints allowed, its
/// account-level ones denied, and on its host anything else denied.
pub fn builtin() -> Vec<Rule> {
    let rule = |verdict, host: &str, paths: &[&str], what: &str| Rule {
        verdict,
        hosts: vec![host.to_string()],
        methods: Vec::new(),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        source: format!("built-in: {what}"),
    };
    use Verdict::{Allow, Deny};
    let openai = "api.openai.com";
    let anthropic = "api.anthropic.com";
    let openrouter = "openrouter.ai";
    vec![
        rule(
            Deny,
            openai,
            &[
                "/v1/files/**",
                "/v1/uploads/**",
                "/v1/fine_tuning/**",
                "/v1/fine-tunes/**",
                "/v1/batches/**",
                "/v1/organization/**",
                "/v1/projects/**",
                "/v1/vector_stores/**",
                "/v1/api_keys/**",
            ],
            "openai account endpoints (files, uploads, fine-tuning, batches, organization, projects, vector stores, keys)",
        ),
        rule(
            Allow,
            openai,
            &[
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/responses/**",
                "/v1/embeddings",
                "/v1/models/**",
                "/v1/moderations",
                "/v1/audio/**",
                "/v1/images/**",
                "/v1/realtime/**",
            ],
            "openai inference endpoints",
        ),
        rule(Deny, openai, &[], "openai: any other endpoint"),
        rule(
            Deny,
            anthropic,
            &[
                "/v1/messages/batches/**",
                "/v1/files/**",
                "/v1/organizations/**",
                "/v1/skills/**",
            ],
            "anthropic account endpoints (message batches, files, organizations and admin keys, skills)",
        ),
        rule(
            Allow,
            anthropic,
            &["/v1/messages/**", "/v1/complete", "/v1/models/**"],
            "anthropic inference endpoints",
        ),
        rule(Deny, anthropic, &[], "anthropic: any other endpoint"),
        rule(
            Deny,
            openrouter,
            &["/api/v1/keys/**", "/api/v1/credits/**", "/api/v1/auth/**"],
            "openrouter account endpoints (keys, credits, auth)",
        ),
        rule(
            Allow,
            openrouter,
            &[
                "/api/v1/chat/completions",
                "/api/v1/completions",
                "/api/v1/responses/**",
                "/api/v1/embeddings",
                "/api/v1/models/**",
                "/api/v1/generation",
            ],
            "openrouter inference endpoints",
        ),
        rule(Deny, openrouter, &[], "openrouter: any other endpoint"),
    ]
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
