//! The gateway as its own OAuth 2.1 authorization server: client credentials for agents,
//! RFC 8414 / 9728 metadata, JWKS, revocation (RFC 7009) and introspection (RFC 7662); and
//! the authorization-code grant for interactive hosts ([`authorize`], [`cimd`]).

pub mod authorize;
pub mod register;

use std::collections::HashMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use chrono::{TimeZone, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};

use crate::audit::{Outcome, RequestOrigin};
use crate::auth::admin::{self, AdminRefusal};
use crate::auth::client::{self, AuthenticatedClient, ClientRefusal};
use crate::auth::keys;
use crate::auth::scope;
use crate::auth::token::{AccessClaims, sign};
use crate::db;
use crate::state::AppState;

pub fn router(registration: crate::config::Registration) -> Router<AppState> {
    let router = Router::new();
    let router = if registration == crate::config::Registration::Off {
        router
    } else {
        router.route(
            "/oauth/register",
            post(register::register)
                .layer(axum::extract::DefaultBodyLimit::max(register::MAX_BODY)),
        )
    };
    router
        .route("/oauth/token", post(token))
        .route("/oauth/revoke", post(revoke))
        .route("/oauth/introspect", post(introspect))
        .route("/oauth/authorize", get(authorize::authorize))
        .route("/.well-known/oauth-authorization-server", get(as_metadata))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
        .route("/.well-known/jwks.json", get(jwks))
}

/// An OAuth error response (RFC 6749 §5.2).
pub struct OAuthError {
    status: StatusCode,
    error: &'static str,
    description: String,
    basic_challenge: bool,
    retry_after: Option<u64>,
}

impl OAuthError {
    fn new(status: StatusCode, error: &'static str, description: impl Into<String>) -> Self {
        Self {
            status,
            error,
            description: description.into(),
            basic_challenge: false,
            retry_after: None,
        }
    }
    fn invalid_client(description: impl Into<String>) -> Self {
        Self {
            basic_challenge: true,
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_client", description)
        }
    }
    /// Too many failed credential checks from this source or for this client id.
    fn slow_down(wait: std::time::Duration) -> Self {
        Self {
            retry_after: Some(retry_secs(wait)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "slow_down",
                "too many failed client authentications; retry later",
            )
        }
    }
    /// Every secret verification is taken; refused without a guess being made or counted.
    fn busy() -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "too many client authentications at once; retry shortly",
            )
        }
    }
    /// Whether this error is about the presented credential (audited as `client_auth.failed`).
    fn is_credential_failure(&self) -> bool {
        matches!(self.error, "invalid_client" | "slow_down") || self.retry_after.is_some()
    }
    /// The audit outcome of a refused credential.
    fn outcome(&self) -> Outcome {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => Outcome::RateLimited,
            StatusCode::SERVICE_UNAVAILABLE => Outcome::Busy,
            _ => Outcome::Denied,
        }
    }
}

fn retry_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

impl IntoResponse for OAuthError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CACHE_CONTROL, "no-store")],
            Json(json!({"error": self.error, "error_description": self.description})),
        )
            .into_response();
        if self.basic_challenge
            && let Ok(v) = "Basic realm=\"toolgate\"".parse()
        {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        r
    }
}

/// Puts a refused client authentication on record (see [`client::authentication_refused`]).
fn audit_failure(
    state: &AppState,
    origin: Option<&RequestOrigin>,
    endpoint: &str,
    client_id: Option<String>,
    err: &OAuthError,
) {
    client::authentication_refused(
        state,
        origin,
        endpoint,
        client_id.as_deref(),
        err.outcome(),
        err.error,
        &err.description,
    );
}

/// Authenticates the client (see [`client::authenticate`]), in OAuth's words when it fails.
pub async fn authenticate_client(
    state: &AppState,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
    origin: Option<&RequestOrigin>,
) -> Result<AuthenticatedClient, OAuthError> {
    client::authenticate(state, headers, form, origin)
        .await
        .map_err(|refusal| match refusal {
            ClientRefusal::Malformed(d) => {
                OAuthError::new(StatusCode::BAD_REQUEST, "invalid_request", d)
            }
            ClientRefusal::Invalid(d) => OAuthError::invalid_client(d),
            ClientRefusal::Limited(wait) => OAuthError::slow_down(wait),
            ClientRefusal::Busy => OAuthError::busy(),
            ClientRefusal::Unavailable => OAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "try again",
            ),
        })
}

