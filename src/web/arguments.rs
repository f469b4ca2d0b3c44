//! Argument rules: one agent's, edited beside its grants, with a preview of the schema the
//! model will be shown and of what is wrong with the rule before it is saved.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::grants::{CatalogOption, catalog_options};
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, render_status};
use crate::policy::arguments::{RuleProblem, Severity};
use crate::service::{self, ServiceError};

/// A saved rule, as the page lists it.
pub struct RuleRow {
    pub target: String,
    /// The rules as JSON text (`{"days":{"maximum":3}}`).
    pub params: String,
    pub problems: Vec<RuleProblem>,
    /// Whether one of them is an error (a warning leaves the row as it is).
    pub broken: bool,
}

/// What the preview shows: problems, and the narrowed schema of each tool the rule touches.
pub struct RulePreview {
    pub problems: Vec<RuleProblem>,
    pub schemas: Vec<(String, String)>,
}

#[derive(Template)]
#[template(path = "admin/arguments/edit.html")]
struct EditPage {
    page: PageCtx,
    agent: String,
    /// Managed by files: shown read-only, with where to edit it.
    managed: bool,
    /// The viewer may change it: an admin, and not managed by files.
    editable: bool,
    rows: Vec<RuleRow>,
    target: String,
    params: String,
    preview: Option<RulePreview>,
    error: Option<String>,
    options: Vec<CatalogOption>,
}

fn page(
    state: &WebState,
    ctx: &Ctx,
    agent: &str,
    target: &str,
    params: &str,
    preview: Option<RulePreview>,
    error: Option<String>,
) -> Result<EditPage, WebError> {
    let snapshot = state.policy.load();
    let view = snapshot
        .agent(agent)
        .ok_or_else(|| WebError::Missing(format!("Agent `{agent}`")))?;
    let rows = view
        .record
        .arguments
        .iter()
        .map(|r| {
            let problems: Vec<RuleProblem> = view
                .argument_problems
                .iter()
                .filter(|p| p.target == r.target)
                .cloned()
                .collect();
            RuleRow {
                target: r.target.clone(),
                params: serde_json::to_string(&r.params).unwrap_or_default(),
                broken: problems.iter().any(|p| p.severity == Severity::Error),
                problems,
            }
        })
        .collect();
    Ok(EditPage {
        page: ctx.page(Nav::Agents, format!("Argument rules of {agent}")),
        agent: agent.to_owned(),
        managed: view.record.managed.is_some(),
        editable: ctx.role().can_edit() && view.record.managed.is_none(),
        rows,
        target: target.to_owned(),
        params: params.to_owned(),
        preview,
        error,
        options: catalog_options(&snapshot),
    })
}

pub async fn edit(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, WebError> {
    render(&page(&state, &ctx, &name, "", "", None, None)?)
}

#[derive(Deserialize)]
pub struct RuleForm {
    #[serde(default)]
    target: String,
    #[serde(default)]
    params: String,
    /// `preview`, `save` or `remove`.
    #[serde(default)]
    action: String,
}

pub async fn submit(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<RuleForm>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    let target = form.target.trim();
    let back = format!("/admin/agents/{name}/arguments");
    if form.action == "remove" {
        service::arguments::delete(&state, &ctx.admin.actor(), &name, target).await?;
        return Ok(redirect_with(
            &state,
            &back,
            Flash::ok(format!("Removed the argument rules on `{target}`.")),
        ));
    }
    let invalid = |message: String| -> Result<Response, WebError> {
        render_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            &page(
                &state,
                &ctx,
                &name,
                target,
                &form.params,
                None,
                Some(message),
            )?,
        )
    };
    let params: serde_json::Value = match serde_json::from_str(&form.params) {
        Ok(v) => v,
        Err(e) => return invalid(format!("The rules are not JSON: {e}")),
    };
    if form.action != "save" {
        return match service::arguments::preview(&state.policy.load(), &name, target, &params) {
            Ok((problems, schemas)) => {
                let schemas = schemas
                    .into_iter()
                    .map(|(tool, s)| (tool, serde_json::to_string_pretty(&s).unwrap_or_default()))
                    .collect();
                render(&page(
                    &state,
                    &ctx,
                    &name,
                    target,
                    &form.params,
                    Some(RulePreview { problems, schemas }),
                    None,
                )?)
            }
            Err(ServiceError::Invalid(m)) => invalid(m),
            Err(e) => Err(e.into()),
        };
    }
    match service::arguments::set(&state, &ctx.admin.actor(), &name, target, &params).await {
        Ok(set) => {
            let flash = match set.problems.first() {
                Some(p) => Flash::warn(format!("Saved, but {}", p.message)),
                None => Flash::ok(format!(
                    "Saved the argument rules on `{target}`: agent `{name}` is held to them from its next request."
                )),
            };
            Ok(redirect_with(&state, &back, flash))
        }
        Err(ServiceError::Invalid(m)) => invalid(m),
        Err(e) => Err(e.into()),
    }
}
