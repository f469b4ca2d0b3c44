//! Tool search: grant-aware deferred tool loading.
//!
//! An agent in `discovery: search` (or `auto` above its token budget) does not get its tools'
//! definitions in `tools/list`. It gets two meta-tools, [`SEARCH_TOOLS`] and [`CALL_TOOL`], plus
//! its pinned tools, and finds the rest by searching: `search_tools` ranks **only the caller's
//! visible tools** (token prefixes ∩ live grants, [`PolicySnapshot::visible`]) and returns the
//! matches' full definitions, which the model then calls by name, directly or through
//! `call_tool`. Both go through [`crate::gate::Gate`], so grants, limits and audit are those of any
//! call. Nothing is stored between requests: the list and the results are pure functions of the
//! token, the live grants and the catalog, in a deterministic order, so prompt caches hold.
//!
//! **Ranking.** BM25F over the name, title, description and parameters (names, descriptions,
//! enum values) of each tool, with queries analyzed for English, French, German and Spanish and
//! mapped onto the tools' English words through a small static lexicon (see `analyze.rs` and `lexicon.txt`). It
//! needs no model and nothing from the network. Three signals sit on top: a token's shape
//! implies a term (a URL "url", `logo.png` "file"), a query that names a tool's group
//! multiplies that tool's score, and so does a query that asks for the tool's action (read,
//! create, update, delete: `action.rs`). Results carry each tool's name, description and input schema
//! without the schema's bookkeeping, so that the model can call it.
//!
//! **Optional embeddings.** Given a table (`--search-embeddings`, made by
//! `bench/embeddings/setup.sh`), [`embed`] adds a static embedding's cosine to the word score.
//! Each tool's vector is its own and the scaling uses the visible tools only, so visibility
//! stays exact. With the default table (WordLlama, from its PyPI wheel) it gains about one
//! point of recall@5 over the held-out sets; the distilled multilingual-e5 table did not help
//! (see `bench/README.md`). It is off unless a table is given: the default build needs none.
//!
//! **Why our own BM25 rather than a crate.** The maintained crates (`bm25`, `tantivy`) score
//! against statistics of the whole corpus they hold, fitted up front, and return a top-k over
//! all of it. We need the opposite shape: one index per catalog, searched through a different
//! visible subset on every request, with document frequencies and average length computed on
//! that subset (see [`index`]), and field weights for name, description and parameters. Doing
//! that with `bm25` means a corpus per agent and token scope, rebuilt on every grant change, or
//! over-fetching and filtering (which still ranks with foreign statistics). Okapi BM25 itself is
//! forty lines; the analyzer is ours too (camelCase and `__` splitting matter for tool names),
//! with Snowball stemming from `rust-stemmers`.
//!
//! [`PolicySnapshot::visible`]: crate::policy::snapshot::PolicySnapshot::visible

mod action;
mod analyze;
pub mod embed;
pub mod index;

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub use index::{Fusion, Hit, SearchIndex, SearchOptions};

/// The weighted English terms a query searches with under `options`, for the benchmark's
/// `--explain`.
pub fn query_terms(query: &str, options: &SearchOptions) -> Vec<(String, f64)> {
    analyze::query_terms(query, &options.query)
}

use crate::cost::{self, ListCost};
use crate::policy::snapshot::{AgentView, Discovery, PolicySnapshot};
use crate::pool::{
    Catalog, ContentHash, Execution, ScriptGroup, ScriptSpec, Tool, ToolName, ToolSource,
};

/// The search meta-tool. Real tool names always contain `__`, so it cannot collide with one.
pub const SEARCH_TOOLS: &str = "search_tools";
/// The call meta-tool.
pub const CALL_TOOL: &str = "call_tool";
/// Results returned when the caller does not say.
pub const DEFAULT_LIMIT: usize = 5;
/// Most results one search returns.
pub const MAX_LIMIT: usize = 20;
/// Default `--search-token-budget`: `auto` lists in full up to this many tokens.
pub const DEFAULT_TOKEN_BUDGET: usize = 5000;

