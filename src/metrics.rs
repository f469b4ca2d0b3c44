//! Prometheus metrics, served on `GET /metrics`.
//!
//! The gateway's own families are prefixed `toolgate_`; the OpenTelemetry MCP semantic
//! conventions' `mcp_server_operation_duration_seconds` and the standard `process_*` families
//! keep their own names, so dashboards written for any MCP server or process read them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Distinct (agent, tool) pairs the MCP operation histogram keeps series for; calls beyond
/// are counted under `other`, so no caller can grow the exposition without bound.
pub const MAX_OPERATION_SERIES: usize = 2000;

/// Seconds, from a fast listing to a slow tool.
const LATENCY_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Unprefixed families (semantic conventions, process).
    plain: Registry,
    /// `mcp.server.operation.duration`, labelled by method, tool, error type and agent.
    pub mcp_operations: HistogramVec,
    operation_series: Arc<Mutex<HashSet<(String, String)>>>,
    /// Events waiting in this instance's audit writer queue (set when scraped).
    pub audit_queue: IntGauge,
    /// Database pool connections: open, and idle (set when scraped).
    pub db_connections: IntGaugeVec,
    /// Rows each audit sink delivered, and its failed attempts.
    pub sink_rows: IntCounterVec,
    pub sink_errors: IntCounterVec,
    /// Rows each audit sink has yet to deliver (set when scraped, counted up to a cap).
    pub sink_lag: IntGaugeVec,
    pub http_requests: IntCounterVec,
    pub http_latency: HistogramVec,
    pub tool_calls: IntCounterVec,
    /// Tool calls by agent and outcome (`unknown_tool`, `argument_denied`, `rate_limited`,
    /// `invalid_arguments`, `success`, `tool_error`, ...).
    pub calls_by_agent: IntCounterVec,
    /// Refused calls by agent, reason and the argument rule that refused (bounded by the
    /// policy: a rule is named only when one refused).
    pub refusals: IntCounterVec,
    pub pool_tools: IntGauge,
    /// Approval requests by what became of them (`requested`, `granted`, `denied`, `expired`).
    pub approvals: IntCounterVec,
    /// Requests waiting for a decision (refreshed every few seconds).
    pub approvals_pending: IntGauge,
    /// Time from request to decision.
    pub approval_decision_seconds: prometheus::Histogram,
    /// Approval rules that match no tool or whose `when` never triggers.
    pub approval_rule_problems: IntGauge,
    /// Approval webhooks by how they ended (`delivered`, `failed` after every retry).
    pub approval_webhooks: IntCounterVec,
    pub pool_load_errors: IntGauge,
    pub zero_match_grants: IntGauge,
    pub agents_without_tools: IntGauge,
    /// Argument rules that cannot do what their author meant.
    pub argument_rule_problems: IntGauge,
    /// Tools of pinned groups held for approval (hidden from every agent).
    pub tools_held: IntGauge,
    /// Rate-limit checks the shared store (Redis) failed to answer in time.
    pub rate_limit_store_errors: IntCounter,
    /// `tools/list` requests answered before the SDK, from serialized definitions.
    pub mcp_fast_lists: IntCounter,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("toolgate".into()), None).unwrap_or_default();
        let plain = Registry::new();
        let mcp_operations = HistogramVec::new(
            HistogramOpts::new(
                "mcp_server_operation_duration_seconds",
                "MCP request duration as the server sees it (OpenTelemetry MCP semantic conventions); error_type is empty on success, tool_error for a result with isError",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["mcp_method_name", "gen_ai_tool_name", "error_type", "agent"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let _ = plain.register(Box::new(mcp_operations.clone()));
        #[cfg(target_os = "linux")]
        let _ = plain.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        let build_info = IntGaugeVec::new(
            Opts::new(
                "build_info",
                "The running build: always 1, labelled with its version",
            ),
            &["version"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let audit_queue = IntGauge::new(
            "audit_queue_events",
            "Events waiting in this instance's audit writer queue",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let sink_rows = IntCounterVec::new(
            Opts::new("audit_sink_rows_total", "Audit rows delivered, by sink"),
            &["sink"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let sink_errors = IntCounterVec::new(
            Opts::new("audit_sink_errors_total", "Failed deliveries, by sink"),
            &["sink"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let sink_lag = IntGaugeVec::new(
            Opts::new(
                "audit_sink_lag_rows",
                "Audit rows a sink has yet to deliver (counted up to 100,000)",
            ),
            &["sink"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let db_connections = IntGaugeVec::new(
            Opts::new("db_pool_connections", "Database pool connections by state"),
            &["state"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let http_requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by surface and status"),
            &["surface", "status"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let http_latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request latency by surface",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["surface"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let tool_calls = IntCounterVec::new(
            Opts::new("tool_calls_total", "Tool calls by surface and outcome"),
            &["surface", "outcome"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let calls_by_agent = IntCounterVec::new(
            Opts::new(
                "calls_by_agent_total",
                "Tool calls by agent and outcome: refusals by reason (unknown_tool, argument_denied, rate_limited, invalid_arguments) and results",
            ),
            &["agent", "outcome"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let refusals = IntCounterVec::new(
            Opts::new(
                "refusals_total",
                "Refused tool calls by agent, reason (not granted, argument rule, input schema, rate limit) and argument rule",
            ),
            &["agent", "reason", "rule"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let pool_tools = IntGauge::new("pool_tools", "Tools in the pool")
            .unwrap_or_else(|_| unreachable_metric());
        let pool_load_errors =
            IntGauge::new("pool_load_errors", "Tool groups whose last load failed")
                .unwrap_or_else(|_| unreachable_metric());
        let zero_match_grants = IntGauge::new("zero_match_grants", "Grants that match no tool")
            .unwrap_or_else(|_| unreachable_metric());
        let agents_without_tools =
            IntGauge::new("agents_without_tools", "Agents whose grants match no tool")
                .unwrap_or_else(|_| unreachable_metric());
        let argument_rule_problems = IntGauge::new(
            "argument_rule_problems",
            "Argument rules that name a missing parameter or ungranted tool, misfit its type, or refuse every call",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let tools_held = IntGauge::new(
            "tools_held",
            "Tools of pinned groups whose definition changed, held until an admin approves it",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let rate_limit_store_errors = IntCounter::new(
            "rate_limit_store_errors_total",
            "Rate-limit checks the shared store failed to answer in time",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let mcp_fast_lists = IntCounter::new(
            "mcp_fast_lists_total",
            "tools/list requests answered from serialized definitions, before the MCP SDK",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let approvals = IntCounterVec::new(
            Opts::new(
                "approvals_total",
                "Approval requests by what became of them",
            ),
            &["state"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let approvals_pending = IntGauge::new(
            "approvals_pending",
            "Approval requests waiting for a decision",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let approval_decision_seconds = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "approval_decision_seconds",
                "Time from an approval request to its decision",
            )
            .buckets(vec![
                1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
            ]),
        )
        .unwrap_or_else(|_| unreachable_metric());
        let approval_rule_problems = IntGauge::new(
            "approval_rule_problems",
            "Approval rules that match no tool or never trigger",
        )
        .unwrap_or_else(|_| unreachable_metric());
        let approval_webhooks = IntCounterVec::new(
            Opts::new(
                "approval_webhooks_total",
                "Approval webhooks by how they ended",
            ),
            &["result"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        for c in [
            Box::new(http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(approval_webhooks.clone()),
            Box::new(approval_rule_problems.clone()),
            Box::new(approvals.clone()),
            Box::new(approvals_pending.clone()),
            Box::new(approval_decision_seconds.clone()),
            Box::new(http_latency.clone()),
            Box::new(tool_calls.clone()),
            Box::new(calls_by_agent.clone()),
            Box::new(refusals.clone()),
            Box::new(pool_tools.clone()),
            Box::new(pool_load_errors.clone()),
            Box::new(zero_match_grants.clone()),
            Box::new(agents_without_tools.clone()),
            Box::new(argument_rule_problems.clone()),
            Box::new(tools_held.clone()),
            Box::new(rate_limit_store_errors.clone()),
            Box::new(mcp_fast_lists.clone()),
            Box::new(build_info),
            Box::new(audit_queue.clone()),
            Box::new(db_connections.clone()),
            Box::new(sink_rows.clone()),
            Box::new(sink_errors.clone()),
            Box::new(sink_lag.clone()),
            Box::new(crate::audit::writer::COMMIT_SECONDS.clone()),
            Box::new(crate::audit::writer::ROWS_WRITTEN.clone()),
            Box::new(crate::audit::writer::WRITE_FAILURES.clone()),
        ] {
            let _ = registry.register(c);
        }
        Self {
            registry,
            plain,
            mcp_operations,
            operation_series: Arc::default(),
            audit_queue,
            db_connections,
            sink_rows,
            sink_errors,
            sink_lag,
            http_requests,
            http_latency,
            tool_calls,
            calls_by_agent,
            refusals,
            pool_tools,
            approvals,
            approvals_pending,
            approval_decision_seconds,
            approval_webhooks,
            approval_rule_problems,
            pool_load_errors,
            zero_match_grants,
            agents_without_tools,
            argument_rule_problems,
            tools_held,
            rate_limit_store_errors,
            mcp_fast_lists,
        }
    }

    /// Records one MCP operation. `tool` must already be a name the caller may see (or a
    /// meta-tool): an unknown name is passed as `None`, so a caller cannot mint label values
    /// nor learn from the exposition that a tool exists.
    pub fn mcp_operation(
        &self,
        method: &str,
        tool: Option<&str>,
        agent: &str,
        error_type: Option<&str>,
        elapsed: std::time::Duration,
    ) {
        let tool = tool.unwrap_or("");
        let (agent, tool) = {
            let mut seen = self
                .operation_series
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let key = (agent.to_owned(), tool.to_owned());
            if seen.contains(&key) || seen.len() < MAX_OPERATION_SERIES {
                seen.insert(key);
                (agent, tool)
            } else {
                ("other", if tool.is_empty() { "" } else { "other" })
            }
        };
        self.mcp_operations
            .with_label_values(&[method, tool, error_type.unwrap_or(""), agent])
            .observe(elapsed.as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.plain.gather());
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// Metric definitions are constants; constructing them only fails on a programming error,
// which the unit test below catches.
fn unreachable_metric<T>() -> T {
    panic!("invalid metric definition")
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_render_in_text_format() {
        let m = super::Metrics::new();
        m.tool_calls.with_label_values(&["mcp", "success"]).inc();
        assert!(
            m.render()
                .contains("toolgate_tool_calls_total{outcome=\"success\",surface=\"mcp\"} 1")
        );
    }

    #[test]
    fn operation_series_are_capped() {
        let m = super::Metrics::new();
        let d = std::time::Duration::from_millis(3);
        for i in 0..super::MAX_OPERATION_SERIES + 50 {
            m.mcp_operation("tools/call", Some(&format!("g__t{i}")), "a", None, d);
        }
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("mcp_server_operation_duration_seconds_count"))
            .count();
        assert_eq!(
            series,
            super::MAX_OPERATION_SERIES + 1,
            "the cap, plus `other`"
        );
        assert!(text.contains("agent=\"other\""));
        assert!(text.contains("toolgate_build_info{version="));
    }
}
