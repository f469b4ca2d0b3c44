//! Argument rules: grants that narrow what a tool may be called with.
//!
//! A rule is a JSON Schema fragment per parameter (`{"days": {"maximum": 3}}`), keyed by a
//! tool name or by a group name (then it applies to every tool of the group that has that
//! parameter). Rules only narrow: they use the keywords that restrict a value (`enum`,
//! `const`, bounds, lengths, `pattern`, `items`), never ones that could widen or reshape the
//! tool's own schema.
//!
//! For each agent the snapshot turns its rules into a narrowed copy of each tool they touch:
//! the tool's input schema with the rules merged in (what the model is shown, so that a
//! well-behaved model never sends a refused call) and the compiled checks the core path runs
//! before anything else. Rules that cannot do what their author meant — a parameter the tool
//! does not have, a tool the agent is not granted, a keyword of the wrong type, a rule no value
//! can satisfy — are reported as [`RuleProblem`]s, loudly, like zero-match grants.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::GrantTarget;
use crate::pool::{ArgumentCheck, Catalog, HttpBinding, Narrowing, Tool};

/// The keywords a rule may use.
pub const KEYWORDS: &[&str] = &[
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "items",
    "minItems",
    "maxItems",
];

const NUMERIC: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
const STRING: &[&str] = &["minLength", "maxLength", "pattern"];
const ARRAY: &[&str] = &["items", "minItems", "maxItems"];

/// Bounds on what a rule may hold: rules are admin input, but they end up in every call's
/// path and in every list, so they stay small.
const MAX_PARAMS: usize = 64;
const MAX_RULE_BYTES: usize = 16 * 1024;
const MAX_PARAM_NAME: usize = 128;

/// One parameter's rule: a checked JSON Schema fragment.
pub type ParamRule = Map<String, Value>;

/// An agent's rules for one tool or group, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArgumentRules {
    /// The tool (`weather__forecast`) or group (`weather`) the rules are keyed by.
    pub target: String,
    /// Parameter name → rule.
    pub params: BTreeMap<String, ParamRule>,
}

/// What is wrong with a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The rule is keyed by a tool or group the agent is not granted (or that does not exist).
    NotGranted,
    /// No tool the rule is keyed by has that parameter.
    UnknownParameter,
    /// A keyword that does not apply to the parameter's type (`minimum` on a string).
    WrongType,
    /// No value satisfies both the tool's schema and the rule: every call is refused.
    Unsatisfiable,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::NotGranted => "not_granted",
            ProblemKind::UnknownParameter => "unknown_parameter",
            ProblemKind::WrongType => "wrong_type",
            ProblemKind::Unsatisfiable => "unsatisfiable",
        }
    }

    /// As the admin UI shows it.
    pub fn label(self) -> &'static str {
        match self {
            ProblemKind::NotGranted => "not granted",
            ProblemKind::UnknownParameter => "unknown parameter",
            ProblemKind::WrongType => "wrong type",
            ProblemKind::Unsatisfiable => "refuses every call",
        }
    }
}

/// A rule that cannot do what its author meant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleProblem {
    pub target: String,
    pub param: Option<String>,
    pub kind: ProblemKind,
    pub message: String,
    /// The nearest existing name (parameter, tool or group), when there is one.
    pub suggestion: Option<String>,
}

/// Parses the rules of one target as written (`{"days": {"maximum": 3}}`), checking their form:
/// only narrowing keywords, each with a value of the right kind, a `pattern` that compiles.
pub fn parse_params(value: &Value) -> Result<BTreeMap<String, ParamRule>, String> {
    let Value::Object(map) = value else {
        return Err("argument rules must be an object of parameter name → rule".into());
    };
    if map.is_empty() {
        return Err("argument rules must name at least one parameter".into());
    }
    if map.len() > MAX_PARAMS {
        return Err(format!("at most {MAX_PARAMS} parameters may have rules"));
    }
    if serde_json::to_vec(value).map_or(0, |v| v.len()) > MAX_RULE_BYTES {
        return Err(format!(
            "argument rules are limited to {MAX_RULE_BYTES} bytes"
        ));
    }
    let mut out = BTreeMap::new();
    for (param, rule) in map {
        if param.is_empty() || param.len() > MAX_PARAM_NAME || param.contains('\0') {
            return Err(format!(
                "parameter name {param:?} must be 1-{MAX_PARAM_NAME} characters without NUL"
            ));
        }
        let rule = parse_rule(rule).map_err(|e| format!("rule on `{param}`: {e}"))?;
        out.insert(param.clone(), rule);
    }
    Ok(out)
}

