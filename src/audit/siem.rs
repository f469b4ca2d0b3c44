//! The audit log in the forms a SIEM reads: the JSONL row schema (`toolgate-audit-v2`), OCSF
//! 1.8.0 records and ArcSight CEF lines. One mapping serves the exports and the sinks.
//!
//! Every form carries the hash chain (`chain`, `chain_seq`, `prev_hash`, `hash`) and the
//! stored fields it is computed over, so the receiving side can re-verify continuity from the
//! records alone (`scripts/verify_ocsf_chain.py`).

use serde_json::{Map, Value, json};

use super::chain::ChainedEvent;
use super::{EventKind, Outcome};

/// The version of the JSONL/CSV row schema (documented in `docs/audit-schema.md`).
pub const ROW_FORMAT: &str = "toolgate-audit-v2";
/// The OCSF version the records follow (and are validated against in CI).
pub const OCSF_VERSION: &str = "1.8.0";

/// What an event is about, for a reader who filters by area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Tool calls and their results.
    Tool,
    /// Listing and searching tools, resources and prompts; the REST document.
    Discovery,
    /// Tokens, client authentication, sign-ins.
    Auth,
    /// Control-plane changes, held and approved tool definitions.
    Admin,
    /// Reads of the audit log itself, and retention.
    Audit,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Tool => "tool",
            Category::Discovery => "discovery",
            Category::Auth => "auth",
            Category::Admin => "admin",
            Category::Audit => "audit",
        }
    }
}

/// How much a reader should care, in the words of syslog and OCSF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Info,
    Low,
    Medium,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
        }
    }

    /// OCSF `severity_id`: 1 Informational, 2 Low, 3 Medium.
    pub fn ocsf_id(self) -> u8 {
        match self {
            Severity::Info => 1,
            Severity::Low => 2,
            Severity::Medium => 3,
        }
    }

    /// CEF severity, 0 to 10.
    pub fn cef(self) -> u8 {
        match self {
            Severity::Info => 3,
            Severity::Low => 5,
            Severity::Medium => 7,
        }
    }

    /// RFC 5424 severity: 6 informational, 5 notice, 4 warning.
    pub fn syslog(self) -> u8 {
        match self {
            Severity::Info => 6,
            Severity::Low => 5,
            Severity::Medium => 4,
        }
    }
}

pub fn category(r: &ChainedEvent) -> Category {
    match EventKind::parse(&r.event.event_type) {
        Some(
            EventKind::ToolCall
            | EventKind::ToolResult
            | EventKind::ApprovalRequested
            | EventKind::ApprovalGranted
            | EventKind::ApprovalDenied
            | EventKind::ApprovalExpired,
        ) => Category::Tool,
        Some(
            EventKind::Initialize
            | EventKind::ToolsList
            | EventKind::ToolsSearch
            | EventKind::ResourcesList
            | EventKind::ResourceRead
            | EventKind::PromptsList
            | EventKind::PromptGet
            | EventKind::OpenApi,
        ) => Category::Discovery,
        Some(
            EventKind::AuthRejected
            | EventKind::TokenIssued
            | EventKind::TokenRevoked
            | EventKind::ClientAuthFailed
            | EventKind::AdminLogin
            | EventKind::AdminLogout,
        ) => Category::Auth,
        Some(EventKind::AuditExport | EventKind::AuditRead | EventKind::Retention) => {
            Category::Audit
        }
        Some(
            EventKind::AdminChange
            | EventKind::ToolDefinitionChanged
            | EventKind::ToolDefinitionApproved
            | EventKind::ToolDefinitionRejected,
        )
        | None => Category::Admin,
    }
}

