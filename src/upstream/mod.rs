//! Upstream MCP servers as tool groups: spawned (stdio) or reached (Streamable HTTP) through
//! the official SDK's client, supervised, and served under the same grants, limits and audit
//! as script tools. An agent cannot tell a proxied tool from a script.
//!
//! One connection (one child process) per upstream for its catalog and for callers it needs no
//! credential of; an upstream that declares credential slots gets, per caller, a connection
//! carrying that caller's stored values and no one else's (see [`principal`]). The agent's
//! token never travels upstream: the upstream gets only credentials stored for it.

mod credentials;
mod guard;
mod principal;
mod stdio;
mod traced;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestParamsMeta};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pool::{
    ContentHash, Execution, GroupStatus, HttpBinding, LoadError, SEPARATOR, Tool, ToolName,
    ToolSource,
};
use crate::telemetry::TraceContext;

pub use credentials::on_record;

/// How an upstream is declared (`policies/upstreams/<group>.yaml`, or the admin API).
///
/// Flat on purpose, with unknown fields refused: a misspelt key in a YAML file is an error,
/// not a setting silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSpec {
    /// `stdio` (a command the gateway spawns) or `http` (Streamable HTTP).
    pub transport: TransportKind,
    /// stdio: the command and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// stdio: the child's environment; nothing else of the gateway's environment is passed
    /// but PATH, HOME, LANG and TZ.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// http: the MCP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http: static headers sent with every request (the upstream's own credentials).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// http: OAuth client credentials at the upstream's own authorization server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthSpec>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Per-call timeout (also bounds the connection handshake).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Calls in flight at once to this upstream.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
    /// Largest message accepted from this upstream (a call's answer, a tool list), in bytes:
    /// a larger answer fails its call at once, read without being kept.
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// How often the tool list is re-read.
    #[serde(default = "default_refresh")]
    pub refresh_secs: u64,
    /// An upstream's group is pinned unless this says `false` (`groups.yaml` `pin:` wins): a
    /// changed or new tool is held until an admin approves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<bool>,
    /// Credentials each call carries for its caller (`per: agent|person|shared`), injected as a
    /// header (`inject: header Authorization "Bearer {}"`, http) or an environment variable
    /// (`inject: env`, stdio). A call with such a slot goes through a connection (a child
    /// process) of its caller's own: see [`principal`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credentials: BTreeMap<String, SlotSpec>,
    /// Connections (stdio children) held at once for callers' credentials; the least recently
    /// used idle one is closed to make room.
    #[serde(
        default = "default_max_principals",
        skip_serializing_if = "is_default_max_principals"
    )]
    pub max_principal_connections: usize,
    /// A caller's connection unused this long is closed.
    #[serde(
        default = "default_principal_idle",
        skip_serializing_if = "is_default_principal_idle"
    )]
    pub principal_idle_secs: u64,
}

/// One credential slot of an upstream, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotSpec {
    pub per: crate::credentials::Per,
    /// `env`, or `header <Name> <template>` where the template holds `{}` for the value.
    pub inject: String,
    /// Filled by the person connecting to the upstream's authorization server (not typed in):
    /// the value injected is the access token of their grant, refreshed ahead of expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<crate::credentials::oauth::SlotOAuth>,
    /// Filled by exchanging the caller's identity at a security token service (RFC 8693) for
    /// a token meant for the upstream, cached per caller until it is near its expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<crate::credentials::exchange::SlotExchange>,
}

/// Where a slot's value goes on the caller's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    Env,
    Header {
        name: http::HeaderName,
        template: String,
    },
}

impl Inject {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text == "env" {
            return Ok(Inject::Env);
        }
        let Some(rest) = text.strip_prefix("header ") else {
            return Err(format!(
                "`inject: {text}` is neither `env` nor `header <Name> <template>`"
            ));
        };
        let (name, template) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "{}"));
        let name = http::HeaderName::try_from(name)
            .map_err(|_| format!("`{name}` is not a header name"))?;
        if matches!(
            name.as_str(),
            "host"
                | "content-length"
                | "content-type"
                | "accept"
                | "mcp-session-id"
                | "mcp-protocol-version"
                | "traceparent"
                | "tracestate"
        ) {
            return Err(format!("header `{name}` is the transport's own"));
        }
        let template = template.trim();
        let template = template
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(template)
            .to_owned();
        if template.matches("{}").count() != 1 {
            return Err(format!(
                "the template `{template}` must hold `{{}}` once, where the value goes"
            ));
        }
        http::HeaderValue::try_from(template.replace("{}", "x"))
            .map_err(|_| format!("the template `{template}` is not a header value"))?;
        Ok(Inject::Header { name, template })
    }

    /// The header's value for `value`, or why it cannot be one.
    fn header_value(template: &str, value: &[u8]) -> Result<http::HeaderValue, String> {
        let value = std::str::from_utf8(value).map_err(|_| "it is not UTF-8".to_owned())?;
        http::HeaderValue::try_from(template.replace("{}", value))
            .map_err(|_| "it holds characters a header cannot carry".to_owned())
    }
}

