//! The consent page of the authorization-code grant: a signed-in person lets a host act as
//! one of the agents they may act as.
//!
//! `/oauth/authorize` sends the browser here with the request's own query; it is checked
//! again on every step (this page may be opened directly, and the form posted by anyone), and
//! the POST carries the session's CSRF token like every form of the UI.

use std::collections::HashMap;

use askama::Template;
use axum::Form;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};

use super::WebState;
use super::error::WebError;
use super::session::Admin;
use super::view::render;
use crate::auth::authorize::{self, AuthorizeRequest};

/// The request's parameters carried through the form, and nothing else.
const CARRIED: [&str; 8] = [
    "response_type",
    "client_id",
    "redirect_uri",
    "state",
    "code_challenge",
    "code_challenge_method",
    "scope",
    "resource",
];

#[derive(Template)]
#[template(path = "admin/hosts/consent.html")]
struct ConsentPage {
    csrf: String,
    username: String,
    client_name: String,
    client_id: String,
    /// The host of a metadata-document URL; empty for a registered client.
    client_host: String,
    redirect_uri: String,
    scopes: Vec<String>,
    agents: Vec<String>,
    fields: Vec<(String, String)>,
}

/// A refused request, for the signed-in person: a page, or the error sent back to a client an
/// admin registered.
fn refused(state: &WebState, e: authorize::AuthorizeError) -> Response {
    match e.for_signed_in(&state.settings.issuer) {
        Ok(r) => r,
        Err(m) => WebError::BadRequest(m).into_response(),
    }
}

async fn checked(
    state: &WebState,
    params: &HashMap<String, String>,
) -> Result<AuthorizeRequest, Response> {
    authorize::validate(state, params)
        .await
        .map_err(|e| refused(state, e))
}

pub async fn show(
    State(state): State<WebState>,
    admin: Admin,
    RawQuery(query): RawQuery,
) -> Result<Response, WebError> {
    let query = query.unwrap_or_default();
    if query.len() > 8 * 1024 {
        return Err(WebError::BadRequest("The request is too long.".into()));
    }
    let params = authorize::parse_query(&query);
    let req = match checked(&state, &params).await {
        Ok(r) => r,
        Err(r) => return Ok(r),
    };
    let agents = state.policy.load().agents_of_user(&admin.username);
    let fields = CARRIED
        .iter()
        .filter_map(|k| params.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    let mut page = render(&ConsentPage {
        csrf: admin.csrf.clone(),
        username: admin.username.clone(),
        client_name: req.client.name.clone(),
        client_id: req.client.client_id.clone(),
        client_host: req.client.url_host.clone().unwrap_or_default(),
        redirect_uri: req.redirect_uri.clone(),
        scopes: req.scope.split_whitespace().map(str::to_owned).collect(),
        agents,
        fields,
    })?;
    // The form's answer is a redirect to the host, which browsers check against
    // `form-action`: the CSP names the verified redirect URI's origin (and nothing else).
    if let Some(csp) = csp_allowing(&req.redirect_uri) {
        page.headers_mut()
            .insert(axum::http::header::CONTENT_SECURITY_POLICY, csp);
    }
    Ok(page)
}

/// The UI's CSP with `form-action` widened to the origin of `redirect_uri`.
fn csp_allowing(redirect_uri: &str) -> Option<axum::http::HeaderValue> {
    let u = url::Url::parse(redirect_uri).ok()?;
    let source = match u.origin() {
        o @ url::Origin::Tuple(..) => o.ascii_serialization(),
        // A private-use scheme (`com.example.app:/cb`) is allowed by its scheme.
        url::Origin::Opaque(_) => format!("{}:", u.scheme()),
    };
    // Only characters a CSP source may hold: nothing can end the directive early.
    if !source
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ":/.-+[]".contains(c))
    {
        return None;
    }
    let csp = super::CONTENT_SECURITY_POLICY.replace(
        "form-action 'self'",
        &format!("form-action 'self' {source}"),
    );
    axum::http::HeaderValue::from_str(&csp).ok()
}

pub async fn submit(
    State(state): State<WebState>,
    admin: Admin,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, WebError> {
    let params: HashMap<String, String> = form
        .iter()
        .filter(|(k, _)| CARRIED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let req = match checked(&state, &params).await {
        Ok(r) => r,
        Err(r) => return Ok(r),
    };
    if form.get("decision").map(String::as_str) != Some("allow") {
        // A declined request from a client identified by a URL is not bounced to its
        // redirect URI either (RFC 9700 §4.11.2: declining is what a person does when the
        // request looks wrong): a page says so, with a link the person may follow.
        return Ok(authorize::AuthorizeError::Redirect {
            redirect_uri: req.redirect_uri.clone(),
            error: "access_denied",
            description: "the person declined".to_owned(),
            state: Some(req.state.clone()),
            trusted: req.client.redirects_trusted(),
        }
        .for_signed_in(&state.settings.issuer)
        .unwrap_or_else(|m| WebError::BadRequest(m).into_response()));
    }
    let agent = form.get("agent").map(String::as_str).unwrap_or("");
    authorize::issue_code(&state, &req, &admin.username, agent)
        .await
        .map_err(WebError::Forbidden)
}
