//! The one core path every surface goes through: **resolve** what the caller may see →
//! **rate limit** → **audit** → **run or answer**.
//!
//! MCP (`tools/call`, `tools/list`, search, `resources/*`, `prompts/*`, `initialize`), the REST
//! endpoints and `/openapi.json` all open a [`Gate`] for their caller and ask it; none of them
//! decides, limits or audits for itself. That is what keeps the surfaces from drifting apart:
//! a tool behaves the same whichever way it is reached, an ungranted tool is
//! indistinguishable from a missing one everywhere (it is resolved against the caller's
//! visibility before anything else is looked at, the request's body included), and every
//! request counts once against its agent's limits.
//!
//! Audit is two rows per call that reaches its tool: `tool.call`/`started` is durable before
//! the tool runs, and `tool.result` with the outcome is durable before the caller is
//! answered. A process killed mid-call therefore leaves the `started` row behind; if the first
//! row cannot be written, nothing runs (fail closed). Reads (lists, search, documents) run
//! nothing: what they disclosed is queued in the same group-commit writer without waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::audit::writer::AuditUnavailable;
use crate::audit::{self, AuditEvent, EventKind, Outcome as AuditOutcome, RequestOrigin};
use crate::limits::{LimitedAction, Refusal};
use crate::policy::snapshot::{Discovery, PolicySnapshot, Principal};
use crate::pool::runner::{self, ScriptOutcome};
use crate::pool::{Execution, Tool};
use crate::state::AppState;
use crate::upstream::UpstreamError;
use rmcp::model::{CallToolResult, ContentBlock};

/// Which surface a request came through.
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

/// A request the gate refused.
#[derive(Debug)]
pub enum Refused {
    /// Unknown, or not granted to the caller: the two are indistinguishable on purpose.
    UnknownTool(String),
    /// The arguments violate the tool's input schema (or could not be read); one line per
    /// violation.
    InvalidArguments {
        tool: Arc<Tool>,
        violations: Vec<String>,
    },
    /// A rate limit is exhausted; retry after this long. `policy`: the limit, for the
    /// `RateLimit` header fields.
    RateLimited {
        retry_after: Duration,
        policy: Option<crate::limits::LimitPolicy>,
    },
    /// The shared rate-limit store is down and the failure mode is `closed`; retry after
    /// this long.
    LimitsUnavailable { retry_after: Duration },
    /// The audit log cannot record the request, so it was not served.
    AuditUnavailable(AuditUnavailable),
    /// The call needs a person's approval: it waits (or will not run), as the ticket says.
    Approval {
        tool: Arc<Tool>,
        ticket: crate::service::approvals::Ticket,
    },
    /// The approval store could not be reached, so the call that needs approval did not run.
    ApprovalUnavailable,
    /// A credential slot of the tool's group has no value for this caller (or it does not
    /// open): the message names the slot and how to fill it.
    CredentialMissing { tool: Arc<Tool>, message: String },
}

/// How a call that reached its tool ended. Serializable: an approved call's outcome is kept
/// for its caller, who may come back on another instance.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
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
            Outcome::Upstream(Err(
                UpstreamError::CircuitOpen(_)
                | UpstreamError::ToolCircuitOpen(..)
                | UpstreamError::Down(_),
            )) => "upstream_unavailable",
            Outcome::Upstream(Err(UpstreamError::Failed(..))) => "upstream_error",
            Outcome::Upstream(Err(UpstreamError::Busy(..))) => "busy",
            Outcome::Upstream(Err(UpstreamError::NotRecorded)) => "audit_unavailable",
        }
    }

    fn audit_outcome(&self) -> AuditOutcome {
        match self {
            Outcome::Script(ScriptOutcome::Success { .. }) => AuditOutcome::Success,
            Outcome::Script(ScriptOutcome::Timeout { .. }) => AuditOutcome::Timeout,
            Outcome::Script(ScriptOutcome::Busy) => AuditOutcome::Busy,
            Outcome::Script(_) => AuditOutcome::ToolError,
            Outcome::Upstream(Ok(r)) if r.is_error == Some(true) => AuditOutcome::ToolError,
            Outcome::Upstream(Ok(_)) => AuditOutcome::Success,
            Outcome::Upstream(Err(UpstreamError::Timeout(..))) => AuditOutcome::Timeout,
            Outcome::Upstream(Err(UpstreamError::Busy(..))) => AuditOutcome::Busy,
            Outcome::Upstream(Err(_)) => AuditOutcome::ToolError,
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
    /// The audit call id of the run (none for an outcome given again after approval).
    pub call_id: Option<String>,
}

/// A tool the caller may call, admitted by its limits; not yet validated or run.
#[derive(Debug)]
pub struct Admitted {
    pub tool: Arc<Tool>,
}

/// One caller's view of the gateway for one request: its principal, where it came from, and
/// the policy snapshot taken when the request arrived (so a request is decided against one
/// consistent state even if a grant changes while it runs).
pub struct Gate<'a> {
    state: &'a AppState,
    principal: &'a Principal,
    origin: Option<&'a RequestOrigin>,
    surface: Surface,
    snapshot: Arc<PolicySnapshot>,
    /// The request's span, on which the call's agent, tool, outcome and audit call id are
    /// recorded (fields the HTTP layer declared).
    span: tracing::Span,
    /// The request's trace, when traces are exported: stamped on its audit rows.
    trace_id: Option<String>,
}

