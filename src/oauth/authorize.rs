//! The authorization-code grant for interactive hosts (OAuth 2.1: public clients, PKCE with
//! S256 only), and its two token grants: `authorization_code` and `refresh_token`.
//!
//! `/oauth/authorize` checks the request and hands it to the consent page under `/admin`
//! (where the sign-in cookie lives); the page (src/web/consent.rs) asks the person which agent
//! the host may act as and calls [`issue_code`]. Until the client and its redirect URI are
//! known to match, errors are shown on a page and never redirected: an attacker must not be
//! able to bounce a browser off this server to a URL of their choosing.

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
use crate::auth::cimd::{self, CimdError};
use crate::auth::redirect::redirect_matches;
use crate::auth::token::{AccessClaims, sign};
use crate::db;
use crate::db::authorizations::{NewAuthorization, Taken};
use crate::state::AppState;

/// Life of an authorization code.
pub const CODE_TTL_SECS: i64 = 60;
/// Life of a refresh token (each use issues the next, for as long again).
pub const REFRESH_TTL_DAYS: i64 = 30;
/// Longest authorize query accepted.
const MAX_QUERY: usize = 8 * 1024;
const MAX_STATE: usize = 1024;

/// A host as the consent page shows it.
#[derive(Debug, Clone)]
pub struct Client {
    pub client_id: String,
    pub name: String,
    /// The host part of a metadata-document client id; `None` for a registered client.
    pub url_host: Option<String>,
    pub redirect_uris: Vec<String>,
}

impl Client {
    /// Whether errors may be sent to this client's redirect URI without the person choosing
    /// to go there: only when an admin registered the client (and so vetted its URIs).
    pub fn redirects_trusted(&self) -> bool {
        self.url_host.is_none()
    }
}

/// An authorize request that passed every check.
#[derive(Debug, Clone)]
pub struct AuthorizeRequest {
    pub client: Client,
    pub redirect_uri: String,
    pub state: String,
    pub code_challenge: String,
    pub scope: String,
    pub resource: String,
}

/// Why an authorize request was refused.
#[derive(Debug)]
pub enum AuthorizeError {
    /// Before the redirect URI is trusted: shown to the person, never redirected.
    Page(String),
    /// For the client at its (verified) redirect URI: redirected there when `trusted` (an
    /// admin registered the client), otherwise shown on a page (see the module's comment).
    Redirect {
        redirect_uri: String,
        error: &'static str,
        description: String,
        state: Option<String>,
        trusted: bool,
    },
}

impl AuthorizeError {
    /// The answer to a browser that has not signed in: a redirect carrying the error for a
    /// trusted client, or the message for a page.
    pub fn redirect_or_message(self, issuer: &str) -> Result<Response, String> {
        match self {
            AuthorizeError::Page(m) => Err(m),
            AuthorizeError::Redirect {
                error,
                description,
                trusted: false,
                ..
            } => Err(untrusted_message(error, &description)),
            AuthorizeError::Redirect {
                redirect_uri,
                error,
                description,
                state,
                trusted: true,
            } => Ok(redirect_to(
                &redirect_uri,
                &error_pairs(error, description, state, issuer),
            )),
        }
    }

    /// The answer to a person who has signed in: as [`Self::redirect_or_message`], except
    /// that an untrusted client's error page links back to the application with the error,
    /// for the person to follow if they recognise it.
    pub fn for_signed_in(self, issuer: &str) -> Result<Response, String> {
        match self {
            AuthorizeError::Redirect {
                redirect_uri,
                error,
                description,
                state,
                trusted: false,
            } => {
                let (status, message) = if error == "access_denied" {
                    (
                        StatusCode::OK,
                        "You declined: nothing was shared with the application.".to_owned(),
                    )
                } else {
                    (
                        StatusCode::BAD_REQUEST,
                        untrusted_message(error, &description),
                    )
                };
                let pairs = error_pairs(error, description, state, issuer);
                Ok(match with_query(&redirect_uri, &pairs) {
                    Some(back) => page(status, &message, Some(&back)),
                    None => page(status, &message, None),
                })
            }
            other => other.redirect_or_message(issuer),
        }
    }
}

fn error_pairs(
    error: &'static str,
    description: String,
    state: Option<String>,
    issuer: &str,
) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("error", error.to_owned()),
        ("error_description", description),
    ];
    if let Some(s) = state {
        pairs.push(("state", s));
    }
    pairs.push(("iss", issuer.to_owned()));
    pairs
}

/// What the person reads when an untrusted client's request is refused.
fn untrusted_message(error: &str, description: &str) -> String {
    format!(
        "The application's request is not valid ({error}: {description}). \
         It was not sent back to the application automatically: \
         an application identified by a URL chooses its own return address."
    )
}

/// `uri` with `pairs` added to its query.
fn with_query(uri: &str, pairs: &[(&str, String)]) -> Option<String> {
    let mut u = url::Url::parse(uri).ok()?;
    {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
    }
    Some(u.into())
}

