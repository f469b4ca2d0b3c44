//! The pool: tools, groups and their pins, changes held for approval, load errors, upstreams.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{API_ACTOR, ApiError, ApiResult};
use crate::service::{self, ServiceError};
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/tools", get(list_tools))
        .route("/groups", get(list_groups))
        .route("/groups/{name}/pin", put(set_group_pin))
        .route("/tools/pending", get(pending_tools))
        .route("/tools/{name}/approve", post(approve_tool))
        .route("/tools/{name}/reject", post(reject_tool))
        .route("/pool/errors", get(pool_errors))
        .route("/upstreams", get(list_upstreams))
        .route(
            "/upstreams/{name}",
            put(put_upstream).delete(delete_upstream),
        )
}

#[utoipa::path(
    get,
    path = "/api/v1/tools",
    tag = "tools",
    summary = "List tools",
    responses((status = 200, body = serde_json::Value, description = "Every tool of the pool"))
)]
async fn list_tools(State(state): State<AppState>) -> Json<Value> {
    let snapshot = state.policy.load();
    let tools: Vec<Value> = snapshot
        .catalog
        .tools()
        .map(|t| {
            json!({
                "name": t.name, "group": t.group(), "title": t.title, "description": t.description,
                "input_schema": *t.input_schema.read(), "source": t.source, "content_hash": t.content_hash,
                "held": snapshot.is_held(t.name.as_str()),
            })
        })
        .collect();
    Json(json!({"tools": tools}))
}

#[utoipa::path(
    get,
    path = "/api/v1/groups",
    tag = "tools",
    summary = "List groups",
    responses((status = 200, body = serde_json::Value, description = "Tool groups with their metadata"))
)]
async fn list_groups(State(state): State<AppState>) -> Json<Value> {
    let snapshot = state.policy.load();
    Json(json!({"groups": snapshot.catalog.groups().collect::<Vec<_>>()}))
}

#[utoipa::path(
    get,
    path = "/api/v1/pool/errors",
    tag = "tools",
    summary = "Tool folder load errors",
    responses((status = 200, body = serde_json::Value, description = "Groups that failed to load, and why"))
)]
async fn pool_errors(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"errors": state.policy.load().catalog.load_errors()}))
}

#[utoipa::path(
    get,
    path = "/api/v1/tools/pending",
    tag = "tools",
    summary = "List held tools",
    responses((status = 200, body = serde_json::Value, description = "Tools held for approval in pinned groups"))
)]
async fn pending_tools(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    Ok(Json(
        json!({"pending": service::pins::pending(&state).await?}),
    ))
}

/// Which held definition a decision is for; without a hash, the one this instance serves.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    hash: Option<String>,
}

fn decision_body(body: &[u8]) -> Result<DecisionBody, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DecisionBody::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError(ServiceError::Invalid(format!("invalid JSON body: {e}"))))
}

#[utoipa::path(
    post,
    path = "/api/v1/tools/{name}/approve",
    tag = "tools",
    summary = "Approve a held tool",
    params(("name" = String, Path, description = "Tool name, `<group>__<operation>`")),
    request_body = DecisionBody,
    responses((status = 200, body = serde_json::Value, description = "Approved"))
)]
async fn approve_tool(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let body = decision_body(&body)?;
    let d = service::pins::decide(
        &state,
        API_ACTOR,
        &name,
        body.hash.as_deref(),
        crate::db::pins::Verdict::Approve,
    )
    .await?;
    Ok(Json(json!({"approved": d})))
}

#[utoipa::path(
    post,
    path = "/api/v1/tools/{name}/reject",
    tag = "tools",
    summary = "Reject a held tool",
    params(("name" = String, Path, description = "Tool name, `<group>__<operation>`")),
    request_body = DecisionBody,
    responses((status = 200, body = serde_json::Value, description = "Rejected"))
)]
async fn reject_tool(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let body = decision_body(&body)?;
    let d = service::pins::decide(
        &state,
        API_ACTOR,
        &name,
        body.hash.as_deref(),
        crate::db::pins::Verdict::Reject,
    )
    .await?;
    Ok(Json(json!({"rejected": d})))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PinBody {
    /// `true`, `false`, or `null` for the default.
    pin: Option<bool>,
}

#[utoipa::path(
    put,
    path = "/api/v1/groups/{name}/pin",
    tag = "tools",
    summary = "Pin or unpin a group",
    params(("name" = String, Path, description = "Group name")),
    request_body = PinBody,
    responses((status = 200, body = serde_json::Value, description = "The group's pin setting and whether it is pinned"))
)]
async fn set_group_pin(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<PinBody>,
) -> ApiResult<Json<Value>> {
    let name = crate::names::GroupName::parse(&name).map_err(ServiceError::from)?;
    let done = service::pins::set_group_pin(&state, API_ACTOR, &name, body.pin).await?;
    Ok(Json(json!(done)))
}

/// Upstreams with their specs and live health on this instance.
#[utoipa::path(
    get,
    path = "/api/v1/upstreams",
    tag = "tools",
    summary = "List upstreams",
    responses((status = 200, body = serde_json::Value, description = "Upstream MCP servers"))
)]
async fn list_upstreams(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let mut conn = state.db.acquire().await.map_err(ServiceError::from)?;
    let specs = crate::db::upstreams::upstreams(&mut conn)
        .await
        .map_err(ServiceError::from)?;
    let health = state.upstreams.health();
    let list: Vec<Value> = specs
        .into_iter()
        // Write-only like stored credentials: a header or variable whose name says it is a
        // secret is not shown back (`policy export`, which writes the config, keeps it).
        .map(|(name, spec)| {
            let spec = crate::upstream::on_record(&serde_json::to_value(&spec).unwrap_or_default());
            json!({"name": name, "spec": spec, "health": health.get(&name)})
        })
        .collect();
    Ok(Json(json!({"upstreams": list})))
}

#[utoipa::path(
    put,
    path = "/api/v1/upstreams/{name}",
    tag = "tools",
    summary = "Add or replace an upstream",
    params(("name" = String, Path, description = "Group name")),
    request_body = serde_json::Value,
    responses((status = 200, body = serde_json::Value, description = "Stored and connected"))
)]
async fn put_upstream(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(spec): Json<crate::upstream::UpstreamSpec>,
) -> ApiResult<StatusCode> {
    let name = crate::names::GroupName::parse(&name).map_err(ServiceError::from)?;
    service::upstreams::set(&state, API_ACTOR, &name, spec).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/api/v1/upstreams/{name}",
    tag = "tools",
    summary = "Remove an upstream",
    params(("name" = String, Path, description = "Group name")),
    responses((status = 204, description = "Removed"))
)]
async fn delete_upstream(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    service::upstreams::delete(&state, API_ACTOR, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