/// An upstream's slot, parsed.
#[derive(Debug, Clone)]
pub struct UpstreamSlot {
    pub slot: crate::pool::CredentialSlot,
    pub inject: Inject,
    pub oauth: Option<Arc<crate::credentials::oauth::SlotOAuth>>,
    pub exchange: Option<Arc<crate::credentials::exchange::SlotExchange>>,
}

impl UpstreamSlot {
    /// Whether its values are typed in (by an admin or the person), rather than obtained by
    /// connecting or by exchange.
    pub fn typed(&self) -> bool {
        self.oauth.is_none() && self.exchange.is_none()
    }
}

/// Slots an upstream may declare.
const MAX_SLOTS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Stdio,
    Http,
}

impl UpstreamSpec {
    /// Checks that the fields fit the transport.
    pub fn validate(&self) -> Result<(), String> {
        match self.transport {
            TransportKind::Stdio => {
                if self.command.as_deref().is_none_or(str::is_empty) {
                    return Err("a stdio upstream needs `command`".into());
                }
                if self.url.is_some() || !self.headers.is_empty() || self.oauth.is_some() {
                    return Err("`url`, `headers` and `oauth` are for http upstreams".into());
                }
            }
            TransportKind::Http => {
                let url = self.url.as_deref().ok_or("an http upstream needs `url`")?;
                let parsed = url::Url::parse(url).map_err(|e| format!("`url` is invalid: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err("`url` must be http or https".into());
                }
                if self.command.is_some() || !self.args.is_empty() || !self.env.is_empty() {
                    return Err("`command`, `args` and `env` are for stdio upstreams".into());
                }
            }
        }
        let slots = self.slots()?;
        for s in &slots {
            match (&s.inject, self.transport) {
                (Inject::Env, TransportKind::Http) => {
                    return Err(format!(
                        "credential `{}`: an http upstream takes credentials as headers (`inject: header <Name> <template>`)",
                        s.slot.name
                    ));
                }
                (Inject::Header { .. }, TransportKind::Stdio) => {
                    return Err(format!(
                        "credential `{}`: a stdio upstream takes credentials in its environment (`inject: env`)",
                        s.slot.name
                    ));
                }
                (Inject::Env, TransportKind::Stdio)
                    if self.env.contains_key(s.slot.name.as_str()) =>
                {
                    return Err(format!(
                        "credential `{}` is also in `env`: a variable has one source",
                        s.slot.name
                    ));
                }
                _ => {}
            }
        }
        if self.oauth.is_some()
            && slots.iter().any(
                |s| matches!(&s.inject, Inject::Header { name, .. } if name == http::header::AUTHORIZATION),
            )
        {
            return Err(
                "`oauth` already fills `Authorization`: a credential cannot fill it too".into(),
            );
        }
        if self.max_principal_connections == 0 || self.principal_idle_secs == 0 {
            return Err(
                "`max_principal_connections` and `principal_idle_secs` must be at least 1".into(),
            );
        }
        if self.timeout_ms == 0 || self.max_concurrency == 0 || self.refresh_secs == 0 {
            return Err(
                "`timeout_ms`, `max_concurrency` and `refresh_secs` must be at least 1".into(),
            );
        }
        if !(MIN_RESULT_BYTES..=MAX_RESULT_BYTES).contains(&self.max_result_bytes) {
            return Err(format!(
                "`max_result_bytes` must be between {MIN_RESULT_BYTES} and {MAX_RESULT_BYTES}"
            ));
        }
        Ok(())
    }
}

impl UpstreamSpec {
    /// The credential slots, parsed: names as script variables are, one header once.
    pub fn slots(&self) -> Result<Vec<UpstreamSlot>, String> {
        if self.credentials.len() > MAX_SLOTS {
            return Err(format!("at most {MAX_SLOTS} credentials per upstream"));
        }
        let mut out: Vec<UpstreamSlot> = Vec::with_capacity(self.credentials.len());
        for (name, spec) in &self.credentials {
            let var =
                crate::pool::env::ScriptVar::parse(name).map_err(|e| format!("credential {e}"))?;
            let inject =
                Inject::parse(&spec.inject).map_err(|e| format!("credential `{name}`: {e}"))?;
            if let Inject::Header { name: h, .. } = &inject
                && out
                    .iter()
                    .any(|o| matches!(&o.inject, Inject::Header { name, .. } if name == h))
            {
                return Err(format!("credential `{name}`: header `{h}` is filled twice"));
            }
            if let Some(o) = &spec.oauth {
                o.validate()
                    .map_err(|e| format!("credential `{name}`: {e}"))?;
                if spec.per != crate::credentials::Per::Person
                    || !matches!(inject, Inject::Header { .. })
                {
                    return Err(format!(
                        "credential `{name}`: `oauth` is for `per: person` slots injected as a header (a person connects to the upstream's authorization server)"
                    ));
                }
            }
            if let Some(x) = &spec.exchange {
                x.validate()
                    .map_err(|e| format!("credential `{name}`: {e}"))?;
                if spec.oauth.is_some()
                    || spec.per == crate::credentials::Per::Shared
                    || !matches!(inject, Inject::Header { .. })
                {
                    return Err(format!(
                        "credential `{name}`: `exchange` is for `per: agent` or `per: person` slots injected as a header, without `oauth` (the token is obtained for each caller)"
                    ));
                }
            }
            out.push(UpstreamSlot {
                slot: crate::pool::CredentialSlot {
                    name: var,
                    per: spec.per,
                },
                inject,
                oauth: spec.oauth.clone().map(Arc::new),
                exchange: spec.exchange.clone().map(Arc::new),
            });
        }
        Ok(out)
    }
}

fn default_max_principals() -> usize {
    32
}
fn default_principal_idle() -> u64 {
    300
}
fn is_default_max_principals(n: &usize) -> bool {
    *n == default_max_principals()
}
fn is_default_principal_idle(n: &u64) -> bool {
    *n == default_principal_idle()
}
fn default_timeout_ms() -> u64 {
    30_000
}
fn default_concurrency() -> usize {
    8
}
fn default_refresh() -> u64 {
    60
}
/// As a script's stdout (`--max-stdout-bytes`).
fn default_max_result_bytes() -> usize {
    4 * 1024 * 1024
}
/// Bounds of `max_result_bytes`: an initialize answer must fit, and one answer is held in
/// memory (a few times over while it is parsed and re-encoded), so it stays well below
/// what a process can afford per call.
const MIN_RESULT_BYTES: usize = 16 * 1024;
const MAX_RESULT_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthSpec {
    pub token_url: String,
    pub client_id: String,
    /// Name of the environment variable holding the client secret (never the secret itself).
    pub client_secret_env: String,
    #[serde(default)]
    pub scope: Option<String>,
}

/// The gateway's client side towards one upstream: it declares no optional capability (so
/// no tasks, no sampling, no elicitation go upstream) and turns the upstream's
/// `notifications/tools/list_changed` into an immediate re-list.
#[derive(Clone)]
pub struct Listener {
    changed: Arc<tokio::sync::Notify>,
}

impl rmcp::ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _ctx: rmcp::service::NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }
}

