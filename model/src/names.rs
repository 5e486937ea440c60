//! The names that become part of a host path, a container name or a
//! label: task names, session ids and profile names.
//!
//! They come from the edge (`hermes exec --task`, `--session`,
//! `HERMES_SESSION_ID`, `--profile`, `HERMES_PROFILE`, `session end ID`),
//! often from an agent, so they are hostile until checked. One rule for
//! all of them: 1 to [`MAX_LEN`] characters of `[A-Za-z0-9_.-]`, the
//! first a letter or a digit. Such a name cannot spell `.`, `..`, a
//! slash or a NUL, nor start with `-` (an option to a program), so it is
//! always exactly one component of a path, and two names never map to
//! one container or one directory.

use std::fmt;

/// The longest name: a label value's limit.
pub const MAX_LEN: usize = 63;

/// The rule, in words, for error messages.
pub const RULE: &str =
    "1 to 63 characters of letters, digits, `_`, `.` and `-`, starting with a letter or a digit";

/// Which kind of name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Task,
    Session,
    Profile,
}

impl NameKind {
    fn noun(self) -> &'static str {
        match self {
            NameKind::Task => "task name",
            NameKind::Session => "session id",
            NameKind::Profile => "profile name",
        }
    }
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.noun())
    }
}

/// What is wrong with a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Empty,
    /// Longer than [`MAX_LEN`] bytes: how long.
    TooLong(usize),
    /// The first character is not a letter or a digit.
    BadFirst(char),
    /// A character outside the set.
    BadChar(char),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Empty => f.write_str("it is empty"),
            Problem::TooLong(n) => write!(f, "it is {n} bytes long"),
            Problem::BadFirst(c) => write!(f, "it starts with '{}'", c.escape_debug()),
            Problem::BadChar(c) => write!(f, "it contains '{}'", c.escape_debug()),
        }
    }
}

/// A name that breaks the rule: where it came from (a flag or a
/// variable, when the caller said), the value (escaped, shortened), what
/// is wrong and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct NameError {
    pub kind: NameKind,
    /// The flag or variable the value came from, such as `--task`.
    pub origin: Option<String>,
    pub value: String,
    pub problem: Problem,
}

impl NameError {
    /// The same error, naming the flag or variable the value came from.
    pub fn from_origin(mut self, origin: impl Into<String>) -> NameError {
        self.origin = Some(origin.into());
        self
    }
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(origin) = &self.origin {
            write!(f, "{origin}: ")?;
        }
        write!(
            f,
            "{} `{}` is refused: {}; a {} must be {RULE}",
            self.kind,
            shown(&self.value),
            self.problem,
            self.kind,
        )
    }
}

/// The value as an error shows it: escaped, and cut after 64 characters.
fn shown(value: &str) -> String {
    let mut out: String = value
        .chars()
        .take(64)
        .flat_map(char::escape_debug)
        .collect();
    let total = value.chars().count();
    if total > 64 {
        out.push_str(&format!("…({total} characters)"));
    }
    out
}

/// Checks a name of `kind` against the rule.
pub fn validate(kind: NameKind, value: &str) -> Result<(), NameError> {
    let fail = |problem| {
        Err(NameError {
            kind,
            origin: None,
            value: value.to_string(),
            problem,
        })
    };
    let Some(first) = value.chars().next() else {
        return fail(Problem::Empty);
    };
    if value.len() > MAX_LEN {
        return fail(Problem::TooLong(value.len()));
    }
    if !first.is_ascii_alphanumeric() {
        return fail(Problem::BadFirst(first));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return fail(Problem::BadChar(c));
    }
    Ok(())
}

/// Whether a name keeps the rule.
pub fn is_valid(value: &str) -> bool {
    validate(NameKind::Task, value).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn good_names_pass() {
        for name in [
            "default",
            "a",
            "0",
            "work-2.a_b",
            "A.b-c_d",
            &"x".repeat(63),
        ] {
            assert!(validate(NameKind::Task, name).is_ok(), "{name}");
        }
    }

    #[test]
    fn names_that_walk_a_path_or_look_like_options_are_refused() {
        for (name, problem) in [
            ("", Problem::Empty),
            (".", Problem::BadFirst('.')),
            ("..", Problem::BadFirst('.')),
            (".hidden", Problem::BadFirst('.')),
            ("-rf", Problem::BadFirst('-')),
            ("_x", Problem::BadFirst('_')),
            ("a/b", Problem::BadChar('/')),
            ("a/../..", Problem::BadChar('/')),
            ("a\0b", Problem::BadChar('\0')),
            ("a b", Problem::BadChar(' ')),
            ("é", Problem::BadFirst('é')),
            ("a\nb", Problem::BadChar('\n')),
        ] {
            assert_eq!(
                validate(NameKind::Task, name).unwrap_err().problem,
                problem,
                "{name:?}"
            );
        }
        assert_eq!(
            validate(NameKind::Task, &"x".repeat(64))
                .unwrap_err()
                .problem,
            Problem::TooLong(64)
        );
    }

    #[test]
    fn the_error_names_the_origin_the_escaped_value_and_the_rule() {
        let e = validate(NameKind::Session, "a\nb")
            .unwrap_err()
            .from_origin("--session");
        let text = e.to_string();
        assert!(text.starts_with("--session: session id `a\\nb`"), "{text}");
        assert!(text.contains("it contains '\\n'"), "{text}");
        assert!(text.contains(RULE), "{text}");
        let long = validate(NameKind::Task, &"y".repeat(500))
            .unwrap_err()
            .to_string();
        assert!(long.contains("…(500 characters)"), "{long}");
        assert!(long.len() < 400, "{long}");
    }
}
