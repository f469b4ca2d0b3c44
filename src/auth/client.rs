//! OAuth clients: how one proves itself (a secret, basic or in the form, or a `private_key_jwt`
//! assertion), within the limits a credential check and a token request are held to; and the
//! audit rows of what the token endpoint refuses or hands out. How a refusal is worded for the
//! client is the OAuth surface's.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chrono::{TimeZone, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};

use super::secrets;
use super::token::{self, AccessClaims};
use crate::audit::{AuditEvent, EventKind, Outcome, RequestOrigin};
use crate::db;
use crate::limits::LimitedAction;
use crate::state::AppState;

pub const CLIENT_ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// Algorithms accepted for `private_key_jwt` client assertions.
const ASSERTION_ALGS: [Algorithm; 4] = [
    Algorithm::EdDSA,
    Algorithm::RS256,
    Algorithm::ES256,
    Algorithm::PS256,
];
/// Longest lifetime accepted for a client assertion.
pub const MAX_ASSERTION_LIFETIME_SECS: i64 = 600;

/// Why a client did not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRefusal {
    /// The request is not a well-formed authentication (counted all the same).
    Malformed(&'static str),
    /// A credential missing or wrong.
    Invalid(&'static str),
    /// The source or the client id failed too often: nothing was checked.
    Limited(Duration),
    /// Every secret verification is taken; refused without a guess being made or counted.
    Busy,
    /// The database could not be asked; nothing was checked.
    Unavailable,
}

/// The surface these records name, as summarised refusals group them.
const SURFACE: &str = "oauth";

/// A client id as a stranger sent it, cut to what an audit row keeps.
fn bounded_client_id(c: &str) -> String {
    c.chars().take(db::assertions::MAX_CLIENT_ID).collect()
}

/// The client id a request claims, whichever authentication method it uses.
pub fn claimed_client_id(headers: &HeaderMap, form: &HashMap<String, String>) -> Option<String> {
    form.get("client_id")
        .cloned()
        .or_else(|| basic_credentials(headers).map(|(id, _)| id))
        .or_else(|| {
            form.get("client_assertion")
                .and_then(|a| unverified_claim(a, "sub"))
        })
}

/// An authenticated OAuth client.
#[derive(Debug)]
pub struct AuthenticatedClient {
    pub client_id: String,
    pub agent: String,
}

fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let h = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = h
        .strip_prefix("Basic ")
        .or_else(|| h.strip_prefix("basic "))?;
    let decoded = String::from_utf8(STANDARD.decode(b64.trim()).ok()?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    // RFC 6749 §2.3.1: both parts are form-urlencoded before base64.
    let dec = |s: &str| {
        url::form_urlencoded::parse(format!("v={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    };
    Some((dec(id)?, dec(secret)?))
}

/// Authenticates the client with exactly one of client_secret_basic, client_secret_post or
/// private_key_jwt, within the failure limits of its source address and client id: a source
/// or client id that failed too often is refused before any lookup or hashing. A check that
/// fails counts; one that succeeds does not, nor one that could not be made (no verification
/// slot, no database).
pub async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
    origin: Option<&RequestOrigin>,
) -> Result<AuthenticatedClient, ClientRefusal> {
    let claimed = claimed_client_id(headers, form);
    let action = LimitedAction::CredentialCheck {
        source: super::source_of(origin),
        client: claimed.as_deref(),
    };
    let taken = state
        .limits
        .take(action)
        .await
        .map_err(|r| ClientRefusal::Limited(r.retry_after()))?;
    let checked = check_client(state, headers, form).await;
    match &checked {
        Ok(_) => taken.succeeded(),
        Err(ClientRefusal::Busy | ClientRefusal::Unavailable) => taken.not_checked(),
        // The failure stays counted.
        Err(_) => drop(taken),
    }
    checked
}

async fn check_client(
    state: &AppState,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
) -> Result<AuthenticatedClient, ClientRefusal> {
    let basic = basic_credentials(headers);
    let post = form.get("client_secret").map(|s| {
        (
            form.get("client_id").cloned().unwrap_or_default(),
            s.clone(),
        )
    });
    let assertion = form.get("client_assertion");
    let methods = [basic.is_some(), post.is_some(), assertion.is_some()]
        .iter()
        .filter(|m| **m)
        .count();
    if methods > 1 {
        return Err(ClientRefusal::Malformed(
            "use exactly one client authentication method",
        ));
    }
    if let Some(assertion) = assertion {
        if form.get("client_assertion_type").map(String::as_str) != Some(CLIENT_ASSERTION_TYPE) {
            return Err(ClientRefusal::Malformed(
                "unsupported client_assertion_type",
            ));
        }
        return verify_assertion(state, assertion, form.get("client_id")).await;
    }
    let Some((client_id, secret)) = basic.or(post) else {
        return Err(ClientRefusal::Invalid("client authentication is required"));
    };
    let client = db::clients::client(&state.db, &client_id)
        .await
        .map_err(|_| ClientRefusal::Unavailable)?;
    let stored = client.as_ref().and_then(|c| c.secret_hash.clone());
    let ok = secrets::VERIFIER
        .check(secret, stored)
        .await
        .map_err(|_| ClientRefusal::Busy)?;
    match client {
        Some(c) if ok => Ok(AuthenticatedClient {
            client_id: c.client_id,
            agent: c.agent,
        }),
        _ => Err(ClientRefusal::Invalid("client authentication failed")),
    }
}

/// Reads a claim from a JWT's payload without verifying it, only to find which key to verify with.
fn unverified_claim(jwt: &str, claim: &str) -> Option<String> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get(claim)?.as_str().map(str::to_owned)
}

async fn verify_assertion(
    state: &AppState,
    assertion: &str,
    form_client_id: Option<&String>,
) -> Result<AuthenticatedClient, ClientRefusal> {
    let fail = || ClientRefusal::Invalid("client assertion rejected");
    let client_id =
        assertion_client_id(assertion, form_client_id.map(String::as_str)).ok_or_else(fail)?;
    let client = db::clients::client(&state.db, &client_id)
        .await
        .map_err(|_| ClientRefusal::Unavailable)?
        .ok_or_else(fail)?;
    let verified = check_assertion(
        assertion,
        &client_id,
        client.jwks.as_ref(),
        &state.settings.issuer,
    )
    .ok_or_else(fail)?;
    // Single use across every instance: the id is recorded in Postgres until the assertion
    // could no longer pass validation. No database, no token: never accept unrecorded.
    let valid_until = Utc
        .timestamp_opt(verified.exp + token::CLOCK_LEEWAY_SECS as i64, 0)
        .single()
        .ok_or_else(fail)?;
    match db::assertions::first_use(&state.db, &client.client_id, &verified.jti, valid_until).await
    {
        Ok(true) => {}
        Ok(false) => {
            return Err(ClientRefusal::Invalid(
                "client assertion already used (its jti was seen before)",
            ));
        }
        Err(e) => {
            tracing::error!(error = %e, "recording a client assertion id failed");
            return Err(ClientRefusal::Unavailable);
        }
    }
    Ok(AuthenticatedClient {
        client_id: client.client_id,
        agent: client.agent,
    })
}

/// The client a `private_key_jwt` assertion speaks for (its unverified `sub`, which must agree
/// with a `client_id` sent beside it), or `None` before any database lookup if the assertion
/// cannot be one of ours.
pub fn assertion_client_id(assertion: &str, form_client_id: Option<&str>) -> Option<String> {
    let header = jsonwebtoken::decode_header(assertion).ok()?;
    if !ASSERTION_ALGS.contains(&header.alg) {
        return None;
    }
    match (form_client_id, unverified_claim(assertion, "sub")) {
        (Some(f), Some(s)) if f != s => None,
        (_, s) => s.filter(|s| s.len() <= db::assertions::MAX_CLIENT_ID),
    }
}

/// What a verified client assertion carries for the replay check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedAssertion {
    pub jti: String,
    pub exp: i64,
    pub claims: Value,
}

/// Verifies an assertion against the client's registered JWKS: algorithm, key, signature,
/// `iss` = `sub` = the client, `aud` = our token endpoint or issuer, `exp` at most
/// [`MAX_ASSERTION_LIFETIME_SECS`] ahead, `nbf` and `iat` not in the future (within
/// [`token::CLOCK_LEEWAY_SECS`]), a `jti`. Single use is the caller's to enforce.
pub fn check_assertion(
    assertion: &str,
    client_id: &str,
    jwks: Option<&Value>,
    issuer: &str,
) -> Option<VerifiedAssertion> {
    let header = jsonwebtoken::decode_header(assertion).ok()?;
    if !ASSERTION_ALGS.contains(&header.alg) {
        return None;
    }
    let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks?.clone()).ok()?;
    let jwk = match &header.kid {
        Some(kid) => jwks.find(kid),
        None if jwks.keys.len() == 1 => jwks.keys.first(),
        None => None,
    }?;
    let key = DecodingKey::from_jwk(jwk).ok()?;
    let mut v = Validation::new(header.alg);
    v.set_issuer(&[client_id]);
    v.sub = Some(client_id.to_owned());
    v.set_audience(&[format!("{issuer}/oauth/token"), issuer.to_owned()]);
    v.set_required_spec_claims(&["exp", "iss", "sub", "aud"]);
    v.validate_nbf = true;
    v.leeway = token::CLOCK_LEEWAY_SECS;
    let data = jsonwebtoken::decode::<Value>(assertion, &key, &v).ok()?;
    let now = Utc::now().timestamp();
    let exp = data.claims.get("exp").and_then(Value::as_i64).unwrap_or(0);
    if exp - now > MAX_ASSERTION_LIFETIME_SECS {
        return None;
    }
    let iat = data
        .claims
        .get("iat")
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)));
    token::check_iat(iat, now).ok()?;
    // The id is stored as it is: a bounded length, and no NUL (which Postgres refuses).
    let jti = data
        .claims
        .get("jti")
        .and_then(Value::as_str)
        .filter(|j| !j.is_empty() && j.len() <= db::assertions::MAX_JTI && !j.contains('\0'))?
        .to_owned();
    Some(VerifiedAssertion {
        jti,
        exp,
        claims: data.claims,
    })
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
