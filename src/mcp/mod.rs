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

use crate::app::AppState;
use crate::audit::{AuditEvent, RequestOrigin, kind};
use crate::calls::{self, CallRefused, Surface};
use crate::policy::snapshot::{Discovery, PolicySnapshot, Principal};
use crate::search;

pub mod apps;

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
    let service = StreamableHttpService::new(
        move || {
            Ok(Gateway {
                state: handler_state.clone(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
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

/// One `ServerHandler` per request; it holds only the shared state.
#[derive(Clone)]
pub struct Gateway {
    state: AppState,
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

/// JSON-RPC error code for a rate-limited request (outside the reserved -32768..-32000).
pub const RATE_LIMITED: i32 = 429;

fn rate_limited(retry_after: std::time::Duration) -> McpError {
    let ms = retry_after.as_millis().max(1) as u64;
    McpError::new(
        rmcp::model::ErrorCode(RATE_LIMITED),
        format!("rate limited: retry after {ms} ms"),
        Some(serde_json::json!({"retry_after_ms": ms})),
    )
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
                .enable_prompts()
                .enable_resources()
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
        let principal = principal(&ctx)?;
        let origin = origin(&ctx);
        let snapshot = self.state.policy.load();
        self.check_agent_limit(&snapshot, &principal, kind::TOOLS_LIST, origin.as_ref())
            .await?;
        let visible = snapshot.visible(&principal);
        let after = match request.and_then(|r| r.cursor).filter(|c| !c.is_empty()) {
            Some(c) => Some(decode_cursor(&c)?),
            None => None,
        };
        let page_size = self.state.settings.page_size;
        let discovery =
            snapshot.effective_discovery(&principal, self.state.settings.search_token_budget);
        let (tools, more) = if discovery == Discovery::Search {
            let pinned = snapshot
                .agent(&principal.agent)
                .map(|a| a.record.pinned.as_slice())
                .unwrap_or_default();
            let listed = search::search_listing(pinned, &visible);
            let (p, more) = page(&listed, |t| &t.name, after.as_deref(), page_size);
            (p.to_vec(), more)
        } else {
            let (p, more) = page(&visible, |t| t.name.as_str(), after.as_deref(), page_size);
            (p.iter().map(|t| t.mcp_definition()).collect(), more)
        };
        let shown: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        let mut result = ListToolsResult::with_all_items(tools)
            // Filtered per token, and a revoked grant must vanish on the next request.
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private);
        if more && let Some(last) = shown.last() {
            result.next_cursor = Some(encode_cursor(last));
        }
        let mut e = AuditEvent::new(kind::TOOLS_LIST, "success").from_origin(origin.as_ref());
        e.agent = Some(principal.agent.clone());
        e.client_id = Some(principal.client_id.clone());
        e.jti = principal.jti.map(|j| j.to_string());
        e.details = Some(json!({"shown": shown, "discovery": discovery.as_str()}).to_string());
        // A list runs nothing: its event is queued in the same group-commit writer but the list
        // does not wait for the commit (a call does). Listing stays sub-millisecond.
        self.state.audit.record_detached(e);
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        // Used by the SDK only for `Mcp-Param-*` header checks; authorization is in call_tool.
        self.state
            .policy
            .load()
            .catalog
            .get(name)
            .map(|t| t.mcp_definition())
            .or_else(|| search::meta_tool(name).cloned())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = principal(&ctx)?;
        let origin = origin(&ctx);
        if search::is_meta_tool(&request.name) {
            let snapshot = self.state.policy.load();
            // The meta-tools exist for agents configured for search or auto (even while auto
            // lists in full, so that a client holding a list from before a grant change still
            // works); a `full` agent has none, and calling one is calling an unknown tool.
            let searches = snapshot
                .agent(&principal.agent)
                .is_some_and(|a| a.record.discovery != Discovery::Full);
            if searches {
                let args = request.arguments.unwrap_or_default();
                return if request.name == search::SEARCH_TOOLS {
                    self.search_tools(&snapshot, &principal, &args, origin.as_ref())
                        .await
                } else {
                    drop(snapshot);
                    match search::parse_call(&args) {
                        Ok(c) => {
                            self.call(&principal, &c.name, c.arguments, origin.as_ref(), true)
                                .await
                        }
                        Err(message) => Ok(tool_error(message)),
                    }
                };
            }
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        self.call(&principal, &request.name, args, origin.as_ref(), false)
            .await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(Vec::new())
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let principal = principal(&ctx)?;
        let resources = apps::resources(&self.state.policy.load(), &principal);
        Ok(ListResourcesResult::with_all_items(resources)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        // The gateway serves no prompts; the list is advertised (empty) for caching clients.
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
        let principal = principal(&ctx)?;
        let result = apps::read(&self.state, &principal, &request.uri).await?;
        Ok(result
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private)
            .into())
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, McpError> {
        ctx.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        self.advertise_apps(&mut info, &ctx);
        Ok(info)
    }

    async fn discover(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, McpError> {
        let mut info = self.get_info();
        self.advertise_apps(&mut info, &ctx);
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(Vec::new())
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }
}

impl Gateway {
    /// Advertises the MCP Apps extension to a caller that can see a tool with a UI.
    fn advertise_apps(&self, info: &mut ServerConfig, ctx: &RequestContext<RoleServer>) {
        let Ok(principal) = principal(ctx) else {
            return;
        };
        if apps::visible_ui(&self.state.policy.load(), &principal).is_empty() {
            return;
        }
        let mut ui = serde_json::Map::new();
        ui.insert("mimeTypes".into(), json!([apps::UI_MIME]));
        info.capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(apps::UI_EXTENSION.to_owned(), ui);
    }
    /// Takes one request from the agent's own limits (not a tool's); refused requests are
    /// audited as `event_type`.
    async fn check_agent_limit(
        &self,
        snapshot: &PolicySnapshot,
        principal: &Principal,
        event_type: &str,
        origin: Option<&RequestOrigin>,
    ) -> Result<(), McpError> {
        let Some(agent) = snapshot.agent(&principal.agent) else {
            return Ok(());
        };
        let Err(wait) = self.state.limits.check(agent, None) else {
            return Ok(());
        };
        let mut e = AuditEvent::new(event_type, "rate_limited").from_origin(origin);
        e.agent = Some(principal.agent.clone());
        e.client_id = Some(principal.client_id.clone());
        self.state
            .audit
            .record(e)
            .await
            .map_err(|_| audit_unavailable())?;
        Err(rate_limited(wait))
    }

    /// A tool call, direct or through `call_tool` (`via_meta`): always the shared call path,
    /// so grants, limits, validation and audit are the same either way. Through `call_tool` an
    /// unknown name is the meta-tool's error (the model reads it), not a protocol error.
    async fn call(
        &self,
        principal: &Principal,
        name: &str,
        args: Value,
        origin: Option<&RequestOrigin>,
        via_meta: bool,
    ) -> Result<CallToolResponse, McpError> {
        match calls::call(&self.state, principal, name, args, Surface::Mcp, origin).await {
            Err(CallRefused::RateLimited { retry_after }) => Err(rate_limited(retry_after)),
            Err(CallRefused::AuditUnavailable(_)) => Err(audit_unavailable()),
            Err(CallRefused::UnknownTool(name)) if via_meta => Ok(tool_error(format!(
                "Unknown tool: {name}. Use {} to find the tools you may call.",
                search::SEARCH_TOOLS
            ))),
            Err(CallRefused::UnknownTool(name)) => Err(McpError::invalid_params(
                format!("Unknown tool: {name}"),
                None,
            )),
            Err(CallRefused::InvalidArguments { tool, violations }) => {
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
            Ok(done) => Ok(done.outcome.into_mcp_result().into()),
        }
    }

    /// `search_tools`: BM25 over the caller's visible tools only; the hits' definitions as
    /// `structuredContent` and the same JSON as text.
    async fn search_tools(
        &self,
        snapshot: &PolicySnapshot,
        principal: &Principal,
        args: &serde_json::Map<String, Value>,
        origin: Option<&RequestOrigin>,
    ) -> Result<CallToolResponse, McpError> {
        self.check_agent_limit(snapshot, principal, search::TOOLS_SEARCH, origin)
            .await?;
        let request = match search::parse_search(args) {
            Ok(r) => r,
            Err(message) => return Ok(tool_error(message)),
        };
        let visible = snapshot.visible(principal);
        let hits = snapshot
            .search_index()
            .search(&visible, &request.query, request.limit);
        let body = search::results_body(&hits);
        // What was disclosed, like `tools/list`; not the query, which is the agent's words.
        let mut e = AuditEvent::new(search::TOOLS_SEARCH, "success").from_origin(origin);
        e.agent = Some(principal.agent.clone());
        e.client_id = Some(principal.client_id.clone());
        e.jti = principal.jti.map(|j| j.to_string());
        e.details = Some(
            json!({
                "shown": hits.iter().map(|h| h.tool.name.as_str()).collect::<Vec<_>>(),
                "limit": request.limit,
            })
            .to_string(),
        );
        self.state
            .audit
            .record(e)
            .await
            .map_err(|_| audit_unavailable())?;
        let text = body.to_string();
        let mut result = CallToolResult::structured(body);
        result.content = vec![ContentBlock::text(text)];
        Ok(result.into())
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
