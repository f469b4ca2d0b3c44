//! The bearer guard's check: the access token an agent presents on `/mcp`, `/tools/...` and
//! `/openapi.json` becomes a [`Principal`], or is refused, audited and counted.

use std::time::Duration;

use super::token::TokenError;
use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::limits::LimitedAction;
use crate::policy::TokenScope;
use crate::policy::snapshot::Principal;
use crate::state::AppState;

/// Why a request's bearer token was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub struct BearerRefusal {
    pub error: TokenError,
    /// Set when the source has presented too many invalid tokens: the wait before retrying.
    pub limited: Option<Duration>,
}

/// Checks the `Authorization` header of a request to `path` on `surface` (`None` when there is
/// none, or when it is not text). Without a header, the dev agent stands in when one is
/// configured (local development only).
///
/// A token that is not valid counts against its source's failure budget, shared with every
/// credential check; a missing one guesses nothing and is not counted (it is how every MCP
/// client discovers where to get a token). Every refusal is audited, summarised per source:
/// a flood of bad tokens never waits on (or is blocked by) the audit log, nor writes a row
/// each.
pub async fn authenticate(
    state: &AppState,
    authorization: Option<&str>,
    origin: Option<&RequestOrigin>,
    path: &str,
    surface: &'static str,
) -> Result<Principal, BearerRefusal> {
    let error = match verify(state, authorization) {
        Ok(principal) => return Ok(principal),
        Err(e) => e,
    };
    tracing::debug!(reason = %error, "request refused: invalid token");
    let limited = if error == TokenError::Missing {
        None
    } else {
        let action = LimitedAction::InvalidBearer {
            source: super::source_of(origin),
        };
        state
            .limits
            .take(action)
            .await
            .err()
            .map(|r| r.retry_after())
    };
    let outcome = if limited.is_some() {
        Outcome::RateLimited
    } else {
        Outcome::Denied
    };
    let mut event = AuditEvent::new(EventKind::AuthRejected, outcome).from_origin(origin);
    event.error = Some(error.to_string());
    event.resource = Some(crate::audit::bounded(path));
    state.refusals.record(event, surface, error.kind());
    Err(BearerRefusal { error, limited })
}

fn verify(state: &AppState, authorization: Option<&str>) -> Result<Principal, TokenError> {
    match authorization {
        None => match &state.settings.dev_agent {
            Some(agent) => Ok(dev_principal(agent)),
            None => Err(TokenError::Missing),
        },
        Some(h) => match h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
        {
            Some(tok) => {
                let snapshot = state.policy.load();
                state.verified_tokens.verify(
                    tok.trim(),
                    &snapshot,
                    &state.settings.expected_token(),
                )
            }
            None => Err(TokenError::Malformed("not a bearer token".into())),
        },
    }
}

/// Whether the credentials a held stream was opened with still stand, checked again whenever
/// the policy changes: the principal they stand for now, and the instant (Unix seconds, leeway
/// included) after which the token stops (`None` for the dev agent). Nothing is counted or
/// audited: the stream's request was authenticated when it was opened.
pub fn recheck(
    state: &AppState,
    authorization: Option<&str>,
) -> Result<(Principal, Option<i64>), TokenError> {
    let token = authorization.and_then(|h| {
        h.strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
    });
    match token {
        None => verify(state, authorization).map(|p| (p, None)),
        Some(tok) => {
            let expected = state.settings.expected_token();
            let (principal, claims) =
                super::token::verify(tok.trim(), &state.policy.load(), &expected)?;
            Ok((principal, Some(claims.exp + expected.leeway_secs as i64)))
        }
    }
}

/// The dev agent holds a token-equivalent of all its live grants.
fn dev_principal(agent: &str) -> Principal {
    Principal {
        agent: agent.to_owned(),
        client_id: "dev-agent".to_owned(),
        jti: None,
        scope: TokenScope::AllGranted,
        person: None,
    }
}
