//! Agents: the list, one agent's page (its exact tools, their token cost, limits, OAuth clients
//! and recent events), creating and deleting agents, creating and revoking clients.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde::Deserialize;

use super::WebState;
use super::audit::{EventRow, event_row};
use super::dashboard::{ZeroMatch, problems};
use super::error::WebError;
use super::grants::{CatalogOption, catalog_options};
use super::session::redirect_with;
use super::view::{
    ConfirmPage, Ctx, Flash, Nav, PageCtx, render, render_status, summary_line, thousands, when,
};
use crate::names::AgentName;
use crate::search::{AgentTokens, agent_tokens};
use crate::service::{self, ServiceError, audit_access};

pub struct AgentListRow {
    pub name: String,
    pub description: String,
    pub discovery: &'static str,
    pub grants: Vec<(String, usize)>,
    pub visible_tools: usize,
    pub sees_nothing: bool,
}

#[derive(Template)]
#[template(path = "admin/agents/index.html")]
struct AgentsPage {
    page: PageCtx,
    rows: Vec<AgentListRow>,
    error: Option<String>,
    new_name: String,
    new_description: String,
}

fn agent_rows(state: &WebState) -> Vec<AgentListRow> {
    service::agents::summaries(&state.policy.load())
        .into_iter()
        .map(|a| AgentListRow {
            grants: a
                .grants
                .iter()
                .map(|g| (g.target.clone(), g.matched_tools))
                .collect(),
            name: a.name,
            description: a.description,
            discovery: a.discovery.as_str(),
            visible_tools: a.visible_tools,
            sees_nothing: a.sees_nothing,
        })
        .collect()
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    render(&AgentsPage {
        page: ctx.page(Nav::Agents, "Agents"),
        rows: agent_rows(&state),
        error: None,
        new_name: String::new(),
        new_description: String::new(),
    })
}

#[derive(Deserialize)]
pub struct NewAgentForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    discovery: Option<String>,
}

pub async fn create(
    State(state): State<WebState>,
    ctx: Ctx,
    Form(form): Form<NewAgentForm>,
) -> Result<Response, WebError> {
    let name = form.name.trim();
    let created = match AgentName::parse(name) {
        Ok(agent) => {
            service::agents::create(
                &state,
                &ctx.admin.actor(),
                &agent,
                form.description.trim(),
                form.discovery.as_deref().filter(|d| !d.is_empty()),
            )
            .await
        }
        Err(e) => Err(e.into()),
    };
    match created {
        Ok(()) => Ok(redirect_with(
            &state,
            &format!("/admin/agents/{name}"),
            Flash::warn(format!(
                "Created agent `{name}`. It sees no tools until you add a grant."
            )),
        )),
        Err(e @ (ServiceError::Invalid(_) | ServiceError::Conflict(_))) => render_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            &AgentsPage {
                page: ctx.page(Nav::Agents, "Agents"),
                rows: agent_rows(&state),
                error: Some(e.to_string()),
                new_name: name.to_owned(),
                new_description: form.description,
            },
        ),
        Err(e) => Err(e.into()),
    }
}

pub struct GrantRow {
    pub target: String,
    pub matched_tools: usize,
    pub created_by: String,
    pub created_at: String,
}

pub struct ToolRow {
    pub name: String,
    pub summary: String,
}

pub struct LimitRow {
    pub scope: String,
    /// As written: `30 per minute`.
    pub rate: String,
    pub burst: String,
}

pub struct ClientRow {
    pub client_id: String,
    pub description: String,
    pub methods: String,
    pub created_at: String,
}

/// What an agent's `tools/list` costs, ready to show.
pub struct CostView {
    pub visible_tools: usize,
    pub visible_tokens: String,
    pub pool_tools: usize,
    pub pool_tokens: String,
    /// The agent's share of the pool's tokens, in percent.
    pub share: String,
    pub saved: String,
    /// `full`, `index` or `search`: how its `tools/list` is served now, and why.
    pub effective_discovery: &'static str,
    pub reason: String,
    /// What that `tools/list` costs as served, and in the two other shapes.
    pub listed_tokens: String,
    pub index_tokens: String,
    pub search_tokens: String,
    pub budget: String,
    pub index_budget: String,
}

impl From<AgentTokens> for CostView {
    fn from(t: AgentTokens) -> Self {
        let c = t.list;
        let share = if c.pool_tokens == 0 {
            "0%".to_owned()
        } else {
            format!(
                "{:.0}%",
                c.visible_tokens as f64 * 100.0 / c.pool_tokens as f64
            )
        };
        Self {
            visible_tools: c.visible_tools,
            visible_tokens: thousands(c.visible_tokens),
            pool_tools: c.pool_tools,
            pool_tokens: thousands(c.pool_tokens),
            share,
            saved: thousands(c.pool_tokens.saturating_sub(c.visible_tokens)),
            effective_discovery: t.effective_discovery.as_str(),
            reason: t.reason,
            listed_tokens: thousands(t.listed_tokens),
            index_tokens: thousands(t.index_tokens),
            search_tokens: thousands(t.search_tokens),
            budget: thousands(t.token_budget),
            index_budget: thousands(t.index_token_budget),
        }
    }
}

