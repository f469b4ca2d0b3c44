//! The call path every surface shares: decide, limit, validate, audit, run, audit.
//!
//! MCP `tools/call` and the REST endpoints both come here, so a tool behaves the same
//! whichever way it is reached: same grants, same validation, same limits, same audit.
//!
//! Audit is two rows per call that reaches its tool: `tool.call`/`started` is durable before
//! the script is spawned, and `tool.result` with the outcome is durable before the caller is
//! answered. A process killed mid-call therefore leaves the `started` row behind; if the
//! first row cannot be written, nothing runs (fail closed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::audit::writer::AuditUnavailable;
use crate::audit::{AuditEvent, RequestOrigin, kind, redact};
use crate::policy::snapshot::Principal;
use crate::pool::runner::{self, ScriptOutcome};
use crate::pool::{Execution, Tool};
use crate::upstream::UpstreamError;
use rmcp::model::{CallToolResult, ContentBlock};

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
    /// A rate limit is exhausted; retry after this long.
    RateLimited { retry_after: Duration },
    /// The audit log cannot record the call, so it was not run.
    AuditUnavailable(AuditUnavailable),
}

/// How a call that reached its tool ended.
#[derive(Debug)]
pub enum Outcome {
    Script(ScriptOutcome),
    /// The upstream's own result (which may itself be `isError`), or why it gave none.
    Upstream(Result<CallToolResult, UpstreamError>),
}

impl Outcome {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Script(s) => s.label(),
            Outcome::Upstream(Ok(r)) if r.is_error == Some(true) => "tool_error",
            Outcome::Upstream(Ok(_)) => "success",
            Outcome::Upstream(Err(UpstreamError::Timeout(..))) => "timeout",
            Outcome::Upstream(Err(UpstreamError::CircuitOpen(_) | UpstreamError::Down(_))) => {
                "upstream_unavailable"
            }
            Outcome::Upstream(Err(UpstreamError::Failed(..))) => "upstream_error",
        }
    }

    /// The outcome names the audit log uses.
    fn audit_outcome(&self) -> &'static str {
        match self {
            Outcome::Script(s) => audit_outcome(s),
            Outcome::Upstream(Ok(r)) if r.is_error == Some(true) => "tool_error",
            Outcome::Upstream(Ok(_)) => "success",
            Outcome::Upstream(Err(UpstreamError::Timeout(..))) => "timeout",
            Outcome::Upstream(Err(_)) => "tool_error",
        }
    }

    /// The MCP result: a script's JSON object becomes `structuredContent` plus the same JSON
    /// as text, other JSON becomes text, a failure becomes `isError` with the text the model
    /// needs to retry; an upstream's result passes through untouched.
    pub fn into_mcp_result(self) -> CallToolResult {
        match self {
            Outcome::Script(ScriptOutcome::Success { output, .. }) => {
                let text = serde_json::to_string(&output).unwrap_or_default();
                if output.is_object() {
                    let mut r = CallToolResult::structured(output);
                    r.content = vec![ContentBlock::text(text)];
                    r
                } else {
                    CallToolResult::success(vec![ContentBlock::text(text)])
                }
            }
            Outcome::Script(failed) => CallToolResult::error(vec![ContentBlock::text(
                failed.error_message().unwrap_or_default(),
            )]),
            Outcome::Upstream(Ok(mut r)) => {
                // A legacy upstream sends no resultType; the caller may be modern.
                r.result_type = Some(rmcp::model::ResultType::COMPLETE);
                r
            }
            Outcome::Upstream(Err(e)) => {
                CallToolResult::error(vec![ContentBlock::text(e.to_string())])
            }
        }
    }
}

/// A call that reached the tool.
#[derive(Debug)]
pub struct CallDone {
    pub tool: Arc<Tool>,
    pub outcome: Outcome,
    pub latency: Duration,
}

fn base_event(
    event_type: &str,
    outcome: &str,
    principal: &Principal,
    tool: &str,
    surface: Surface,
    origin: Option<&RequestOrigin>,
) -> AuditEvent {
    let mut e = AuditEvent::new(event_type, outcome).from_origin(origin);
    e.agent = Some(principal.agent.clone());
    e.client_id = Some(principal.client_id.clone());
    e.jti = principal.jti.map(|j| j.to_string());
    e.tool = Some(tool.to_owned());
    e.resource = Some(format!("tool:{tool}"));
    e.details = Some(serde_json::json!({"surface": surface.as_str()}).to_string());
    e
}

/// The outcome names the audit log uses.
fn audit_outcome(o: &ScriptOutcome) -> &'static str {
    match o {
        ScriptOutcome::Success { .. } => "success",
        ScriptOutcome::Failed { .. }
        | ScriptOutcome::InvalidOutput { .. }
        | ScriptOutcome::OutputTooLarge { .. }
        | ScriptOutcome::SpawnFailed { .. } => "tool_error",
        ScriptOutcome::Timeout { .. } => "timeout",
        ScriptOutcome::Busy => "busy",
    }
}

