//! Host authorizations: every signed-in person sees and revokes their own; admins see and
//! revoke everyone's.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::{Admin, redirect_with};
use super::view::{Flash, render, when};
use crate::db;
use crate::service::{self, ServiceError};

struct Row {
    id: String,
    client_name: String,
    client_id: String,
    agent: String,
    username: String,
    created: String,
    status: String,
    live: bool,
}

#[derive(Template)]
#[template(path = "admin/hosts/authorizations.html")]
struct AuthorizationsPage {
    csrf: String,
    all: bool,
    rows: Vec<Row>,
    flash: Option<Flash>,
}

pub async fn index(
    State(state): State<WebState>,
    admin: Admin,
    flash: Option<axum::Extension<Flash>>,
) -> Result<Response, WebError> {
    let all = admin.role.can_edit();
    let only = (!all).then_some(admin.username.as_str());
    let now = chrono::Utc::now();
    let rows = db::authorizations::list(&state.db, only)
        .await?
        .into_iter()
        .map(|a| {
            let live = a.revoked_at.is_none() && a.expires_at > now;
            Row {
                id: a.id.to_string(),
                status: match (&a.revoked_at, live) {
                    (Some(t), _) => format!(
                        "revoked {} by {}",
                        when(t),
                        a.revoked_by.unwrap_or_default()
                    ),
                    (None, true) => "active".into(),
                    (None, false) => "expired".into(),
                },
                client_name: a.client_name,
                client_id: a.client_id,
                agent: a.agent,
                username: a.username,
                created: when(&a.created_at),
                live,
            }
        })
        .collect();
    render(&AuthorizationsPage {
        csrf: admin.csrf.clone(),
        all,
        rows,
        flash: flash.map(|f| f.0),
    })
}

pub async fn revoke(
    State(state): State<WebState>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Response, WebError> {
    let id = uuid::Uuid::parse_str(&id).map_err(|_| WebError::NotFound)?;
    // A person revokes only their own; an admin anyone's. Someone else's id is "not found".
    let only = (!admin.role.can_edit()).then_some(admin.username.as_str());
    service::authorizations::revoke(&state, &admin.actor(), id, only).await?;
    Ok(redirect_with(
        &state,
        "/admin/authorizations",
        Flash::ok("The authorization is revoked: the application's tokens stop working now."),
    ))
}

#[derive(Deserialize)]
pub struct UserForm {
    #[serde(default)]
    username: String,
}

/// Adds a person who may act as the agent (admins only: `require_session` refuses others).
pub async fn add_user(
    State(state): State<WebState>,
    admin: Admin,
    Path(name): Path<String>,
    Form(form): Form<UserForm>,
) -> Result<Response, WebError> {
    let username =
        crate::names::Username::parse(form.username.trim()).map_err(ServiceError::from)?;
    service::agents::add_user(&state, &admin.actor(), &name, &username).await?;
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{name}"),
        Flash::ok(format!("{username} may now act as {name} through a host.")),
    ))
}

/// Removes a person from the agent; what they authorized for it is revoked.
pub async fn remove_user(
    State(state): State<WebState>,
    admin: Admin,
    Path(name): Path<String>,
    Form(form): Form<UserForm>,
) -> Result<Response, WebError> {
    service::agents::remove_user(&state, &admin.actor(), &name, &form.username).await?;
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{name}"),
        Flash::ok(format!(
            "{} may no longer act as {name}; their host authorizations for it are revoked.",
            form.username
        )),
    ))
}