impl<'a> Gate<'a> {
    pub fn new(
        state: &'a AppState,
        principal: &'a Principal,
        surface: Surface,
        origin: Option<&'a RequestOrigin>,
    ) -> Self {
        let span = origin
            .and_then(|o| o.span.clone())
            .unwrap_or_else(tracing::Span::current);
        span.record("toolgate.agent", principal.agent.as_str());
        let trace_id = crate::telemetry::trace_id(&span);
        Self {
            state,
            principal,
            origin,
            surface,
            snapshot: state.policy.load(),
            span,
            trace_id,
        }
    }

    pub fn principal(&self) -> &Principal {
        self.principal
    }

    /// The live state this gate decides against.
    pub fn state(&self) -> &'a AppState {
        self.state
    }

    pub fn snapshot(&self) -> &PolicySnapshot {
        &self.snapshot
    }

    /// The tools the caller may see, in name order: the one visibility decision
    /// ([`PolicySnapshot::visible`]) that listing, search, documents and calls share.
    pub fn visible(&self) -> Vec<Arc<Tool>> {
        self.snapshot.visible(self.principal)
    }

    /// The caller's index-mode `search_tools`, built once per view of a snapshot.
    pub fn index_tool(&self) -> Arc<crate::search::IndexTool> {
        self.snapshot.index_tool(self.principal)
    }

    /// The tool `name` if the caller may see it; `None` whether it is unknown or not granted.
    pub fn resolve(&self, name: &str) -> Option<Arc<Tool>> {
        self.snapshot.resolve(self.principal, name)
    }

    /// Whether the caller has the search meta-tools (`discovery: search` or `auto`).
    pub fn has_meta_tools(&self) -> bool {
        self.snapshot
            .agent(&self.principal.agent)
            .is_some_and(|a| a.record.discovery != Discovery::Full)
    }

    pub fn discovery(&self) -> Discovery {
        self.snapshot
            .effective_discovery(self.principal, self.state.settings.budgets())
    }

    pub fn pinned(&self) -> &[String] {
        self.snapshot
            .agent(&self.principal.agent)
            .map(|a| a.record.pinned.as_slice())
            .unwrap_or_default()
    }

    fn event(&self, kind: EventKind, outcome: AuditOutcome) -> AuditEvent {
        let mut e = AuditEvent::new(kind, outcome).from_origin(self.origin);
        e.agent = Some(self.principal.agent.clone());
        e.client_id = Some(self.principal.client_id.clone());
        e.person = self.principal.person.clone();
        e.jti = self.principal.jti.map(|j| j.to_string());
        e.details = Some(self.details(serde_json::json!({})));
        e
    }

    /// An event's details: `extra`, the surface, and the trace when there is one.
    fn details(&self, mut extra: Value) -> String {
        if let Value::Object(m) = &mut extra {
            m.insert("surface".into(), self.surface.as_str().into());
            if let Some(t) = &self.trace_id {
                m.insert("trace_id".into(), t.as_str().into());
            }
        }
        extra.to_string()
    }

    fn tool_event(&self, kind: EventKind, outcome: AuditOutcome, tool: &str) -> AuditEvent {
        let mut e = self.event(kind, outcome);
        // The name may be a caller's invention of any length: bounded like any outside text.
        let tool = audit::bounded(tool);
        e.resource = Some(format!("tool:{tool}"));
        e.tool = Some(tool);
        e
    }

    /// A child of the request's span for one step of the core path (`resolve`, `limit`,
    /// `audit`), when traces are exported; otherwise none: the steps cost nothing extra when
    /// nobody looks.
    fn step(&self, name: &'static str) -> tracing::Span {
        if !crate::telemetry::exporting() {
            return tracing::Span::none();
        }
        match name {
            "resolve" => tracing::info_span!(parent: &self.span, "toolgate.resolve"),
            "limit" => tracing::info_span!(parent: &self.span, "toolgate.limit"),
            _ => tracing::info_span!(parent: &self.span, "toolgate.audit.commit"),
        }
    }

    /// The span of running `tool` (the OpenTelemetry GenAI `execute_tool`), when traces are
    /// exported.
    fn execute_span(&self, tool: &str) -> tracing::Span {
        if !crate::telemetry::exporting() {
            return tracing::Span::none();
        }
        tracing::info_span!(
            parent: &self.span,
            "execute_tool",
            otel.name = format!("execute_tool {tool}"),
            otel.kind = "internal",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool,
        )
    }

    /// Records `e` durably, inside a span of its own: the commit is a step of the call.
    async fn commit(&self, e: AuditEvent) -> Result<(), AuditUnavailable> {
        use tracing::Instrument;
        self.state
            .audit
            .record(e)
            .instrument(self.step("audit"))
            .await
    }

    /// Counts a refusal by its reason and, for an argument rule, the rule (`<on>.<param>`,
    /// the same words the charts use).
    fn refusal(&self, reason: &str, rule: &str) {
        self.state
            .metrics
            .refusals
            .with_label_values(&[self.principal.agent.as_str(), reason, rule])
            .inc();
    }

    /// Counts a call's outcome, and records it on the request's span.
    fn metric(&self, outcome: &str) {
        self.span.record("toolgate.outcome", outcome);
        self.state
            .metrics
            .tool_calls
            .with_label_values(&[self.surface.as_str(), outcome])
            .inc();
        // Per agent (bounded by the agents: the principal comes from a verified token), for
        // "who is refused, and by what".
        self.state
            .metrics
            .calls_by_agent
            .with_label_values(&[self.principal.agent.as_str(), outcome])
            .inc()
    }

    /// Takes one request from every limit of the caller's agent that applies (to `tool`, for
    /// a call). A refusal is audited as `kind` without waiting: a flood of refused requests
    /// must never queue behind, or slow, the audit log.
    async fn limit(
        &self,
        kind: EventKind,
        tool: Option<&str>,
        resource: Option<&str>,
    ) -> Result<(), Refused> {
        let Some(agent) = self.snapshot.agent(&self.principal.agent) else {
            return Ok(());
        };
        let action = match tool {
            Some(tool) => LimitedAction::Call { agent, tool },
            None => LimitedAction::Agent(agent),
        };
        let taken =
            tracing::Instrument::instrument(self.state.limits.take(action), self.step("limit"))
                .await;
        let Err(refusal) = taken else {
            return Ok(());
        };
        let mut e = match tool {
            Some(t) => self.tool_event(kind, AuditOutcome::RateLimited, t),
            None => self.event(kind, AuditOutcome::RateLimited),
        };
        if resource.is_some() {
            e.resource = resource.map(audit::bounded);
        }
        let refused = match refusal {
            Refusal::Exhausted(retry_after) => {
                e.error = Some(format!(
                    "rate limited; retry after {} ms",
                    retry_after.as_millis()
                ));
                Refused::RateLimited {
                    retry_after,
                    policy: crate::limits::refusing_policy(agent, tool, retry_after),
                }
            }
            Refusal::StoreUnavailable(retry_after) => {
                e.error = Some("the rate-limit store is unavailable".into());
                Refused::LimitsUnavailable { retry_after }
            }
        };
        self.state.audit.record_detached(e);
        Err(refused)
    }

    /// Admits a request that reads rather than runs (a list, a search, a document, a
    /// resource, a handshake): counts it against the agent's limits.
    pub async fn admit(&self, kind: EventKind) -> Result<(), Refused> {
        self.limit(kind, None, None).await
    }

    /// Records what a read disclosed (`details`), without waiting for the commit.
    pub fn disclosed(&self, kind: EventKind, outcome: AuditOutcome, details: Value) {
        let mut e = self.event(kind, outcome);
        e.details = Some(self.details(details));
        self.state.audit.record_detached(e);
    }

    /// Records a read of something the caller may not see or that does not exist
    /// (`resource`: what was asked for), without waiting.
    pub fn not_found(&self, kind: EventKind, resource: &str) {
        let mut e = self.event(kind, AuditOutcome::NotFound);
        e.resource = Some(audit::bounded(resource));
        self.state.audit.record_detached(e);
    }

    /// First step of a call: resolve `name` against what the caller may see, then take the
    /// request from the limits. An unknown or ungranted name counts against the agent's
    /// limits like any call and is audited as denied, durably, before the caller learns.
    pub async fn admit_call(&self, name: &str) -> Result<Admitted, Refused> {
        if crate::telemetry::exporting() {
            self.span
                .record("toolgate.tool", audit::bounded(name).as_str());
        }
        let resolved = self.step("resolve").in_scope(|| self.resolve(name));
        let Some(tool) = resolved else {
            return Err(self.unknown_tool(name).await);
        };
        if let Err(r) = self.limit(EventKind::ToolCall, Some(name), None).await {
            self.metric("rate_limited");
            self.refusal("rate limit", "");
            return Err(r);
        }
        Ok(Admitted { tool })
    }

    /// A call addressed to nothing the caller may see (`label`: the name or the REST route
    /// asked for).
    pub async fn unknown_tool(&self, label: &str) -> Refused {
        if let Err(r) = self.limit(EventKind::ToolCall, Some(label), None).await {
            self.metric("rate_limited");
            self.refusal("rate limit", "");
            return r;
        }
        self.metric("unknown_tool");
        self.refusal("not granted", "");
        let mut e = self.tool_event(EventKind::ToolCall, AuditOutcome::Denied, label);
        e.error = Some("unknown tool, or not granted to this agent".into());
        match self.commit(e).await {
            Ok(()) => Refused::UnknownTool(label.to_owned()),
            Err(err) => Refused::AuditUnavailable(err),
        }
    }

    /// Second step of a call: validate, audit `started`, run, audit the result. `args` is
    /// the argument object, or why the surface could not read one (a body that is not JSON,
    /// too large, of the wrong type): refused, audited and counted like a schema violation.
    pub async fn run(
        &self,
        admitted: Admitted,
        args: Result<Value, Vec<String>>,
    ) -> Result<CallDone, Refused> {
        let tool = admitted.tool;
        let name = tool.name.as_str();
        let (redacted, secrets, bytes_in, violations) = match &args {
            Ok(args) => {
                let (redacted, secrets) = audit::redact_collect(args, &tool.audit);
                // A redacted value may be repeated under a key that is not (a note quoting the
                // password, a header built from it): scrubbed there too.
                let redacted = audit::scrub(
                    &serde_json::to_string(&redacted).unwrap_or_default(),
                    &secrets,
                );
                let bytes_in = serde_json::to_vec(args)
                    .map(|v| v.len() as i64)
                    .unwrap_or(0);
                let violations = if args.is_object() {
                    tool.violations(args)
                } else {
                    vec!["arguments must be a JSON object".to_owned()]
                };
                (Some(redacted), secrets, Some(bytes_in), violations)
            }
            Err(v) => (None, Vec::new(), None, v.clone()),
        };
        // The agent's argument rules, checked only on arguments the tool itself accepts: a
        // refusal by a rule is a policy decision (`denied`, naming the rule), not a malformed
        // call.
        let refusals = match (&args, &tool.narrowing) {
            (Ok(a), Some(n)) if violations.is_empty() => n.refusals(a),
            _ => Vec::new(),
        };
        if !refusals.is_empty() {
            self.metric("argument_denied");
            let named: Vec<String> = refusals
                .iter()
                .map(|(c, _)| format!("{}.{}", c.source, c.param))
                .collect();
            self.refusal("argument rule", &named.join(", "));
            let rules: Vec<Value> = refusals
                .iter()
                .map(|(c, _)| serde_json::json!({"on": c.source, "param": c.param, "rule": c.rule}))
                .collect();
            let refused_by_rule: Vec<String> =
                refusals.into_iter().flat_map(|(_, lines)| lines).collect();
            let mut e = self.tool_event(EventKind::ToolCall, AuditOutcome::Denied, name);
            e.arguments = redacted;
            e.bytes_in = bytes_in;
            e.error = Some(audit::scrub(&refused_by_rule.join("; "), &secrets));
            e.details = Some(self.details(serde_json::json!({"argument_rules": rules})));
            self.commit(e).await.map_err(Refused::AuditUnavailable)?;
            return Err(Refused::InvalidArguments {
                tool,
                violations: refused_by_rule,
            });
        }
        if !violations.is_empty() {
            self.metric("invalid_arguments");
            self.refusal("input schema", "");
            let mut e = self.tool_event(EventKind::ToolCall, AuditOutcome::InvalidArguments, name);
            e.arguments = redacted;
            e.bytes_in = bytes_in;
            e.error = Some(audit::scrub(&violations.join("; "), &secrets));
            self.commit(e).await.map_err(Refused::AuditUnavailable)?;
            return Err(Refused::InvalidArguments { tool, violations });
        }
        let args = args.unwrap_or_default();
        if let Some(rule) = self
            .snapshot
            .agent(&self.principal.agent)
            .and_then(|a| a.approval_for(&tool, &args))
        {
            return self
                .approval(
                    tool.clone(),
                    rule,
                    &args,
                    redacted.as_deref().unwrap_or("{}"),
                )
                .await;
        }
        self.execute_audited(tool, args, redacted, secrets, bytes_in, None)
            .await
    }

    /// A call an approval rule asks about: the caller's request for exactly this call, or the
    /// outcome of its approved run (given once).
    async fn approval(
        &self,
        tool: Arc<Tool>,
        rule: &crate::policy::approvals::CompiledApproval,
        args: &Value,
        shown: &str,
    ) -> Result<CallDone, Refused> {
        use crate::service::approvals::{self, Gatekeeping};
        match approvals::gatekeep(
            self.state,
            self.principal,
            self.surface.as_str(),
            &tool,
            rule,
            args,
            shown,
        )
        .await
        {
            Ok(Gatekeeping::Ran { outcome, latency }) => {
                let Ok(outcome) = serde_json::from_value::<Outcome>(outcome) else {
                    tracing::error!(tool = %tool.name, "an approved call's stored outcome does not read back");
                    self.metric("approval_unavailable");
                    return Err(Refused::ApprovalUnavailable);
                };
                self.metric(outcome.label());
                Ok(CallDone {
                    tool,
                    outcome,
                    latency,
                    call_id: None,
                })
            }
            Ok(Gatekeeping::Ticket(ticket)) => {
                self.metric(if ticket.waiting() {
                    "approval_pending"
                } else {
                    "approval_refused"
                });
                Err(Refused::Approval { tool, ticket })
            }
            // Too large to keep, or too many waiting: refused, on record, with the reason.
            Err(
                crate::service::ServiceError::Invalid(message)
                | crate::service::ServiceError::Conflict(message),
            ) => {
                self.metric("approval_refused");
                let mut e = self.tool_event(
                    EventKind::ToolCall,
                    AuditOutcome::Denied,
                    tool.name.as_str(),
                );
                e.error = Some(message.clone());
                self.commit(e).await.map_err(Refused::AuditUnavailable)?;
                Err(Refused::InvalidArguments {
                    tool,
                    violations: vec![message],
                })
            }
            Err(e) => {
                tracing::error!(error = %e, "the approval store is unavailable");
                self.metric("approval_unavailable");
                Err(Refused::ApprovalUnavailable)
            }
        }
    }

    /// Runs a call a person approved (`approval`), with the caller's identity this gate was
    /// opened for; its rows link to the approval.
    pub async fn run_approved(
        &self,
        tool: Arc<Tool>,
        args: Value,
        approval: uuid::Uuid,
    ) -> Result<CallDone, Refused> {
        let (redacted, secrets) = audit::redact_collect(&args, &tool.audit);
        let redacted = audit::scrub(
            &serde_json::to_string(&redacted).unwrap_or_default(),
            &secrets,
        );
        let bytes_in = serde_json::to_vec(&args)
            .map(|v| v.len() as i64)
            .unwrap_or(0);
        self.execute_audited(
            tool,
            args,
            Some(redacted),
            secrets,
            Some(bytes_in),
            Some(approval),
        )
        .await
    }

    /// Audits `started`, runs, audits the result.
    async fn execute_audited(
        &self,
        tool: Arc<Tool>,
        args: Value,
        redacted: Option<String>,
        mut secrets: Vec<String>,
        bytes_in: Option<i64>,
        approval: Option<uuid::Uuid>,
    ) -> Result<CallDone, Refused> {
        let started = Instant::now();
        let name = tool.name.as_str();
        let mut linked_details = serde_json::Map::new();
        if let Some(id) = approval {
            linked_details.insert("approval".into(), serde_json::json!(id));
        }
        let credentials = match self.credentials_for(&tool).await {
            Ok(c) => c,
            Err(message) => {
                self.metric("credential_missing");
                let mut e = self.tool_event(EventKind::ToolCall, AuditOutcome::Denied, name);
                e.arguments = redacted;
                e.bytes_in = bytes_in;
                e.error = Some(message.clone());
                if !linked_details.is_empty() {
                    e.details = Some(self.details(serde_json::Value::Object(linked_details)));
                }
                self.commit(e).await.map_err(Refused::AuditUnavailable)?;
                return Err(Refused::CredentialMissing { tool, message });
            }
        };
        if !credentials.is_empty() {
            // Which slot and whose value each call used, never the value.
            let used: Vec<_> = credentials
                .iter()
                .map(|(slot, _)| serde_json::json!({"slot": slot.name, "per": slot.per, "owner": slot.owner}))
                .collect();
            linked_details.insert("credentials".into(), serde_json::Value::Array(used));
            // Whatever the tool says back is scrubbed of them, like redacted arguments.
            secrets.extend(
                credentials
                    .iter()
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
            );
        }
        let linked = |e: &mut AuditEvent| {
            if !linked_details.is_empty() {
                e.details = Some(self.details(serde_json::Value::Object(linked_details.clone())));
            }
        };
        let call_id = uuid::Uuid::now_v7().to_string();
        let mut e = self.tool_event(EventKind::ToolCall, AuditOutcome::Started, name);
        e.call_id = Some(call_id.clone());
        e.arguments = redacted;
        e.bytes_in = bytes_in;
        linked(&mut e);
        self.span.record("toolgate.call_id", call_id.as_str());
        // The script or upstream continues the trace from the run's own span.
        let run_span = self.execute_span(name);
        let trace = crate::telemetry::context_of(if run_span.is_none() {
            &self.span
        } else {
            &run_span
        });
        // The tool is prepared while its `started` row commits; it acts only once the row is
        // durable (see `audit::Durable`), and a failed commit undoes what was prepared.
        let (committed, durable) = audit::durable();
        let commit = async {
            self.commit(e).await?;
            committed.done();
            Ok(Instant::now())
        };
        let run = tracing::Instrument::instrument(
            self.execute(&tool, args, &trace, &credentials, durable),
            run_span,
        );
        let (ran, outcome) = match after_commit(commit, run).await {
            Ok(done) => done,
            Err(err) => {
                self.metric("audit_unavailable");
                return Err(Refused::AuditUnavailable(err));
            }
        };
        self.touch_credentials(&credentials);
        let latency = ran.elapsed();

        let mut e = self.tool_event(EventKind::ToolResult, outcome.audit_outcome(), name);
        e.call_id = Some(call_id.clone());
        linked(&mut e);
        e.latency_us = Some(latency.as_micros() as i64);
        e.bytes_in = bytes_in;
        // Whatever the tool says back, on any channel, is scrubbed of the values that were
        // redacted from its arguments: a script that echoes its input to stderr must not
        // put a password into the log, an export, or a viewer's page.
        match &outcome {
            Outcome::Upstream(Ok(r)) => {
                let text = serde_json::to_string(r).unwrap_or_default();
                e.bytes_out = Some(text.len() as i64);
                e.result_sha256 = Some(hex::encode(Sha256::digest(text.as_bytes())));
                if tool.audit.store_results {
                    e.result = Some(audit::scrub(&text, &secrets));
                }
            }
            Outcome::Upstream(Err(err)) => {
                e.error = Some(audit::scrub(&err.to_string(), &secrets));
            }
            Outcome::Script(ScriptOutcome::Success {
                output,
                stdout_bytes,
            }) => {
                let text = serde_json::to_string(output).unwrap_or_default();
                e.bytes_out = Some(*stdout_bytes as i64);
                e.result_sha256 = Some(hex::encode(Sha256::digest(text.as_bytes())));
                if tool.audit.store_results {
                    e.result = Some(audit::scrub(&text, &secrets));
                }
            }
            Outcome::Script(ScriptOutcome::Failed { exit_code, stderr }) => {
                e.exit_code = *exit_code;
                e.error = Some(truncate(&audit::scrub(stderr, &secrets), 4096));
            }
            Outcome::Script(other) => {
                e.error = other
                    .error_message()
                    .map(|m| truncate(&audit::scrub(&m, &secrets), 4096))
            }
        }
        if let Err(err) = self.commit(e).await {
            self.metric("audit_unavailable");
            return Err(Refused::AuditUnavailable(err));
        }
        self.metric(outcome.label());
        tracing::info!(
            agent = %self.principal.agent,
            tool = %tool.name,
            surface = self.surface.as_str(),
            outcome = outcome.label(),
            latency_ms = started.elapsed().as_millis() as u64,
            "tool call"
        );
        Ok(CallDone {
            tool,
            outcome,
            latency,
            call_id: Some(call_id),
        })
    }

    /// The values of the tool's credential slots for this caller, or why one is missing.
    async fn credentials_for(
        &self,
        tool: &Tool,
    ) -> Result<Vec<crate::credentials::Opened>, String> {
        use crate::credentials::{Per, SlotKey};
        let upstream_slots;
        type Slot<'a> = (
            &'a crate::pool::CredentialSlot,
            Option<&'a crate::credentials::oauth::SlotOAuth>,
            Option<&'a Arc<crate::credentials::exchange::SlotExchange>>,
        );
        let (group, slots): (&str, Vec<Slot<'_>>) = match &tool.exec {
            Execution::Script(spec) => (
                &spec.group.name,
                spec.group
                    .credentials
                    .iter()
                    .map(|s| (s, None, None))
                    .collect(),
            ),
            Execution::Upstream { upstream, .. } => {
                upstream_slots = self.state.upstreams.slots(upstream);
                if upstream_slots.is_empty() {
                    return Ok(Vec::new());
                }
                (
                    upstream,
                    upstream_slots
                        .iter()
                        .map(|s| (&s.slot, s.oauth.as_deref(), s.exchange.as_ref()))
                        .collect(),
                )
            }
        };
        let mut out = Vec::with_capacity(slots.len());
        for (slot, oauth, exchange) in slots {
            let owner = match slot.per {
                Per::Agent => self.principal.agent.clone(),
                Per::Shared => String::new(),
                Per::Person => match &self.principal.person {
                    Some(p) => p.clone(),
                    None => {
                        return Err(format!(
                            "`{}` needs the credential `{}` of the person it acts for, and this call is made with the agent's own credentials, for no person: call it from a host a person signed in to",
                            tool.name, slot.name
                        ));
                    }
                },
            };
            let key = SlotKey {
                per: slot.per,
                owner,
                group: group.to_owned(),
                name: slot.name.to_string(),
            };
            if let Some(spec) = exchange {
                let token = self.exchanged(&key, spec).await.map_err(|why| {
                    format!(
                        "`{}` needs a token for upstream `{}` exchanged for {} at the token service of slot `{}`, and {why}",
                        tool.name,
                        key.group,
                        match key.per {
                            Per::Person => format!(
                                "person `{}` (through agent `{}`)",
                                key.owner, self.principal.agent
                            ),
                            _ => format!("agent `{}`", key.owner),
                        },
                        key.name
                    )
                })?;
                out.push((key, token));
                continue;
            }
            let fill = match slot.per {
                Per::Agent => format!(
                    "an admin sets it with PUT /api/v1/agents/{}/credentials/{}/{}",
                    key.owner, key.group, key.name
                ),
                Per::Person if oauth.is_some() => format!(
                    "the person connects on the My connections page ({}/admin/connections)",
                    self.state.settings.issuer
                ),
                Per::Person => format!(
                    "the person sets it on the My connections page (/admin/connections), or an admin with PUT /api/v1/users/{}/credentials/{}/{}",
                    key.owner, key.group, key.name
                ),
                Per::Shared => format!(
                    "an admin sets it with PUT /api/v1/credentials/{}/{}",
                    key.group, key.name
                ),
            };
            match self.state.credentials.value(&key) {
                Ok(Some(v)) if oauth.is_some() => {
                    // A connected grant: its access token is what goes out, while it is good.
                    let usable = match crate::credentials::oauth::Grant::parse(&v) {
                        None => {
                            Err("it holds no grant from the upstream's authorization server"
                                .to_owned())
                        }
                        Some(g) if g.failed.is_some() => Err(format!(
                            "the upstream's authorization server refused to refresh it ({})",
                            g.failed.as_deref().unwrap_or_default()
                        )),
                        Some(g) if g.expired(chrono::Utc::now()) => {
                            Err("it expired and was not refreshed".to_owned())
                        }
                        // The token's audience is where the upstream was when it was given.
                        Some(g)
                            if !self
                                .state
                                .upstreams
                                .url(group)
                                .is_some_and(|u| g.for_resource(&u)) =>
                        {
                            Err(format!(
                                "it was given for `{}`, and the upstream has moved since",
                                g.resource
                            ))
                        }
                        Some(g) => Ok(zeroize::Zeroizing::new(g.access_token.into_bytes())),
                    };
                    match usable {
                        Ok(token) => out.push((key, token)),
                        Err(why) => {
                            return Err(format!(
                                "`{}` needs person `{}`'s connection `{}` to upstream `{}`, and {why}: connect again: {fill}",
                                tool.name, key.owner, key.name, key.group
                            ));
                        }
                    }
                }
                Ok(Some(v)) => out.push((key, v)),
                Ok(None) => {
                    return Err(format!(
                        "`{}` needs the credential `{}` ({} slot of group `{}`), which has no value for {}: {fill}",
                        tool.name,
                        key.name,
                        key.per.as_str(),
                        key.group,
                        match key.per {
                            Per::Agent => format!("agent `{}`", key.owner),
                            Per::Person => format!("person `{}`", key.owner),
                            Per::Shared => "anyone".into(),
                        },
                    ));
                }
                Err(e) => {
                    tracing::error!(slot = %key.name, group = %key.group, error = %e, "a stored credential does not open");
                    return Err(format!(
                        "`{}` needs the credential `{}` of group `{}`, and its stored value cannot be used ({e}); {fill}",
                        tool.name, key.name, key.group
                    ));
                }
            }
        }
        Ok(out)
    }

    /// The caller's token for an exchanged slot: the cached one while fresh, else one the
    /// slot's token service gives for a subject token signed here (put on record).
    async fn exchanged(
        &self,
        slot: &crate::credentials::SlotKey,
        spec: &Arc<crate::credentials::exchange::SlotExchange>,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        use crate::credentials::exchange::{self, ExchangeKey, Source, SubjectClaims};
        let person = (slot.per == crate::credentials::Per::Person).then_some(slot.owner.as_str());
        let key = ExchangeKey {
            group: slot.group.clone(),
            slot: slot.name.clone(),
            agent: self.principal.agent.clone(),
            person: person.map(str::to_owned),
            spec: spec.clone(),
        };
        let (token, source) = self
            .state
            .exchanges
            .token(key, || async {
                // Read only here, once per caller and token lifetime: the key can rotate.
                let signing = crate::db::keys::current_signing_key(&self.state.db)
                    .await
                    .map_err(|e| format!("the gateway's signing key cannot be read: {e}"))?
                    .ok_or("the gateway has no signing key")?;
                let subject = SubjectClaims::new(
                    &self.state.settings.issuer,
                    spec.subject_audience(),
                    &self.principal.agent,
                    &self.principal.client_id,
                    person,
                )
                .sign(&signing.kid, &signing.private_pkcs8)?;
                exchange::exchange(spec, &subject).await
            })
            .await?;
        if let Source::Exchanged(expires_in) = source {
            let mut e = crate::db::change_event(
                crate::db::credentials::EXCHANGER,
                crate::audit::AdminAction::CredentialExchanged,
                &crate::db::credentials::resource(slot),
                None,
                Some(serde_json::json!({
                    "per": slot.per, "owner": slot.owner, "group": slot.group, "name": slot.name,
                    "agent": self.principal.agent, "person": person,
                    "token_endpoint": spec.token_endpoint, "expires_in": expires_in,
                })),
            );
            e.agent = Some(self.principal.agent.clone());
            e.person = self.principal.person.clone();
            // The token is obtained and will be used: a lost record is logged, not a failed call.
            if let Err(err) = self.commit(e).await {
                tracing::error!(error = %err, "recording a token exchange failed");
            }
        }
        Ok(zeroize::Zeroizing::new(token.as_bytes().to_vec()))
    }

    /// Notes, in the background and at most once a minute per slot, that these were used.
    fn touch_credentials(&self, used: &[crate::credentials::Opened]) {
        let due: Vec<_> = used
            .iter()
            .map(|(k, _)| k)
            .filter(|k| self.state.credentials.due_for_touch(k))
            .cloned()
            .collect();
        if due.is_empty() {
            return;
        }
        let db = self.state.db.clone();
        tokio::spawn(async move {
            if let Ok(mut conn) = db.acquire().await
                && let Err(e) = crate::db::credentials::touch(&mut conn, &due).await
            {
                tracing::debug!(error = %e, "noting a credential's last use failed");
            }
        });
    }

    /// Runs the tool: its script, or a call to its upstream.
    async fn execute(
        &self,
        tool: &Tool,
        args: Value,
        trace: &crate::telemetry::TraceContext,
        credentials: &[crate::credentials::Opened],
        durable: audit::Durable,
    ) -> Outcome {
        match &tool.exec {
            Execution::Script(spec) => {
                let env: Vec<(&str, &[u8])> = credentials
                    .iter()
                    .map(|(slot, v)| (slot.name.as_str(), v.as_slice()))
                    .collect();
                Outcome::Script(
                    runner::run(
                        spec,
                        &args,
                        &self.state.settings.output,
                        trace,
                        &env,
                        durable,
                    )
                    .await,
                )
            }
            Execution::Upstream {
                upstream,
                tool: original,
            } => {
                let map = match args {
                    Value::Object(m) => m,
                    _ => serde_json::Map::new(),
                };
                Outcome::Upstream(
                    self.state
                        .upstreams
                        .call(upstream, original, map, trace, credentials, durable)
                        .await,
                )
            }
        }
    }

    /// A whole call: [`Self::admit_call`] then [`Self::run`].
    pub async fn call(&self, name: &str, args: Value) -> Result<CallDone, Refused> {
        let admitted = self.admit_call(name).await?;
        self.run(admitted, Ok(args)).await
    }
}

