//! The call path every surface shares: decide, validate, run, count.
//!
//! MCP `tools/call` and the REST endpoints both come here, so a tool behaves the same
//! whichever way it is reached: same grants, same validation, same limits, same audit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::app::AppState;
use crate::policy::snapshot::Principal;
use crate::pool::runner::{self, ScriptOutcome};
use crate::pool::{Execution, Tool};

/// Which surface a call came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Mcp,
    Rest,
}

impl Surface {
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Mcp => "mcp",
            Surface::Rest => "rest",
        }
    }
}

/// A call that did not reach the tool.
#[derive(Debug)]
pub enum CallRefused {
    /// Unknown, or not granted to the caller: the two are indistinguishable on purpose.
    UnknownTool(String),
    /// The arguments violate the tool's input schema; one line per violation.
    InvalidArguments {
        tool: Arc<Tool>,
        violations: Vec<String>,
    },
}

/// A call that reached the tool.
#[derive(Debug)]
pub struct CallDone {
    pub tool: Arc<Tool>,
    pub outcome: ScriptOutcome,
    pub latency: Duration,
}

/// Runs `name` for `principal` with `args` (a JSON object).
pub async fn call(
    state: &AppState,
    principal: &Principal,
    name: &str,
    args: Value,
    surface: Surface,
) -> Result<CallDone, CallRefused> {
    let started = Instant::now();
    let snapshot = state.policy.load();
    let Some(tool) = snapshot.resolve(principal, name) else {
        state
            .metrics
            .tool_calls
            .with_label_values(&[surface.as_str(), "unknown_tool"])
            .inc();
        return Err(CallRefused::UnknownTool(name.to_owned()));
    };
    drop(snapshot);
    let violations = if args.is_object() {
        tool.violations(&args)
    } else {
        vec!["arguments must be a JSON object".to_owned()]
    };
    if !violations.is_empty() {
        state
            .metrics
            .tool_calls
            .with_label_values(&[surface.as_str(), "invalid_arguments"])
            .inc();
        return Err(CallRefused::InvalidArguments { tool, violations });
    }
    let outcome = match &tool.exec {
        Execution::Script(spec) => runner::run(spec, &args, &state.settings.output).await,
    };
    state
        .metrics
        .tool_calls
        .with_label_values(&[surface.as_str(), outcome.label()])
        .inc();
    tracing::info!(
        agent = %principal.agent,
        tool = %tool.name,
        surface = surface.as_str(),
        outcome = outcome.label(),
        latency_ms = started.elapsed().as_millis() as u64,
        "tool call"
    );
    Ok(CallDone {
        tool,
        outcome,
        latency: started.elapsed(),
    })
}
