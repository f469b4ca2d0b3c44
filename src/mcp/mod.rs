//! The MCP surface: `POST /mcp`, served by the official SDK (`rmcp`) in stateless,
//! JSON-response mode for both protocol eras. The handler translates; the core decides.

use std::sync::Arc;

use axum::Router;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::audit::{EventKind, Outcome, RequestOrigin};
use crate::gate::{Gate, Refused, Surface};
use crate::policy::snapshot::Principal;
use crate::search;
use crate::state::AppState;

pub mod apps;
mod jsonrpc;
mod list;
pub mod listen;

/// Largest JSON-RPC request body accepted on `/mcp`.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

pub fn router(state: AppState) -> Router<AppState> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(state.settings.allowed_hosts.clone())
        .with_allowed_origins(state.settings.allowed_origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_REQUEST_BYTES)
        .with_sse_keep_alive(None);
    let handler_state = state.clone();
    let listeners = Arc::new(listen::Listeners::default());
    let service = StreamableHttpService::new(
        move || {
            Ok(Gateway {
                state: handler_state.clone(),
                listeners: listeners.clone(),
                // The SDK asks the handler for tool definitions outside any request context
                // (`Mcp-Param-*` header checks); this is the caller it must answer for.
                caller: CALLER.try_with(Clone::clone).ok(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        // Inside authentication: a stranger learns nothing from how a body is malformed.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            jsonrpc::guard,
        ))
        .layer(axum::middleware::from_fn(with_caller))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::http::require_agent,
        ))
        // Outermost: no request reaches a tool while the audit log cannot be written.
        .layer(axum::middleware::from_fn_with_state(
            state,
            crate::http::require_audit,
        ))
}

tokio::task_local! {
    /// The authenticated caller of the request being served, for the SDK's handler factory.
    static CALLER: Principal;
}

/// One `ServerHandler` per request; it holds the shared state and the request's caller.
#[derive(Clone)]
pub struct Gateway {
    state: AppState,
    caller: Option<Principal>,
    /// `subscriptions/listen` streams held now, shared by every request's handler.
    listeners: Arc<listen::Listeners>,
}

fn principal(ctx: &RequestContext<RoleServer>) -> Result<Principal, McpError> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .cloned()
        // The axum guard runs first; reaching here without a principal is a wiring bug.
        .ok_or_else(|| McpError::internal_error("request is not authenticated", None))
}

fn origin(ctx: &RequestContext<RoleServer>) -> Option<RequestOrigin> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<RequestOrigin>())
        .cloned()
}

/// JSON-RPC error code of a rate-limited request that is not a tool call (`tools/list`,
/// `prompts/get`...): in the range JSON-RPC 2.0 leaves to servers (-32000 to -32099), with
/// `data.retry_after_ms`. A rate-limited tool call is a tool error instead (see
/// [`rate_limited_call`]).
pub const RATE_LIMITED: i32 = -32029;

/// Milliseconds to wait, rounded up as the REST surface's `Retry-After` is: never an
/// invitation to come back early.
fn retry_ms(retry_after: std::time::Duration) -> u64 {
    retry_after.as_micros().div_ceil(1000).max(1) as u64
}

fn rate_limited(retry_after: std::time::Duration) -> McpError {
    let ms = retry_ms(retry_after);
    McpError::new(
        rmcp::model::ErrorCode(RATE_LIMITED),
        format!("rate limited: retry after {ms} ms"),
        Some(serde_json::json!({"retry_after_ms": ms})),
    )
}

/// A rate-limited tool call, as a tool error the model reads (and may wait on) rather than a
/// protocol error agent frameworks turn into an exception that ends the run; `_meta` carries
/// the wait for clients that act on it.
fn rate_limited_call(retry_after: std::time::Duration) -> CallToolResponse {
    let ms = retry_ms(retry_after);
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "rate limited: this agent may not call this tool again yet; retry after {ms} ms"
    ))]);
    let mut meta = serde_json::Map::new();
    meta.insert("retry_after_ms".into(), json!(ms));
    result.meta = Some(rmcp::model::MetaObject(meta));
    result.into()
}

