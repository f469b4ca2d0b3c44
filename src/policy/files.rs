//! Policies as code: `policies/agents/<name>/agent.md` (YAML front matter plus a Markdown
//! body) and an optional `policies/groups.yaml`. `check` validates a folder against the
//! catalog, `apply` makes the database match it, `export` writes the database back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::GrantTarget;
use super::approvals::{self, ApprovalRule};
use super::arguments::{self, ArgumentRules};
use super::snapshot::{AgentRecord, Discovery, Managed, RateLimitRecord};
use super::style;
use crate::db;
use crate::db::agents::AgentSettings;
use crate::db::groups::GroupMeta;
use crate::limits::LimitForm;
use crate::names::{AgentName, GroupName, Username};
use crate::pool::Catalog;

/// The YAML front matter of an `agent.md`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontMatter {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
    /// For the agent as a whole: `rate_limit: {per_minute: 30, burst: 5}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<LimitForm>,
    /// Limits per group or exact tool: `tool_limits: {weather: {per_second: 0.5, burst: 2}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_limits: BTreeMap<String, LimitForm>,
    /// Argument rules per tool or group: `arguments: {weather__forecast: {days: {maximum: 3}}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, serde_json::Value>,
    /// Calls that wait for a person, per tool, group or `@destructive`:
    /// `approval: {payments__transfer: {when: {amount: {exclusiveMinimum: 1000}}, approvers: [finance], ttl: 1h}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approval: BTreeMap<String, serde_json::Value>,
    /// People who may act as this agent through an interactive host: `users: [alice, bob]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// `managed: files`: the admin UI and API show the agent read-only; only `policy apply`
    /// changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,
}

/// One agent file.
#[derive(Debug, Clone)]
pub struct AgentFile {
    pub name: String,
    /// Path shown in messages, relative to the policies folder's parent.
    pub file: String,
    pub front: FrontMatter,
    pub body: String,
    front_lines: Vec<String>,
}

impl AgentFile {
    /// The line (1-based, in the file) where `value` is written in the front matter.
    fn line_of(&self, value: &str) -> usize {
        self.front_lines
            .iter()
            .position(|l| {
                l.match_indices(value).any(|(i, _)| {
                    let before = l[..i].chars().last();
                    let after = l[i + value.len()..].chars().next();
                    !before.is_some_and(crate::pool::is_name_char)
                        && !after.is_some_and(crate::pool::is_name_char)
                })
            })
            .map(|i| i + 2)
            .unwrap_or(1)
    }

    pub fn settings(&self) -> AgentSettings {
        AgentSettings {
            description: self.front.description.clone(),
            notes: self.body.clone(),
            discovery: self.front.discovery.unwrap_or_default(),
            pinned: self.front.pinned.clone(),
            managed: self.front.managed,
        }
    }

    /// The argument rules, checked; one that [`validate`] reports is left out.
    pub fn argument_rules(&self) -> Vec<ArgumentRules> {
        self.front
            .arguments
            .iter()
            .filter(|(t, _)| GrantTarget::parse(t).is_ok())
            .filter_map(|(target, params)| {
                Some(ArgumentRules {
                    target: target.clone(),
                    params: arguments::parse_params(params).ok()?,
                })
            })
            .collect()
    }

    /// The approval rules, checked; one that [`validate`] reports is left out.
    pub fn approval_rules(&self) -> Vec<ApprovalRule> {
        self.front
            .approval
            .iter()
            .filter_map(|(target, rule)| approvals::parse(target, rule).ok())
            .collect()
    }

    /// The limits, checked; one that [`validate`] reports is left out.
    pub fn limits(&self) -> Vec<RateLimitRecord> {
        let agent_wide = self.front.rate_limit.iter().map(|l| (None, l));
        let per_tool = self.front.tool_limits.iter().map(|(p, l)| (Some(p), l));
        agent_wide
            .chain(per_tool)
            .filter_map(|(pattern, form)| {
                Some(RateLimitRecord {
                    pattern: match pattern {
                        // Exactly as written: `validate` reports one with spaces around it.
                        Some(p) if p.trim() != p => return None,
                        Some(p) => Some(GrantTarget::parse(p).ok()?),
                        None => None,
                    },
                    limit: form.parse().ok()?,
                })
            })
            .collect()
    }
}

