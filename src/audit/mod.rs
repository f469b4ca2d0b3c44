//! The audit log: what happened, who did it, from where, and how it ended.
//!
//! Every event is one row, appended through the group-commit [`writer`], chained by hash
//! ([`chain`]) and exported in streams ([`export`]). Arguments are stored redacted; results
//! only as size and hash unless their group opts in.

pub mod chain;
pub mod checkpoint;
pub mod export;
pub mod follow;
pub mod rollup;
pub mod scrub;
pub mod siem;
pub mod sink;
pub mod writer;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The word that a call's `started` row is durable, for the part of the call that waits on it.
///
/// A call prepares its tool (a script's slot, environment and sandbox; an upstream's
/// connection, slot and request) while its `started` row commits; only what makes the tool
/// act (the script's exec, the request's send) waits for [`Durable::wait`]. Nothing of the tool
/// runs unless the row is on disk.
#[derive(Debug)]
pub struct Durable(tokio::sync::oneshot::Receiver<()>);

/// The sending half of [`Durable`]: [`Committed::done`] once the row is durable; dropped
/// without it, the waiting side learns the row never will be.
#[derive(Debug)]
pub struct Committed(tokio::sync::oneshot::Sender<()>);

/// A pair: the committer keeps [`Committed`], the tool's runner [`Durable`].
pub fn durable() -> (Committed, Durable) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (Committed(tx), Durable(rx))
}

impl Durable {
    /// Already durable: for a run that has no row to wait for (a benchmark, a test of the
    /// runner alone).
    pub fn now() -> Self {
        let (committed, durable) = durable();
        committed.done();
        durable
    }

    /// `true` once the row is durable; `false` if it never will be.
    pub async fn wait(self) -> bool {
        self.0.await.is_ok()
    }
}

impl Committed {
    pub fn done(self) {
        // The runner may have ended first (a busy slot, a sandbox that failed): nobody waits.
        let _ = self.0.send(());
    }
}

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
    /// The person behind the token (its `act` claim) when a host acts for someone who signed
    /// in; `agent` is who they act as and `client_id` the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<String>,
}