/// Refusals and failed credentials are worth a look (medium); a call that failed or was
/// limited is low; a held tool definition is medium (someone changed a pinned tool).
pub fn severity(r: &ChainedEvent) -> Severity {
    let kind = EventKind::parse(&r.event.event_type);
    if matches!(
        kind,
        Some(
            EventKind::AuthRejected
                | EventKind::ClientAuthFailed
                | EventKind::ToolDefinitionChanged
        )
    ) {
        return Severity::Medium;
    }
    match Outcome::parse(&r.event.outcome) {
        Some(Outcome::Denied) => Severity::Medium,
        Some(
            Outcome::RateLimited
            | Outcome::InvalidArguments
            | Outcome::ToolError
            | Outcome::Timeout
            | Outcome::Busy
            | Outcome::NotFound,
        ) => Severity::Low,
        Some(Outcome::Success | Outcome::Started) => Severity::Info,
        None => Severity::Low,
    }
}

/// A stored JSON text as a native value, when writing the value back gives the stored text
/// exactly (so the hash can be recomputed from it): objects and arrays only, so that a JSON
/// string in a row always means the stored text itself.
fn native(text: &Option<String>) -> Value {
    let Some(t) = text else { return Value::Null };
    match serde_json::from_str::<Value>(t) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) if v.to_string().as_str() == t.as_str() => v,
        _ => Value::String(t.clone()),
    }
}

/// The fields that carry stored JSON text, natively in a v2 row.
const NATIVE_FIELDS: [&str; 3] = ["arguments", "details", "flags"];

/// One row in the `toolgate-audit-v2` schema: every field present (null when empty), JSON
/// text as native JSON where it round-trips, category and severity added.
pub fn row(r: &ChainedEvent) -> Value {
    let e = &r.event;
    json!({
        "format": ROW_FORMAT,
        "id": r.id,
        "at": e.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "at_unix_us": e.at.timestamp_micros(),
        "chain": r.chain,
        "chain_seq": r.chain_seq,
        "prev_hash": r.prev_hash,
        "hash": r.hash,
        "instance": r.instance,
        "event_type": e.event_type,
        "outcome": e.outcome,
        "category": category(r).as_str(),
        "severity": severity(r).as_str(),
        "agent": e.agent,
        "person": e.person,
        "client_id": e.client_id,
        "jti": e.jti,
        "admin_user": e.admin_user,
        "tool": e.tool,
        "resource": e.resource,
        "remote_addr": e.remote_addr,
        "user_agent": e.user_agent,
        "request_id": e.request_id,
        "call_id": e.call_id,
        "exit_code": e.exit_code,
        "error": e.error,
        "latency_us": e.latency_us,
        "bytes_in": e.bytes_in,
        "bytes_out": e.bytes_out,
        "arguments": native(&e.arguments),
        "result_sha256": e.result_sha256,
        "result": e.result,
        "details": native(&e.details),
        "flags": native(&r.flags),
    })
}

/// Reads a row back (a v2 row, or a v1 row where JSON text is a string): native JSON goes
/// back to the text it was written from, so the hash can be recomputed.
pub fn parse_row(mut value: Value) -> serde_json::Result<ChainedEvent> {
    if let Some(o) = value.as_object_mut() {
        for f in NATIVE_FIELDS {
            if let Some(v) = o.get_mut(f)
                && (v.is_object() || v.is_array())
            {
                *v = Value::String(v.to_string());
            }
        }
        // A v2 row writes absent fields as null; the stored row has none.
        o.retain(|_, v| !v.is_null());
    }
    serde_json::from_value(value)
}