/// A problem in the policies folder, located to a file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// The parsed folder.
#[derive(Debug, Clone, Default)]
pub struct PolicyDir {
    pub agents: Vec<AgentFile>,
    pub groups: Vec<GroupMeta>,
    /// `upstreams/<group>.yaml`: upstream MCP servers served as tool groups.
    pub upstreams: BTreeMap<String, crate::upstream::UpstreamSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsFile {
    #[serde(default)]
    groups: BTreeMap<String, GroupEntry>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupEntry {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pin: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    managed: Option<Managed>,
}

fn shown(dir: &Path, path: &Path) -> String {
    let base = dir.parent().unwrap_or(dir);
    path.strip_prefix(base)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Splits `---\n<yaml>\n---\n<body>`.
fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    if rest[offset..].trim_end() == "---" {
        return Some((&rest[..offset], ""));
    }
    None
}

/// A character of a front-matter value that YAML reads as a line break or control (`\r`,
/// U+0085, U+2028, U+2029, C0 and C1 controls other than tab and newline), with the line of
/// its first literal occurrence (the first front-matter line when it came from an escape).
/// Such a value does not survive `policy export`: the writer breaks the line there.
fn unwritable_char(front: &FrontMatter, yaml: &str) -> Option<(char, usize)> {
    let bad = |c: char| {
        (c.is_control() && c != '\t' && c != '\n') || matches!(c, '\u{2028}' | '\u{2029}')
    };
    let mut found = None;
    let mut visit = |s: &str| {
        if found.is_none() {
            found = s.chars().find(|c| bad(*c));
        }
    };
    let value = serde_json::to_value(front).unwrap_or_default();
    let mut stack = vec![&value];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::String(s) => visit(s),
            serde_json::Value::Array(a) => stack.extend(a),
            serde_json::Value::Object(o) => {
                for (k, v) in o {
                    visit(k);
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    let c = found?;
    let line = yaml
        .find(c)
        .map(|at| yaml[..at].matches('\n').count() + 2)
        .unwrap_or(2);
    Some((c, line))
}

/// Reads the folder; syntax problems come back located, and the rest still loads.
pub fn read_dir(dir: &Path) -> (PolicyDir, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut out = PolicyDir::default();
    let agents_dir = dir.join("agents");
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&agents_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    folders.sort();
    for folder in folders {
        let name = folder
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let path = folder.join("agent.md");
        let file = shown(dir, &path);
        let problem = |line: usize, message: String| Problem {
            file: file.clone(),
            line,
            message,
        };
        if let Err(e) = AgentName::parse(&name) {
            problems.push(problem(1, e.to_string()));
            continue;
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(problem(1, format!("cannot read agent.md: {e}")));
                continue;
            }
        };
        let Some((yaml, body)) = split_front_matter(&text) else {
            problems.push(problem(
                1,
                "agent.md must start with YAML front matter between `---` lines".into(),
            ));
            continue;
        };
        let front: FrontMatter = if yaml.trim().is_empty() {
            FrontMatter::default()
        } else {
            match serde_yaml::from_str(yaml) {
                Ok(f) => f,
                Err(e) => {
                    // YAML also breaks lines at a lone `\r`, so its line number can point past
                    // the end of the file; count the file's own lines up to the error instead.
                    let line = e
                        .location()
                        .map(|l| {
                            let upto = &yaml.as_bytes()[..l.index().min(yaml.len())];
                            upto.iter().filter(|b| **b == b'\n').count() + 2
                        })
                        .unwrap_or(1);
                    problems.push(problem(line, format!("invalid front matter: {e}")));
                    continue;
                }
            }
        };
        if let Some((c, line)) = unwritable_char(&front, yaml) {
            problems.push(problem(
                line,
                format!(
                    "front matter holds the character U+{:04X}; values may not hold control characters or line separators other than a newline",
                    c as u32
                ),
            ));
            continue;
        }
        out.agents.push(AgentFile {
            name,
            file,
            front,
            body: body.trim().to_owned(),
            front_lines: yaml.lines().map(str::to_owned).collect(),
        });
    }
    let mut upstream_files: Vec<PathBuf> = std::fs::read_dir(dir.join("upstreams"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect()
        })
        .unwrap_or_default();
    upstream_files.sort();
    for path in upstream_files {
        let file = shown(dir, &path);
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        // An upstream's tools are named `<upstream>__<tool>`: its name is their group's.
        if let Err(e) = GroupName::parse(&name) {
            problems.push(Problem {
                file,
                line: 1,
                message: format!("upstream name: {e}"),
            });
            continue;
        }
        match std::fs::read_to_string(&path)
            .map_err(|e| (1, e.to_string()))
            .and_then(|t| {
                serde_yaml::from_str::<crate::upstream::UpstreamSpec>(&t).map_err(|e| {
                    (
                        e.location().map(|l| l.line()).unwrap_or(1),
                        format!("invalid upstream: {e}"),
                    )
                })
            }) {
            Ok(spec) => match spec.validate() {
                Ok(()) => {
                    out.upstreams.insert(name, spec);
                }
                Err(message) => problems.push(Problem {
                    file,
                    line: 1,
                    message,
                }),
            },
            Err((line, message)) => problems.push(Problem {
                file,
                line,
                message,
            }),
        }
    }
    let groups_path = dir.join("groups.yaml");
    if groups_path.is_file() {
        let file = shown(dir, &groups_path);
        match std::fs::read_to_string(&groups_path)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                serde_yaml::from_str::<GroupsFile>(&t).map_err(|e| {
                    format!(
                        "{}invalid groups.yaml: {e}",
                        e.location()
                            .map(|l| format!("@{}@", l.line()))
                            .unwrap_or_default()
                    )
                })
            }) {
            Ok(g) => {
                out.groups = g
                    .groups
                    .into_iter()
                    .map(|(name, e)| GroupMeta {
                        name,
                        description: e.description,
                        owner: e.owner,
                        pin: e.pin,
                        managed: e.managed,
                    })
                    .collect();
            }
            Err(msg) => {
                let (line, msg) = match msg.strip_prefix('@').and_then(|m| m.split_once('@')) {
                    Some((l, m)) => (l.parse().unwrap_or(1), m.to_owned()),
                    None => (1, msg),
                };
                problems.push(Problem {
                    file,
                    line,
                    message: msg,
                });
            }
        }
    }
    (out, problems)
}

/// Finds what the database would refuse, before it is touched: grants and limit patterns that
/// are not group or tool names, limits that are not one positive count per second, minute or
/// hour with a whole burst (see [`LimitForm::parse`]), text with NUL bytes.
/// `apply` stops on any of these, with or without `--strict`; `check` reports them too.
pub fn validate(policies: &PolicyDir) -> Vec<Problem> {
    let mut problems = Vec::new();
    for agent in &policies.agents {
        let at = |line: usize, message: String| Problem {
            file: agent.file.clone(),
            line,
            message,
        };
        for grant in &agent.front.tools {
            let line = agent.line_of(grant.trim());
            if grant.trim() != grant {
                problems.push(at(line, format!("grant `{grant}` has spaces around it")));
            } else if let Err(e) = GrantTarget::parse(grant) {
                problems.push(at(line, e));
            }
        }
        for pattern in agent.front.tool_limits.keys() {
            if pattern.trim() != pattern || GrantTarget::parse(pattern).is_err() {
                problems.push(at(
                    agent.line_of(pattern.trim()),
                    format!("`{pattern}` in tool_limits is not a group or tool name"),
                ));
            }
        }
        for (target, rule) in &agent.front.approval {
            if let Err(e) = approvals::parse(target, rule) {
                problems.push(at(
                    agent.line_of(target.trim()),
                    format!("approval of `{target}`: {e}"),
                ));
            }
        }
        for (target, params) in &agent.front.arguments {
            let line = agent.line_of(target.trim());
            if let Err(e) = GrantTarget::parse(target) {
                problems.push(at(line, format!("`{target}` in arguments: {e}")));
            } else if let Err(e) = arguments::parse_params(params) {
                problems.push(at(line, format!("arguments of `{target}`: {e}")));
            }
        }
        let limits = agent
            .front
            .rate_limit
            .iter()
            .map(|l| ("rate_limit", l))
            .chain(agent.front.tool_limits.iter().map(|(p, l)| (p.as_str(), l)));
        for (key, l) in limits {
            if let Err(e) = l.parse() {
                problems.push(at(agent.line_of(key), format!("`{key}`: {e}")));
            }
        }
        let texts = [
            ("description", &agent.front.description),
            ("the body", &agent.body),
        ];
        for (what, text) in texts {
            if text.contains('\0') {
                problems.push(at(1, format!("{what} contains a NUL character")));
            }
        }
        for user in &agent.front.users {
            if let Err(e) = Username::parse(user) {
                problems.push(at(agent.line_of("users"), e.to_string()));
            }
        }
        for pin in agent.front.pinned.iter().filter(|p| p.contains('\0')) {
            problems.push(at(
                agent.line_of("pinned"),
                format!("pinned tool {pin:?} contains a NUL character"),
            ));
        }
    }
    for g in &policies.groups {
        if [&g.name, &g.description, &g.owner]
            .iter()
            .any(|t| t.contains('\0'))
        {
            problems.push(Problem {
                file: "policies/groups.yaml".into(),
                line: 1,
                message: format!("group {:?} contains a NUL character", g.name),
            });
        }
    }
    problems
}

/// The `per: person` credential slots of what `target` grants: of its script groups (from the
/// catalog) and of an upstream declared in the folder, as (group, slot) pairs.
fn person_slots(
    target: &GrantTarget,
    catalog: &Catalog,
    upstreams: &BTreeMap<String, crate::upstream::UpstreamSpec>,
) -> BTreeSet<(String, String)> {
    use crate::credentials::Per;
    let mut out = BTreeSet::new();
    for tool in target.matched_tools(catalog) {
        if let crate::pool::Execution::Script(spec) = &tool.exec {
            for slot in spec
                .group
                .credentials
                .iter()
                .filter(|s| s.per == Per::Person)
            {
                out.insert((spec.group.name.to_string(), slot.name.to_string()));
            }
        }
    }
    let group = match target {
        GrantTarget::Group(g) => g.as_str(),
        GrantTarget::Tool(t) => t.group(),
    };
    if let Some(spec) = upstreams.get(group) {
        for s in spec.slots().unwrap_or_default() {
            if s.slot.per == Per::Person {
                out.insert((group.to_owned(), s.slot.name.to_string()));
            }
        }
    }
    out
}

/// Checks the folder against the catalog: everything [`validate`] refuses, then every grant
/// must match at least one tool, pinned tools must be visible, group metadata must name a
/// served group.
pub fn check(policies: &PolicyDir, catalog: &Catalog) -> Vec<Problem> {
    let mut problems = validate(policies);
    let groups = catalog.group_names();
    for agent in &policies.agents {
        let mut targets = Vec::new();
        let mut seen = BTreeSet::new();
        for grant in &agent.front.tools {
            let line = agent.line_of(grant);
            let at = |message: String| Problem {
                file: agent.file.clone(),
                line,
                message,
            };
            if !seen.insert(grant.as_str()) {
                problems.push(at(format!("grant `{grant}` is listed twice")));
                continue;
            }
            match GrantTarget::parse(grant) {
                // Reported by `validate`.
                Err(_) => {}
                Ok(t) => {
                    if t.matched(catalog).is_empty() {
                        let hint = match super::suggestions(grant, catalog).first() {
                            Some(s) => format!("; did you mean `{s}`?"),
                            None => String::new(),
                        };
                        let what = match &t {
                            GrantTarget::Group(g) if !groups.iter().any(|n| n == g.as_str()) => {
                                format!("unknown group `{g}`")
                            }
                            _ => format!("grant `{grant}` matches no tool"),
                        };
                        problems.push(at(format!(
                            "{what}: agent `{}` gets nothing from it{hint}",
                            agent.name
                        )));
                    }
                    for (group, slot) in person_slots(&t, catalog, &policies.upstreams) {
                        if agent.front.users.is_empty() {
                            problems.push(at(format!(
                                "group `{group}` needs each person's credential `{slot}`, and no person may act as agent `{}` (`users:` is empty): its calls of `{group}` can never carry one and fail",
                                agent.name
                            )));
                        }
                    }
                    targets.push(t);
                }
            }
        }
        if !agent.front.tools.is_empty() && targets.iter().all(|t| t.matched(catalog).is_empty()) {
            problems.push(Problem {
                file: agent.file.clone(),
                line: agent.line_of("tools"),
                message: format!(
                    "agent `{}` sees no tools at all: every grant matches nothing",
                    agent.name
                ),
            });
        }
        let rules = agent.argument_rules();
        let approval_rules = agent.approval_rules();
        // Only agents with rules need their tools here; found by name, not by a pool scan.
        let visible: Vec<_> = if rules.is_empty() && approval_rules.is_empty() {
            Vec::new()
        } else {
            targets
                .iter()
                .flat_map(|g| g.matched_tools(catalog))
                .map(|t| (t.name.as_str(), t.clone()))
                .collect::<BTreeMap<_, _>>()
                .into_values()
                .collect()
        };
        for p in arguments::analyse(&agent.name, &rules, &visible, catalog).problems {
            let line = p
                .param
                .as_deref()
                .map(|param| agent.line_of(param))
                .filter(|l| *l > 1)
                .unwrap_or_else(|| agent.line_of(&p.target));
            // Errors read like every other problem of the folder; a warning says it is one (a
            // rule that holds, but narrows more than its keywords say). Both fail the check.
            let message = match p.severity {
                arguments::Severity::Error => p.message,
                arguments::Severity::Warning => format!("warning: {}", p.message),
            };
            problems.push(Problem {
                file: agent.file.clone(),
                line,
                message,
            });
        }
        // Who is an approver lives in the database, not the folder: checked by the API and
        // the admin UI, which read the accounts.
        for p in approvals::problems(&approval_rules, &visible, None) {
            problems.push(Problem {
                file: agent.file.clone(),
                line: agent.line_of(&p.target),
                message: p.message,
            });
        }
        for pin in &agent.front.pinned {
            if !targets.iter().any(|t| t.matches(pin)) || catalog.get(pin).is_none() {
                problems.push(Problem {
                    file: agent.file.clone(),
                    line: agent.line_of(pin),
                    message: format!("pinned tool `{pin}` is not one of the agent's visible tools"),
                });
            }
        }
    }
    for name in policies.upstreams.keys() {
        if catalog.tools().any(|t| {
            t.group() == *name && matches!(t.source, crate::pool::ToolSource::Script { .. })
        }) {
            problems.push(Problem {
                file: format!("policies/upstreams/{name}.yaml"),
                line: 1,
                message: format!("upstream `{name}` has the name of a script tool group"),
            });
        }
    }
    let upstream_names: Vec<&String> = policies.upstreams.keys().collect();
    for g in &policies.groups {
        if !groups.contains(&g.name) && !upstream_names.contains(&&g.name) {
            let hint = super::suggestions(&g.name, catalog)
                .first()
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            problems.push(Problem {
                file: "policies/groups.yaml".into(),
                line: 1,
                message: format!("unknown group `{}`{hint}", g.name),
            });
        }
    }
    problems
}

/// One change `apply` makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    CreateAgent {
        name: String,
        settings: AgentSettings,
    },
    UpdateAgent {
        name: String,
        before: AgentSettings,
        after: AgentSettings,
    },
    DeleteAgent {
        name: String,
    },
    AddGrant {
        agent: String,
        target: String,
    },
    RemoveGrant {
        agent: String,
        target: String,
    },
    SetLimits {
        agent: String,
        before: Vec<RateLimitRecord>,
        after: Vec<RateLimitRecord>,
    },
    SetArguments {
        agent: String,
        rules: ArgumentRules,
    },
    DeleteArguments {
        agent: String,
        target: String,
    },
    SetApproval {
        agent: String,
        rule: ApprovalRule,
    },
    DeleteApproval {
        agent: String,
        target: String,
    },
    SetGroup {
        before: Option<GroupMeta>,
        after: GroupMeta,
    },
    DeleteGroup {
        name: String,
    },
    SetUpstream {
        name: String,
        before: Option<serde_json::Value>,
        after: serde_json::Value,
    },
    DeleteUpstream {
        name: String,
    },
    SetUsers {
        agent: String,
        before: Vec<String>,
        after: Vec<String>,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::CreateAgent { name, .. } => write!(f, "+ agent {name}"),
            Change::UpdateAgent {
                name,
                before,
                after,
            } => {
                write!(f, "~ agent {name}")?;
                if before.discovery != after.discovery {
                    write!(
                        f,
                        " discovery {} -> {}",
                        before.discovery.as_str(),
                        after.discovery.as_str()
                    )?;
                }
                if before.description != after.description {
                    write!(f, " description")?;
                }
                if before.notes != after.notes {
                    write!(f, " notes")?;
                }
                if before.pinned != after.pinned {
                    write!(f, " pinned {:?} -> {:?}", before.pinned, after.pinned)?;
                }
                if before.managed != after.managed {
                    let shown = |m: Option<Managed>| m.map_or("ui", Managed::as_str);
                    write!(
                        f,
                        " managed {} -> {}",
                        shown(before.managed),
                        shown(after.managed)
                    )?;
                }
                Ok(())
            }
            Change::DeleteAgent { name } => {
                write!(f, "- agent {name} (with its grants, limits and clients)")
            }
            Change::AddGrant { agent, target } => write!(f, "+ grant {agent} -> {target}"),
            Change::RemoveGrant { agent, target } => write!(f, "- grant {agent} -> {target}"),
            Change::SetLimits { agent, after, .. } => {
                let parts: Vec<String> = after
                    .iter()
                    .map(|l| match &l.pattern {
                        Some(p) => format!("{p}: {}", l.limit),
                        None => format!("*: {}", l.limit),
                    })
                    .collect();
                write!(f, "~ rate limits {agent}: [{}]", parts.join(", "))
            }
            Change::SetArguments { agent, rules } => write!(
                f,
                "~ argument rules {agent} -> {}: {}",
                rules.target,
                serde_json::to_string(&rules.params).unwrap_or_default()
            ),
            Change::DeleteArguments { agent, target } => {
                write!(f, "- argument rules {agent} -> {target}")
            }
            Change::SetApproval { agent, rule } => write!(
                f,
                "~ approval {agent} -> {}: {}",
                rule.target,
                rule.to_value()
            ),
            Change::DeleteApproval { agent, target } => {
                write!(f, "- approval {agent} -> {target}")
            }
            Change::SetGroup {
                before: None,
                after,
            } => write!(f, "+ group {}", after.name),
            Change::SetGroup { before, after } => {
                write!(f, "~ group {}", after.name)?;
                let pin = before.as_ref().and_then(|b| b.pin);
                if pin != after.pin {
                    let shown = |p: Option<bool>| p.map_or("unset".to_owned(), |p| p.to_string());
                    write!(f, " pin {} -> {}", shown(pin), shown(after.pin))?;
                }
                let managed = before.as_ref().and_then(|b| b.managed);
                if managed != after.managed {
                    let shown = |m: Option<Managed>| m.map_or("ui", Managed::as_str);
                    write!(f, " managed {} -> {}", shown(managed), shown(after.managed))?;
                }
                Ok(())
            }
            Change::DeleteGroup { name } => write!(f, "- group {name}"),
            Change::SetUpstream {
                name, before: None, ..
            } => write!(f, "+ upstream {name}"),
            Change::SetUpstream { name, .. } => write!(f, "~ upstream {name}"),
            Change::DeleteUpstream { name } => write!(f, "- upstream {name}"),
            Change::SetUsers {
                agent,
                before,
                after,
            } => write!(f, "~ users {agent}: {before:?} -> {after:?}"),
        }
    }
}

