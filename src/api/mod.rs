//! The JSON admin API under `/api/v1`, authenticated by the admin token.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::service::ServiceError;
use crate::state::AppState;

mod agents;
mod audit;
mod clients;
mod tools;
mod users;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .merge(agents::routes())
        .merge(clients::routes())
        .merge(tools::routes())
        .merge(users::routes())
        .merge(audit::routes())
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
