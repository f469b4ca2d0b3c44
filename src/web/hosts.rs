//! Host applications: the public clients interactive hosts sign people in through, those an
//! admin registered and those that registered themselves (`/oauth/register`), with the forms
//! that approve a held registration or delete a client.
//!
//! A self-registered client's name and redirect URIs are a stranger's text: they reach the page
//! only through askama's escaping, and the page says whose word they are.

use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;

use super::WebState;
use super::error::WebError;
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, when};
use crate::config::Registration;
use crate::service;

pub struct HostRow {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub dynamic: bool,
    pub held: bool,
    pub registered: String,
    pub registered_from: String,
    pub approved_by: String,
    pub expires: String,
}

#[derive(Template)]
#[template(path = "admin/hosts/clients.html")]
struct HostsPage {
    page: PageCtx,
    mode: &'static str,
    held: usize,
    rows: Vec<HostRow>,
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    let rows: Vec<HostRow> = service::clients::list_public(&state)
        .await?
        .into_iter()
        .map(|c| HostRow {
            dynamic: c.is_dynamic(),
            held: c.is_held(),
            registered: when(&c.created_at),
            registered_from: c.registered_from.unwrap_or_default(),
            approved_by: c.approved_by.unwrap_or_default(),
            expires: c.expires_at.as_ref().map(when).unwrap_or_default(),
            client_id: c.client_id,
            client_name: c.client_name,
            redirect_uris: c.redirect_uris,
        })
        .collect();
    render(&HostsPage {
        page: ctx.page(Nav::Hosts, "Host applications"),
        mode: match state.settings.registration {
            Registration::Off => "off",
            Registration::Held => "held",
            Registration::Open => "open",
        },
        held: rows.iter().filter(|r| r.held).count(),
        rows,
    })
}

pub async fn approve(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(client_id): Path<String>,
) -> Result<Response, WebError> {
    service::clients::approve_public(&state, &ctx.admin.actor(), &client_id).await?;
    Ok(redirect_with(
        &state,
        "/admin/hosts",
        Flash::ok(format!(
            "Approved `{client_id}`: people may now sign in through it (each still consents, as an agent they may act as)."
        )),
    ))
}

pub async fn delete(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(client_id): Path<String>,
) -> Result<Response, WebError> {
    service::clients::delete_public(&state, &ctx.admin.actor(), &client_id).await?;
    Ok(redirect_with(
        &state,
        "/admin/hosts",
        Flash::warn(format!(
            "Deleted `{client_id}`: its authorizations are revoked and its tokens stop working."
        )),
    ))
}