/// Health, as the API and the UI show it.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub state: &'static str,
    pub tools: usize,
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    /// The circuit is open: calls fail at once until this many ms have passed.
    pub circuit_open_ms: Option<u64>,
    /// Connections open for callers' own credentials.
    pub caller_connections: usize,
}

/// Calls failing in a row before the circuit opens, and how long it stays open. The
/// upstream's circuit counts failures of the connection; a tool's own circuit counts its
/// timeouts and oversized answers, so that one tool that hangs (or an agent that keeps
/// calling it) does not shut the upstream's other tools for everyone.
const BREAKER_THRESHOLD: u32 = 3;
const BREAKER_OPEN: Duration = Duration::from_secs(10);

/// Shortest time between two re-lists of an upstream's tools: a flood of
/// `tools/list_changed` costs at most one list a second.
const MIN_RELIST: Duration = Duration::from_secs(1);

struct Shared {
    /// Fired when the upstream says its tool list changed.
    changed: Arc<tokio::sync::Notify>,
    group: String,
    spec: UpstreamSpec,
    client: tokio::sync::RwLock<Option<RunningService<RoleClient, Listener>>>,
    tools: Mutex<Vec<rmcp::model::Tool>>,
    status: Mutex<Status>,
    slots: tokio::sync::Semaphore,
    /// The upstream's own credentials, scrubbed from whatever it says (see [`credentials`]).
    credentials: Mutex<Vec<String>>,
    /// The credentials each call carries for its caller, and the callers' connections.
    credential_slots: Arc<[UpstreamSlot]>,
    principals: principal::Connections,
}

impl Shared {
    fn credentials(&self) -> Vec<String> {
        self.credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[derive(Default)]
struct Status {
    state: &'static str,
    last_error: Option<String>,
    failures: u32,
    open_until: Option<Instant>,
    /// Per tool that failed: its timeouts and oversized answers in a row, and until when its
    /// own circuit is open. Only tools the upstream listed are called, and a success removes
    /// the entry, so this holds at most one entry per listed tool.
    tools: HashMap<String, (u32, Option<Instant>)>,
}

/// How a call to the upstream went, for the circuits.
enum Verdict {
    /// The upstream answered (a result, or a JSON-RPC error of its own).
    Answered,
    /// This tool timed out or answered past the size limit.
    ToolFailed,
    /// The connection failed.
    ConnectionFailed,
    /// Nothing was sent: the call could not be recorded.
    NotSent,
}

/// A supervised upstream: its shared state and its supervisor task.
type Running = (Arc<Shared>, tokio::task::AbortHandle);

/// Every upstream this instance runs.
#[derive(Clone, Default)]
pub struct Upstreams {
    inner: Arc<Mutex<HashMap<String, Running>>>,
}

/// Why a proxied call failed before the upstream answered.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum UpstreamError {
    #[error("upstream `{0}` is not connected")]
    Down(String),
    #[error("upstream `{0}` is failing; its circuit is open, retry in a few seconds")]
    CircuitOpen(String),
    #[error(
        "tool `{1}` of upstream `{0}` timed out or answered too much three times in a row; it is not called for a few seconds"
    )]
    ToolCircuitOpen(String, String),
    #[error("upstream `{0}` did not answer within {1} ms")]
    Timeout(String, u64),
    #[error("upstream `{0}` failed: {1}")]
    Failed(String, String),
    #[error("the call could not be recorded, so it was not sent")]
    NotRecorded,
    #[error(
        "upstream `{0}` has {1} connections open, one per caller's credentials, all in use: retry shortly"
    )]
    Busy(String, usize),
}

