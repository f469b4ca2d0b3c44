//! People's accounts for the admin UI and host sign-in: roles, disabling, resets, sessions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{API_ACTOR, ApiResult};
use crate::service::ServiceError;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/users", get(list_users).post(create_user))
        .route("/users/{username}", get(get_user).delete(delete_user))
        .route("/users/{username}/role", put(set_user_role))
        .route("/users/{username}/approver-sets", put(set_approver_sets))
        .route("/users/{username}/disable", post(disable_user))
        .route("/users/{username}/enable", post(enable_user))
        .route(
            "/users/{username}/password-reset",
            post(reset_user_password),
        )
        .route(
            "/users/{username}/sessions",
            get(user_sessions).delete(end_user_sessions),
        )
        .route("/users/{username}/sessions/{id}", delete(end_user_session))
}

fn user_json(a: &crate::db::accounts::Account) -> Value {
    json!({
        "username": a.username,
        "role": a.role,
        "disabled": a.disabled,
        "sign_in": if a.oidc_issuer.is_some() { "oidc" } else { "password" },
        "oidc_issuer": a.oidc_issuer,
        "created_at": a.created_at,
        "last_sign_in_at": a.last_sign_in_at,
        "sessions": a.sessions,
        "approver_sets": a.approver_sets,
    })
}

#[utoipa::path(
    get,
    path = "/api/v1/users",
    tag = "users",
    summary = "List people",
    responses((status = 200, body = serde_json::Value, description = "Accounts of the admin UI"))
)]
async fn list_users(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let users = crate::service::accounts::list(&state).await?;
    Ok(Json(
        json!({"users": users.iter().map(user_json).collect::<Vec<_>>()}),
    ))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewUser {
    username: String,
    password: String,
    role: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/users",
    tag = "users",
    summary = "Create a person",
    request_body = NewUser,
    responses((status = 201, body = serde_json::Value, description = "Created"))
)]
async fn create_user(
    State(state): State<AppState>,
    Json(body): Json<NewUser>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    crate::service::accounts::create(
        &state.db,
        API_ACTOR,
        &body.username,
        &body.password,
        &body.role,
    )
    .await?;
    let user = crate::service::accounts::get(&state, &body.username).await?;
    Ok((StatusCode::CREATED, Json(user_json(&user))))
}

#[utoipa::path(
    get,
    path = "/api/v1/users/{username}",
    tag = "users",
    summary = "Show a person",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 200, body = serde_json::Value, description = "The person"))
)]
async fn get_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(user_json(
        &crate::service::accounts::get(&state, &username).await?,
    )))
}

#[utoipa::path(
    delete,
    path = "/api/v1/users/{username}",
    tag = "users",
    summary = "Delete a person",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 204, description = "Deleted; their sessions and host authorizations end"))
)]
async fn delete_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<StatusCode> {
    crate::service::accounts::delete(&state, API_ACTOR, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct RoleBody {
    role: String,
}

#[utoipa::path(
    put,
    path = "/api/v1/users/{username}/role",
    tag = "users",
    summary = "Set a person's role",
    params(("username" = String, Path, description = "Username of a person")),
    request_body = RoleBody,
    responses((status = 200, body = serde_json::Value, description = "The person"))
)]
async fn set_user_role(
    State(state): State<AppState>,
    Path(username): Path<String>,
    Json(body): Json<RoleBody>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_role(&state, API_ACTOR, &username, &body.role).await?;
    get_user(State(state), Path(username)).await
}

#[derive(Deserialize, utoipa::ToSchema)]
struct ApproverSetsBody {
    /// The approver sets this person belongs to (`finance`, `release-managers`), beside their
    /// role; an approval rule's `approvers` names roles or sets.
    sets: Vec<String>,
}

#[utoipa::path(
    put,
    path = "/api/v1/users/{username}/approver-sets",
    tag = "users",
    summary = "Set the approver sets a person belongs to",
    params(("username" = String, Path, description = "Username of a person")),
    request_body = ApproverSetsBody,
    responses((status = 200, body = serde_json::Value, description = "The person"))
)]
async fn set_approver_sets(
    State(state): State<AppState>,
    Path(username): Path<String>,
    Json(body): Json<ApproverSetsBody>,
) -> ApiResult<Json<Value>> {
    crate::service::approvals::set_approver_sets(&state, API_ACTOR, &username, &body.sets).await?;
    get_user(State(state), Path(username)).await
}

#[utoipa::path(
    post,
    path = "/api/v1/users/{username}/disable",
    tag = "users",
    summary = "Disable a person",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 200, body = serde_json::Value, description = "The person"))
)]
async fn disable_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_disabled(&state, API_ACTOR, &username, true).await?;
    get_user(State(state), Path(username)).await
}

#[utoipa::path(
    post,
    path = "/api/v1/users/{username}/enable",
    tag = "users",
    summary = "Enable a person",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 200, body = serde_json::Value, description = "The person"))
)]
async fn enable_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_disabled(&state, API_ACTOR, &username, false).await?;
    get_user(State(state), Path(username)).await
}

#[utoipa::path(
    post,
    path = "/api/v1/users/{username}/password-reset",
    tag = "users",
    summary = "Make a password reset link",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 201, body = serde_json::Value, description = "A one-time reset link"))
)]
async fn reset_user_password(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (token, expires) =
        crate::service::accounts::reset_link(&state, API_ACTOR, &username).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "reset_url": crate::service::accounts::reset_url(&state, &token),
            "expires_at": expires,
        })),
    ))
}

#[utoipa::path(
    get,
    path = "/api/v1/users/{username}/sessions",
    tag = "users",
    summary = "List a person's sessions",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 200, body = serde_json::Value, description = "Their admin UI sessions"))
)]
async fn user_sessions(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    let sessions = crate::service::accounts::sessions(&state, &username).await?;
    Ok(Json(json!({"sessions": sessions.iter().map(|s| json!({
        "id": s.id,
        "created_at": s.created_at,
        "last_seen_at": s.last_seen_at,
        "expires_at": s.expires_at,
        "remote_addr": s.remote_addr,
        "user_agent": s.user_agent,
    })).collect::<Vec<_>>()})))
}

#[utoipa::path(
    delete,
    path = "/api/v1/users/{username}/sessions",
    tag = "users",
    summary = "End all of a person's sessions",
    params(("username" = String, Path, description = "Username of a person")),
    responses((status = 200, body = serde_json::Value, description = "How many sessions ended"))
)]
async fn end_user_sessions(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    let ended = crate::service::accounts::end_sessions(&state, API_ACTOR, &username, None).await?;
    Ok(Json(json!({"ended": ended})))
}

#[utoipa::path(
    delete,
    path = "/api/v1/users/{username}/sessions/{id}",
    tag = "users",
    summary = "End one session",
    params(("username" = String, Path, description = "Username of a person"), ("id" = String, Path, description = "Session id")),
    responses((status = 200, body = serde_json::Value, description = "Ended"))
)]
async fn end_user_session(
    State(state): State<AppState>,
    Path((username, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let id: uuid::Uuid = id
        .parse()
        .map_err(|_| ServiceError::Invalid(format!("`{id}` is not a session id")))?;
    let ended =
        crate::service::accounts::end_sessions(&state, API_ACTOR, &username, Some(id)).await?;
    if ended == 0 {
        return Err(ServiceError::NotFound(format!("session `{id}`")).into());
    }
    Ok(Json(json!({"ended": ended})))
}
