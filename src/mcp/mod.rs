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
use serde_json::Value;

use crate::app::AppState;
use crate::audit::{AuditEvent, RequestOrigin, kind};
use crate::calls::{self, CallRefused, Surface};
use crate::policy::snapshot::Principal;
use crate::pool::runner::ScriptOutcome;

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
        .with_instructions("Tools served by toolgate. You see only the tools granted to you.")
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let principal = principal(&ctx)?;
        let snapshot = self.state.policy.load();
        if let Some(agent) = snapshot.agent(&principal.agent)
            && let Err(wait) = self.state.limits.check(agent, None)
        {
            let mut e = AuditEvent::new(kind::TOOLS_LIST, "rate_limited")
                .from_origin(origin(&ctx).as_ref());
            e.agent = Some(principal.agent.clone());
            e.client_id = Some(principal.client_id.clone());
            self.state
                .audit
                .record(e)
                .await
                .map_err(|_| audit_unavailable())?;
            return Err(rate_limited(wait));
        }
        let visible = snapshot.visible(&principal);
        let after = match request.and_then(|r| r.cursor).filter(|c| !c.is_empty()) {
            Some(c) => Some(decode_cursor(&c)?),
            None => None,
        };
        let start = match &after {
            Some(last) => visible.partition_point(|t| t.name.as_str() <= last.as_str()),
            None => 0,
        };
        let page_size = self.state.settings.page_size;
        let page: Vec<_> = visible.iter().skip(start).take(page_size).collect();
        let mut result =
            ListToolsResult::with_all_items(page.iter().map(|t| t.mcp_definition()).collect())
                // Filtered per token, and a revoked grant must vanish on the next request.
                .with_ttl_ms(0)
                .with_cache_scope(CacheScope::Private);
        if start + page.len() < visible.len()
            && let Some(last) = page.last()
        {
            result.next_cursor = Some(encode_cursor(last.name.as_str()));
        }
        let mut e = AuditEvent::new(kind::TOOLS_LIST, "success").from_origin(origin(&ctx).as_ref());
        e.agent = Some(principal.agent.clone());
        e.client_id = Some(principal.client_id.clone());
        e.jti = principal.jti.map(|j| j.to_string());
        e.details = Some(
            serde_json::json!({"shown": page.iter().map(|t| t.name.as_str()).collect::<Vec<_>>()})
                .to_string(),
        );
        self.state
            .audit
            .record(e)
            .await
            .map_err(|_| audit_unavailable())?;
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
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = principal(&ctx)?;
        let args = Value::Object(request.arguments.unwrap_or_default());
        let origin = origin(&ctx);
        match calls::call(
            &self.state,
            &principal,
            &request.name,
            args,
            Surface::Mcp,
            origin.as_ref(),
        )
        .await
        {
            Err(CallRefused::RateLimited { retry_after }) => Err(rate_limited(retry_after)),
            Err(CallRefused::AuditUnavailable(_)) => Err(audit_unavailable()),
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
                Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into())
            }
            Ok(done) => Ok(to_result(done.outcome).into()),
        }
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
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(Vec::new())
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
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

/// A JSON object becomes `structuredContent` plus the same JSON as text; other JSON becomes
/// text; a failure becomes `isError` with the text the model needs to retry.
pub fn to_result(outcome: ScriptOutcome) -> CallToolResult {
    match outcome {
        ScriptOutcome::Success { output, .. } => {
            let text = serde_json::to_string(&output).unwrap_or_default();
            if output.is_object() {
                let mut r = CallToolResult::structured(output);
                r.content = vec![ContentBlock::text(text)];
                r
            } else {
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
        }
        failed => CallToolResult::error(vec![ContentBlock::text(
            failed.error_message().unwrap_or_default(),
        )]),
    }
}