fn sorted_users(users: &[String]) -> Vec<String> {
    let mut u = users.to_vec();
    u.sort();
    u.dedup();
    u
}

fn settings_of(a: &AgentRecord) -> AgentSettings {
    AgentSettings {
        description: a.description.clone(),
        notes: a.notes.clone(),
        discovery: a.discovery,
        pinned: a.pinned.clone(),
        managed: a.managed,
    }
}

/// The changes that make the database (`agents`, `groups`) match the folder.
pub fn plan(
    policies: &PolicyDir,
    agents: &[AgentRecord],
    groups: &[GroupMeta],
    upstreams: &BTreeMap<String, serde_json::Value>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let current: BTreeMap<&str, &AgentRecord> =
        agents.iter().map(|a| (a.name.as_str(), a)).collect();
    let wanted: BTreeSet<&str> = policies.agents.iter().map(|a| a.name.as_str()).collect();
    for file in &policies.agents {
        let settings = file.settings();
        let wanted_grants: BTreeSet<&str> = file.front.tools.iter().map(String::as_str).collect();
        let limits = file.limits();
        match current.get(file.name.as_str()) {
            None => {
                changes.push(Change::CreateAgent {
                    name: file.name.clone(),
                    settings,
                });
                for t in &wanted_grants {
                    changes.push(Change::AddGrant {
                        agent: file.name.clone(),
                        target: (*t).to_owned(),
                    });
                }
                if !limits.is_empty() {
                    changes.push(Change::SetLimits {
                        agent: file.name.clone(),
                        before: Vec::new(),
                        after: limits,
                    });
                }
                for rules in file.argument_rules() {
                    changes.push(Change::SetArguments {
                        agent: file.name.clone(),
                        rules,
                    });
                }
                for rule in file.approval_rules() {
                    changes.push(Change::SetApproval {
                        agent: file.name.clone(),
                        rule,
                    });
                }
                if !file.front.users.is_empty() {
                    changes.push(Change::SetUsers {
                        agent: file.name.clone(),
                        before: Vec::new(),
                        after: sorted_users(&file.front.users),
                    });
                }
            }
            Some(record) => {
                let before = settings_of(record);
                if before != settings {
                    changes.push(Change::UpdateAgent {
                        name: file.name.clone(),
                        before,
                        after: settings,
                    });
                }
                let have: BTreeSet<&str> =
                    record.grants.iter().map(|g| g.target.as_str()).collect();
                for t in wanted_grants.difference(&have) {
                    changes.push(Change::AddGrant {
                        agent: file.name.clone(),
                        target: (*t).to_owned(),
                    });
                }
                for t in have.difference(&wanted_grants) {
                    changes.push(Change::RemoveGrant {
                        agent: file.name.clone(),
                        target: (*t).to_owned(),
                    });
                }
                let mut have_limits = record.limits.clone();
                let mut want_limits = limits.clone();
                have_limits.sort_by(|a, b| a.pattern.cmp(&b.pattern));
                want_limits.sort_by(|a, b| a.pattern.cmp(&b.pattern));
                if have_limits != want_limits {
                    changes.push(Change::SetLimits {
                        agent: file.name.clone(),
                        before: record.limits.clone(),
                        after: limits,
                    });
                }
                let wanted_rules = file.argument_rules();
                for rules in &wanted_rules {
                    if !record.arguments.contains(rules) {
                        changes.push(Change::SetArguments {
                            agent: file.name.clone(),
                            rules: rules.clone(),
                        });
                    }
                }
                for have in &record.arguments {
                    if !wanted_rules.iter().any(|w| w.target == have.target) {
                        changes.push(Change::DeleteArguments {
                            agent: file.name.clone(),
                            target: have.target.clone(),
                        });
                    }
                }
                let wanted_approvals = file.approval_rules();
                for rule in &wanted_approvals {
                    if !record.approvals.contains(rule) {
                        changes.push(Change::SetApproval {
                            agent: file.name.clone(),
                            rule: rule.clone(),
                        });
                    }
                }
                for have in &record.approvals {
                    if !wanted_approvals.iter().any(|w| w.target == have.target) {
                        changes.push(Change::DeleteApproval {
                            agent: file.name.clone(),
                            target: have.target.clone(),
                        });
                    }
                }
                let want_users = sorted_users(&file.front.users);
                let have_users = sorted_users(&record.users);
                if want_users != have_users {
                    changes.push(Change::SetUsers {
                        agent: file.name.clone(),
                        before: have_users,
                        after: want_users,
                    });
                }
            }
        }
    }
    for a in agents {
        if !wanted.contains(a.name.as_str()) {
            changes.push(Change::DeleteAgent {
                name: a.name.clone(),
            });
        }
    }
    let current_groups: BTreeMap<&str, &GroupMeta> =
        groups.iter().map(|g| (g.name.as_str(), g)).collect();
    for g in &policies.groups {
        match current_groups.get(g.name.as_str()) {
            Some(existing) if *existing == g => {}
            existing => changes.push(Change::SetGroup {
                before: existing.map(|e| (*e).clone()),
                after: g.clone(),
            }),
        }
    }
    for (name, spec) in &policies.upstreams {
        let after = serde_json::to_value(spec).unwrap_or_default();
        let before = upstreams.get(name);
        if before != Some(&after) {
            changes.push(Change::SetUpstream {
                name: name.clone(),
                before: before.cloned(),
                after,
            });
        }
    }
    for name in upstreams.keys() {
        if !policies.upstreams.contains_key(name) {
            changes.push(Change::DeleteUpstream { name: name.clone() });
        }
    }
    let wanted_groups: BTreeSet<&str> = policies.groups.iter().map(|g| g.name.as_str()).collect();
    for g in groups {
        if !wanted_groups.contains(g.name.as_str()) {
            changes.push(Change::DeleteGroup {
                name: g.name.clone(),
            });
        }
    }
    changes
}

