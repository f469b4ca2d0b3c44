//! Grants: every grant at a glance, the grant editor with its preview, and removal.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use serde::Deserialize;
use serde_json::json;

use super::WebState;
use super::dashboard::{ZeroMatch, problems};
use super::error::WebError;
use super::session::redirect_with;
use super::view::{ConfirmPage, Ctx, Flash, Nav, PageCtx, render, render_status, when};
use crate::policy::GrantTarget;
use crate::policy::snapshot::PolicySnapshot;
use crate::service::{self, ServiceError};

/// A suggestion of the target field: a group or a tool of the catalog.
pub struct CatalogOption {
    pub value: String,
    pub label: String,
}

/// Every group (with its tool count) and every tool, for the `<datalist>` of the target field.
pub fn catalog_options(snapshot: &PolicySnapshot) -> Vec<CatalogOption> {
    let catalog = &snapshot.catalog;
    let mut options: Vec<CatalogOption> = catalog
        .group_names()
        .into_iter()
        .map(|g| {
            let n = catalog.tools().filter(|t| t.group() == g).count();
            CatalogOption {
                label: format!("group · {n} tool(s)"),
                value: g,
            }
        })
        .collect();
    options.extend(catalog.tools().map(|t| CatalogOption {
        value: t.name.as_str().to_owned(),
        label: "tool".to_owned(),
    }));
    options
}

/// What a target would match, as the editor shows it.
pub struct PreviewView {
    pub target: String,
    pub error: Option<String>,
    pub tools: Vec<String>,
    pub suggestions: Vec<String>,
}

fn preview(snapshot: &PolicySnapshot, target: &str) -> PreviewView {
    let target = target.trim();
    match service::grants::preview(snapshot, target) {
        Ok((tools, suggestions)) => PreviewView {
            target: target.to_owned(),
            error: None,
            tools,
            suggestions,
        },
        Err(e) => PreviewView {
            target: target.to_owned(),
            error: Some(e.to_string()),
            tools: Vec::new(),
            suggestions: Vec::new(),
        },
    }
}

pub struct GrantListRow {
    pub agent: String,
    pub target: String,
    pub matched_tools: usize,
    pub created_by: String,
    pub created_at: String,
    /// The agent is managed by files: no remove link.
    pub managed: bool,
}

#[derive(Template)]
#[template(path = "admin/grants/index.html")]
struct GrantsPage {
    page: PageCtx,
    zero_match: Vec<ZeroMatch>,
    rows: Vec<GrantListRow>,
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let (zero_match, _) = problems(&service::agents::summaries(&snapshot));
    let rows = snapshot
        .agents()
        .into_iter()
        .flat_map(|a| {
            a.grant_matches.iter().map(|m| {
                let rec = a.record.grants.iter().find(|g| g.id == m.id);
                GrantListRow {
                    agent: a.record.name.clone(),
                    target: m.target.clone(),
                    matched_tools: m.matched_tools,
                    created_by: rec.map(|g| g.created_by.clone()).unwrap_or_default(),
                    created_at: rec.map(|g| when(&g.created_at)).unwrap_or_default(),
                    managed: a.record.managed.is_some(),
                }
            })
        })
        .collect();
    render(&GrantsPage {
        page: ctx.page(Nav::Grants, "Grants"),
        zero_match,
        rows,
    })
}

#[derive(Template)]
#[template(path = "admin/grants/new.html")]
struct EditorPage {
    page: PageCtx,
    agents: Vec<String>,
    agent: String,
    target: String,
    preview: Option<PreviewView>,
    error: Option<String>,
    options: Vec<CatalogOption>,
}

fn editor(
    state: &WebState,
    ctx: &Ctx,
    agent: &str,
    target: &str,
    error: Option<String>,
) -> EditorPage {
    let snapshot = state.policy.load();
    let target = target.trim();
    EditorPage {
        page: ctx.page(Nav::Grants, "Add a grant"),
        agents: snapshot
            .agents()
            .iter()
            .map(|a| a.record.name.clone())
            .collect(),
        agent: agent.to_owned(),
        target: target.to_owned(),
        preview: (!target.is_empty()).then(|| preview(&snapshot, target)),
        error,
        options: catalog_options(&snapshot),
    }
}

#[derive(Deserialize, Default)]
pub struct EditorQuery {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    target: String,
}

