//! `config set` and `config unset` as edits of the text, not rewrites of
//! the tree: comments, blank lines and key order outside the edited value
//! stay exactly as the user wrote them.
//!
//! The parser gives every key and value its line and column; a same-line
//! scalar is replaced in place (a trailing comment survives), a multi-line
//! value is replaced as a block of lines, and a new key goes after the last
//! line of the mapping that should hold it, at that mapping's indentation.
//! Every edit is read back: if the new text does not parse to the intended
//! value, the edit is refused and the caller keeps the old text.

use crate::schema::Ty;
use crate::value::Value;
use crate::yaml::{self, Entry, Node, NodeKind, Scalar, Style, YamlError};

/// Why an edit could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("the file does not parse: {0}")]
    Parse(#[from] YamlError),
    #[error("`{key}` at line {line} is written in flow style ({{...}} or [...]); edit it by hand")]
    FlowStyle { key: String, line: usize },
    #[error("`{key}` at line {line} is {found}, not a mapping; use --force to replace it")]
    NotAMapping {
        key: String,
        line: usize,
        found: &'static str,
    },
    #[error(
        "`{key}` at line {line} is a whole section; use --force to replace it with a single value"
    )]
    ReplacesSection { key: String, line: usize },
    #[error("the top of the file is not a block mapping; edit it by hand")]
    RootNotEditable,
    #[error("an empty key path")]
    EmptyPath,
    #[error(transparent)]
    Path(#[from] crate::keypath::KeyPathError),
    #[error("the edited text did not read back as intended ({0}); the file was left unchanged")]
    ReadBack(String),
}

/// Sets `path` (dotted) to `value` in `text`. Without `force`, refuses to
/// replace a non-empty mapping by a scalar or to descend through a scalar.
pub fn set(text: &str, path: &str, value: &Value, force: bool) -> Result<String, EditError> {
    let segments = segments(path)?;
    let mut doc = Doc::new(text);
    let Some(root) = yaml::parse(text)? else {
        // Empty or comments only: append the whole key.
        let block = nest(&segments, value).to_yaml_block(0);
        doc.append(&block);
        return read_back_set(doc.finish(), path, value);
    };
    let NodeKind::Map { flow: false, .. } = root.kind else {
        return Err(EditError::RootNotEditable);
    };
    let mut node = &root;
    for (depth, segment) in segments.iter().enumerate() {
        let last = depth + 1 == segments.len();
        let Some(entry) = node.get(segment) else {
            // Insert the rest of the path into `node`.
            let rest = nest(&segments[depth..], value);
            insert_into(&mut doc, node, &rest)?;
            return read_back_set(doc.finish(), path, value);
        };
        if last {
            guard_section(entry, value, force)?;
            replace_value(&mut doc, entry, value)?;
            return read_back_set(doc.finish(), path, value);
        }
        match &entry.value.kind {
            NodeKind::Map { flow: false, .. } => node = &entry.value,
            NodeKind::Map { flow: true, .. } => {
                return Err(EditError::FlowStyle {
                    key: entry.key.clone(),
                    line: entry.key_pos.line,
                });
            }
            kind => {
                let is_null = matches!(kind, NodeKind::Scalar(s) if s.resolve() == Value::Null);
                if !is_null && !force {
                    return Err(EditError::NotAMapping {
                        key: entry.key.clone(),
                        line: entry.key_pos.line,
                        found: entry.value.kind_name(),
                    });
                }
                let rest = nest(&segments[depth + 1..], value);
                replace_value(&mut doc, entry, &rest)?;
                return read_back_set(doc.finish(), path, value);
            }
        }
    }
    Err(EditError::EmptyPath)
}

/// Removes `path` from `text`. `Ok(None)` when the key is not in the file.
/// A mapping the key was the last entry of goes with it (`terminal:` is
/// not left behind empty), up to the top.
pub fn unset(text: &str, path: &str) -> Result<Option<String>, EditError> {
    let segments = segments(path)?;
    let Some(mut new) = unset_one(text, &segments)? else {
        return Ok(None);
    };
    for depth in (1..segments.len()).rev() {
        let parent = &segments[..depth];
        let left = yaml::parse(&new)?
            .map(|n| n.to_value())
            .and_then(|v| v.get_keys(parent).cloned());
        let empty = match left {
            Some(Value::Null) => true,
            Some(Value::Map(entries)) => entries.is_empty(),
            _ => false,
        };
        if !empty {
            break;
        }
        match unset_one(&new, parent)? {
            Some(text) => new = text,
            None => break,
        }
    }
    Ok(Some(new))
}

