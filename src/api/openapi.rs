//! The admin API's OpenAPI 3.1 document, served at `/api/v1/openapi.json`: generated from the
//! handlers' own annotations, so a route cannot exist without its entry (a test compares the
//! document with the router's routes).

use axum::Json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use super::{agents, audit, clients, credentials, tools, users};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "toolgate admin API",
        description = "Agents, grants, argument rules, rate limits, OAuth clients, people, tool approvals and the audit log. Every request carries the admin token: `Authorization: Bearer $TOOLGATE_ADMIN_TOKEN`. Errors are `{\"error\": \"...\"}` with a status that says which kind."
    ),
    paths(
        agents::list_agents,
        agents::create_agent,
        agents::get_agent,
        agents::delete_agent,
        agents::add_grant,
        agents::remove_grant,
        agents::put_arguments,
        agents::delete_arguments,
        agents::put_approval,
        agents::delete_approval,
        agents::list_approvals,
        credentials::put_agent_credential,
        credentials::delete_agent_credential,
        credentials::list_agent_credentials,
        credentials::put_person_credential,
        credentials::delete_person_credential,
        credentials::list_person_credentials,
        credentials::put_shared_credential,
        credentials::delete_shared_credential,
        credentials::list_shared_credentials,
        agents::get_approval,
        agents::approve,
        agents::deny,
        agents::preview_grant,
        agents::put_agent_user,
        agents::delete_agent_user,
        agents::get_limits,
        agents::set_limits,
        clients::list_clients,
        clients::create_client,
        clients::delete_client,
        clients::list_public_clients,
        clients::put_public_client,
        clients::approve_public_client,
        clients::delete_public_client,
        clients::list_authorizations,
        clients::revoke_authorization,
        clients::revoke_token,
        tools::list_tools,
        tools::list_groups,
        tools::pool_errors,
        tools::pending_tools,
        tools::approve_tool,
        tools::reject_tool,
        tools::set_group_pin,
        tools::list_upstreams,
        tools::put_upstream,
        tools::delete_upstream,
        users::list_users,
        users::create_user,
        users::get_user,
        users::delete_user,
        users::set_user_role,
        users::set_approver_sets,
        users::disable_user,
        users::enable_user,
        users::reset_user_password,
        users::user_sessions,
        users::end_user_sessions,
        users::end_user_session,
        audit::list_audit,
        audit::get_audit,
        audit::export_audit
    ),
    components(schemas(ErrorBody)),
    modifiers(&Conventions),
    security(("admin_token" = [])),
    tags(
        (name = "agents", description = "Agents, the people who may act as them, their rate limits"),
        (name = "grants", description = "Grants and argument rules"),
        (name = "approvals", description = "Calls that wait for a person: approval rules, requests and decisions"),
        (name = "clients", description = "OAuth clients, host registrations and authorizations, token revocation"),
        (name = "tools", description = "The tool pool, groups, pins and held tools, upstream MCP servers"),
        (name = "users", description = "People of the admin UI and hosts"),
        (name = "credentials", description = "Values for tool groups' credential slots, per agent, per person or shared: write-only, encrypted at rest"),
        (name = "audit", description = "The audit log: read and export (each read is itself on record)"),
    )
)]
struct ApiDoc;

/// Every error answer's body.
#[derive(ToSchema)]
#[allow(dead_code)]
struct ErrorBody {
    /// What is wrong, for a person to read.
    error: String,
}

/// The audit log's filters (`GET /audit`); the same apply to the export.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct AuditParams {
    /// From this instant (RFC 3339).
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Before this instant (RFC 3339).
    until: Option<chrono::DateTime<chrono::Utc>>,
    agent: Option<String>,
    tool: Option<String>,
    /// An event type, e.g. `tool.result`, `auth.denied`, `admin.change`.
    event_type: Option<String>,
    /// An outcome, e.g. `success`, `denied`, `tool_error`, `rate_limited`.
    outcome: Option<String>,
    /// A person: what hosts did for them and what they did themselves.
    person: Option<String>,
    /// One OAuth client.
    client_id: Option<String>,
    /// Only events that took at least this many milliseconds (tool calls, upstream requests).
    min_latency_ms: Option<i64>,
    /// Cursor: only events with a smaller id (the previous page's `next_before`).
    before: Option<i64>,
    /// Incremental cursor: only events committed after this one, oldest first (the previous
    /// page's `next_after`). Never skips a row another instance committed late.
    after_id: Option<i64>,
    /// Page size, 1 to 500 (50 by default).
    limit: Option<i64>,
}

/// The export's format and filters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ExportParams {
    /// `csv`, `jsonl`, `ocsf` (OCSF 1.8.0 JSON lines) or `cef` (ArcSight CEF lines).
    format: String,
    since: Option<chrono::DateTime<chrono::Utc>>,
    until: Option<chrono::DateTime<chrono::Utc>>,
    agent: Option<String>,
    tool: Option<String>,
    event_type: Option<String>,
    outcome: Option<String>,
    person: Option<String>,
    client_id: Option<String>,
    min_latency_ms: Option<i64>,
    /// Only events committed after this one (a JSONL export's `next_after_id`).
    after_id: Option<i64>,
}

/// What holds for every operation, said once: the bearer admin token, and the error answers.
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token (`--admin-token` / `TOOLGATE_ADMIN_TOKEN`)",
                    ))
                    .build(),
            ),
        );
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in doc.paths.paths.values_mut() {
            let ops: [&mut Option<Operation>; 4] = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                let answers = &mut op.responses.responses;
                for (code, text) in [
                    (
                        "400",
                        "The request is invalid: a bad name, body or parameter",
                    ),
                    ("401", "No admin token, or not the right one"),
                    ("404", "What the path names does not exist"),
                    (
                        "409",
                        "It conflicts with what exists, or the agent or group is managed by files",
                    ),
                    (
                        "429",
                        "Too many failed admin token checks from this address (`Retry-After`)",
                    ),
                ] {
                    answers
                        .entry(code.to_owned())
                        .or_insert_with(|| error(text).into());
                }
            }
        }
    }
}

/// `GET /api/v1/openapi.json`.
pub(super) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// The document, for tests and `toolgate` subcommands.
pub fn document_value() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