fn text(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// The OCSF class and activity of an event: (class_uid, category_uid, activity_id,
/// activity_name).
fn ocsf_class(r: &ChainedEvent) -> (u32, u32, u32, &'static str) {
    const API: (u32, u32) = (6003, 6);
    const AUTH: (u32, u32) = (3002, 3);
    const ENTITY: (u32, u32) = (3004, 3);
    let action = || -> Option<String> {
        serde_json::from_str::<Value>(r.event.details.as_deref()?)
            .ok()?
            .get("action")?
            .as_str()
            .map(str::to_owned)
    };
    match EventKind::parse(&r.event.event_type) {
        // The mapping one vendor uses in production (ocsf-schema#1736): a tool call is
        // API Activity "Other", named Invoke.
        Some(EventKind::ToolCall | EventKind::ToolResult) => (API.0, API.1, 99, "Invoke"),
        Some(
            EventKind::ToolsList
            | EventKind::ToolsSearch
            | EventKind::ResourcesList
            | EventKind::ResourceRead
            | EventKind::PromptsList
            | EventKind::PromptGet
            | EventKind::OpenApi
            | EventKind::Initialize,
        ) => (API.0, API.1, 2, "Read"),
        Some(
            EventKind::TokenIssued
            | EventKind::AdminLogin
            | EventKind::ClientAuthFailed
            | EventKind::AuthRejected,
        ) => (AUTH.0, AUTH.1, 1, "Logon"),
        Some(EventKind::AdminLogout) => (AUTH.0, AUTH.1, 2, "Logoff"),
        Some(EventKind::TokenRevoked) => (AUTH.0, AUTH.1, 99, "Revoke"),
        Some(EventKind::AuditExport | EventKind::AuditRead) => (ENTITY.0, ENTITY.1, 2, "Read"),
        Some(EventKind::Retention) => (ENTITY.0, ENTITY.1, 4, "Delete"),
        Some(EventKind::ToolDefinitionChanged) => (ENTITY.0, ENTITY.1, 3, "Update"),
        Some(EventKind::ToolDefinitionApproved) => (ENTITY.0, ENTITY.1, 10, "Activate"),
        Some(EventKind::ToolDefinitionRejected) => (ENTITY.0, ENTITY.1, 11, "Deactivate"),
        // A request for approval is an entity (the pending request) created, then decided:
        // OCSF 1.8.0 has no approval activity, so the decisions are "Other", named.
        Some(EventKind::ApprovalRequested) => (ENTITY.0, ENTITY.1, 1, "Create"),
        Some(EventKind::ApprovalGranted) => (ENTITY.0, ENTITY.1, 99, "Approve"),
        Some(EventKind::ApprovalDenied) => (ENTITY.0, ENTITY.1, 99, "Deny"),
        Some(EventKind::ApprovalExpired) => (ENTITY.0, ENTITY.1, 99, "Expire"),
        Some(EventKind::AdminChange) | None => {
            let a = action().unwrap_or_default();
            let verb = a.rsplit('.').next().unwrap_or_default();
            match verb {
                "create" | "add" | "register" => (ENTITY.0, ENTITY.1, 1, "Create"),
                "delete" | "remove" | "revoke" => (ENTITY.0, ENTITY.1, 4, "Delete"),
                "enable" => (ENTITY.0, ENTITY.1, 8, "Enable"),
                "disable" => (ENTITY.0, ENTITY.1, 9, "Disable"),
                _ => (ENTITY.0, ENTITY.1, 3, "Update"),
            }
        }
    }
}

/// `ip`, `ip:port` or `[v6]:port` as an OCSF network endpoint.
fn endpoint(addr: &str) -> Value {
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return json!({"ip": sa.ip().to_string(), "port": sa.port()});
    }
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return json!({"ip": ip.to_string()});
    }
    json!({"name": addr})
}