/// Runs `commit` and `run` side by side in this task: the commit's value and the run's
/// outcome once the commit succeeded, or the commit's error, with `run` dropped wherever it
/// was (so what it prepared is undone). A run waiting on the commit's word finishes after it.
async fn after_commit<T, E, O>(
    commit: impl Future<Output = Result<T, E>>,
    run: impl Future<Output = O>,
) -> Result<(T, O), E> {
    let mut commit = std::pin::pin!(commit);
    let mut run = std::pin::pin!(run);
    let mut finished = None;
    let committed = loop {
        tokio::select! {
            biased;
            c = &mut commit => break c?,
            o = &mut run, if finished.is_none() => finished = Some(o),
        }
    };
    let outcome = match finished {
        Some(o) => o,
        None => run.await,
    };
    Ok((committed, outcome))
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

/// Decides a request for approval ([`crate::service::approvals::decide`]); a granted call is
/// then run here, once, in the background, through the core path under its caller's identity.
pub async fn decide(
    state: &AppState,
    decider: &crate::service::approvals::Decider,
    id: uuid::Uuid,
    approve: bool,
    reason: Option<&str>,
) -> Result<crate::db::approvals::ApprovalRow, crate::service::ServiceError> {
    let row = crate::service::approvals::decide(state, decider, id, approve, reason).await?;
    if approve {
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = run_granted(&state, id).await {
                tracing::error!(approval = %id, error = %e, "running an approved call failed");
            }
        });
    }
    Ok(row)
}

