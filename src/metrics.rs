//! Prometheus metrics, served on `GET /metrics`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_latency: HistogramVec,
    pub tool_calls: IntCounterVec,
    pub pool_tools: IntGauge,
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
        for c in [
            Box::new(http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(http_latency.clone()),
            Box::new(tool_calls.clone()),
            Box::new(pool_tools.clone()),
            Box::new(pool_load_errors.clone()),
            Box::new(zero_match_grants.clone()),
            Box::new(agents_without_tools.clone()),
            Box::new(argument_rule_problems.clone()),
            Box::new(tools_held.clone()),
            Box::new(rate_limit_store_errors.clone()),
            Box::new(mcp_fast_lists.clone()),
        ] {
            let _ = registry.register(c);
        }
        Self {
            registry,
            http_requests,
            http_latency,
            tool_calls,
            pool_tools,
            pool_load_errors,
            zero_match_grants,
            agents_without_tools,
            argument_rule_problems,
            tools_held,
            rate_limit_store_errors,
            mcp_fast_lists,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
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
}
