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
    })
}

async fn list_users(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let users = crate::service::accounts::list(&state).await?;
    Ok(Json(
        json!({"users": users.iter().map(user_json).collect::<Vec<_>>()}),
    ))
}

#[derive(Deserialize)]
struct NewUser {
    username: String,
    password: String,
    role: String,
}

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

async fn get_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(user_json(
        &crate::service::accounts::get(&state, &username).await?,
    )))
}

async fn delete_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<StatusCode> {
    crate::service::accounts::delete(&state, API_ACTOR, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct RoleBody {
    role: String,
}

async fn set_user_role(
    State(state): State<AppState>,
    Path(username): Path<String>,
    Json(body): Json<RoleBody>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_role(&state, API_ACTOR, &username, &body.role).await?;
    get_user(State(state), Path(username)).await
}

async fn disable_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_disabled(&state, API_ACTOR, &username, true).await?;
    get_user(State(state), Path(username)).await
}

async fn enable_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    crate::service::accounts::set_disabled(&state, API_ACTOR, &username, false).await?;
    get_user(State(state), Path(username)).await
}

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

async fn end_user_sessions(
    State(state): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    let ended = crate::service::accounts::end_sessions(&state, API_ACTOR, &username, None).await?;
    Ok(Json(json!({"ended": ended})))
}

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
