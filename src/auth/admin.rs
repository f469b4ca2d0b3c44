//! The admin token: the credential of the JSON admin API and of token introspection.

use std::time::Duration;

use axum::http::{HeaderMap, header};
use sha2::Digest;

use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::limits::LimitedAction;
use crate::state::AppState;

/// Why an admin token was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRefusal {
    /// Missing or wrong.
    Invalid,
    /// This source failed too often; nothing was compared.
    Limited(Duration),
}

/// Whether `headers` present the admin token, compared in constant time.
fn presents_admin_token(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(expected) = &state.settings.admin_token else {
        return false;
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    // Comparing digests keeps the comparison independent of where the strings differ.
    sha2::Sha256::digest(presented.as_bytes()) == sha2::Sha256::digest(expected.as_bytes())
}

/// Checks the admin token a request to `endpoint` (on `surface`) presents, within the failure
/// limit of its source address, which it shares with every other credential check. A request
/// without any token is refused but neither counted nor audited: it guesses nothing. Failures
/// are audited, summarised per source, without waiting on the audit log.
pub async fn check(
    state: &AppState,
    headers: &HeaderMap,
    origin: Option<&RequestOrigin>,
    endpoint: &str,
    surface: &'static str,
) -> Result<(), AdminRefusal> {
    if !headers.contains_key(header::AUTHORIZATION) {
        return Err(AdminRefusal::Invalid);
    }
    let action = LimitedAction::CredentialCheck {
        source: super::source_of(origin),
        client: None,
    };
    let outcome = match state.limits.take(action).await {
        Err(refusal) => Err(AdminRefusal::Limited(refusal.retry_after())),
        Ok(taken) if presents_admin_token(state, headers) => {
            taken.succeeded();
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
    state.refusals.record(e, surface, error);
    outcome
}
