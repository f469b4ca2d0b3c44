//! Held tools: definitions of pinned groups that changed (or appeared) and wait for an admin,
//! each with the diff against the approved one, and the forms that approve or reject them.
//!
//! Every definition shown here was written by a tool author or an upstream server, and a held
//! one is by construction suspect: it reaches the page only through askama's escaping.

use askama::Template;
use axum::Form;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, when};
use crate::service;

/// One line of a unified diff, with how to show it.
pub struct DiffLine {
    /// `head`, `hunk`, `add`, `del` or `ctx`.
    pub kind: &'static str,
    pub text: String,
}

pub(super) fn diff_lines(diff: &str) -> Vec<DiffLine> {
    diff.lines()
        .map(|l| DiffLine {
            kind: if l.starts_with("+++") || l.starts_with("---") {
                "head"
            } else if l.starts_with("@@") {
                "hunk"
            } else if l.starts_with('+') {
                "add"
            } else if l.starts_with('-') {
                "del"
            } else {
                "ctx"
            },
            text: l.to_owned(),
        })
        .collect()
}

pub struct HeldView {
    pub name: String,
    pub group: String,
    pub rejected: bool,
    pub rejected_by: String,
    pub source: String,
    pub first_seen: String,
    pub previous_hash: String,
    pub hash: String,
    pub served: bool,
    pub diff: Vec<DiffLine>,
}

#[derive(Template)]
#[template(path = "admin/tools/pending.html")]
struct PendingPage {
    page: PageCtx,
    held: Vec<HeldView>,
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    let held = service::pins::pending(&state)
        .await?
        .into_iter()
        .map(|p| HeldView {
            rejected: p.status == "rejected",
            rejected_by: p.tool.rejected_by.clone().unwrap_or_default(),
            source: p.tool.source.clone(),
            first_seen: when(&p.tool.first_seen),
            previous_hash: p.tool.previous_hash.clone().unwrap_or_default(),
            served: p.served,
            diff: diff_lines(&p.diff),
            name: p.tool.name,
            group: p.tool.group,
            hash: p.tool.hash,
        })
        .collect();
    render(&PendingPage {
        page: ctx.page(Nav::Tools, "Held tools"),
        held,
    })
}

#[derive(Deserialize)]
pub struct DecisionForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    hash: String,
}

/// The form names the exact definition the admin saw, so a change arriving in between is not
/// approved unseen.
pub async fn approve(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<DecisionForm>,
) -> Result<Response, WebError> {
    let d = service::pins::decide(
        &state,
        &ctx.admin.actor(),
        &form.name,
        Some(&form.hash),
        crate::db::pins::Verdict::Approve,
    )
    .await?;
    Ok(redirect_with(
        &state,
        "/admin/tools/pending",
        Flash::ok(format!(
            "Approved the new definition of `{}`: agents granted it see it from their next request.",
            d.name
        )),
    ))
}

pub async fn reject(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<DecisionForm>,
) -> Result<Response, WebError> {
    let d = service::pins::decide(
        &state,
        &ctx.admin.actor(),
        &form.name,
        Some(&form.hash),
        crate::db::pins::Verdict::Reject,
    )
    .await?;
    Ok(redirect_with(
        &state,
        "/admin/tools/pending",
        Flash::warn(format!(
            "Rejected the new definition of `{}`: it stays held until a definition is approved.",
            d.name
        )),
    ))
}
