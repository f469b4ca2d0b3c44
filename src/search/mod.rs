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
    Catalog, ContentHash, Execution, GroupSummaries, ScriptGroup, ScriptSpec, Tool, ToolName,
    ToolSource,
};

/// The search meta-tool. Real tool names always contain `__`, so it cannot collide with one.
pub const SEARCH_TOOLS: &str = "search_tools";
/// The call meta-tool.
pub const CALL_TOOL: &str = "call_tool";
/// The load meta-tool (index mode): named tools' full definitions.
pub const LOAD_TOOLS: &str = "load_tools";
/// Most tools one `load_tools` returns.
pub const MAX_LOAD: usize = 20;
/// Default `--index-token-budget`: `auto` serves the index up to this many tokens.
pub const DEFAULT_INDEX_BUDGET: usize = 8000;
/// Longest summary of a tool in the index, in characters.
const INDEX_SUMMARY_CHARS: usize = 56;
/// A summary longer than this ends at its first clause break after it (`, `, `; `, `: `,
/// ` (`, ` - `, or a word that starts the details: "using", "for", "from" …): the purpose,
/// not the details, which `load_tools` gives.
const INDEX_CLAUSE_CHARS: usize = 24;
/// Results returned when the caller does not say.
pub const DEFAULT_LIMIT: usize = 5;
/// Most results one search returns.
pub const MAX_LIMIT: usize = 20;
/// Default `--search-token-budget`: `auto` lists in full up to this many tokens.
pub const DEFAULT_TOKEN_BUDGET: usize = 5000;

/// Whether `name` is one of the meta-tools.
pub fn is_meta_tool(name: &str) -> bool {
    name == SEARCH_TOOLS || name == CALL_TOOL || name == LOAD_TOOLS
}

fn object(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

static META_TOOLS: LazyLock<[rmcp::model::Tool; 3]> = LazyLock::new(|| {
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
                        "description": "The tool's arguments."
                    }
                },
                "required": ["name"],
                "additionalProperties": false
            })),
        ),
        rmcp::model::Tool::new(
            LOAD_TOOLS,
            "Load the full definitions of tools you name (exact names, as the index in \
             search_tools lists them), to call them.",
            object(json!({
                "type": "object",
                "properties": {
                    "names": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "maxItems": MAX_LOAD,
                        "description": "The tools' exact names."
                    }
                },
                "required": ["names"],
                "additionalProperties": false
            })),
        )
        .with_annotations(
            rmcp::model::ToolAnnotations::new()
                .read_only(true)
                .open_world(false),
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

/// One entry of a `tools/list`: a tool of the pool (or the agent's narrowed copy), one of
/// the meta-tools, or `search_tools` carrying the caller's index.
#[derive(Debug, Clone)]
pub enum Listed {
    Meta(&'static rmcp::model::Tool),
    Tool(Arc<Tool>),
    Index(Arc<IndexTool>),
}

/// `search_tools` with the caller's index in its description, and its serialized entry.
#[derive(Debug)]
pub struct IndexTool {
    pub tool: rmcp::model::Tool,
    pub json: String,
}

impl Listed {
    pub fn name(&self) -> &str {
        match self {
            Listed::Meta(t) => &t.name,
            Listed::Tool(t) => t.name.as_str(),
            Listed::Index(t) => &t.tool.name,
        }
    }

    /// The entry as the SDK's type.
    pub fn definition(&self) -> rmcp::model::Tool {
        match self {
            Listed::Meta(t) => (*t).clone(),
            Listed::Tool(t) => t.mcp_definition(),
            Listed::Index(t) => t.tool.clone(),
        }
    }
}

/// The pinned tools among `visible`, as list entries.
fn pinned_entries<'a>(
    pinned: &'a [String],
    visible: &'a [Arc<Tool>],
) -> impl Iterator<Item = Listed> + 'a {
    visible
        .iter()
        .filter(|t| pinned.iter().any(|p| p == t.name.as_str()))
        .map(|t| Listed::Tool(t.clone()))
}

/// The search-mode `tools/list`: `search_tools` and `call_tool`, plus the pinned tools among
/// `visible`, all in name order (so that one cursor scheme pages every mode).
pub fn search_entries(pinned: &[String], visible: &[Arc<Tool>]) -> Vec<Listed> {
    let mut listed: Vec<Listed> = meta_tools()
        .iter()
        .filter(|t| t.name != LOAD_TOOLS)
        .map(Listed::Meta)
        .collect();
    listed.extend(pinned_entries(pinned, visible));
    listed.sort_by(|a, b| a.name().cmp(b.name()));
    listed
}