/// Whether `name` is one of the meta-tools.
pub fn is_meta_tool(name: &str) -> bool {
    name == SEARCH_TOOLS || name == CALL_TOOL
}

fn object(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

static META_TOOLS: LazyLock<[rmcp::model::Tool; 2]> = LazyLock::new(|| {
    [
        rmcp::model::Tool::new(
            CALL_TOOL,
            "Call one of your tools by its exact name, as search_tools returned it. \
             You may also call a found tool directly by its name.",
            object(json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's exact name."},
                    "arguments": {
                        "type": "object",
                        "description": "The tool's arguments, as its inputSchema describes them."
                    }
                },
                "required": ["name"],
                "additionalProperties": false
            })),
        ),
        rmcp::model::Tool::new(
            SEARCH_TOOLS,
            "Find the tools you may use for a task. Describe the task in plain words \
             (e.g. \"merge a pull request\"); returns the best matches' full definitions \
             (name, description, inputSchema), best first. Then call a tool by its name.",
            object(json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The task, in plain words."},
                    "limit": {
                        "type": "integer",
                        "description": "How many tools to return.",
                        "minimum": 1,
                        "maximum": MAX_LIMIT,
                        "default": DEFAULT_LIMIT
                    }
                },
                "required": ["query"],
                "additionalProperties": false
            })),
        )
        .with_annotations(
            rmcp::model::ToolAnnotations::new()
                .read_only(true)
                .open_world(false),
        ),
    ]
});

/// The meta-tools' definitions, in name order.
pub fn meta_tools() -> &'static [rmcp::model::Tool] {
    &*META_TOOLS
}

pub fn meta_tool(name: &str) -> Option<&'static rmcp::model::Tool> {
    META_TOOLS.iter().find(|t| t.name == name)
}

/// One entry of a `tools/list`: a tool of the pool (or the agent's narrowed copy), or one of
/// the meta-tools.
#[derive(Debug, Clone)]
pub enum Listed {
    Meta(&'static rmcp::model::Tool),
    Tool(Arc<Tool>),
}

impl Listed {
    pub fn name(&self) -> &str {
        match self {
            Listed::Meta(t) => &t.name,
            Listed::Tool(t) => t.name.as_str(),
        }
    }

    /// The entry as the SDK's type.
    pub fn definition(&self) -> rmcp::model::Tool {
        match self {
            Listed::Meta(t) => (*t).clone(),
            Listed::Tool(t) => t.mcp_definition(),
        }
    }
}

/// The search-mode `tools/list`: the meta-tools, plus the pinned tools among `visible`, all in
/// name order (so that one cursor scheme pages both modes).
pub fn search_entries(pinned: &[String], visible: &[Arc<Tool>]) -> Vec<Listed> {
    let mut listed: Vec<Listed> = meta_tools().iter().map(Listed::Meta).collect();
    listed.extend(
        visible
            .iter()
            .filter(|t| pinned.iter().any(|p| p == t.name.as_str()))
            .map(|t| Listed::Tool(t.clone())),
    );
    listed.sort_by(|a, b| a.name().cmp(b.name()));
    listed
}

/// [`search_entries`] as the SDK's types.
pub fn search_listing(pinned: &[String], visible: &[Arc<Tool>]) -> Vec<rmcp::model::Tool> {
    search_entries(pinned, visible)
        .iter()
        .map(Listed::definition)
        .collect()
}

/// `auto` resolved: `Full` while the visible tools' definitions cost at most `budget` tokens.
pub fn resolve_discovery(
    configured: Discovery,
    visible_tokens: impl FnOnce() -> usize,
    budget: usize,
) -> Discovery {
    match configured {
        Discovery::Auto if visible_tokens() <= budget => Discovery::Full,
        Discovery::Auto => Discovery::Search,
        other => other,
    }
}

/// A parsed `search_tools` call.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    pub query: String,
    pub limit: usize,
}

