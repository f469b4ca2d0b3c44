//! The JSON admin API under `/api/v1`, authenticated by the admin token.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use crate::audit::RequestOrigin;
use crate::auth::admin::{self, AdminRefusal};
use crate::service::ServiceError;
use crate::state::AppState;

mod agents;
mod audit;
mod clients;
mod credentials;
pub mod openapi;
mod tools;
mod users;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .merge(agents::routes())
        .merge(credentials::routes())
        .merge(clients::routes())
        .merge(tools::routes())
        .merge(users::routes())
        .merge(audit::routes())
        .layer(axum::middleware::from_fn_with_state(state, require_admin))
        // The endpoint reference is the product's, not this instance's: it needs no token.
        .route("/openapi.json", axum::routing::get(openapi::document))
}

/// The answer to a request whose admin token was not accepted.
fn refused(refusal: AdminRefusal) -> Response {
    match refusal {
        AdminRefusal::Invalid => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"toolgate-admin\"")],
            Json(json!({"error": "an admin token is required"})),
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

async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let origin = req.extensions().get::<RequestOrigin>();
    match admin::check(&state, req.headers(), origin, "/api/v1", "api").await {
        Ok(()) => next.run(req).await,
        Err(refusal) => refused(refusal),
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