/// The index-mode `tools/list`: the three meta-tools, `search_tools` carrying the index of
/// every visible tool in its description (where every client shows it to the model: a
/// tool's description is part of what the model is given, while server instructions and
/// resources are shown, or not, as each host decides), plus the pinned tools.
pub fn index_entries(
    pinned: &[String],
    visible: &[Arc<Tool>],
    groups: &GroupSummaries,
) -> Vec<Listed> {
    index_entries_with(pinned, visible, Arc::new(index_tool(visible, groups)))
}

/// [`index_entries`] with `search_tools` already built by [`index_tool`] (the snapshot keeps
/// it per caller's view).
pub fn index_entries_with(
    pinned: &[String],
    visible: &[Arc<Tool>],
    index: Arc<IndexTool>,
) -> Vec<Listed> {
    let mut listed: Vec<Listed> = meta_tools()
        .iter()
        .filter(|t| t.name != SEARCH_TOOLS)
        .map(Listed::Meta)
        .collect();
    listed.push(Listed::Index(index));
    listed.extend(pinned_entries(pinned, visible));
    listed.sort_by(|a, b| a.name().cmp(b.name()));
    listed
}

/// [`index_entries`] as the SDK's types.
pub fn index_listing(
    pinned: &[String],
    visible: &[Arc<Tool>],
    groups: &GroupSummaries,
) -> Vec<rmcp::model::Tool> {
    index_entries(pinned, visible, groups)
        .iter()
        .map(Listed::definition)
        .collect()
}

#[allow(
    clippy::expect_used,
    reason = "search_tools is one of the meta-tools, and the SDK's own type serializes"
)]
pub fn index_tool(visible: &[Arc<Tool>], groups: &GroupSummaries) -> IndexTool {
    let mut tool = meta_tool(SEARCH_TOOLS)
        .expect("search_tools is a meta-tool")
        .clone();
    // The index says what the tool is for itself: search mode's description is not repeated.
    tool.description = Some(index_text(visible, groups).into());
    let json = serde_json::to_string(&tool).expect("a tool definition serializes");
    IndexTool { tool, json }
}

/// The index: a heading per group (its name, and its summary made safe), then one line per
/// visible tool, beginning with its name, then a colon and the first sentence of its
/// description, made safe (see [`summary`]). A pure function of `visible` (name-ordered) and
/// the groups' summaries: it changes only when visibility or a definition does, so prompt
/// caches hold.
pub fn index_text(visible: &[Arc<Tool>], groups: &GroupSummaries) -> String {
    let mut out = String::from(
        "Your tools by group (name: purpose). load_tools gives their definitions; call them \
         by name or through call_tool. This tool finds tools for a task (query) and returns \
         their definitions.",
    );
    let mut group = "";
    for t in visible {
        let name = t.name.as_str();
        let g = name
            .split_once(crate::pool::SEPARATOR)
            .map_or(name, |(g, _)| g);
        if g != group {
            group = g;
            out.push_str("\n## ");
            out.push_str(g);
            let s = groups.get(g).map(|s| group_line(s)).unwrap_or_default();
            if !s.is_empty() {
                out.push_str(": ");
                out.push_str(&s);
            }
        }
        out.push('\n');
        out.push_str(name);
        let s = t.description.as_deref().map(summary).unwrap_or_default();
        if !s.is_empty() {
            out.push_str(": ");
            out.push_str(&s);
        }
    }
    out
}

/// A description's first sentence as one line of plain text, at most
/// [`INDEX_SUMMARY_CHARS`] characters: descriptions are written by tool authors and upstream
/// servers, so line breaks, control and invisible formatting characters (bidirectional
/// overrides, zero-width, tag characters) become spaces, markup brackets and backticks become
/// harmless look-alikes, and nothing can start a line or a heading of its own.
pub fn summary(description: &str) -> String {
    let mut out = first_clause(description, INDEX_CLAUSE_CHARS);
    cut_at_connector(&mut out);
    out
}

/// A group's summary as its index heading: made safe and bounded like a tool's line, but
/// whole up to the bound (its author wrote it as one line; it is not a description's first
/// sentence).
pub fn group_line(summary: &str) -> String {
    first_clause(summary, usize::MAX)
}

