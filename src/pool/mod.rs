//! The tool pool: every tool the gateway can serve, before anyone's grants are applied.
//!
//! A [`Catalog`] is an immutable value. Reloads build a new one and swap it in, so a request
//! always sees one consistent catalog from start to finish.

pub mod copies;
pub mod definition;
pub mod egress;
pub mod env;
pub mod jail;
pub mod loader;
pub mod runner;
pub mod sandbox;
pub mod slots;
pub mod spawn;
pub mod watcher;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

/// The separator between a group and an operation in a tool name (`weather__current`).
pub const SEPARATOR: &str = "__";

/// Longest tool name we serve; the MCP conformance suite checks 64.
pub const MAX_TOOL_NAME: usize = 64;

/// A validated tool name: `[A-Za-z0-9_.-]{1,64}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ToolName(String);

impl ToolName {
    /// Parses a tool name, saying what is wrong with it when it is not one.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("tool name is empty".into());
        }
        if s.len() > MAX_TOOL_NAME {
            return Err(format!(
                "tool name `{s}` is {} characters long; the limit is {MAX_TOOL_NAME}",
                s.len()
            ));
        }
        if let Some(c) = s.chars().find(|c| !is_name_char(*c)) {
            return Err(format!(
                "tool name `{s}` contains `{c}`; only letters, digits, `_`, `.` and `-` are allowed"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The group part: what comes before the first `__`. No group name contains `__` (the
    /// loader, the upstream API and the upstream supervisor all refuse one), so this is the
    /// group the tool was loaded from.
    pub fn group(&self) -> &str {
        self.0.split_once(SEPARATOR).map_or(&self.0, |(g, _)| g)
    }

    /// The operation part: what comes after the first `__` (the upstream's own tool name for
    /// an upstream tool).
    pub fn operation(&self) -> &str {
        self.0.split_once(SEPARATOR).map_or("", |(_, o)| o)
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub use crate::names::is_name_char;

/// Where a tool comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ToolSource {
    /// A script in a folder under `tools/` (the name shared by the group's tools).
    Script { folder: Arc<str> },
    /// A tool of an upstream MCP server.
    Upstream { upstream: String },
}

impl ToolSource {
    pub fn label(&self) -> &'static str {
        match self {
            ToolSource::Script { .. } => "script",
            ToolSource::Upstream { .. } => "upstream",
        }
    }
}

/// How the REST projection reaches an operation.
#[derive(Debug, Clone)]
pub struct HttpBinding {
    pub method: http::Method,
    /// The operation's path inside its group, as written in `openapi.json` (`/notes/{name}`).
    pub path: String,
    pub path_params: Vec<String>,
    pub query_params: Vec<String>,
    /// Property names that come from the JSON request body.
    pub body_params: Vec<String>,
    /// The operation object as compact JSON text, for the merged OpenAPI document. Kept as
    /// text, not as a parsed `Value`: parsed (every object an ordered map) it was the largest
    /// part of a tool's memory, and only a request for `/openapi.json` reads it. Shared by the
    /// operations of one load whose texts are the same ([`Shared`]).
    pub operation: Arc<str>,
}

impl HttpBinding {
    /// The text kept for an operation object.
    pub fn operation_text(op: &Value) -> Arc<str> {
        op.to_string().into()
    }

    /// The text kept for a script's operation object, without what the tool holds anyway: the
    /// summary when it is the tool's `title`, the description when it is the tool's
    /// `description` (and not its summary), and the `operationId`, which the OpenAPI document
    /// replaces. [`Tool::openapi_operation`] puts the first two back. In a large pool these
    /// were a third of every operation's text. The operation's `x-toolgate-*` keys stay, for an
    /// admin reviewing a held definition; the OpenAPI document drops them.
    pub fn script_operation_text(
        op: &Value,
        title: Option<&str>,
        description: Option<&str>,
    ) -> Arc<str> {
        let Value::Object(o) = op else {
            return Self::operation_text(op);
        };
        let mut o = o.clone();
        o.retain(|k, _| k != "operationId");
        let summary = o.get("summary").and_then(Value::as_str);
        let told = o.get("description").and_then(Value::as_str);
        let drop_summary = summary.is_some() && summary == title;
        let drop_description = told.is_some() && told == description && told != title;
        if drop_summary {
            o.shift_remove("summary");
        }
        if drop_description {
            o.shift_remove("description");
        }
        Self::operation_text(&Value::Object(o))
    }

    /// The operation object, parsed from its text.
    pub fn operation(&self) -> Value {
        // The text was written by `operation_text` from a `Value`, so it parses.
        serde_json::from_str(&self.operation).unwrap_or(Value::Null)
    }
}

/// A tool's content hash (SHA-256 of its definition and files): 32 bytes inline, not 64 hex
/// characters on the heap in every tool of the pool. It is written, compared and stored as
/// lowercase hex, as before.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentHash([u8; 32]);

impl ContentHash {
    pub fn from_digest(digest: impl Into<[u8; 32]>) -> Self {
        Self(digest.into())
    }

    /// The lowercase hex form, as stored in the database and shown in the API.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Whether `hex` is this hash's hex form (case-sensitive, as the stored form is lowercase),
    /// without allocating.
    pub fn matches(&self, hex: &str) -> bool {
        let mut buf = [0u8; 64];
        hex::encode_to_slice(self.0, &mut buf).is_ok() && buf == hex.as_bytes()
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({self})")
    }
}

impl Serialize for ContentHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl PartialEq<String> for ContentHash {
    fn eq(&self, other: &String) -> bool {
        self.matches(other)
    }
}

impl PartialEq<ContentHash> for String {
    fn eq(&self, other: &ContentHash) -> bool {
        other.matches(self)
    }
}

/// A credential a group's scripts need, in their environment under `name`, valued per `per`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSlot {
    pub name: env::ScriptVar,
    pub per: crate::credentials::Per,
}

/// What the tools of one script folder share: one allocation for the whole group, not a copy
/// in each of its tools (a pool of 100,000 tools held ~130 bytes of these per tool).
#[derive(Debug)]
pub struct ScriptGroup {
    /// The group's name.
    pub name: Box<str>,
    /// The group's folder: the scripts' working directory.
    pub workdir: PathBuf,
    /// The variables the group declares (`x-toolgate-env`), besides the fixed ones.
    pub env: Box<[env::ScriptVar]>,
    /// The credentials its scripts need (`x-toolgate-credentials`), each filled per caller.
    pub credentials: Box<[CredentialSlot]>,
    /// Where the declared variables get their values: never the gateway's own environment.
    pub script_env: Arc<dyn env::ScriptEnv>,
    /// Every top-level `x-toolgate-*` setting of the group's document, as canonical JSON text:
    /// shown to an admin reviewing a held definition.
    pub settings: Box<str>,
    /// How the group's scripts are confined.
    pub sandbox: sandbox::Sandbox,
    /// How many calls of each of the group's tools run at once ([`slots`]).
    pub max_concurrency: usize,
    /// The gateway's copy of the group's scripts as hashed, which calls run; `None` when the
    /// group was not pinned at its load, or the pool was loaded without a copy store (commands
    /// that run no script): calls then run the folder's files.
    pub copies: Option<Arc<copies::GroupCopy>>,
    /// Whether the pool was loaded with a copy store: a group of it that is pinned now and has
    /// no copy waits for its next load to be served ([`ScriptSpec::awaits_copy`]).
    pub copy_store: bool,
    /// The identity of the group's `openapi.json` when it was read.
    pub spec_stamp: FileStamp,
    /// The document's `info.summary`: what the group is for, in a line (covered by the hash,
    /// as part of `settings`).
    pub summary: Option<Box<str>>,
}

/// The identity of a file the hash covers, when it was read ([`loader`]'s `stamp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStamp {
    pub stamp: u64,
    /// SHA-256 of its bytes.
    pub digest: [u8; 32],
}

/// The identities of a script tool's own files at its load (the group's `openapi.json` is the
/// group's, [`ScriptGroup::spec_stamp`]): a later load that finds other files with the same
/// content records that they were changed and restored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStamps {
    pub script: u64,
    /// The App file's; 0 when the tool has none.
    pub ui: u64,
}

