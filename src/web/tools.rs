//! The tool catalog: groups and tools with their descriptions and input schemas, who sees
//! each tool, where it comes from, and the groups that failed to load.
//!
//! Descriptions and schemas are written by tool authors and upstream servers: hostile text.
//! They reach the page only through askama's escaping.

use askama::Template;
use axum::extract::State;
use axum::response::Response;

use super::WebState;
use super::dashboard::{Broken, broken_groups};
use super::error::WebError;
use super::view::{Ctx, Nav, PageCtx, render};
use crate::pool::ToolSource;

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
        .map(|t| ToolView {
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
        })
        .collect();
    render(&CatalogPage {
        page: ctx.page(Nav::Tools, "Tool catalog"),
        groups,
        tools,
        broken: broken_groups(&snapshot),
    })
}