/// What the last real apply wrote from the files (agents, grants, users): a removal of
/// anything else came from outside the files and needs `--prune`.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    agents: BTreeSet<String>,
    grants: BTreeSet<(String, String)>,
    users: BTreeSet<(String, String)>,
    approvals: BTreeSet<(String, String)>,
}

impl Applied {
    pub fn from_rows(rows: &[db::policy_applied::AppliedRow]) -> Self {
        let mut out = Self::default();
        for (agent, kind, value) in rows {
            match kind.as_str() {
                "agent" => {
                    out.agents.insert(agent.clone());
                }
                "grant" => {
                    out.grants.insert((agent.clone(), value.clone()));
                }
                "user" => {
                    out.users.insert((agent.clone(), value.clone()));
                }
                "approval" => {
                    out.approvals.insert((agent.clone(), value.clone()));
                }
                _ => {}
            }
        }
        out
    }

    /// What these files write: the rows a real apply records.
    pub fn rows_of(policies: &PolicyDir) -> Vec<db::policy_applied::AppliedRow> {
        let mut rows = Vec::new();
        for a in &policies.agents {
            rows.push((a.name.clone(), "agent".to_owned(), String::new()));
            for t in &a.front.tools {
                rows.push((a.name.clone(), "grant".to_owned(), t.clone()));
            }
            for u in &a.front.users {
                rows.push((a.name.clone(), "user".to_owned(), u.clone()));
            }
            for t in a.front.approval.keys() {
                rows.push((a.name.clone(), "approval".to_owned(), t.clone()));
            }
        }
        rows
    }
}

