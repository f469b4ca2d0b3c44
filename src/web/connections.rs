//! "My connections": the credentials a person's tools need of them (`per: person` slots of the
//! groups the agents they may act as can reach), filled and cleared by the person. Write-only:
//! a value, once stored, is shown again to nobody; the page says only whether it is set and
//! when it was last used.

use std::collections::BTreeSet;

use askama::Template;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::{self, Admin, redirect_with};
use super::view::{Flash, render, when};
use crate::credentials::Per;
use crate::pool::Execution;
use crate::service::{self, ServiceError};

struct Row {
    group: String,
    name: String,
    set: bool,
    updated: String,
    last_used: String,
    /// Filled by connecting to the upstream's authorization server, not by a typed value.
    connect: bool,
    /// What is wrong with a connection (refused at refresh, expired).
    trouble: Option<String>,
}

#[derive(Template)]
#[template(path = "admin/connections.html")]
struct ConnectionsPage {
    csrf: String,
    rows: Vec<Row>,
    flash: Option<Flash>,
}

/// The person slots `username` can fill: those of the groups reachable by an agent they may
/// act as. Nothing else is shown, so the page names no group the person cannot use.
fn person_slots(state: &WebState, username: &str) -> BTreeSet<(String, String)> {
    let policy = state.policy.load();
    let mut out = BTreeSet::new();
    let mut upstreams_seen = BTreeSet::new();
    for agent in policy.agents_of_user(username) {
        let Some(view) = policy.agent(&agent) else {
            continue;
        };
        for tool in &view.visible {
            match &tool.exec {
                Execution::Script(spec) => {
                    for slot in spec.group.credentials.iter() {
                        if slot.per == Per::Person {
                            out.insert((spec.group.name.to_string(), slot.name.to_string()));
                        }
                    }
                }
                Execution::Upstream { upstream, .. } => {
                    if upstreams_seen.insert(upstream.clone()) {
                        for s in state.upstreams.slots(upstream).iter() {
                            // An exchanged slot is nothing the person fills.
                            if s.slot.per == Per::Person && s.exchange.is_none() {
                                out.insert((upstream.clone(), s.slot.name.to_string()));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

pub async fn index(
    State(state): State<WebState>,
    admin: Admin,
    flash: Option<axum::Extension<Flash>>,
) -> Result<Response, WebError> {
    let slots = person_slots(&state, &admin.username);
    let stored = service::credentials::list(&state, Per::Person, &admin.username).await?;
    let rows = slots
        .into_iter()
        .map(|(group, name)| {
            let info = stored.iter().find(|c| c.group == group && c.name == name);
            let connect = service::connections::is_connected_slot(&state, &group, &name);
            // A connected grant can be stored and still unusable (refused at refresh).
            let trouble = if connect && info.is_some() {
                service::credentials::slot(Per::Person, &admin.username, &group, &name)
                    .ok()
                    .and_then(|k| service::connections::trouble(&state, &k))
            } else {
                None
            };
            Row {
                set: info.is_some(),
                updated: info.map(|c| when(&c.updated_at)).unwrap_or_default(),
                last_used: info
                    .and_then(|c| c.last_used_at.as_ref())
                    .map(when)
                    .unwrap_or_else(|| "never".into()),
                connect,
                trouble,
                group,
                name,
            }
        })
        .collect();
    render(&ConnectionsPage {
        csrf: admin.csrf.clone(),
        rows,
        flash: flash.map(|f| f.0),
    })
}

#[derive(Deserialize)]
pub struct ValueForm {
    #[serde(default)]
    value: String,
}

/// The slot `(group, name)` of the signed-in person, if it is one they can fill (anything else
/// is "not found": a person stores nothing under a name no tool of theirs reads).
fn own_slot(
    state: &WebState,
    admin: &Admin,
    group: &str,
    name: &str,
) -> Result<crate::credentials::SlotKey, WebError> {
    if !person_slots(state, &admin.username).contains(&(group.to_owned(), name.to_owned())) {
        return Err(WebError::NotFound);
    }
    Ok(service::credentials::slot(
        Per::Person,
        &admin.username,
        group,
        name,
    )?)
}

pub async fn set(
    State(state): State<WebState>,
    admin: Admin,
    Path((group, name)): Path<(String, String)>,
    Form(form): Form<ValueForm>,
) -> Result<Response, WebError> {
    let slot = own_slot(&state, &admin, &group, &name)?;
    match service::credentials::set(&state, &admin.actor(), &slot, form.value.trim()).await {
        Ok(()) => Ok(redirect_with(
            &state,
            "/admin/connections",
            Flash::ok(format!(
                "`{name}` for `{group}` is stored; it is used on your calls and never shown again."
            )),
        )),
        Err(ServiceError::Invalid(e)) => {
            Ok(redirect_with(&state, "/admin/connections", Flash::warn(e)))
        }
        Err(e) => Err(e.into()),
    }
}

pub async fn delete(
    State(state): State<WebState>,
    admin: Admin,
    Path((group, name)): Path<(String, String)>,
) -> Result<Response, WebError> {
    let slot = own_slot(&state, &admin, &group, &name)?;
    service::credentials::delete(&state, &admin.actor(), &slot).await?;
    Ok(redirect_with(
        &state,
        "/admin/connections",
        Flash::ok(format!(
            "`{name}` for `{group}` is cleared: its calls fail until you set it again."
        )),
    ))
}

/// The cookie holding a connection's `state` between the redirect to the authorization server
/// and its callback: `SameSite=Lax`, as the way back is a cross-site navigation (the `Strict`
/// session cookie does not come with it, which is why the callback is bound to this cookie).
const FLOW_COOKIE: &str = "toolgate_connect";

fn flow_cookie(state: &WebState, value: &str, max_age: i64) -> HeaderValue {
    session::flow_cookie(
        state,
        FLOW_COOKIE,
        "/admin/connections/callback",
        value,
        max_age,
    )
}

/// `POST /admin/connections/{group}/{name}/connect`: sends the person to the upstream's
/// authorization server.
pub async fn connect(
    State(state): State<WebState>,
    admin: Admin,
    Path((group, name)): Path<(String, String)>,
) -> Result<Response, WebError> {
    let slot = own_slot(&state, &admin, &group, &name)?;
    match service::connections::start(&state, &admin.username, &slot.group, &slot.name).await {
        Ok((to, flow_state)) => {
            // A page that moves on by itself rather than a redirect: the UI's CSP allows forms
            // to send the browser to this origin only (`form-action 'self'`), and a browser
            // holds a form's redirects to that too.
            let host = url::Url::parse(&to)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_default();
            let mut r = render(&Go {
                to,
                group: slot.group.clone(),
                host,
            })?;
            r.headers_mut()
                .append(header::SET_COOKIE, flow_cookie(&state, &flow_state, 600));
            Ok(r)
        }
        Err(ServiceError::Conflict(e) | ServiceError::Invalid(e)) => {
            Ok(redirect_with(&state, "/admin/connections", Flash::warn(e)))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Template)]
#[template(path = "admin/connection_go.html")]
struct Go {
    to: String,
    group: String,
    host: String,
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    state: Option<String>,
    code: Option<String>,
    error: Option<String>,
}

/// The page the callback answers with: it moves on to My connections by itself (a redirect
/// chain that began at the authorization server would not carry the session cookie).
#[derive(Template)]
#[template(path = "admin/connection_done.html")]
struct Done {
    ok: bool,
    text: String,
}

/// `GET /admin/connections/callback`: the authorization server's answer.
pub async fn callback(
    State(state): State<WebState>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, WebError> {
    let from_cookie = session::cookie(&headers, FLOW_COOKIE).unwrap_or("");
    let presented = q.state.as_deref().unwrap_or("");
    let outcome = if presented.is_empty() || !session::same_token(presented, from_cookie) {
        Err("This connection did not start in this browser, or took too long. Start it again from My connections.".to_owned())
    } else if let Some(e) = q.error.as_deref() {
        // The server's words are bounded and escaped like any text from outside.
        let e: String = e.chars().filter(|c| !c.is_control()).take(100).collect();
        Err(format!(
            "The authorization server did not connect you ({e}). Start again from My connections."
        ))
    } else {
        match service::connections::finish(&state, presented, q.code.as_deref().unwrap_or("")).await
        {
            Ok((group, name)) => Ok(format!(
                "Connected: `{name}` for `{group}` is stored; your calls to it carry your own token from now on."
            )),
            Err(
                ServiceError::Invalid(e) | ServiceError::Conflict(e) | ServiceError::NotFound(e),
            ) => Err(e),
            Err(e) => return Err(e.into()),
        }
    };
    let (ok, text) = match outcome {
        Ok(t) => (true, t),
        Err(t) => (false, t),
    };
    let mut r = render(&Done { ok, text })?;
    if !ok {
        *r.status_mut() = axum::http::StatusCode::BAD_REQUEST;
    }
    r.headers_mut()
        .append(header::SET_COOKIE, flow_cookie(&state, "", 0));
    Ok(r)
}
