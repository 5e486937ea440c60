//! Plain config values: what a YAML node means once its position is
//! dropped. Used for the merged view (`config show`, `config get`) and to
//! render values back as YAML or JSON.

use crate::yaml::resolve_plain;

/// A config value. Mappings keep the order of their keys.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Value>),
    Map(Vec<(String, Value)>),
}

impl Value {
    /// The value under `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value at a dotted path (`terminal.backend`).
    /// The value at a key path ([`crate::keypath`]: dotted, a key with a
    /// dot in quotes); `None` when it is not there or the path is malformed.
    pub fn get_path(&self, path: &str) -> Option<&Value> {
        self.get_keys(&crate::keypath::parse(path).ok()?)
    }

    /// The value under `keys`, outermost first.
    pub fn get_keys<S: AsRef<str>>(&self, keys: &[S]) -> Option<&Value> {
        keys.iter().try_fold(self, |v, key| v.get(key.as_ref()))
    }

    pub fn is_collection(&self) -> bool {
        matches!(self, Value::Seq(_) | Value::Map(_))
    }

    /// Overlays `over` on `self`: mappings merge key by key, anything else
    /// in `over` replaces. A null over a mapping leaves the mapping (an
    /// empty `terminal:` section means "all defaults").
    pub fn merge(&mut self, over: &Value) {
        match (self, over) {
            (Value::Map(base), Value::Map(over)) => {
                for (key, value) in over {
                    match base.iter_mut().find(|(k, _)| k == key) {
                        Some((_, slot)) => slot.merge(value),
                        None => base.push((key.clone(), value.clone())),
                    }
                }
            }
            (Value::Map(_), Value::Null) => {}
            (slot, value) => *slot = value.clone(),
        }
    }