/// A removal `apply` did not make: the thing was not written by the last apply (added in the
/// admin UI or API since, or before any apply recorded what it wrote). `--prune` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    Agent {
        name: String,
    },
    Grant {
        agent: String,
        target: String,
    },
    /// An approval rule: removing it would let calls run unapproved.
    Approval {
        agent: String,
        target: String,
    },
    /// `live`: the person's live host authorizations for the agent, which `--prune` revokes.
    User {
        agent: String,
        user: String,
        live: i64,
    },
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::Agent { name } => write!(f, "kept agent {name}"),
            Kept::Grant { agent, target } => write!(f, "kept grant {agent} -> {target}"),
            Kept::Approval { agent, target } => write!(f, "kept approval {agent} -> {target}"),
            Kept::User { agent, user, .. } => write!(f, "kept user {agent} -> {user}"),
        }?;
        write!(f, " (added outside the files; --prune removes it")?;
        match self {
            Kept::User { live, .. } if *live > 0 => {
                write!(f, ", revoking {live} host authorization(s))")
            }
            _ => write!(f, ")"),
        }
    }
}

/// Host authorizations a person loses because they leave an agent's `users` (or the agent
/// goes): counted before the change, live ones only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub agent: String,
    pub user: String,
    pub count: i64,
    /// `revoked …` when applied, `would revoke …` in a dry run.
    pub applied: bool,
}

