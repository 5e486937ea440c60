//! The tools' schemas in the shapes every model's tool calling accepts.
//!
//! schemars describes a type faithfully for a JSON Schema validator:
//! another type by `$ref` into `$defs`, an optional field as
//! `"type": [T, "null"]` or a union with `{"type": "null"}`, an enum of
//! documented variants as a `oneOf` of `const`s, an integer's Rust type as
//! a `format`. Tool-call backends are stricter than validators: llama.cpp
//! builds its grammar from a subset (no references, one type a node, few
//! formats), Anthropic refuses unions at the top of an `input_schema`,
//! OpenAI's Codex endpoint refuses combinators there, draft-07 validators
//! refuse keywords beside a `$ref`.
//!
//! [`flatten`] rewrites a schema into the subset they all take: every
//! reference inlined, one type a node, a choice an `enum` (its values'
//! descriptions added to the node's), an optional field simply not
//! required, every object closed (`additionalProperties: false`) with
//! `properties` and `required`. What it cannot rewrite (a union of
//! different types, a reference that loops) it leaves as it is; the
//! tests over every tool find it.

use serde_json::{Map, Value};

/// The keys of a schema's definitions, in 2020-12 and in draft-07.
const DEFINITIONS: [&str; 2] = ["$defs", "definitions"];

/// `schema` (a tool's input or output schema) flat; see the module.
pub fn flatten(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut root = schema.clone();
    root.remove("$schema");
    let mut definitions = Map::new();
    let mut removed = Vec::new();
    for key in DEFINITIONS {
        if let Some(Value::Object(defs)) = root.remove(key) {
            for (name, def) in &defs {
                definitions.insert(format!("#/{key}/{name}"), def.clone());
            }
            removed.push((key, defs));
        }
    }
    let mut flat = Flattener {
        definitions: &definitions,
        inlining: Vec::new(),
        left: false,
    };
    let mut root = flat.node(root);
    if flat.left {
        // A type that holds itself: its references stay, and what they
        // point at with them.
        for (key, defs) in removed {
            root.insert(key.to_string(), Value::Object(defs));
        }
    }
    root
}

struct Flattener<'a> {
    /// Each definition by the reference that names it.
    definitions: &'a Map<String, Value>,
    /// The references being inlined, outermost first: one met again is a
    /// loop, left as a reference.
    inlining: Vec<String>,
    /// Whether a reference was left (a loop, or nothing it names).
    left: bool,
}

impl Flattener<'_> {
    fn value(&mut self, value: Value) -> Value {
        match value {
            Value::Object(node) => Value::Object(self.node(node)),
            other => other,
        }
    }

    /// A node flat: its own subschemas first, then what it refers to or
    /// unites (flat already when merged in, never walked again: a type
    /// that holds itself ends at its reference), then its own keywords.
    fn node(&mut self, mut node: Map<String, Value>) -> Map<String, Value> {
        for key in ["items", "additionalProperties"] {
            if let Some(Value::Object(schema)) = node.remove(key) {
                node.insert(key.to_string(), Value::Object(self.node(schema)));
            }
        }
        if let Some(Value::Object(properties)) = node.remove("properties") {
            let properties = properties
                .into_iter()
                .map(|(name, schema)| (name, self.value(schema)))
                .collect();
            node.insert("properties".to_string(), Value::Object(properties));
        }
        // A reference: the definition, with the node's own keywords (its
        // description) over the definition's.
        if let Some(Value::String(reference)) = node.get("$ref").cloned() {
            let found = self.definitions.get(&reference).cloned();
            match found {
                Some(Value::Object(def)) if !self.inlining.contains(&reference) => {
                    node.remove("$ref");
                    self.inlining.push(reference);
                    let def = self.node(def);
                    self.inlining.pop();
                    node = merged(def, node);
                }
                _ => self.left = true,
            }
        }
        if let Some(Value::Array(parts)) = node.remove("allOf") {
            for part in parts {
                if let Value::Object(part) = self.value(part) {
                    node = merged(part, node);
                }
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(variants)) = node.remove(key) {
                node = self.union(node, key, variants);
            }
        }
        own_keywords(&mut node);
        node
    }

    /// The node of an `anyOf` or `oneOf` of `variants`: the variant that
    /// is not null, or one `enum` of variants that are each one value.
    fn union(
        &mut self,
        node: Map<String, Value>,
        key: &str,
        variants: Vec<Value>,
    ) -> Map<String, Value> {
        let variants: Vec<Value> = variants.into_iter().map(|v| self.value(v)).collect();
        let not_null: Vec<&Value> = variants.iter().filter(|v| !is_null(v)).collect();
        if let [Value::Object(only)] = not_null.as_slice() {
            return merged(only.clone(), node);
        }
        if let Some(choice) = choice(&not_null) {
            return merged(choice, node);
        }
        let mut node = node;
        node.insert(key.to_string(), Value::Array(variants));
        node
    }
}

