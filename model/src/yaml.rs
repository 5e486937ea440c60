//! A positioned YAML tree, read with hard limits.
//!
//! `parse` turns the text of one YAML document into a [`Node`] tree in which
//! every node knows its line and column, so that validation can say *where*
//! a value is wrong and `config set` can edit the text in place. Hostile
//! input gets an error, never a hang: the text is capped in size, nesting is
//! capped in depth, and aliases are expanded against a node budget (the
//! "billion laughs" document fails after a few thousand nodes).
//!
//! Scalars resolve as PyYAML does for the words people write in config files
//! (`yes`/`no`/`on`/`off` are booleans), since the files we read were written
//! for the Python reference.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span};

use crate::value::Value;

/// Largest config text we read. Config files are a few kilobytes.
pub const MAX_BYTES: usize = 1024 * 1024;
/// Deepest nesting of collections.
pub const MAX_DEPTH: usize = 64;
/// Most nodes in one document, aliases expanded.
pub const MAX_NODES: usize = 20_000;

/// A place in the text: line and column, both counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    fn from_marker(m: saphyr_parser::Marker) -> Pos {
        Pos {
            line: m.line(),
            col: m.col() + 1,
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.col)
    }
}

/// A YAML node with where it starts and the line its content ends on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub start: Pos,
    /// Where the node's content ends (exclusive). For a block collection:
    /// where its last descendant ends. For a block scalar the column is 0,
    /// only the line is meaningful.
    pub end: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Scalar(Scalar),
    Seq { items: Vec<Node>, flow: bool },
    Map { entries: Vec<Entry>, flow: bool },
}

/// A scalar as written: its text, whether it was quoted (or a block
/// scalar), and its tag if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub text: String,
    pub style: Style,
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    Quoted,
    Block,
}

/// One `key: value` pair of a mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

/// Why a text is not a YAML document we accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", .pos.map(|p| format!("{p}: ")).unwrap_or_default())]
pub struct YamlError {
    pub pos: Option<Pos>,
    pub message: String,
}

impl YamlError {
    fn at(pos: Pos, message: impl Into<String>) -> YamlError {
        YamlError {
            pos: Some(pos),
            message: message.into(),
        }
    }
}

impl From<ScanError> for YamlError {
    fn from(e: ScanError) -> YamlError {
        YamlError::at(Pos::from_marker(*e.marker()), e.info().to_string())
    }
}

impl Node {
    /// The entries of a mapping node, or `None`.
    pub fn entries(&self) -> Option<&[Entry]> {
        match &self.kind {
            NodeKind::Map { entries, .. } => Some(entries),
            _ => None,
        }
    }

    /// The value under `key` in a mapping node.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries()?.iter().find(|e| e.key == key)
    }

    /// A short name of the node's kind, for messages ("a mapping").
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            NodeKind::Map { .. } => "a mapping",
            NodeKind::Seq { .. } => "a list",
            NodeKind::Scalar(_) => match self.to_value() {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Int(_) => "an integer",
                Value::Float(_) => "a number",
                _ => "a string",
            },
        }
    }

    /// The plain value of this node, positions dropped.
    pub fn to_value(&self) -> Value {
        match &self.kind {
            NodeKind::Scalar(s) => s.resolve(),
            NodeKind::Seq { items, .. } => Value::Seq(items.iter().map(Node::to_value).collect()),
            NodeKind::Map { entries, .. } => Value::Map(
                entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_value()))
                    .collect(),
            ),
        }
    }
}

impl Scalar {
    /// The value this scalar stands for: quoted text is always a string;
    /// plain text resolves to null, a boolean, a number or a string.
    pub fn resolve(&self) -> Value {
        match self.tag.as_deref() {
            Some("str") => return Value::Str(self.text.clone()),
            Some("null") => return Value::Null,
            Some("bool") | Some("int") | Some("float") | None => {}
            Some(_) => return Value::Str(self.text.clone()),
        }
        match self.style {
            Style::Plain => resolve_plain(&self.text),
            Style::Quoted | Style::Block => Value::Str(self.text.clone()),
        }
    }
}