impl Upstreams {
    /// Starts, restarts or stops supervisors so that exactly `specs` run; `on_change` is called
    /// whenever an upstream's tool list changes (to rebuild the catalog).
    pub fn reconcile(
        &self,
        specs: &BTreeMap<String, UpstreamSpec>,
        on_change: Arc<dyn Fn() + Send + Sync>,
    ) {
        let mut running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        running.retain(|name, (shared, task)| {
            let keep = specs.get(name) == Some(&shared.spec);
            if !keep {
                // Dropping the last handle of the connection kills a stdio child.
                task.abort();
                changed = true;
            }
            keep
        });
        for (name, spec) in specs {
            if running.contains_key(name) {
                continue;
            }
            let shared = Arc::new(Shared {
                changed: Arc::new(tokio::sync::Notify::new()),
                group: name.clone(),
                spec: spec.clone(),
                client: tokio::sync::RwLock::new(None),
                tools: Mutex::new(Vec::new()),
                status: Mutex::new(Status {
                    state: "connecting",
                    ..Status::default()
                }),
                slots: tokio::sync::Semaphore::new(spec.max_concurrency.max(1)),
                credentials: Mutex::new(credentials::of(spec, &[])),
                credential_slots: spec.slots().unwrap_or_default().into(),
                principals: principal::Connections::default(),
            });
            let task = tokio::spawn(supervise(shared.clone(), on_change.clone()));
            running.insert(name.clone(), (shared, task.abort_handle()));
            changed = true;
        }
        drop(running);
        if changed {
            on_change();
        }
    }

    /// The pool's view of the upstreams: their tools, and a status per group.
    pub fn catalog_part(&self) -> (Vec<Arc<Tool>>, Vec<GroupStatus>) {
        let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut tools = Vec::new();
        let mut groups = Vec::new();
        let mut names: Vec<&String> = running.keys().collect();
        names.sort();
        for name in names {
            let shared = &running[name].0;
            let listed = shared
                .tools
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let status = shared.status.lock().unwrap_or_else(|p| p.into_inner());
            let mut problems = Vec::new();
            let mut count = 0;
            for t in listed {
                match to_pool_tool(name, &t) {
                    Ok(tool) => {
                        count += 1;
                        tools.push(Arc::new(tool));
                    }
                    Err(e) => problems.push(e),
                }
            }
            let error = status
                .last_error
                .clone()
                .map(|e| format!("{}: {e}", status.state))
                .into_iter()
                .chain(problems)
                .next();
            groups.push(GroupStatus {
                name: name.clone(),
                folder: format!("upstream:{name}"),
                source: "upstream",
                tools: count,
                summary: Some(shared.spec.description.clone()).filter(|d| !d.is_empty()),
                error: error.map(|reason| LoadError {
                    folder: format!("upstream:{name}"),
                    file: format!("upstreams/{name}"),
                    reason,
                }),
            });
        }
        (tools, groups)
    }