async fn token(
    State(state): State<AppState>,
    origin: Option<axum::Extension<crate::audit::RequestOrigin>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let origin = origin.map(|o| o.0);
    let claimed = form.get("client_id").map(String::as_str);
    if let Err(wait) = client::admit_token_request(&state, origin.as_ref(), claimed).await {
        let secs = retry_secs(wait);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.to_string()), (header::CACHE_CONTROL, "no-store".to_owned())],
            Json(json!({"error": "slow_down", "error_description": "too many token requests from this address"})),
        )
            .into_response();
    }
    match issue_token(&state, &headers, &form, origin.as_ref()).await {
        Ok((body, claims)) => {
            if client::token_issued(&state, origin.as_ref(), &claims)
                .await
                .is_err()
            {
                return OAuthError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    "the audit log is unavailable; retry shortly",
                )
                .into_response();
            }
            (
                StatusCode::OK,
                [
                    (header::CACHE_CONTROL, "no-store"),
                    (header::PRAGMA, "no-cache"),
                ],
                Json(body),
            )
                .into_response()
        }
        Err(err) => {
            let client_id = client::claimed_client_id(&headers, &form);
            if err.is_credential_failure() {
                audit_failure(&state, origin.as_ref(), "/oauth/token", client_id, &err);
            } else {
                client::token_refused(
                    &state,
                    origin.as_ref(),
                    client_id.as_deref(),
                    err.error,
                    &err.description,
                );
            }
            err.into_response()
        }
    }
}

async fn issue_token(
    state: &AppState,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
    origin: Option<&RequestOrigin>,
) -> Result<(Value, AccessClaims), OAuthError> {
    // Interactive hosts are public clients: PKCE and the code (or refresh token) are their
    // proof, there is no client secret to check.
    match form.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            return authorize::exchange(state, headers, form, false).await;
        }
        Some("refresh_token") => return authorize::exchange(state, headers, form, true).await,
        _ => {}
    }
    let client = authenticate_client(state, headers, form, origin).await?;
    match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") => {}
        Some(other) => {
            return Err(OAuthError::new(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                format!(
                    "grant_type `{other}` is not supported; use client_credentials, authorization_code or refresh_token"
                ),
            ));
        }
        None => {
            return Err(OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "grant_type is required",
            ));
        }
    }
    if let Some(resource) = form.get("resource")
        && resource.trim_end_matches('/') != state.settings.audience
    {
        return Err(OAuthError::new(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("resource must be {}", state.settings.audience),
        ));
    }
    let snapshot = state.policy.load();
    let grants = snapshot
        .agent(&client.agent)
        .map(|a| a.grants.clone())
        .unwrap_or_default();
    drop(snapshot);
    let token_scope = scope::narrow(&grants, form.get("scope").map(String::as_str))
        .map_err(|e| OAuthError::new(StatusCode::BAD_REQUEST, "invalid_scope", e))?;
    let key = db::keys::current_signing_key(&state.db)
        .await
        .ok()
        .flatten()
        .ok_or_else(|| {
            OAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "no signing key",
            )
        })?;
    let claims = AccessClaims::new(
        &state.settings.issuer,
        &state.settings.audience,
        &client.agent,
        &client.client_id,
        &token_scope,
        &grants,
        state.settings.token_ttl,
    );
    let jwt = sign(&claims, &key.kid, &key.private_pkcs8).map_err(|_| {
        OAuthError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "signing failed",
        )
    })?;
    tracing::info!(agent = %client.agent, client_id = %client.client_id, jti = %claims.jti, "access token issued");
    let body = json!({
        "access_token": jwt,
        "token_type": "Bearer",
        "expires_in": state.settings.token_ttl.as_secs(),
        "scope": claims.scope,
    });
    Ok((body, claims))
}

/// Verifies one of our tokens' signature and returns its claims, expired or not (for
/// revocation and introspection).
fn decode_ours(state: &AppState, token: &str, check_exp: bool) -> Option<AccessClaims> {
    let header = jsonwebtoken::decode_header(token).ok()?;
    if header.alg != Algorithm::EdDSA {
        return None;
    }
    let snapshot = state.policy.load();
    let key = snapshot.verify_key(header.kid.as_deref()?)?;
    let mut v = Validation::new(Algorithm::EdDSA);
    v.set_issuer(&[&state.settings.issuer]);
    v.set_audience(&[&state.settings.audience]);
    v.validate_exp = check_exp;
    jsonwebtoken::decode::<AccessClaims>(token, &DecodingKey::from_ed_der(key), &v)
        .ok()
        .map(|d| d.claims)
}

