//! Rate limits: every agent's at a glance, and one agent's editor (agent-wide and per group
//! or tool).

use std::collections::BTreeMap;

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::error::WebError;
use super::grants::{CatalogOption, catalog_options};
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, render_status};
use crate::app::AppState;
use crate::policy::snapshot::RateLimitRecord;
use crate::service::{self, ServiceError};

pub struct AgentLimits {
    pub agent: String,
    /// (scope, per second, burst); an empty scope is the whole agent.
    pub limits: Vec<(String, u32, u32)>,
}

#[derive(Template)]
#[template(path = "admin/limits/index.html")]
struct LimitsPage {
    page: PageCtx,
    agents: Vec<AgentLimits>,
}

pub async fn index(State(state): State<AppState>, ctx: Ctx) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    render(&LimitsPage {
        page: ctx.page(Nav::Limits, "Rate limits"),
        agents: snapshot
            .agents()
            .iter()
            .map(|a| AgentLimits {
                agent: a.record.name.clone(),
                limits: a
                    .record
                    .limits
                    .iter()
                    .map(|l| (l.pattern.clone().unwrap_or_default(), l.per_second, l.burst))
                    .collect(),
            })
            .collect(),
    })
}

/// One row of the editor, as typed.
pub struct LimitInput {
    pub index: usize,
    pub pattern: String,
    pub per_second: String,
    pub burst: String,
}

impl LimitInput {
    fn is_blank(&self) -> bool {
        self.pattern.is_empty() && self.per_second.is_empty() && self.burst.is_empty()
    }
}

#[derive(Template)]
#[template(path = "admin/limits/edit.html")]
struct EditPage {
    page: PageCtx,
    agent: String,
    rows: Vec<LimitInput>,
    error: Option<String>,
    options: Vec<CatalogOption>,
}

/// Blank rows offered for new limits.
const BLANK_ROWS: usize = 2;

fn edit_page(
    ctx: &Ctx,
    state: &AppState,
    agent: &str,
    mut rows: Vec<LimitInput>,
    error: Option<String>,
) -> EditPage {
    let start = rows.len();
    rows.extend((0..BLANK_ROWS).map(|i| LimitInput {
        index: start + i,
        pattern: String::new(),
        per_second: String::new(),
        burst: String::new(),
    }));
    // Keep indices dense after a failed submit dropped removed rows.
    for (i, r) in rows.iter_mut().enumerate() {
        r.index = i;
    }
    EditPage {
        page: ctx.page(Nav::Limits, format!("Rate limits of {agent}")),
        agent: agent.to_owned(),
        rows,
        error,
        options: catalog_options(&state.policy.load()),
    }
}

pub async fn edit(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let agent = snapshot
        .agent(&name)
        .ok_or_else(|| WebError::Missing(format!("Agent `{name}`")))?;
    let rows = agent
        .record
        .limits
        .iter()
        .enumerate()
        .map(|(i, l)| LimitInput {
            index: i,
            pattern: l.pattern.clone().unwrap_or_default(),
            per_second: l.per_second.to_string(),
            burst: l.burst.to_string(),
        })
        .collect();
    render(&edit_page(&ctx, &state, &name, rows, None))
}

/// Reads the indexed rows (`pattern_3`, `per_second_3`, `burst_3`, `remove_3`) of the form.
fn read_rows(
    fields: &[(String, String)],
) -> (Vec<LimitInput>, Result<Vec<RateLimitRecord>, String>) {
    let mut by_index: BTreeMap<usize, (LimitInput, bool)> = BTreeMap::new();
    for (key, value) in fields {
        let Some((field, index)) = key.rsplit_once('_') else {
            continue;
        };
        let Ok(index) = index.parse::<usize>() else {
            continue;
        };
        let (row, remove) = by_index.entry(index).or_insert_with(|| {
            (
                LimitInput {
                    index,
                    pattern: String::new(),
                    per_second: String::new(),
                    burst: String::new(),
                },
                false,
            )
        });
        match field {
            "pattern" => row.pattern = value.trim().to_owned(),
            "per_second" => row.per_second = value.trim().to_owned(),
            "burst" => row.burst = value.trim().to_owned(),
            "remove" => *remove = true,
            _ => {}
        }
    }
    let rows: Vec<LimitInput> = by_index
        .into_values()
        .filter(|(r, remove)| !remove && !r.is_blank())
        .map(|(r, _)| r)
        .collect();
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = rows.iter().find(|r| !seen.insert(r.pattern.as_str())) {
        let what = if dup.pattern.is_empty() {
            "agent-wide limit".to_owned()
        } else {
            format!("limit on `{}`", dup.pattern)
        };
        return (
            rows,
            Err(format!("There are two rows for the {what}; keep one.")),
        );
    }
    let parsed = rows
        .iter()
        .map(|r| {
            let scope = if r.pattern.is_empty() {
                "the agent-wide limit".to_owned()
            } else {
                format!("the limit on `{}`", r.pattern)
            };
            let number = |v: &str, what: &str| {
                v.parse::<u32>()
                    .map_err(|_| format!("{what} of {scope} must be a whole number, not `{v}`"))
            };
            Ok(RateLimitRecord {
                pattern: (!r.pattern.is_empty()).then(|| r.pattern.clone()),
                per_second: number(&r.per_second, "Requests per second")?,
                burst: number(&r.burst, "The burst")?,
            })
        })
        .collect();
    (rows, parsed)
}

pub async fn save(
    State(state): State<AppState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, WebError> {
    let (rows, parsed) = read_rows(&fields);
    let result = match parsed {
        Ok(limits) => service::set_limits(&state, &ctx.admin.actor(), &name, limits)
            .await
            .map_err(|e| match e {
                ServiceError::Invalid(m) => Ok(m),
                other => Err(other),
            }),
        Err(m) => Err(Ok(m)),
    };
    match result {
        Ok(()) => Ok(redirect_with(
            &state,
            &format!("/admin/agents/{name}"),
            Flash::ok(format!("Saved the rate limits of agent `{name}`.")),
        )),
        Err(Ok(message)) => render_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            &edit_page(&ctx, &state, &name, rows, Some(message)),
        ),
        Err(Err(e)) => Err(e.into()),
    }
}