/// Removes the one entry at `segments`: its key's line and its value's.
fn unset_one(text: &str, segments: &[String]) -> Result<Option<String>, EditError> {
    let path = crate::keypath::render(segments);
    let Some(root) = yaml::parse(text)? else {
        return Ok(None);
    };
    let mut node = &root;
    let mut found = None;
    for (depth, segment) in segments.iter().enumerate() {
        let Some(entry) = node.get(segment) else {
            return Ok(None);
        };
        if let NodeKind::Map { flow: true, .. } = node.kind {
            return Err(EditError::FlowStyle {
                key: crate::keypath::render(&segments[..depth]),
                line: node.start.line,
            });
        }
        if depth + 1 == segments.len() {
            found = Some(entry);
        } else {
            node = &entry.value;
        }
    }
    let Some(entry) = found else {
        return Ok(None);
    };
    let mut doc = Doc::new(text);
    doc.check_key_starts_line(entry)?;
    doc.replace_lines(
        entry.key_pos.line,
        entry.value.end.line.max(entry.key_pos.line),
        "",
    );
    let new = doc.finish();
    let reread = yaml::parse(&new)?;
    if reread
        .map(|n| n.to_value())
        .and_then(|v| v.get_keys(segments).cloned())
        .is_some()
    {
        return Err(EditError::ReadBack(format!("`{path}` is still there")));
    }
    Ok(Some(new))
}

/// Turns the text of `config set KEY VALUE` into a value: for a key whose
/// default is text, the text itself; otherwise `true/yes/on`,
/// `false/no/off`, `null/none/~`, integers, floats where the text is the
/// float's own spelling, and `[...]`/`{...}` read as YAML.
pub fn coerce(text: &str, ty: Option<Ty>) -> Result<Value, EditError> {
    let is_null = matches!(text.to_ascii_lowercase().as_str(), "null" | "none" | "~");
    match ty {
        Some(Ty::OptStr) if is_null => return Ok(Value::Null),
        Some(Ty::OptStr) => return Ok(Value::Str(text.to_string())),
        Some(ty) if ty.takes_text() => return Ok(Value::Str(text.to_string())),
        _ => {}
    }
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" => return Ok(Value::Bool(true)),
        "false" | "no" | "off" => return Ok(Value::Bool(false)),
        _ if is_null => return Ok(Value::Null),
        _ => {}
    }
    if let Ok(i) = text.parse::<i64>() {
        return Ok(Value::Int(i));
    }
    if let Ok(f) = text.parse::<f64>() {
        if f.is_finite() && (f.to_string() == text || format!("{f:.1}") == text) {
            return Ok(Value::Float(f));
        }
    }
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        let doc = format!("v: {text}\n");
        let node = yaml::parse(&doc)?;
        return Ok(node
            .and_then(|n| n.to_value().get("v").cloned())
            .unwrap_or(Value::Null));
    }
    Ok(Value::Str(text.to_string()))
}

fn segments(path: &str) -> Result<Vec<String>, EditError> {
    Ok(crate::keypath::parse(path)?)
}

/// `a.b` and `v` → `{a: {b: v}}` minus the outermost key: the value that
/// goes under `segments[0]`, wrapped so it can be rendered as an entry.
fn nest(segments: &[String], value: &Value) -> Value {
    segments.iter().rev().fold(value.clone(), |inner, key| {
        Value::Map(vec![(key.to_string(), inner)])
    })
}

fn guard_section(entry: &Entry, value: &Value, force: bool) -> Result<(), EditError> {
    let replaces_section = matches!(&entry.value.kind, NodeKind::Map { entries, .. } if !entries.is_empty())
        && !value.is_collection();
    if replaces_section && !force {
        return Err(EditError::ReplacesSection {
            key: entry.key.clone(),
            line: entry.key_pos.line,
        });
    }
    Ok(())
}

/// Adds the single-key mapping `rest` as a new entry of the block mapping
/// `map`, after its last line and at its indentation.
fn insert_into(doc: &mut Doc, map: &Node, rest: &Value) -> Result<(), EditError> {
    let NodeKind::Map { entries, flow } = &map.kind else {
        return Err(EditError::RootNotEditable);
    };
    if *flow {
        return Err(EditError::FlowStyle {
            key: String::new(),
            line: map.start.line,
        });
    }
    let Some(first) = entries.first() else {
        return Err(EditError::RootNotEditable);
    };
    let indent = first.key_pos.col - 1;
    let block = rest.to_yaml_block(indent);
    doc.insert_after(map.end.line, &block);
    Ok(())
}

/// Replaces the value of `entry`: in place when both old and new fit on
/// the key's line, else as a block of lines.
fn replace_value(doc: &mut Doc, entry: &Entry, value: &Value) -> Result<(), EditError> {
    doc.check_key_starts_line(entry)?;
    let old = &entry.value;
    let inline_new = !matches!(value, Value::Seq(s) if !s.is_empty())
        && !matches!(value, Value::Map(m) if !m.is_empty());
    let same_line_scalar = matches!(
        &old.kind,
        NodeKind::Scalar(Scalar {
            style: Style::Plain | Style::Quoted,
            ..
        })
    ) && old.start.line == entry.key_pos.line
        && old.end.line == entry.key_pos.line
        && old.end.col > old.start.col;
    if inline_new && same_line_scalar {
        doc.replace_in_line(
            entry.key_pos.line,
            old.start.col,
            old.end.col,
            &value.to_yaml_inline(),
        );
        return Ok(());
    }
    let empty_value =
        matches!(&old.kind, NodeKind::Scalar(s) if s.text.is_empty() && s.style == Style::Plain);
    if inline_new && empty_value {
        // `key:` with nothing after it (or only a comment).
        doc.insert_after_key(entry, &value.to_yaml_inline());
        return Ok(());
    }
    let indent = entry.key_pos.col - 1;
    let key_text = doc.key_text(entry);
    let rendered = format!(
        "{}{}{}",
        " ".repeat(indent),
        key_text,
        value.yaml_after_key(indent)
    );
    let last = if empty_value {
        entry.key_pos.line
    } else {
        old.end.line.max(entry.key_pos.line)
    };
    doc.replace_lines(entry.key_pos.line, last, &rendered);
    Ok(())
}

