//! Key paths as `config get`/`set`/`unset` and error messages write them:
//! keys joined by `.`, a key holding a `.` (a host name of
//! `proxy.resolve`) written in double quotes, as
//! `proxy.resolve."api.openai.com"`. Inside the quotes `\"` is a quote and
//! `\\` a backslash. [`render`] writes what [`parse`] reads back.

/// Why a key path cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyPathError {
    #[error("an empty key path")]
    Empty,
    #[error("`{0}` has an empty key (two dots in a row, or a dot at an end)")]
    EmptyKey(String),
    #[error("`{0}` has a quote that is not closed")]
    Unclosed(String),
    #[error("`{0}`: a quoted key is followed by something other than a dot")]
    AfterQuote(String),
}

/// The keys of `path`, outermost first.
pub fn parse(path: &str) -> Result<Vec<String>, KeyPathError> {
    if path.is_empty() {
        return Err(KeyPathError::Empty);
    }
    let mut keys = Vec::new();
    let mut chars = path.chars().peekable();
    loop {
        let mut key = String::new();
        if chars.next_if_eq(&'"').is_some() {
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some(escaped) => key.push(escaped),
                        None => break,
                    },
                    c => key.push(c),
                }
            }
            if !closed {
                return Err(KeyPathError::Unclosed(path.to_string()));
            }
            if chars.peek().is_some_and(|c| *c != '.') {
                return Err(KeyPathError::AfterQuote(path.to_string()));
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != '.') {
                key.push(c);
            }
        }
        if key.is_empty() {
            return Err(KeyPathError::EmptyKey(path.to_string()));
        }
        keys.push(key);
        // The dot before the next key, or the end.
        if chars.next().is_none() {
            return Ok(keys);
        }
    }
}

/// One key as it appears in a path: bare, or quoted when it holds a dot, a
/// quote or a backslash, starts with a quote, or is empty.
pub fn key(key: &str) -> String {
    if !key.is_empty() && !key.contains(['.', '"', '\\']) {
        return key.to_string();
    }
    let mut out = String::from("\"");
    for c in key.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The path of `keys`.
pub fn render<S: AsRef<str>>(keys: &[S]) -> String {
    keys.iter()
        .map(|k| key(k.as_ref()))
        .collect::<Vec<_>>()
        .join(".")
}

/// `prefix` (a path already written) and one more key.
pub fn join(prefix: &str, last: &str) -> String {
    format!("{prefix}.{}", key(last))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_quoted_keys_parse() {
        assert_eq!(parse("terminal.backend").unwrap(), ["terminal", "backend"]);
        assert_eq!(
            parse("proxy.resolve.\"api.openai.com\"").unwrap(),
            ["proxy", "resolve", "api.openai.com"]
        );
        assert_eq!(
            parse("\"a.b\".\"c\\\"d\\\\\".e").unwrap(),
            ["a.b", "c\"d\\", "e"]
        );
        assert_eq!(
            parse("a.b").unwrap(),
            render(&["a", "b"]).split('.').collect::<Vec<_>>()
        );
    }

    #[test]
    fn malformed_paths_are_refused() {
        assert_eq!(parse(""), Err(KeyPathError::Empty));
        for bad in ["a..b", ".a", "a.", "a.\"\"", "a.\"b.c\"."] {
            assert!(
                matches!(parse(bad), Err(KeyPathError::EmptyKey(_))),
                "{bad}"
            );
        }
        assert!(matches!(parse("a.\"b.c"), Err(KeyPathError::Unclosed(_))));
        assert!(matches!(
            parse("a.\"b\"c"),
            Err(KeyPathError::AfterQuote(_))
        ));
    }

    #[test]
    fn rendered_paths_read_back() {
        for keys in [
            vec!["proxy", "resolve", "api.openai.com"],
            vec!["terminal", "docker_env", "A"],
            vec!["x", "quo\"te", "back\\slash", "\"lead"],
        ] {
            let path = render(&keys);
            assert_eq!(parse(&path).unwrap(), keys, "{path}");
        }
        assert_eq!(
            render(&["proxy", "resolve", "api.openai.com"]),
            "proxy.resolve.\"api.openai.com\""
        );
        assert_eq!(
            join("proxy.resolve", "localhost"),
            "proxy.resolve.localhost"
        );
    }
}
