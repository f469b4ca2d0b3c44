//! The "Activity" section the dashboard, an agent's page and a tool's page share: calls and
//! latency over a chosen range, and the refusals by agent, tool, reason and rule. Read from
//! the rollups, never the log.

use super::WebState;
use super::error::WebError;
use crate::db::rollups::Scope;
use crate::service::audit_access::{self, Range};

/// One line of the refusals table.
pub struct RefusalRow {
    pub agent: String,
    pub tool: String,
    pub reason: String,
    pub rule: String,
    pub calls: i64,
    /// The audit list filtered to these refusals.
    pub href: String,
}

/// What the section shows.
pub struct Activity {
    pub range: &'static str,
    /// SVG drawn here: numbers and fixed text only (see `chart`).
    pub calls: String,
    pub latency: String,
    pub refusals: Vec<RefusalRow>,
    /// Whose activity, for the section's empty text: "this agent", "this tool", "agents".
    pub whose: &'static str,
}

/// The outcome the audit log records for a refusal's reason.
fn outcome_of(reason: &str) -> &'static str {
    match reason {
        "rate limit" => "rate_limited",
        "input schema" => "invalid_arguments",
        _ => "denied",
    }
}

pub async fn load(state: &WebState, range: Range, scope: Scope) -> Result<Activity, WebError> {
    let points = audit_access::activity(state, range, &scope).await?;
    let (agent, tool) = match &scope {
        Scope::All => (None, None),
        Scope::Agent(a) => (Some(a.as_str()), None),
        Scope::Tool(t) => (None, Some(t.as_str())),
    };
    let refusals = audit_access::refusals(state, range, agent, tool)
        .await?
        .into_iter()
        .map(|r| {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            if !r.agent.is_empty() {
                q.append_pair("agent", &r.agent);
            }
            if !r.tool.is_empty() {
                q.append_pair("tool", &r.tool);
            }
            q.append_pair("outcome", outcome_of(&r.reason));
            RefusalRow {
                href: format!("/admin/audit?{}", q.finish()),
                agent: r.agent,
                tool: r.tool,
                reason: r.reason,
                rule: r.rule,
                calls: r.calls,
            }
        })
        .collect();
    let (whose, calls_label, latency_label) = match scope {
        Scope::All => (
            "agents",
            "Tool calls: succeeded, failed, refused",
            "Tool call latency, p50 and p95",
        ),
        Scope::Agent(_) => (
            "this agent",
            "This agent's tool calls: succeeded, failed, refused",
            "This agent's tool call latency, p50 and p95",
        ),
        Scope::Tool(_) => (
            "this tool",
            "This tool's calls: succeeded, failed, refused",
            "This tool's latency, p50 and p95",
        ),
    };
    Ok(Activity {
        range: range.as_str(),
        calls: super::chart::calls(&points, calls_label),
        latency: super::chart::latency(&points, latency_label),
        refusals,
        whose,
    })
}