/// A call that waits for approval, or that a person refused: a tool error the model reads
/// (the call did not run), with the request in `_meta` for clients that act on it.
fn approval_call(tool: &str, ticket: &crate::service::approvals::Ticket) -> CallToolResponse {
    let mut result = CallToolResult::error(vec![ContentBlock::text(ticket.message(tool))]);
    let mut meta = serde_json::Map::new();
    meta.insert(
        "io.toolgate/approval".into(),
        json!({"id": ticket.id, "status": ticket.status, "expires_at": ticket.expires_at, "reason": ticket.reason}),
    );
    result.meta = Some(rmcp::model::MetaObject(meta));
    result.into()
}

/// A call that waits for approval, as a task (SEP-2663): `working` until a person decides,
/// then the call's result (`completed`) or the refusal (`failed`). The task is the request:
/// its id is the request's, readable by the same caller only.
fn approval_task(ticket: &crate::service::approvals::Ticket) -> rmcp::model::CreateTaskResult {
    let now = chrono::Utc::now();
    let mut task = rmcp::model::Task::new(
        ticket.id.to_string(),
        rmcp::model::TaskStatus::Working,
        now.to_rfc3339(),
        now.to_rfc3339(),
    );
    task.status_message = Some(format!("waiting for approval {}", ticket.id));
    task.ttl_ms = Some((ticket.expires_at - now).num_milliseconds().max(0) as u64);
    task.poll_interval_ms = Some(APPROVAL_POLL_MS);
    rmcp::model::CreateTaskResult::new(task)
}

/// How often a client polls a task that waits for a person.
const APPROVAL_POLL_MS: u64 = 2000;

/// `tasks/get` for a call that waits for approval.
async fn approval_task_state(
    state: &AppState,
    principal: &Principal,
    task_id: &str,
) -> Result<rmcp::model::GetTaskResult, McpError> {
    use rmcp::model::{DetailedTask, GetTaskResult, Task, TaskPayload, TaskStatus};
    let unknown = || McpError::invalid_params("unknown task", None);
    let id = uuid::Uuid::parse_str(task_id).map_err(|_| unknown())?;
    let row = crate::service::approvals::for_caller(state, principal, id)
        .await
        .map_err(|_| audit_unavailable())?
        .ok_or_else(unknown)?;
    let updated = row
        .finished_at
        .or(row.decided_at)
        .unwrap_or(row.requested_at)
        .to_rfc3339();
    let mut task = Task::new(
        row.id.to_string(),
        TaskStatus::Working,
        row.requested_at.to_rfc3339(),
        updated,
    );
    task.ttl_ms = Some(
        (row.expires_at - row.requested_at)
            .num_milliseconds()
            .max(0) as u64,
    );
    task.poll_interval_ms = Some(APPROVAL_POLL_MS);
    let ticket = crate::service::approvals::Ticket {
        id: row.id,
        status: row.state.clone(),
        reason: row.reason.clone(),
        expires_at: row.expires_at,
        created: false,
    };
    let payload = match (row.state.as_str(), crate::gate::stored_outcome(&row)) {
        ("done", Some(outcome)) => {
            let result = serde_json::to_value(outcome.into_mcp_result())
                .ok()
                .and_then(|v| v.as_object().cloned())
                .unwrap_or_default();
            TaskPayload::Completed { result }
        }
        ("pending" | "granted" | "running", _) => {
            task.status_message = Some(ticket.message(&row.tool));
            TaskPayload::Working
        }
        (s, _) => {
            // Application codes, outside JSON-RPC's reserved range.
            let code = match s {
                "denied" => -31001,
                "expired" => -31002,
                _ => -31003,
            };
            let mut error = serde_json::Map::new();
            error.insert("code".into(), json!(code));
            error.insert("message".into(), json!(ticket.message(&row.tool)));
            error.insert(
                "data".into(),
                json!({"approval": row.id, "status": row.state, "reason": row.reason}),
            );
            TaskPayload::Failed { error }
        }
    };
    // The outcome is this task's: an identical call made later is a new request.
    if !matches!(payload, TaskPayload::Working) {
        let _ = crate::service::approvals::mark_delivered(state, row.id).await;
    }
    Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
}