/// `uri` with `pairs` added to its query, as a 303.
pub fn redirect_to(uri: &str, pairs: &[(&str, String)]) -> Response {
    match with_query(uri, pairs) {
        Some(u) => Redirect::to(&u).into_response(),
        None => (StatusCode::BAD_REQUEST, "bad redirect URI").into_response(),
    }
}

/// Finds the client: a metadata document for a URL, a registered public client otherwise.
async fn find_client(state: &AppState, client_id: &str) -> Result<Client, String> {
    if cimd::is_url_client_id(client_id) {
        let m = state
            .cimd
            .get(client_id)
            .await
            .map_err(|e: CimdError| e.to_string())?;
        let host = url::Url::parse(client_id)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned));
        return Ok(Client {
            client_id: m.client_id.clone(),
            name: m.client_name.clone(),
            url_host: host,
            redirect_uris: m.redirect_uris.clone(),
        });
    }
    if client_id.len() > 128 {
        return Err("unknown client".into());
    }
    match db::public_clients::public_client_by_id(&state.db, client_id).await {
        Ok(Some(c)) => Ok(Client {
            client_id: c.client_id,
            name: c.client_name,
            url_host: None,
            redirect_uris: c.redirect_uris,
        }),
        Ok(None) => Err(
            "this client is not known here: it is neither a Client ID Metadata Document URL nor a client an admin registered"
                .into(),
        ),
        Err(e) => {
            tracing::error!(error = %e, "reading a public client failed");
            Err("the server could not check this client; try again".into())
        }
    }
}

/// Checks an authorize request's parameters (RFC 6749 §4.1.1, RFC 7636, RFC 8707).
pub async fn validate(
    state: &AppState,
    params: &HashMap<String, String>,
) -> Result<AuthorizeRequest, AuthorizeError> {
    let page = |m: &str| AuthorizeError::Page(m.to_owned());
    let client_id = params
        .get("client_id")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| page("The request names no client (client_id is missing)."))?;
    let client = find_client(state, client_id)
        .await
        .map_err(AuthorizeError::Page)?;
    let redirect_uri = params
        .get("redirect_uri")
        .ok_or_else(|| page("The request has no redirect_uri."))?;
    if !client
        .redirect_uris
        .iter()
        .any(|r| redirect_matches(r, redirect_uri))
    {
        return Err(page(
            "The redirect_uri is not one this client registered. Nothing was sent back to the application.",
        ));
    }
    // From here on the redirect URI is the client's own: errors are for it (sent there only
    // if an admin registered the client).
    let state_param = params.get("state").filter(|s| !s.is_empty()).cloned();
    let trusted = client.redirects_trusted();
    let to_client = |error: &'static str, description: &str| AuthorizeError::Redirect {
        redirect_uri: redirect_uri.clone(),
        error,
        description: description.to_owned(),
        state: state_param.clone(),
        trusted,
    };
    if params.get("response_type").map(String::as_str) != Some("code") {
        return Err(to_client(
            "unsupported_response_type",
            "response_type must be code",
        ));
    }
    let Some(st) = state_param.clone() else {
        return Err(to_client("invalid_request", "state is required"));
    };
    if st.len() > MAX_STATE {
        return Err(to_client("invalid_request", "state is too long"));
    }
    let challenge = params
        .get("code_challenge")
        .ok_or_else(|| to_client("invalid_request", "code_challenge is required (PKCE)"))?;
    match params.get("code_challenge_method").map(String::as_str) {
        Some("S256") => {}
        _ => {
            return Err(to_client(
                "invalid_request",
                "code_challenge_method must be S256",
            ));
        }
    }
    // base64url of a sha256: 43 characters.
    if challenge.len() != 43
        || !challenge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(to_client(
            "invalid_request",
            "code_challenge must be the base64url sha256 of the verifier",
        ));
    }
    let resource = match params.get("resource") {
        Some(r) if r.trim_end_matches('/') == state.settings.audience => {
            state.settings.audience.clone()
        }
        Some(_) => {
            return Err(to_client(
                "invalid_target",
                &format!("resource must be {}", state.settings.audience),
            ));
        }
        None => state.settings.audience.clone(),
    };
    let scope = params.get("scope").cloned().unwrap_or_default();
    if scope.len() > 4096 {
        return Err(to_client("invalid_scope", "scope is too long"));
    }
    // The form only: whether the chosen agent holds it is checked at consent.
    if let Err(e) = super::narrow(&[], Some(&scope)).or_else(|e| {
        if e.starts_with("none of") {
            Ok(Vec::new())
        } else {
            Err(e)
        }
    }) {
        return Err(to_client("invalid_scope", &e));
    }
    Ok(AuthorizeRequest {
        client,
        redirect_uri: redirect_uri.clone(),
        state: st,
        code_challenge: challenge.clone(),
        scope,
        resource,
    })
}

