//! The tool catalog: groups and tools with their descriptions and input schemas, who sees
//! each tool, where it comes from, and the groups that failed to load.
//!
//! Descriptions and schemas are written by tool authors and upstream servers: hostile text.
//! They reach the page only through askama's escaping.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;

use super::WebState;
use super::audit::{EventRow, event_row};
use super::dashboard::{Broken, ChartQuery, broken_groups};
use super::error::WebError;
use super::view::{Ctx, Nav, PageCtx, render};
use crate::policy::snapshot::{AgentView, PolicySnapshot};
use crate::pool::{Tool, ToolSource};
use crate::service::audit_access;

pub struct GroupRow {
    pub name: String,
    pub folder: String,
    pub source: &'static str,
    pub tools: usize,
    pub broken: bool,
}

pub struct ToolView {
    pub name: String,
    pub group: String,
    pub title: String,
    pub description: String,
    pub schema: String,
    pub source: String,
    pub agents: Vec<String>,
    /// Pinned and not approved as it is: served to no agent.
    pub held: bool,
}

#[derive(Template)]
#[template(path = "admin/tools/index.html")]
struct CatalogPage {
    page: PageCtx,
    groups: Vec<GroupRow>,
    tools: Vec<ToolView>,
    broken: Vec<Broken>,
}

fn tool_view(
    snapshot: &PolicySnapshot,
    agents: &[&std::sync::Arc<AgentView>],
    t: &Tool,
) -> ToolView {
    ToolView {
        name: t.name.as_str().to_owned(),
        group: t.group().to_owned(),
        title: t.title.clone().unwrap_or_default(),
        description: t.description.clone().unwrap_or_default(),
        schema: serde_json::to_string_pretty(&*t.input_schema).unwrap_or_default(),
        source: match &t.source {
            ToolSource::Script { folder } => format!("script in tools/{folder}"),
            ToolSource::Upstream { upstream } => format!("upstream MCP server {upstream}"),
        },
        held: snapshot.is_held(t.name.as_str()),
        agents: agents
            .iter()
            .filter(|a| a.visible.iter().any(|v| v.name == t.name))
            .map(|a| a.record.name.clone())
            .collect(),
    }
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let agents = snapshot.agents();
    let groups = snapshot
        .catalog
        .groups()
        .map(|g| GroupRow {
            name: g.name.clone(),
            folder: g.folder.clone(),
            source: g.source,
            tools: g.tools,
            broken: g.error.is_some(),
        })
        .collect();
    let tools = snapshot
        .catalog
        .tools()
        .map(|t| tool_view(&snapshot, &agents, t))
        .collect();
    render(&CatalogPage {
        page: ctx.page(Nav::Tools, "Tool catalog"),
        groups,
        tools,
        broken: broken_groups(&snapshot),
    })
}

#[derive(Template)]
#[template(path = "admin/tools/show.html")]
struct ToolPage {
    page: PageCtx,
    t: ToolView,
    activity: super::activity::Activity,
    events: Vec<EventRow>,
}

/// One tool: what the catalog says of it, its calls and refusals over time, its recent events.
pub async fn show(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Query(q): Query<ChartQuery>,
) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let tool = snapshot
        .catalog
        .get(&name)
        .ok_or_else(|| WebError::Missing(format!("Tool `{name}`")))?;
    let agents = snapshot.agents();
    let t = tool_view(&snapshot, &agents, tool);
    let activity = super::activity::load(
        &state,
        q.range,
        crate::db::rollups::Scope::Tool(name.clone()),
    )
    .await?;
    let filter = crate::db::audit::AuditFilter {
        tool: Some(name.clone()),
        ..Default::default()
    };
    let actor = ctx.admin.actor();
    let events = audit_access::rows(&state, super::audit::reader(&actor), &filter, None, 15)
        .await?
        .iter()
        .map(event_row)
        .collect();
    render(&ToolPage {
        page: ctx.page(Nav::Tools, format!("Tool {name}")),
        t,
        activity,
        events,
    })
}