impl AuditEvent {
    /// A new event stamped now, at the microsecond precision Postgres keeps. Kinds and
    /// outcomes are types so that every surface writes the same words for the same thing;
    /// the row keeps them as text (the hash chain and exports are defined over text).
    pub fn new(kind: EventKind, outcome: Outcome) -> Self {
        Self {
            at: now_micros(),
            event_type: kind.as_str().to_owned(),
            outcome: outcome.as_str().to_owned(),
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

    /// What of this event's `error` a reader who may not see tool arguments (the viewer role)
    /// is shown. The error of an argument-rule refusal quotes the refused value; a schema
    /// violation quotes the offending arguments; a tool's stderr, invalid output or an
    /// upstream's error text may repeat anything it was sent. Everything else is the
    /// gateway's own words (timeouts, limits, unknown tools). Decided on the stored row, so it
    /// holds for rows written before it existed.
    pub fn error_without_arguments(&self) -> ErrorForViewer {
        let tool_call = self.event_type == EventKind::ToolCall.as_str();
        let tool_result = self.event_type == EventKind::ToolResult.as_str();
        if self.outcome == Outcome::InvalidArguments.as_str()
            || (tool_result && self.outcome == Outcome::ToolError.as_str())
        {
            return ErrorForViewer::Hidden;
        }
        if !(tool_call && self.outcome == Outcome::Denied.as_str()) {
            return ErrorForViewer::Whole;
        }
        let details: Option<serde_json::Value> = self
            .details
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok());
        let Some(rules) = details.as_ref().and_then(|d| d.get("argument_rules")) else {
            // A name that is not the caller's to call: no argument is in it.
            return ErrorForViewer::Whole;
        };
        let lines: Option<Vec<String>> = rules.as_array().map(|rules| {
            rules
                .iter()
                .map(|r| {
                    let text = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("?");
                    format!(
                        "`{}`: value refused by rule {} on `{}`",
                        text("param"),
                        r.get("rule").map(|v| v.to_string()).unwrap_or_default(),
                        text("on")
                    )
                })
                .collect()
        });
        match lines {
            Some(lines) if !lines.is_empty() => ErrorForViewer::Summary(lines.join("; ")),
            _ => ErrorForViewer::Hidden,
        }
    }

    /// Stamps the origin of the request this task is serving, when there is one (see
    /// [`RequestOrigin::scope`]).
    pub fn from_current_origin(self) -> Self {
        let origin = CURRENT_ORIGIN.try_with(Clone::clone).ok();
        self.from_origin(origin.as_ref())
    }
}

/// What of an event's `error` a reader who may not see tool arguments is shown
/// ([`AuditEvent::error_without_arguments`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorForViewer {
    /// All of it: nothing in it comes from a call's arguments or a tool's output.
    Whole,
    /// It quotes argument values; this says what happened without them.
    Summary(String),
    /// It may quote argument values, and there is nothing to say without them.
    Hidden,
}

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident ($what:literal) { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vdoc])* $variant,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The word stored in the audit log.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|k| k.as_str() == s)
            }

            /// Parses a word a person typed (a filter): an unknown one is an error that lists
            /// the known ones, so a typo is not an empty result.
            pub fn parse_named(s: &str) -> Result<Self, String> {
                Self::parse(s).ok_or_else(|| {
                    let known: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
                    format!(concat!("unknown ", $what, " `{}`; the known ones are {}"), s, known.join(", "))
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::parse_named(s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse_named(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// For a filter written in a form or a query string: a blank value filters nothing, any
/// other must name a known word.
pub fn blank_is_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr<Err = String>,
{
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.trim().is_empty() => {
            s.trim().parse().map(Some).map_err(serde::de::Error::custom)
        }
        _ => Ok(None),
    }
}

/// A number in a query string: `serde_urlencoded` hands flattened fields over as text, which
/// a plain `i64` refuses.
pub fn number_or_text<'de, D>(d: D) -> Result<Option<i64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Int(i64),
        Text(String),
    }
    match Option::<N>::deserialize(d)? {
        None => Ok(None),
        Some(N::Int(i)) => Ok(Some(i)),
        Some(N::Text(s)) if s.trim().is_empty() => Ok(None),
        Some(N::Text(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a whole number"))),
    }
}

text_enum! {
    /// What an event records.
    EventKind ("event type") {
        /// An MCP `initialize` or `server/discover`.
        Initialize = "initialize",
        ToolsList = "tools/list",
        ToolsSearch = "tools/search",
        ResourcesList = "resources/list",
        ResourceRead = "resources/read",
        PromptsList = "prompts/list",
        PromptGet = "prompts/get",
        /// `GET /openapi.json`: the REST projection of what the caller sees.
        OpenApi = "openapi",
        /// A tool call: refused, or `started` before it runs.
        ToolCall = "tool.call",
        /// How a call that ran ended.
        ToolResult = "tool.result",
        AuthRejected = "auth.rejected",
        TokenIssued = "token.issued",
        TokenRevoked = "token.revoked",
        ClientAuthFailed = "client_auth.failed",
        AdminChange = "admin.change",
        AdminLogin = "admin.login",
        AdminLogout = "admin.logout",
        AuditExport = "audit.export",
        /// Rows of the audit log were shown (a page, one event): who read, through what, with
        /// what filter.
        AuditRead = "audit.read",
        Retention = "audit.retention",
        /// A tool of a pinned group changed (or appeared) and is held: both hashes, and whether
        /// a `folder` edit or an `upstream` re-list changed it.
        ToolDefinitionChanged = "tool.definition_changed",
        /// An admin (or `first-use`) approved a definition: it is served.
        ToolDefinitionApproved = "tool.definition_approved",
        /// An admin rejected a definition: it stays held.
        ToolDefinitionRejected = "tool.definition_rejected",
        /// A call needs a person's approval: the binding's digests, the rule that asked.
        ApprovalRequested = "approval.requested",
        /// A person (or the operator's admin token) approved a request.
        ApprovalGranted = "approval.granted",
        ApprovalDenied = "approval.denied",
        /// A request nobody decided within its rule's `ttl`.
        ApprovalExpired = "approval.expired",
    }
}

text_enum! {
    /// The control-plane change an `admin.change` event records (its `details.action`). The
    /// words are those the log has always stored: the chain and its readers depend on them.
    AdminAction ("admin action") {
        AdminSessionEnd = "admin_session.end",
        AdminUserCreate = "admin_user.create",
        AdminUserDelete = "admin_user.delete",
        AdminUserDisable = "admin_user.disable",
        AdminUserEnable = "admin_user.enable",
        AdminUserPasswordResetLink = "admin_user.password_reset_link",
        AdminUserPasswordSet = "admin_user.password_set",
        AdminUserRole = "admin_user.role",
        AdminUserApproverSets = "admin_user.approver_sets",
        AgentCreate = "agent.create",
        AgentDelete = "agent.delete",
        AgentUpdate = "agent.update",
        AgentUserAdd = "agent.user.add",
        AgentUserRemove = "agent.user.remove",
        ArgumentsDelete = "arguments.delete",
        ArgumentsSet = "arguments.set",
        ApprovalRuleDelete = "approval_rule.delete",
        ApprovalRuleSet = "approval_rule.set",
        AuthorizationCreate = "authorization.create",
        AuthorizationRevoke = "authorization.revoke",
        ClientCreate = "client.create",
        ClientDelete = "client.delete",
        CredentialDelete = "credential.delete",
        /// Stored or replaced (the value is never on record).
        CredentialSet = "credential.set",
        /// Every value's data key re-wrapped under a new key-encryption key.
        CredentialRekey = "credential.rekey",
        /// A person connected to an upstream's authorization server (a token grant stored).
        CredentialConnected = "credential.connected",
        /// A person's upstream grant refreshed ahead of its expiry.
        CredentialRefreshed = "credential.refreshed",
        /// A person's upstream grant could not be refreshed: they must connect again.
        CredentialRefreshFailed = "credential.refresh_failed",
        /// A caller's identity exchanged at a token service for a token to an upstream
        /// (RFC 8693): once per caller and token lifetime, not per call.
        CredentialExchanged = "credential.exchanged",
        GrantCreate = "grant.create",
        GrantDelete = "grant.delete",
        GroupDelete = "group.delete",
        GroupPin = "group.pin",
        GroupSet = "group.set",
        KeyRotate = "key.rotate",
        PublicClientApprove = "public_client.approve",
        PublicClientDelete = "public_client.delete",
        PublicClientPut = "public_client.put",
        PublicClientRegister = "public_client.register",
        RateLimitSet = "rate_limit.set",
        TokenRevoke = "token.revoke",
        UpstreamDelete = "upstream.delete",
        UpstreamSet = "upstream.set",
    }
}

text_enum! {
    /// How an event ended.
    Outcome ("outcome") {
        Success = "success",
        /// Not allowed: unknown or not granted (indistinguishable on purpose), a bad
        /// credential, a refused token.
        Denied = "denied",
        RateLimited = "rate_limited",
        /// The request was understood but its arguments or body are invalid.
        InvalidArguments = "invalid_arguments",
        /// A call is about to run (its result follows as `tool.result`).
        Started = "started",
        ToolError = "tool_error",
        Timeout = "timeout",
        Busy = "busy",
        /// The request asked for something that does not exist for this caller.
        NotFound = "not_found",
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
    /// The request's span, for the core to record what it decided on (the agent, the tool,
    /// the outcome): surfaces may run handlers under spans of their own.
    pub span: Option<tracing::Span>,
}

tokio::task_local! {
    static CURRENT_ORIGIN: RequestOrigin;
}

impl RequestOrigin {
    /// Runs `f` with this origin as the current request's: control-plane changes recorded
    /// deep in the service and database layers carry who-from-where without every function
    /// on the way passing it along.
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CURRENT_ORIGIN.scope(self, f).await
    }
}

/// Drops audit partitions older than the retention period. Each drop is recorded in the
/// retention ledger and in the control-plane chain, in the transaction that drops it.
pub async fn apply_retention(
    db: &sqlx::PgPool,
    retention_days: u32,
) -> anyhow::Result<Vec<String>> {
    let cutoff = Utc::now() - chrono::Duration::days(i64::from(retention_days));
    let dropped = crate::db::audit::drop_partitions_before(db, cutoff, retention_days).await?;
    if !dropped.is_empty() {
        tracing::info!(partitions = ?dropped, "dropped audit partitions past retention");
    }
    Ok(dropped)
}

/// Keys whose values are always redacted, in any group, at any depth.
const ALWAYS_REDACTED: [&str; 4] = ["password", "token", "secret", "authorization"];

pub const REDACTED: &str = "[REDACTED]";

pub use scrub::scrub;

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
    redact_collect(args, policy).0
}

/// [`redact`], and the values it took out (every string or scalar under a redacted key), so
/// that what a tool says back can be scrubbed of them with [`scrub`].
pub fn redact_collect(args: &Value, policy: &AuditPolicy) -> (Value, Vec<String>) {
    let mut out = args.clone();
    let mut secrets = Vec::new();
    for rule in &policy.redact {
        if rule.starts_with('/')
            && let Some(v) = out.pointer_mut(rule)
        {
            collect_leaves(v, &mut secrets);
            *v = Value::String(REDACTED.into());
        }
    }
    let keys: Vec<String> = policy
        .redact
        .iter()
        .filter(|r| !r.starts_with('/'))
        .map(|r| r.to_lowercase())
        .collect();
    redact_keys(&mut out, &keys, &mut secrets);
    secrets.retain(|s| !s.is_empty() && s != REDACTED);
    secrets.sort();
    secrets.dedup();
    (out, secrets)
}

fn collect_leaves(v: &Value, into: &mut Vec<String>) {
    match v {
        Value::String(s) => into.push(s.clone()),
        Value::Number(n) => into.push(n.to_string()),
        Value::Bool(_) | Value::Null => {}
        Value::Array(items) => items.iter().for_each(|i| collect_leaves(i, into)),
        Value::Object(map) => map.values().for_each(|i| collect_leaves(i, into)),
    }
}

fn redact_keys(v: &mut Value, extra: &[String], secrets: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                let lower = k.to_lowercase();
                if ALWAYS_REDACTED.iter().any(|s| lower.contains(s)) || extra.contains(&lower) {
                    collect_leaves(val, secrets);
                    *val = Value::String(REDACTED.into());
                } else {
                    redact_keys(val, extra, secrets);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|i| redact_keys(i, extra, secrets)),
        _ => {}
    }
}

/// `s` cut to a length fit for an indexed audit column (a resource name, a route).
pub fn bounded(s: &str) -> String {
    s.chars().take(512).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The words stay those already in the log (the chain hashes them and readers filter on
    /// them); every one parses back; a word nobody records is an error listing those that are.
    #[test]
    fn kinds_outcomes_and_admin_actions_are_the_stored_words() {
        assert_eq!(AdminAction::ALL.len(), 43);
        assert_eq!(
            AdminAction::PublicClientRegister.as_str(),
            "public_client.register"
        );
        assert_eq!(
            AdminAction::PublicClientApprove.as_str(),
            "public_client.approve"
        );
        assert_eq!(AdminAction::GrantCreate.as_str(), "grant.create");
        assert_eq!(AdminAction::AgentUserAdd.as_str(), "agent.user.add");
        assert_eq!(AdminAction::AdminUserDisable.as_str(), "admin_user.disable");
        for a in AdminAction::ALL {
            assert_eq!(AdminAction::parse(a.as_str()), Some(*a));
        }
        for k in EventKind::ALL {
            assert_eq!(k.as_str().parse::<EventKind>(), Ok(*k));
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.as_str()));
        }
        for o in Outcome::ALL {
            assert_eq!(
                serde_json::from_value::<Outcome>(json!(o.as_str())).unwrap(),
                *o
            );
        }
        let e = "tool.reslt".parse::<EventKind>().unwrap_err();
        assert!(e.starts_with("unknown event type `tool.reslt`"), "{e}");
        assert!(
            e.contains("tool.result") && e.contains("admin.change"),
            "{e}"
        );
        let e = serde_json::from_value::<Outcome>(json!("sucess")).unwrap_err();
        assert!(e.to_string().contains("success"), "{e}");
    }

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

    #[test]
    fn what_a_tool_echoes_is_scrubbed_of_redacted_values() {
        let args = json!({"user": "ann", "password": "hunter2\"x", "pin": 12345, "short": {"token": "ab"}});
        let (_, secrets) = redact_collect(&args, &AuditPolicy::default());
        let echoed = format!("got {}", serde_json::to_string(&args).unwrap());
        let clean = scrub(&echoed, &secrets);
        assert!(!clean.contains("hunter2"), "{clean}");
        // `ab` is too short to replace inside text: the text is withheld instead.
        assert!(clean.starts_with("[withheld"), "{clean}");
        let clean = scrub(
            "password was hunter2\"x, pin 12345",
            &["hunter2\"x".to_owned(), "12345".to_owned()],
        );
        assert_eq!(clean, "password was [REDACTED], pin [REDACTED]");
    }

    #[test]
    fn a_viewer_is_shown_no_error_that_may_quote_arguments() {
        let event = |kind: EventKind, outcome: Outcome, details: Option<Value>| {
            let mut e = AuditEvent::new(kind, outcome);
            e.error = Some("`q`: \"secret\" does not match \"^public-\"".into());
            e.details = details.map(|d| d.to_string());
            e
        };
        let denied = event(
            EventKind::ToolCall,
            Outcome::Denied,
            Some(
                json!({"argument_rules": [{"on": "notes", "param": "q", "rule": {"pattern": "^public-"}}], "surface": "mcp"}),
            ),
        );
        assert_eq!(
            denied.error_without_arguments(),
            ErrorForViewer::Summary(
                "`q`: value refused by rule {\"pattern\":\"^public-\"} on `notes`".into()
            )
        );
        let unknown = event(
            EventKind::ToolCall,
            Outcome::Denied,
            Some(json!({"surface": "mcp"})),
        );
        assert_eq!(unknown.error_without_arguments(), ErrorForViewer::Whole);
        for hidden in [
            event(EventKind::ToolResult, Outcome::ToolError, None),
            event(EventKind::ToolCall, Outcome::InvalidArguments, None),
            event(
                EventKind::ToolCall,
                Outcome::Denied,
                Some(json!({"argument_rules": 3})),
            ),
        ] {
            assert_eq!(hidden.error_without_arguments(), ErrorForViewer::Hidden);
        }
        let timeout = event(EventKind::ToolResult, Outcome::Timeout, None);
        assert_eq!(timeout.error_without_arguments(), ErrorForViewer::Whole);
    }
}
