//! Writing a policy file back in the style it was read: `policy export` over a folder kept in
//! git should change the lines whose values changed, not turn every `tools: [a, b]` into a
//! block list. serde_yaml writes block style only, so the top two levels are laid out here,
//! following the file being replaced: key order, and flow (`[a, b]`, `{k: v}`) or block style
//! per key. Values below that, and every scalar, are serde_yaml's. Comments are not kept.
//!
//! Whatever is written is parsed again and compared with the value; on any difference the
//! plain serde_yaml rendering is written instead, so a style can never change a policy.

use serde_json::{Map, Value};

/// How a key of the file being replaced was written.
#[derive(Debug, Default)]
struct Shape {
    /// Top-level keys in the order written, each with its style.
    keys: Vec<(String, Style)>,
}

#[derive(Debug, Clone)]
enum Style {
    Flow,
    /// A block map or list; for a map, its keys in order with whether each was flow.
    Block(Vec<(String, bool)>),
}

fn opens_flow(rest: &str) -> bool {
    let rest = rest.trim_start();
    rest.starts_with('[') || rest.starts_with('{')
}

/// `key: rest` at the start of `line`, for a plain or quoted key.
fn key_line(line: &str) -> Option<(String, &str)> {
    let (key, rest) = if let Some(q) = line.strip_prefix('"').or_else(|| line.strip_prefix('\'')) {
        let quote = line.chars().next()?;
        let end = q.find(quote)?;
        (q[..end].to_owned(), q[end + 1..].strip_prefix(':')?)
    } else {
        let at = line
            .find(": ")
            .or_else(|| line.strip_suffix(':').map(str::len))?;
        let key = &line[..at];
        if key.is_empty() || key.contains(['#', '[', '{', '"', '\'']) {
            return None;
        }
        (key.to_owned(), &line[at + 1..])
    };
    Some((key, rest))
}

fn shape_of(previous: &str) -> Shape {
    let mut shape = Shape::default();
    // The indentation of the current top-level key's children: its first indented line's.
    let mut child_indent = None;
    for line in previous.lines() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 {
            child_indent = None;
            if let Some((key, rest)) = key_line(line) {
                let style = if opens_flow(rest) {
                    Style::Flow
                } else {
                    Style::Block(Vec::new())
                };
                shape.keys.push((key, style));
            }
            continue;
        }
        if *child_indent.get_or_insert(indent) != indent || trimmed.starts_with("- ") {
            continue;
        }
        if let Some((_, Style::Block(children))) = shape.keys.last_mut()
            && let Some((key, rest)) = key_line(trimmed)
        {
            children.push((key, opens_flow(rest)));
        }
    }
    shape
}

/// A string as a flow scalar: plain when nothing in it can be misread, JSON-quoted (a valid
/// YAML double-quoted scalar) otherwise.
fn flow_str(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | '/'))
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        s.to_owned()
    } else {
        Value::from(s).to_string()
    }
}

