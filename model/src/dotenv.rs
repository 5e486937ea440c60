//! `$HERMES_HOME/.env`: `KEY=value` lines holding secrets.
//!
//! Reading follows the common dotenv rules (`export ` prefix, `#` comments,
//! single quotes literal, double quotes with escapes). Editing replaces the
//! line of one key and keeps every other line as it was. Values are never
//! part of an error message.

/// Parses `.env` text into `(name, value)` pairs, in file order; a later
/// line for the same name wins when looked up with [`get`].
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines().filter_map(parse_line).collect()
}

/// The value of `name`, the last definition winning.
pub fn get<'a>(entries: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entries
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn parse_line(line: &str) -> Option<(String, String)> {
    let line = line.trim_start();
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let line = line.strip_prefix("export ").unwrap_or(line);
    let (name, raw) = line.split_once('=')?;
    let name = name.trim();
    if !crate::config::is_env_name(name) {
        return None;
    }
    let raw = raw.trim_start();
    let value = if let Some(rest) = raw.strip_prefix('\'') {
        rest.split_once('\'').map_or(rest, |(v, _)| v).to_string()
    } else if let Some(rest) = raw.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('r') => out.push('\r'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => {}
                },
                c => out.push(c),
            }
        }
        out
    } else {
        let end = raw.find(" #").unwrap_or(raw.len());
        raw[..end].trim_end().to_string()
    };
    Some((name.to_string(), value))
}

/// `.env` text with `name` set to `value`: its line replaced in place (any
/// later duplicates removed), or appended.
pub fn set(text: &str, name: &str, value: &str) -> String {
    let new_line = format!("{name}={}\n", quote(value));
    let mut out = String::with_capacity(text.len() + new_line.len());
    let mut written = false;
    for line in text.split_inclusive('\n') {
        if parse_line(line).is_some_and(|(k, _)| k == name) {
            if !written {
                out.push_str(&new_line);
                written = true;
            }
            continue;
        }
        out.push_str(line);
    }
    if !written {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&new_line);
    }
    out
}

/// `.env` text without `name`; `None` when it was not there.
pub fn unset(text: &str, name: &str) -> Option<String> {
    let mut found = false;
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| {
            let hit = parse_line(line).is_some_and(|(k, _)| k == name);
            found |= hit;
            !hit
        })
        .collect();
    found.then_some(kept)
}

fn quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@+=,%~".contains(c));
    if plain {
        return value.to_string();
    }
    if !value.contains(['\'', '\n', '\r']) {
        // Single quotes are literal for every dotenv reader: no `$` expansion.
        return format!("'{value}'");
    }
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a bare `config set` key names a secret and belongs in `.env`:
/// a provider key (`OPENAI_API_KEY`), or any name the sandbox rule
/// [`crate::config::is_secret_name`] takes for a secret (`GITHUB_TOKEN`,
/// `CLIENT_SECRET`, the AWS and cloud backends' credentials). One rule for
/// both edges: what may not enter a sandbox may not sit in config.yaml.
pub fn is_credential_key(key: &str) -> bool {
    if key.contains('.') || !crate::config::is_env_name(key) {
        return false;
    }
    crate::providers::is_credential_variable(key) || crate::config::is_secret_name(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_exports_quotes_and_comments() {
        let text = "# c\nexport A=1\nB='x y # z'\nC=\"q\\\"n\\n\"\nD=plain # note\nbad line\n=nokey\nA=2\n";
        let entries = parse(text);
        assert_eq!(get(&entries, "A"), Some("2"));
        assert_eq!(get(&entries, "B"), Some("x y # z"));
        assert_eq!(get(&entries, "C"), Some("q\"n\n"));
        assert_eq!(get(&entries, "D"), Some("plain"));
        assert_eq!(entries.len(), 5);
    }

    #[test]
    fn set_replaces_in_place_and_keeps_other_lines() {
        let text = "# keys\nA=1\nB=2\nA=3\n";
        assert_eq!(set(text, "A", "new"), "# keys\nA=new\nB=2\n");
        assert_eq!(set("B=2", "C", "x y"), "B=2\nC='x y'\n");
        assert_eq!(set("", "C", "it's"), "C=\"it's\"\n");
    }

    #[test]
    fn set_values_read_back_equal() {
        for v in [
            "sk-abc123",
            "with space",
            "quote\"s",
            "back\\slash",
            "",
            "#hash",
            "$dollar",
            "it's",
            "multi\nline",
        ] {
            let text = set("", "K", v);
            assert_eq!(get(&parse(&text), "K"), Some(v), "{text}");
        }
    }

    #[test]
    fn unset_removes_every_line_of_the_key() {
        assert_eq!(unset("A=1\nB=2\nA=3\n", "A"), Some("B=2\n".to_string()));
        assert_eq!(unset("B=2\n", "A"), None);
    }

    #[test]
    fn credential_keys_are_recognised() {
        assert!(is_credential_key("OPENAI_API_KEY"));
        assert!(is_credential_key("GITHUB_TOKEN"));
        assert!(is_credential_key("client_secret"));
        for name in crate::cloud::CREDENTIALS.iter().chain(&[
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "STRIPE_API_KEY",
            "DB_PASSWORD",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ]) {
            assert!(is_credential_key(name), "{name}");
        }
        assert!(!is_credential_key("terminal.api_token"));
        assert!(!is_credential_key("TOKENIZER"));
        assert!(!is_credential_key("terminal"));
        assert!(!is_credential_key("PATH"));
    }
}