fn parse_rule(rule: &Value) -> Result<ParamRule, String> {
    let Value::Object(rule) = rule else {
        return Err("a rule is an object of JSON Schema keywords, like {\"maximum\": 3}".into());
    };
    if rule.is_empty() {
        return Err("a rule must use at least one keyword".into());
    }
    for (k, v) in rule {
        if !KEYWORDS.contains(&k.as_str()) {
            let hint = KEYWORDS
                .iter()
                .min_by_key(|w| strsim::damerau_levenshtein(k, w))
                .filter(|w| strsim::damerau_levenshtein(k, w) <= 3)
                .map(|w| format!("; did you mean `{w}`?"))
                .unwrap_or_default();
            return Err(format!(
                "`{k}` is not a narrowing keyword (one of {}){hint}",
                KEYWORDS.join(", ")
            ));
        }
        match k.as_str() {
            "enum" => match v {
                Value::Array(a) if !a.is_empty() => {}
                _ => return Err("`enum` must be a non-empty array".into()),
            },
            "const" => {}
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
                if !v.is_number() {
                    return Err(format!("`{k}` must be a number"));
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" => {
                if !v.is_u64() {
                    return Err(format!("`{k}` must be a non-negative integer"));
                }
            }
            "pattern" => {
                let Some(p) = v.as_str() else {
                    return Err("`pattern` must be a string".into());
                };
                if jsonschema::validator_for(&json!({"pattern": p})).is_err() {
                    return Err(format!("`pattern` {p:?} is not a valid regular expression"));
                }
            }
            "items" => {
                parse_rule(v).map_err(|e| format!("in `items`: {e}"))?;
            }
            _ => unreachable!("every keyword of KEYWORDS is matched"),
        }
    }
    Ok(rule.clone())
}

/// The rules of `agent` that apply to `tool`, with the target they are keyed by.
fn applicable<'r>(
    rules: &'r [ArgumentRules],
    tool: &str,
) -> Vec<(&'r str, &'r str, &'r ParamRule)> {
    let mut out = Vec::new();
    for r in rules {
        let Ok(target) = GrantTarget::parse(&r.target) else {
            continue;
        };
        if !target.matches(tool) {
            continue;
        }
        for (param, rule) in &r.params {
            out.push((r.target.as_str(), param.as_str(), rule));
        }
    }
    out
}