#[derive(Template)]
#[template(path = "admin/agents/show.html")]
struct AgentPage {
    page: PageCtx,
    name: String,
    /// Managed by files: shown read-only, with where to edit it.
    managed: bool,
    /// The viewer may change it: an admin, and not managed by files.
    editable: bool,
    description: String,
    discovery: &'static str,
    grants: Vec<GrantRow>,
    zero_match: Vec<ZeroMatch>,
    sees_nothing: bool,
    rule_flags: Vec<super::dashboard::RuleFlag>,
    /// Argument rules: (target, rules as JSON).
    arguments: Vec<(String, String)>,
    /// Approval rules: (target, rule as JSON).
    approvals: Vec<(String, String)>,
    /// Approval rules that never trigger or that nobody can decide.
    approval_problems: Vec<crate::policy::approvals::ApprovalProblem>,
    /// Credential slots of its tools it cannot fill.
    credential_problems: Vec<String>,
    tools: Vec<ToolRow>,
    cost: CostView,
    limits: Vec<LimitRow>,
    clients: Vec<ClientRow>,
    /// People who may act as this agent through an interactive host.
    users: Vec<String>,
    events: Vec<EventRow>,
    options: Vec<CatalogOption>,
    /// This agent's calls and refusals over the chosen span.
    activity: super::activity::Activity,
}

pub async fn show(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<super::dashboard::ChartQuery>,
) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| WebError::Missing(format!("Agent `{name}`")))?;
    let mine: Vec<_> = service::agents::summaries(&snapshot)
        .into_iter()
        .filter(|a| a.name == name)
        .collect();
    let (zero_match, blind) = problems(&mine);
    let grants = agent
        .grant_matches
        .iter()
        .map(|m| {
            let rec = agent.record.grants.iter().find(|g| g.id == m.id);
            GrantRow {
                target: m.target.clone(),
                matched_tools: m.matched_tools,
                created_by: rec.map(|g| g.created_by.clone()).unwrap_or_default(),
                created_at: rec.map(|g| when(&g.created_at)).unwrap_or_default(),
            }
        })
        .collect();
    let cost = agent_tokens(&snapshot, agent, state.settings.budgets());
    let clients = crate::db::clients::clients(&state.db, Some(&name))
        .await?
        .into_iter()
        .map(|c| ClientRow {
            client_id: c.client_id,
            description: c.description,
            methods: c.auth_methods.join(", "),
            created_at: when(&c.created_at),
        })
        .collect();
    let filter = crate::db::audit::AuditFilter {
        agent: Some(name.clone()),
        ..Default::default()
    };
    let actor = ctx.admin.actor();
    let events = audit_access::rows(&state, super::audit::reader(&actor), &filter, None, 15)
        .await?
        .iter()
        .map(event_row)
        .collect();
    let activity = super::activity::load(
        &state,
        q.range,
        crate::db::rollups::Scope::Agent(name.clone()),
    )
    .await?;
    let approval_problems = service::approvals::problems(&state, &name).await?;
    let page = AgentPage {
        activity,
        approvals: agent
            .record
            .approvals
            .iter()
            .map(|r| (r.target.clone(), r.to_value().to_string()))
            .collect(),
        approval_problems,
        credential_problems: service::credentials::problems(&state, agent),
        page: ctx.page(Nav::Agents, format!("Agent {name}")),
        managed: agent.record.managed.is_some(),
        editable: ctx.role().can_edit() && agent.record.managed.is_none(),
        description: agent.record.description.clone(),
        discovery: agent.record.discovery.as_str(),
        grants,
        zero_match,
        sees_nothing: !blind.is_empty(),
        rule_flags: super::dashboard::rule_flags(&mine),
        arguments: agent
            .record
            .arguments
            .iter()
            .map(|r| {
                (
                    r.target.clone(),
                    serde_json::to_string(&r.params).unwrap_or_default(),
                )
            })
            .collect(),
        tools: agent
            .visible
            .iter()
            .map(|t| ToolRow {
                name: t.name.as_str().to_owned(),
                summary: summary_line(t.description.as_deref()),
            })
            .collect(),
        cost: cost.into(),
        limits: agent
            .record
            .limits
            .iter()
            .map(|l| LimitRow {
                scope: l
                    .pattern
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                rate: super::limits::rate_text(&l.limit),
                burst: super::limits::burst_text(&l.limit),
            })
            .collect(),
        clients,
        users: agent.record.users.clone(),
        events,
        options: catalog_options(&snapshot),
        name,
    };
    render(&page)
}

pub async fn confirm_delete(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    let snapshot = state.policy.load();
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| WebError::Missing(format!("Agent `{name}`")))?;
    render(&ConfirmPage {
        page: ctx.page(Nav::Agents, format!("Delete agent {name}")),
        question: format!("Delete agent `{name}`?"),
        consequences: vec![
            format!(
                "Its {} grant(s), rate limits and OAuth clients are deleted with it.",
                agent.record.grants.len()
            ),
            "Its access tokens stop working on their next request.".to_owned(),
            "The audit log keeps its history.".to_owned(),
        ],
        action: format!("/admin/agents/{name}/delete"),
        fields: Vec::new(),
        button: "Delete agent".into(),
        cancel: format!("/admin/agents/{name}"),
    })
}