/// Resolves a plain scalar the way PyYAML reads config files.
pub fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
            return Value::Bool(true);
        }
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
            return Value::Bool(false);
        }
        _ => {}
    }
    if let Some(i) = parse_int(text) {
        return Value::Int(i);
    }
    if let Some(f) = parse_float(text) {
        return Value::Float(f);
    }
    Value::Str(text.to_string())
}

fn parse_int(text: &str) -> Option<i64> {
    let (neg, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = if let Some(hex) = digits.strip_prefix("0x") {
        i64::from_str_radix(hex, 16).ok()?
    } else if let Some(oct) = digits.strip_prefix("0o") {
        i64::from_str_radix(oct, 8).ok()?
    } else if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse::<i64>().ok()?
    } else {
        return None;
    };
    Some(if neg { -magnitude } else { magnitude })
}

fn parse_float(text: &str) -> Option<f64> {
    match text {
        ".inf" | ".Inf" | ".INF" | "+.inf" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    let body = text.trim_start_matches(['-', '+']);
    // Only decimal notation: "1e3" and "1.5" are numbers, "inf" is text.
    let first = body.as_bytes().first()?;
    if !(first.is_ascii_digit() || *first == b'.') || !body.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    if !body
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
    {
        return None;
    }
    text.parse::<f64>().ok()
}

/// Reads raw bytes as config text: refuses what is too large, not UTF-8,
/// or binary, naming the line.
pub fn text_from_bytes(bytes: &[u8]) -> Result<&str, YamlError> {
    if bytes.len() > MAX_BYTES {
        return Err(YamlError {
            pos: None,
            message: format!(
                "the file is {} bytes; a config file may be at most {} bytes",
                bytes.len(),
                MAX_BYTES
            ),
        });
    }
    // Binary data first: a NUL or other control byte is never config text.
    if let Some(i) = bytes
        .iter()
        .position(|&b| (b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t')) || b == 0x7f)
    {
        return Err(YamlError::at(
            position_after(&bytes[..i]),
            "the file holds binary data (a control character)",
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let valid = &bytes[..e.valid_up_to()];
        YamlError::at(position_after(valid), "the file is not UTF-8 text")
    })?;
    Ok(text)
}

fn position_after(prefix: &[u8]) -> Pos {
    let line = prefix.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = prefix
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let col = String::from_utf8_lossy(&prefix[line_start..])
        .chars()
        .count()
        + 1;
    Pos { line, col }
}

/// Parses one YAML document. An empty document (only comments or blank
/// lines) gives `Ok(None)`.
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    text_from_bytes(text.as_bytes())?;
    let mut builder = Builder::new(text);
    let mut parser = Parser::new_from_str(text);
    let mut documents = 0usize;
    while let Some(event) = parser.next_event() {
        let (event, span) = event?;
        match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(YamlError::at(
                        Pos::from_marker(span.start),
                        "the file holds more than one YAML document (a second `---`)",
                    ));
                }
            }
            Event::StreamEnd => break,
            other => builder.event(other, span)?,
        }
    }
    Ok(builder.root)
}

/// A collection under construction.
enum Open {
    Seq {
        items: Vec<Node>,
        start: Pos,
        flow: bool,
        anchor: usize,
    },
    Map {
        entries: Vec<Entry>,
        pending_key: Option<(String, Pos)>,
        start: Pos,
        flow: bool,
        anchor: usize,
    },
}

struct Builder<'t> {
    lines: Vec<&'t str>,
    stack: Vec<Open>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    root: Option<Node>,
}

