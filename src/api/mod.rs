//! The JSON admin API under `/api/v1`, authenticated by the admin token.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::service::{self, ServiceError, audit_access};
use crate::state::AppState;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/agents", get(list_agents).post(create_agent))
        .route("/agents/{name}", get(get_agent).delete(delete_agent))
        .route("/agents/{name}/grants", post(add_grant))
        .route("/agents/{name}/grants/{target}", delete(remove_grant))
        .route(
            "/agents/{name}/arguments/{target}",
            axum::routing::put(put_arguments).delete(delete_arguments),
        )
        .route(
            "/agents/{name}/clients",
            get(list_clients).post(create_client),
        )
        .route("/clients/{client_id}", delete(delete_client))
        .route(
            "/agents/{name}/users/{username}",
            axum::routing::put(put_agent_user).delete(delete_agent_user),
        )
        .route("/public-clients", get(list_public_clients))
        .route(
            "/public-clients/{client_id}",
            axum::routing::put(put_public_client).delete(delete_public_client),
        )
        .route("/authorizations", get(list_authorizations))
        .route("/authorizations/{id}", delete(revoke_authorization))
        .route("/grants/preview", get(preview_grant))
        .route("/tools", get(list_tools))
        .route("/groups", get(list_groups))
        .route("/groups/{name}/pin", axum::routing::put(set_group_pin))
        .route("/tools/pending", get(pending_tools))
        .route("/tools/{name}/approve", post(approve_tool))
        .route("/tools/{name}/reject", post(reject_tool))
        .route("/pool/errors", get(pool_errors))
        .route("/tokens/revoke", post(revoke_token))
        .route(
            "/agents/{name}/rate-limits",
            get(get_limits).put(set_limits),
        )
        .route("/audit", get(list_audit))
        .route("/upstreams", get(list_upstreams))
        .route(
            "/upstreams/{name}",
            axum::routing::put(put_upstream).delete(delete_upstream),
        )
        .route("/users", get(list_users).post(create_user))
        .route("/users/{username}", get(get_user).delete(delete_user))
        .route("/users/{username}/role", axum::routing::put(set_user_role))
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
        .route("/audit/export", get(export_audit))
        .route("/audit/{id}", get(get_audit))
        .layer(axum::middleware::from_fn_with_state(state, require_admin))
}

/// Constant-time comparison of the presented admin token.
pub fn is_admin_token(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(expected) = &state.settings.admin_token else {
        return false;
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    use sha2::Digest;
    // Comparing digests keeps the comparison independent of where the strings differ.
    sha2::Sha256::digest(presented.as_bytes()) == sha2::Sha256::digest(expected.as_bytes())
}

/// Why an admin token was not accepted.
pub enum AdminRefusal {
    /// Missing or wrong.
    Invalid,
    /// This source failed too often; nothing was compared.
    Limited(std::time::Duration),
}

impl AdminRefusal {
    pub fn into_response(self, challenge: &'static str, body: Value) -> Response {
        match self {
            AdminRefusal::Invalid => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, challenge)],
                Json(body),
            )
                .into_response(),
            AdminRefusal::Limited(wait) => (
                StatusCode::TOO_MANY_REQUESTS,
                [(
                    header::RETRY_AFTER,
                    (wait.as_secs_f64().ceil().max(1.0) as u64).to_string(),
                )],
                Json(json!({"error": "too many failed admin token checks from this address; retry later"})),
            )
                .into_response(),
        }
    }
}

/// Checks the admin token within the failure limit of the request's source address, which it
/// shares with every other credential check. A request without any token is refused but not
/// counted: it guesses nothing. Failures are audited without waiting on the audit log.
pub fn check_admin_token(
    state: &AppState,
    headers: &HeaderMap,
    origin: Option<&RequestOrigin>,
    endpoint: &str,
) -> Result<(), AdminRefusal> {
    if !headers.contains_key(header::AUTHORIZATION) {
        return Err(AdminRefusal::Invalid);
    }
    let ip = origin
        .and_then(|o| o.remote_addr.as_deref())
        .and_then(|a| a.parse().ok());
    let outcome = match state.limits.credential_attempt(ip, None) {
        Err(wait) => Err(AdminRefusal::Limited(wait)),
        Ok(attempt) if is_admin_token(state, headers) => {
            attempt.succeeded();
            return Ok(());
        }
        Ok(_failed) => Err(AdminRefusal::Invalid),
    };
    let (result, error) = match &outcome {
        Err(AdminRefusal::Limited(_)) => {
            (Outcome::RateLimited, "too many failed admin token checks")
        }
        _ => (Outcome::Denied, "wrong admin token"),
    };
    let mut e = AuditEvent::new(EventKind::ClientAuthFailed, result).from_origin(origin);
    e.resource = Some(endpoint.to_owned());
    e.error = Some(error.to_owned());
    state
        .refusals
        .record(e, crate::http::surface_of(endpoint), error);
    outcome
}