    /// Reads a resource from an upstream, under our URI (rewritten back for the upstream).
    pub async fn read_resource(
        &self,
        group: &str,
        upstream_uri: &str,
        our_uri: &str,
    ) -> Result<rmcp::model::ReadResourceResult, UpstreamError> {
        let shared = {
            let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            running
                .get(group)
                .map(|(s, _)| s.clone())
                .ok_or_else(|| UpstreamError::Down(group.to_owned()))?
        };
        let timeout = Duration::from_millis(shared.spec.timeout_ms);
        let work = async {
            let client = shared.client.read().await;
            let client = client
                .as_ref()
                .ok_or_else(|| UpstreamError::Down(group.to_owned()))?;
            client
                .read_resource(rmcp::model::ReadResourceRequestParams::new(
                    upstream_uri.to_owned(),
                ))
                .await
                .map_err(|e| {
                    UpstreamError::Failed(
                        group.to_owned(),
                        credentials::scrub_text(&e.to_string(), &shared.credentials()),
                    )
                })
        };
        let result = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| UpstreamError::Timeout(group.to_owned(), shared.spec.timeout_ms))??;
        let mut result = credentials::scrub(result, &shared.credentials())
            .ok_or_else(|| UpstreamError::Failed(group.to_owned(), WITHHELD.to_owned()))?;
        for c in &mut result.contents {
            if let rmcp::model::ResourceContents::TextResourceContents { uri, .. }
            | rmcp::model::ResourceContents::BlobResourceContents { uri, .. } = c
                && uri == upstream_uri
            {
                *uri = our_uri.to_owned();
            }
        }
        Ok(result)
    }

    /// The credential slots `group` declares (empty if none, or if it is not an upstream).
    pub fn slots(&self, group: &str) -> Arc<[UpstreamSlot]> {
        let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        running
            .get(group)
            .map(|(s, _)| s.credential_slots.clone())
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }

    /// The URL of an http upstream.
    pub fn url(&self, group: &str) -> Option<String> {
        let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        running.get(group).and_then(|(s, _)| s.spec.url.clone())
    }

    pub fn health(&self) -> BTreeMap<String, Health> {
        let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .map(|(name, (s, _))| {
                let st = s.status.lock().unwrap_or_else(|p| p.into_inner());
                let open = st
                    .open_until
                    .and_then(|u| u.checked_duration_since(Instant::now()))
                    .map(|d| d.as_millis() as u64);
                (
                    name.clone(),
                    Health {
                        state: st.state,
                        tools: s.tools.lock().map(|t| t.len()).unwrap_or(0),
                        last_error: st.last_error.clone(),
                        consecutive_failures: st.failures,
                        circuit_open_ms: open,
                        caller_connections: s.principals.len(),
                    },
                )
            })
            .collect()
    }

    /// Forwards a call with the tool's original name and the upstream's own credentials,
    /// within the caller's `trace`: in the request's `_meta` (`traceparent`, `tracestate`, as
    /// MCP carries trace context on any transport) and, over HTTP, as the W3C headers. With
    /// `opened` (the caller's values of the upstream's slots) it goes out on the caller's own
    /// connection, made on first use.
    pub async fn call(
        &self,
        group: &str,
        tool: &str,
        args: Map<String, Value>,
        trace: &TraceContext,
        opened: &[crate::credentials::Opened],
        durable: crate::audit::Durable,
    ) -> Result<CallToolResult, UpstreamError> {
        let shared = {
            let running = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            running
                .get(group)
                .map(|(s, _)| s.clone())
                .ok_or_else(|| UpstreamError::Down(group.to_owned()))?
        };
        {
            let st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if st.open_until.is_some_and(|u| u > now) {
                return Err(UpstreamError::CircuitOpen(group.to_owned()));
            }
            if st
                .tools
                .get(tool)
                .and_then(|(_, until)| *until)
                .is_some_and(|u| u > now)
            {
                return Err(UpstreamError::ToolCircuitOpen(
                    group.to_owned(),
                    tool.to_owned(),
                ));
            }
        }
        let timeout = Duration::from_millis(shared.spec.timeout_ms);
        let own = match opened {
            [] => None,
            opened => {
                let key = principal::key(opened);
                let conn = shared
                    .principals
                    .get(
                        key,
                        shared.spec.max_principal_connections,
                        Duration::from_secs(shared.spec.principal_idle_secs),
                        || principal::build(&shared.spec, &shared.credential_slots, opened),
                    )
                    .map_err(|principal::Full(n)| UpstreamError::Busy(group.to_owned(), n))?
                    .map_err(|e| UpstreamError::Failed(group.to_owned(), e))?;
                Some((key, conn))
            }
        };
        if let Some((key, conn)) = &own
            && let Err(e) = connect_own(&shared, conn).await
        {
            // The caller's credentials are refused, or its child did not start: that is the
            // caller's failure, and the upstream's circuit (everyone's) is left alone.
            shared.principals.forget(key, conn);
            let again = reconnect_hint(&shared);
            return Err(UpstreamError::Failed(
                group.to_owned(),
                credentials::scrub_text(
                    &format!(
                        "cannot connect with the credentials of {}: {e}{again}",
                        conn.whose
                    ),
                    &conn.scrub,
                ),
            ));
        }
        let work = async {
            let _slot = shared.slots.acquire().await.map_err(|_| {
                (
                    Verdict::ConnectionFailed,
                    UpstreamError::Down(group.to_owned()),
                )
            })?;
            let client = match &own {
                Some((_, conn)) => conn.client.read().await,
                None => shared.client.read().await,
            };
            let client = client.as_ref().ok_or_else(|| {
                (
                    Verdict::ConnectionFailed,
                    UpstreamError::Down(group.to_owned()),
                )
            })?;
            let mut params = CallToolRequestParams::new(tool.to_owned());
            params.arguments = Some(args);
            if let Some(tp) = &trace.traceparent {
                params.set_traceparent(tp);
            }
            if let Some(ts) = &trace.tracestate {
                params.set_tracestate(ts);
            }
            // Everything above (the connection, the slot, the request) was made while the
            // call's `started` row committed; the send waits for it to be on disk.
            if !durable.wait().await {
                return Err((Verdict::NotSent, UpstreamError::NotRecorded));
            }
            client.call_tool(params).await.map_err(|e| {
                let verdict = match &e {
                    rmcp::ServiceError::McpError(d) if guard::is_refusal(d) => Verdict::ToolFailed,
                    rmcp::ServiceError::McpError(_) => Verdict::Answered,
                    _ => Verdict::ConnectionFailed,
                };
                let said = match e {
                    rmcp::ServiceError::McpError(d) if guard::is_refusal(&d) => {
                        d.message.to_string()
                    }
                    e => e.to_string(),
                };
                (verdict, UpstreamError::Failed(group.to_owned(), said))
            })
        };
        let result = match tokio::time::timeout(timeout, work).await {
            // Not sent: nothing happened that the upstream's health or a connection's
            // should count.
            Ok(Err((Verdict::NotSent, e))) => return Err(e),
            Ok(r) => r,
            Err(_) => Err((
                Verdict::ToolFailed,
                UpstreamError::Timeout(group.to_owned(), shared.spec.timeout_ms),
            )),
        };
        let credentials = match &own {
            Some((_, conn)) => conn.scrub.clone(),
            None => shared.credentials(),
        };
        let (verdict, result) = match result {
            Ok(r) => match credentials::scrub(r, &credentials) {
                Some(r) => (Verdict::Answered, Ok(r)),
                None => (
                    Verdict::Answered,
                    Err(UpstreamError::Failed(group.to_owned(), WITHHELD.to_owned())),
                ),
            },
            Err((v, UpstreamError::Failed(g, said))) => (
                v,
                Err(UpstreamError::Failed(
                    g,
                    credentials::scrub_text(&said, &credentials),
                )),
            ),
            Err((v, e)) => (v, Err(e)),
        };
        if let Some((key, conn)) = &own {
            conn.touch();
            match verdict {
                // A tool that hangs is the tool's, whoever calls it: its circuit counts.
                Verdict::ToolFailed => {}
                // A caller's connection failing is that caller's: it is dropped (the next
                // call reconnects) and the upstream's circuit, everyone's, is left alone.
                Verdict::ConnectionFailed => {
                    shared.principals.forget(key, conn);
                    return match result {
                        Err(UpstreamError::Failed(g, said)) => Err(UpstreamError::Failed(
                            g,
                            format!("{said}{}", reconnect_hint(&shared)),
                        )),
                        other => other,
                    };
                }
                Verdict::Answered | Verdict::NotSent => return result,
            }
        }
        let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &result {
            st.last_error = Some(e.to_string());
        }
        match verdict {
            Verdict::Answered => {
                st.failures = 0;
                st.open_until = None;
                st.tools.remove(tool);
            }
            Verdict::ToolFailed => {
                // A timeout may also be a dead connection: let the supervisor check now.
                shared.changed.notify_one();
                let (failures, until) = st.tools.entry(tool.to_owned()).or_default();
                *failures += 1;
                if *failures >= BREAKER_THRESHOLD {
                    *until = Some(Instant::now() + BREAKER_OPEN);
                }
            }
            // Returned above, before any of this.
            Verdict::NotSent => {}
            Verdict::ConnectionFailed => {
                // Let the supervisor check the connection now rather than at its next poll.
                shared.changed.notify_one();
                st.failures += 1;
                if st.failures >= BREAKER_THRESHOLD {
                    st.open_until = Some(Instant::now() + BREAKER_OPEN);
                }
            }
        }
        result
    }
}