/// A node's own keywords in the subset: one type, no null, a choice an
/// `enum`, a format only on a string, an object closed.
fn own_keywords(node: &mut Map<String, Value>) {
    // One type: null is what an optional field can be sent, and the
    // field's being optional already says so.
    if let Some(Value::Array(types)) = node.get("type") {
        let mut types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let ty = match types.len() {
            1 => types.remove(0),
            _ => Value::Array(types),
        };
        node.insert("type".to_string(), ty);
    }
    node.remove("nullable");
    if node.get("default") == Some(&Value::Null) {
        node.remove("default");
    }
    if let Some(value) = node.remove("const") {
        node.insert("enum".to_string(), Value::Array(vec![value]));
    }
    if let Some(Value::Array(values)) = node.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if node.get("type").is_none() {
        if let Some(ty) = node.get("enum").and_then(enum_type) {
            node.insert("type".to_string(), Value::String(ty.to_string()));
        }
    }
    let ty = node.get("type").and_then(Value::as_str).map(str::to_string);
    // `uint64`, `int32`, `double`: the Rust type, which no backend reads
    // and some refuse.
    if ty.as_deref() != Some("string") {
        node.remove("format");
    }
    if ty.as_deref() == Some("object") {
        object(node);
    }
}

/// `over`'s keywords over `under`'s (properties and required names
/// together); their descriptions, where both have
/// one, joined (`over`'s, the field's, first; `under`'s, its type's or
/// its values', after).
fn merged(mut under: Map<String, Value>, over: Map<String, Value>) -> Map<String, Value> {
    let finer = under.remove("description");
    for (key, value) in over {
        match (under.get_mut(&key), value) {
            (Some(Value::Object(below)), Value::Object(above)) if key == "properties" => {
                below.extend(above);
            }
            (Some(Value::Array(below)), Value::Array(above)) if key == "required" => {
                for name in above {
                    if !below.contains(&name) {
                        below.push(name);
                    }
                }
            }
            (_, value) => {
                under.insert(key, value);
            }
        }
    }
    let description = match (under.remove("description"), finer) {
        (Some(Value::String(above)), Some(Value::String(below))) if !above.contains(&below) => {
            Some(Value::String(format!("{above}\n{below}")))
        }
        (Some(above), _) => Some(above),
        (None, below) => below,
    };
    if let Some(description) = description {
        under.insert("description".to_string(), description);
    }
    under
}

/// Variants that are each one value of one type, as one node: an `enum`
/// of them, their descriptions (a documented enum's variants) a line
/// each in the node's.
fn choice(variants: &[&Value]) -> Option<Map<String, Value>> {
    let mut values = Vec::new();
    let mut lines = Vec::new();
    for variant in variants {
        let variant = variant.as_object()?;
        let value = match variant.get("enum").and_then(Value::as_array) {
            Some(values) if values.len() == 1 => values[0].clone(),
            _ => return None,
        };
        if let Some(Value::String(d)) = variant.get("description") {
            let name = match &value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            lines.push(format!("{name}: {d}"));
        }
        values.push(value);
    }
    let values = Value::Array(values);
    let ty = enum_type(&values)?;
    let mut node = Map::new();
    node.insert("type".to_string(), Value::String(ty.to_string()));
    node.insert("enum".to_string(), values);
    if !lines.is_empty() {
        node.insert("description".to_string(), Value::String(lines.join("\n")));
    }
    Some(node)
}

/// The one type of every value of an `enum`, if they share one.
fn enum_type(values: &Value) -> Option<&'static str> {
    let values = values.as_array()?;
    let type_of = |v: &Value| match v {
        Value::String(_) => Some("string"),
        Value::Bool(_) => Some("boolean"),
        Value::Number(n) if n.is_f64() => Some("number"),
        Value::Number(_) => Some("integer"),
        _ => None,
    };
    let first = type_of(values.first()?)?;
    values
        .iter()
        .all(|v| type_of(v) == Some(first))
        .then_some(first)
}

fn is_null(variant: &Value) -> bool {
    variant.get("type") == Some(&Value::String("null".to_string()))
        || variant.get("enum") == Some(&Value::Array(vec![Value::Null]))
}

