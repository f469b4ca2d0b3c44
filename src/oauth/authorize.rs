//! The authorization-code grant's endpoints for interactive hosts: `/oauth/authorize`, which
//! checks a request ([`crate::auth::authorize`]) and passes it on to the consent page, and the
//! two token grants, `authorization_code` and `refresh_token`.

use std::collections::HashMap;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::OAuthError;
use crate::auth::secrets::{random_token, sha256_hex};
use crate::auth::token::{AccessClaims, sign};
use crate::auth::{authorize, cimd, scope};
use crate::db;
use crate::db::authorizations::Taken;
use crate::state::AppState;

/// Life of a refresh token (each use issues the next, for as long again).
pub const REFRESH_TTL_DAYS: i64 = 30;

/// `GET /oauth/authorize`: checks the request, then passes it on to the consent page.
pub async fn authorize(
    State(state): State<AppState>,
    origin: Option<axum::Extension<crate::audit::RequestOrigin>>,
    RawQuery(query): RawQuery,
) -> Response {
    let origin = origin.map(|o| o.0);
    if authorize::admit(&state, origin.as_ref()).await.is_err() {
        return authorize::error_page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-in requests from this address; wait a moment and try again.",
        );
    }
    let query = query.unwrap_or_default();
    if query.len() > authorize::MAX_QUERY {
        return authorize::error_page(StatusCode::BAD_REQUEST, "The request is too long.");
    }
    let params = authorize::parse_query(&query);
    match authorize::validate(&state, &params).await {
        // The consent page lives under /admin, where the sign-in cookie is sent; it checks
        // the request again, as it may be opened directly.
        Ok(_) => Redirect::to(&format!("/admin/consent?{query}")).into_response(),
        Err(e) => match e.redirect_or_message(&state.settings.issuer) {
            Ok(r) => r,
            Err(m) => authorize::error_page(StatusCode::BAD_REQUEST, &m),
        },
    }
}

fn invalid_grant(d: &str) -> OAuthError {
    OAuthError::new(StatusCode::BAD_REQUEST, "invalid_grant", d)
}

fn invalid_request(d: &str) -> OAuthError {
    OAuthError::new(StatusCode::BAD_REQUEST, "invalid_request", d)
}

fn unavailable() -> OAuthError {
    OAuthError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        "try again",
    )
}

/// Public clients authenticate with nothing but the code verifier: a secret or an assertion
/// sent along means the client is confused about what it is.
fn public_client_id<'a>(
    headers: &axum::http::HeaderMap,
    form: &'a HashMap<String, String>,
) -> Result<&'a str, OAuthError> {
    if headers.contains_key(axum::http::header::AUTHORIZATION)
        || form.contains_key("client_secret")
        || form.contains_key("client_assertion")
    {
        return Err(OAuthError::invalid_client(
            "this grant is for public clients: send client_id only, no secret or assertion",
        ));
    }
    form.get("client_id")
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| invalid_request("client_id is required"))
}

/// Revokes an authorization whose code or refresh token was presented a second time.
async fn revoke_replayed(state: &AppState, id: Uuid, what: &str) {
    let done = async {
        let mut tx = state.db.begin().await?;
        db::authorizations::revoke(&mut tx, "oauth:replay", id, None, what).await?;
        tx.commit().await
    }
    .await;
    match done {
        Ok(()) => {
            tracing::warn!(authorization = %id, "{what}: the authorization is revoked");
            if let Err(e) = state.reload_policy().await {
                tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, authorization = %id, "revoking a replayed authorization failed")
        }
    }
}