/// A tool whose files changed on disk since the previous load and came back to the content
/// the tool has now (so its hash is the same): which files.
#[derive(Debug, Clone)]
pub struct Restored {
    pub tool: Arc<Tool>,
    pub files: Vec<String>,
}

/// What running a script needs.
#[derive(Debug, Clone)]
pub struct ScriptSpec {
    pub group: Arc<ScriptGroup>,
    /// The script's file name in the group's folder (the loader only takes UTF-8 names).
    pub file: Box<str>,
    pub timeout: Duration,
    /// Its files' identities when it was loaded.
    pub stamps: FileStamps,
}

impl ScriptSpec {
    /// The script's path in its folder (what names it, for the per-script call slots).
    pub fn script(&self) -> PathBuf {
        self.group.workdir.join(&*self.file)
    }

    /// What a call executes: the gateway's copy of the bytes that were hashed, or the
    /// folder's file when the pool was loaded without copies.
    pub fn program(&self) -> PathBuf {
        match &self.group.copies {
            Some(copy) => copy.script(&self.file),
            None => self.script(),
        }
    }

    /// The group's folder, where the script runs.
    pub fn workdir(&self) -> &Path {
        &self.group.workdir
    }

    /// Loaded while its group was not pinned, so it would run the folder's file, which the
    /// hash does not bind: a pinned group's tool in this state is held until the next load
    /// copies it.
    pub fn awaits_copy(&self) -> bool {
        self.group.copy_store && self.group.copies.is_none()
    }
}

