//! Agents and what they are given: grants, argument rules, the people they act for, rate limits.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{API_ACTOR, ApiResult};
use crate::service::{self, ServiceError};
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/agents", get(list_agents).post(create_agent))
        .route("/agents/{name}", get(get_agent).delete(delete_agent))
        .route("/agents/{name}/grants", post(add_grant))
        .route("/agents/{name}/grants/{target}", delete(remove_grant))
        .route(
            "/agents/{name}/arguments/{target}",
            put(put_arguments).delete(delete_arguments),
        )
        .route(
            "/agents/{name}/approval/{target}",
            put(put_approval).delete(delete_approval),
        )
        .route("/approvals", get(list_approvals))
        .route("/approvals/{id}", get(get_approval))
        .route("/approvals/{id}/approve", post(approve))
        .route("/approvals/{id}/deny", post(deny))
        .route(
            "/agents/{name}/users/{username}",
            put(put_agent_user).delete(delete_agent_user),
        )
        .route(
            "/agents/{name}/rate-limits",
            get(get_limits).put(set_limits),
        )
        .route("/grants/preview", get(preview_grant))
}

#[utoipa::path(
    get,
    path = "/api/v1/agents",
    tag = "agents",
    summary = "List agents",
    responses((status = 200, body = serde_json::Value, description = "Every agent with its grants, matched tools, problems and limits"))
)]
async fn list_agents(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let snapshot = state.policy.load();
    let mut agents = service::agents::summaries(&snapshot);
    for a in agents.iter_mut().filter(|a| !a.approvals.is_empty()) {
        a.approval_problems = service::approvals::problems(&state, &a.name).await?;
    }
    for a in agents.iter_mut() {
        if let Some(view) = snapshot.agent(&a.name) {
            a.credential_problems = service::credentials::problems(&state, view);
        }
    }
    Ok(Json(json!({"agents": agents})))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewAgent {
    name: String,
    #[serde(default)]
    description: String,
    discovery: Option<String>,
}

#[utoipa::path(
    post,
    path = "/api/v1/agents",
    tag = "agents",
    summary = "Create an agent",
    request_body = NewAgent,
    responses((status = 201, body = serde_json::Value, description = "Created"))
)]
async fn create_agent(
    State(state): State<AppState>,
    Json(body): Json<NewAgent>,
) -> ApiResult<Response> {
    let name = crate::names::AgentName::parse(&body.name).map_err(ServiceError::from)?;
    service::agents::create(
        &state,
        API_ACTOR,
        &name,
        &body.description,
        body.discovery.as_deref(),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(json!({"name": body.name}))).into_response())
}