    /// The value as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Seq(items) => {
                serde_json::Value::Array(items.iter().map(Value::to_json).collect())
            }
            Value::Map(entries) => serde_json::Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// A scalar written as a YAML plain or quoted scalar; a collection in
    /// flow style. Used on one line.
    pub fn to_yaml_inline(&self) -> String {
        match self {
            Value::Null => "null".to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => format_float(*f),
            Value::Str(s) => quote_if_needed(s),
            Value::Seq(items) => format!(
                "[{}]",
                items
                    .iter()
                    .map(Value::to_yaml_inline)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Map(entries) => format!(
                "{{{}}}",
                entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", quote_if_needed(k), v.to_yaml_inline()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The value as block-style YAML lines, each indented by `indent`
    /// spaces, ending with a newline. A scalar or an empty collection is a
    /// single line.
    pub fn to_yaml_block(&self, indent: usize) -> String {
        let pad = " ".repeat(indent);
        let mut out = String::new();
        match self {
            Value::Seq(items) if !items.is_empty() => {
                for item in items {
                    match item {
                        Value::Map(e) if !e.is_empty() => {
                            // `- key: value` with the rest of the mapping under it.
                            let body = item.to_yaml_block(indent + 2);
                            out.push_str(&pad);
                            out.push_str("- ");
                            out.push_str(body.trim_start());
                        }
                        Value::Seq(s) if !s.is_empty() => {
                            out.push_str(&format!("{pad}-\n{}", item.to_yaml_block(indent + 2)));
                        }
                        _ => out.push_str(&format!("{pad}- {}\n", item.to_yaml_inline())),
                    }
                }
            }
            Value::Map(entries) if !entries.is_empty() => {
                for (key, value) in entries {
                    out.push_str(&format!("{pad}{}:", quote_if_needed(key)));
                    out.push_str(&value.yaml_after_key(indent));
                }
            }
            other => {
                out.push_str(&pad);
                out.push_str(&other.to_yaml_inline());
                out.push('\n');
            }
        }
        out
    }

    /// What follows `key:` for this value: ` scalar\n`, or a newline and
    /// the collection indented under the key.
    pub fn yaml_after_key(&self, key_indent: usize) -> String {
        match self {
            Value::Seq(items) if !items.is_empty() => {
                format!("\n{}", self.to_yaml_block(key_indent + 2))
            }
            Value::Map(entries) if !entries.is_empty() => {
                format!("\n{}", self.to_yaml_block(key_indent + 2))
            }
            other => format!(" {}\n", other.to_yaml_inline()),
        }
    }

    /// How `config get` prints a value: scalars bare, collections as YAML.
    pub fn to_display(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::Seq(_) | Value::Map(_) => self.to_yaml_block(0).trim_end().to_string(),
            other => other.to_yaml_inline(),
        }
    }
}

fn format_float(f: f64) -> String {
    if f.is_nan() {
        ".nan".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { ".inf" } else { "-.inf" }.to_string()
    } else if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{f:.1}")
    } else {
        f.to_string()
    }
}

/// A string as a YAML scalar: plain where that reads back as the same
/// string, double-quoted otherwise.
pub fn quote_if_needed(s: &str) -> String {
    let plain_ok = !s.is_empty()
        && resolve_plain(s) == Value::Str(s.to_string())
        && !s.starts_with(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    '-' | '?'
                        | ':'
                        | ','
                        | '['
                        | ']'
                        | '{'
                        | '}'
                        | '#'
                        | '&'
                        | '*'
                        | '!'
                        | '|'
                        | '>'
                        | '\''
                        | '"'
                        | '%'
                        | '@'
                        | '`'
                )
        })
        && !s.ends_with(|c: char| c.is_whitespace() || c == ':')
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.contains(['\n', '\r', '\t'])
        && !s.chars().any(char::is_control);
    let plain_ok = plain_ok || looks_like_path_or_word(s);
    if plain_ok {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Strings such as `-v` or `/a:/b` that are safe plain but start with a
/// character the general rule is wary of.
fn looks_like_path_or_word(s: &str) -> bool {
    s.starts_with("--")
        && s.len() > 2
        && s[2..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | '.' | '/'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::yaml::parse;

    fn round_trip(v: &Value) -> Value {
        let text = format!("k:{}", v.yaml_after_key(0));
        parse(&text)
            .unwrap()
            .unwrap()
            .to_value()
            .get("k")
            .cloned()
            .unwrap()
    }

    #[test]
    fn rendered_values_read_back_equal() {
        let values = [
            Value::Str("yes".into()),
            Value::Str("12".into()),
            Value::Str("a: b".into()),
            Value::Str("- x".into()),
            Value::Str("".into()),
            Value::Str("line\nbreak \"q\"".into()),
            Value::Str("--cap-add=SYS_PTRACE".into()),
            Value::Str("/host:/container:ro".into()),
            Value::Int(-3),
            Value::Float(1.5),
            Value::Float(2.0),
            Value::Bool(false),
            Value::Null,
            Value::Seq(vec![]),
            Value::Map(vec![]),
            Value::Seq(vec![Value::Str("a".into()), Value::Int(1)]),
            Value::Map(vec![
                ("A".into(), Value::Str("x y".into())),
                ("B".into(), Value::Seq(vec![Value::Int(1)])),
            ]),
            Value::Seq(vec![Value::Map(vec![
                ("x".into(), Value::Int(1)),
                ("y".into(), Value::Int(2)),
            ])]),
        ];
        for v in values {
            assert_eq!(round_trip(&v), v, "{v:?}");
        }
    }

    #[test]
    fn merge_overlays_mappings_key_by_key() {
        let mut base = Value::Map(vec![(
            "t".into(),
            Value::Map(vec![
                ("a".into(), Value::Int(1)),
                ("b".into(), Value::Int(2)),
            ]),
        )]);
        let over = Value::Map(vec![(
            "t".into(),
            Value::Map(vec![
                ("b".into(), Value::Int(3)),
                ("c".into(), Value::Int(4)),
            ]),
        )]);
        base.merge(&over);
        assert_eq!(base.get_path("t.a"), Some(&Value::Int(1)));
        assert_eq!(base.get_path("t.b"), Some(&Value::Int(3)));
        assert_eq!(base.get_path("t.c"), Some(&Value::Int(4)));
        base.merge(&Value::Map(vec![("t".into(), Value::Null)]));
        assert_eq!(base.get_path("t.a"), Some(&Value::Int(1)));
    }
}
