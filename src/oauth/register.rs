//! `POST /oauth/register`: Dynamic Client Registration (RFC 7591) for interactive hosts.
//!
//! `mcp-remote` and the desktop hosts behind it register themselves before their first
//! sign-in. Anyone may ask, so a registration is bounded: a per-address budget, a small body,
//! a cap on registrations nobody has used yet, and an expiry; and with
//! `--oauth-registration held` (the default) it does nothing until an admin approves it. What it
//! gets is a public client (PKCE, no secret) for the authorization-code grant only: never a
//! client-credentials client, which only an admin makes for an agent.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::OAuthError;
use crate::audit::RequestOrigin;
use crate::config::Registration;
use crate::service::clients::{self, RegistrationError, RegistrationRequest};
use crate::state::AppState;

/// Largest registration request read: a real one is a few hundred bytes.
pub const MAX_BODY: usize = 16 * 1024;

fn refused(error: &'static str, description: impl Into<String>) -> Response {
    OAuthError::new(StatusCode::BAD_REQUEST, error, description).into_response()
}

pub async fn register(
    State(state): State<AppState>,
    origin: Option<axum::Extension<RequestOrigin>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let held = match state.settings.registration {
        // Not routed when off; kept here so the handler never registers against the setting.
        Registration::Off => return StatusCode::NOT_FOUND.into_response(),
        Registration::Held => true,
        Registration::Open => false,
    };
    let source = crate::auth::source_of(origin.as_ref().map(|o| &o.0));
    if let Err(wait) = crate::auth::authorize::admit_registration(&state, source).await {
        return OAuthError {
            retry_after: Some(super::retry_secs(wait)),
            ..OAuthError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "slow_down",
                "too many registrations from this address; retry later",
            )
        }
        .into_response();
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return refused(
            "invalid_client_metadata",
            "send the client metadata as a JSON object (Content-Type: application/json)",
        );
    }
    let request: RegistrationRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return refused(
                "invalid_client_metadata",
                format!("the client metadata is not a valid registration request: {e}"),
            );
        }
    };
    match clients::register(&state, &request, source, held).await {
        Ok(c) => {
            let mut body = json!({
                "client_id": c.client_id,
                "client_id_issued_at": c.created_at.timestamp(),
                "client_name": c.client_name,
                "redirect_uris": c.redirect_uris,
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
                "scope": crate::policy::ALL_TOOLS_SCOPE,
            });
            if held {
                // Not part of RFC 7591: what a person following the sign-in link will see.
                body["toolgate_status"] = json!("held");
                body["toolgate_note"] = json!(
                    "this registration waits for an administrator's approval before anyone can sign in through it"
                );
            }
            (
                StatusCode::CREATED,
                [(header::CACHE_CONTROL, "no-store")],
                Json(body),
            )
                .into_response()
        }
        Err(RegistrationError::RedirectUri(m)) => refused("invalid_redirect_uri", m),
        Err(RegistrationError::Metadata(m)) => refused("invalid_client_metadata", m),
        Err(RegistrationError::Full) => OAuthError {
            retry_after: Some(3600),
            ..OAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "too many registrations wait for their first use; retry later",
            )
        }
        .into_response(),
        Err(RegistrationError::Failed(e)) => {
            tracing::error!(error = %e, "registering a client failed");
            OAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the registration could not be stored; try again",
            )
            .into_response()
        }
    }
}