#[utoipa::path(
    get,
    path = "/api/v1/agents/{name}",
    tag = "agents",
    summary = "Show an agent",
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 200, body = serde_json::Value, description = "The agent, the tools it sees and what its tools/list costs in tokens"))
)]
async fn get_agent(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let snapshot = state.policy.load();
    let mut summary = service::agents::summaries(&snapshot)
        .into_iter()
        .find(|a| a.name == name)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{name}`")))?;
    summary.approval_problems = service::approvals::problems(&state, &name).await?;
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{name}`")))?;
    summary.credential_problems = service::credentials::problems(&state, agent);
    let tools: Vec<&str> = agent.visible.iter().map(|t| t.name.as_str()).collect();
    // What its tools/list costs (its visible tools against the whole pool) and so how it is
    // served: `auto` resolved against the search token budget.
    let tokens = crate::search::agent_tokens(&snapshot, agent, state.settings.budgets());
    Ok(Json(
        json!({"agent": summary, "tools": tools, "tokens": tokens}),
    ))
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}",
    tag = "agents",
    summary = "Delete an agent",
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 204, description = "Deleted, with its grants, limits and clients"))
)]
async fn delete_agent(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    service::agents::delete(&state, API_ACTOR, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewGrant {
    target: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/agents/{name}/grants",
    tag = "grants",
    summary = "Add a grant",
    params(("name" = String, Path, description = "Agent name")),
    request_body = NewGrant,
    responses((status = 201, body = serde_json::Value, description = "Added; `matched_tools`, `warning` (zero match) and `reaches` say what it does"))
)]
async fn add_grant(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<NewGrant>,
) -> ApiResult<Response> {
    let target = crate::policy::GrantTarget::parse(&body.target).map_err(ServiceError::Invalid)?;
    let added = service::grants::add(&state, API_ACTOR, &name, &target).await?;
    Ok((StatusCode::CREATED, Json(added)).into_response())
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}/grants/{target}",
    tag = "grants",
    summary = "Remove a grant",
    params(("name" = String, Path, description = "Agent name"), ("target" = String, Path, description = "A group name or an exact tool name")),
    responses((status = 204, description = "Removed: live on the agent's next request"))
)]
async fn remove_grant(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::grants::remove(&state, API_ACTOR, &name, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /agents/<agent>/arguments/<tool-or-group>` with `{"param": {rule}, ...}`.
#[utoipa::path(
    put,
    path = "/api/v1/agents/{name}/arguments/{target}",
    tag = "grants",
    summary = "Set argument rules on a tool or group",
    params(("name" = String, Path, description = "Agent name"), ("target" = String, Path, description = "A group name or an exact tool name")),
    request_body = serde_json::Value,
    responses((status = 200, body = serde_json::Value, description = "Set; `problems` lists what the rules cannot do"))
)]
async fn put_arguments(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<service::arguments::ArgumentsSet>> {
    Ok(Json(
        service::arguments::set(&state, API_ACTOR, &name, &target, &body).await?,
    ))
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}/arguments/{target}",
    tag = "grants",
    summary = "Remove argument rules",
    params(("name" = String, Path, description = "Agent name"), ("target" = String, Path, description = "A group name or an exact tool name")),
    responses((status = 204, description = "Removed"))
)]
async fn delete_arguments(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::arguments::delete(&state, API_ACTOR, &name, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct PreviewQuery {
    target: String,
}

#[utoipa::path(
    get,
    path = "/api/v1/grants/preview",
    tag = "grants",
    summary = "Preview a grant",
    params(("target" = String, Query, description = "A group name or an exact tool name")),
    responses((status = 200, body = serde_json::Value, description = "The tools it would match and, when none, suggestions"))
)]
async fn preview_grant(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<PreviewQuery>,
) -> ApiResult<Json<Value>> {
    let (matched, suggestions) = service::grants::preview(&state.policy.load(), &q.target)?;
    Ok(Json(
        json!({"target": q.target, "matched_tools": matched.len(), "tools": matched, "suggestions": suggestions}),
    ))
}

#[utoipa::path(
    put,
    path = "/api/v1/agents/{name}/users/{username}",
    tag = "agents",
    summary = "Let a person act as an agent",
    params(("name" = String, Path, description = "Agent name"), ("username" = String, Path, description = "Username of a person")),
    responses((status = 204, description = "The person may act as the agent through a host"))
)]
async fn put_agent_user(
    State(state): State<AppState>,
    Path((name, username)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let username = crate::names::Username::parse(&username).map_err(ServiceError::from)?;
    service::agents::add_user(&state, API_ACTOR, &name, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}/users/{username}",
    tag = "agents",
    summary = "Stop a person acting as an agent",
    params(("name" = String, Path, description = "Agent name"), ("username" = String, Path, description = "Username of a person")),
    responses((status = 204, description = "Removed; their host authorizations for the agent are revoked"))
)]
async fn delete_agent_user(
    State(state): State<AppState>,
    Path((name, username)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::agents::remove_user(&state, API_ACTOR, &name, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/api/v1/agents/{name}/rate-limits",
    tag = "agents",
    summary = "Show rate limits",
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 200, body = serde_json::Value, description = "`rate_limits`: the agent's limits"))
)]
async fn get_limits(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let snapshot = state.policy.load();
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{name}`")))?;
    Ok(Json(json!({"rate_limits": agent.record.limits})))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct LimitsBody {
    /// Each `{"pattern": <group or tool, absent for the whole agent>, "per_second" | "per_minute" | "per_hour": <rate>, "burst": <n>}`.
    #[schema(value_type = Vec<Object>)]
    rate_limits: Vec<crate::policy::snapshot::RateLimitRecord>,
}

#[utoipa::path(
    put,
    path = "/api/v1/agents/{name}/rate-limits",
    tag = "agents",
    summary = "Replace rate limits",
    params(("name" = String, Path, description = "Agent name")),
    request_body = LimitsBody,
    responses((status = 200, body = serde_json::Value, description = "The limits as stored"))
)]
async fn set_limits(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<LimitsBody>,
) -> ApiResult<Json<Value>> {
    service::agents::set_limits(&state, API_ACTOR, &name, body.rate_limits).await?;
    get_limits(State(state), Path(name)).await
}

