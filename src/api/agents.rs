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
            "/agents/{name}/users/{username}",
            put(put_agent_user).delete(delete_agent_user),
        )
        .route(
            "/agents/{name}/rate-limits",
            get(get_limits).put(set_limits),
        )
        .route("/grants/preview", get(preview_grant))
}

async fn list_agents(State(state): State<AppState>) -> Json<Value> {
    let snapshot = state.policy.load();
    Json(json!({"agents": service::agents::summaries(&snapshot)}))
}

#[derive(Deserialize)]
struct NewAgent {
    name: String,
    #[serde(default)]
    description: String,
    discovery: Option<String>,
}

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

async fn get_agent(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let snapshot = state.policy.load();
    let summary = service::agents::summaries(&snapshot)
        .into_iter()
        .find(|a| a.name == name)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{name}`")))?;
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{name}`")))?;
    let tools: Vec<&str> = agent.visible.iter().map(|t| t.name.as_str()).collect();
    // What its tools/list costs (its visible tools against the whole pool) and so how it is
    // served: `auto` resolved against the search token budget.
    let tokens = crate::search::agent_tokens(&snapshot, agent, state.settings.search_token_budget);
    Ok(Json(
        json!({"agent": summary, "tools": tools, "tokens": tokens}),
    ))
}

async fn delete_agent(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    service::agents::delete(&state, API_ACTOR, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct NewGrant {
    target: String,
}

async fn add_grant(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<NewGrant>,
) -> ApiResult<Response> {
    let target = crate::policy::GrantTarget::parse(&body.target).map_err(ServiceError::Invalid)?;
    let added = service::grants::add(&state, API_ACTOR, &name, &target).await?;
    Ok((StatusCode::CREATED, Json(added)).into_response())
}

async fn remove_grant(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::grants::remove(&state, API_ACTOR, &name, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /agents/<agent>/arguments/<tool-or-group>` with `{"param": {rule}, ...}`.
async fn put_arguments(
    State(state): State<AppState>,
    Path((name, target)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<service::arguments::ArgumentsSet>> {
    Ok(Json(
        service::arguments::set(&state, API_ACTOR, &name, &target, &body).await?,
    ))
}

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

async fn preview_grant(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<PreviewQuery>,
) -> ApiResult<Json<Value>> {
    let (matched, suggestions) = service::grants::preview(&state.policy.load(), &q.target)?;
    Ok(Json(
        json!({"target": q.target, "matched_tools": matched.len(), "tools": matched, "suggestions": suggestions}),
    ))
}

async fn put_agent_user(
    State(state): State<AppState>,
    Path((name, username)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let username = crate::names::Username::parse(&username).map_err(ServiceError::from)?;
    service::agents::add_user(&state, API_ACTOR, &name, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_agent_user(
    State(state): State<AppState>,
    Path((name, username)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    service::agents::remove_user(&state, API_ACTOR, &name, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

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

#[derive(Deserialize)]
struct LimitsBody {
    rate_limits: Vec<crate::policy::snapshot::RateLimitRecord>,
}

async fn set_limits(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<LimitsBody>,
) -> ApiResult<Json<Value>> {
    service::agents::set_limits(&state, API_ACTOR, &name, body.rate_limits).await?;
    get_limits(State(state), Path(name)).await
}