impl fmt::Display for Revocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.applied {
            "revoked"
        } else {
            "would revoke"
        };
        write!(
            f,
            "{verb} {} host authorization(s) of {} for {}",
            self.count, self.user, self.agent
        )
    }
}

/// Takes out of `changes` the removals of agents, grants and users the last apply did not
/// write (unless `prune`), and says what was kept. A user change that only removed kept
/// users goes; one that also does something else keeps them in its `after`.
pub fn hold_back(changes: Vec<Change>, applied: &Applied, prune: bool) -> (Vec<Change>, Vec<Kept>) {
    if prune {
        return (changes, Vec::new());
    }
    let mut out = Vec::with_capacity(changes.len());
    let mut kept = Vec::new();
    for change in changes {
        match change {
            Change::DeleteAgent { name } if !applied.agents.contains(&name) => {
                kept.push(Kept::Agent { name });
            }
            Change::RemoveGrant { agent, target }
                if !applied.grants.contains(&(agent.clone(), target.clone())) =>
            {
                kept.push(Kept::Grant { agent, target });
            }
            Change::DeleteApproval { agent, target }
                if !applied.approvals.contains(&(agent.clone(), target.clone())) =>
            {
                kept.push(Kept::Approval { agent, target });
            }
            Change::SetUsers {
                agent,
                before,
                after,
            } => {
                let outside: Vec<String> = before
                    .iter()
                    .filter(|u| !after.contains(u))
                    .filter(|u| !applied.users.contains(&(agent.clone(), (*u).clone())))
                    .cloned()
                    .collect();
                let after = sorted_users(&[after, outside.clone()].concat());
                kept.extend(outside.into_iter().map(|user| Kept::User {
                    agent: agent.clone(),
                    user,
                    live: 0,
                }));
                if after != before {
                    out.push(Change::SetUsers {
                        agent,
                        before,
                        after,
                    });
                }
            }
            other => out.push(other),
        }
    }
    (out, kept)
}

/// The outcome of `apply`.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub changes: Vec<Change>,
    /// Zero-match grants and other non-fatal problems.
    pub warnings: Vec<Problem>,
    /// Removals left out because the last apply did not write what they remove.
    pub kept: Vec<Kept>,
    /// Host authorizations the changes revoke (or would, in a dry run).
    pub revocations: Vec<Revocation>,
    pub applied: bool,
}

/// How the folder and the database differ, as the dashboard shows it: what `apply` would do,
/// and what it would keep (changed outside the files since the last apply).
#[derive(Debug, Default)]
pub struct Drift {
    /// The folder does not read: nothing compared.
    pub problems: Vec<Problem>,
    pub changes: Vec<Change>,
    pub kept: Vec<Kept>,
}

/// Compares the folder with the database, as a dry run of `apply` without `--prune` would,
/// without taking the apply lock (a concurrent apply makes this one momentarily stale, which
/// the next look corrects).
pub async fn drift(
    pool: &PgPool,
    dir: &Path,
    agents: &[AgentRecord],
) -> Result<Drift, sqlx::Error> {
    let owned = dir.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        let (policies, mut problems) = read_dir(&owned);
        problems.extend(validate(&policies));
        (policies, problems)
    })
    .await;
    let Ok((policies, problems)) = read else {
        return Ok(Drift::default());
    };
    if !problems.is_empty() {
        return Ok(Drift {
            problems,
            ..Drift::default()
        });
    }
    let mut conn = pool.acquire().await?;
    let groups = db::groups::groups(&mut conn).await?;
    let upstreams = db::upstreams::upstreams(&mut conn).await?;
    let applied = Applied::from_rows(&db::policy_applied::load(&mut conn).await?);
    let (changes, kept) = hold_back(
        plan(&policies, agents, &groups, &upstreams),
        &applied,
        false,
    );
    Ok(Drift {
        problems: Vec::new(),
        changes,
        kept,
    })
}

/// Why `apply` refused.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("the policies folder has errors:\n{}", .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
    #[error("refusing to apply with --strict: {} problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Strict(Vec<Problem>),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Makes the database match the folder in one transaction, but for removals of agents,
