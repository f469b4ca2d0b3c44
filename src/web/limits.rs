//! Rate limits: every agent's at a glance, and one agent's editor (agent-wide and per group
//! or tool).

use std::collections::BTreeMap;

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::WebState;
use super::error::WebError;
use super::grants::{CatalogOption, catalog_options};
use super::session::redirect_with;
use super::view::{Ctx, Flash, Nav, PageCtx, render, render_status};
use crate::limits::{Limit, LimitForm, Period};
use crate::policy::GrantTarget;
use crate::policy::snapshot::RateLimitRecord;
use crate::service::{self, ServiceError};

pub struct AgentLimits {
    pub agent: String,
    /// (scope, rate, burst) as shown; an empty scope is the whole agent.
    pub limits: Vec<(String, String, String)>,
}

/// A limit's rate as written: `30 per minute`, `0.5 per second`.
pub fn rate_text(l: &Limit) -> String {
    format!("{} per {}", l.count(), l.period().as_str())
}

/// A limit's burst as written, or the default in force when none was.
pub fn burst_text(l: &Limit) -> String {
    match l.burst_written() {
        Some(b) => b.to_string(),
        None => format!("{} (default)", l.burst()),
    }
}

#[derive(Template)]
#[template(path = "admin/limits/index.html")]
struct LimitsPage {
    page: PageCtx,
    agents: Vec<AgentLimits>,
}

pub async fn index(State(state): State<WebState>, ctx: Ctx) -> Result<Response, WebError> {
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
                    .map(|l| {
                        (
                            l.pattern
                                .as_ref()
                                .map(ToString::to_string)
                                .unwrap_or_default(),
                            rate_text(&l.limit),
                            burst_text(&l.limit),
                        )
                    })
                    .collect(),
            })
            .collect(),
    })
}

/// One row of the editor, as typed.
pub struct LimitInput {
    pub index: usize,
    pub pattern: String,
    /// The count, as typed (`30`, `0.5`).
    pub rate: String,
    /// `second`, `minute` or `hour`.
    pub period: String,
    /// Empty: the default (the count, rounded up).
    pub burst: String,
}

impl LimitInput {
    fn blank(index: usize) -> Self {
        Self {
            index,
            pattern: String::new(),
            rate: String::new(),
            period: Period::Second.as_str().to_owned(),
            burst: String::new(),
        }
    }

    fn is_blank(&self) -> bool {
        self.pattern.is_empty() && self.rate.is_empty() && self.burst.is_empty()
    }
}

/// The periods offered in the editor: (value, label).
pub const PERIODS: [(&str, &str); 3] = [
    ("second", "per second"),
    ("minute", "per minute"),
    ("hour", "per hour"),
];

#[derive(Template)]
#[template(path = "admin/limits/edit.html")]
struct EditPage {
    page: PageCtx,
    agent: String,
    /// Managed by files: shown read-only, with where to edit it.
    managed: bool,
    /// The viewer may change it: an admin, and not managed by files.
    editable: bool,
    rows: Vec<LimitInput>,
    error: Option<String>,
    options: Vec<CatalogOption>,
}

/// Blank rows offered for new limits.
const BLANK_ROWS: usize = 2;

fn edit_page(
    ctx: &Ctx,
    state: &WebState,
    agent: &str,
    mut rows: Vec<LimitInput>,
    error: Option<String>,
) -> EditPage {
    let start = rows.len();
    rows.extend((0..BLANK_ROWS).map(|i| LimitInput::blank(start + i)));
    let managed = state
        .policy
        .load()
        .agent(agent)
        .is_some_and(|a| a.record.managed.is_some());
    // Keep indices dense after a failed submit dropped removed rows.
    for (i, r) in rows.iter_mut().enumerate() {
        r.index = i;
    }
    EditPage {
        page: ctx.page(Nav::Limits, format!("Rate limits of {agent}")),
        agent: agent.to_owned(),
        managed,
        editable: ctx.role().can_edit() && !managed,
        rows,
        error,
        options: catalog_options(&state.policy.load()),
    }
}

pub async fn edit(
    State(state): State<WebState>,
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
            pattern: l
                .pattern
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            rate: l.limit.count().to_string(),
            period: l.limit.period().as_str().to_owned(),
            burst: l
                .limit
                .burst_written()
                .map(|b| b.to_string())
                .unwrap_or_default(),
        })
        .collect();
    render(&edit_page(&ctx, &state, &name, rows, None))
}

/// Reads the indexed rows (`pattern_3`, `rate_3`, `period_3`, `burst_3`, `remove_3`) of the
/// form.
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
        let (row, remove) = by_index
            .entry(index)
            .or_insert_with(|| (LimitInput::blank(index), false));
        match field {
            "pattern" => row.pattern = value.trim().to_owned(),
            "rate" => row.rate = value.trim().to_owned(),
            "period" => row.period = value.trim().to_owned(),
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
                v.parse::<f64>()
                    .map_err(|_| format!("{what} of {scope} must be a number, not `{v}`"))
            };
            let count = number(&r.rate, "The rate")?;
            let burst = match r.burst.as_str() {
                "" => None,
                b => Some(number(b, "The burst")?),
            };
            let mut form = LimitForm {
                burst,
                ..LimitForm::default()
            };
            match Period::parse(&r.period) {
                Some(Period::Second) => form.per_second = Some(count),
                Some(Period::Minute) => form.per_minute = Some(count),
                Some(Period::Hour) => form.per_hour = Some(count),
                None => {
                    return Err(format!(
                        "The period of {scope} must be second, minute or hour"
                    ));
                }
            }
            let limit = form.parse().map_err(|e| format!("In {scope}: {e}"))?;
            let pattern = (!r.pattern.is_empty())
                .then(|| GrantTarget::parse(&r.pattern))
                .transpose()
                .map_err(|e| format!("In {scope}: {e}"))?;
            Ok(RateLimitRecord { pattern, limit })
        })
        .collect();
    (rows, parsed)
}

pub async fn save(
    State(state): State<WebState>,
    ctx: Ctx,
    Path(name): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, WebError> {
    let (rows, parsed) = read_rows(&fields);
    let result = match parsed {
        Ok(limits) => service::agents::set_limits(&state, &ctx.admin.actor(), &name, limits)
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