impl<'t> Builder<'t> {
    fn new(text: &'t str) -> Self {
        Builder {
            lines: text.lines().collect(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            nodes: 0,
            root: None,
        }
    }

    /// Whether the collection that starts at `pos` is written in flow style.
    fn is_flow_at(&self, pos: Pos, open: char) -> bool {
        self.lines
            .get(pos.line.wrapping_sub(1))
            .and_then(|l| l.chars().nth(pos.col - 1))
            == Some(open)
    }

    /// The column just after the quote that closes the one-line quoted
    /// scalar starting at `pos`.
    fn closing_quote(&self, pos: Pos) -> Option<usize> {
        let line = self.lines.get(pos.line.wrapping_sub(1))?;
        let mut chars = line.chars().skip(pos.col - 1);
        let quote = chars.next()?;
        let mut col = pos.col;
        let mut escaped = false;
        let mut pending_single = false;
        for c in chars {
            col += 1;
            if quote == '\'' {
                if pending_single {
                    if c == '\'' {
                        pending_single = false;
                        continue;
                    }
                    return Some(col);
                }
                if c == '\'' {
                    pending_single = true;
                }
            } else if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                return Some(col + 1);
            }
        }
        pending_single.then_some(col + 1)
    }

    fn count(&mut self, n: usize, pos: Pos) -> Result<(), YamlError> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(YamlError::at(
                pos,
                format!("the document expands to more than {MAX_NODES} nodes (aliases included)"),
            ));
        }
        Ok(())
    }

    fn open(&mut self, open: Open, pos: Pos) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(YamlError::at(
                pos,
                format!("nesting deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.count(1, pos)?;
        self.stack.push(open);
        Ok(())
    }

    fn event(&mut self, event: Event<'_>, span: Span) -> Result<(), YamlError> {
        let pos = Pos::from_marker(span.start);
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, pos)?;
                let style = match style {
                    ScalarStyle::Plain => Style::Plain,
                    ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => Style::Quoted,
                    ScalarStyle::Literal | ScalarStyle::Folded => Style::Block,
                };
                let tag = match tag {
                    Some(t) if t.handle == "tag:yaml.org,2002:" || t.handle == "!!" => {
                        Some(t.suffix.clone())
                    }
                    Some(t) => {
                        return Err(YamlError::at(
                            pos,
                            format!("unsupported YAML tag `{}{}`", t.handle, t.suffix),
                        ));
                    }
                    None => None,
                };
                let mut end = Pos::from_marker(span.end);
                if style == Style::Quoted {
                    // The parser's span of a quoted scalar runs on over the
                    // spaces and comment after it: find the closing quote.
                    if let Some(col) = self.closing_quote(pos) {
                        end = Pos {
                            line: pos.line,
                            col,
                        };
                    }
                } else if end.line > pos.line && end.col == 1 {
                    // A block scalar's span ends at the start of the next line.
                    end = Pos {
                        line: end.line - 1,
                        col: 0,
                    };
                }
                let node = Node {
                    kind: NodeKind::Scalar(Scalar {
                        text: text.into_owned(),
                        style,
                        tag,
                    }),
                    start: pos,
                    end: end.max(pos),
                };
                self.remember(anchor, &node);
                self.push(node)
            }
            Event::Alias(id) => {
                let Some(target) = self.anchors.get(&id) else {
                    return Err(YamlError::at(pos, "alias to an unknown anchor"));
                };
                let mut node = target.clone();
                let size = node_count(&node);
                self.count(size, pos)?;
                node.start = pos;
                node.end = Pos::from_marker(span.end);
                self.push(node)
            }
            Event::SequenceStart(anchor, _) => {
                let flow = self.is_flow_at(pos, '[');
                self.open(
                    Open::Seq {
                        items: Vec::new(),
                        start: pos,
                        flow,
                        anchor,
                    },
                    pos,
                )
            }
            Event::MappingStart(anchor, _) => {
                let flow = self.is_flow_at(pos, '{');
                self.open(
                    Open::Map {
                        entries: Vec::new(),
                        pending_key: None,
                        start: pos,
                        flow,
                        anchor,
                    },
                    pos,
                )
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let end = Pos::from_marker(span.end);
                let Some(open) = self.stack.pop() else {
                    return Err(YamlError::at(pos, "unbalanced collection end"));
                };
                let (node, anchor) = match open {
                    Open::Seq {
                        items,
                        start,
                        flow,
                        anchor,
                    } => {
                        let last = items.last().map_or(start, |n| n.end);
                        (
                            Node {
                                kind: NodeKind::Seq { items, flow },
                                start,
                                end: if flow { end.max(last) } else { last },
                            },
                            anchor,
                        )
                    }
                    Open::Map {
                        entries,
                        start,
                        flow,
                        anchor,
                        ..
                    } => {
                        let last = entries.last().map_or(start, |e| e.value.end);
                        (
                            Node {
                                kind: NodeKind::Map { entries, flow },
                                start,
                                end: if flow { end.max(last) } else { last },
                            },
                            anchor,
                        )
                    }
                };
                self.remember(anchor, &node);
                self.push(node)
            }
            Event::DocumentEnd | Event::StreamStart | Event::Nothing => Ok(()),
            Event::DocumentStart(_) | Event::StreamEnd => Ok(()),
        }
    }

    fn remember(&mut self, anchor: usize, node: &Node) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
    }

    /// Hands a finished node to the collection that holds it.
    fn push(&mut self, node: Node) -> Result<(), YamlError> {
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Open::Seq { items, .. }) => {
                items.push(node);
                Ok(())
            }
            Some(Open::Map {
                entries,
                pending_key,
                ..
            }) => match pending_key.take() {
                None => {
                    let key = match &node.kind {
                        NodeKind::Scalar(s) => s.text.clone(),
                        _ => {
                            return Err(YamlError::at(
                                node.start,
                                "a mapping key must be a plain word, not a collection",
                            ));
                        }
                    };
                    if let Some(first) = entries.iter().find(|e| e.key == key) {
                        return Err(YamlError::at(
                            node.start,
                            format!(
                                "duplicate key `{key}` (first defined at line {})",
                                first.key_pos.line
                            ),
                        ));
                    }
                    *pending_key = Some((key, node.start));
                    Ok(())
                }
                Some((key, key_pos)) => {
                    entries.push(Entry {
                        key,
                        key_pos,
                        value: node,
                    });
                    Ok(())
                }
            },
        }
    }
}