/// An object closed to other properties, with `properties` and only the
/// names of its properties `required`.
fn object(node: &mut Map<String, Value>) {
    let names: Vec<String> = match node
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()))
    {
        Value::Object(properties) => properties.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let required = match node.remove("required") {
        Some(Value::Array(required)) => required
            .into_iter()
            .filter(|r| r.as_str().is_some_and(|r| names.iter().any(|n| n == r)))
            .collect(),
        _ => Vec::new(),
    };
    node.insert("required".to_string(), Value::Array(required));
    if matches!(
        node.get("additionalProperties"),
        None | Some(Value::Bool(true))
    ) {
        node.insert("additionalProperties".to_string(), Value::Bool(false));
    }
}

#[cfg(test)]
mod tests {
    use rmcp::schemars;
    use serde_json::json;

    use super::*;

    /// Arguments with every shape schemars makes of a tool's arguments.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Arguments {
        /// A name.
        name: String,
        /// How many.
        #[serde(default)]
        count: Option<u32>,
        /// Which kind.
        kind: Kind,
        /// Which kind, if any.
        #[serde(default)]
        maybe: Option<Kind>,
        /// Another.
        inner: Inner,
        /// Others.
        #[serde(default)]
        others: Vec<Inner>,
        /// A flag.
        #[serde(default)]
        flag: bool,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Kind {
        /// The first.
        One,
        /// The second.
        Two,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        /// A path.
        path: Option<String>,
    }

    fn flat_of<T: schemars::JsonSchema + 'static>() -> Value {
        let schema = rmcp::handler::server::common::schema_for_input::<T>()
            .unwrap_or_else(|e| panic!("{e}"));
        Value::Object(flatten(&schema))
    }

    #[test]
    fn a_derived_schema_comes_out_flat() {
        let kind = json!({
            "type": "string",
            "enum": ["one", "two"],
        });
        let with = |description: &str| {
            let mut kind = kind.clone();
            kind["description"] =
                json!(format!("{description}\none: The first.\ntwo: The second."));
            kind
        };
        let inner = json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "A path." },
            },
            "required": [],
            "additionalProperties": false,
        });
        let mut described = inner.clone();
        described["description"] = json!("Another.");
        let others = json!({
            "type": "array",
            "items": inner,
            "description": "Others.",
        });
        assert_eq!(
            flat_of::<Arguments>(),
            json!({
                "type": "object",
                "properties": {
                    "name": { "type": "string", "description": "A name." },
                    "count": { "type": "integer", "minimum": 0, "description": "How many." },
                    "kind": with("Which kind."),
                    "maybe": with("Which kind, if any."),
                    "inner": described,
                    "others": others,
                    "flag": { "type": "boolean", "default": false, "description": "A flag." },
                },
                "required": ["name", "kind", "inner"],
                "additionalProperties": false,
            })
        );
    }

    /// A tree: the type is in itself, so its reference stays, and so does
    /// the definition it names.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Tree {
        /// The children.
        children: Vec<Tree>,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Forest {
        /// A tree.
        tree: Tree,
    }

    #[test]
    fn a_type_that_holds_itself_keeps_its_reference_and_its_definition() {
        let flat = flat_of::<Forest>();
        let inner = &flat["properties"]["tree"]["properties"]["children"]["items"];
        assert_eq!(inner["$ref"], "#/$defs/Tree", "{flat}");
        assert!(flat["$defs"]["Tree"].is_object(), "{flat}");
    }

    #[test]
    fn a_flat_schema_stays_as_it_is() {
        let flat = flat_of::<Arguments>();
        let Value::Object(object) = &flat else {
            panic!("{flat}");
        };
        assert_eq!(Value::Object(flatten(object)), flat);
    }

    /// The keys no tool's schema may hold, anywhere.
    fn unflat_keys(schema: &Value, found: &mut Vec<String>) {
        match schema {
            Value::Object(node) => {
                for (key, value) in node {
                    let unflat = matches!(
                        key.as_str(),
                        "$ref" | "$defs" | "definitions" | "oneOf" | "anyOf" | "allOf" | "const"
                    ) || (key == "type" && !value.is_string());
                    if unflat {
                        found.push(format!("{key}: {value}"));
                    }
                    unflat_keys(value, found);
                }
            }
            Value::Array(values) => values.iter().for_each(|v| unflat_keys(v, found)),
            _ => {}
        }
    }

    #[test]
    fn every_tool_the_server_lists_has_flat_schemas() {
        let tools = super::super::tools::router().list_all();
        assert_eq!(tools.len(), 4);
        for tool in tools {
            let mut found = Vec::new();
            unflat_keys(
                &Value::Object(tool.input_schema.as_ref().clone()),
                &mut found,
            );
            if let Some(output) = &tool.output_schema {
                unflat_keys(&Value::Object(output.as_ref().clone()), &mut found);
            }
            assert!(found.is_empty(), "{}: {found:?}", tool.name);
        }
    }
}
