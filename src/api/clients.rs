//! OAuth clients (confidential and public), people's authorizations, token revocation.

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
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
        .route(
            "/agents/{name}/clients",
            get(list_clients).post(create_client),
        )
        .route("/clients/{client_id}", delete(delete_client))
        .route("/public-clients", get(list_public_clients))
        .route(
            "/public-clients/{client_id}",
            put(put_public_client).delete(delete_public_client),
        )
        .route(
            "/public-clients/{client_id}/approve",
            post(approve_public_client),
        )
        .route("/authorizations", get(list_authorizations))
        .route("/authorizations/{id}", delete(revoke_authorization))
        .route("/tokens/revoke", post(revoke_token))
}

#[utoipa::path(
    get,
    path = "/api/v1/agents/{name}/clients",
    tag = "clients",
    summary = "List an agent's clients",
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 200, body = serde_json::Value, description = "The agent's OAuth clients (never their secrets)"))
)]
async fn list_clients(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let clients = crate::db::clients::clients(&state.db, Some(&name))
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"clients": clients})))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
struct NewClientBody {
    #[serde(default)]
    description: String,
    jwks: Option<Value>,
}

#[utoipa::path(
    post,
    path = "/api/v1/agents/{name}/clients",
    tag = "clients",
    summary = "Create a client for an agent",
    params(("name" = String, Path, description = "Agent name")),
    request_body = NewClientBody,
    responses((status = 201, body = serde_json::Value, description = "Created; the secret is in this answer only"))
)]
async fn create_client(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    // The body is optional: an empty one creates a secret-based client.
    let body: NewClientBody = if body.iter().all(u8::is_ascii_whitespace) {
        NewClientBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ServiceError::Invalid(format!("invalid JSON body: {e}")))?
    };
    let client =
        service::clients::create(&state, API_ACTOR, &name, &body.description, body.jwks).await?;
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        Json(client),
    )
        .into_response())
}

#[utoipa::path(
    delete,
    path = "/api/v1/clients/{client_id}",
    tag = "clients",
    summary = "Delete a client",
    params(("client_id" = String, Path, description = "OAuth client id")),
    responses((status = 204, description = "Deleted; its tokens stop working"))
)]
async fn delete_client(
    State(state): State<AppState>,
    Path(client_id): Path<String>,
) -> ApiResult<StatusCode> {
    service::clients::delete(&state, API_ACTOR, &client_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/api/v1/public-clients",
    tag = "clients",
    summary = "List public clients",
    responses((status = 200, body = serde_json::Value, description = "Public (host) clients, registered or held"))
)]
async fn list_public_clients(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let clients = crate::db::public_clients::public_clients(&state.db)
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"public_clients": clients})))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PublicClientBody {
    client_name: String,
    redirect_uris: Vec<String>,
}

#[utoipa::path(
    put,
    path = "/api/v1/public-clients/{client_id}",
    tag = "clients",
    summary = "Register a public client",
    params(("client_id" = String, Path, description = "OAuth client id")),
    request_body = PublicClientBody,
    responses((status = 200, body = serde_json::Value, description = "Registered or updated"))
)]
async fn put_public_client(
    State(state): State<AppState>,
    Path(client_id): Path<String>,
    Json(body): Json<PublicClientBody>,
) -> ApiResult<StatusCode> {
    service::clients::put_public(
        &state.db,
        API_ACTOR,
        &client_id,
        &body.client_name,
        &body.redirect_uris,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Approves a host's held registration (`--oauth-registration held`).
#[utoipa::path(
    post,
    path = "/api/v1/public-clients/{client_id}/approve",
    tag = "clients",
    summary = "Approve a held registration",
    params(("client_id" = String, Path, description = "OAuth client id")),
    responses((status = 200, body = serde_json::Value, description = "Approved: it may now ask people to sign in"))
)]
async fn approve_public_client(
    State(state): State<AppState>,
    Path(client_id): Path<String>,
) -> ApiResult<Json<Value>> {
    service::clients::approve_public(&state, API_ACTOR, &client_id).await?;
    let client = crate::db::public_clients::public_client_by_id(&state.db, &client_id)
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"public_client": client})))
}

#[utoipa::path(
    delete,
    path = "/api/v1/public-clients/{client_id}",
    tag = "clients",
    summary = "Delete a public client",
    params(("client_id" = String, Path, description = "OAuth client id")),
    responses((status = 204, description = "Deleted, with its authorizations"))
)]
async fn delete_public_client(
    State(state): State<AppState>,
    Path(client_id): Path<String>,
) -> ApiResult<StatusCode> {
    service::clients::delete_public(&state, API_ACTOR, &client_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct AuthorizationsQuery {
    username: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/authorizations",
    tag = "clients",
    summary = "List host authorizations",
    params(("username" = Option<String>, Query, description = "Only this person's")),
    responses((status = 200, body = serde_json::Value, description = "Live host authorizations"))
)]
async fn list_authorizations(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<AuthorizationsQuery>,
) -> ApiResult<Json<Value>> {
    let list = crate::db::authorizations::list(&state.db, q.username.as_deref())
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"authorizations": list})))
}

#[utoipa::path(
    delete,
    path = "/api/v1/authorizations/{id}",
    tag = "clients",
    summary = "Revoke a host authorization",
    params(("id" = String, Path, description = "Authorization id")),
    responses((status = 204, description = "Revoked, with its tokens"))
)]
async fn revoke_authorization(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|_| ServiceError::NotFound(format!("authorization `{id}`")))?;
    service::authorizations::revoke(&state, API_ACTOR, id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct RevokeBody {
    jti: uuid::Uuid,
    /// When the token expires; defaults to a day from now.
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[utoipa::path(
    post,
    path = "/api/v1/tokens/revoke",
    tag = "clients",
    summary = "Revoke one token by its jti",
    request_body = RevokeBody,
    responses((status = 204, description = "Revoked"))
)]
async fn revoke_token(
    State(state): State<AppState>,
    Json(body): Json<RevokeBody>,
) -> ApiResult<StatusCode> {
    let expires = body
        .expires_at
        .unwrap_or_else(|| chrono::Utc::now() + chrono::Duration::days(1));
    service::tokens::revoke(&state, API_ACTOR, body.jti, expires).await?;
    Ok(StatusCode::NO_CONTENT)
}