/// How a call is executed.
#[derive(Debug, Clone)]
pub enum Execution {
    Script(ScriptSpec),
    /// Forwarded to an upstream MCP server under the tool's original name.
    Upstream {
        upstream: String,
        tool: String,
    },
}

/// One tool of the pool (or, narrowed by an agent's argument rules, that agent's copy of it).
#[derive(Debug, Clone)]
pub struct Tool {
    /// `<group>__<operation>`: the group and operation are read off it ([`Self::group`]), not
    /// kept twice (two strings a tool, in a pool of 100,000).
    pub name: ToolName,
    pub title: Option<String>,
    pub description: Option<String>,
    pub input_schema: InputSchema,
    pub content_hash: ContentHash,
    pub source: ToolSource,
    pub http: Option<HttpBinding>,
    pub exec: Execution,
    /// The tool's own input schema, compiled on first use (a narrowed copy shares it).
    pub validator: InputValidator,
    /// Relative path of an MCP App UI file in the tool's folder.
    pub ui: Option<String>,
    /// What the audit log keeps of this tool's calls.
    pub audit: Arc<crate::audit::AuditPolicy>,
    /// Passed through untouched from upstream tools.
    /// Boxed, as `meta`: most tools have none, and inline they cost 104 bytes a tool.
    pub annotations: Option<Box<rmcp::model::ToolAnnotations>>,
    /// `_meta`, passed through untouched (for MCP Apps: `_meta.ui`).
    pub meta: Option<Box<rmcp::model::MetaObject>>,
    /// The argument rules of the agent whose copy this is; `None` in the pool itself.
    pub narrowing: Option<Arc<Narrowing>>,
    /// This tool's `tools/list` entry, serialized on first list.
    pub listed: ListedJson,
}

/// A tool's `tools/list` entry as JSON text, written the first time the tool is listed and
/// then copied into every list that shows it: a list costs what its agent sees, in bytes
/// copied, not a serialization per request. Only tools that are listed pay for it, and all of
/// them together at most [`LISTED_JSON_BUDGET`] bytes: past it, an entry is written for each
/// list (from the kept schema text, without parsing it), so that lists across every agent of
/// a large pool do not grow the gateway by a copy of every definition. A clone starts empty,
/// because a clone is how an agent's narrowed copy is made, and its definition differs from
/// the pool's.
#[derive(Debug, Default)]
pub struct ListedJson(std::sync::OnceLock<Box<str>>);

/// The bytes that all tools' kept `tools/list` entries may hold together. 16 MB keeps the
/// entries of some 50,000 typical tools: every tool of most pools, the most listed ones of
/// the largest.
pub const LISTED_JSON_BUDGET: usize = 16 << 20;