/// `grant_type=authorization_code` and `grant_type=refresh_token`.
pub async fn exchange(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    form: &HashMap<String, String>,
    refresh: bool,
) -> Result<(Value, AccessClaims), OAuthError> {
    let client_id = public_client_id(headers, form)?;
    if let Some(resource) = form.get("resource")
        && resource.trim_end_matches('/') != state.settings.audience
    {
        return Err(OAuthError::new(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("resource must be {}", state.settings.audience),
        ));
    }
    let mut tx = state.db.begin().await.map_err(|_| unavailable())?;
    let (authorization_id, agent, username, scope) = if refresh {
        let token = form
            .get("refresh_token")
            .ok_or_else(|| invalid_request("refresh_token is required"))?;
        match db::authorizations::take_refresh(&mut tx, &sha256_hex(token))
            .await
            .map_err(|_| unavailable())?
        {
            Taken::Ok(t) if t.client_id == client_id => {
                (t.authorization_id, t.agent, t.username, t.scope)
            }
            Taken::Ok(_) => {
                tx.commit().await.map_err(|_| unavailable())?;
                return Err(invalid_grant(
                    "the refresh token was issued to another client",
                ));
            }
            Taken::Invalid => return Err(invalid_grant("the refresh token is not valid")),
            Taken::Replayed(id) => {
                drop(tx);
                revoke_replayed(state, id, "refresh token reused").await;
                return Err(invalid_grant(
                    "the refresh token was already used; every token of this authorization is revoked",
                ));
            }
        }
    } else {
        let code = form
            .get("code")
            .ok_or_else(|| invalid_request("code is required"))?;
        let verifier = form
            .get("code_verifier")
            .ok_or_else(|| invalid_request("code_verifier is required (PKCE)"))?;
        // RFC 7636 §4.1: 43 to 128 unreserved characters.
        if !(43..=128).contains(&verifier.len())
            || !verifier
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        {
            return Err(invalid_request(
                "code_verifier must be 43 to 128 unreserved characters",
            ));
        }
        let redirect_uri = form
            .get("redirect_uri")
            .ok_or_else(|| invalid_request("redirect_uri is required"))?;
        let taken = db::authorizations::take_code(&mut tx, &sha256_hex(code))
            .await
            .map_err(|_| unavailable())?;
        let c = match taken {
            Taken::Ok(c) => c,
            Taken::Invalid => {
                return Err(invalid_grant(
                    "the code is not valid (unknown, expired or revoked)",
                ));
            }
            Taken::Replayed(id) => {
                drop(tx);
                revoke_replayed(state, id, "authorization code replayed").await;
                return Err(invalid_grant(
                    "the code was already used; the tokens issued from it are revoked",
                ));
            }
        };
        // The code is spent whatever follows: a wrong verifier does not get another try.
        tx.commit().await.map_err(|_| unavailable())?;
        tx = state.db.begin().await.map_err(|_| unavailable())?;
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        if c.client_id != client_id {
            return Err(invalid_grant("the code was issued to another client"));
        }
        if &c.redirect_uri != redirect_uri {
            return Err(invalid_grant(
                "redirect_uri is not the one the code was issued for",
            ));
        }
        if c.resource != state.settings.audience {
            return Err(invalid_grant("the code was issued for another resource"));
        }
        if Sha256::digest(challenge.as_bytes()) != Sha256::digest(c.code_challenge.as_bytes()) {
            return Err(invalid_grant(
                "code_verifier does not match the code_challenge",
            ));
        }
        (c.authorization_id, c.agent, c.username, c.scope)
    };
    let snapshot = state.policy.load();
    let grants = snapshot
        .agent(&agent)
        .map(|a| a.grants.clone())
        .unwrap_or_default();
    let may = snapshot.may_act_as(&username, &agent);
    drop(snapshot);
    if !may {
        return Err(invalid_grant("the person may no longer act as this agent"));
    }
    let token_scope = scope::narrow(&grants, Some(&scope))
        .map_err(|e| OAuthError::new(StatusCode::BAD_REQUEST, "invalid_scope", e))?;
    let refresh_token = random_token();
    db::authorizations::insert_refresh(
        &mut tx,
        authorization_id,
        &sha256_hex(&refresh_token),
        Utc::now() + chrono::Duration::days(REFRESH_TTL_DAYS),
    )
    .await
    .map_err(|_| unavailable())?;
    let key = db::keys::current_signing_key(&state.db)
        .await
        .ok()
        .flatten()
        .ok_or_else(unavailable)?;
    let claims = AccessClaims::new(
        &state.settings.issuer,
        &state.settings.audience,
        &agent,
        client_id,
        &token_scope,
        &grants,
        state.settings.token_ttl,
    )
    .acting_for(&username, authorization_id);
    let jwt = sign(&claims, &key.kid, &key.private_pkcs8).map_err(|_| {
        OAuthError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "signing failed",
        )
    })?;
    tx.commit().await.map_err(|_| unavailable())?;
    // The consent may have been given on another instance a moment ago: this token is checked
    // against this instance's snapshot, which must not wait for the NOTIFY to have it.
    if state
        .policy
        .load()
        .authorization(&authorization_id)
        .is_none()
        && let Err(e) = state.reload_policy().await
    {
        tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
    }
    tracing::info!(agent = %agent, client_id, person = %username, jti = %claims.jti, "access token issued to a host");
    let body = json!({
        "access_token": jwt,
        "token_type": "Bearer",
        "expires_in": state.settings.token_ttl.as_secs(),
        "scope": claims.scope,
        "refresh_token": refresh_token,
    });
    Ok((body, claims))
}

/// RFC 7009 for public clients: a host revoking its refresh token (or an access token issued
/// under a consent) ends the whole authorization. The answer is 200 whatever was sent, so
/// that nobody learns which tokens exist; `None` when this is not a public client's request.
pub async fn revoke_public(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    form: &HashMap<String, String>,
) -> Option<Response> {
    let client_id = public_client_id(headers, form).ok()?;
    // Confidential clients keep authenticating as before (a missing secret is theirs to fix).
    let public = cimd::is_url_client_id(client_id)
        || matches!(
            db::public_clients::public_client_by_id(&state.db, client_id).await,
            Ok(Some(_))
        );
    if !public {
        return None;
    }
    let ok = || {
        (
            StatusCode::OK,
            [(axum::http::header::CACHE_CONTROL, "no-store")],
        )
            .into_response()
    };
    let Some(token) = form.get("token") else {
        return Some(invalid_request("token is required").into_response());
    };
    let from_refresh = db::authorizations::of_refresh_token(&state.db, &sha256_hex(token))
        .await
        .ok()
        .flatten();
    let id = match from_refresh {
        Some((id, owner)) if owner == client_id => Some(id),
        Some(_) => None,
        None => super::decode_ours(state, token, false)
            .filter(|c| c.client_id == client_id)
            .and_then(|c| c.authorization_id)
            .and_then(|id| Uuid::parse_str(&id).ok()),
    };
    if let Some(id) = id {
        let done = async {
            let mut tx = state.db.begin().await?;
            db::authorizations::revoke(
                &mut tx,
                &format!("client:{client_id}"),
                id,
                None,
                "revoked by the client",
            )
            .await?;
            tx.commit().await
        }
        .await;
        if let Err(e) = done {
            tracing::error!(error = %e, "recording a revocation failed");
            return Some(unavailable().into_response());
        }
        if let Err(e) = state.reload_policy().await {
            tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
        }
    }
    Some(ok())
}