/// Reads `search_tools` arguments; the error is the text the model reads to retry.
pub fn parse_search(args: &Map<String, Value>) -> Result<SearchRequest, String> {
    let query = match args.get("query") {
        Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
        Some(Value::String(_)) | None => {
            return Err("search_tools needs a `query`: the task, in plain words".into());
        }
        Some(_) => return Err("`query` must be a string".into()),
    };
    let limit = match args.get("limit") {
        None | Some(Value::Null) => DEFAULT_LIMIT,
        Some(v) => match v.as_u64() {
            Some(n) => (n as usize).clamp(1, MAX_LIMIT),
            None => return Err(format!("`limit` must be an integer from 1 to {MAX_LIMIT}")),
        },
    };
    if let Some(k) = args.keys().find(|k| *k != "query" && *k != "limit") {
        return Err(format!(
            "unknown argument `{k}`: search_tools takes query and limit"
        ));
    }
    Ok(SearchRequest { query, limit })
}

/// A parsed `call_tool` call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRequest {
    pub name: String,
    pub arguments: Value,
}

/// Reads `call_tool` arguments. Missing `arguments` is `{}`; a non-object is passed on, for the
/// call path to refuse and audit like any other invalid arguments.
pub fn parse_call(args: &Map<String, Value>) -> Result<CallRequest, String> {
    let name = match args.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err("call_tool needs `name`: the tool's exact name, a string".into()),
    };
    if let Some(k) = args.keys().find(|k| *k != "name" && *k != "arguments") {
        return Err(format!(
            "unknown argument `{k}`: call_tool takes name and arguments"
        ));
    }
    let arguments = match args.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v) => v.clone(),
    };
    Ok(CallRequest { name, arguments })
}

/// The `search_tools` result: per hit, what a model needs to call the tool and no more: its
/// name, description and input schema (types, required, enums, defaults, bounds, parameter
/// descriptions). Left out: annotations, `_meta`, titles and the schema's bookkeeping
/// (`$schema`, `additionalProperties`, `title`), which `tools/list` still carries.
pub fn results_body(hits: &[Hit]) -> Value {
    let tools: Vec<Value> = hits.iter().map(|h| compact_definition(&h.tool)).collect();
    json!({"tools": tools})
}

fn compact_definition(tool: &Tool) -> Value {
    let mut def = Map::new();
    def.insert("name".into(), Value::String(tool.name.to_string()));
    if let Some(d) = &tool.description {
        def.insert("description".into(), Value::String(d.clone()));
    }
    def.insert(
        "inputSchema".into(),
        compact_schema(&Value::Object((*tool.input_schema).clone())),
    );
    Value::Object(def)
}

/// A JSON Schema without the keywords a model does not need to write a valid call (the
/// gateway still validates against the full schema, and says what is wrong).
fn compact_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "$schema" | "additionalProperties" | "title")
                })
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        // Maps of names to schemas, and schemas: compact inside.
                        "properties" | "$defs" | "definitions" => match v {
                            Value::Object(props) => Value::Object(
                                props
                                    .iter()
                                    .map(|(name, s)| (name.clone(), compact_schema(s)))
                                    .collect(),
                            ),
                            other => other.clone(),
                        },
                        "items" | "not" | "additionalItems" => compact_schema(v),
                        "anyOf" | "oneOf" | "allOf" => match v {
                            Value::Array(a) => Value::Array(a.iter().map(compact_schema).collect()),
                            other => other.clone(),
                        },
                        _ => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The text block of a `search_tools` result: what the model reads.
pub fn results_text(hits: &[Hit]) -> String {
    results_body(hits).to_string()
}