/// The bytes kept by every [`ListedJson`] alive.
static LISTED_JSON_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl ListedJson {
    /// The kept entry, or `write`'s text, kept when the budget allows.
    fn get_or_write(&self, write: impl FnOnce() -> String) -> Cow<'_, str> {
        use std::sync::atomic::Ordering;
        if let Some(kept) = self.0.get() {
            return Cow::Borrowed(kept);
        }
        let text = write();
        let reserved = LISTED_JSON_BYTES
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + text.len() <= LISTED_JSON_BUDGET).then_some(used + text.len())
            })
            .is_ok();
        if !reserved {
            return Cow::Owned(text);
        }
        let len = text.len();
        if self.0.set(text.into_boxed_str()).is_err() {
            // Another list kept it first: give back what was reserved for this copy.
            LISTED_JSON_BYTES.fetch_sub(len, Ordering::Relaxed);
        }
        match self.0.get() {
            Some(kept) => Cow::Borrowed(kept),
            None => unreachable!("the cell was set above"),
        }
    }

    /// The bytes all kept entries hold now.
    pub fn kept_bytes() -> usize {
        LISTED_JSON_BYTES.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for ListedJson {
    fn drop(&mut self) {
        if let Some(kept) = self.0.get() {
            LISTED_JSON_BYTES.fetch_sub(kept.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Clone for ListedJson {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// The argument rules that apply to one agent's calls of one tool, compiled.
#[derive(Debug)]
pub struct Narrowing {
    pub checks: Vec<ArgumentCheck>,
}

/// One parameter's rule.
#[derive(Debug)]
pub struct ArgumentCheck {
    pub param: String,
    /// The tool or group the rule is keyed by.
    pub source: String,
    /// The rule as written, to name it when it refuses a call.
    pub rule: Value,
    pub validator: Arc<jsonschema::Validator>,
}

impl Narrowing {
    /// Checks an argument object against every rule: the rules that refuse it, each with the
    /// lines that say why (naming the parameter and the rule).
    pub fn refusals(&self, args: &Value) -> Vec<(&ArgumentCheck, Vec<String>)> {
        let mut out = Vec::new();
        for c in &self.checks {
            let rule = c.rule.to_string();
            let lines: Vec<String> = match args.get(&c.param) {
                None => vec![format!(
                    "`{}` is required: this agent's grant limits it to {rule} (rule on `{}`)",
                    c.param, c.source
                )],
                Some(v) => c
                    .validator
                    .iter_errors(v)
                    .map(|e| {
                        format!(
                            "`{}`: {e}; refused by this agent's rule {rule} on `{}`",
                            c.param, c.source
                        )
                    })
                    .collect(),
            };
            if !lines.is_empty() {
                out.push((c, lines));
            }
        }
        out
    }

    /// [`Self::refusals`] as lines.
    pub fn violations(&self, args: &Value) -> Vec<String> {
        self.refusals(args)
            .into_iter()
            .flat_map(|(_, l)| l)
            .collect()
    }
}

impl Tool {
    /// The group this tool belongs to.
    pub fn group(&self) -> &str {
        self.name.group()
    }

    /// The operation's name inside its group (an upstream tool's own name).
    pub fn operation(&self) -> &str {
        self.name.operation()
    }

    /// The MCP `Tool` definition, as `tools/list` shows it. The input schema is parsed for it
    /// and not kept (unless a call keeps it already): what lists read is [`Self::mcp_json`].
    pub fn mcp_definition(&self) -> rmcp::model::Tool {
        self.mcp_definition_with(self.input_schema.read())
    }

    /// [`Self::mcp_definition`] with `schema` as its input schema.
    pub(crate) fn mcp_definition_with(&self, schema: Arc<Map<String, Value>>) -> rmcp::model::Tool {
        let mut tool = rmcp::model::Tool::new(
            self.name.as_str().to_owned(),
            self.description.clone().unwrap_or_default(),
            schema,
        );
        if self.description.is_none() {
            tool.description = None;
        }
        tool.title = self.title.clone();
        tool.annotations = self.annotations.as_deref().cloned();
        tool.meta = self.meta.as_deref().cloned();
        tool
    }

    /// [`Self::mcp_definition`] serialized as the SDK serializes it inside a `tools/list`
    /// result (the definition carries no `outputSchema`, the one field the SDK rewrites for
    /// older protocol revisions, so one text serves both eras), kept within the budget of
    /// [`ListedJson`].
    pub fn mcp_json(&self) -> Cow<'_, str> {
        self.listed.get_or_write(|| self.write_mcp_json())
    }

    /// [`Self::mcp_json`] written field by field, in the order and with the omissions of the
    /// SDK's `Tool` (name, title, description, inputSchema, annotations, `_meta`), the schema
    /// copied as its kept text: the schema is never parsed for a list.
    #[allow(
        clippy::expect_used,
        reason = "strings and the SDK's annotation and meta types always serialize"
    )]
    fn write_mcp_json(&self) -> String {
        let schema = self.input_schema.text();
        let mut out = Vec::with_capacity(
            64 + self.name.as_str().len()
                + self.title.as_ref().map_or(0, String::len)
                + self.description.as_ref().map_or(0, String::len)
                + schema.len(),
        );
        // The keys are the SDK's, plain ASCII: written as they are.
        fn key(out: &mut Vec<u8>, key: &str) {
            out.push(if out.is_empty() { b'{' } else { b',' });
            out.push(b'"');
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
        }
        fn field<T: Serialize + ?Sized>(out: &mut Vec<u8>, name: &str, value: &T) {
            key(out, name);
            serde_json::to_writer(out, value).expect("strings and the SDK's types serialize");
        }
        field(&mut out, "name", self.name.as_str());
        if let Some(t) = &self.title {
            field(&mut out, "title", t);
        }
        if let Some(d) = &self.description {
            field(&mut out, "description", d);
        }
        // The schema is JSON text already: copied as it is.
        key(&mut out, "inputSchema");
        out.extend_from_slice(schema.as_bytes());
        if let Some(a) = &self.annotations {
            field(&mut out, "annotations", a);
        }
        if let Some(m) = &self.meta {
            field(&mut out, "_meta", m);
        }
        out.push(b'}');
        String::from_utf8(out).expect("JSON written from strings is UTF-8")
    }

    /// The tool's OpenAPI operation object, with the summary and description that
    /// [`HttpBinding::script_operation_text`] left out put back (and the tool's name as its
    /// `operationId`, its group as its tag), without the gateway's `x-toolgate-*` keys. `None`
    /// for a tool with no REST binding.
    pub fn openapi_operation(&self) -> Option<Value> {
        let mut op = self.operation_with_settings()?;
        if let Value::Object(o) = &mut op {
            o.retain(|k, _| !k.starts_with("x-toolgate-"));
        }
        Some(op)
    }

    /// [`Self::openapi_operation`] with the operation's own `x-toolgate-*` keys, as an admin
    /// reviews it.
    pub(crate) fn operation_with_settings(&self) -> Option<Value> {
        let mut op = self.http.as_ref()?.operation();
        if let Value::Object(o) = &mut op {
            if let Some(title) = &self.title
                && !o.contains_key("summary")
            {
                o.insert("summary".into(), Value::String(title.clone()));
            }
            if let Some(d) = &self.description
                && !o.contains_key("description")
                && Some(d) != self.title.as_ref()
            {
                o.insert("description".into(), Value::String(d.clone()));
            }
            o.insert(
                "operationId".into(),
                Value::String(self.name.as_str().into()),
            );
            o.insert(
                "tags".into(),
                Value::Array(vec![Value::String(self.group().to_owned())]),
            );
        }
        Some(op)
    }

    /// The `ui://` resource of this tool's MCP App, if it has one.
    pub fn ui_resource(&self) -> Option<String> {
        self.meta
            .as_ref()
            .and_then(|m| m.get("ui"))
            .and_then(|ui| ui.get("resourceUri"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    }

    /// Checks arguments against the input schema; each violation is one line.
    pub fn violations(&self, args: &Value) -> Vec<String> {
        let validator = match self.validator.compiled() {
            Ok(v) => v,
            Err(e) => return vec![format!("the tool's input schema cannot be used: {e}")],
        };
        validator
            .iter_errors(args)
            .map(|e| {
                let at = e.instance_path.to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("at `{at}`: {e}")
                }
            })
            .collect()
    }
}

/// A tool's input schema, kept as compact JSON text and parsed on first use.
///
/// Parsed, a schema is a tree of ordered maps, about ten times its text; most tools of a large
/// pool are never listed or called on a given instance, so they keep only the text. What reads
/// the schema of every tool (the search index, the catalog table) uses [`Self::read`], which
/// does not keep what it parses. Clones share one allocation.
#[derive(Clone)]
pub struct InputSchema(Arc<SchemaText>);

struct SchemaText {
    text: Box<str>,
    parsed: std::sync::OnceLock<Arc<Map<String, Value>>>,
    /// The validator of this schema, compiled on first use ([`InputValidator`]); here rather
    /// than in an allocation of its own per tool. Boxed: a compiled validator is ~170 bytes
    /// inline, and most tools of a large pool are never called.
    compiled: std::sync::OnceLock<Box<Result<jsonschema::Validator, String>>>,
}

impl InputSchema {
    /// The schema of a tool that may never be used: only its text is kept.
    pub fn new(schema: &Map<String, Value>) -> Self {
        Self::from_text(serde_json::to_string(schema).unwrap_or_default())
    }

    /// The schema whose compact JSON text (as `serde_json` writes a `Map`) is `text`.
    fn from_text(text: String) -> Self {
        Self(Arc::new(SchemaText {
            text: text.into_boxed_str(),
            parsed: std::sync::OnceLock::new(),
            compiled: std::sync::OnceLock::new(),
        }))
    }

    /// The schema, parsed and kept from now on.
    pub fn parsed(&self) -> &Arc<Map<String, Value>> {
        self.0.parsed.get_or_init(|| Arc::new(self.parse()))
    }

    /// The schema, parsed if it is not kept already, without keeping it: for passes over the
    /// whole pool.
    pub fn read(&self) -> Arc<Map<String, Value>> {
        match self.0.parsed.get() {
            Some(m) => m.clone(),
            None => Arc::new(self.parse()),
        }
    }

    /// Whether `other` is this very schema (one allocation), not only an equal one.
    pub fn is_shared_with(&self, other: &InputSchema) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The compact JSON text.
    pub fn text(&self) -> &str {
        &self.0.text
    }

    fn parse(&self) -> Map<String, Value> {
        // The text was written from a `Map`, so it parses back to one.
        serde_json::from_str(&self.0.text).unwrap_or_default()
    }
}

impl From<Arc<Map<String, Value>>> for InputSchema {
    /// A schema already parsed (an upstream's, a narrowed copy's): it is kept as it is.
    fn from(schema: Arc<Map<String, Value>>) -> Self {
        let kept = Self::new(&schema);
        let _ = kept.0.parsed.set(schema);
        kept
    }
}

impl From<Map<String, Value>> for InputSchema {
    fn from(schema: Map<String, Value>) -> Self {
        Arc::new(schema).into()
    }
}

impl std::ops::Deref for InputSchema {
    type Target = Map<String, Value>;

    /// The parsed schema, kept from now on (see [`Self::parsed`]).
    fn deref(&self) -> &Self::Target {
        self.parsed()
    }
}

impl fmt::Debug for InputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// A tool's input-schema validator, compiled on the tool's first call.
///
/// A compiled validator costs kilobytes, and most tools of a large pool are never called on a
/// given instance: keeping one per tool made memory grow with the pool. The schema is compiled
/// once when the tool is loaded, so that a schema that does not compile is the loader's error,
/// and the result is dropped; the call path compiles it again, once, from the same schema.
///
/// The compiled validator is kept with the schema's text, so a validator is a handle on it: a
/// narrowed copy of a tool clones the handle and shares the pool tool's validator. The cell is
/// the schema's, so each `InputSchema` gets one validator ([`Self::check`] on a schema made for
/// it, as the loader and the upstream supervisor do): a second handle with another draft would
/// share the first one's compiled result.
#[derive(Debug, Clone)]
pub struct InputValidator {
    schema: InputSchema,
    draft: Option<jsonschema::Draft>,
}

impl InputValidator {
    fn build(
        schema: &Map<String, Value>,
        draft: Option<jsonschema::Draft>,
    ) -> Result<jsonschema::Validator, String> {
        let mut options = jsonschema::options();
        if let Some(d) = draft {
            options = options.with_draft(d);
        }
        options
            .build(&Value::Object(schema.clone()))
            .map_err(|e| e.to_string())
    }

    /// Checks that `schema` (`parsed` is the same, already parsed) compiles under `draft`, or
    /// the one it declares, keeping only the schema.
    pub fn check(
        schema: InputSchema,
        parsed: &Map<String, Value>,
        draft: Option<jsonschema::Draft>,
    ) -> Result<Self, String> {
        Self::build(parsed, draft)?;
        Ok(Self { schema, draft })
    }

    /// The validator of a schema [`Self::check`] already passed under `draft`.
    fn checked(schema: InputSchema, draft: Option<jsonschema::Draft>) -> Self {
        Self { schema, draft }
    }

    /// The compiled validator, built on first use.
    pub fn compiled(&self) -> Result<&jsonschema::Validator, &str> {
        self.schema
            .0
            .compiled
            .get_or_init(|| Box::new(Self::build(&self.schema.read(), self.draft)))
            .as_ref()
            .as_ref()
            .map_err(String::as_str)
    }
}

/// What the tools of one load share when their texts are the same: one input schema (with its
/// parsed form and compiled validator, made once for all of them) and one OpenAPI operation
/// text. Generated and hand-written pools repeat both (`{"type":"object","properties":{}}`,
/// the same body and responses across a group's operations), and each copy cost a tool its
/// text, an allocation and, for a schema, a compilation at load. Scoped to one load: nothing
/// is kept once the catalog is built, so a pool whose texts are all different pays only
/// the sets, for the load's duration.
#[derive(Default)]
pub struct Shared {
    /// Schemas checked under [`Self::DRAFT`], by text.
    schemas: std::sync::Mutex<std::collections::HashSet<SchemaByText>>,
    operations: std::sync::Mutex<std::collections::HashSet<Arc<str>>>,
}

/// An input schema, compared and hashed by its text.
struct SchemaByText(InputSchema);

impl PartialEq for SchemaByText {
    fn eq(&self, other: &Self) -> bool {
        self.0.text() == other.0.text()
    }
}

impl Eq for SchemaByText {}

impl std::hash::Hash for SchemaByText {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.text().hash(state);
    }
}

impl std::borrow::Borrow<str> for SchemaByText {
    fn borrow(&self) -> &str {
        self.0.text()
    }
}

impl Shared {
    /// The draft every schema shared here was checked under: script tools' (OpenAPI 3.1's).
    pub const DRAFT: jsonschema::Draft = jsonschema::Draft::Draft202012;

    /// The input schema and validator for `schema`: the ones an earlier tool of this load
    /// made for the same text, or new ones, checked to compile under [`Self::DRAFT`].
    pub fn schema(
        &self,
        schema: &Map<String, Value>,
    ) -> Result<(InputSchema, InputValidator), String> {
        use std::sync::PoisonError;
        let text = serde_json::to_string(schema).unwrap_or_default();
        let known = self
            .schemas
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(text.as_str())
            .map(|s| s.0.clone());
        if let Some(kept) = known {
            return Ok((
                kept.clone(),
                InputValidator::checked(kept, Some(Self::DRAFT)),
            ));
        }
        let kept = InputSchema::from_text(text);
        let validator = InputValidator::check(kept.clone(), schema, Some(Self::DRAFT))?;
        // Two threads may have made the same one: either is right, and the first stays.
        self.schemas
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(SchemaByText(kept.clone()));
        Ok((kept, validator))
    }

    /// `text`, or the same text an earlier tool of this load kept.
    pub fn operation(&self, text: Arc<str>) -> Arc<str> {
        let mut known = self
            .operations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(same) = known.get(&*text) {
            return same.clone();
        }
        known.insert(text.clone());
        text
    }
}

/// Why a tool group could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadError {
    /// The folder under `tools/`.
    pub folder: String,
    /// The file at fault, relative to the tools directory.
    pub file: String,
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.reason)
    }
}