fn refused(r: Refused) -> McpError {
    match r {
        Refused::Approval { tool, ticket } => {
            McpError::invalid_request(ticket.message(tool.name.as_str()), None)
        }
        Refused::ApprovalUnavailable => McpError::internal_error(
            "the approval store is unavailable, so the call that needs approval did not run; retry shortly",
            None,
        ),
        Refused::RateLimited { retry_after, .. } => rate_limited(retry_after),
        Refused::AuditUnavailable(_) => audit_unavailable(),
        Refused::LimitsUnavailable { retry_after } => {
            let ms = retry_after.as_millis().max(1) as u64;
            McpError::internal_error(
                format!(
                    "the rate-limit store is unavailable, so the request was not served; retry after {ms} ms"
                ),
                Some(serde_json::json!({"retry_after_ms": ms})),
            )
        }
        Refused::UnknownTool(name) => {
            McpError::invalid_params(format!("Unknown tool: {name}"), None)
        }
        Refused::CredentialMissing { message, .. } => McpError::invalid_request(message, None),
        Refused::InvalidArguments { tool, violations } => McpError::invalid_params(
            format!(
                "invalid arguments for {}: {}",
                tool.name,
                violations.join("; ")
            ),
            None,
        ),
    }
}

fn audit_unavailable() -> McpError {
    McpError::internal_error(
        "the audit log is unavailable, so the tool was not run; retry shortly",
        None,
    )
}

fn encode_cursor(last: &str) -> String {
    URL_SAFE_NO_PAD.encode(last.as_bytes())
}

fn decode_cursor(cursor: &str) -> Result<String, McpError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| McpError::invalid_params("invalid cursor", None))
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                // Pushed on `subscriptions/listen` (2026-07-28); not said to 2025-era
                // clients, which have no stream here (see `initialize`).
                .enable_tool_list_changed()
                .enable_prompts()
                .enable_resources()
                // A call that waits for approval is a task to a 2026-07-28 client that
                // declares the extension (`tasks/get` polls it).
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("toolgate", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Tools served by toolgate. You see only the tools granted to you. When search_tools \
             is listed, find your other tools with it and call them by name.",
        )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let started = std::time::Instant::now();
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        let cursor = request.and_then(|r| r.cursor);
        let listing = list::listing(&self.state, &gate, cursor.as_deref()).await;
        self.state.metrics.mcp_operation(
            "tools/list",
            None,
            &principal.agent,
            listing
                .as_ref()
                .err()
                .map(|e| e.code.0.to_string())
                .as_deref(),
            started.elapsed(),
        );
        Ok(listing?.into_result())
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        // The SDK checks `Mcp-Param-*` headers against this definition before the call is
        // dispatched: it must answer for the caller's visibility exactly as the call will,
        // or an ungranted tool could be told from a missing one by the error it gets.
        let principal = self.caller.as_ref()?;
        let gate = Gate::new(&self.state, principal, Surface::Mcp, None);
        if search::is_meta_tool(name) {
            return gate
                .has_meta_tools()
                .then(|| search::meta_tool(name).cloned())
                .flatten();
        }
        gate.resolve(name).map(|t| t.mcp_definition())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = std::time::Instant::now();
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        let name = request.name.to_string();
        // A 2026-07-28 client that declares the tasks extension on this request is given a
        // task for a call that waits for approval; any other is told in a tool result.
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str());
        let waits = if !modern {
            Waits::ToolResult
        } else if ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            Waits::Task
        } else {
            Waits::InputRequired
        };
        // A retry of a call that waits for approval (SEP-2322) carries the state we sealed
        // for this caller; it is held open for a decision, then the call goes through the core
        // path again like any.
        if modern && let Some(sealed) = request.request_state.as_deref() {
            let Some(id) =
                crate::service::approvals::open_state(gate.snapshot(), &principal, sealed)
            else {
                return Err(McpError::invalid_params(
                    "requestState is not one this gateway issued for this caller",
                    None,
                ));
            };
            crate::service::approvals::hold(&self.state, id, self.state.settings.approval_hold)
                .await;
        }
        let hold = Hold {
            peer: &ctx.peer,
            progress: ctx.meta.get_progress_token(),
            bound: self.state.settings.approval_hold,
        };
        let result = call_tool(&gate, request, waits, &hold).await;
        // The tool label only for a name the caller may see: no label values minted from
        // made-up names, no trace of an ungranted tool.
        let visible =
            (search::is_meta_tool(&name) && gate.has_meta_tools()) || gate.resolve(&name).is_some();
        let error_type = match &result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                Some("tool_error".to_owned())
            }
            Ok(_) => None,
            Err(e) => Some(e.code.0.to_string()),
        };
        self.state.metrics.mcp_operation(
            "tools/call",
            visible.then_some(name.as_str()),
            &principal.agent,
            error_type.as_deref(),
            started.elapsed(),
        );
        result
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::PromptsList).await.map_err(refused)?;
        Ok(ListPromptsResult::with_all_items(Vec::new())
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::ResourcesList)
            .await
            .map_err(refused)?;
        let resources = apps::resources(&gate);
        gate.disclosed(
            EventKind::ResourcesList,
            Outcome::Success,
            json!({"shown": resources.iter().map(|r| r.uri.as_str()).collect::<Vec<_>>()}),
        );
        Ok(ListResourcesResult::with_all_items(resources)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::PromptGet).await.map_err(refused)?;
        // The gateway serves no prompts; the list is advertised (empty) for caching clients.
        gate.not_found(EventKind::PromptGet, &format!("prompt:{}", request.name));
        Err(McpError::invalid_params(
            format!("Prompt not found: {}", request.name),
            Some(json!({"name": request.name})),
        ))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::ResourceRead).await.map_err(refused)?;
        match apps::read(&self.state, &gate, &request.uri).await {
            Ok(result) => {
                gate.disclosed(
                    EventKind::ResourceRead,
                    Outcome::Success,
                    json!({"uri": crate::audit::bounded(&request.uri)}),
                );
                Ok(result
                    .with_ttl_ms(0)
                    .with_cache_scope(CacheScope::Private)
                    .into())
            }
            Err(e) => {
                gate.not_found(EventKind::ResourceRead, &request.uri);
                Err(e)
            }
        }
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::Initialize).await.map_err(refused)?;
        ctx.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        // Served statelessly, a 2025-era client has no GET stream to be told on: it sees a
        // change on its next `tools/list` (`ttlMs: 0`), and is not promised a push.
        if let Some(tools) = info.capabilities.tools.as_mut() {
            tools.list_changed = None;
        }
        // The tasks extension is defined from 2026-07-28 only.
        if let Some(ext) = info.capabilities.extensions.as_mut() {
            ext.remove(rmcp::model::TASKS_EXTENSION_ID);
        }
        advertise_apps(&gate, &mut info);
        Ok(info)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        listen::accepted(requested)
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        listen::hold(&self.state, &self.listeners, context).await
    }

    async fn discover(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::Initialize).await.map_err(refused)?;
        let mut info = self.get_info();
        advertise_apps(&gate, &mut info);
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let (principal, _) = caller(&ctx)?;
        approval_task_state(&self.state, &principal, &request.task_id).await
    }

    /// Acknowledged (SEP-2663: cancellation is cooperative), for the task's own caller: a
    /// request for approval is withdrawn only by a person's decision or its expiry.
    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (principal, _) = caller(&ctx)?;
        let id = uuid::Uuid::parse_str(&request.task_id)
            .map_err(|_| McpError::invalid_params("unknown task", None))?;
        match crate::service::approvals::for_caller(&self.state, &principal, id).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(McpError::invalid_params("unknown task", None)),
            Err(_) => Err(audit_unavailable()),
        }
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let (principal, origin) = caller(&ctx)?;
        let gate = Gate::new(&self.state, &principal, Surface::Mcp, origin.as_ref());
        gate.admit(EventKind::ResourcesList)
            .await
            .map_err(refused)?;
        Ok(ListResourceTemplatesResult::with_all_items(Vec::new())
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }
}

