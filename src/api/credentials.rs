//! Credentials for tool groups' slots: write-only values per agent, per person, or shared.
//! A stored value is never answered back: only its name, owner, key and dates.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{API_ACTOR, ApiResult};
use crate::credentials::Per;
use crate::service::{self, ServiceError};
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/agents/{name}/credentials", get(list_agent_credentials))
        .route(
            "/agents/{name}/credentials/{group}/{slot}",
            put(put_agent_credential).delete(delete_agent_credential),
        )
        .route("/users/{name}/credentials", get(list_person_credentials))
        .route(
            "/users/{name}/credentials/{group}/{slot}",
            put(put_person_credential).delete(delete_person_credential),
        )
        .route("/credentials", get(list_shared_credentials))
        .route(
            "/credentials/{group}/{slot}",
            put(put_shared_credential).delete(delete_shared_credential),
        )
}

/// The value to store; it is never shown again.
#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct CredentialValue {
    value: String,
}

fn value_of(body: axum::body::Bytes) -> Result<String, ServiceError> {
    serde_json::from_slice::<CredentialValue>(&body)
        .map(|v| v.value)
        // Never echo the body: it holds the secret.
        .map_err(|_| ServiceError::Invalid("the body must be {\"value\": \"...\"}".into()))
}

async fn put_one(
    state: &AppState,
    per: Per,
    owner: &str,
    group: &str,
    slot: &str,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let key = service::credentials::slot(per, owner, group, slot)?;
    let value = zeroize::Zeroizing::new(value_of(body)?);
    service::credentials::set(state, API_ACTOR, &key, &value).await?;
    Ok(Json(
        json!({"per": per, "owner": owner, "group": group, "name": slot, "stored": true}),
    ))
}

async fn delete_one(
    state: &AppState,
    per: Per,
    owner: &str,
    group: &str,
    slot: &str,
) -> ApiResult<StatusCode> {
    let key = service::credentials::slot(per, owner, group, slot)?;
    service::credentials::delete(state, API_ACTOR, &key).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_of(state: &AppState, per: Per, owner: &str) -> ApiResult<Json<Value>> {
    let rows = service::credentials::list(state, per, owner).await?;
    Ok(Json(json!({"credentials": rows})))
}

#[utoipa::path(
    put,
    path = "/api/v1/agents/{name}/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Store an agent's credential for a group's slot (write-only)",
    params(("name" = String, Path), ("group" = String, Path), ("slot" = String, Path, description = "The slot's name, as the group's `x-toolgate-credentials` declares it")),
    request_body = CredentialValue,
    responses((status = 200, body = serde_json::Value, description = "Stored; the value is never shown again"))
)]
async fn put_agent_credential(
    State(state): State<AppState>,
    Path((name, group, slot)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    put_one(&state, Per::Agent, &name, &group, &slot, body).await
}

#[utoipa::path(
    delete,
    path = "/api/v1/agents/{name}/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Delete an agent's credential",
    params(("name" = String, Path), ("group" = String, Path), ("slot" = String, Path)),
    responses((status = 204, description = "Deleted"))
)]
async fn delete_agent_credential(
    State(state): State<AppState>,
    Path((name, group, slot)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    delete_one(&state, Per::Agent, &name, &group, &slot).await
}

#[utoipa::path(
    get,
    path = "/api/v1/agents/{name}/credentials",
    tag = "credentials",
    summary = "An agent's stored credentials: names, key and last use, never values",
    params(("name" = String, Path)),
    responses((status = 200, body = serde_json::Value, description = "The agent's credentials"))
)]
async fn list_agent_credentials(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    list_of(&state, Per::Agent, &name).await
}

#[utoipa::path(
    put,
    path = "/api/v1/users/{name}/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Store a person's credential for a group's slot (write-only)",
    params(("name" = String, Path), ("group" = String, Path), ("slot" = String, Path)),
    request_body = CredentialValue,
    responses((status = 200, body = serde_json::Value, description = "Stored; the value is never shown again"))
)]
async fn put_person_credential(
    State(state): State<AppState>,
    Path((name, group, slot)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    put_one(&state, Per::Person, &name, &group, &slot, body).await
}

#[utoipa::path(
    delete,
    path = "/api/v1/users/{name}/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Delete a person's credential",
    params(("name" = String, Path), ("group" = String, Path), ("slot" = String, Path)),
    responses((status = 204, description = "Deleted"))
)]
async fn delete_person_credential(
    State(state): State<AppState>,
    Path((name, group, slot)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    delete_one(&state, Per::Person, &name, &group, &slot).await
}

#[utoipa::path(
    get,
    path = "/api/v1/users/{name}/credentials",
    tag = "credentials",
    summary = "A person's stored credentials: names, key and last use, never values",
    params(("name" = String, Path)),
    responses((status = 200, body = serde_json::Value, description = "The person's credentials"))
)]
async fn list_person_credentials(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    list_of(&state, Per::Person, &name).await
}

#[utoipa::path(
    put,
    path = "/api/v1/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Store a shared credential for a group's slot (write-only)",
    params(("group" = String, Path), ("slot" = String, Path)),
    request_body = CredentialValue,
    responses((status = 200, body = serde_json::Value, description = "Stored; the value is never shown again"))
)]
async fn put_shared_credential(
    State(state): State<AppState>,
    Path((group, slot)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    put_one(&state, Per::Shared, "", &group, &slot, body).await
}

#[utoipa::path(
    delete,
    path = "/api/v1/credentials/{group}/{slot}",
    tag = "credentials",
    summary = "Delete a shared credential",
    params(("group" = String, Path), ("slot" = String, Path)),
    responses((status = 204, description = "Deleted"))
)]
async fn delete_shared_credential(
    State(state): State<AppState>,
    Path((group, slot)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    delete_one(&state, Per::Shared, "", &group, &slot).await
}

#[utoipa::path(
    get,
    path = "/api/v1/credentials",
    tag = "credentials",
    summary = "Shared stored credentials: names, key and last use, never values",
    responses((status = 200, body = serde_json::Value, description = "The shared credentials"))
)]
async fn list_shared_credentials(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    list_of(&state, Per::Shared, "").await
}
