//! The dashboard: what is wrong first (zero-match grants, agents that see nothing, broken tool
//! groups), then the counts.

use askama::Template;
use axum::extract::State;
use axum::response::Response;

use super::WebState;
use super::error::WebError;
use super::view::{Ctx, Nav, PageCtx, render, thousands};
use crate::policy::snapshot::PolicySnapshot;
use crate::service::{self, agents::AgentSummary};

/// A grant that matches no tool, with the nearest existing names.
pub struct ZeroMatch {
    pub agent: String,
    pub target: String,
    pub suggestions: Vec<String>,
}

/// An agent whose grants match nothing at all.
pub struct Blind {
    pub agent: String,
    pub grants: usize,
}

/// A tool group whose last load failed.
pub struct Broken {
    pub folder: String,
    pub file: String,
    pub reason: String,
    /// Tools still served from the last good load.
    pub still_serving: usize,
}

/// An argument rule that cannot do what its author meant.
pub struct RuleFlag {
    pub agent: String,
    pub problem: crate::policy::arguments::RuleProblem,
}

/// Every argument-rule problem of `agents`.
pub fn rule_flags(agents: &[AgentSummary]) -> Vec<RuleFlag> {
    agents
        .iter()
        .flat_map(|a| {
            a.problems.iter().map(|p| RuleFlag {
                agent: a.name.clone(),
                problem: p.clone(),
            })
        })
        .collect()
}

/// The zero-match grants and the agents that see nothing, of `agents`.
pub fn problems(agents: &[AgentSummary]) -> (Vec<ZeroMatch>, Vec<Blind>) {
    let zero = agents
        .iter()
        .flat_map(|a| {
            a.grants
                .iter()
                .filter(|g| g.matched_tools == 0)
                .map(|g| ZeroMatch {
                    agent: a.name.clone(),
                    target: g.target.clone(),
                    suggestions: g.suggestions.clone(),
                })
        })
        .collect();
    let blind = agents
        .iter()
        .filter(|a| a.sees_nothing)
        .map(|a| Blind {
            agent: a.name.clone(),
            grants: a.grants.len(),
        })
        .collect();
    (zero, blind)
}

pub fn broken_groups(snapshot: &PolicySnapshot) -> Vec<Broken> {
    snapshot
        .catalog
        .groups()
        .filter_map(|g| {
            g.error.as_ref().map(|e| Broken {
                folder: g.folder.clone(),
                file: e.file.clone(),
                reason: e.reason.clone(),
                still_serving: g.tools,
            })
        })
        .collect()
}

pub struct AgentRow {
    pub name: String,
    /// Each grant with the number of tools it matches.
    pub grants: Vec<(String, usize)>,
    pub visible_tools: usize,
    pub zero_match: usize,
    pub sees_nothing: bool,
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct DashboardPage {
    page: PageCtx,
    zero_match: Vec<ZeroMatch>,
    blind: Vec<Blind>,
    rule_flags: Vec<RuleFlag>,
    /// Approval rules that never trigger or that nobody can decide: (agent, problem).
    approval_flags: Vec<(String, crate::policy::approvals::ApprovalProblem)>,
    broken: Vec<Broken>,
    agents: usize,
    groups: usize,
    tools: usize,
    grants: usize,
    calls_24h: String,
    denials_24h: String,
    rows: Vec<AgentRow>,
    /// Tools of pinned groups held for approval.
    held: usize,
    /// How the database differs from the policies folder, when there is one.
    drift: Option<DriftView>,
    activity: super::activity::Activity,
}

#[derive(serde::Deserialize, Default)]
pub struct ChartQuery {
    #[serde(default)]
    pub range: service::audit_access::Range,
}

/// The drift between the policies folder and the database, as lines to show (the first
/// [`DRIFT_SHOWN`] of each list, with the count of the rest).
struct DriftView {
    problems: Vec<String>,
    changes: Vec<String>,
    kept: Vec<String>,
    more_changes: usize,
    more_kept: usize,
}

const DRIFT_SHOWN: usize = 20;

fn drift_view(d: &crate::policy::files::Drift) -> DriftView {
    let first = |items: Vec<String>| -> (Vec<String>, usize) {
        let more = items.len().saturating_sub(DRIFT_SHOWN);
        (items.into_iter().take(DRIFT_SHOWN).collect(), more)
    };
    let (problems, _) = first(d.problems.iter().map(ToString::to_string).collect());
    let (changes, more_changes) = first(d.changes.iter().map(ToString::to_string).collect());
    let (kept, more_kept) = first(d.kept.iter().map(ToString::to_string).collect());
    DriftView {
        problems,
        changes,
        kept,
        more_changes,
        more_kept,
    }
}

pub async fn show(
    State(state): State<WebState>,
    axum::extract::Query(q): axum::extract::Query<ChartQuery>,
    ctx: Ctx,
) -> Result<Response, WebError> {
    let snapshot = state.policy.load();
    let summaries = service::agents::summaries(&snapshot);
    let (zero_match, blind) = problems(&summaries);
    let since = chrono::Utc::now() - chrono::Duration::hours(24);
    let (calls, denials) = service::audit_access::counts_since(&state, since).await?;
    let activity = super::activity::load(&state, q.range, crate::db::rollups::Scope::All).await?;
    // The page still shows everything else when the comparison cannot be made.
    let drift = match service::policy::drift(&state).await {
        Ok(d) => d.as_ref().map(drift_view),
        Err(e) => {
            tracing::warn!(error = %e, "comparing the policies folder with the database failed");
            None
        }
    };
    let mut approval_flags = Vec::new();
    for a in summaries.iter().filter(|a| !a.approvals.is_empty()) {
        for p in service::approvals::problems(&state, &a.name).await? {
            approval_flags.push((a.name.clone(), p));
        }
    }
    let page = DashboardPage {
        approval_flags,
        page: ctx.page(Nav::Dashboard, "Dashboard"),
        zero_match,
        blind,
        rule_flags: rule_flags(&summaries),
        broken: broken_groups(&snapshot),
        agents: summaries.len(),
        groups: snapshot.catalog.group_names().len(),
        tools: snapshot.catalog.len(),
        grants: summaries.iter().map(|a| a.grants.len()).sum(),
        calls_24h: thousands(calls.max(0) as usize),
        denials_24h: thousands(denials.max(0) as usize),
        held: snapshot.held_count(),
        drift,
        activity,
        rows: summaries
            .iter()
            .map(|a| AgentRow {
                name: a.name.clone(),
                grants: a
                    .grants
                    .iter()
                    .map(|g| (g.target.clone(), g.matched_tools))
                    .collect(),
                visible_tools: a.visible_tools,
                zero_match: a.zero_match_grants,
                sees_nothing: a.sees_nothing,
            })
            .collect(),
    };
    render(&page)
}