async fn revoke(
    State(state): State<AppState>,
    origin: Option<axum::Extension<RequestOrigin>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let origin = origin.map(|o| o.0);
    // A public client (an interactive host) has no credential but its tokens.
    if !headers.contains_key(header::AUTHORIZATION)
        && !form.contains_key("client_secret")
        && !form.contains_key("client_assertion")
        && let Some(r) = authorize::revoke_public(&state, &headers, &form).await
    {
        return r;
    }
    let client = match authenticate_client(&state, &headers, &form, origin.as_ref()).await {
        Ok(c) => c,
        Err(e) => {
            if e.is_credential_failure() {
                let client_id = client::claimed_client_id(&headers, &form);
                audit_failure(&state, origin.as_ref(), "/oauth/revoke", client_id, &e);
            }
            return e.into_response();
        }
    };
    let Some(token) = form.get("token") else {
        return OAuthError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "token is required",
        )
        .into_response();
    };
    // RFC 7009 §2.2: an invalid or foreign token is answered 200 all the same.
    if let Some(claims) = decode_ours(&state, token, false)
        && claims.client_id == client.client_id
        && let Ok(jti) = uuid::Uuid::parse_str(&claims.jti)
    {
        let expires = Utc
            .timestamp_opt(claims.exp, 0)
            .single()
            .unwrap_or_else(Utc::now);
        if let Err(e) = crate::service::tokens::revoke(
            &state,
            &format!("client:{}", client.client_id),
            jti,
            expires,
        )
        .await
        {
            tracing::error!(error = %e, "recording a revocation failed");
            return OAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "try again",
            )
            .into_response();
        }
        tracing::info!(jti = %jti, client_id = %client.client_id, "access token revoked");
    }
    (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")]).into_response()
}

async fn introspect(
    State(state): State<AppState>,
    origin: Option<axum::Extension<RequestOrigin>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let origin = origin.map(|o| o.0);
    let checked = admin::check(
        &state,
        &headers,
        origin.as_ref(),
        "/oauth/introspect",
        "oauth",
    )
    .await;
    match checked {
        Ok(()) => {}
        Err(AdminRefusal::Invalid) => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                Json(json!({"error": "invalid_client"})),
            )
                .into_response();
        }
        Err(AdminRefusal::Limited(wait)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_secs(wait).to_string())],
                Json(json!({"error": "too many failed admin token checks from this address; retry later"})),
            )
                .into_response();
        }
    }
    let inactive = Json(json!({"active": false})).into_response();
    let Some(token) = form.get("token") else {
        return inactive;
    };
    let snapshot = state.policy.load();
    match crate::auth::token::verify(token, &snapshot, &state.settings.expected_token()) {
        Ok((_, c)) => Json(json!({
            "active": true,
            "token_type": "Bearer",
            "iss": c.iss, "sub": c.sub, "aud": c.aud, "client_id": c.client_id,
            "iat": c.iat, "exp": c.exp, "jti": c.jti, "scope": c.scope,
            "tool_prefixes": c.tool_prefixes,
            "act": c.act, "authorization_id": c.authorization_id,
        }))
        .into_response(),
        Err(_) => inactive,
    }
}

async fn as_metadata(State(state): State<AppState>) -> Json<Value> {
    let i = &state.settings.issuer;
    let mut metadata = json!({
        "issuer": i,
        "token_endpoint": format!("{i}/oauth/token"),
        "jwks_uri": format!("{i}/.well-known/jwks.json"),
        "revocation_endpoint": format!("{i}/oauth/revoke"),
        "introspection_endpoint": format!("{i}/oauth/introspect"),
        "grant_types_supported": ["client_credentials", "authorization_code", "refresh_token"],
        // `none`: interactive hosts are public clients proving themselves with PKCE.
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"],
        "token_endpoint_auth_signing_alg_values_supported": ["EdDSA", "RS256", "ES256", "PS256"],
        "revocation_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"],
        // The generic scopes only: listing every group would tell any stranger what the
        // catalog holds. `tools:<group>` and `tools:<group>__<tool>` narrow a token too; an
        // agent learns its own tools from `tools/list`. Clients that ask for the OpenID
        // scopes by habit (`mcp-remote`) get them ignored, not refused.
        "scopes_supported": scope::SUPPORTED_SCOPES,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "authorization_endpoint": format!("{i}/oauth/authorize"),
        "code_challenge_methods_supported": ["S256"],
        "client_id_metadata_document_supported": true,
        "authorization_response_iss_parameter_supported": true,
    });
    if state.settings.registration != crate::config::Registration::Off {
        metadata["registration_endpoint"] = json!(format!("{i}/oauth/register"));
    }
    Json(metadata)
}

async fn resource_metadata(State(state): State<AppState>) -> Json<Value> {
    Json(json!({
        "resource": state.settings.audience,
        "resource_name": "toolgate",
        "authorization_servers": [state.settings.issuer],
        "bearer_methods_supported": ["header"],
        "scopes_supported": scope::SUPPORTED_SCOPES,
    }))
}

async fn jwks(State(state): State<AppState>) -> Response {
    match db::keys::published_keys(&state.db).await {
        Ok(keys) => (
            [(header::CACHE_CONTROL, "public, max-age=300")],
            Json(json!({"keys": keys.iter().map(|k| keys::jwk(&k.kid, &k.public_key)).collect::<Vec<_>>()})),
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "reading the signing keys failed");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}