async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let origin = req.extensions().get::<RequestOrigin>();
    match check_admin_token(&state, req.headers(), origin, "/api/v1") {
        Ok(()) => next.run(req).await,
        Err(refused) => refused.into_response(
            "Bearer realm=\"toolgate-admin\"",
            json!({"error": "an admin token is required"}),
        ),
    }
}

/// The actor recorded for API changes.
const API_ACTOR: &str = "api:admin-token";

/// Who reads the audit log through the API.
const READER: audit_access::Reader<'static> = audit_access::Reader {
    who: API_ACTOR,
    channel: audit_access::Channel::Api,
};

/// The JSON API's error: client errors say what is wrong; server errors are opaque.
pub struct ApiError(ServiceError);

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        Self(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match &self.0 {
            ServiceError::NotFound(what) => (StatusCode::NOT_FOUND, format!("{what} not found")),
            ServiceError::Invalid(m) => (StatusCode::BAD_REQUEST, m.clone()),
            ServiceError::Conflict(m) => (StatusCode::CONFLICT, m.clone()),
            ServiceError::Database(e) => {
                tracing::error!(error = %e, "admin API database error");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database is unavailable".to_owned(),
                )
            }
            ServiceError::Other(e) => {
                tracing::error!(error = ?e, "admin API error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error".to_owned(),
                )
            }
        };
        (status, Json(json!({"error": message}))).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

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

async fn list_groups(State(state): State<AppState>) -> Json<Value> {
    let snapshot = state.policy.load();
    Json(json!({"groups": snapshot.catalog.groups().collect::<Vec<_>>()}))
}

async fn pool_errors(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"errors": state.policy.load().catalog.load_errors()}))
}

async fn pending_tools(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    Ok(Json(
        json!({"pending": service::pins::pending(&state).await?}),
    ))
}

/// Which held definition a decision is for; without a hash, the one this instance serves.
#[derive(Deserialize, Default)]
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PinBody {
    /// `true`, `false`, or `null` for the default.
    pin: Option<bool>,
}

async fn set_group_pin(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(body): Json<PinBody>,
) -> ApiResult<Json<Value>> {
    let name = crate::names::GroupName::parse(&name).map_err(ServiceError::from)?;
    let done = service::pins::set_group_pin(&state, API_ACTOR, &name, body.pin).await?;
    Ok(Json(json!(done)))
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

#[derive(Deserialize, Default)]
struct AuditQuery {
    #[serde(flatten)]
    filter: crate::db::audit::AuditFilter,
    before: Option<i64>,
    limit: Option<i64>,
}

/// Newest first; `next_before` is the cursor for the next (older) page.
async fn list_audit(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<AuditQuery>,
) -> ApiResult<Json<Value>> {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let rows = audit_access::rows(&state, READER, &q.filter, q.before, limit).await?;
    let next = if rows.len() as i64 == limit {
        rows.last().and_then(|r| r.id)
    } else {
        None
    };
    Ok(Json(json!({"events": rows, "next_before": next})))
}

async fn get_audit(State(state): State<AppState>, Path(id): Path<i64>) -> ApiResult<Json<Value>> {
    let row = audit_access::row(&state, READER, id).await?;
    Ok(Json(json!({"event": row})))
}

#[derive(Deserialize)]
struct ExportQuery {
    format: crate::audit::export::Format,
    #[serde(flatten)]
    filter: crate::db::audit::AuditFilter,
}

/// Streams the export: one row in memory at a time, whatever the range, once its record
/// (`audit.export`, with the filter) is durable.
async fn export_audit(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<ExportQuery>,
) -> ApiResult<Response> {
    use futures::StreamExt;
    let body = audit_access::export(&state, READER, q.format, q.filter)
        .await?
        .map(|r| {
            r.map_err(|e| {
                tracing::error!(error = %e, "audit export failed mid-stream");
                std::io::Error::other("audit export failed")
            })
        });
    Ok((
        [
            (header::CONTENT_TYPE, q.format.content_type().to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", q.format.file_name()),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// Upstreams with their specs and live health on this instance.
async fn list_upstreams(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let mut conn = state.db.acquire().await.map_err(ServiceError::from)?;
    let specs = crate::db::upstreams::upstreams(&mut conn)
        .await
        .map_err(ServiceError::from)?;
    let health = state.upstreams.health();
    let list: Vec<Value> = specs
        .into_iter()
        .map(|(name, spec)| json!({"name": name, "spec": spec, "health": health.get(&name)}))
        .collect();
    Ok(Json(json!({"upstreams": list})))
}

async fn put_upstream(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(spec): Json<crate::upstream::UpstreamSpec>,
) -> ApiResult<StatusCode> {
    let name = crate::names::GroupName::parse(&name).map_err(ServiceError::from)?;
    service::upstreams::set(&state, API_ACTOR, &name, spec).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_upstream(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    service::upstreams::delete(&state, API_ACTOR, &name).await?;
    Ok(StatusCode::NO_CONTENT)
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
            "reset_url": crate::web::accounts::reset_url(&state, &token),
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