/// `GET /oauth/authorize`: checks the request, then passes it on to the consent page.
pub async fn authorize(
    State(state): State<AppState>,
    origin: Option<axum::Extension<crate::audit::RequestOrigin>>,
    RawQuery(query): RawQuery,
) -> Response {
    // Anyone may ask, and a metadata-document client id makes this server fetch a URL: the
    // token endpoint's per-address budget bounds how often one source can make it do so.
    let ip = origin
        .as_ref()
        .and_then(|o| o.remote_addr.as_deref())
        .and_then(|a| a.parse().ok());
    if let Some(ip) = ip
        && state.limits.check_token_ip(ip).is_err()
    {
        return error_page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-in requests from this address; wait a moment and try again.",
        );
    }
    let query = query.unwrap_or_default();
    if query.len() > MAX_QUERY {
        return error_page(StatusCode::BAD_REQUEST, "The request is too long.");
    }
    let params = parse_query(&query);
    match validate(&state, &params).await {
        // The consent page lives under /admin, where the sign-in cookie is sent; it checks
        // the request again, as it may be opened directly.
        Ok(_) => Redirect::to(&format!("/admin/consent?{query}")).into_response(),
        Err(e) => match e.redirect_or_message(&state.settings.issuer) {
            Ok(r) => r,
            Err(m) => error_page(StatusCode::BAD_REQUEST, &m),
        },
    }
}

/// A query string's parameters; a parameter given twice is refused as a whole (RFC 6749
/// §3.1) by keeping neither.
pub fn parse_query(query: &str) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut twice = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if out.insert(k.to_string(), v.into_owned()).is_some() {
            twice.push(k.to_string());
        }
    }
    for k in twice {
        out.remove(&k);
    }
    out
}

/// A plain page for errors before the client is trusted; the message is escaped.
pub fn error_page(status: StatusCode, message: &str) -> Response {
    page(status, message, None)
}

/// The page, with a link back to the application when `back` is given (for a person who has
/// signed in, to follow if they started the sign-in themselves).
fn page(status: StatusCode, message: &str, back: Option<&str>) -> Response {
    let link = back
        .map(|b| {
            format!(
                "<p><a id=\"authorize-back\" rel=\"noreferrer\" href=\"{}\">Return to the application anyway</a> \
                 (only if you started this sign-in yourself)</p>",
                escape_html(b)
            )
        })
        .unwrap_or_default();
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign-in request refused · toolgate</title>\
         <link rel=\"stylesheet\" href=\"/static/admin.css\"></head><body class=\"bare\"><main class=\"narrow\">\
         <section class=\"card\"><h1>This sign-in request was refused</h1><p id=\"authorize-error\">{}</p>{link}</section></main></body></html>",
        escape_html(message)
    );
    (
        status,
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-store"),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'self'; frame-ancestors 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Records the person's consent for `agent` and returns the redirect carrying the code.
/// Refused (`Err` with a message for the page) if the person may not act as the agent.
pub async fn issue_code(
    state: &AppState,
    req: &AuthorizeRequest,
    username: &str,
    agent: &str,
) -> Result<Response, String> {
    let snapshot = state.policy.load();
    if !snapshot.may_act_as(username, agent) {
        return Err(format!("You may not act as the agent `{agent}`."));
    }
    let grants = snapshot
        .agent(agent)
        .map(|a| a.grants.clone())
        .unwrap_or_default();
    drop(snapshot);
    if let Err(e) = super::narrow(&grants, Some(&req.scope)) {
        return Ok(AuthorizeError::Redirect {
            redirect_uri: req.redirect_uri.clone(),
            error: "invalid_scope",
            description: e,
            state: Some(req.state.clone()),
            trusted: req.client.redirects_trusted(),
        }
        .for_signed_in(&state.settings.issuer)
        .unwrap_or_else(|m| error_page(StatusCode::BAD_REQUEST, &m)));
    }
    let code = random_token();
    let id = Uuid::now_v7();
    let n = NewAuthorization {
        id,
        client_id: &req.client.client_id,
        client_name: &req.client.name,
        agent,
        username,
        scope: &req.scope,
        code_hash: &sha256_hex(&code),
        redirect_uri: &req.redirect_uri,
        code_challenge: &req.code_challenge,
        resource: &req.resource,
        code_expires: Utc::now() + chrono::Duration::seconds(CODE_TTL_SECS),
    };
    let created = async {
        let mut tx = state.db.begin().await?;
        let ok = db::authorizations::create(&mut tx, &format!("user:{username}"), &n).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(ok)
    }
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "recording a consent failed");
        "The consent could not be recorded; try again.".to_owned()
    })?;
    if !created {
        return Err(format!("You may not act as the agent `{agent}`."));
    }
    // The access token issued for this code is checked against the snapshot: have it now.
    if let Err(e) = state.reload_policy().await {
        tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
    }
    tracing::info!(client_id = %req.client.client_id, agent, username, authorization = %id, "host authorized");
    Ok(redirect_to(
        &req.redirect_uri,
        &[
            ("code", code),
            ("state", req.state.clone()),
            ("iss", state.settings.issuer.clone()),
        ],
    ))
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
    let prefixes = super::narrow(&grants, Some(&scope))
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
        &prefixes,
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