fn flow(v: &Value) -> String {
    match v {
        Value::String(s) => flow_str(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(flow).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", flow_str(k), flow(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// serde_yaml's block rendering of one `key: value`, indented by `indent` spaces.
fn block(key: &str, v: &Value, indent: usize) -> Option<String> {
    let mut one = Map::new();
    one.insert(key.to_owned(), v.clone());
    let text = serde_yaml::to_string(&Value::Object(one)).ok()?;
    let pad = " ".repeat(indent);
    Some(text.lines().map(|l| format!("{pad}{l}\n")).collect())
}

fn is_collection(v: &Value) -> bool {
    matches!(v, Value::Array(a) if !a.is_empty()) || matches!(v, Value::Object(o) if !o.is_empty())
}

fn render(value: &Map<String, Value>, shape: &Shape) -> Option<String> {
    // The previous file's order first, then what it did not have, in the value's order.
    let mut order: Vec<&str> = shape
        .keys
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| value.contains_key(*k))
        .collect();
    for k in value.keys() {
        if !order.contains(&k.as_str()) {
            order.push(k);
        }
    }
    let mut out = String::new();
    for key in order {
        let v = &value[key];
        let style = shape.keys.iter().find(|(k, _)| k == key).map(|(_, s)| s);
        match (style, v) {
            (Some(Style::Flow), v) if is_collection(v) => {
                out.push_str(&format!("{}: {}\n", flow_str(key), flow(v)));
            }
            (Some(Style::Block(children)), Value::Object(map)) if !map.is_empty() => {
                out.push_str(&format!("{}:\n", flow_str(key)));
                let mut keys: Vec<&str> = children
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .filter(|k| map.contains_key(*k))
                    .collect();
                for k in map.keys() {
                    if !keys.contains(&k.as_str()) {
                        keys.push(k);
                    }
                }
                for k in keys {
                    let child = &map[k];
                    let was_flow = children.iter().any(|(c, f)| c == k && *f);
                    if was_flow && is_collection(child) {
                        out.push_str(&format!("  {}: {}\n", flow_str(k), flow(child)));
                    } else {
                        out.push_str(&block(k, child, 2)?);
                    }
                }
            }
            _ => out.push_str(&block(key, v, 0)?),
        }
    }
    Some(out)
}

/// `value` (a map) as YAML, laid out like `previous` where it has the same keys.
pub fn to_yaml_like(value: &Value, previous: Option<&str>) -> anyhow::Result<String> {
    let plain = serde_yaml::to_string(value)?;
    let (Some(previous), Value::Object(map)) = (previous, value) else {
        return Ok(plain);
    };
    let Some(styled) = render(map, &shape_of(previous)) else {
        return Ok(plain);
    };
    // The style is only a layout: it must read back as exactly the value.
    let back: Option<Value> = serde_yaml::from_str(&styled).ok();
    Ok(if back.as_ref() == Some(value) {
        styled
    } else {
        plain
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flow_stays_flow_and_block_stays_block_in_the_order_read() {
        let previous = "description: Weather agent.\ntools: [weather, search]\nrate_limit: {per_second: 5, burst: 10}\ntool_limits:\n  weather__forecast: {per_minute: 30, burst: 2}\n  search:\n    per_minute: 5\npinned:\n- weather__now\n";
        let value = json!({
            "description": "Weather agent.",
            "tools": ["weather", "search", "maps"],
            "pinned": ["weather__now"],
            "rate_limit": {"per_second": 5, "burst": 10},
            "tool_limits": {"search": {"per_minute": 5}, "weather__forecast": {"per_minute": 30, "burst": 2}},
            "users": ["ada"],
        });
        let out = to_yaml_like(&value, Some(previous)).unwrap();
        assert_eq!(
            out,
            "description: Weather agent.\ntools: [weather, search, maps]\nrate_limit: {per_second: 5, burst: 10}\ntool_limits:\n  weather__forecast: {per_minute: 30, burst: 2}\n  search:\n    per_minute: 5\npinned:\n- weather__now\nusers:\n- ada\n"
        );
    }

    #[test]
    fn strings_that_could_be_misread_in_flow_are_quoted_and_read_back_the_same() {
        let previous = "tools: [a]\narguments: {x: {enum: [a]}}\n";
        let value = json!({
            "tools": ["yes", "a, b", "1.5", "#c", "ok*", "x: y", "]"],
            "arguments": {"x": {"enum": ["no", "{", "", "ünï"], "maximum": 3}},
        });
        let out = to_yaml_like(&value, Some(previous)).unwrap();
        assert!(
            out.starts_with("tools: [\"yes\", \"a, b\", \"1.5\""),
            "{out}"
        );
        let back: Value = serde_yaml::from_str(&out).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn without_a_previous_file_it_is_serde_yamls_block_style() {
        let value = json!({"tools": ["a"]});
        assert_eq!(to_yaml_like(&value, None).unwrap(), "tools:\n- a\n");
    }
}
