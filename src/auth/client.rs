//! OAuth client authentication and token issuance, on record: the limits a client's credential
//! check and a token request are held to, and the audit rows of what the token endpoint
//! refuses or hands out. How a client proves itself (secret or assertion) and how a refusal is
//! worded for it are the OAuth surface's.

use std::future::Future;
use std::time::Duration;

use serde_json::json;

use super::token::AccessClaims;
use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::db;
use crate::limits::LimitedAction;
use crate::state::AppState;

/// The surface these records name, as summarised refusals group them.
const SURFACE: &str = "oauth";

/// A client id as a stranger sent it, cut to what an audit row keeps.
fn bounded_client_id(c: &str) -> String {
    c.chars().take(db::assertions::MAX_CLIENT_ID).collect()
}

/// Runs `check`, the verification of the credential a client claiming `claimed` presents,
/// within the failure limits of the request's source address and of the client id: a source
/// or client id that failed too often is refused (`Err(wait)`) before any lookup or hashing.
/// A check that fails counts; one that succeeds does not, nor one that `not_checked` says was
/// never made (no verification slot, no database).
pub async fn authenticate<T, E>(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    claimed: Option<&str>,
    check: impl Future<Output = Result<T, E>>,
    not_checked: impl FnOnce(&E) -> bool,
) -> Result<Result<T, E>, Duration> {
    let action = LimitedAction::CredentialCheck {
        source: super::source_of(origin),
        client: claimed,
    };
    let taken = state
        .limits
        .take(action)
        .await
        .map_err(|r| r.retry_after())?;
    let checked = check.await;
    match &checked {
        Ok(_) => taken.succeeded(),
        Err(e) if not_checked(e) => taken.not_checked(),
        // The failure stays counted.
        Err(_) => drop(taken),
    }
    Ok(checked)
}

/// Admits one request to the token endpoint from its source, or audits its refusal and says
/// how long to wait: against client-secret guessing, whatever the request turns out to be.
pub async fn admit_token_request(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    claimed: Option<&str>,
) -> Result<(), Duration> {
    let action = LimitedAction::TokenRequest {
        source: super::source_of(origin),
    };
    let Err(refusal) = state.limits.take(action).await else {
        return Ok(());
    };
    let mut e =
        AuditEvent::new(EventKind::ClientAuthFailed, Outcome::RateLimited).from_origin(origin);
    e.client_id = claimed.map(bounded_client_id);
    e.resource = Some("/oauth/token".to_owned());
    e.error = Some("slow_down: too many token requests from this address".to_owned());
    state.refusals.record(e, SURFACE, "too many token requests");
    Err(refusal.retry_after())
}

/// Records a refused client authentication at `endpoint` (`error` in a few fixed words, as
/// identical refusals from one source are summarised together) without waiting on the audit
/// log: outsiders' failures must never be slowed or blocked by it.
pub fn authentication_refused(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    endpoint: &str,
    claimed: Option<&str>,
    outcome: Outcome,
    error: &'static str,
    description: &str,
) {
    let mut e = AuditEvent::new(EventKind::ClientAuthFailed, outcome).from_origin(origin);
    e.client_id = claimed.map(bounded_client_id);
    e.resource = Some(endpoint.to_owned());
    e.error = Some(format!("{error}: {description}"));
    state.refusals.record(e, SURFACE, error);
}

/// Records a token request refused for another reason than the client's credential (a grant
/// type, a scope, a code), summarised like every refusal of a stranger.
pub fn token_refused(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    claimed: Option<&str>,
    error: &'static str,
    description: &str,
) {
    let mut e = AuditEvent::new(EventKind::TokenIssued, Outcome::Denied).from_origin(origin);
    e.client_id = claimed.map(bounded_client_id);
    e.error = Some(format!("{error}: {description}"));
    state.refusals.record(e, SURFACE, error);
}

/// The audit log could not take a record that must be written before the answer is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotRecorded;

/// Records the token `claims` describe as issued, waiting for the audit log: a token that is
/// not in the audit log is not handed out.
pub async fn token_issued(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    claims: &AccessClaims,
) -> Result<(), NotRecorded> {
    let mut e = AuditEvent::new(EventKind::TokenIssued, Outcome::Success).from_origin(origin);
    e.agent = Some(claims.sub.clone());
    e.client_id = Some(claims.client_id.clone());
    e.jti = Some(claims.jti.clone());
    e.person = claims.act.as_ref().map(|a| a.sub.clone());
    e.resource = Some(claims.aud.clone());
    e.details = Some(
        json!({"scope": claims.scope, "tool_prefixes": claims.tool_prefixes, "exp": claims.exp})
            .to_string(),
    );
    state.audit.record(e).await.map_err(|_| NotRecorded)
}