fn caller(
    ctx: &RequestContext<RoleServer>,
) -> Result<(Principal, Option<RequestOrigin>), McpError> {
    Ok((principal(ctx)?, origin(ctx)))
}

/// Advertises the MCP Apps extension to a caller that can see a tool with a UI.
fn advertise_apps(gate: &Gate<'_>, info: &mut ServerConfig) {
    if apps::visible_ui(gate).is_empty() {
        return;
    }
    let mut ui = serde_json::Map::new();
    ui.insert("mimeTypes".into(), json!([apps::UI_MIME]));
    info.capabilities
        .extensions
        .get_or_insert_with(Default::default)
        .insert(apps::UI_EXTENSION.to_owned(), ui);
}

/// How a caller is told that its call waits for approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// 2025 era: a tool error that says so.
    ToolResult,
    /// 2026-07-28 with the tasks extension: a task.
    Task,
    /// 2026-07-28 without it: `InputRequiredResult` with a sealed `requestState`.
    InputRequired,
}

/// A 2025-era call that waits for approval is held open this long for a decision, with a
/// progress notification every [`PROGRESS_EVERY`] when the client asked for progress
/// (which also keeps clients that reset their timeout on progress waiting).
struct Hold<'a> {
    peer: &'a rmcp::Peer<RoleServer>,
    progress: Option<rmcp::model::ProgressToken>,
    bound: std::time::Duration,
}