/// The state of one tool group in the pool.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    pub name: String,
    pub folder: String,
    pub source: &'static str,
    pub tools: usize,
    /// What the group is for, in a line, as written: its `openapi.json`'s `info.summary`, or
    /// an upstream's `description`. The index heads the group's tools with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The last load failed; `tools` is what is still served from the last good load.
    pub error: Option<LoadError>,
}

/// Groups' one-line summaries as written (hostile text: the index makes them safe), by
/// group name.
pub type GroupSummaries = BTreeMap<String, String>;

/// An immutable snapshot of the pool.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Ordered by name, one tool per name: found by binary search. A map keyed by name kept a
    /// second copy of every name, and its nodes, for nothing a sorted list does not do.
    tools: Vec<Arc<Tool>>,
    groups: BTreeMap<String, GroupStatus>,
    /// Each group's `summary`, by group name (not folder): what the index heads it with.
    summaries: GroupSummaries,
    /// Tools whose files were changed and restored since the previous load.
    restored: Vec<Restored>,
}

impl Catalog {
    /// A catalog of `tools`; of two tools with one name, the last is kept.
    pub fn new(tools: Vec<Arc<Tool>>, groups: Vec<GroupStatus>) -> Self {
        let mut tools = tools;
        // Stable, so that of equal names the last given stays last, and is the one kept.
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools.reverse();
        tools.dedup_by(|a, b| a.name == b.name);
        tools.reverse();
        tools.shrink_to_fit();
        let summaries = groups
            .iter()
            .filter_map(|g| Some((g.name.clone(), g.summary.clone()?)))
            .collect();
        Self {
            tools,
            groups: groups.into_iter().map(|g| (g.folder.clone(), g)).collect(),
            summaries,
            restored: Vec::new(),
        }
    }

