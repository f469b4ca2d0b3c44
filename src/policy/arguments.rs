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
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
];

/// JSON Schema's type names, which a rule's `type` may use.
const TYPE_NAMES: &[&str] = &[
    "null", "boolean", "integer", "number", "string", "array", "object",
];

/// The `format`s a rule may use: those the validator checks. Any other would be an annotation
/// that narrows nothing.
pub const FORMATS: &[&str] = &[
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
];

/// The JSON type a keyword constrains.
///
/// Under JSON Schema a keyword passes every value of another type: `{"maximum": 3}` accepts
/// `"999"`, `[100]` and `{"v": 100}`. In a rule, whose whole point is to narrow, that is a hole,
/// so a rule holds the value to its keywords' type ([`typed`]); and a parameter that admits
/// other types is reported, since the rule then refuses them too ([`ProblemKind::OtherTypes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ValueType {
    Number,
    String,
    Array,
    Object,
}

impl ValueType {
    /// The type `keyword` applies to; `None` for `enum` and `const`, which name exact values.
    pub fn of_keyword(keyword: &str) -> Option<Self> {
        Some(match keyword {
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
                ValueType::Number
            }
            "minLength" | "maxLength" | "pattern" | "format" => ValueType::String,
            "items" | "minItems" | "maxItems" | "uniqueItems" => ValueType::Array,
            "properties" | "required" | "minProperties" | "maxProperties" => ValueType::Object,
            _ => return None,
        })
    }

    /// As JSON Schema's `type` names it.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::Number => "number",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::Object => "object",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            ValueType::Number => "numbers",
            ValueType::String => "strings",
            ValueType::Array => "arrays",
            ValueType::Object => "objects",
        }
    }

    fn with_article(self) -> &'static str {
        match self {
            ValueType::Number => "a number",
            ValueType::String => "a string",
            ValueType::Array => "an array",
            ValueType::Object => "an object",
        }
    }

    /// Whether every value of the JSON Schema type `t` is of this type.
    pub fn admits(self, t: &str) -> bool {
        t == self.name() || (self == ValueType::Number && t == "integer")
    }
}

/// The types the keywords of `rule` (not of its `items` or `properties`) hold a value to: one,
/// none (only `enum`/`const`), or several (a rule no value satisfies).
pub fn rule_types(rule: &ParamRule) -> BTreeSet<ValueType> {
    rule.keys()
        .filter_map(|k| ValueType::of_keyword(k))
        .collect()
}

/// The first keyword of `rule` of type `t`, to name in a message.
fn keyword_of(rule: &ParamRule, t: ValueType) -> &str {
    rule.keys()
        .find(|k| ValueType::of_keyword(k) == Some(t))
        .map_or("?", String::as_str)
}

/// The schema a rule is checked with: the rule, with each level (`items`, `properties`) held
/// to the type of its keywords.
pub fn typed(rule: &ParamRule) -> Value {
    let mut out = rule.clone();
    if let Some(Value::Object(items)) = rule.get("items") {
        out.insert("items".into(), typed(items));
    }
    if let Some(Value::Object(props)) = rule.get("properties") {
        let props = props
            .iter()
            .map(|(k, v)| {
                let v = v.as_object().map_or_else(|| v.clone(), typed);
                (k.clone(), v)
            })
            .collect();
        out.insert("properties".into(), Value::Object(props));
    }
    // Beside the rule's own `type`, if it has one; keywords of two types make a rule no value
    // satisfies, which refuses every call (and is reported).
    let types: Vec<Value> = rule_types(rule)
        .into_iter()
        .map(|t| json!({"type": t.name()}))
        .collect();
    if !types.is_empty() {
        out.insert("allOf".into(), Value::Array(types));
    }
    Value::Object(out)
}

