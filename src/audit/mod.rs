//! The audit log: what happened, who did it, from where, and how it ended.
//!
//! Every event is one row, appended through the group-commit [`writer`], chained by hash
//! ([`chain`]) and exported in streams ([`export`]). Arguments are stored redacted; results
//! only as size and hash unless their group opts in.

pub mod chain;
pub mod export;
pub mod writer;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event, before it is chained.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    pub at: DateTime<Utc>,
    pub event_type: String,
    pub outcome: String,
    pub agent: Option<String>,
    pub client_id: Option<String>,
    pub jti: Option<String>,
    pub admin_user: Option<String>,
    pub tool: Option<String>,
    pub resource: Option<String>,
    pub remote_addr: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
    pub call_id: Option<String>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub latency_us: Option<i64>,
    pub bytes_in: Option<i64>,
    pub bytes_out: Option<i64>,
    pub arguments: Option<String>,
    pub result_sha256: Option<String>,
    pub result: Option<String>,
    pub details: Option<String>,
}

impl AuditEvent {
    /// A new event stamped now, at the microsecond precision Postgres keeps.
    pub fn new(event_type: &str, outcome: &str) -> Self {
        Self {
            at: now_micros(),
            event_type: event_type.to_owned(),
            outcome: outcome.to_owned(),
            ..Self::default()
        }
    }

    pub fn from_origin(mut self, origin: Option<&RequestOrigin>) -> Self {
        if let Some(o) = origin {
            self.remote_addr = o.remote_addr.clone();
            self.user_agent = o.user_agent.clone();
            self.request_id = o.request_id.clone();
        }
        self
    }
}

/// This process, as named in the audit log: host and process id.
pub fn instance_name() -> &'static str {
    static NAME: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "toolgate".into());
        format!("{host}:{}", std::process::id())
    });
    &NAME
}

/// Now, truncated to microseconds so that the hashed time equals the stored one.
pub fn now_micros() -> DateTime<Utc> {
    let micros = Utc::now().timestamp_micros();
    DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

/// Where a request came from, captured once per request by the HTTP layer.
#[derive(Debug, Clone, Default)]
pub struct RequestOrigin {
    pub remote_addr: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
}

/// Drops audit partitions older than the retention period, and records that it did.
pub async fn apply_retention(state: &crate::app::AppState) -> anyhow::Result<Vec<String>> {
    let cutoff =
        Utc::now() - chrono::Duration::days(i64::from(state.settings.audit_retention_days));
    let dropped = crate::db::audit::drop_partitions_before(&state.db, cutoff).await?;
    if !dropped.is_empty() {
        let mut e = AuditEvent::new(kind::RETENTION, "success");
        e.admin_user = Some("toolgate".into());
        e.resource = Some("audit_events".into());
        e.details = Some(serde_json::json!({"dropped_partitions": dropped, "retention_days": state.settings.audit_retention_days, "cutoff": cutoff}).to_string());
        state.audit.record(e).await?;
        tracing::info!(partitions = ?dropped, "dropped audit partitions past retention");
    }
    Ok(dropped)
}

/// Event types.
pub mod kind {
    pub const TOOLS_LIST: &str = "tools/list";
    pub const TOOL_CALL: &str = "tool.call";
    pub const TOOL_RESULT: &str = "tool.result";
    pub const AUTH_REJECTED: &str = "auth.rejected";
    pub const TOKEN_ISSUED: &str = "token.issued";
    pub const TOKEN_REVOKED: &str = "token.revoked";
    pub const CLIENT_AUTH_FAILED: &str = "client_auth.failed";
    pub const ADMIN_CHANGE: &str = "admin.change";
    pub const RETENTION: &str = "audit.retention";
}

/// Keys whose values are always redacted, in any group, at any depth.
const ALWAYS_REDACTED: [&str; 4] = ["password", "token", "secret", "authorization"];

pub const REDACTED: &str = "[REDACTED]";

/// Per-group audit settings from `openapi.json` (`x-toolgate-audit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditPolicy {
    /// JSON pointers (`/card/number`) or key names (`ssn`) to redact.
    #[serde(default)]
    pub redact: Vec<String>,
    /// Store full results instead of only their size and hash.
    #[serde(default)]
    pub store_results: bool,
}

/// A copy of `args` with secrets replaced by `[REDACTED]`.
pub fn redact(args: &Value, policy: &AuditPolicy) -> Value {
    let mut out = args.clone();
    for rule in &policy.redact {
        if rule.starts_with('/')
            && let Some(v) = out.pointer_mut(rule)
        {
            *v = Value::String(REDACTED.into());
        }
    }
    let keys: Vec<String> = policy
        .redact
        .iter()
        .filter(|r| !r.starts_with('/'))
        .map(|r| r.to_lowercase())
        .collect();
    redact_keys(&mut out, &keys);
    out
}

fn redact_keys(v: &mut Value, extra: &[String]) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                let lower = k.to_lowercase();
                if ALWAYS_REDACTED.iter().any(|s| lower.contains(s)) || extra.contains(&lower) {
                    *val = Value::String(REDACTED.into());
                } else {
                    redact_keys(val, extra);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| redact_keys(i, extra)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_at_any_depth_and_by_group_rules() {
        let policy = AuditPolicy {
            redact: vec!["/card/number".into(), "ssn".into()],
            store_results: false,
        };
        let args = json!({"q": "x", "api_token": "t", "nested": {"Password": "p", "ok": 1}, "card": {"number": "4111"}, "SSN": "1"});
        let r = redact(&args, &policy);
        assert_eq!(
            r,
            json!({"q": "x", "api_token": REDACTED, "nested": {"Password": REDACTED, "ok": 1}, "card": {"number": REDACTED}, "SSN": REDACTED})
        );
    }
}