/// A connected grant the upstream refuses was revoked there: only the person can mend that,
/// and the error says where.
fn reconnect_hint(shared: &Shared) -> &'static str {
    if shared.credential_slots.iter().any(|s| s.oauth.is_some()) {
        "; if the upstream revoked the connection, connect again on My connections (/admin/connections)"
    } else {
        ""
    }
}

/// What an agent is told in place of an answer that quoted the upstream's credential and
/// could not be cleaned without breaking it.
const WITHHELD: &str = "its answer was withheld: it quoted the upstream's credential";

/// Converts an upstream tool into a pool tool named `<group>__<tool>`.
pub(crate) fn to_pool_tool(group: &str, t: &rmcp::model::Tool) -> Result<Tool, String> {
    // A tool's group is read off its name up to the first `__`; a group name with `__` in it
    // (one written into the table by hand, past the API's check) would be read as another
    // group's, so none is served. The rule is the one the API and the grants hold it to.
    if let Err(e) = crate::names::GroupName::parse(group) {
        return Err(format!("tool `{}` skipped: {e}", t.name));
    }
    let name = ToolName::parse(&format!("{group}{SEPARATOR}{}", t.name))
        .map_err(|e| format!("tool `{}` skipped: {e}", t.name))?;
    // Upstream schemas are hostile input too: no network `$ref`s are resolved.
    let schema = crate::pool::InputSchema::from(t.input_schema.clone());
    let validator = crate::pool::InputValidator::check(schema.clone(), &t.input_schema, None)
        .map_err(|e| format!("tool `{}` skipped: invalid input schema: {e}", t.name))?;
    let props: Vec<String> = t
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    sha2::Digest::update(&mut hasher, serde_json::to_vec(t).unwrap_or_default());
    Ok(Tool {
        name,
        title: t.title.clone(),
        description: t.description.as_ref().map(|d| d.to_string()),
        input_schema: schema,
        content_hash: ContentHash::from_digest(sha2::Digest::finalize(hasher)),
        source: ToolSource::Upstream {
            upstream: group.to_owned(),
        },
        http: Some(HttpBinding {
            method: http::Method::POST,
            path: format!("/{}", t.name),
            path_params: Vec::new(),
            query_params: Vec::new(),
            body_params: props,
            operation: HttpBinding::operation_text(&serde_json::json!({
                "summary": t.title.clone().or_else(|| t.description.as_ref().map(|d| d.to_string())),
                "description": t.description,
                "requestBody": {"content": {"application/json": {"schema": *t.input_schema}}},
                "responses": {"200": {"description": "The tool's result"}},
            })),
        }),
        exec: Execution::Upstream {
            upstream: group.to_owned(),
            tool: t.name.to_string(),
        },
        validator,
        ui: None,
        narrowing: None,
        listed: Default::default(),
        audit: Arc::new(crate::audit::AuditPolicy::default()),
        annotations: t.annotations.clone().map(Box::new),
        meta: t.meta.clone().map(|m| Box::new(rewrite_ui_meta(group, m))),
    })
}