/// [`summary`] before the cut at a [`DETAILS`] word; a clause break ends it past `clause_at`
/// characters.
fn first_clause(description: &str, clause_at: usize) -> String {
    let first = first_sentence(description);
    let mut out = String::with_capacity(first.len().min(INDEX_SUMMARY_CHARS * 4));
    let mut chars = 0;
    let mut space = false;
    for c in first.chars() {
        let c = match c {
            '<' => '‹',
            '>' => '›',
            '`' => '\'',
            '[' => '(',
            ']' => ')',
            c if c.is_control() || c.is_whitespace() || invisible(c) => ' ',
            c => c,
        };
        if c == ' ' {
            space = !out.is_empty();
            continue;
        }
        if chars + usize::from(space) + 1 > INDEX_SUMMARY_CHARS {
            // Cut at the last word boundary rather than inside a word, and end on a word
            // that carries meaning: the line is a pointer to the definition load_tools gives,
            // so an ellipsis would cost a token and say nothing the format does not.
            if !space && let Some(at) = out.rfind(' ') {
                out.truncate(at);
            }
            // And end where a phrase ends: "… by its tag name", not "… by its tag name in a
            // GitHub".
            if let Some(at) = last_phrase_start(&out) {
                out.truncate(at);
            }
            trim_dangling(&mut out);
            return out;
        }
        if space && chars >= clause_at && matches!(out.chars().last(), Some(',' | ';' | ':')) {
            out.pop();
            return out;
        }
        if space && chars >= clause_at && (c == '(' || c == '-' || c == '—') {
            return out;
        }
        if space {
            out.push(' ');
            chars += 1;
            space = false;
        }
        out.push(c);
        chars += 1;
    }
    // A full stop at the end says nothing the line break does not.
    if out.ends_with('.') && !out.ends_with("..") {
        out.pop();
    }
    out
}

/// Words that leave a cut line hanging ("… using", "… of the"): dropped from its end.
const DANGLING: &[&str] = &[
    "a", "an", "and", "as", "at", "by", "for", "from", "in", "into", "its", "of", "on", "or",
    "that", "the", "their", "to", "using", "via", "which", "with", "your",
];

/// Words after which a summary gives the details (the means, the scope, the source), not
/// the purpose: a summary past [`INDEX_CLAUSE_CHARS`] ends before the first of them.
const DETAILS: &[&str] = &[
    "across",
    "as",
    "based",
    "by",
    "for",
    "from",
    "including",
    "that",
    "using",
    "via",
    "when",
    "where",
    "which",
    "while",
    "with",
    "within",
];

/// Ends `out` before the first [`DETAILS`] word past [`INDEX_CLAUSE_CHARS`].
fn cut_at_connector(out: &mut String) {
    let first = breaks_before(out, DETAILS).next();
    if let Some(at) = first {
        out.truncate(at);
        trim_dangling(out);
    }
}

/// Where the last phrase of `out` past [`INDEX_CLAUSE_CHARS`] starts: the space before its
/// last [`DANGLING`] word there.
fn last_phrase_start(out: &str) -> Option<usize> {
    breaks_before(out, DANGLING).last()
}

/// The spaces of `out` past [`INDEX_CLAUSE_CHARS`] characters that come before one of
/// `words` (in any case), in order.
fn breaks_before<'a>(out: &'a str, words: &'a [&'a str]) -> impl Iterator<Item = usize> + 'a {
    let mut chars = 0;
    let mut last = 0;
    out.match_indices(' ').filter_map(move |(i, _)| {
        chars += out[last..i].chars().count();
        last = i;
        let next = out[i + 1..].split(' ').next().unwrap_or("");
        (chars >= INDEX_CLAUSE_CHARS && words.contains(&next.to_lowercase().as_str())).then_some(i)
    })
}

/// Drops trailing punctuation and [`DANGLING`] words from a cut line.
fn trim_dangling(out: &mut String) {
    loop {
        let trimmed = out
            .trim_end_matches([' ', ',', ';', ':', '-', '—', '(', '/'])
            .len();
        out.truncate(trimmed);
        let start = out.rfind(' ').map_or(0, |i| i + 1);
        if start == 0 || !DANGLING.contains(&out[start..].to_lowercase().as_str()) {
            return;
        }
        out.truncate(start);
    }
}

/// Up to and including the first full stop followed by a space, or the first line break.
fn first_sentence(d: &str) -> &str {
    let d = d.trim_start();
    let mut end = d.len();
    for (i, c) in d.char_indices() {
        if c == '\n' || c == '\r' {
            end = i;
            break;
        }
        if matches!(c, '.' | '!' | '?' | '。')
            && d[i + c.len_utf8()..]
                .chars()
                .next()
                .is_none_or(char::is_whitespace)
        {
            end = i + c.len_utf8();
            break;
        }
    }
    &d[..end]
}

/// Characters that render as nothing or reorder text: Unicode's format characters a model
/// reads and a person does not see.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}' | '\u{E0000}'..='\u{E007F}')
}