fn read_back_set(new: String, path: &str, value: &Value) -> Result<String, EditError> {
    let reread = yaml::parse(&new)
        .map_err(|e| EditError::ReadBack(e.to_string()))?
        .map(|n| n.to_value());
    let got = reread.as_ref().and_then(|v| v.get_path(path));
    if got != Some(value) {
        return Err(EditError::ReadBack(format!(
            "`{path}` read back as {}",
            got.map_or("nothing".to_string(), Value::to_yaml_inline)
        )));
    }
    Ok(new)
}

/// The text as lines that keep their own line endings.
struct Doc {
    lines: Vec<String>,
}

impl Doc {
    fn new(text: &str) -> Doc {
        Doc {
            lines: text.split_inclusive('\n').map(str::to_string).collect(),
        }
    }

    fn finish(self) -> String {
        self.lines.concat()
    }

    fn line(&self, line: usize) -> &str {
        self.lines
            .get(line.wrapping_sub(1))
            .map_or("", String::as_str)
    }

    /// Byte offset of the 1-based character column `col` in `line`.
    fn byte_at(&self, line: usize, col: usize) -> usize {
        let text = self.line(line);
        text.char_indices()
            .nth(col - 1)
            .map_or(text.len(), |(i, _)| i)
    }

    fn check_key_starts_line(&self, entry: &Entry) -> Result<(), EditError> {
        let before =
            &self.line(entry.key_pos.line)[..self.byte_at(entry.key_pos.line, entry.key_pos.col)];
        if before.chars().all(|c| c == ' ') {
            Ok(())
        } else {
            Err(EditError::FlowStyle {
                key: entry.key.clone(),
                line: entry.key_pos.line,
            })
        }
    }

    /// The key as written (quotes included), up to its colon.
    fn key_text(&self, entry: &Entry) -> String {
        let line = self.line(entry.key_pos.line);
        let start = self.byte_at(entry.key_pos.line, entry.key_pos.col);
        let rest = &line[start..];
        let quoted = rest.starts_with(['"', '\'']);
        let end = if quoted {
            let q = rest.as_bytes()[0] as char;
            rest[1..].find(q).map_or(rest.len(), |i| i + 2)
        } else {
            rest.find(':').unwrap_or(rest.len())
        };
        format!("{}:", rest[..end].trim_end())
    }

    fn ensure_newline(&mut self, line: usize) {
        if let Some(text) = self.lines.get_mut(line.wrapping_sub(1)) {
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
    }

    fn append(&mut self, block: &str) {
        let n = self.lines.len();
        self.ensure_newline(n);
        self.lines.push(block.to_string());
    }

    fn insert_after(&mut self, line: usize, block: &str) {
        self.ensure_newline(line);
        let at = line.min(self.lines.len());
        self.lines.insert(at, block.to_string());
    }

    fn replace_in_line(&mut self, line: usize, start_col: usize, end_col: usize, new: &str) {
        let start = self.byte_at(line, start_col);
        let end = self.byte_at(line, end_col);
        if let Some(text) = self.lines.get_mut(line - 1) {
            text.replace_range(start..end, new);
        }
    }

    /// `key:` or `key:   # comment` → `key: value` keeping the comment.
    fn insert_after_key(&mut self, entry: &Entry, new: &str) {
        let key_len = self.key_text(entry).chars().count();
        let at = self.byte_at(entry.key_pos.line, entry.key_pos.col + key_len);
        if let Some(text) = self.lines.get_mut(entry.key_pos.line - 1) {
            let rest = text[at..].trim_start_matches(' ').to_string();
            let tail = if rest.starts_with('#') {
                format!(" {rest}")
            } else {
                rest
            };
            text.replace_range(at.., &format!(" {new}{tail}"));
            if !text.ends_with('\n') && !tail.is_empty() {
                text.push('\n');
            }
        }
    }

    /// Replaces lines `first..=last` (1-based) by `block`.
    fn replace_lines(&mut self, first: usize, last: usize, block: &str) {
        let last = last.min(self.lines.len());
        let had_newline = self.lines.get(last - 1).is_some_and(|l| l.ends_with('\n'));
        let mut block = block.to_string();
        if !had_newline && block.ends_with('\n') && last == self.lines.len() {
            block.pop();
        }
        self.lines.splice(first - 1..last, std::iter::once(block));
    }
}

#[cfg(test)]
mod tests;