/// Runs a granted request's call: the first to claim it (on any instance) runs it, once, if the
/// tool is still granted to the caller and its definition is the one approved; stores how it
/// ended for the caller to read.
pub async fn run_granted(
    state: &AppState,
    id: uuid::Uuid,
) -> Result<(), crate::service::ServiceError> {
    use crate::service::approvals;
    let Some((row, principal, args)) = approvals::claim(state, id).await? else {
        return Ok(());
    };
    let surface = if row.surface == Surface::Rest.as_str() {
        Surface::Rest
    } else {
        Surface::Mcp
    };
    let gate = Gate::new(state, &principal, surface, None);
    // Checked again now, as any call is: the caller's credential and the rule still stand,
    // the tool is still granted with the definition approved, the arguments are those whose
    // digest the approver was shown and pass the tool's schema and the agent's argument
    // rules as they are now.
    let ran = match gate.resolve(&row.tool) {
        _ if approvals::stale(gate.snapshot(), &row).is_some() => {
            Err(approvals::stale(gate.snapshot(), &row)
                .unwrap_or_default()
                .to_owned())
        }
        _ if approvals::arguments_sha256(&args) != row.arguments_sha256 => Err(
            "the stored arguments are not those approved (their digest differs); not run"
                .to_owned(),
        ),
        None => Err("the tool is no longer granted to this agent".to_owned()),
        Some(tool) if tool.content_hash.hex() != row.definition_sha256 => Err(
            "the tool's definition changed since the request; call again to ask anew".to_owned(),
        ),
        Some(tool) if !tool.violations(&args).is_empty() => Err(tool.violations(&args).join("; ")),
        Some(tool)
            if tool
                .narrowing
                .as_ref()
                .is_some_and(|n| !n.refusals(&args).is_empty()) =>
        {
            Err(tool
                .narrowing
                .as_ref()
                .map(|n| {
                    n.refusals(&args)
                        .into_iter()
                        .flat_map(|(_, lines)| lines)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default())
        }
        Some(tool) => match gate.run_approved(tool, args, row.id).await {
            Ok(done) => Ok((
                serde_json::to_value(&done.outcome).unwrap_or_default(),
                done.latency,
                done.call_id,
            )),
            Err(Refused::AuditUnavailable(_)) => {
                Err("the audit log was unavailable, so the call did not run".to_owned())
            }
            Err(Refused::InvalidArguments { violations, .. }) => Err(violations.join("; ")),
            Err(other) => Err(format!("the call did not run ({other:?})")),
        },
    };
    approvals::finish(state, id, ran).await
}

/// Every few seconds: expires requests whose time is up, runs granted calls whose deciding
/// instance died before running them, refreshes the pending gauge.
pub fn spawn_approval_sweeper(state: AppState) {
    use crate::service::approvals;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            if let Err(e) = approvals::expire_due(&state).await {
                tracing::warn!(error = %e, "expiring approval requests failed");
            }
            for id in approvals::orphans(&state).await.unwrap_or_default() {
                if let Err(e) = run_granted(&state, id).await {
                    tracing::warn!(approval = %id, error = %e, "running an approved call failed");
                }
            }
            let _ = approvals::count_pending(&state).await;
            let _ = approvals::purge(&state).await;
        }
    });
}