/// One OCSF 1.8.0 record (with the `security_control` profile): tool calls and listings as
/// API Activity (6003), tokens, client authentication and sign-ins as Authentication (3002),
/// admin changes and reads of the log as Entity Management (3004).
///
/// The chain travels in `unmapped.record_integrity` (the names of the proposed OCSF
/// `record_integrity` profile: `chain_uid`, `prev_event`, `fingerprint`), and the stored row in
/// `unmapped.toolgate`, with its JSON text as stored: what the hash is computed over.
pub fn ocsf(r: &ChainedEvent) -> Value {
    let e = &r.event;
    let (class_uid, category_uid, activity_id, activity_name) = ocsf_class(r);
    let sev = severity(r);
    let time_ms = e.at.timestamp_millis();
    let outcome = Outcome::parse(&e.outcome);
    let denied = matches!(outcome, Some(Outcome::Denied | Outcome::RateLimited));
    let failed = !matches!(outcome, Some(Outcome::Success | Outcome::Started));
    let mut rec = Map::new();
    rec.insert("class_uid".into(), json!(class_uid));
    rec.insert("category_uid".into(), json!(category_uid));
    rec.insert("activity_id".into(), json!(activity_id));
    rec.insert("activity_name".into(), json!(activity_name));
    rec.insert("type_uid".into(), json!(class_uid * 100 + activity_id));
    rec.insert("time".into(), json!(time_ms));
    rec.insert("severity_id".into(), json!(sev.ocsf_id()));
    rec.insert("status_id".into(), json!(if failed { 2 } else { 1 }));
    rec.insert(
        "status".into(),
        json!(if failed { "Failure" } else { "Success" }),
    );
    rec.insert("status_code".into(), json!(e.outcome));
    if let Some(err) = text(&e.error) {
        rec.insert("status_detail".into(), json!(err));
    }
    rec.insert(
        "message".into(),
        json!(format!("{} {}", e.event_type, e.outcome)),
    );
    // security_control: whether the gateway let it through.
    rec.insert("action_id".into(), json!(if denied { 2 } else { 1 }));
    rec.insert(
        "action".into(),
        json!(if denied { "Denied" } else { "Allowed" }),
    );
    rec.insert("disposition_id".into(), json!(if denied { 2 } else { 1 }));
    rec.insert(
        "disposition".into(),
        json!(if denied { "Blocked" } else { "Allowed" }),
    );
    if let Some(us) = e.latency_us {
        rec.insert("duration".into(), json!(us / 1000));
        rec.insert("end_time".into(), json!(time_ms));
        rec.insert("start_time".into(), json!(time_ms - us / 1000));
    }
    let mut metadata = json!({
        "version": OCSF_VERSION,
        "product": {"name": "toolgate", "vendor_name": "toolgate", "version": env!("CARGO_PKG_VERSION")},
        "profiles": ["security_control"],
        "log_name": r.chain,
        "log_version": ROW_FORMAT,
        "sequence": r.chain_seq,
        "logged_time": time_ms,
    });
    if let Some(id) = r.id {
        metadata["uid"] = json!(id.to_string());
    }
    if let Some(c) = text(&e.call_id).or(text(&e.request_id)) {
        metadata["correlation_uid"] = json!(c);
    }
    rec.insert("metadata".into(), metadata);

    // Who: the person a host acts for (a user), else the agent's own identity (a service);
    // the agent as the acting application, the OAuth client and the token's id.
    let agent_user = |name: &str| json!({"name": name, "type_id": 4, "type": "Service"});
    let principal = match (text(&e.person), text(&e.agent), text(&e.admin_user)) {
        (Some(p), _, _) => Some(json!({"name": p, "type_id": 1, "type": "User"})),
        (None, Some(a), _) => Some(agent_user(a)),
        (None, None, Some(u)) => Some(json!({"name": u, "type_id": 2, "type": "Admin"})),
        _ => None,
    };
    let mut actor = Map::new();
    if let Some(u) = &principal {
        actor.insert("user".into(), u.clone());
    }
    if let Some(a) = text(&e.agent) {
        actor.insert("app_name".into(), json!(a));
    }
    if let Some(c) = text(&e.client_id) {
        actor.insert("app_uid".into(), json!(c));
    }
    if let Some(j) = text(&e.jti) {
        actor.insert("session".into(), json!({"uid": j}));
    }
    if actor.is_empty() {
        actor.insert("app_name".into(), json!("toolgate"));
    }
    let src = text(&e.remote_addr).map(endpoint);
    if let Some(ua) = text(&e.user_agent) {
        let mut req = json!({"user_agent": ua});
        if let Some(id) = text(&e.request_id) {
            req["uid"] = json!(id);
        }
        rec.insert("http_request".into(), req);
    }
    match class_uid {
        6003 => {
            let mut api = json!({"operation": e.event_type});
            if let Some(t) = text(&e.tool) {
                api["service"] = json!({"name": t});
            }
            if let Some(id) = text(&e.call_id).or(text(&e.request_id)) {
                api["request"] = json!({"uid": id});
            }
            rec.insert("api".into(), api);
            rec.insert("actor".into(), Value::Object(actor));
            rec.insert(
                "src_endpoint".into(),
                src.unwrap_or_else(|| json!({"name": "unknown"})),
            );
        }
        3002 => {
            rec.insert(
                "user".into(),
                principal.unwrap_or_else(|| json!({"name": "unknown"})),
            );
            // OCSF requires the service or the destination of an authentication: the gateway
            // (with the OAuth client, when there is one).
            let mut service = json!({"name": "toolgate"});
            if let Some(c) = text(&e.client_id) {
                service["uid"] = json!(c);
            }
            rec.insert("service".into(), service);
            if let Some(s) = src {
                rec.insert("src_endpoint".into(), s);
            }
            rec.insert("actor".into(), Value::Object(actor));
        }
        _ => {
            let name = text(&e.resource)
                .or(text(&e.tool))
                .unwrap_or(&e.event_type)
                .to_owned();
            rec.insert(
                "entity".into(),
                json!({"name": name, "type": category(r).as_str()}),
            );
            if let Some(s) = src {
                rec.insert("src_endpoint".into(), s);
            }
            rec.insert("actor".into(), Value::Object(actor));
        }
    }
    let stored = json!({
        "id": r.id,
        "at_unix_us": e.at.timestamp_micros(),
        "chain": r.chain,
        "chain_seq": r.chain_seq,
        "instance": r.instance,
        "event_type": e.event_type,
        "outcome": e.outcome,
        "agent": e.agent,
        "client_id": e.client_id,
        "jti": e.jti,
        "admin_user": e.admin_user,
        "tool": e.tool,
        "resource": e.resource,
        "remote_addr": e.remote_addr,
        "user_agent": e.user_agent,
        "request_id": e.request_id,
        "call_id": e.call_id,
        "exit_code": e.exit_code,
        "error": e.error,
        "latency_us": e.latency_us,
        "bytes_in": e.bytes_in,
        "bytes_out": e.bytes_out,
        "arguments": e.arguments,
        "result_sha256": e.result_sha256,
        "result": e.result,
        "details": e.details,
        "flags": r.flags,
        "person": e.person,
    });
    rec.insert(
        "unmapped".into(),
        json!({
            "record_integrity": {
                "chain_uid": r.chain,
                "sequence": r.chain_seq,
                "prev_event": {"fingerprint": {"algorithm_id": 3, "algorithm": "SHA-256", "value": r.prev_hash}},
                "fingerprint": {"algorithm_id": 3, "algorithm": "SHA-256", "value": r.hash},
                "canonicalization": "toolgate-chain-v1",
            },
            "toolgate": stored,
        }),
    );
    Value::Object(rec)
}