/// An upstream's `ui://host/path` becomes `ui://<group>/host/path`, so that two upstreams can
/// never claim the same resource and `resources/read` knows where to go. The rest of `_meta.ui`
/// (visibility, CSP domains) passes through untouched.
fn rewrite_ui_meta(group: &str, mut meta: rmcp::model::MetaObject) -> rmcp::model::MetaObject {
    if let Some(Value::Object(ui)) = meta.get_mut("ui")
        && let Some(Value::String(uri)) = ui.get_mut("resourceUri")
        && let Some(rest) = uri.strip_prefix("ui://")
    {
        *uri = format!("ui://{group}/{rest}");
    }
    meta
}

/// The upstream and its own URI behind one of our `ui://<group>/...` URIs.
pub fn upstream_ui_uri(uri: &str) -> Option<(&str, String)> {
    let rest = uri.strip_prefix("ui://")?;
    let (group, path) = rest.split_once('/')?;
    Some((group, format!("ui://{path}")))
}

/// Connects to the upstream; also returns the credentials obtained on the way (an OAuth
/// access token), to be scrubbed like the configured ones.
async fn connect(
    group: &str,
    spec: &UpstreamSpec,
    listener: Listener,
) -> Result<(RunningService<RoleClient, Listener>, Vec<String>), String> {
    match spec.transport {
        TransportKind::Stdio => {
            let command = spec.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(&spec.args).env_clear();
            for name in ["PATH", "HOME", "LANG", "TZ"] {
                if let Ok(v) = std::env::var(name) {
                    cmd.env(name, v);
                }
            }
            cmd.envs(&spec.env);
            let transport = stdio::ChildTransport::spawn(cmd, spec.max_result_bytes, group)
                .map_err(|e| format!("cannot start `{command}`: {e}"))?;
            let client = listener
                .serve(transport)
                .await
                .map_err(|e| format!("handshake failed: {e}"))?;
            Ok((client, Vec::new()))
        }
        TransportKind::Http => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let url = spec.url.as_deref().unwrap_or_default();
            let mut custom = HashMap::new();
            for (k, v) in &spec.headers {
                let name = http::HeaderName::try_from(k.as_str())
                    .map_err(|e| format!("header `{k}`: {e}"))?;
                let value = http::HeaderValue::try_from(v.as_str())
                    .map_err(|e| format!("header `{k}`: {e}"))?;
                custom.insert(name, value);
            }
            // A JSON answer is bounded as a whole, an SSE one per event (a little framing on
            // top of the message).
            let mut config = StreamableHttpClientTransportConfig::with_uri(url)
                .custom_headers(custom)
                .max_json_response_size(spec.max_result_bytes)
                .max_sse_event_size(spec.max_result_bytes.saturating_add(1024));
            config.allow_stateless = true;
            let mut obtained = Vec::new();
            if let Some(o) = &spec.oauth {
                let token = upstream_token(o).await?;
                obtained.push(token.clone());
                config = config.auth_header(token);
            }
            let client = listener
                .serve(StreamableHttpClientTransport::with_client(
                    traced::TracedClient::new(spec.max_result_bytes).map_err(|e| e.to_string())?,
                    config,
                ))
                .await
                .map_err(|e| format!("cannot reach {url}: {e}"))?;
            Ok((client, obtained))
        }
    }
}

/// Connects a caller's own connection if it is not (or no longer) connected.
async fn connect_own(shared: &Shared, conn: &principal::Connection) -> Result<(), String> {
    if conn
        .client
        .read()
        .await
        .as_ref()
        .is_some_and(|c| !c.is_closed())
    {
        return Ok(());
    }
    let mut client = conn.client.write().await;
    if client.as_ref().is_some_and(|c| !c.is_closed()) {
        return Ok(());
    }
    *client = None;
    let handshake = Duration::from_millis(shared.spec.timeout_ms.clamp(1000, 30_000));
    // Its list_changed notices are the upstream's, read on the shared connection.
    let listener = Listener {
        changed: Arc::new(tokio::sync::Notify::new()),
    };
    let (connected, _) =
        tokio::time::timeout(handshake, connect(&shared.group, &conn.spec, listener))
            .await
            .map_err(|_| format!("no handshake within {} ms", handshake.as_millis()))??;
    *client = Some(connected);
    Ok(())
}

