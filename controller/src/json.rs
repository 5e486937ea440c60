//! The JSON contract of `--output json` ([docs/json.md]): every command
//! that takes it prints exactly one JSON document on stdout, an object
//! whose first field is `schema_version`, errors included: an error is
//! `{"schema_version": 1, "error": {"message", "causes", "exit_code"}}`,
//! with the same exit code as the text's, and the text's `error:` line
//! still on stderr. The shapes are JSON Schemas under `docs/schema/`,
//! which the suite validates every command's output against.
//!
//! `config get` and `config show` print the config's own value: their
//! errors follow the contract, their values carry no version (a value of
//! config.yaml has the shape the user gave it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};

/// The version of every document's shape. A field is only ever added
/// within a version; a rename, a removal or a change of type bumps it.
pub const SCHEMA_VERSION: u64 = 1;

/// Whether this invocation asked for JSON.
static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The last error a command said itself (`error: …` on stderr) before
/// it returned a failing exit code without a document.
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Whether `args` (the whole command line) ask for JSON: `--output json`,
/// `--output=json`, or `config`'s `--json`. Only options before `--` count
/// (what follows is an exec's command).
pub fn asked_in(args: &[String]) -> bool {
    let mut words = args.iter().skip(1).take_while(|w| *w != "--");
    while let Some(word) = words.next() {
        let json = match word.as_str() {
            "--output" => words.next().is_some_and(|v| v == "json"),
            "--output=json" | "--json" => true,
            _ => false,
        };
        if json {
            return true;
        }
    }
    false
}

/// From now on, errors are documents too.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Records an error a command said itself: the document of a failing
/// command that printed none names it.
pub fn note_error(text: &str) {
    if requested() {
        let mut last = LAST_ERROR
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.get_or_insert_with(|| text.to_string());
    }
}

/// The first error a command said itself, if any.
pub fn noted_error() -> Option<String> {
    LAST_ERROR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// `value` (an object) with `schema_version` first.
pub fn versioned(value: impl serde::Serialize) -> Result<Value, serde_json::Error> {
    let mut out = Map::new();
    out.insert("schema_version".to_string(), Value::from(SCHEMA_VERSION));
    match serde_json::to_value(value)? {
        Value::Object(fields) => out.extend(fields),
        other => {
            out.insert("value".to_string(), other);
        }
    }
    Ok(Value::Object(out))
}

/// Prints `value` as a versioned document on stdout.
pub fn print(value: impl serde::Serialize) -> Result<(), serde_json::Error> {
    let doc = versioned(value)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// The document of an error: its message, the chain of its causes, and
/// the exit code the command ends with.
pub fn error_document(message: &str, causes: &[String], exit_code: u8) -> Value {
    serde_json::json!({
        "schema_version": SCHEMA_VERSION,
        "error": {
            "message": message,
            "causes": causes,
            "exit_code": exit_code,
        }
    })
}

/// Prints an error's document on stdout.
pub fn print_error(message: &str, causes: &[String], exit_code: u8) {
    let doc = error_document(message, causes, exit_code);
    // A map of strings and numbers always serializes.
    println!(
        "{}",
        serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".to_string())
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        std::iter::once("hermes")
            .chain(words.iter().copied())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn json_is_asked_for_by_the_option_never_by_an_exec_s_command() {
        assert!(asked_in(&args(&["status", "--output", "json"])));
        assert!(asked_in(&args(&["sandbox", "list", "--output=json"])));
        assert!(asked_in(&args(&["config", "show", "--json"])));
        assert!(!asked_in(&args(&["status", "--output", "text"])));
        assert!(!asked_in(&args(&[
            "exec", "--", "tool", "--output", "json"
        ])));
    }

    #[test]
    fn a_document_starts_with_its_version_and_an_error_is_one() {
        let doc = versioned(serde_json::json!({"a": 1})).unwrap();
        assert_eq!(doc.to_string(), r#"{"schema_version":1,"a":1}"#);
        let err = error_document("bad", &["because".to_string()], 64);
        assert_eq!(err["error"]["exit_code"], 64);
        assert_eq!(err["schema_version"], 1);
    }
}