/// The compiled check of a rule ([`typed`]), with `format` checked rather than annotated.
#[allow(clippy::expect_used, reason = "`false` is a constant, valid schema")]
pub fn compile(rule: &ParamRule) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .should_ignore_unknown_formats(false)
        .build(&typed(rule))
        // A rule that fails to compile was refused when written; one that slips through
        // refuses every call rather than none.
        .unwrap_or_else(|_| jsonschema::validator_for(&json!(false)).expect("false is a schema"))
}

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
    /// A keyword that does not apply to the parameter's type (`minimum` on a string): the rule
    /// refuses every value the tool accepts.
    WrongType,
    /// The parameter admits types the rule's keywords do not apply to (`maximum` on a
    /// parameter typed `["integer", "string"]`, or untyped): the rule refuses those too.
    OtherTypes,
    /// No value satisfies both the tool's schema and the rule: every call is refused.
    Unsatisfiable,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::NotGranted => "not_granted",
            ProblemKind::UnknownParameter => "unknown_parameter",
            ProblemKind::WrongType => "wrong_type",
            ProblemKind::OtherTypes => "other_types",
            ProblemKind::Unsatisfiable => "unsatisfiable",
        }
    }

    /// An error is a rule that does not do what it says: it narrows nothing (not granted, no
    /// such parameter) or refuses every call. A warning is a rule that holds, but narrows more
    /// than its keywords say: `{"maximum": 3}` on a parameter that also takes strings refuses
    /// every string, which the tool itself would accept. The gate never lets such a value past
    /// the rule, so nothing gets through; what the warning says is that calls the author may
    /// have meant to allow are refused.
    pub fn severity(self) -> Severity {
        match self {
            ProblemKind::OtherTypes => Severity::Warning,
            _ => Severity::Error,
        }
    }

    /// As the admin UI shows it.
    pub fn label(self) -> &'static str {
        match self {
            ProblemKind::NotGranted => "not granted",
            ProblemKind::UnknownParameter => "unknown parameter",
            ProblemKind::WrongType => "wrong type: refuses every call",
            ProblemKind::OtherTypes => "narrows the type too",
            ProblemKind::Unsatisfiable => "refuses every call",
        }
    }
}

/// How bad a [`RuleProblem`] is ([`ProblemKind::severity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A rule that cannot do what its author meant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleProblem {
    pub target: String,
    pub param: Option<String>,
    pub kind: ProblemKind,
    /// `kind`'s severity, spelled out for the API's readers.
    pub severity: Severity,
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
            "type" => {
                let names: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    one => vec![one],
                };
                let known = names
                    .iter()
                    .all(|n| n.as_str().is_some_and(|n| TYPE_NAMES.contains(&n)));
                if names.is_empty() || !known {
                    return Err(format!(
                        "`type` must be one of {} or a non-empty array of them",
                        TYPE_NAMES.join(", ")
                    ));
                }
            }
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
            "multipleOf" => {
                if !v.as_f64().is_some_and(|m| m > 0.0) {
                    return Err("`multipleOf` must be a number greater than 0".into());
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties" => {
                if !v.is_u64() {
                    return Err(format!("`{k}` must be a non-negative integer"));
                }
            }
            "uniqueItems" => {
                if !v.is_boolean() {
                    return Err("`uniqueItems` must be true or false".into());
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
            "format" => {
                if !v.as_str().is_some_and(|f| FORMATS.contains(&f)) {
                    return Err(format!("`format` must be one of {}", FORMATS.join(", ")));
                }
            }
            "items" => {
                parse_rule(v).map_err(|e| format!("in `items`: {e}"))?;
            }
            "properties" => {
                let Value::Object(props) = v else {
                    return Err("`properties` must be an object of property name → rule".into());
                };
                for (name, sub) in props {
                    parse_rule(sub).map_err(|e| format!("in property `{name}`: {e}"))?;
                }
            }
            "required" => {
                let names = v.as_array().filter(|a| {
                    a.iter().all(|n| {
                        n.as_str()
                            .is_some_and(|n| n.len() <= MAX_PARAM_NAME && !n.contains('\0'))
                    })
                });
                if names.is_none() {
                    return Err("`required` must be an array of property names".into());
                }
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

/// The JSON Schema type of a value (`integer` for a number without a fraction).
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The JSON Schema types a parameter's schema admits, as far as it says: its `type`, or the
/// types of its `const`/`enum` values, or those of every branch of an `anyOf`/`oneOf`. `None`
/// when it does not say (any type).
fn declared(prop: &Value) -> Option<BTreeSet<String>> {
    let m = match prop {
        Value::Bool(false) => return Some(BTreeSet::new()),
        Value::Object(m) => m,
        _ => return None,
    };
    match m.get("type") {
        Some(Value::String(t)) => return Some([t.clone()].into()),
        Some(Value::Array(a)) => {
            return Some(
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            );
        }
        _ => {}
    }
    if let Some(c) = m.get("const") {
        return Some([type_of(c).to_owned()].into());
    }
    if let Some(Value::Array(values)) = m.get("enum") {
        return Some(values.iter().map(|v| type_of(v).to_owned()).collect());
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = m.get(k) {
            let mut all = BTreeSet::new();
            for b in branches {
                all.extend(declared(b)?);
            }
            return Some(all);
        }
    }
    None
}

/// The schema of `items`, or of property `name`, inside a parameter schema (any value when
/// it does not say).
fn sub_schema<'p>(prop: &'p Value, pointer: &str) -> &'p Value {
    static ANY: Value = Value::Bool(true);
    prop.pointer(pointer).unwrap_or(&ANY)
}

fn pointer_token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The types both `a` and `b` admit (`None`: any type); `integer` is what `number` and
/// `integer` have in common.
fn intersect(a: Option<BTreeSet<String>>, b: Option<BTreeSet<String>>) -> Option<BTreeSet<String>> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => Some(
            a.iter()
                .filter_map(|x| {
                    if b.contains(x) {
                        Some(x.clone())
                    } else if (x == "integer" && b.contains("number"))
                        || (x == "number" && b.contains("integer"))
                    {
                        Some("integer".to_owned())
                    } else {
                        None
                    }
                })
                .collect(),
        ),
    }
}