/// Client credentials at the upstream's own authorization server.
async fn upstream_token(o: &OAuthSpec) -> Result<String, String> {
    use oauth2::{ClientId, ClientSecret, Scope, TokenResponse, TokenUrl};
    let secret = std::env::var(&o.client_secret_env)
        .map_err(|_| format!("environment variable `{}` is not set", o.client_secret_env))?;
    let client = oauth2::basic::BasicClient::new(ClientId::new(o.client_id.clone()))
        .set_client_secret(ClientSecret::new(secret))
        .set_token_uri(TokenUrl::new(o.token_url.clone()).map_err(|e| e.to_string())?);
    let http = oauth2::reqwest::ClientBuilder::new()
        .redirect(oauth2::reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = client.exchange_client_credentials();
    if let Some(s) = &o.scope {
        request = request.add_scope(Scope::new(s.clone()));
    }
    let token = request
        .request_async(&http)
        .await
        .map_err(|e| format!("upstream token request failed: {e}"))?;
    Ok(token.access_token().secret().clone())
}

fn set_status(shared: &Shared, state: &'static str, error: Option<String>) {
    // A connection error can quote what the upstream said (or was sent); admins read it.
    let error = error.map(|e| credentials::scrub_text(&e, &shared.credentials()));
    let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
    st.state = state;
    if error.is_some() || state == "up" {
        st.last_error = error;
    }
}

/// Keeps one upstream connected: connect, list, refresh; on loss, reconnect with backoff.
async fn supervise(shared: Arc<Shared>, on_change: Arc<dyn Fn() + Send + Sync>) {
    let mut backoff = Duration::from_millis(500);
    loop {
        set_status(&shared, "connecting", None);
        // A server that never finishes its handshake must not wedge the supervisor.
        let handshake = Duration::from_millis(shared.spec.timeout_ms.clamp(1000, 30_000));
        let connected = match shared.spec.validate() {
            Err(e) => Err(e),
            Ok(()) => match tokio::time::timeout(
                handshake,
                connect(
                    &shared.group,
                    &shared.spec,
                    Listener {
                        changed: shared.changed.clone(),
                    },
                ),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(format!("no handshake within {} ms", handshake.as_millis())),
            },
        };
        match connected {
            Ok((client, obtained)) => {
                *shared.credentials.lock().unwrap_or_else(|p| p.into_inner()) =
                    credentials::of(&shared.spec, &obtained);
                backoff = Duration::from_millis(500);
                *shared.client.write().await = Some(client);
                set_status(&shared, "up", None);
                tracing::info!(upstream = %shared.group, "upstream connected");
                let mut listed_at: Option<Instant> = None;
                loop {
                    // However often the upstream says its list changed, it is read at most
                    // once per MIN_RELIST.
                    if let Some(at) = listed_at {
                        tokio::time::sleep_until((at + MIN_RELIST).into()).await;
                    }
                    listed_at = Some(Instant::now());
                    let listed = {
                        let guard = shared.client.read().await;
                        match guard.as_ref() {
                            Some(c) if !c.is_closed() => {
                                // A dead HTTP upstream can keep a request pending; bound it.
                                let timeout = Duration::from_millis(shared.spec.timeout_ms);
                                match tokio::time::timeout(timeout, c.list_all_tools()).await {
                                    Ok(r) => r.map_err(|e| e.to_string()),
                                    Err(_) => Err(format!(
                                        "tools/list took longer than {} ms",
                                        shared.spec.timeout_ms
                                    )),
                                }
                            }
                            _ => Err("connection closed".to_owned()),
                        }
                    };
                    match listed {
                        Ok(tools) => {
                            let changed = {
                                let mut current =
                                    shared.tools.lock().unwrap_or_else(|p| p.into_inner());
                                let changed = *current != tools;
                                *current = tools;
                                changed
                            };
                            if changed {
                                on_change();
                            }
                        }
                        Err(e) => {
                            tracing::warn!(upstream = %shared.group, error = %e, "upstream lost");
                            set_status(&shared, "down", Some(e));
                            break;
                        }
                    }
                    // Re-list periodically; a closed connection is noticed within a second.
                    let deadline =
                        Instant::now() + Duration::from_secs(shared.spec.refresh_secs.max(1));
                    while Instant::now() < deadline {
                        shared
                            .principals
                            .reap(Duration::from_secs(shared.spec.principal_idle_secs));
                        // A list_changed notification re-lists at once; otherwise poll.
                        if tokio::time::timeout(
                            Duration::from_millis(500),
                            shared.changed.notified(),
                        )
                        .await
                        .is_ok()
                        {
                            break;
                        }
                        if shared
                            .client
                            .read()
                            .await
                            .as_ref()
                            .is_none_or(|c| c.is_closed())
                        {
                            break;
                        }
                    }
                }
                if let Some(old) = shared.client.write().await.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), old.cancel()).await;
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %shared.group, error = %e, "upstream unavailable");
                set_status(&shared, "down", Some(e));
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream_tool(name: &str) -> rmcp::model::Tool {
        serde_json::from_value(serde_json::json!({
            "name": name, "description": "d", "inputSchema": {"type": "object"}
        }))
        .unwrap()
    }

    #[test]
    fn an_upstream_tool_keeps_its_group_and_own_name() {
        let t = to_pool_tool("up", &upstream_tool("do__it")).unwrap();
        assert_eq!(t.name.as_str(), "up__do__it");
        assert_eq!((t.group(), t.operation()), ("up", "do__it"));
    }

    /// A group written into the table past the API's check must not pass for another group:
    /// `a__b` + `c` would be named `a__b__c` and read as group `a`.
    #[test]
    fn a_group_name_with_the_separator_serves_no_tool() {
        let e = to_pool_tool("a__b", &upstream_tool("c")).unwrap_err();
        assert!(e.contains("`a__b` is not a valid group name"), "{e}");
        assert!(e.contains("without `__`"), "{e}");
    }
}
