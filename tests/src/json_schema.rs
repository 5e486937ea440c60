//! The JSON Schemas of `--output json` (docs/schema/), for the tests
//! that check a command's document against its shape.

use std::path::Path;

use serde_json::Value;

use crate::cli::Run;

/// The schema of a command's document, from docs/schema/.
pub fn schema(name: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schema")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    jsonschema::validator_for(&value).unwrap_or_else(|e| panic!("{name}.json: {e}"))
}

/// Checks that `run` printed one document of `name`'s schema (or the
/// error schema, with the run's exit code), and returns it.
pub fn document(run: &Run, name: &str) -> Value {
    let doc: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{name}: not one JSON document ({e}): {run:?}"));
    assert_eq!(doc["schema_version"], 1, "{name}: {doc}");
    let first = doc.as_object().and_then(|o| o.keys().next().cloned());
    assert_eq!(first.as_deref(), Some("schema_version"), "{name}: {doc}");
    let (schema_name, validator) = if doc.get("error").is_some() {
        assert_eq!(
            doc["error"]["exit_code"].as_i64(),
            Some(i64::from(run.code)),
            "{name}: the error's exit code is the command's: {run:?}"
        );
        ("error", schema("error"))
    } else {
        (name, schema(name))
    };
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{name}: the document breaks {schema_name}.json: {errors:?}\n{doc:#}"
    );
    doc
}