/// The outcome an approved call left, for its caller to read.
pub fn stored_outcome(row: &crate::db::approvals::ApprovalRow) -> Option<Outcome> {
    crate::service::approvals::outcome_of(row).and_then(|v| serde_json::from_value(v.clone()).ok())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::after_commit;
    use crate::audit;

    /// A run that prepares, then waits for the word, then "acts" (sets a flag).
    async fn run(durable: audit::Durable, acted: Arc<AtomicBool>, prepared: Arc<AtomicBool>) {
        prepared.store(true, Ordering::SeqCst);
        if durable.wait().await {
            acted.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn the_run_prepares_during_the_commit_and_acts_only_after_it() {
        let (acted, prepared) = (Arc::<AtomicBool>::default(), Arc::<AtomicBool>::default());
        let (committed, durable) = audit::durable();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let commit = {
            let (acted, prepared) = (acted.clone(), prepared.clone());
            async move {
                // The commit is still in flight: the run has prepared and not acted.
                rx.await.unwrap();
                assert!(prepared.load(Ordering::SeqCst));
                assert!(!acted.load(Ordering::SeqCst));
                committed.done();
                Ok::<_, ()>("durable")
            }
        };
        let both = after_commit(commit, run(durable, acted.clone(), prepared.clone()));
        let release = async {
            tokio::task::yield_now().await;
            tx.send(()).unwrap();
        };
        let (done, ()) = tokio::join!(both, release);
        assert_eq!(done, Ok(("durable", ())));
        assert!(acted.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_failed_commit_drops_the_run_before_it_acts() {
        let (acted, prepared) = (Arc::<AtomicBool>::default(), Arc::<AtomicBool>::default());
        let (committed, durable) = audit::durable();
        let commit = async move {
            tokio::task::yield_now().await;
            drop(committed);
            Err::<(), _>("the log is down")
        };
        let done = after_commit(commit, run(durable, acted.clone(), prepared.clone())).await;
        assert_eq!(done, Err("the log is down"));
        assert!(prepared.load(Ordering::SeqCst));
        assert!(!acted.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_run_that_ends_early_still_waits_for_the_commit() {
        let (committed, _durable) = audit::durable();
        let commit = async move {
            tokio::task::yield_now().await;
            committed.done();
            Ok::<_, ()>(1)
        };
        // A busy slot or a failed sandbox: the run is over before the row is durable.
        let done = after_commit(commit, async { "busy" }).await;
        assert_eq!(done, Ok((1, "busy")));
    }
}
