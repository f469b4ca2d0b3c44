//! Approval rules: which of an agent's calls wait for a person.
//!
//! A rule is keyed like an argument rule, by a tool (`payments__transfer`) or a group
//! (`github`), or by `@destructive` for every tool whose annotations say
//! `destructiveHint: true`. It asks for approval on every call of what it is keyed by or, with
//! `when`, only on calls whose arguments match every fragment (the argument-rule language:
//! `{amount: {exclusiveMinimum: 1000}}`). `approvers` names who may decide (roles or approver
//! sets of accounts), `ttl` how long a request waits before it expires.
//!
//! In `agent.md`:
//!
//! ```yaml
//! approval:
//!   payments__transfer: {when: {amount: {exclusiveMinimum: 1000}}, approvers: [finance], ttl: 1h}
//!   github__merge_pr: {approvers: [admin]}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::GrantTarget;
use super::arguments::{self, ParamRule};
use crate::pool::Tool;

/// The key of a rule on every tool annotated `destructiveHint: true`.
pub const DESTRUCTIVE: &str = "@destructive";

/// How long a request waits when the rule does not say.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
const MIN_TTL: Duration = Duration::from_secs(60);
const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
const MAX_APPROVERS: usize = 16;

/// What a rule is keyed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalTarget {
    Grant(GrantTarget),
    Destructive,
}

impl ApprovalTarget {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == DESTRUCTIVE {
            return Ok(Self::Destructive);
        }
        GrantTarget::parse(s)
            .map(Self::Grant)
            .map_err(|e| format!("{e}, or {DESTRUCTIVE}"))
    }

    /// Whether the rule applies to `tool`.
    pub fn covers(&self, tool: &Tool) -> bool {
        match self {
            Self::Grant(g) => g.matches(tool.name.as_str()),
            Self::Destructive => tool
                .annotations
                .as_ref()
                .is_some_and(|a| a.destructive_hint == Some(true)),
        }
    }
}

/// One rule, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRule {
    /// As written: a tool, a group, or `@destructive`.
    pub target: String,
    /// Parameter → fragment; empty: every call.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub when: BTreeMap<String, ParamRule>,
    /// Roles or approver sets whose accounts may decide.
    pub approvers: Vec<String>,
    /// How long a request waits, in seconds.
    #[serde(serialize_with = "ttl_text")]
    pub ttl: Duration,
}

fn ttl_text<S: serde::Serializer>(ttl: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_ttl(*ttl))
}

/// `3600s` → `1h`: the largest unit that divides it.
pub fn format_ttl(ttl: Duration) -> String {
    let secs = ttl.as_secs();
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs >= n && secs.is_multiple_of(n) {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}

/// `90s`, `30m`, `1h`, `2d`, or a number of seconds.
pub fn parse_ttl(value: &Value) -> Result<Duration, String> {
    let secs = match value {
        Value::Number(n) => n.as_u64().ok_or("ttl must be a whole number of seconds")?,
        Value::String(s) => {
            let s = s.trim();
            let (digits, unit) =
                s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("ttl {s:?} must be a number and a unit: 90s, 30m, 1h, 2d"))?;
            let unit = match unit {
                "" | "s" => 1,
                "m" => 60,
                "h" => 3600,
                "d" => 86_400,
                _ => return Err(format!("ttl {s:?}: the unit is one of s, m, h, d")),
            };
            n.checked_mul(unit).ok_or("ttl is too long")?
        }
        _ => return Err("ttl must be a duration such as 1h".into()),
    };
    let ttl = Duration::from_secs(secs);
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(format!(
            "ttl must be between {} and {}",
            format_ttl(MIN_TTL),
            format_ttl(MAX_TTL)
        ));
    }
    Ok(ttl)
}

