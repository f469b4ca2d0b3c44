//! "My connections": the credentials a person's tools need of them (`per: person` slots of the
//! groups the agents they may act as can reach), filled and cleared by the person. Write-only:
//! a value, once stored, is shown again to nobody; the page says only whether it is set and
//! when it was last used.

use std::collections::BTreeSet;

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::{Admin, redirect_with};
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
                            if s.slot.per == Per::Person {
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
            Row {
                set: info.is_some(),
                updated: info.map(|c| when(&c.updated_at)).unwrap_or_default(),
                last_used: info
                    .and_then(|c| c.last_used_at.as_ref())
                    .map(when)
                    .unwrap_or_else(|| "never".into()),
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