/// `PUT /agents/<agent>/approval/<tool-group-or-@destructive>` with
/// `{"when": {...}, "approvers": [...], "ttl": "1h"}`.
#[utoipa::path(
    put,
    path = "/api/v1/agents/{name}/approval/{target}",
    tag = "approvals",
    summary = "Require approval for calls of a tool, a group, or every destructive tool",
    params(("name" = String, Path, description = "Agent name"), ("target" = String, Path, description = "A group name, an exact tool name, or @destructive")),
    request_body = serde_json::Value,
    responses((status = 200, body = serde_json::Value, description = "Set; `problems` lists a rule that never triggers or that nobody can decide"))
)]
async fn put_approval(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<service::approvals::RuleSet>> {
    Ok(Json(
        service::approvals::set_rule(&state, API_ACTOR, &name, &target, &body).await?,
    ))
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}/approval/{target}",
    tag = "approvals",
    summary = "Remove an approval rule",
    params(("name" = String, Path, description = "Agent name"), ("target" = String, Path, description = "A group name, an exact tool name, or @destructive")),
    responses((status = 204, description = "Removed"))
)]
async fn delete_approval(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::approvals::delete_rule(&state, API_ACTOR, &name, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ApprovalQuery {
    /// `pending`, `granted`, `denied`, `expired`, `running`, `done` or `failed`.
    state: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/approvals",
    tag = "approvals",
    summary = "List approval requests",
    params(ApprovalQuery),
    responses((status = 200, body = serde_json::Value, description = "Requests, newest first (at most 500)"))
)]
async fn list_approvals(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<ApprovalQuery>,
) -> ApiResult<Json<Value>> {
    let rows = service::approvals::list(&state, q.state.as_deref()).await?;
    Ok(Json(json!({"approvals": rows})))
}

fn approval_id(id: &str) -> Result<uuid::Uuid, ServiceError> {
    uuid::Uuid::parse_str(id).map_err(|_| ServiceError::NotFound(format!("approval {id}")))
}

#[utoipa::path(
    get,
    path = "/api/v1/approvals/{id}",
    tag = "approvals",
    summary = "Show an approval request",
    params(("id" = String, Path, description = "The request's id")),
    responses((status = 200, body = serde_json::Value, description = "The request, its binding and what became of it; `definition`: the tool's definition the call was made against and its diff against the one a call of this tool was last approved against"))
)]
async fn get_approval(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let row = service::approvals::get(&state, approval_id(&id)?).await?;
    let review = service::approvals::review(&state, std::slice::from_ref(&row))
        .await?
        .remove(&row.id);
    Ok(Json(json!({"approval": row, "definition": review})))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
struct Decision {
    #[serde(default)]
    reason: Option<String>,
}

/// The body is optional (`{"reason": "..."}`): an empty one decides without a reason.
async fn decide(
    state: &AppState,
    id: &str,
    approve: bool,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice::<Decision>(&body)
            .map_err(|e| {
                ServiceError::Invalid(format!("the body must be {{\"reason\": \"...\"}}: {e}"))
            })?
            .reason
    };
    let row = crate::gate::decide(
        state,
        &service::approvals::Decider::AdminToken,
        approval_id(id)?,
        approve,
        reason.as_deref(),
    )
    .await?;
    Ok(Json(json!({"approval": row})))
}

#[utoipa::path(
    post,
    path = "/api/v1/approvals/{id}/approve",
    tag = "approvals",
    summary = "Approve a pending request: the call runs once",
    params(("id" = String, Path, description = "The request's id")),
    request_body = Decision,
    responses((status = 200, body = serde_json::Value, description = "Granted"), (status = 409, description = "Not pending any more"))
)]
async fn approve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    decide(&state, &id, true, body).await
}

#[utoipa::path(
    post,
    path = "/api/v1/approvals/{id}/deny",
    tag = "approvals",
    summary = "Deny a pending request: the call never runs",
    params(("id" = String, Path, description = "The request's id")),
    request_body = Decision,
    responses((status = 200, body = serde_json::Value, description = "Denied"), (status = 409, description = "Not pending any more"))
)]
async fn deny(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    decide(&state, &id, false, body).await
}