/// A parsed `load_tools` call: the names, deduplicated, in the order given.
pub fn parse_load(args: &Map<String, Value>) -> Result<Vec<String>, String> {
    if let Some(k) = args.keys().find(|k| *k != "names") {
        return Err(format!("unknown argument `{k}`: load_tools takes names"));
    }
    let Some(Value::Array(names)) = args.get("names") else {
        return Err("load_tools needs `names`: an array of exact tool names".into());
    };
    if names.is_empty() || names.len() > MAX_LOAD {
        return Err(format!("`names` holds 1 to {MAX_LOAD} tool names"));
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for n in names {
        let Value::String(n) = n else {
            return Err("`names` holds strings: exact tool names".into());
        };
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    Ok(out)
}

/// The `load_tools` result: the full definitions (as `tools/list` gives them) of the named
/// tools the caller may see, and the names it may not, unknown or not granted alike.
pub fn load_body(found: &[Arc<Tool>], not_found: &[String]) -> Value {
    let tools: Vec<rmcp::model::Tool> = found.iter().map(|t| t.mcp_definition()).collect();
    json!({"tools": tools, "not_found": not_found})
}

/// [`search_entries`] as the SDK's types.
pub fn search_listing(pinned: &[String], visible: &[Arc<Tool>]) -> Vec<rmcp::model::Tool> {
    search_entries(pinned, visible)
        .iter()
        .map(Listed::definition)
        .collect()
}

/// The token budgets `auto` chooses by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budgets {
    /// The definitions are listed in full up to this many tokens.
    pub full: usize,
    /// Above it, the index is served up to this many tokens (of the index-mode list).
    pub index: usize,
}

/// `auto` resolved: `Full` while the visible tools' definitions cost at most `budgets.full`
/// tokens, `Index` while the index-mode list costs at most `budgets.index`, `Search` above.
/// The counts are asked for only when needed.
pub fn resolve_discovery(
    configured: Discovery,
    visible_tokens: impl FnOnce() -> usize,
    index_tokens: impl FnOnce() -> usize,
    budgets: Budgets,
) -> Discovery {
    match configured {
        Discovery::Auto if visible_tokens() <= budgets.full => Discovery::Full,
        Discovery::Auto if index_tokens() <= budgets.index => Discovery::Index,
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
    /// The index-mode `tools/list` (meta-tools with the index, and pinned tools).
    pub index_tokens: usize,
    /// What its `tools/list` costs as it is served now.
    pub listed_tokens: usize,
    /// `discovery` as configured.
    pub discovery: Discovery,
    /// `full`, `index` or `search`: `auto` resolved against the budgets.
    pub effective_discovery: Discovery,
    /// Why it is served so, in words.
    pub reason: String,
    pub token_budget: usize,
    pub index_token_budget: usize,
}

/// Token accounting of `agent` (with a token that carries all its grants), for the admin
/// surfaces. Counts come from the snapshot's memo of [`cost`] results.
pub fn agent_tokens(snapshot: &PolicySnapshot, agent: &AgentView, budgets: Budgets) -> AgentTokens {
    let visible_tokens = snapshot.agent_list_tokens(agent);
    let search_tokens =
        cost::definitions_tokens(&search_listing(&agent.record.pinned, &agent.visible));
    let index_tokens = snapshot.agent_index_tokens(agent);
    let effective = resolve_discovery(
        agent.record.discovery,
        || visible_tokens,
        || index_tokens,
        budgets,
    );
    let reason = match agent.record.discovery {
        Discovery::Auto => match effective {
            Discovery::Full => format!(
                "auto: its definitions ({visible_tokens} tokens) fit the budget ({})",
                budgets.full
            ),
            Discovery::Index => format!(
                "auto: its definitions ({visible_tokens} tokens) exceed the budget ({}); its index ({index_tokens} tokens) fits the index budget ({})",
                budgets.full, budgets.index
            ),
            _ => format!(
                "auto: its definitions ({visible_tokens} tokens) exceed the budget ({}), and its index ({index_tokens} tokens) the index budget ({})",
                budgets.full, budgets.index
            ),
        },
        d => format!("configured `{}`", d.as_str()),
    };
    AgentTokens {
        list: ListCost {
            visible_tools: agent.visible.len(),
            visible_tokens,
            pool_tools: snapshot.catalog.len(),
            pool_tokens: snapshot.pool_list_tokens(),
        },
        search_tokens,
        index_tokens,
        listed_tokens: match effective {
            Discovery::Search => search_tokens,
            Discovery::Index => index_tokens,
            _ => visible_tokens,
        },
        discovery: agent.record.discovery,
        effective_discovery: effective,
        reason,
        token_budget: budgets.full,
        index_token_budget: budgets.index,
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
                    summary: None,
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