/// Whether `name` can name a role or an approver set.
pub fn valid_approver(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

/// Parses the rule keyed by `target` as written (`{when: …, approvers: […], ttl: 1h}`).
pub fn parse(target: &str, value: &Value) -> Result<ApprovalRule, String> {
    ApprovalTarget::parse(target)?;
    let Value::Object(map) = value else {
        return Err(
            "an approval rule is an object: {approvers: [...], when: {...}, ttl: 1h}".into(),
        );
    };
    for k in map.keys() {
        if !["when", "approvers", "ttl"].contains(&k.as_str()) {
            return Err(format!(
                "unknown field `{k}` in an approval rule (when, approvers, ttl)"
            ));
        }
    }
    let when = match map.get("when") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(w) => arguments::parse_params(w).map_err(|e| format!("when: {e}"))?,
    };
    let approvers: Vec<String> = match map.get("approvers") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| match v.as_str() {
                Some(s) if valid_approver(s) => Ok(s.to_owned()),
                _ => Err(format!(
                    "approver {v} must be a role or approver set name (lowercase letters, digits, _ . -)"
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("approvers must list at least one role or approver set".into()),
    };
    if approvers.len() > MAX_APPROVERS {
        return Err(format!("at most {MAX_APPROVERS} approvers"));
    }
    let mut approvers = approvers;
    approvers.sort();
    approvers.dedup();
    let ttl = match map.get("ttl") {
        None | Some(Value::Null) => DEFAULT_TTL,
        Some(t) => parse_ttl(t)?,
    };
    Ok(ApprovalRule {
        target: target.to_owned(),
        when,
        approvers,
        ttl,
    })
}

impl ApprovalRule {
    /// As stored and written back to `agent.md`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        if !self.when.is_empty() {
            m.insert("when".into(), json!(self.when));
        }
        m.insert("approvers".into(), json!(self.approvers));
        m.insert("ttl".into(), json!(format_ttl(self.ttl)));
        Value::Object(m)
    }

    /// The rule's own digest: the "policy version" a request is bound to. A changed rule
    /// asks again.
    pub fn sha256(&self) -> String {
        let text = format!("{}\n{}", self.target, self.to_value());
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    pub fn target(&self) -> ApprovalTarget {
        // Checked when parsed.
        ApprovalTarget::parse(&self.target).unwrap_or(ApprovalTarget::Destructive)
    }
}

/// A rule compiled for the core path.
#[derive(Debug)]
pub struct CompiledApproval {
    pub rule: ApprovalRule,
    pub target: ApprovalTarget,
    pub sha256: String,
    checks: Vec<(String, jsonschema::Validator)>,
}

impl CompiledApproval {
    pub fn new(rule: ApprovalRule) -> Self {
        let checks = rule
            .when
            .iter()
            .map(|(p, r)| (p.clone(), arguments::compile(r)))
            .collect();
        Self {
            target: rule.target(),
            sha256: rule.sha256(),
            rule,
            checks,
        }
    }

    /// Whether a call of `tool` with `args` needs approval under this rule: the rule covers
    /// the tool and every `when` fragment matches its parameter (a parameter the call leaves
    /// out matches nothing).
    pub fn asks(&self, tool: &Tool, args: &Value) -> bool {
        self.target.covers(tool)
            && self
                .checks
                .iter()
                .all(|(p, v)| args.get(p).is_some_and(|value| v.is_valid(value)))
    }
}

/// A rule that cannot do what its author meant, found against the catalog and the accounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalProblem {
    pub target: String,
    pub message: String,
}

/// The problems of `rules` for an agent that sees `visible`: a rule that matches no tool the
/// agent may call, a `when` on a parameter none of them has (it can never trigger), an
/// approver that names nobody (`staffed`: the roles and sets some enabled account holds).
pub fn problems(
    rules: &[ApprovalRule],
    visible: &[std::sync::Arc<Tool>],
    staffed: Option<&BTreeSet<String>>,
) -> Vec<ApprovalProblem> {
    let mut out = Vec::new();
    for rule in rules {
        let target = rule.target();
        let covered: Vec<&Tool> = visible
            .iter()
            .map(|t| t.as_ref())
            .filter(|t| target.covers(t))
            .collect();
        let problem = |message: String| ApprovalProblem {
            target: rule.target.clone(),
            message,
        };
        if covered.is_empty() {
            out.push(problem(format!(
                "approval on `{}` matches no tool this agent may call: it never triggers",
                rule.target
            )));
            continue;
        }
        for param in rule.when.keys() {
            let has = covered.iter().any(|t| {
                t.input_schema
                    .parsed()
                    .get("properties")
                    .and_then(|p| p.get(param))
                    .is_some()
            });
            if !has {
                out.push(problem(format!(
                    "approval on `{}`: no tool it covers has a parameter `{param}`, so `when` never triggers",
                    rule.target
                )));
            }
        }
        if let Some(staffed) = staffed {
            for a in &rule.approvers {
                if !staffed.contains(a) {
                    out.push(problem(format!(
                        "approval on `{}`: no enabled account is `{a}`, so nobody can approve",
                        rule.target
                    )));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_write_back_the_same() {
        let v = json!({"when": {"amount": {"exclusiveMinimum": 1000}}, "approvers": ["finance"], "ttl": "90m"});
        let r = parse("payments__transfer", &v).unwrap();
        assert_eq!(r.ttl, Duration::from_secs(5400));
        assert_eq!(r.to_value(), v);
        assert_eq!(parse("payments__transfer", &r.to_value()).unwrap(), r);
        let every = parse(DESTRUCTIVE, &json!({"approvers": ["admin"]})).unwrap();
        assert_eq!(every.ttl, DEFAULT_TTL);
        assert!(every.when.is_empty());
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (target, v, says) in [
            (
                "payments__transfer",
                json!({"approvers": []}),
                "at least one",
            ),
            (
                "payments__transfer",
                json!({"approvers": ["Finance Team"]}),
                "approver",
            ),
            (
                "payments__transfer",
                json!({"approvers": ["a"], "ttl": "5s"}),
                "between",
            ),
            (
                "payments__transfer",
                json!({"approvers": ["a"], "ttl": "1y"}),
                "unit",
            ),
            (
                "payments__transfer",
                json!({"approvers": ["a"], "who": 1}),
                "unknown field",
            ),
            (
                "payments__transfer",
                json!({"approvers": ["a"], "when": {"amount": {"minimum": "x"}}}),
                "when",
            ),
            ("@everything", json!({"approvers": ["a"]}), "@destructive"),
        ] {
            let e = parse(target, &v).unwrap_err();
            assert!(e.contains(says), "{v}: {e}");
        }
    }
}
