//! The approvals inbox: calls that wait for a person, with what exactly would run, and the
//! forms that approve or deny them.
//!
//! Everything shown here came from an agent (its arguments) or a tool author (the tool's
//! name): it reaches the page only through askama's escaping. Any role may open the inbox and
//! decide; the service decides whether this account is among a request's approvers and not
//! the one who made the call.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::error::WebError;
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, when};
use crate::db::approvals::ApprovalRow;
use crate::service;

pub struct RequestView {
    pub id: String,
    pub state: String,
    pub agent: String,
    pub person: String,
    pub client_id: String,
    pub tool: String,
    pub rule: String,
    pub approvers: String,
    pub arguments: String,
    pub arguments_sha256: String,
    pub definition_sha256: String,
    pub requested: String,
    pub expires: String,
    pub decided_by: String,
    pub reason: String,
    /// How the tool's definition compares with the one a call of it was last approved against.
    pub definition_note: String,
    pub definition_changed: bool,
    /// The diff (or, for a tool no call of which was approved, the whole definition as added).
    pub diff: Vec<super::pins::DiffLine>,
}

impl RequestView {
    fn with_review(mut self, review: Option<&service::approvals::DefinitionReview>) -> Self {
        let Some(r) = review else { return self };
        self.definition_note = match (&r.last_approved_at, r.changed_since_approved) {
            (None, _) if r.definition.is_none() => "The definition this call was made against was not kept.".into(),
            (None, _) => "No call of this tool was approved before: the whole definition is new to approvers.".into(),
            (Some(at), false) => format!("The same definition as when a call of this tool was last approved ({}).", when(at)),
            (Some(at), true) => format!("The definition changed since a call of this tool was last approved ({}): read what changed.", when(at)),
        };
        self.definition_changed = r.changed_since_approved;
        self.diff = super::pins::diff_lines(&r.diff);
        self
    }
}

impl From<ApprovalRow> for RequestView {
    fn from(r: ApprovalRow) -> Self {
        let arguments = serde_json::from_str::<serde_json::Value>(&r.shown_arguments)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or(r.shown_arguments);
        Self {
            id: r.id.to_string(),
            state: r.state,
            agent: r.agent,
            person: r.person.unwrap_or_default(),
            client_id: r.client_id,
            tool: r.tool,
            rule: r.rule_target,
            approvers: r.approvers.join(", "),
            arguments,
            arguments_sha256: r.arguments_sha256,
            definition_sha256: r.definition_sha256,
            requested: when(&r.requested_at),
            expires: when(&r.expires_at),
            decided_by: r.decided_by.unwrap_or_default(),
            reason: r.reason.unwrap_or_default(),
            definition_note: String::new(),
            definition_changed: false,
            diff: Vec::new(),
        }
    }
}

#[derive(Template)]
#[template(path = "admin/approvals/index.html")]
struct InboxPage {
    page: PageCtx,
    pending: Vec<RequestView>,
    recent: Vec<RequestView>,
}

/// The inbox shows an account the requests it may decide; admins and auditors, who read
/// everything, see every request. A viewer or member is not shown other people's arguments.
pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    service::approvals::expire_due(&state).await?;
    let mine = service::approvals::visible_to(&state, &ctx.admin.username).await?;
    let pending: Vec<ApprovalRow> = service::approvals::list(&state, Some("pending"))
        .await?
        .into_iter()
        .filter(|r| mine.shows(r))
        .rev()
        .collect();
    let reviews = service::approvals::review(&state, &pending).await?;
    let pending = pending
        .into_iter()
        .map(|r| {
            let review = reviews.get(&r.id);
            RequestView::from(r).with_review(review)
        })
        .collect();
    let recent = service::approvals::list(&state, None)
        .await?
        .into_iter()
        .filter(|r| r.state != "pending" && mine.shows(r))
        .take(50)
        .map(RequestView::from)
        .collect();
    render(&InboxPage {
        page: ctx.page(Nav::Approvals, "Approvals"),
        pending,
        recent,
    })
}

#[derive(Deserialize)]
pub struct DecisionForm {
    #[serde(default)]
    decision: String,
    #[serde(default)]
    reason: String,
}

pub async fn decide(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Form(form): Form<DecisionForm>,
) -> Result<Response, WebError> {
    let id = uuid::Uuid::parse_str(&id).map_err(|_| WebError::Missing(format!("approval {id}")))?;
    let approve = match form.decision.as_str() {
        "approve" => true,
        "deny" => false,
        _ => return Err(WebError::BadRequest("decide approve or deny".into())),
    };
    let decider = service::approvals::Decider::Account(ctx.admin.username.clone());
    let row = crate::gate::decide(&state, &decider, id, approve, Some(&form.reason)).await?;
    let flash = if approve {
        Flash::ok(format!(
            "Approved: `{}` of agent `{}` runs once now.",
            row.tool, row.agent
        ))
    } else {
        Flash::warn(format!(
            "Denied: `{}` of agent `{}` will not run.",
            row.tool, row.agent
        ))
    };
    Ok(redirect_with(&state, "/admin/approvals", flash))
}