    /// This catalog, noting the tools whose files were changed and restored since the previous
    /// load.
    pub fn with_restored(mut self, restored: Vec<Restored>) -> Self {
        self.restored = restored;
        self
    }

    /// The tools whose files were changed on disk and restored since the previous load.
    pub fn restored(&self) -> &[Restored] {
        &self.restored
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.tools.binary_search_by(|t| t.name.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tool>> {
        self.position(name).ok().map(|i| &self.tools[i])
    }

    /// Every tool, ordered by name.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.tools.iter()
    }

    /// The tools whose names start with `prefix`, in name order: a range of the name-ordered
    /// map, so that a group's tools are found without looking at the rest of the pool.
    pub fn with_prefix<'a, 'p>(
        &'a self,
        prefix: &'p str,
    ) -> impl Iterator<Item = &'a Arc<Tool>> + use<'a, 'p> {
        let first = self.position(prefix).unwrap_or_else(|i| i);
        self.tools[first..]
            .iter()
            .take_while(move |t| t.name.as_str().starts_with(prefix))
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// This catalog with `summaries` as its groups' (a catalog made of bare definitions has
    /// no group documents to read them from).
    pub fn with_summaries(mut self, summaries: GroupSummaries) -> Self {
        self.summaries = summaries;
        self
    }

    /// What each group is for, in a line as written, by group name.
    pub fn group_summaries(&self) -> &GroupSummaries {
        &self.summaries
    }

    /// Group statuses, ordered by folder.
    pub fn groups(&self) -> impl Iterator<Item = &GroupStatus> {
        self.groups.values()
    }

    /// The names of the groups that serve tools, for suggestions and grant checks.
    pub fn group_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tools.iter().map(|t| t.group().to_owned()).collect();
        names.dedup();
        names.sort();
        names.dedup();
        names
    }