const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Hold<'_> {
    /// Waits for a person's decision on `ticket` (and the approved run) up to the bound,
    /// telling the client it waits.
    async fn wait(&self, state: &AppState, tool: &str, ticket: &crate::service::approvals::Ticket) {
        let decided = crate::service::approvals::hold(state, ticket.id, self.bound);
        tokio::pin!(decided);
        let mut ticks = tokio::time::interval(PROGRESS_EVERY);
        let mut sent = 0u32;
        loop {
            tokio::select! {
                () = &mut decided => return,
                _ = ticks.tick() => {
                    let Some(token) = self.progress.clone() else { continue };
                    sent += 1;
                    let note = rmcp::model::ProgressNotificationParam::new(token, f64::from(sent))
                        .with_message(ticket.message(tool));
                    // A client gone away ends the request anyway; nothing to do here.
                    let _ = self.peer.notify_progress(note).await;
                }
            }
        }
    }
}

/// `tools/call`: a meta-tool, or a tool through the core path.
async fn call_tool(
    gate: &Gate<'_>,
    request: CallToolRequestParams,
    waits: Waits,
    hold: &Hold<'_>,
) -> Result<CallToolResponse, McpError> {
    // The meta-tools exist for agents configured for search or auto (even while auto
    // lists in full, so that a client holding a list from before a grant change still
    // works); a `full` agent has none, and calling one is calling an unknown tool.
    if search::is_meta_tool(&request.name) && gate.has_meta_tools() {
        let args = request.arguments.unwrap_or_default();
        return if request.name == search::SEARCH_TOOLS {
            search_tools(gate, &args).await
        } else if request.name == search::LOAD_TOOLS {
            load_tools(gate, &args).await
        } else {
            match search::parse_call(&args) {
                Ok(c) => call(gate, &c.name, c.arguments, true, waits, hold).await,
                Err(message) => Ok(tool_error(message)),
            }
        };
    }
    let args = Value::Object(request.arguments.unwrap_or_default());
    call(gate, &request.name, args, false, waits, hold).await
}