/// The types a rule's own `type` names, if it has one.
fn own_types(rule: &ParamRule) -> Option<BTreeSet<String>> {
    rule.get("type")
        .and_then(|t| declared(&json!({ "type": t })))
}

fn type_list(ts: &BTreeSet<String>) -> String {
    if ts.is_empty() {
        return "no type at all".into();
    }
    ts.iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `ts` as a `type` value (`"integer"` or `["integer", "null"]`).
fn type_value(ts: &BTreeSet<String>) -> Value {
    match ts.len() {
        1 => Value::from(ts.iter().next().map_or("", String::as_str)),
        _ => Value::from(ts.iter().map(String::as_str).collect::<Vec<_>>()),
    }
}

/// What the types of `rule` make of a parameter whose schema is `prop`: the most severe of
/// keywords of two types at once (no value satisfies the rule), a keyword of a type the
/// parameter never has (every call refused), or a parameter that admits types the keyword
/// does not apply to (the rule refuses those too) — at every level of `items` and
/// `properties`. A rule's own `type` narrows what the parameter admits: writing it is how an
/// author says "numbers only" and silences the warning.
fn type_problem(prop: &Value, rule: &ParamRule) -> Option<(ProblemKind, String)> {
    let mut found: Vec<(ProblemKind, String)> = Vec::new();
    let wanted = rule_types(rule);
    let admitted = intersect(declared(prop), own_types(rule));
    let mut wanted_iter = wanted.iter();
    if let (Some(a), Some(b)) = (wanted_iter.next(), wanted_iter.next()) {
        found.push((
            ProblemKind::Unsatisfiable,
            format!(
                "`{}` applies to {} and `{}` to {}: no value is both, so every call is refused",
                keyword_of(rule, *a),
                a.plural(),
                keyword_of(rule, *b),
                b.plural()
            ),
        ));
    } else if let Some(t) = wanted.first() {
        let k = keyword_of(rule, *t);
        match &admitted {
            Some(ts) if !ts.iter().any(|x| t.admits(x)) => found.push((
                ProblemKind::WrongType,
                format!(
                    "`{k}` applies to {}, but it takes {}: the rule refuses every value",
                    t.plural(),
                    type_list(ts)
                ),
            )),
            Some(ts) => {
                let (kept, others): (BTreeSet<String>, BTreeSet<String>) =
                    ts.iter().cloned().partition(|x| t.admits(x));
                if !others.is_empty() {
                    found.push((
                        ProblemKind::OtherTypes,
                        format!(
                            "`{k}` applies to {}, and it also takes {}: the rule refuses every value that is not {} (if that is meant, say so with \"type\": {} in the rule)",
                            t.plural(),
                            type_list(&others),
                            t.with_article(),
                            type_value(&kept)
                        ),
                    ));
                }
            }
            None => found.push((
                ProblemKind::OtherTypes,
                format!(
                    "`{k}` applies to {}, and it declares no type: the rule refuses every value that is not {} (if that is meant, say so with \"type\": \"{}\" in the rule)",
                    t.plural(),
                    t.with_article(),
                    t.name()
                ),
            )),
        }
    } else if let (Some(own), Some(ts)) = (own_types(rule), &admitted)
        && ts.is_empty()
    {
        found.push((
            ProblemKind::WrongType,
            format!(
                "the rule's `type` is {}, but it takes {}: the rule refuses every value",
                type_list(&own),
                type_list(&declared(prop).unwrap_or_default())
            ),
        ));
    }
    if let Some(Value::Object(items)) = rule.get("items")
        && let Some((kind, m)) = type_problem(sub_schema(prop, "/items"), items)
    {
        found.push((kind, format!("in `items`: {m}")));
    }
    if let Some(Value::Object(props)) = rule.get("properties") {
        for (name, sub) in props {
            let Value::Object(sub) = sub else { continue };
            let at = format!("/properties/{}", pointer_token(name));
            if let Some((kind, m)) = type_problem(sub_schema(prop, &at), sub) {
                found.push((kind, format!("in property `{name}`: {m}")));
            }
        }
    }
    found
        .into_iter()
        .min_by_key(|(kind, _)| kind.severity() == Severity::Warning)
}

fn num(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

/// Why no value satisfies `prop` and `rule` together, when that can be shown.
fn unsatisfiable(prop: &Value, rule: &ParamRule) -> Option<String> {
    let both = jsonschema::options()
        .should_validate_formats(true)
        .build(&json!({"allOf": [prop, typed(rule)]}))
        .ok();
    let accepts = |v: &Value| both.as_ref().is_some_and(|s| s.is_valid(v));
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
        // The rule holds the value to numbers: the tool's integers are what is left of it.
        let integer =
            declared(prop).is_some_and(|ts| ts.contains("integer") && !ts.contains("number"));
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
/// pattern beside the tool's own, and the type the rule holds the value to. What the model
/// reads.
pub fn merge(prop: &Value, rule: &ParamRule) -> Value {
    let mut out = prop.as_object().cloned().unwrap_or_default();
    let any = Value::Object(Map::new());
    for (k, v) in rule {
        let sub = v.as_object();
        match (k.as_str(), out.get(k)) {
            // Below, with the keywords' type.
            ("type", _) => {}
            ("items", old) => {
                let narrowed = merge(old.unwrap_or(&any), sub.unwrap_or(&Map::new()));
                out.insert(k.clone(), narrowed);
            }
            ("properties", old @ (None | Some(Value::Object(_)))) => {
                let mut props = old.and_then(Value::as_object).cloned().unwrap_or_default();
                for (name, r) in sub.into_iter().flatten() {
                    let narrowed = merge(
                        props.get(name).unwrap_or(&any),
                        r.as_object().unwrap_or(&Map::new()),
                    );
                    props.insert(name.clone(), narrowed);
                }
                out.insert(k.clone(), Value::Object(props));
            }
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
            ("minLength" | "minItems" | "minProperties", Some(old)) => {
                if v.as_u64() > old.as_u64() {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("maxLength" | "maxItems" | "maxProperties", Some(old)) => {
                if v.as_u64() < old.as_u64() {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("uniqueItems", Some(_)) => {
                if v == &Value::Bool(true) {
                    out.insert(k.clone(), v.clone());
                }
            }
            ("required", Some(Value::Array(old))) => {
                let mut all = old.clone();
                for name in v.as_array().into_iter().flatten() {
                    if !all.contains(name) {
                        all.push(name.clone());
                    }
                }
                out.insert(k.clone(), Value::Array(all));
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
            (_, Some(old)) if old == v => {}
            // `const`, a second `pattern` or `format` or `multipleOf`, or an `enum` beside a
            // non-array one: both must hold.
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
    // The type the rule holds the value to: what the tool admits of it, narrowed by the rule's
    // own `type` and its keywords'. (Keywords of two types refuse everything, and are
    // reported; so is a type the tool does not take.)
    let types = rule_types(rule);
    let keyword = match (types.first(), types.len()) {
        (Some(t), 1) => Some([t.name().to_owned()].into()),
        _ => None,
    };
    let before = declared(prop);
    let after = match (types.len(), keyword) {
        (0 | 1, keyword) if keyword.is_some() || rule.contains_key("type") => {
            intersect(intersect(before.clone(), own_types(rule)), keyword)
        }
        (0 | 1, _) => None,
        _ => Some(BTreeSet::new()),
    };
    match after {
        // Types that exclude each other (keywords of two types, or a `type` the tool or the
        // keywords do not take): no value passes, and the model is told so.
        Some(after) if after.is_empty() => {
            let all = out
                .entry("allOf")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = all {
                a.extend(rule.get("type").map(|t| json!({ "type": t })));
                a.extend(types.iter().map(|t| json!({"type": t.name()})));
            }
        }
        Some(after) if Some(&after) != before.as_ref() || !out.contains_key("type") => {
            let ty = match prop.get("type") {
                Some(Value::Array(_)) => {
                    Value::from(after.iter().map(String::as_str).collect::<Vec<_>>())
                }
                _ => type_value(&after),
            };
            out.insert("type".into(), ty);
        }
        _ => {}
    }
    // A default the rule refuses would tell the model something false (and the parameter is
    // required once ruled, so no default applies anyway).
    if let Some(d) = out.get("default")
        && !compile(rule).is_valid(d)
    {
        out.remove("default");
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
        let problem = |param: Option<&str>,
                       kind: ProblemKind,
                       message: String,
                       suggestion: Option<String>| RuleProblem {
            target: r.target.clone(),
            param: param.map(str::to_owned),
            kind,
            severity: kind.severity(),
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
                let typing = type_problem(prop, rule);
                let refuses_all = typing
                    .as_ref()
                    .is_some_and(|(kind, _)| kind.severity() == Severity::Error);
                if let Some((kind, m)) = typing {
                    out.problems.push(problem(
                        Some(param),
                        kind,
                        format!("rule on `{param}` of `{}`: {m}", tool.name),
                        None,
                    ));
                }
                if refuses_all {
                    continue;
                }
                if let Some(m) = unsatisfiable(prop, rule) {
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
        checks.push(ArgumentCheck {
            param: (*param).to_owned(),
            source: (*source).to_owned(),
            rule: Value::Object((*rule).clone()),
            validator: Arc::new(compile(rule)),
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
        let e = parse_params(&json!({"days": {"default": 3}})).unwrap_err();
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

    fn kind(prop: Value, r: Value) -> Option<ProblemKind> {
        type_problem(&prop, &rule(r)).map(|(k, _)| k)
    }

    #[test]
    fn keywords_must_fit_the_parameter_type() {
        let s = json!({"type": "string"});
        assert_eq!(
            kind(s.clone(), json!({"maximum": 3})),
            Some(ProblemKind::WrongType)
        );
        assert_eq!(kind(s.clone(), json!({"pattern": "^a"})), None);
        let i = json!({"type": "integer"});
        assert_eq!(kind(i.clone(), json!({"maximum": 3})), None);
        assert_eq!(kind(i.clone(), json!({"multipleOf": 2})), None);
        assert_eq!(
            kind(i, json!({"maxLength": 3})),
            Some(ProblemKind::WrongType)
        );
        let arr = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(
            kind(arr.clone(), json!({"items": {"maximum": 1}})),
            Some(ProblemKind::WrongType)
        );
        assert_eq!(kind(arr, json!({"uniqueItems": true})), None);
        let obj = json!({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}});
        assert_eq!(
            kind(obj.clone(), json!({"properties": {"n": {"maximum": 1}}})),
            Some(ProblemKind::OtherTypes)
        );
        assert_eq!(kind(obj, json!({"required": ["n"]})), None);
    }

    #[test]
    fn a_parameter_of_other_types_is_a_warning_which_the_rule_type_answers() {
        for prop in [
            json!({}),
            json!({"type": ["integer", "string"]}),
            json!({"enum": [1, "one"]}),
            json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        ] {
            let (k, m) = type_problem(&prop, &rule(json!({"maximum": 3}))).unwrap();
            assert_eq!(k, ProblemKind::OtherTypes, "{prop}");
            assert_eq!(k.severity(), Severity::Warning);
            assert!(
                m.contains("refuses every value that is not a number"),
                "{m}"
            );
            assert_eq!(
                kind(prop.clone(), json!({"maximum": 3, "type": "integer"})),
                None,
                "{prop}"
            );
        }
        // Saying a type the parameter does not take refuses everything.
        assert_eq!(
            kind(json!({"type": "string"}), json!({"type": "integer"})),
            Some(ProblemKind::WrongType)
        );
        // Keywords of two types: no value is both.
        let (k, m) =
            type_problem(&json!({}), &rule(json!({"maximum": 3, "maxLength": 2}))).unwrap();
        assert_eq!(k, ProblemKind::Unsatisfiable, "{m}");
    }

    #[test]
    fn a_rule_refuses_values_of_another_type_than_its_keywords() {
        let check = |r: Value, v: Value| compile(&rule(r)).is_valid(&v);
        for v in [
            json!("999"),
            json!([100]),
            json!({"v": 100}),
            json!(true),
            json!(null),
        ] {
            assert!(!check(json!({"maximum": 3}), v.clone()), "{v}");
        }
        assert!(check(json!({"maximum": 3}), json!(2.5)));
        assert!(!check(json!({"pattern": "^a"}), json!(1)));
        assert!(check(json!({"pattern": "^a"}), json!("abc")));
        assert!(!check(json!({"items": {"maximum": 3}}), json!(["1"])));
        assert!(!check(json!({"items": {"maximum": 3}}), json!({"0": 1})));
        assert!(check(json!({"items": {"maximum": 3}}), json!([1, 2])));
        assert!(!check(json!({"required": ["a"]}), json!(["a"])));
        assert!(!check(
            json!({"properties": {"a": {"maxLength": 1}}}),
            json!({"a": 5})
        ));
        assert!(check(
            json!({"properties": {"a": {"maxLength": 1}}}),
            json!({"b": 5})
        ));
        assert!(!check(json!({"format": "ipv4"}), json!("300.1.1.1")));
        assert!(check(json!({"format": "ipv4"}), json!("10.1.1.1")));
        assert!(check(json!({"enum": [1, "a"]}), json!("a")));
    }

    #[test]
    fn the_model_is_shown_the_type_the_rule_holds_the_value_to() {
        let m = merge(
            &json!({"type": ["integer", "string"]}),
            &rule(json!({"maximum": 3})),
        );
        assert_eq!(m["type"], json!(["integer"]), "{m}");
        let m = merge(&json!({"description": "d"}), &rule(json!({"maxLength": 3})));
        assert_eq!(m["type"], "string", "{m}");
        let m = merge(&json!({"type": "integer"}), &rule(json!({"maximum": 3})));
        assert_eq!(m["type"], "integer", "{m}");
        let m = merge(&json!({}), &rule(json!({"items": {"minimum": 0}})));
        assert_eq!(m["type"], "array", "{m}");
        assert_eq!(m["items"]["type"], "number", "{m}");
        let m = merge(&json!({}), &rule(json!({"type": ["integer", "null"]})));
        assert_eq!(m["type"], json!(["integer", "null"]), "{m}");
    }

    #[test]
    fn new_keywords_are_checked_when_written() {
        for bad in [
            json!({"multipleOf": 0}),
            json!({"format": "color"}),
            json!({"uniqueItems": 1}),
            json!({"required": [1]}),
            json!({"properties": {"a": 3}}),
            json!({"type": "float"}),
            json!({"type": []}),
        ] {
            assert!(parse_rule(&bad).is_err(), "{bad}");
        }
        for good in [
            json!({"multipleOf": 0.5}),
            json!({"format": "date"}),
            json!({"uniqueItems": true, "maxItems": 2}),
            json!({"required": ["a"], "properties": {"a": {"enum": [1]}}}),
            json!({"type": ["integer", "null"]}),
        ] {
            assert!(parse_rule(&good).is_ok(), "{good}");
        }
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

    /// Random parameter schemas × rules × values, through the same path a call takes (the
    /// agent's rules analysed against a tool, the narrowed copy's checks), against an oracle
    /// written apart from the validator: what each keyword means under its type.
    mod typed_rules {
        use super::*;
        use crate::pool::{Catalog, Tool};
        use proptest::prelude::*;

        const PATTERNS: &[&str] = &["^a", "b$", "[0-9]", "^[ab]*$"];
        const DATES: &[&str] = &["2024-01-31", "2024-13-01", "2024-02-30", "x"];
        const TYPES: &[&str] = TYPE_NAMES;

        fn pattern_matches(p: &str, s: &str) -> bool {
            match p {
                "^a" => s.starts_with('a'),
                "b$" => s.ends_with('b'),
                "[0-9]" => s.chars().any(|c| c.is_ascii_digit()),
                "^[ab]*$" => s.chars().all(|c| c == 'a' || c == 'b'),
                _ => unreachable!("only the patterns above are generated"),
            }
        }

        /// JSON Schema equality: numbers by value.
        fn json_eq(a: &Value, b: &Value) -> bool {
            match (a, b) {
                (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
                (Value::Array(x), Value::Array(y)) => {
                    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
                }
                (Value::Object(x), Value::Object(y)) => {
                    x.len() == y.len()
                        && x.iter()
                            .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
                }
                _ => a == b,
            }
        }

        fn is_type(t: &str, v: &Value) -> bool {
            match t {
                "number" => v.is_number(),
                "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
                other => type_of(v) == other,
            }
        }

        /// Whether `v` satisfies `rule`, each keyword read under its type: a keyword of a type
        /// `v` is not of is not satisfied.
        fn oracle(rule: &Map<String, Value>, v: &Value) -> bool {
            rule.iter().all(|(k, kv)| {
                let f = v.as_f64();
                let s = v.as_str();
                let a = v.as_array();
                let o = v.as_object();
                let n = |x: &Value| x.as_f64().unwrap();
                let u = |x: &Value| x.as_u64().unwrap() as usize;
                match k.as_str() {
                    "type" => match kv {
                        Value::String(t) => is_type(t, v),
                        // The validator reads `4.0` against a list of types as a number, not
                        // an integer (JSON Schema says it is both): it refuses more than the
                        // rule says, never less. Mirrored here so that the converse holds.
                        Value::Array(ts) => ts.iter().any(|t| match t.as_str().unwrap() {
                            "integer" => v.is_i64() || v.is_u64(),
                            t => is_type(t, v),
                        }),
                        _ => unreachable!(),
                    },
                    "enum" => kv.as_array().unwrap().iter().any(|x| json_eq(x, v)),
                    "const" => json_eq(kv, v),
                    "minimum" => f.is_some_and(|f| f >= n(kv)),
                    "maximum" => f.is_some_and(|f| f <= n(kv)),
                    "exclusiveMinimum" => f.is_some_and(|f| f > n(kv)),
                    "exclusiveMaximum" => f.is_some_and(|f| f < n(kv)),
                    // Values and divisors are multiples of 0.5: exact in halves.
                    "multipleOf" => f.is_some_and(|f| {
                        ((f * 2.0).round() as i64) % ((n(kv) * 2.0).round() as i64) == 0
                    }),
                    "minLength" => s.is_some_and(|s| s.chars().count() >= u(kv)),
                    "maxLength" => s.is_some_and(|s| s.chars().count() <= u(kv)),
                    "pattern" => s.is_some_and(|s| pattern_matches(kv.as_str().unwrap(), s)),
                    "format" => s.is_some_and(|s| {
                        s.len() == 10 && chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok()
                    }),
                    "items" => {
                        a.is_some_and(|a| a.iter().all(|x| oracle(kv.as_object().unwrap(), x)))
                    }
                    "minItems" => a.is_some_and(|a| a.len() >= u(kv)),
                    "maxItems" => a.is_some_and(|a| a.len() <= u(kv)),
                    "uniqueItems" => a.is_some_and(|a| {
                        kv == &Value::Bool(false)
                            || a.iter()
                                .enumerate()
                                .all(|(i, x)| a[i + 1..].iter().all(|y| !json_eq(x, y)))
                    }),
                    "properties" => o.is_some_and(|o| {
                        kv.as_object().unwrap().iter().all(|(name, sub)| {
                            o.get(name)
                                .is_none_or(|x| oracle(sub.as_object().unwrap(), x))
                        })
                    }),
                    "required" => o.is_some_and(|o| {
                        kv.as_array()
                            .unwrap()
                            .iter()
                            .all(|name| o.contains_key(name.as_str().unwrap()))
                    }),
                    "minProperties" => o.is_some_and(|o| o.len() >= u(kv)),
                    "maxProperties" => o.is_some_and(|o| o.len() <= u(kv)),
                    other => unreachable!("keyword {other} is not generated"),
                }
            })
        }

        fn scalar() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                (-12i64..12).prop_map(Value::from),
                // Halves, some of them whole (`2.0` beside `2`).
                (-24i64..24).prop_map(|h| json!(h as f64 / 2.0)),
                "[ab1 ]{0,5}".prop_map(Value::from),
                proptest::sample::select(DATES).prop_map(Value::from),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            scalar().prop_recursive(2, 12, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    proptest::collection::btree_map("[abn]", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn type_value_of(ts: Vec<&'static str>) -> Value {
            if ts.len() == 1 {
                json!(ts[0])
            } else {
                json!(ts)
            }
        }

        /// A parameter schema: untyped, of one type or of several, sometimes with the schema
        /// of its items or of a property.
        fn prop_schema() -> impl Strategy<Value = Value> {
            let types = proptest::option::of(proptest::sample::subsequence(TYPES, 1..4));
            let inner = proptest::option::of(proptest::sample::subsequence(TYPES, 1..3));
            (types, inner, any::<bool>()).prop_map(|(types, inner, items)| {
                let mut m = Map::new();
                if let Some(ts) = types {
                    m.insert("type".into(), type_value_of(ts));
                }
                if let Some(ts) = inner {
                    let sub = json!({"type": type_value_of(ts)});
                    if items {
                        m.insert("items".into(), sub);
                    } else {
                        m.insert("properties".into(), json!({"a": sub}));
                    }
                }
                Value::Object(m)
            })
        }

        /// One keyword with a value that parses.
        fn keyword(depth: u32) -> BoxedStrategy<(String, Value)> {
            let half = (-16i64..16).prop_map(|h| json!(h as f64 / 2.0));
            let len = 0u64..5;
            let mut options: Vec<BoxedStrategy<(String, Value)>> = vec![
                proptest::collection::vec(scalar(), 1..4)
                    .prop_map(|v| ("enum".into(), json!(v)))
                    .boxed(),
                scalar().prop_map(|v| ("const".into(), v)).boxed(),
                proptest::sample::subsequence(TYPES, 1..3)
                    .prop_map(|ts| ("type".into(), type_value_of(ts)))
                    .boxed(),
            ];
            for k in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
                options.push(half.clone().prop_map(move |v| (k.into(), v)).boxed());
            }
            options.push(
                proptest::sample::select(&[0.5, 1.0, 2.0, 3.0][..])
                    .prop_map(|m| ("multipleOf".into(), json!(m)))
                    .boxed(),
            );
            for k in [
                "minLength",
                "maxLength",
                "minItems",
                "maxItems",
                "minProperties",
                "maxProperties",
            ] {
                options.push(len.clone().prop_map(move |n| (k.into(), json!(n))).boxed());
            }
            options.push(
                proptest::sample::select(PATTERNS)
                    .prop_map(|p| ("pattern".into(), json!(p)))
                    .boxed(),
            );
            options.push(Just(("format".into(), json!("date"))).boxed());
            options.push(
                any::<bool>()
                    .prop_map(|b| ("uniqueItems".into(), json!(b)))
                    .boxed(),
            );
            options.push(
                proptest::sample::subsequence(&["a", "b", "n"][..], 1..3)
                    .prop_map(|r| ("required".into(), json!(r)))
                    .boxed(),
            );
            if depth > 0 {
                options.push(
                    rule(depth - 1)
                        .prop_map(|r| ("items".into(), Value::Object(r)))
                        .boxed(),
                );
                options.push(
                    rule(depth - 1)
                        .prop_map(|r| ("properties".into(), json!({"a": r})))
                        .boxed(),
                );
            }
            proptest::strategy::Union::new(options).boxed()
        }

        /// A rule: mostly keywords of one type (as an author writes them), sometimes any mix.
        fn rule(depth: u32) -> BoxedStrategy<Map<String, Value>> {
            proptest::collection::vec(keyword(depth), 1..4)
                .prop_map(|kws| kws.into_iter().collect::<Map<String, Value>>())
                .boxed()
        }

        fn tool(prop: &Value) -> Arc<Tool> {
            let schema = json!({"type": "object", "properties": {"p": prop}});
            let def = rmcp::model::Tool::new(
                "t",
                "a tool",
                Arc::new(schema.as_object().unwrap().clone()),
            );
            Arc::new(crate::upstream::to_pool_tool("g", &def).unwrap())
        }

        fn analysed(prop: &Value, r: &Map<String, Value>) -> (Analysis, Arc<Tool>) {
            let t = tool(prop);
            let catalog = Catalog::new(vec![t.clone()], Vec::new());
            let rules = [ArgumentRules {
                target: "g__t".into(),
                params: [("p".to_owned(), r.clone())].into(),
            }];
            (analyse("a", &rules, std::slice::from_ref(&t), &catalog), t)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// What passes the check satisfies the rule under its keywords' types; and what
            /// satisfies it passes (the rule refuses nothing it does not say).
            #[test]
            fn the_check_is_the_rule_under_its_types(
                prop in prop_schema(),
                r in rule(2),
                vs in proptest::collection::vec(value(), 1..8),
            ) {
                prop_assume!(parse_rule(&Value::Object(r.clone())).is_ok());
                let (analysis, _) = analysed(&prop, &r);
                let narrowed = &analysis.narrowed["g__t"];
                let narrowing = narrowed.narrowing.as_ref().unwrap();
                for v in vs {
                    let passes = narrowing.refusals(&json!({"p": v})).is_empty();
                    let holds = oracle(&r, &v);
                    prop_assert_eq!(passes, holds, "rule {} on {}, value {}", Value::Object(r.clone()), prop, v);
                }
            }

            /// A value the tool accepts that the rule refuses only for its type is never a
            /// surprise: the rule is reported (unless its own `type` says so).
            #[test]
            fn a_rule_that_refuses_a_type_the_tool_takes_is_reported(
                prop in prop_schema(),
                r in rule(0),
                v in value(),
            ) {
                let mut r = r;
                r.remove("type");
                let types = rule_types(&r);
                if types.is_empty() || parse_rule(&Value::Object(r.clone())).is_err() {
                    return Ok(());
                }
                let (analysis, t) = analysed(&prop, &r);
                let tool_accepts = t.violations(&json!({"p": v})).is_empty();
                let of_type = types.iter().all(|k| k.admits(type_of(&v)));
                if tool_accepts && !of_type {
                    prop_assert!(
                        !analysis.problems.is_empty(),
                        "rule {} on {} refuses {} silently", Value::Object(r.clone()), prop, v
                    );
                }
            }

            /// The schema the model is shown never accepts what the check refuses.
            #[test]
            fn the_listed_schema_is_no_wider_than_the_check(
                prop in prop_schema(),
                r in rule(1),
                v in value(),
            ) {
                prop_assume!(parse_rule(&Value::Object(r.clone())).is_ok());
                let (analysis, _) = analysed(&prop, &r);
                let narrowed = &analysis.narrowed["g__t"];
                let shown = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&Value::Object((*narrowed.input_schema).clone()))
                    .unwrap();
                let args = json!({"p": v});
                if shown.is_valid(&args) {
                    prop_assert!(
                        narrowed.narrowing.as_ref().unwrap().refusals(&args).is_empty(),
                        "rule {} on {}: the model is shown a schema that accepts {}", Value::Object(r.clone()), prop, v
                    );
                }
            }
        }
    }
}