fn node_count(node: &Node) -> usize {
    match &node.kind {
        NodeKind::Scalar(_) => 1,
        NodeKind::Seq { items, .. } => 1 + items.iter().map(node_count).sum::<usize>(),
        NodeKind::Map { entries, .. } => {
            1 + entries
                .iter()
                .map(|e| 1 + node_count(&e.value))
                .sum::<usize>()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn root(text: &str) -> Node {
        parse(text).unwrap().unwrap()
    }

    #[test]
    fn nodes_know_their_lines_and_columns() {
        let n = root("# c\nterminal:\n  backend: docker\n  timeout: 5\n");
        let terminal = n.get("terminal").unwrap();
        assert_eq!(terminal.key_pos, Pos { line: 2, col: 1 });
        let backend = terminal.value.get("backend").unwrap();
        assert_eq!(backend.key_pos, Pos { line: 3, col: 3 });
        assert_eq!(backend.value.start, Pos { line: 3, col: 12 });
        assert_eq!(terminal.value.end.line, 4);
        assert_eq!(backend.value.end, Pos { line: 3, col: 18 });
    }

    #[test]
    fn quoted_scalars_end_at_their_closing_quote() {
        for (text, col) in [
            ("k: \"a \\\" b\"  # c\n", 12),
            ("k: 'it''s'  # c\n", 11),
            ("k: 'x'\n", 7),
            ("k: \"ü\" # c\n", 7),
        ] {
            let n = root(text);
            assert_eq!(
                n.get("k").unwrap().value.end,
                Pos { line: 1, col },
                "{text}"
            );
        }
    }

    #[test]
    fn a_block_scalar_ends_on_its_last_line() {
        let n = root("a: |\n  one\n  two\nb: 1\n");
        assert_eq!(n.get("a").unwrap().value.end.line, 3);
    }

    #[test]
    fn plain_scalars_resolve_like_pyyaml() {
        assert_eq!(resolve_plain("yes"), Value::Bool(true));
        assert_eq!(resolve_plain("off"), Value::Bool(false));
        assert_eq!(resolve_plain("~"), Value::Null);
        assert_eq!(resolve_plain("-12"), Value::Int(-12));
        assert_eq!(resolve_plain("0x1f"), Value::Int(31));
        assert_eq!(resolve_plain("1.5"), Value::Float(1.5));
        assert_eq!(resolve_plain("1g"), Value::Str("1g".into()));
        assert_eq!(resolve_plain("inf"), Value::Str("inf".into()));
        assert_eq!(resolve_plain("1.2.3"), Value::Str("1.2.3".into()));
    }

    #[test]
    fn quoted_scalars_stay_strings() {
        let n = root("a: '5'\nb: \"yes\"\nc: !!str 7\n");
        assert_eq!(n.to_value().get("a"), Some(&Value::Str("5".into())));
        assert_eq!(n.to_value().get("b"), Some(&Value::Str("yes".into())));
        assert_eq!(n.to_value().get("c"), Some(&Value::Str("7".into())));
    }

    #[test]
    fn duplicate_keys_are_refused_with_both_lines() {
        let e = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 3, col: 1 }));
        assert!(e.message.contains("duplicate key `a`"), "{e}");
        assert!(e.message.contains("line 1"), "{e}");
    }

    #[test]
    fn empty_documents_are_none() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n\n").unwrap(), None);
    }

    #[test]
    fn deep_nesting_is_refused_quickly() {
        let text = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(parse(&text).is_err());
        let mut block = String::new();
        for i in 0..200 {
            block.push_str(&" ".repeat(i));
            block.push_str("k:\n");
        }
        let e = parse(&block).unwrap_err();
        assert!(e.message.contains("nesting"), "{e}");
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for name in 'b'..='j' {
            text.push_str(&format!(
                "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = name;
        }
        // Refused, never expanded (ten billion nodes): a bound that only
        // a hang misses, whatever the machine's load.
        let started = std::time::Instant::now();
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("nodes"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn aliases_within_budget_expand() {
        let n = root("base: &b {x: 1}\nother: *b\n");
        assert_eq!(
            n.to_value().get("other"),
            Some(&Value::Map(vec![("x".into(), Value::Int(1))]))
        );
    }

    #[test]
    fn binary_and_oversized_input_is_refused() {
        let e = text_from_bytes(b"a: 1\nb: \x00\x01").unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 2, col: 4 }));
        let e = text_from_bytes(b"a: 1\n\xff\xfe").unwrap_err();
        assert!(e.message.contains("UTF-8"));
        let big = vec![b'#'; MAX_BYTES + 1];
        assert!(
            text_from_bytes(&big)
                .unwrap_err()
                .message
                .contains("at most")
        );
    }

    #[test]
    fn a_second_document_is_refused() {
        let e = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(e.pos.map(|p| p.line), Some(2));
    }

    #[test]
    fn flow_collections_are_marked() {
        let n = root("a: {x: 1}\nb: [1]\nc:\n  - 1\n");
        assert!(matches!(
            n.get("a").unwrap().value.kind,
            NodeKind::Map { flow: true, .. }
        ));
        assert!(matches!(
            n.get("b").unwrap().value.kind,
            NodeKind::Seq { flow: true, .. }
        ));
        assert!(matches!(
            n.get("c").unwrap().value.kind,
            NodeKind::Seq { flow: false, .. }
        ));
    }
}