/// What an agent's tool definitions cost, and how it is therefore served.
#[derive(Debug, Clone, Serialize)]
pub struct AgentTokens {
    /// Its visible tools' `tools/list` entries next to the whole pool's.
    #[serde(flatten)]
    pub list: ListCost,
    /// The search-mode `tools/list` (meta-tools and pinned tools).
    pub search_tokens: usize,
    /// What its `tools/list` costs as it is served now.
    pub listed_tokens: usize,
    /// `discovery` as configured.
    pub discovery: Discovery,
    /// `full` or `search`: `auto` resolved against the budget.
    pub effective_discovery: Discovery,
    pub token_budget: usize,
}

/// Token accounting of `agent` (with a token that carries all its grants), for the admin
/// surfaces. Counts come from the snapshot's memo of [`cost`] results.
pub fn agent_tokens(snapshot: &PolicySnapshot, agent: &AgentView, budget: usize) -> AgentTokens {
    let visible_tokens = snapshot.agent_list_tokens(agent);
    let search_tokens =
        cost::definitions_tokens(&search_listing(&agent.record.pinned, &agent.visible));
    let effective = resolve_discovery(agent.record.discovery, || visible_tokens, budget);
    AgentTokens {
        list: ListCost {
            visible_tools: agent.visible.len(),
            visible_tokens,
            pool_tools: snapshot.catalog.len(),
            pool_tokens: snapshot.pool_list_tokens(),
        },
        search_tokens,
        listed_tokens: if effective == Discovery::Search {
            search_tokens
        } else {
            visible_tokens
        },
        discovery: agent.record.discovery,
        effective_discovery: effective,
        token_budget: budget,
    }
}

/// A catalog made of MCP `tools/list` entries (`{"name", "description", "inputSchema"}`), for
/// the benchmark and tests. Its tools can be listed and searched but not run: they have no
/// script.
pub fn catalog_from_definitions(defs: &Value) -> Result<Catalog, String> {
    let defs: Vec<rmcp::model::Tool> = serde_json::from_value(defs.clone())
        .map_err(|e| format!("not a JSON array of MCP tool definitions: {e}"))?;
    let mut tools = Vec::with_capacity(defs.len());
    for def in defs {
        let name = ToolName::parse(&def.name)?;
        let (group, _) = def
            .name
            .split_once(crate::pool::SEPARATOR)
            .ok_or_else(|| format!("`{}` is not `<group>__<operation>`", def.name))?;
        // Kept as text, as the loader keeps a script tool's.
        let schema = crate::pool::InputSchema::new(&def.input_schema);
        let validator = crate::pool::InputValidator::check(
            schema.clone(),
            &def.input_schema,
            Some(jsonschema::Draft::Draft202012),
        )
        .map_err(|e| format!("`{}`: invalid inputSchema: {e}", def.name))?;
        let hash = Sha256::digest(serde_json::to_vec(&def).unwrap_or_default());
        tools.push(Arc::new(Tool {
            name,
            title: def.title.clone(),
            description: def.description.as_ref().map(|d| d.to_string()),
            input_schema: schema,
            content_hash: ContentHash::from_digest(hash),
            source: ToolSource::Upstream {
                upstream: group.to_owned(),
            },
            http: None,
            exec: Execution::Script(ScriptSpec {
                group: Arc::new(ScriptGroup {
                    name: group.into(),
                    workdir: PathBuf::new(),
                    env: Box::default(),
                    credentials: Box::default(),
                    script_env: Arc::new(crate::pool::env::PrefixedEnv::default()),
                    settings: "{}".into(),
                    sandbox: Default::default(),
                    max_concurrency: 1,
                    copies: None,
                    copy_store: false,
                    spec_stamp: Default::default(),
                }),
                file: "".into(),
                timeout: Duration::from_secs(1),
                stamps: Default::default(),
            }),
            validator,
            ui: None,
            narrowing: None,
            listed: Default::default(),
            audit: Arc::default(),
            annotations: def.annotations.clone().map(Box::new),
            meta: def.meta.clone().map(Box::new),
        }));
    }
    Ok(Catalog::new(tools, Vec::new()))
}

#[cfg(test)]
mod tests;
