//! The authorization-code grant's request and consent, for interactive hosts (OAuth 2.1:
//! public clients, PKCE with S256 only): which client asks, whether its request holds, and the
//! code a person's consent issues. `/oauth/authorize` checks a request and hands it to the
//! consent page under `/admin` (where the sign-in cookie lives); the page asks the person which
//! agent the host may act as and calls [`issue_code`]. Both surfaces only translate.
//!
//! Until the client and its redirect URI are known to match, errors are shown on a page and
//! never redirected: an attacker must not be able to bounce a browser off this server to a URL
//! of their choosing. The answers are the same whichever surface gives them, so they are
//! built here: a redirect carrying the error or code, or a bare page.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use uuid::Uuid;

use super::cimd::{self, CimdError};
use super::redirect::redirect_matches;
use super::secrets::{random_token, sha256_hex};
use crate::audit::RequestOrigin;
use crate::db;
use crate::db::authorizations::NewAuthorization;
use crate::limits::LimitedAction;
use crate::state::AppState;

/// Admits one authorize request from its source, or says how long to wait. Anyone may ask,
/// and a metadata-document client id makes this server fetch a URL: the token endpoint's
/// per-address budget bounds how often one source can make it do so.
pub async fn admit(state: &AppState, origin: Option<&RequestOrigin>) -> Result<(), Duration> {
    let action = LimitedAction::TokenRequest {
        source: super::source_of(origin),
    };
    match state.limits.take(action).await {
        Ok(_) => Ok(()),
        Err(refusal) => Err(refusal.retry_after()),
    }
}

/// Admits one dynamic client registration from `source`, or says how long to wait: each one
/// writes a row, so an address gets a few, then one every few minutes.
pub async fn admit_registration(state: &AppState, source: Option<IpAddr>) -> Result<(), Duration> {
    match state
        .limits
        .take(LimitedAction::Registration { source })
        .await
    {
        Ok(_) => Ok(()),
        Err(refusal) => Err(refusal.retry_after()),
    }
}

/// Life of an authorization code.
pub const CODE_TTL_SECS: i64 = 60;
/// Longest authorize query accepted.
pub const MAX_QUERY: usize = 8 * 1024;
const MAX_STATE: usize = 1024;

/// A host as the consent page shows it.
#[derive(Debug, Clone)]
pub struct Client {
    pub client_id: String,
    pub name: String,
    /// The host part of a metadata-document client id; `None` for a registered client.
    pub url_host: Option<String>,
    pub redirect_uris: Vec<String>,
    /// Whether an admin looked at this client's redirect URIs: they made it, or approved the
    /// host's own registration. A client registered with `--oauth-registration open` has
    /// only its own word for them.
    pub vetted: bool,
}

impl Client {
    /// Whether errors may be sent to this client's redirect URI without the person choosing
    /// to go there: only when an admin registered the client (and so vetted its URIs).
    pub fn redirects_trusted(&self) -> bool {
        self.url_host.is_none() && self.vetted
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
            vetted: false,
        });
    }
    if client_id.len() > 128 {
        return Err("unknown client".into());
    }
    match db::public_clients::public_client_by_id(&state.db, client_id).await {
        // Never redirected: until an admin approved it, its redirect URIs are its own word.
        Ok(Some(c)) if c.is_held() => {
            if c.expires_at.is_some_and(|t| t < chrono::Utc::now()) {
                Err("This application's registration expired before an administrator approved it. Connect it again to register anew.".into())
            } else {
                Err(format!(
                    "This application (\"{}\", client {}) registered itself and waits for an administrator's approval. Ask an administrator to approve it under Host applications in toolgate's admin pages, then reload this page.",
                    c.client_name, c.client_id
                ))
            }
        }
        Ok(Some(c)) => Ok(Client {
            vetted: !c.is_dynamic() || c.approved_by.is_some(),
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
    // The form only: whether the chosen agent holds it is checked at consent.
    if let Err(e) = super::scope::parse(Some(&scope)) {
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
    if let Err(e) = super::scope::narrow(&grants, Some(&req.scope)) {
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