/// grants and users the last apply did not write (see [`hold_back`]), made only with `prune`.
pub async fn apply_dir(
    pool: &PgPool,
    dir: &Path,
    catalog: &Catalog,
    actor: &str,
    dry_run: bool,
    strict: bool,
    prune: bool,
) -> Result<ApplyReport, ApplyError> {
    let (policies, mut invalid) = read_dir(dir);
    invalid.extend(validate(&policies));
    if !invalid.is_empty() {
        return Err(ApplyError::Invalid(invalid));
    }
    let warnings = check(&policies, catalog);
    if strict && !warnings.is_empty() {
        return Err(ApplyError::Strict(warnings));
    }
    let mut tx = pool.begin().await?;
    // One apply at a time; a concurrent one would compute its diff from a stale read.
    db::locks::hold(&mut tx, db::locks::Lock::PolicyApply).await?;
    let state = db::snapshot::load_state(pool).await?;
    let pinned_before = db::pins::pinned_groups(&mut tx).await?;
    let groups = db::groups::groups(&mut tx).await?;
    let upstreams = db::upstreams::upstreams(&mut tx).await?;
    let applied = Applied::from_rows(&db::policy_applied::load(&mut tx).await?);
    let (changes, mut kept) = hold_back(
        plan(&policies, &state.agents, &groups, &upstreams),
        &applied,
        prune,
    );
    // What `--prune` would cost the people kept.
    for k in &mut kept {
        if let Kept::User { agent, user, live } = k {
            *live = db::authorizations::live_counts_for_agent(&mut tx, agent)
                .await?
                .remove(user.as_str())
                .unwrap_or(0);
        }
    }
    let mut revocations = Vec::new();
    for change in &changes {
        let (agent, users) = match change {
            Change::SetUsers {
                agent,
                before,
                after,
            } => (
                agent,
                before
                    .iter()
                    .filter(|u| !after.contains(u))
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
            Change::DeleteAgent { name } => (
                name,
                state
                    .agents
                    .iter()
                    .filter(|a| a.name == *name)
                    .flat_map(|a| a.users.iter().cloned())
                    .collect(),
            ),
            _ => continue,
        };
        let mut counts = db::authorizations::live_counts_for_agent(&mut tx, agent).await?;
        let mut users: BTreeSet<String> = users.into_iter().collect();
        if matches!(change, Change::DeleteAgent { .. }) {
            // The agent's authorizations go with it, whoever made them.
            users.extend(counts.keys().cloned());
        }
        for user in users {
            revocations.push(Revocation {
                agent: agent.clone(),
                count: counts.remove(&user).unwrap_or(0),
                user,
                applied: !dry_run,
            });
        }
    }
    if !dry_run {
        // Runs of new agents and grants (a first start is nothing else) are written together;
        // any other change first writes the run before it, so the order stays the plan's.
        let mut run: Vec<db::agents::Creation<'_>> = Vec::new();
        for change in &changes {
            match change {
                Change::CreateAgent { name, settings } => {
                    run.push(db::agents::Creation::Agent { name, settings });
                    continue;
                }
                Change::AddGrant { agent, target } => {
                    run.push(db::agents::Creation::Grant { agent, target });
                    continue;
                }
                _ => {}
            }
            if !run.is_empty() {
                db::agents::create_many(&mut tx, actor, &std::mem::take(&mut run)).await?;
            }
            match change {
                Change::CreateAgent { .. } | Change::AddGrant { .. } => {}
                Change::UpdateAgent {
                    name,
                    before,
                    after,
                } => db::agents::update_agent(&mut tx, actor, name, before, after).await?,
                Change::DeleteAgent { name } => {
                    db::agents::delete_agent(&mut tx, actor, name).await?;
                }
                Change::RemoveGrant { agent, target } => {
                    db::grants::remove_grant(&mut tx, actor, agent, target).await?;
                }
                Change::SetLimits {
                    agent,
                    before,
                    after,
                } => db::limits::set_limits(&mut tx, actor, agent, before, after).await?,
                Change::SetArguments { agent, rules } => {
                    db::arguments::set_argument_rules(&mut tx, actor, agent, rules).await?;
                }
                Change::DeleteArguments { agent, target } => {
                    db::arguments::delete_argument_rules(&mut tx, actor, agent, target).await?;
                }
                Change::SetApproval { agent, rule } => {
                    db::approval_rules::set_approval_rule(&mut tx, actor, agent, rule).await?;
                }
                Change::DeleteApproval { agent, target } => {
                    db::approval_rules::delete_approval_rule(&mut tx, actor, agent, target).await?;
                }
                Change::SetGroup { before, after } => {
                    db::groups::upsert_group(&mut tx, actor, before.as_ref(), after).await?
                }
                Change::DeleteGroup { name } => {
                    db::groups::delete_group(&mut tx, actor, name).await?;
                }
                Change::SetUpstream {
                    name,
                    before,
                    after,
                } => {
                    db::upstreams::set_upstream(&mut tx, actor, name, before.as_ref(), after)
                        .await?;
                }
                Change::DeleteUpstream { name } => {
                    db::upstreams::delete_upstream(&mut tx, actor, name).await?;
                }
                Change::SetUsers { agent, after, .. } => {
                    db::agent_users::set_agent_users(&mut tx, actor, agent, after).await?;
                }
            }
        }
        if !run.is_empty() {
            db::agents::create_many(&mut tx, actor, &run).await?;
        }
        // A group pinned by this apply starts from what it serves now, approved by whoever
        // applied (trust on first use, per group).
        for group in db::pins::pinned_groups(&mut tx)
            .await?
            .difference(&pinned_before)
        {
            db::pins::baseline(&mut tx, actor, group, catalog).await?;
        }
        db::policy_applied::replace(&mut tx, &Applied::rows_of(&policies)).await?;
        tx.commit().await?;
    }
    Ok(ApplyReport {
        changes,
        warnings,
        kept,
        revocations,
        applied: !dry_run,
    })
}

/// Whether an agent file's front matter and body already say `front` and `notes` (a written
/// `discovery: full` is the default the export leaves out).
fn says_the_same(yaml: &str, body: &str, front: &FrontMatter, notes: &str) -> bool {
    let read: Option<FrontMatter> = if yaml.trim().is_empty() {
        Some(FrontMatter::default())
    } else {
        serde_yaml::from_str(yaml).ok()
    };
    read.is_some_and(|mut read| {
        if read.discovery == Some(Discovery::Full) {
            read.discovery = None;
        }
        read == *front && body.trim() == notes
    })
}

/// Writes the database as policy files that `apply` turns into no change, each in the style
/// of the file it replaces (see [`style`]).
pub async fn export(pool: &PgPool, dir: &Path) -> anyhow::Result<usize> {
    let state = db::snapshot::load_state(pool).await?;
    let mut conn = pool.acquire().await?;
    let groups = db::groups::groups(&mut conn).await?;
    let agents_dir = dir.join("agents");
    std::fs::create_dir_all(&agents_dir)?;
    for a in &state.agents {
        let mut tool_limits = BTreeMap::new();
        let mut rate_limit = None;
        for l in &a.limits {
            let limit = LimitForm::from(l.limit);
            match &l.pattern {
                None => rate_limit = Some(limit),
                Some(p) => {
                    tool_limits.insert(p.to_string(), limit);
                }
            }
        }
        let front = FrontMatter {
            description: a.description.clone(),
            tools: a.grants.iter().map(|g| g.target.clone()).collect(),
            discovery: (a.discovery != Discovery::Full).then_some(a.discovery),
            pinned: a.pinned.clone(),
            rate_limit,
            tool_limits,
            arguments: a
                .arguments
                .iter()
                .map(|r| (r.target.clone(), serde_json::json!(r.params)))
                .collect(),
            approval: a
                .approvals
                .iter()
                .map(|r| (r.target.clone(), r.to_value()))
                .collect(),
            users: a.users.clone(),
            managed: a.managed,
        };
        let folder = agents_dir.join(&a.name);
        let path = folder.join("agent.md");
        let previous = std::fs::read_to_string(&path).ok();
        let previous = previous.as_deref().and_then(split_front_matter);
        // A file that already says this is left as it is, comments and all.
        if previous.is_some_and(|(yaml, body)| says_the_same(yaml, body, &front, &a.notes)) {
            continue;
        }
        let yaml = style::to_yaml_like(&serde_json::to_value(&front)?, previous.map(|p| p.0))?;
        let mut text = format!("---\n{yaml}---\n");
        if !a.notes.is_empty() {
            text.push('\n');
            text.push_str(&a.notes);
            text.push('\n');
        }
        std::fs::create_dir_all(&folder)?;
        std::fs::write(path, text)?;
    }
    let upstreams = db::upstreams::upstreams(&mut conn).await?;
    if !upstreams.is_empty() {
        let up_dir = dir.join("upstreams");
        std::fs::create_dir_all(&up_dir)?;
        for (name, spec) in &upstreams {
            let spec: crate::upstream::UpstreamSpec = serde_json::from_value(spec.clone())?;
            let path = up_dir.join(format!("{name}.yaml"));
            let previous = std::fs::read_to_string(&path).ok();
            let yaml = style::to_yaml_like(&serde_json::to_value(&spec)?, previous.as_deref())?;
            std::fs::write(path, yaml)?;
        }
    }
    let groups_path = dir.join("groups.yaml");
    if groups.is_empty() {
        if groups_path.exists() {
            std::fs::remove_file(groups_path)?;
        }
    } else {
        let map: BTreeMap<String, GroupEntry> = groups
            .into_iter()
            .map(|g| {
                (
                    g.name,
                    GroupEntry {
                        description: g.description,
                        owner: g.owner,
                        pin: g.pin,
                        managed: g.managed,
                    },
                )
            })
            .collect();
        #[derive(Serialize)]
        struct Out {
            groups: BTreeMap<String, GroupEntry>,
        }
        let previous = std::fs::read_to_string(&groups_path).ok();
        let value = serde_json::to_value(Out { groups: map })?;
        std::fs::write(
            &groups_path,
            style::to_yaml_like(&value, previous.as_deref())?,
        )?;
    }
    Ok(state.agents.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(rows: &[(&str, &str, &str)]) -> Applied {
        let rows: Vec<_> = rows
            .iter()
            .map(|(a, k, v)| ((*a).to_owned(), (*k).to_owned(), (*v).to_owned()))
            .collect();
        Applied::from_rows(&rows)
    }

    fn removals() -> Vec<Change> {
        vec![
            Change::RemoveGrant {
                agent: "a".into(),
                target: "written".into(),
            },
            Change::RemoveGrant {
                agent: "a".into(),
                target: "outside".into(),
            },
            Change::SetUsers {
                agent: "a".into(),
                before: vec!["alice".into(), "bob".into()],
                after: vec!["carol".into()],
            },
            Change::DeleteAgent {
                name: "gone".into(),
            },
            Change::DeleteAgent { name: "ui".into() },
        ]
    }

    #[test]
    fn removals_of_what_the_last_apply_did_not_write_are_kept() {
        let last = applied(&[
            ("a", "agent", ""),
            ("a", "grant", "written"),
            ("a", "user", "bob"),
            ("gone", "agent", ""),
        ]);
        let (changes, kept) = hold_back(removals(), &last, false);
        assert_eq!(
            changes,
            vec![
                Change::RemoveGrant {
                    agent: "a".into(),
                    target: "written".into(),
                },
                Change::SetUsers {
                    agent: "a".into(),
                    before: vec!["alice".into(), "bob".into()],
                    after: vec!["alice".into(), "carol".into()],
                },
                Change::DeleteAgent {
                    name: "gone".into(),
                },
            ]
        );
        assert_eq!(
            kept,
            vec![
                Kept::Grant {
                    agent: "a".into(),
                    target: "outside".into(),
                },
                Kept::User {
                    agent: "a".into(),
                    user: "alice".into(),
                    live: 0,
                },
                Kept::Agent { name: "ui".into() },
            ]
        );
    }

    #[test]
    fn a_user_change_that_only_removed_kept_users_goes_and_prune_keeps_nothing() {
        let only_removal = vec![Change::SetUsers {
            agent: "a".into(),
            before: vec!["alice".into()],
            after: vec![],
        }];
        let (changes, kept) = hold_back(only_removal.clone(), &Applied::default(), false);
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(kept.len(), 1);
        let (changes, kept) = hold_back(only_removal.clone(), &Applied::default(), true);
        assert_eq!(changes, only_removal);
        assert!(kept.is_empty());
        let (changes, kept) = hold_back(removals(), &Applied::default(), true);
        assert_eq!(changes, removals());
        assert!(kept.is_empty());
    }

    #[test]
    fn front_matter_splits_from_the_body() {
        let (yaml, body) = split_front_matter("---\ntools: [search]\n---\nHello\n").unwrap();
        assert_eq!(yaml, "tools: [search]\n");
        assert_eq!(body, "Hello\n");
        assert!(split_front_matter("tools: [search]\n").is_none());
    }

    /// Found by fuzzing (`fuzz/`, target `agent_md`): lone carriage returns made the reported
    /// line 16 of a 5-line file.
    #[test]
    fn a_front_matter_error_is_located_inside_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("agents/a")).unwrap();
        let text = "---\r\ntools: [w\r\r\r\r\r\r\r\r\r\r\r\r\r\r\t0tbaeher]\r\n---\r\nbody\r\n";
        std::fs::write(dir.path().join("agents/a/agent.md"), text).unwrap();
        let (policies, problems) = read_dir(dir.path());
        assert!(policies.agents.is_empty());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, 2, "{}", problems[0]);
        assert!(problems[0].message.starts_with("invalid front matter"));
    }

    /// Found by fuzzing (`fuzz/`, target `agent_md`): a tool entry holding carriage returns
    /// and U+2028 read fine, but `policy export` wrote it as a block whose last line ran into
    /// the closing `---`, and the exported file no longer read back.
    #[test]
    fn values_with_line_separators_or_controls_are_refused_where_they_are() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("agents/a")).unwrap();
        let file = dir.path().join("agents/a/agent.md");
        for (text, line, code) in [
            (
                "---\ntools: [w]\ndescription: \"x\\u2028y\"\n---\n",
                2,
                "U+2028",
            ),
            // An escape, not the character itself: located at the front matter's first line.
            ("---\ntools: [w]\npinned: [\"a\\rb\"]\n---\n", 2, "U+000D"),
            (
                "---\ntools: [\"nor__t\r\r[[xx\u{2028}\", __tx]\n---\n0b",
                2,
                "U+2028",
            ),
        ] {
            std::fs::write(&file, text).unwrap();
            let (policies, problems) = read_dir(dir.path());
            assert!(policies.agents.is_empty(), "{text:?}");
            assert_eq!(problems.len(), 1, "{text:?}: {problems:?}");
            assert_eq!(problems[0].line, line, "{text:?}: {}", problems[0]);
            assert!(problems[0].message.contains(code), "{}", problems[0]);
        }
        // A multi-line description and tabs are fine.
        std::fs::write(
            &file,
            "---\ntools: [w]\ndescription: |\n  one\n  \ttwo\n---\n",
        )
        .unwrap();
        let (policies, problems) = read_dir(dir.path());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(policies.agents[0].front.description, "one\n\ttwo\n");
    }
}