    /// This catalog plus upstream groups; an upstream whose group name is already served by a
    /// script folder is reported, and its tools are left out.
    pub fn with_upstreams(self, (tools, groups): (Vec<Arc<Tool>>, Vec<GroupStatus>)) -> Self {
        let mut out = self;
        let script_groups = out.group_names();
        for mut g in groups {
            if script_groups.contains(&g.name) {
                g.error = Some(LoadError {
                    folder: g.folder.clone(),
                    file: format!("upstreams/{}", g.name),
                    reason: format!(
                        "group name `{}` is already served by a script folder",
                        g.name
                    ),
                });
                g.tools = 0;
            }
            out.groups.insert(g.folder.clone(), g);
        }
        let mut added: Vec<Arc<Tool>> = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for t in tools {
            if script_groups.iter().any(|g| g == t.group())
                || out.get(t.name.as_str()).is_some()
                || !names.insert(t.name.clone())
            {
                continue;
            }
            added.push(t);
        }
        if !added.is_empty() {
            out.tools.extend(added);
            out.tools.sort_by(|a, b| a.name.cmp(&b.name));
        }
        out
    }

    pub fn load_errors(&self) -> Vec<LoadError> {
        self.groups
            .values()
            .filter_map(|g| g.error.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_names_group_and_operation_are_split_at_the_first_separator() {
        let n = ToolName::parse("github__create_issue").unwrap();
        assert_eq!((n.group(), n.operation()), ("github", "create_issue"));
        // An upstream's own tool name may itself hold `__`; a group name never does.
        let n = ToolName::parse("up__a__b").unwrap();
        assert_eq!((n.group(), n.operation()), ("up", "a__b"));
        let n = ToolName::parse("plain").unwrap();
        assert_eq!((n.group(), n.operation()), ("plain", ""));
    }

    /// The entry a list copies is written without the SDK's types; it must be what the SDK
    /// would write, byte for byte, whatever the definition holds: hostile text in every
    /// string, optional fields present and absent, annotations and `_meta`.
    #[test]
    fn a_written_list_entry_is_the_sdks_serialization_byte_for_byte() {
        let defs = serde_json::json!([
            {"name": "g__plain", "inputSchema": {"type": "object"}},
            {"name": "g__full", "title": "T \"quoted\" </script>\u{7}",
             "description": "line\nbreak \\ back\tslash \u{0} é 🦀 \u{2028}",
             "inputSchema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"enum": [1, "x\"y"]}},
                             "required": ["z"]},
             "annotations": {"title": "A", "readOnlyHint": true, "destructiveHint": false},
             "_meta": {"ui": {"resourceUri": "ui://g/app.html"}, "k": [null, 1.5]}},
            {"name": "g__described", "description": "", "inputSchema": {"type": "object", "properties": {}}},
        ]);
        let catalog = crate::search::catalog_from_definitions(&defs).unwrap();
        for tool in catalog.tools() {
            let sdk = serde_json::to_string(&tool.mcp_definition()).unwrap();
            assert_eq!(tool.write_mcp_json(), sdk, "{}", tool.name.as_str());
            assert_eq!(tool.mcp_json(), sdk, "{}", tool.name.as_str());
        }
    }

    /// Entries are kept only within the budget: past it a list still gets each entry, written
    /// anew, and the bytes kept are given back when their tools go.
    #[test]
    fn list_entries_are_kept_within_their_budget_and_given_back() {
        let description = "d".repeat(4096);
        let count = LISTED_JSON_BUDGET / description.len() + 100;
        let defs: Vec<Value> = (0..count)
            .map(|i| {
                serde_json::json!({"name": format!("g__op{i}"), "description": description,
                    "inputSchema": {"type": "object"}})
            })
            .collect();
        let catalog = crate::search::catalog_from_definitions(&Value::Array(defs)).unwrap();
        let before = ListedJson::kept_bytes();
        let mut borrowed = 0;
        for tool in catalog.tools() {
            let entry = tool.mcp_json();
            assert!(entry.contains(&description));
            borrowed += usize::from(matches!(entry, Cow::Borrowed(_)));
        }
        let kept = ListedJson::kept_bytes();
        assert!(kept <= LISTED_JSON_BUDGET, "{kept} bytes kept");
        assert!(
            borrowed > 0 && borrowed < count,
            "{borrowed} of {count} kept"
        );
        // A tool listed again is copied from what it kept, or written again: the same text.
        for tool in catalog.tools() {
            assert_eq!(tool.mcp_json(), tool.write_mcp_json());
        }
        assert_eq!(ListedJson::kept_bytes(), kept);
        drop(catalog);
        assert_eq!(ListedJson::kept_bytes(), before);
    }
}