/// The editor; with `target` set it shows the preview straight away (links from "did you
/// mean" land here).
pub async fn new(
    State(state): State<WebState>,
    ctx: Ctx,
    Query(q): Query<EditorQuery>,
) -> Result<Response, WebError> {
    render(&editor(&state, &ctx, &q.agent, &q.target, None))
}

#[derive(Deserialize)]
pub struct GrantForm {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    target: String,
    /// `preview` re-renders the form with what the target matches; `save` adds the grant.
    #[serde(default)]
    action: String,
}

pub async fn submit(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<GrantForm>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    if form.action != "save" {
        return render(&editor(&state, &ctx, &form.agent, &form.target, None));
    }
    let added = match GrantTarget::parse(&form.target) {
        Ok(target) => service::grants::add(&state, &ctx.admin.actor(), &form.agent, &target).await,
        Err(e) => Err(ServiceError::Invalid(e)),
    };
    match added {
        Ok(added) => {
            let flash = match &added.warning {
                Some(w) => Flash::warn(format!("Added, but {w}")),
                None => Flash::ok(format!(
                    "Added the grant `{}`: agent `{}` now sees its {} tool(s) on its next request.",
                    added.target, added.agent, added.matched_tools
                )),
            };
            Ok(redirect_with(
                &state,
                &format!("/admin/agents/{}", added.agent),
                flash,
            ))
        }
        Err(e @ (ServiceError::Invalid(_) | ServiceError::Conflict(_))) => {
            let status = if matches!(e, ServiceError::Conflict(_)) {
                StatusCode::CONFLICT
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            render_status(
                status,
                &editor(&state, &ctx, &form.agent, &form.target, Some(e.to_string())),
            )
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
pub struct PreviewQuery {
    #[serde(default)]
    target: String,
}

/// The live preview of the editor's script: the same answer as the Preview button, as JSON.
pub async fn preview_json(
    State(state): State<WebState>,
    _ctx: Ctx,
    Query(q): Query<PreviewQuery>,
) -> Response {
    let p = preview(&state.policy.load(), &q.target);
    Json(json!({
        "target": p.target,
        "error": p.error,
        "matched_tools": p.tools.len(),
        "tools": p.tools.iter().take(100).collect::<Vec<_>>(),
        "suggestions": p.suggestions,
    }))
    .into_response()
}

#[derive(Deserialize)]
pub struct RemoveForm {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    target: String,
}

pub async fn confirm_remove(
    State(state): State<WebState>,
    ctx: Ctx,
    Query(q): Query<RemoveForm>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    let snapshot = state.policy.load();
    let agent = snapshot
        .agent(&q.agent)
        .ok_or_else(|| WebError::Missing(format!("Agent `{}`", q.agent)))?;
    let grant = agent
        .grant_matches
        .iter()
        .find(|g| g.target == q.target)
        .ok_or_else(|| {
            WebError::Missing(format!("The grant `{}` of agent `{}`", q.target, q.agent))
        })?;
    let (matched, _) = service::grants::preview(&snapshot, &q.target)?;
    let mut consequences = vec![if grant.matched_tools == 0 {
        "It matches no tool, so the agent loses nothing.".to_owned()
    } else {
        format!(
            "From its next request on, the agent no longer sees these {} tool(s), unless another of its grants also matches them: {}.",
            matched.len(),
            matched.join(", ")
        )
    }];
    consequences.push("The change is recorded in the audit log under your name.".into());
    render(&ConfirmPage {
        page: ctx.page(Nav::Grants, "Remove grant"),
        question: format!("Remove the grant `{}` from agent `{}`?", q.target, q.agent),
        consequences,
        action: "/admin/grants/remove".into(),
        fields: vec![
            ("agent".into(), q.agent.clone()),
            ("target".into(), q.target),
        ],
        button: "Remove grant".into(),
        cancel: format!("/admin/agents/{}", q.agent),
    })
}

pub async fn remove(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<RemoveForm>,
) -> Result<Response, WebError> {
    service::grants::remove(&state, &ctx.admin.actor(), &form.agent, &form.target).await?;
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{}", form.agent),
        Flash::ok(format!(
            "Removed the grant `{}` from agent `{}`.",
            form.target, form.agent
        )),
    ))
}