fn properties(schema: &Map<String, Value>) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// The parameter types a property schema declares; empty when it does not say.
fn types(prop: &Value) -> BTreeSet<String> {
    match prop.get("type") {
        Some(Value::String(t)) => [t.clone()].into(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// Why `rule` cannot apply to a parameter whose schema is `prop`, if it cannot.
fn wrong_type(prop: &Value, rule: &ParamRule) -> Option<String> {
    let ts = types(prop);
    if ts.is_empty() {
        return None;
    }
    let has = |t: &str| ts.contains(t) || (t == "number" && ts.contains("integer"));
    for k in rule.keys() {
        let (needs, what) = if NUMERIC.contains(&k.as_str()) {
            ("number", "numbers")
        } else if STRING.contains(&k.as_str()) {
            ("string", "strings")
        } else if ARRAY.contains(&k.as_str()) {
            ("array", "arrays")
        } else {
            continue;
        };
        if !has(needs) {
            let ts: Vec<&str> = ts.iter().map(String::as_str).collect();
            return Some(format!(
                "`{k}` applies to {what}, but it is of type {}",
                ts.join(" or ")
            ));
        }
    }
    if let (Some(items_rule), Some(items)) = (
        rule.get("items").and_then(Value::as_object),
        prop.get("items"),
    ) {
        return wrong_type(items, items_rule).map(|m| format!("in `items`: {m}"));
    }
    None
}

fn num(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

/// Why no value satisfies `prop` and `rule` together, when that can be shown.
fn unsatisfiable(prop: &Value, rule: &ParamRule) -> Option<String> {
    let both = json!({"allOf": [prop, Value::Object(rule.clone())]});
    let accepts = |v: &Value| {
        jsonschema::validator_for(&both)
            .map(|s| s.is_valid(v))
            .unwrap_or(false)
    };
    // A finite set of candidates: decided exactly.
    let candidates: Option<Vec<Value>> = rule
        .get("const")
        .map(|c| vec![c.clone()])
        .or_else(|| rule.get("enum").and_then(Value::as_array).cloned())
        .or_else(|| prop.get("const").map(|c| vec![c.clone()]))
        .or_else(|| prop.get("enum").and_then(Value::as_array).cloned());
    if let Some(c) = candidates {
        if !c.iter().any(accepts) {
            let shown: Vec<String> = c.iter().take(5).map(Value::to_string).collect();
            return Some(format!(
                "no value is accepted by both the tool's schema and the rule (tried {})",
                shown.join(", ")
            ));
        }
        return None;
    }
    let lower = |m: &Map<String, Value>| {
        [
            num(m.get("minimum")).map(|v| (v, false)),
            num(m.get("exclusiveMinimum")).map(|v| (v, true)),
        ]
    };
    let upper = |m: &Map<String, Value>| {
        [
            num(m.get("maximum")).map(|v| (v, false)),
            num(m.get("exclusiveMaximum")).map(|v| (v, true)),
        ]
    };
    let empty = Map::new();
    let p = prop.as_object().unwrap_or(&empty);
    // The tightest bounds, with whether each is exclusive.
    let lo = lower(p)
        .into_iter()
        .chain(lower(rule))
        .flatten()
        .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let hi = upper(p)
        .into_iter()
        .chain(upper(rule))
        .flatten()
        .min_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    if let (Some((l, lx)), Some((h, hx))) = (lo, hi) {
        let integer = types(prop).contains("integer") && !types(prop).contains("number");
        let empty_range = if integer {
            let first = if lx { l.floor() + 1.0 } else { l.ceil() };
            let last = if hx { h.ceil() - 1.0 } else { h.floor() };
            first > last
        } else {
            l > h || (l == h && (lx || hx))
        };
        if empty_range {
            return Some(format!(
                "no {} lies between {}{l} and {h}{} once the tool's own bounds are added",
                if integer { "integer" } else { "number" },
                if lx { "(exclusive) " } else { "" },
                if hx { " (exclusive)" } else { "" }
            ));
        }
    }
    for (min_k, max_k) in [("minLength", "maxLength"), ("minItems", "maxItems")] {
        let min = [p.get(min_k), rule.get(min_k)]
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .max();
        let max = [p.get(max_k), rule.get(max_k)]
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .min();
        if let (Some(a), Some(b)) = (min, max)
            && a > b
        {
            return Some(format!("`{min_k}` {a} is more than `{max_k}` {b}"));
        }
    }
    if let (Some(items_rule), Some(items)) = (
        rule.get("items").and_then(Value::as_object),
        prop.get("items"),
    ) {
        return unsatisfiable(items, items_rule).map(|m| format!("in `items`: {m}"));
    }
    None
}

/// `prop` narrowed by `rule`: the tighter of each bound, the intersection of enums, a second
/// pattern beside the tool's own. What the model reads.
pub fn merge(prop: &Value, rule: &ParamRule) -> Value {
    let mut out = prop.as_object().cloned().unwrap_or_default();
    for (k, v) in rule {
        match (k.as_str(), out.get(k)) {
            (_, None) => {
                out.insert(k.clone(), v.clone());
            }
            ("minimum" | "exclusiveMinimum", Some(old)) => {
                if num(Some(v)) > num(Some(old)) {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("maximum" | "exclusiveMaximum", Some(old)) => {
                if num(Some(v)) < num(Some(old)) {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("minLength" | "minItems", Some(old)) => {
                if v.as_u64() > old.as_u64() {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("maxLength" | "maxItems", Some(old)) => {
                if v.as_u64() < old.as_u64() {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("enum", Some(Value::Array(old))) => {
                let kept: Vec<Value> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| old.contains(x))
                    .cloned()
                    .collect();
                out.insert(k.clone(), Value::Array(kept));
            }
            ("items", Some(old)) => {
                let narrowed = merge(old, v.as_object().unwrap_or(&Map::new()));
                out.insert(k.clone(), narrowed);
            }
            // `const`, a second `pattern`, or an `enum` beside a non-array one: both must hold.
            _ => {
                let all = out
                    .entry("allOf")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(a) = all {
                    a.push(json!({k.clone(): v.clone()}));
                }
            }
        }
    }
    // A default the rule refuses would tell the model something false (and the parameter is
    // required once ruled, so no default applies anyway).
    if let Some(d) = out.get("default") {
        let accepted = jsonschema::validator_for(&Value::Object(rule.clone()))
            .map(|v| v.is_valid(d))
            .unwrap_or(false);
        if !accepted {
            out.remove("default");
        }
    }
    Value::Object(out)
}

/// What an agent's rules make of its tools: the narrowed copies, and every problem.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Tool name → the tool as this agent sees it (only tools that rules narrow).
    pub narrowed: HashMap<String, Arc<Tool>>,
    pub problems: Vec<RuleProblem>,
}

/// Applies `rules` to the tools `visible` to an agent (its live grants), reporting what does
/// not apply. Rules on parameters a tool does not declare are not applied to it.
pub fn analyse(
    agent: &str,
    rules: &[ArgumentRules],
    visible: &[Arc<Tool>],
    catalog: &Catalog,
) -> Analysis {
    let mut out = Analysis::default();
    for r in rules {
        let problem =
            |param: Option<&str>, kind, message: String, suggestion: Option<String>| RuleProblem {
                target: r.target.clone(),
                param: param.map(str::to_owned),
                kind,
                message,
                suggestion,
            };
        let Ok(target) = GrantTarget::parse(&r.target) else {
            out.problems.push(problem(
                None,
                ProblemKind::NotGranted,
                format!("`{}` is not a tool or group name", r.target),
                None,
            ));
            continue;
        };
        let tools: Vec<&Arc<Tool>> = visible
            .iter()
            .filter(|t| target.matches(t.name.as_str()))
            .collect();
        if tools.is_empty() {
            let exists = !target.matched(catalog).is_empty();
            let suggestion = (!exists)
                .then(|| super::suggestions(&r.target, catalog).into_iter().next())
                .flatten();
            let message = if exists {
                format!(
                    "argument rules on `{}`, which agent `{agent}` is not granted: they narrow nothing",
                    r.target
                )
            } else {
                format!(
                    "argument rules on `{}`, which matches no tool{}",
                    r.target,
                    suggestion
                        .as_ref()
                        .map(|s| format!("; did you mean `{s}`?"))
                        .unwrap_or_default()
                )
            };
            out.problems
                .push(problem(None, ProblemKind::NotGranted, message, suggestion));
            continue;
        }
        for (param, rule) in &r.params {
            let with: Vec<(&Arc<Tool>, &Value)> = tools
                .iter()
                .filter_map(|t| {
                    properties(&t.input_schema)
                        .and_then(|p| p.get(param))
                        .map(|p| (*t, p))
                })
                .collect();
            if with.is_empty() {
                let known: BTreeSet<&String> = tools
                    .iter()
                    .filter_map(|t| properties(&t.input_schema))
                    .flat_map(|p| p.keys())
                    .collect();
                let suggestion = known
                    .iter()
                    .map(|k| (strsim::damerau_levenshtein(param, k), *k))
                    .filter(|(d, k)| *d <= (k.len().max(param.len()) / 3).max(2))
                    .min()
                    .map(|(_, k)| k.clone());
                let whose = match &target {
                    GrantTarget::Tool(t) => format!("`{t}` has"),
                    GrantTarget::Group(g) => format!("no tool of group `{g}` has"),
                };
                out.problems.push(problem(
                    Some(param),
                    ProblemKind::UnknownParameter,
                    format!(
                        "{whose} no parameter `{param}`{}",
                        suggestion
                            .as_ref()
                            .map(|s| format!("; did you mean `{s}`?"))
                            .unwrap_or_default()
                    ),
                    suggestion,
                ));
                continue;
            }
            for (tool, prop) in with {
                if let Some(m) = wrong_type(prop, rule) {
                    out.problems.push(problem(
                        Some(param),
                        ProblemKind::WrongType,
                        format!("rule on `{param}` of `{}`: {m}", tool.name),
                        None,
                    ));
                } else if let Some(m) = unsatisfiable(prop, rule) {
                    out.problems.push(problem(
                        Some(param),
                        ProblemKind::Unsatisfiable,
                        format!(
                            "rule on `{param}` of `{}` refuses every call: {m}",
                            tool.name
                        ),
                        None,
                    ));
                }
            }
        }
    }
    for tool in visible {
        if let Some(t) = narrow(tool, &applicable(rules, tool.name.as_str())) {
            out.narrowed
                .insert(tool.name.as_str().to_owned(), Arc::new(t));
        }
    }
    out
}

/// The tool as these rules narrow it, or `None` when none of them applies to it.
fn narrow(tool: &Tool, rules: &[(&str, &str, &ParamRule)]) -> Option<Tool> {
    let props = properties(&tool.input_schema)?;
    let rules: Vec<_> = rules
        .iter()
        .filter(|(_, p, _)| props.contains_key(*p))
        .collect();
    if rules.is_empty() {
        return None;
    }
    let mut schema = (*tool.input_schema).clone();
    let mut checks = Vec::new();
    let mut narrowed_props: BTreeMap<&str, Value> = BTreeMap::new();
    for (source, param, rule) in &rules {
        let current = narrowed_props
            .get(param)
            .cloned()
            .unwrap_or_else(|| props[*param].clone());
        narrowed_props.insert(param, merge(&current, rule));
        let rule_value = Value::Object((*rule).clone());
        // A rule that fails to compile was refused when written; one that slips through
        // refuses every call rather than none.
        let validator = jsonschema::validator_for(&rule_value).unwrap_or_else(|_| {
            jsonschema::validator_for(&json!(false)).expect("false is a schema")
        });
        checks.push(ArgumentCheck {
            param: (*param).to_owned(),
            source: (*source).to_owned(),
            rule: rule_value,
            validator: Arc::new(validator),
        });
    }
    if let Some(Value::Object(p)) = schema.get_mut("properties") {
        for (param, v) in &narrowed_props {
            p.insert((*param).to_owned(), v.clone());
        }
    }
    // A ruled parameter must be sent: the tool's own default could lie outside the rule.
    let mut required: Vec<Value> = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for param in narrowed_props.keys() {
        if !required.iter().any(|r| r.as_str() == Some(param)) {
            required.push(json!(param));
        }
    }
    schema.insert("required".into(), Value::Array(required));
    let mut out = tool.clone();
    out.http = tool.http.as_ref().map(|b| {
        let mut b = b.clone();
        b.operation =
            HttpBinding::operation_text(&narrow_operation(&b.operation(), &narrowed_props));
        b
    });
    out.input_schema = schema.into();
    out.narrowing = Some(Arc::new(Narrowing { checks }));
    Some(out)
}

/// The OpenAPI operation with the narrowed parameter schemas, so `/openapi.json` shows what
/// the MCP list shows.
fn narrow_operation(op: &Value, narrowed: &BTreeMap<&str, Value>) -> Value {
    let mut op = op.clone();
    if let Some(Value::Array(params)) = op.get_mut("parameters") {
        for p in params.iter_mut() {
            let name = p.get("name").and_then(Value::as_str).map(str::to_owned);
            if let (Some(name), Value::Object(p)) = (name, p)
                && let Some(schema) = narrowed.get(name.as_str())
            {
                p.insert("schema".into(), schema.clone());
                p.insert("required".into(), Value::Bool(true));
            }
        }
    }
    if let Some(Value::Object(content)) = op.pointer_mut("/requestBody/content") {
        for media in content.values_mut() {
            if let Some(Value::Object(schema)) = media.get_mut("schema") {
                let mut hit = Vec::new();
                if let Some(Value::Object(props)) = schema.get_mut("properties") {
                    for (name, v) in narrowed {
                        if props.contains_key(*name) {
                            props.insert((*name).to_owned(), v.clone());
                            hit.push(json!(name));
                        }
                    }
                }
                if !hit.is_empty() {
                    let req = schema
                        .entry("required")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(req) = req {
                        for h in hit {
                            if !req.contains(&h) {
                                req.push(h);
                            }
                        }
                    }
                }
            }
        }
    }
    op
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: Value) -> ParamRule {
        parse_rule(&v).unwrap()
    }

    #[test]
    fn only_narrowing_keywords_are_accepted() {
        assert!(parse_params(&json!({"days": {"maximum": 3}})).is_ok());
        let e = parse_params(&json!({"days": {"maximun": 3}})).unwrap_err();
        assert!(e.contains("did you mean `maximum`"), "{e}");
        let e = parse_params(&json!({"days": {"type": "string"}})).unwrap_err();
        assert!(e.contains("not a narrowing keyword"), "{e}");
        assert!(parse_params(&json!({"days": {"maximum": "3"}})).is_err());
        assert!(parse_params(&json!({"repo": {"pattern": "("}})).is_err());
        assert!(parse_params(&json!({"repo": {"enum": []}})).is_err());
        assert!(parse_params(&json!({})).is_err());
        assert!(parse_params(&json!([1])).is_err());
        assert!(parse_params(&json!({"tags": {"items": {"enum": ["a"]}}})).is_ok());
        assert!(parse_params(&json!({"tags": {"items": {"default": 1}}})).is_err());
    }

    #[test]
    fn bounds_that_cross_are_unsatisfiable() {
        let prop = json!({"type": "integer", "minimum": 1});
        assert!(unsatisfiable(&prop, &rule(json!({"maximum": 3}))).is_none());
        assert!(unsatisfiable(&prop, &rule(json!({"minimum": 5, "maximum": 3}))).is_some());
        assert!(unsatisfiable(&prop, &rule(json!({"maximum": 0}))).is_some());
        assert!(unsatisfiable(&prop, &rule(json!({"minimum": 2.2, "maximum": 2.8}))).is_some());
        let number = json!({"type": "number"});
        assert!(unsatisfiable(&number, &rule(json!({"minimum": 2.2, "maximum": 2.8}))).is_none());
        assert!(
            unsatisfiable(&number, &rule(json!({"exclusiveMinimum": 2, "maximum": 2}))).is_some()
        );
    }

    #[test]
    fn an_enum_the_tool_does_not_accept_is_unsatisfiable() {
        let prop = json!({"type": "string", "enum": ["metric", "imperial"]});
        assert!(unsatisfiable(&prop, &rule(json!({"enum": ["kelvin"]}))).is_some());
        assert!(unsatisfiable(&prop, &rule(json!({"enum": ["kelvin", "metric"]}))).is_none());
        let s = json!({"type": "string", "maxLength": 3});
        assert!(unsatisfiable(&s, &rule(json!({"const": "toolong"}))).is_some());
        assert!(unsatisfiable(&s, &rule(json!({"minLength": 4}))).is_some());
    }

    #[test]
    fn keywords_must_fit_the_parameter_type() {
        let s = json!({"type": "string"});
        assert!(wrong_type(&s, &rule(json!({"maximum": 3}))).is_some());
        assert!(wrong_type(&s, &rule(json!({"pattern": "^a"}))).is_none());
        let i = json!({"type": "integer"});
        assert!(wrong_type(&i, &rule(json!({"maximum": 3}))).is_none());
        assert!(wrong_type(&i, &rule(json!({"maxLength": 3}))).is_some());
        assert!(wrong_type(&json!({}), &rule(json!({"maxLength": 3}))).is_none());
        let arr = json!({"type": "array", "items": {"type": "string"}});
        assert!(wrong_type(&arr, &rule(json!({"items": {"maximum": 1}}))).is_some());
    }

    #[test]
    fn merging_keeps_the_tighter_bound_and_both_patterns() {
        let prop = json!({"type": "integer", "minimum": 1, "maximum": 16, "description": "days"});
        let m = merge(&prop, &rule(json!({"maximum": 3, "minimum": 0})));
        assert_eq!(
            m,
            json!({"type": "integer", "minimum": 1, "maximum": 3, "description": "days"})
        );
        let m = merge(
            &json!({"type": "string", "pattern": "^a"}),
            &rule(json!({"pattern": "b$"})),
        );
        assert_eq!(m["pattern"], "^a");
        assert_eq!(m["allOf"], json!([{"pattern": "b$"}]));
        let m = merge(
            &json!({"enum": ["a", "b", "c"]}),
            &rule(json!({"enum": ["c", "a", "z"]})),
        );
        assert_eq!(m["enum"], json!(["c", "a"]));
        let m = merge(
            &json!({"type": "integer", "default": 3}),
            &rule(json!({"maximum": 2})),
        );
        assert!(m.get("default").is_none(), "{m}");
        let m = merge(
            &json!({"type": "integer", "default": 1}),
            &rule(json!({"maximum": 2})),
        );
        assert_eq!(m["default"], 1);
    }
}