pub async fn delete(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, WebError> {
    service::agents::delete(&state, &ctx.admin.actor(), &name).await?;
    Ok(redirect_with(
        &state,
        "/admin/agents",
        Flash::ok(format!("Deleted agent `{name}`.")),
    ))
}

#[derive(Template)]
#[template(path = "admin/agents/client_created.html")]
struct ClientCreatedPage {
    page: PageCtx,
    agent: String,
    client_id: String,
    client_secret: String,
    token_url: String,
}

#[derive(Deserialize)]
pub struct NewClientForm {
    #[serde(default)]
    description: String,
}

/// Shows the new secret in the response itself, once: it is stored only as a hash, so there is
/// no page to redirect to that could show it. The page is `no-store`.
pub async fn create_client(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<NewClientForm>,
) -> Result<Response, WebError> {
    let client = service::clients::create(
        &state,
        &ctx.admin.actor(),
        &name,
        form.description.trim(),
        None,
    )
    .await?;
    let mut r = render(&ClientCreatedPage {
        page: ctx.page(Nav::Agents, format!("New client for {name}")),
        agent: name,
        client_id: client.client_id,
        client_secret: client.client_secret.unwrap_or_default(),
        token_url: format!("{}/oauth/token", state.settings.issuer),
    })?;
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(r)
}

async fn client_agent(state: &WebState, client_id: &str) -> Result<String, WebError> {
    crate::db::clients::clients(&state.db, None)
        .await?
        .into_iter()
        .find(|c| c.client_id == client_id)
        .map(|c| c.agent)
        .ok_or_else(|| WebError::Missing(format!("Client `{client_id}`")))
}

pub async fn confirm_revoke_client(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(client_id): Path<String>,
) -> Result<Response, WebError> {
    ctx.admin.require_edit()?;
    let agent = client_agent(&state, &client_id).await?;
    render(&ConfirmPage {
        page: ctx.page(Nav::Agents, "Revoke client"),
        question: format!("Revoke client `{client_id}` of agent `{agent}`?"),
        consequences: vec![
            "The client can no longer obtain tokens.".to_owned(),
            "Tokens it already holds stop working on their next request.".to_owned(),
        ],
        action: format!("/admin/clients/{client_id}/revoke"),
        fields: Vec::new(),
        button: "Revoke client".into(),
        cancel: format!("/admin/agents/{agent}"),
    })
}

pub async fn revoke_client(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(client_id): Path<String>,
) -> Result<Response, WebError> {
    let agent = client_agent(&state, &client_id).await?;
    service::clients::delete(&state, &ctx.admin.actor(), &client_id).await?;
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{agent}"),
        Flash::ok(format!("Revoked client `{client_id}`.")),
    ))
}

#[derive(Deserialize)]
pub struct ApprovalForm {
    #[serde(default)]
    target: String,
    #[serde(default)]
    approvers: String,
    #[serde(default)]
    ttl: String,
    /// Optional: `{"amount": {"exclusiveMinimum": 1000}}`.
    #[serde(default)]
    when: String,
}

/// Sets an approval rule from the agent page's form.
pub async fn set_approval(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<ApprovalForm>,
) -> Result<Response, WebError> {
    let mut rule = serde_json::Map::new();
    let approvers: Vec<&str> = form
        .approvers
        .split([',', ' '])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    rule.insert("approvers".into(), serde_json::json!(approvers));
    if !form.ttl.trim().is_empty() {
        rule.insert("ttl".into(), serde_json::json!(form.ttl.trim()));
    }
    if !form.when.trim().is_empty() {
        let when: serde_json::Value = serde_json::from_str(&form.when)
            .map_err(|e| WebError::BadRequest(format!("`when` must be JSON: {e}")))?;
        rule.insert("when".into(), when);
    }
    let set = service::approvals::set_rule(
        &state,
        &ctx.admin.actor(),
        &name,
        form.target.trim(),
        &serde_json::Value::Object(rule),
    )
    .await?;
    let flash = match set.problems.first() {
        Some(p) => Flash::warn(format!("Saved, but: {}", p.message)),
        None => Flash::ok(format!(
            "Calls of `{}` by `{name}` now wait for approval.",
            set.rule.target
        )),
    };
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{name}"),
        flash,
    ))
}

#[derive(Deserialize)]
pub struct RemoveApprovalForm {
    #[serde(default)]
    target: String,
}

pub async fn remove_approval(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(form): Form<RemoveApprovalForm>,
) -> Result<Response, WebError> {
    service::approvals::delete_rule(&state, &ctx.admin.actor(), &name, &form.target).await?;
    Ok(redirect_with(
        &state,
        &format!("/admin/agents/{name}"),
        Flash::warn(format!(
            "Calls of `{}` by `{name}` no longer wait for approval.",
            form.target
        )),
    ))
}