/// CEF header field: `\` and `|` escaped, no line breaks.
fn cef_header(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace(['\r', '\n'], " ")
}

/// CEF extension value: `\`, `=` and line breaks escaped.
fn cef_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('=', "\\=")
        .replace('\r', "\\r")
        .replace('\n', "\\n")
}

/// One ArcSight CEF line (CEF:0): the event type as signature id, the chain in custom
/// fields, the row id as `externalId`.
pub fn cef(r: &ChainedEvent) -> String {
    let e = &r.event;
    let sev = severity(r);
    let mut ext: Vec<(&str, String)> = vec![("rt", e.at.timestamp_millis().to_string())];
    let mut opt = |k: &'static str, v: Option<&str>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            ext.push((k, cef_value(v)));
        }
    };
    opt("externalId", r.id.map(|i| i.to_string()).as_deref());
    opt("outcome", Some(&e.outcome));
    opt("cat", Some(category(r).as_str()));
    opt("suser", e.person.as_deref().or(e.agent.as_deref()));
    opt("duser", e.admin_user.as_deref());
    opt(
        "src",
        e.remote_addr
            .as_deref()
            .and_then(|a| match endpoint(a).get("ip") {
                Some(Value::String(ip)) => Some(ip.clone()),
                _ => None,
            })
            .as_deref(),
    );
    opt("requestClientApplication", e.user_agent.as_deref());
    opt("msg", e.error.as_deref());
    // Custom fields, each with its label, only when it has a value.
    let seq = r.chain_seq.to_string();
    let latency = e.latency_us.map(|l| l.to_string());
    let exit = e.exit_code.map(|l| l.to_string());
    for (key, label_key, label, value) in [
        ("cs1", "cs1Label", "agent", e.agent.as_deref()),
        ("cs2", "cs2Label", "tool", e.tool.as_deref()),
        ("cs3", "cs3Label", "client_id", e.client_id.as_deref()),
        ("cs4", "cs4Label", "chain", Some(r.chain.as_str())),
        ("cs5", "cs5Label", "prev_hash", Some(r.prev_hash.as_str())),
        ("cs6", "cs6Label", "hash", Some(r.hash.as_str())),
        ("cn1", "cn1Label", "chain_seq", Some(seq.as_str())),
        ("cn2", "cn2Label", "latency_us", latency.as_deref()),
        ("cn3", "cn3Label", "exit_code", exit.as_deref()),
    ] {
        if value.is_some_and(|v| !v.is_empty()) {
            opt(label_key, Some(label));
            opt(key, value);
        }
    }
    opt("dvchost", Some(&r.instance));
    opt("requestContext", e.call_id.as_deref());
    let ext: Vec<String> = ext.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "CEF:0|toolgate|toolgate|{}|{}|{}|{}|{}",
        cef_header(env!("CARGO_PKG_VERSION")),
        cef_header(&e.event_type),
        cef_header(&format!("{} {}", e.event_type, e.outcome)),
        sev.cef(),
        ext.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditEvent;

    fn sample() -> ChainedEvent {
        let mut e = AuditEvent::new(EventKind::ToolResult, Outcome::ToolError);
        e.agent = Some("assistant".into());
        e.tool = Some("git__log".into());
        e.remote_addr = Some("127.0.0.1:5000".into());
        e.details = Some(r#"{"a":1,"b":[true,null]}"#.into());
        e.arguments = Some(r#"{"x": 1}"#.into());
        e.error = Some("bad | pipe = and\nnewline \\".into());
        let mut r = crate::audit::chain::extend("c", (0, crate::audit::chain::GENESIS), "i", e);
        r.id = Some(7);
        r
    }

    #[test]
    fn a_v2_row_reads_back_to_the_stored_row() {
        let r = sample();
        let v = row(&r);
        assert!(v["details"].is_object(), "round-tripping JSON is native");
        assert!(
            v["arguments"].is_string(),
            "JSON text that would not be written back byte for byte stays text"
        );
        assert!(v["person"].is_null() && v.get("person").is_some());
        let back = parse_row(v).expect("reads back");
        assert_eq!(back, r);
    }

    #[test]
    fn cef_escapes_what_would_split_a_field() {
        let line = cef(&sample());
        assert!(line.starts_with("CEF:0|toolgate|toolgate|"));
        assert!(
            line.contains("msg=bad | pipe \\= and\\nnewline \\\\"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert!(line.contains("cs2=git__log"));
        assert!(line.contains("src=127.0.0.1"));
    }

    #[test]
    fn ocsf_carries_the_chain_and_the_stored_row() {
        let r = sample();
        let o = ocsf(&r);
        assert_eq!(o["class_uid"], 6003);
        assert_eq!(o["type_uid"], 600399);
        assert_eq!(o["api"]["service"]["name"], "git__log");
        assert_eq!(
            o["unmapped"]["record_integrity"]["fingerprint"]["value"],
            r.hash
        );
        assert_eq!(
            o["unmapped"]["toolgate"]["details"],
            r#"{"a":1,"b":[true,null]}"#
        );
        assert_eq!(o["src_endpoint"]["port"], 5000);
    }
}