/// Runs `name` for `principal` with `args` (a JSON object).
pub async fn call(
    state: &AppState,
    principal: &Principal,
    name: &str,
    args: Value,
    surface: Surface,
    origin: Option<&RequestOrigin>,
) -> Result<CallDone, CallRefused> {
    let started = Instant::now();
    let metric = |outcome: &str| {
        state
            .metrics
            .tool_calls
            .with_label_values(&[surface.as_str(), outcome])
            .inc()
    };
    let snapshot = state.policy.load();
    let Some(tool) = snapshot.resolve(principal, name) else {
        metric("unknown_tool");
        let mut e = base_event(kind::TOOL_CALL, "denied", principal, name, surface, origin);
        e.error = Some("unknown tool, or not granted to this agent".into());
        state
            .audit
            .record(e)
            .await
            .map_err(CallRefused::AuditUnavailable)?;
        return Err(CallRefused::UnknownTool(name.to_owned()));
    };
    let agent = snapshot.agent(&principal.agent).cloned();
    drop(snapshot);
    if let Some(agent) = agent
        && let Err(retry_after) = state.limits.check(&agent, Some(name))
    {
        metric("rate_limited");
        let mut e = base_event(
            kind::TOOL_CALL,
            "rate_limited",
            principal,
            name,
            surface,
            origin,
        );
        e.error = Some(format!(
            "rate limited; retry after {} ms",
            retry_after.as_millis()
        ));
        state
            .audit
            .record(e)
            .await
            .map_err(CallRefused::AuditUnavailable)?;
        return Err(CallRefused::RateLimited { retry_after });
    }
    let redacted = serde_json::to_string(&redact(&args, &tool.audit)).unwrap_or_default();
    let bytes_in = serde_json::to_vec(&args)
        .map(|v| v.len() as i64)
        .unwrap_or(0);
    let violations = if args.is_object() {
        tool.violations(&args)
    } else {
        vec!["arguments must be a JSON object".to_owned()]
    };
    if !violations.is_empty() {
        metric("invalid_arguments");
        let mut e = base_event(
            kind::TOOL_CALL,
            "invalid_arguments",
            principal,
            name,
            surface,
            origin,
        );
        e.arguments = Some(redacted);
        e.bytes_in = Some(bytes_in);
        e.error = Some(violations.join("; "));
        state
            .audit
            .record(e)
            .await
            .map_err(CallRefused::AuditUnavailable)?;
        return Err(CallRefused::InvalidArguments { tool, violations });
    }
    let call_id = uuid::Uuid::now_v7().to_string();
    let mut e = base_event(kind::TOOL_CALL, "started", principal, name, surface, origin);
    e.call_id = Some(call_id.clone());
    e.arguments = Some(redacted);
    e.bytes_in = Some(bytes_in);
    if let Err(err) = state.audit.record(e).await {
        metric("audit_unavailable");
        return Err(CallRefused::AuditUnavailable(err));
    }

    let ran = Instant::now();
    let outcome = match &tool.exec {
        Execution::Script(spec) => {
            Outcome::Script(runner::run(spec, &args, &state.settings.output).await)
        }
        Execution::Upstream {
            upstream,
            tool: original,
        } => {
            let map = match &args {
                Value::Object(m) => m.clone(),
                _ => serde_json::Map::new(),
            };
            Outcome::Upstream(state.upstreams.call(upstream, original, map).await)
        }
    };
    let latency = ran.elapsed();

    let mut e = base_event(
        kind::TOOL_RESULT,
        outcome.audit_outcome(),
        principal,
        name,
        surface,
        origin,
    );
    e.call_id = Some(call_id);
    e.latency_us = Some(latency.as_micros() as i64);
    e.bytes_in = Some(bytes_in);
    match &outcome {
        Outcome::Upstream(Ok(r)) => {
            let text = serde_json::to_string(r).unwrap_or_default();
            e.bytes_out = Some(text.len() as i64);
            e.result_sha256 = Some(hex::encode(Sha256::digest(text.as_bytes())));
            if tool.audit.store_results {
                e.result = Some(text);
            }
        }
        Outcome::Upstream(Err(err)) => e.error = Some(err.to_string()),
        Outcome::Script(ScriptOutcome::Success {
            output,
            stdout_bytes,
        }) => {
            let text = serde_json::to_string(output).unwrap_or_default();
            e.bytes_out = Some(*stdout_bytes as i64);
            e.result_sha256 = Some(hex::encode(Sha256::digest(text.as_bytes())));
            if tool.audit.store_results {
                e.result = Some(text);
            }
        }
        Outcome::Script(ScriptOutcome::Failed { exit_code, stderr }) => {
            e.exit_code = *exit_code;
            e.error = Some(truncate(stderr, 4096));
        }
        Outcome::Script(other) => e.error = other.error_message().map(|m| truncate(&m, 4096)),
    }
    if let Err(err) = state.audit.record(e).await {
        metric("audit_unavailable");
        return Err(CallRefused::AuditUnavailable(err));
    }
    metric(outcome.label());
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
        latency,
    })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
