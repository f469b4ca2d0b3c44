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

async fn list_clients(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let clients = crate::db::clients::clients(&state.db, Some(&name))
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"clients": clients})))
}

#[derive(Deserialize, Default)]
struct NewClientBody {
    #[serde(default)]
    description: String,
    jwks: Option<Value>,
}

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

async fn delete_client(
    State(state): State<AppState>,
    Path(client_id): Path<String>,
) -> ApiResult<StatusCode> {
    service::clients::delete(&state, API_ACTOR, &client_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_public_clients(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let clients = crate::db::public_clients::public_clients(&state.db)
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"public_clients": clients})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicClientBody {
    client_name: String,
    redirect_uris: Vec<String>,
}

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

async fn list_authorizations(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<AuthorizationsQuery>,
) -> ApiResult<Json<Value>> {
    let list = crate::db::authorizations::list(&state.db, q.username.as_deref())
        .await
        .map_err(ServiceError::from)?;
    Ok(Json(json!({"authorizations": list})))
}

async fn revoke_authorization(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|_| ServiceError::NotFound(format!("authorization `{id}`")))?;
    service::authorizations::revoke(&state, API_ACTOR, id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct RevokeBody {
    jti: uuid::Uuid,
    /// When the token expires; defaults to a day from now.
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

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