/// A tool call, direct or through `call_tool` (`via_meta`): always the core path, so grants,
/// limits, validation and audit are the same either way. Through `call_tool` an unknown name
/// is the meta-tool's error (the model reads it), not a protocol error.
async fn call(
    gate: &Gate<'_>,
    name: &str,
    args: Value,
    via_meta: bool,
    waits: Waits,
    hold: &Hold<'_>,
) -> Result<CallToolResponse, McpError> {
    // A 2025-era call that may wait for a person is kept, to be made again after the hold;
    // an agent without approval rules pays nothing for it.
    let again = (waits == Waits::ToolResult
        && !hold.bound.is_zero()
        && gate
            .snapshot()
            .agent(&gate.principal().agent)
            .is_some_and(|a| !a.approvals.is_empty()))
    .then(|| args.clone());
    let mut result = gate.call(name, args).await;
    if let (Some(args), Err(Refused::Approval { tool, ticket })) = (again, &result)
        && ticket.waiting()
    {
        hold.wait(gate.state(), tool.name.as_str(), ticket).await;
        // Once more through the core path: an approved call runs (or gives its run's
        // result) exactly as an identical retry would; one still waiting is told so.
        result = gate.call(name, args).await;
    }
    match result {
        Err(Refused::UnknownTool(name)) if via_meta => Ok(tool_error(format!(
            "Unknown tool: {name}. Use {} to find the tools you may call.",
            search::SEARCH_TOOLS
        ))),
        Err(Refused::InvalidArguments { tool, violations }) => {
            let text = format!(
                "invalid arguments for {}:\n{}",
                tool.name,
                violations
                    .iter()
                    .map(|v| format!("- {v}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            Ok(tool_error(text))
        }
        Err(Refused::RateLimited { retry_after, .. }) => Ok(rate_limited_call(retry_after)),
        // Read by the model (and its person): which credential is missing, and who sets it.
        Err(Refused::CredentialMissing { message, .. }) => Ok(tool_error(message)),
        Err(Refused::Approval { ticket, .. }) if waits == Waits::Task && ticket.waiting() => {
            Ok(CallToolResponse::Task(approval_task(&ticket)))
        }
        Err(Refused::Approval { ticket, .. })
            if waits == Waits::InputRequired && ticket.waiting() =>
        {
            let sealed =
                crate::service::approvals::seal_state(gate.state(), gate.principal(), ticket.id)
                    .await
                    .map_err(|_| audit_unavailable())?;
            let mut meta = serde_json::Map::new();
            meta.insert(
                "io.toolgate/approval".into(),
                json!({"id": ticket.id, "status": ticket.status, "expires_at": ticket.expires_at}),
            );
            Ok(CallToolResponse::InputRequired(
                rmcp::model::InputRequiredResult::from_request_state(sealed)
                    .with_meta(rmcp::model::MetaObject(meta)),
            ))
        }
        Err(Refused::Approval { tool, ticket }) => Ok(approval_call(tool.name.as_str(), &ticket)),
        Err(r) => Err(refused(r)),
        Ok(done) => Ok(done.outcome.into_mcp_result().into()),
    }
}

/// `search_tools`: BM25 over the caller's visible tools only; the hits' definitions as
/// `structuredContent` and the same JSON as text.
async fn search_tools(
    gate: &Gate<'_>,
    args: &serde_json::Map<String, Value>,
) -> Result<CallToolResponse, McpError> {
    match gate.admit(EventKind::ToolsSearch).await {
        Ok(()) => {}
        Err(Refused::RateLimited { retry_after, .. }) => return Ok(rate_limited_call(retry_after)),
        Err(r) => return Err(refused(r)),
    }
    let request = match search::parse_search(args) {
        Ok(r) => r,
        Err(message) => return Ok(tool_error(message)),
    };
    let visible = gate.visible();
    let hits = gate
        .snapshot()
        .search_index()
        .search(&visible, &request.query, request.limit);
    let body = search::results_body(&hits);
    // What was disclosed, like `tools/list`; not the query, which is the agent's words.
    gate.disclosed(
        EventKind::ToolsSearch,
        Outcome::Success,
        json!({
            "shown": hits.iter().map(|h| h.tool.name.as_str()).collect::<Vec<_>>(),
            "limit": request.limit,
        }),
    );
    let text = body.to_string();
    let mut result = CallToolResult::structured(body);
    result.content = vec![ContentBlock::text(text)];
    Ok(result.into())
}

/// `load_tools`: the full definitions of the named tools the caller may see. A name it may
/// not see is answered exactly as one that does not exist.
async fn load_tools(
    gate: &Gate<'_>,
    args: &serde_json::Map<String, Value>,
) -> Result<CallToolResponse, McpError> {
    match gate.admit(EventKind::ToolsSearch).await {
        Ok(()) => {}
        Err(Refused::RateLimited { retry_after, .. }) => return Ok(rate_limited_call(retry_after)),
        Err(r) => return Err(refused(r)),
    }
    let names = match search::parse_load(args) {
        Ok(n) => n,
        Err(message) => return Ok(tool_error(message)),
    };
    let (mut found, mut not_found) = (Vec::new(), Vec::new());
    for n in names {
        match gate.resolve(&n) {
            Some(t) => found.push(t),
            // Bounded like any outside text: it is echoed to the caller only.
            None => not_found.push(crate::audit::bounded(&n)),
        }
    }
    let body = search::load_body(&found, &not_found);
    gate.disclosed(
        EventKind::ToolsSearch,
        Outcome::Success,
        json!({
            "shown": found.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            "load": true,
        }),
    );
    let text = body.to_string();
    let mut result = CallToolResult::structured(body);
    result.content = vec![ContentBlock::text(text)];
    Ok(result.into())
}

/// Serves the request inside `CALLER`'s scope, so that the SDK's handler factory (which runs
/// in this task) knows who it answers for.
pub async fn with_caller(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match req.extensions().get::<Principal>().cloned() {
        Some(p) => CALLER.scope(p, next.run(req)).await,
        None => next.run(req).await,
    }
}

/// The items of a name-ordered list after the cursor's name, at most `size`; `true` when more
/// follow.
fn page<'a, T>(
    items: &'a [T],
    name: impl Fn(&T) -> &str,
    after: Option<&str>,
    size: usize,
) -> (&'a [T], bool) {
    let start = after.map_or(0, |last| items.partition_point(|t| name(t) <= last));
    let end = start.saturating_add(size).min(items.len());
    (&items[start..end], end < items.len())
}

fn tool_error(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
}
