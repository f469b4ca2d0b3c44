//! Approvals: a call a rule asks about waits for a person, and runs once they agree.
//!
//! A request is bound to exactly one call (agent, person, client, tool, the SHA-256 of the
//! canonical arguments, of the tool definition and of the rule that asked). Once granted, the
//! instance that recorded the decision runs the call itself, through the core path, and keeps
//! its outcome: a caller that polls (a REST status URL) reads it there, a caller that retries
//! the identical call is given it once. Whoever comes first, the call runs exactly once:
//! running takes the request from `granted` to `running` in one `UPDATE`, which one
//! transaction wins.
//!
//! Separation of duties: nobody decides a request made under their own identity (the person
//! a host token acts for, or an account among the agent's people), and only accounts whose
//! role or approver sets the rule names decide at all. The operator's admin token may decide:
//! it is not a person.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{Result, ServiceError};
use crate::audit::{AuditEvent, EventKind, Outcome as AuditOutcome};
use crate::db;
use crate::db::approvals::{ApprovalRow, Binding, NewRequest};
use crate::policy::approvals::CompiledApproval;
use crate::policy::snapshot::{PolicySnapshot, Principal};
use crate::policy::{GrantTarget, TokenScope};
use crate::pool::Tool;
use crate::state::AppState;

/// Largest argument object a request keeps (it waits in the database until decided).
const MAX_ARGUMENT_BYTES: usize = 256 * 1024;
/// Requests one agent may have waiting at once: a loop of varied calls must not fill the
/// inbox or the database.
const MAX_PENDING_PER_AGENT: i64 = 100;

/// Where a call that needs approval stands, as its caller is told.
#[derive(Debug, Clone, Serialize)]
pub struct Ticket {
    pub id: Uuid,
    /// `pending`, `granted`, `running`, `denied`, `expired`, `failed`.
    pub status: String,
    pub reason: Option<String>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// Whether this call created the request (rather than finding it).
    #[serde(skip)]
    pub created: bool,
}

impl Ticket {
    fn of(row: &ApprovalRow, created: bool) -> Self {
        Self {
            id: row.id,
            status: row.state.clone(),
            reason: row.reason.clone(),
            expires_at: row.expires_at,
            created,
        }
    }

    /// Whether the call may still run under this request.
    pub fn waiting(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "granted" | "running")
    }

    /// What the caller reads.
    pub fn message(&self, tool: &str) -> String {
        match self.status.as_str() {
            "pending" => format!(
                "waiting for approval {}: `{tool}` needs a person to approve this exact call. Call again with the same arguments once approved (until {}).",
                self.id,
                self.expires_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            "granted" | "running" => format!(
                "approval {} was granted and the call is running; call again with the same arguments for its result.",
                self.id
            ),
            "denied" => format!(
                "approval {} was denied{}; the call did not run.",
                self.id,
                self.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            "expired" => format!(
                "approval {} expired before anyone decided; the call did not run.",
                self.id
            ),
            _ => format!(
                "approval {} was granted but the call could not run{}.",
                self.id,
                self.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// What the gate does with a call a rule asks about.
pub enum Gatekeeping {
    /// Wait (or tell the caller why it will not run).
    Ticket(Ticket),
    /// The approved call already ran: its outcome, given to this caller once.
    Ran { outcome: Value, latency: Duration },
}

/// The SHA-256 of the canonical form of `args`: the same call hashes the same whatever the
/// order its client wrote the keys in.
pub fn arguments_sha256(args: &Value) -> String {
    let text = serde_json::to_string(&crate::pool::definition::canonical(args)).unwrap_or_default();
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn scope_value(scope: &TokenScope) -> Value {
    match scope {
        TokenScope::AllGranted => json!("all"),
        TokenScope::Only(t) => json!(t.iter().map(|g| g.to_string()).collect::<Vec<_>>()),
    }
}

fn scope_of(v: &Value) -> TokenScope {
    match v {
        Value::Array(items) => TokenScope::Only(
            items
                .iter()
                .filter_map(|i| i.as_str().and_then(|s| GrantTarget::parse(s).ok()))
                .collect(),
        ),
        _ => TokenScope::AllGranted,
    }
}

/// The core path's question: a call of `tool` with `args` that `rule` asks about. Finds this
/// caller's request for exactly this call, or records a new one; gives the outcome of an
/// approved run once. `shown`: the arguments as the audit log keeps them (redacted), which is
/// what approvers read.
pub async fn gatekeep(
    state: &AppState,
    principal: &Principal,
    surface: &str,
    tool: &Tool,
    rule: &CompiledApproval,
    args: &Value,
    shown: &str,
) -> Result<Gatekeeping> {
    let binding = Binding {
        agent: principal.agent.clone(),
        person: principal.person.clone(),
        client_id: principal.client_id.clone(),
        tool: tool.name.to_string(),
        arguments_sha256: arguments_sha256(args),
        definition_sha256: tool.content_hash.hex(),
        rule_sha256: rule.sha256.clone(),
    };
    // What an agent can make the database hold: bounded per request and in number.
    if serde_json::to_vec(args).map_or(0, |v| v.len()) > MAX_ARGUMENT_BYTES {
        return Err(ServiceError::Invalid(format!(
            "a call that needs approval may carry at most {} KiB of arguments",
            MAX_ARGUMENT_BYTES / 1024
        )));
    }
    let ttl = chrono::Duration::from_std(rule.rule.ttl).unwrap_or(chrono::Duration::hours(1));
    let new = NewRequest {
        id: Uuid::now_v7(),
        binding: binding.clone(),
        jti: principal.jti,
        scope: scope_value(&principal.scope),
        surface: surface.to_owned(),
        rule_target: rule.rule.target.clone(),
        approvers: rule.rule.approvers.clone(),
        arguments: args.clone(),
        shown_arguments: shown.to_owned(),
        expires_at: chrono::Utc::now() + ttl,
    };
    // An identical call racing this one may add the request first (one open request per
    // binding, by a unique index): then this one finds it on the next round.
    for _ in 0..3 {
        if let Some(found) = find(state, &binding).await? {
            return Ok(found);
        }
        let mut tx = state.db.begin().await?;
        db::approvals::lock_agent(&mut tx, &principal.agent).await?;
        let waiting = db::approvals::pending_for(&mut tx, &principal.agent).await?;
        if waiting >= MAX_PENDING_PER_AGENT {
            return Err(ServiceError::Conflict(format!(
                "{waiting} calls of this agent already wait for approval; ask an approver to decide them first"
            )));
        }
        let Some(row) = db::approvals::insert(&mut tx, &new).await? else {
            tx.rollback().await?;
            continue;
        };
        // What the approver reads, and what the next request of this tool is compared with.
        db::approvals::remember_definition(
            &mut tx,
            &row.definition_sha256,
            &row.tool,
            &tool.definition(),
        )
        .await?;
        let mut e = event(EventKind::ApprovalRequested, AuditOutcome::Success, &row);
        e.arguments = Some(shown.to_owned());
        e.details = Some(
            json!({
                "approval": row.id,
                "rule": row.rule_target,
                "approvers": row.approvers,
                "arguments_sha256": row.arguments_sha256,
                "definition_sha256": row.definition_sha256,
                "rule_sha256": row.rule_sha256,
                "expires_at": row.expires_at,
                "surface": row.surface,
            })
            .to_string(),
        );
        db::record_changes(&mut tx, vec![e]).await?;
        tx.commit().await?;
        state
            .metrics
            .approvals
            .with_label_values(&["requested"])
            .inc();
        notify(state, &row);
        return Ok(Gatekeeping::Ticket(Ticket::of(&row, true)));
    }
    Err(ServiceError::Conflict(
        "identical calls keep racing for approval; retry".into(),
    ))
}

/// This caller's open request for exactly this call, as the gate answers it: waiting, or its
/// outcome given once. `None`: there is none (or another retry was given its outcome), so a
/// new request is due.
async fn find(state: &AppState, binding: &Binding) -> Result<Option<Gatekeeping>> {
    // One connection at a time, each given back before the next is taken: a burst of
    // retries must not hold the pool while waiting for it.
    let found = {
        let mut conn = state.db.acquire().await?;
        db::approvals::open_for(&mut conn, binding).await?
    };
    let Some(mut row) = found else {
        return Ok(None);
    };
    if row.state == "pending" && row.expires_at <= chrono::Utc::now() {
        expire_due(state).await?;
        let mut conn = state.db.acquire().await?;
        row = db::approvals::get(&mut conn, row.id).await?.unwrap_or(row);
    }
    if matches!(row.state.as_str(), "pending" | "granted" | "running") {
        return Ok(Some(Gatekeeping::Ticket(Ticket::of(&row, false))));
    }
    // Given once: a racing identical retry that loses goes on to a new request.
    let delivered = {
        let mut conn = state.db.acquire().await?;
        db::approvals::deliver(&mut conn, row.id).await?
    };
    if !delivered {
        return Ok(None);
    }
    if row.state == "done"
        && let Some(stored) = &row.outcome
    {
        let outcome = stored["outcome"].clone();
        let latency = Duration::from_micros(stored["latency_us"].as_u64().unwrap_or(0));
        return Ok(Some(Gatekeeping::Ran { outcome, latency }));
    }
    Ok(Some(Gatekeeping::Ticket(Ticket::of(&row, false))))
}

/// An approval event about `row`, as the caller's: agent, person, client, tool.
fn event(kind: EventKind, outcome: AuditOutcome, row: &ApprovalRow) -> AuditEvent {
    let mut e = AuditEvent::new(kind, outcome);
    e.agent = Some(row.agent.clone());
    e.person = row.person.clone();
    e.client_id = Some(row.client_id.clone());
    e.jti = row.jti.map(|j| j.to_string());
    e.tool = Some(row.tool.clone());
    e.resource = Some(format!("approval:{}", row.id));
    e
}

/// What requests an account is shown: those it may decide, or all for the roles that read
/// everything.
pub struct Shown {
    all: bool,
    names: Vec<String>,
}

impl Shown {
    pub fn shows(&self, row: &ApprovalRow) -> bool {
        self.all || row.approvers.iter().any(|a| self.names.contains(a))
    }
}

pub async fn visible_to(state: &AppState, username: &str) -> Result<Shown> {
    let mut conn = state.db.acquire().await?;
    Ok(match db::approvals::approver(&mut conn, username).await? {
        Some((role, mut sets)) => {
            let all = matches!(role.as_str(), "admin" | "auditor");
            sets.push(role);
            Shown { all, names: sets }
        }
        None => Shown {
            all: false,
            names: Vec::new(),
        },
    })
}

/// Why `row` can no longer be approved or run, if it cannot: the token that made the call
/// was revoked, its client (or the person's authorization of the host) is gone, the agent was
/// deleted (a re-created agent of the same name has other clients), or the rule that asked
/// was changed or removed (its approvers may not be the rule's any more).
pub fn stale(snapshot: &PolicySnapshot, row: &ApprovalRow) -> Option<&'static str> {
    if row.jti.is_some_and(|j| snapshot.is_revoked(&j)) {
        return Some("the token that made the call was revoked");
    }
    match &row.person {
        Some(p) if !snapshot.has_authorization(&row.agent, &row.client_id, p) => {
            return Some("the person's authorization of this host was revoked");
        }
        None if snapshot.client_agent(&row.client_id) != Some(row.agent.as_str()) => {
            return Some("the client that made the call no longer exists for this agent");
        }
        _ => {}
    }
    let Some(view) = snapshot.agent(&row.agent) else {
        return Some("the agent no longer exists");
    };
    if !view.approvals.iter().any(|r| r.sha256 == row.rule_sha256) {
        return Some("the approval rule that asked was changed or removed; call again to ask anew");
    }
    None
}

/// Who decides.
#[derive(Debug, Clone)]
pub enum Decider {
    /// The operator's admin token: not a person, so separation of duties does not bind it.
    AdminToken,
    /// A signed-in account.
    Account(String),
}

impl Decider {
    fn name(&self) -> String {
        match self {
            Decider::AdminToken => "admin-token".to_owned(),
            Decider::Account(u) => u.clone(),
        }
    }
}

/// Whether `decider` may decide `row`: refused with the reason otherwise.
async fn may_decide(state: &AppState, decider: &Decider, row: &ApprovalRow) -> Result<()> {
    let Decider::Account(user) = decider else {
        return Ok(());
    };
    let mut conn = state.db.acquire().await?;
    let Some((role, sets)) = db::approvals::approver(&mut conn, user).await? else {
        return Err(ServiceError::Invalid(format!(
            "account `{user}` cannot approve"
        )));
    };
    if !row.approvers.iter().any(|a| *a == role || sets.contains(a)) {
        return Err(ServiceError::Invalid(format!(
            "`{user}` is not among this request's approvers ({})",
            row.approvers.join(", ")
        )));
    }
    // Separation of duties: not one's own call, nor a call of an agent one may act as.
    let acts_as = state
        .policy
        .load()
        .agent(&row.agent)
        .is_some_and(|a| a.record.users.iter().any(|u| u == user));
    if row.person.as_deref() == Some(user.as_str()) || acts_as {
        return Err(ServiceError::Invalid(format!(
            "`{user}` cannot decide a call made under their own identity (agent `{}`)",
            row.agent
        )));
    }
    Ok(())
}

/// Approves (`granted`) or denies a pending request, on record. Running an approved call is
/// the core path's ([`crate::gate::decide`]).
pub async fn decide(
    state: &AppState,
    decider: &Decider,
    id: Uuid,
    approve: bool,
    reason: Option<&str>,
) -> Result<ApprovalRow> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if reason.is_some_and(|r| r.len() > 2000) {
        return Err(ServiceError::Invalid(
            "the reason is limited to 2000 bytes".into(),
        ));
    }
    let current = {
        let mut conn = state.db.acquire().await?;
        db::approvals::get(&mut conn, id).await?
    }
    .ok_or_else(|| ServiceError::NotFound(format!("approval {id}")))?;
    may_decide(state, decider, &current).await?;
    if approve && let Some(why) = stale(&state.policy.load(), &current) {
        return Err(ServiceError::Conflict(format!(
            "approval {id} cannot be granted: {why}"
        )));
    }
    expire_due(state).await?;
    let (new_state, kind, outcome) = if approve {
        ("granted", EventKind::ApprovalGranted, AuditOutcome::Success)
    } else {
        ("denied", EventKind::ApprovalDenied, AuditOutcome::Denied)
    };
    let mut tx = state.db.begin().await?;
    let Some(row) = db::approvals::decide(&mut tx, id, new_state, &decider.name(), reason).await?
    else {
        let now = db::approvals::get(&mut tx, id).await?;
        return Err(ServiceError::Conflict(format!(
            "approval {id} is not pending any more ({})",
            now.map(|r| r.state).unwrap_or_default()
        )));
    };
    if approve {
        db::approvals::definition_approved(&mut tx, &row.definition_sha256).await?;
    }
    let mut e = event(kind, outcome, &row);
    e.details = Some(
        json!({
            "approval": row.id,
            "decided_by": row.decided_by,
            "reason": row.reason,
            "arguments_sha256": row.arguments_sha256,
            "definition_sha256": row.definition_sha256,
            "rule_sha256": row.rule_sha256,
        })
        .to_string(),
    );
    db::record_changes(&mut tx, vec![e]).await?;
    tx.commit().await?;
    state
        .metrics
        .approvals
        .with_label_values(&[new_state])
        .inc();
    state
        .metrics
        .approval_decision_seconds
        .observe((chrono::Utc::now() - row.requested_at).num_milliseconds() as f64 / 1000.0);
    Ok(row)
}

/// Takes a granted request to run it: its arguments and the caller's identity, for the
/// first to ask only (the request is then `running`).
pub async fn claim(state: &AppState, id: Uuid) -> Result<Option<(ApprovalRow, Principal, Value)>> {
    let mut conn = state.db.acquire().await?;
    Ok(db::approvals::claim_run(&mut conn, id)
        .await?
        .map(|(row, args)| {
            let principal = Principal {
                agent: row.agent.clone(),
                client_id: row.client_id.clone(),
                jti: row.jti,
                scope: scope_of(&row.scope),
                person: row.person.clone(),
            };
            (row, principal, args)
        }))
}

/// Records how a claimed request ended: `done` with the call's outcome, or `failed` with why
/// it could not run.
pub async fn finish(
    state: &AppState,
    id: Uuid,
    ran: std::result::Result<(Value, Duration, Option<String>), String>,
) -> Result<()> {
    let (final_state, stored, call_id) = match ran {
        Ok((outcome, latency, call_id)) => (
            "done",
            json!({"outcome": outcome, "latency_us": latency.as_micros() as u64}),
            call_id,
        ),
        Err(reason) => ("failed", json!({"reason": reason}), None),
    };
    let mut conn = state.db.acquire().await?;
    db::approvals::finish(&mut conn, id, final_state, &stored, call_id.as_deref()).await?;
    Ok(())
}

/// Granted requests nobody has run (their deciding instance died first), whose grant is in
/// the audit log: a row set to `granted` in the database by hand is not run.
pub async fn orphans(state: &AppState) -> Result<Vec<Uuid>> {
    let mut conn = state.db.acquire().await?;
    let mut out = Vec::new();
    for id in db::approvals::granted_unclaimed(&mut conn).await? {
        if db::approvals::granted_on_record(&mut conn, id).await? {
            out.push(id);
        } else {
            tracing::error!(approval = %id, "a request is granted in the database but no grant is on record; not run");
        }
    }
    Ok(out)
}

/// How long a request that ended is kept (its record stays in the audit log).
const KEEP_ENDED_DAYS: i32 = 7;

/// Removes requests that ended more than a week ago.
pub async fn purge(state: &AppState) -> Result<u64> {
    let mut conn = state.db.acquire().await?;
    let purged = db::approvals::purge_finished(&mut conn, KEEP_ENDED_DAYS).await?;
    db::approvals::purge_definitions(&mut conn).await?;
    Ok(purged)
}

/// What an approver reads about the tool of a request: the definition the call was made
/// against, and how it differs from the one a person last approved a call of this tool
/// against (tool authors and upstreams change definitions; a pinned group's change is
/// approved by an admin, but the approver of a call should still see what is new).
#[derive(Debug, Clone, Serialize)]
pub struct DefinitionReview {
    /// Canonical, pretty-printed; `None` when it was not kept.
    pub definition: Option<String>,
    /// The definition a call of this tool was last approved against, and when.
    pub last_approved_sha256: Option<String>,
    pub last_approved_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Whether this request's definition differs from that one (`false` when none was approved).
    pub changed_since_approved: bool,
    /// Unified line diff, last approved against this request's (empty when unchanged; every
    /// line added when no call of this tool was approved before).
    pub diff: String,
}

/// The definition reviews of these requests, by request id.
pub async fn review(
    state: &AppState,
    rows: &[ApprovalRow],
) -> Result<std::collections::HashMap<Uuid, DefinitionReview>> {
    let mut hashes: Vec<String> = rows.iter().map(|r| r.definition_sha256.clone()).collect();
    hashes.sort();
    hashes.dedup();
    let mut tools: Vec<String> = rows.iter().map(|r| r.tool.clone()).collect();
    tools.sort();
    tools.dedup();
    let mut conn = state.db.acquire().await?;
    let kept: std::collections::HashMap<String, Value> =
        db::approvals::definitions(&mut conn, &hashes)
            .await?
            .into_iter()
            .map(|d| (d.content_hash, d.definition))
            .collect();
    let approved: std::collections::HashMap<String, db::approvals::KeptDefinition> =
        db::approvals::last_approved_definitions(&mut conn, &tools)
            .await?
            .into_iter()
            .map(|d| (d.tool.clone(), d))
            .collect();
    Ok(rows
        .iter()
        .map(|r| {
            let mine = kept.get(&r.definition_sha256);
            let last = approved.get(&r.tool);
            let changed = last.is_some_and(|l| l.content_hash != r.definition_sha256);
            let diff = match (mine, last) {
                (Some(_), Some(l)) if l.content_hash == r.definition_sha256 => String::new(),
                (Some(d), l) => crate::pool::definition::diff(l.map(|l| &l.definition), d),
                (None, _) => String::new(),
            };
            let review = DefinitionReview {
                definition: mine.map(crate::pool::definition::pretty),
                last_approved_sha256: last.map(|l| l.content_hash.clone()),
                last_approved_at: last.and_then(|l| l.last_approved_at),
                changed_since_approved: changed,
                diff,
            };
            (r.id, review)
        })
        .collect())
}

/// Refreshes the pending gauge.
pub async fn count_pending(state: &AppState) -> Result<()> {
    let mut conn = state.db.acquire().await?;
    let n = db::approvals::pending_count(&mut conn).await?;
    state.metrics.approvals_pending.set(n);
    Ok(())
}

/// Expires every pending request whose time is up, each on record.
pub async fn expire_due(state: &AppState) -> Result<usize> {
    let mut tx = state.db.begin().await?;
    let rows = db::approvals::expire_due(&mut tx).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let events = rows
        .iter()
        .map(|r| {
            let mut e = event(EventKind::ApprovalExpired, AuditOutcome::Timeout, r);
            e.details = Some(
                json!({"approval": r.id, "expires_at": r.expires_at, "approvers": r.approvers})
                    .to_string(),
            );
            e
        })
        .collect();
    db::record_changes(&mut tx, events).await?;
    tx.commit().await?;
    state
        .metrics
        .approvals
        .with_label_values(&["expired"])
        .inc_by(rows.len() as u64);
    Ok(rows.len())
}

pub async fn list(state: &AppState, status: Option<&str>) -> Result<Vec<ApprovalRow>> {
    if let Some(s) = status
        && ![
            "pending", "granted", "denied", "expired", "running", "done", "failed",
        ]
        .contains(&s)
    {
        return Err(ServiceError::Invalid(format!(
            "state must be one of pending, granted, denied, expired, running, done, failed; not {s:?}"
        )));
    }
    let mut conn = state.db.acquire().await?;
    Ok(db::approvals::list(&mut conn, status, 500).await?)
}

pub async fn get(state: &AppState, id: Uuid) -> Result<ApprovalRow> {
    let mut conn = state.db.acquire().await?;
    db::approvals::get(&mut conn, id)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("approval {id}")))
}

/// A request as its own caller may read it (the REST status URL): `None` for anyone else,
/// the same as for a request that does not exist.
pub async fn for_caller(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
) -> Result<Option<ApprovalRow>> {
    // A request whose time is up reads as expired, not as still waiting.
    expire_due(state).await?;
    let mut conn = state.db.acquire().await?;
    Ok(db::approvals::get(&mut conn, id).await?.filter(|r| {
        r.agent == principal.agent
            && r.client_id == principal.client_id
            && r.person == principal.person
    }))
}

/// Marks a decided request's outcome as given to its caller (a task read to its end).
pub async fn mark_delivered(state: &AppState, id: Uuid) -> Result<bool> {
    let mut conn = state.db.acquire().await?;
    Ok(db::approvals::deliver(&mut conn, id).await?)
}

/// The stored outcome of a done request, for a reader of its status.
pub fn outcome_of(row: &ApprovalRow) -> Option<&Value> {
    row.outcome
        .as_ref()
        .filter(|_| row.state == "done")
        .map(|o| &o["outcome"])
}

/// Sets the approver sets of an account.
pub async fn set_approver_sets(
    state: &AppState,
    actor: &str,
    username: &str,
    sets: &[String],
) -> Result<()> {
    let mut sets: Vec<String> = sets.iter().map(|s| s.trim().to_owned()).collect();
    sets.retain(|s| !s.is_empty());
    sets.sort();
    sets.dedup();
    if let Some(bad) = sets
        .iter()
        .find(|s| !crate::policy::approvals::valid_approver(s))
    {
        return Err(ServiceError::Invalid(format!(
            "approver set {bad:?}: lowercase letters, digits, _ . - only"
        )));
    }
    let mut tx = state.db.begin().await?;
    if !db::approvals::set_approver_sets(&mut tx, actor, username, &sets).await? {
        return Err(ServiceError::NotFound(format!("account `{username}`")));
    }
    tx.commit().await?;
    Ok(())
}

/// What setting an approval rule did: its problems (a rule that never triggers, or that
/// nobody can decide, is kept and flagged, like a zero-match grant).
#[derive(Debug, Serialize)]
pub struct RuleSet {
    pub agent: String,
    pub rule: crate::policy::approvals::ApprovalRule,
    pub problems: Vec<crate::policy::approvals::ApprovalProblem>,
}

/// Sets an agent's approval rule on one tool, group or `@destructive`.
pub async fn set_rule(
    state: &AppState,
    actor: &str,
    agent: &str,
    target: &str,
    body: &Value,
) -> Result<RuleSet> {
    let rule = crate::policy::approvals::parse(target, body).map_err(ServiceError::Invalid)?;
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::approval_rules::set_approval_rule(&mut tx, actor, agent, &rule).await? {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    super::refresh(state, crate::policy::snapshot::Parts::AGENTS).await;
    let problems = problems(state, agent)
        .await?
        .into_iter()
        .filter(|p| p.target == target)
        .collect();
    Ok(RuleSet {
        agent: agent.to_owned(),
        rule,
        problems,
    })
}

pub async fn delete_rule(state: &AppState, actor: &str, agent: &str, target: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::approval_rules::delete_approval_rule(&mut tx, actor, agent, target).await? {
        return Err(ServiceError::NotFound(format!(
            "approval on `{target}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    super::refresh(state, crate::policy::snapshot::Parts::AGENTS).await;
    Ok(())
}

/// The problems of an agent's approval rules, against what it sees and who can approve.
pub async fn problems(
    state: &AppState,
    agent: &str,
) -> Result<Vec<crate::policy::approvals::ApprovalProblem>> {
    let snapshot = state.policy.load();
    let Some(view) = snapshot.agent(agent) else {
        return Ok(Vec::new());
    };
    if view.record.approvals.is_empty() {
        return Ok(Vec::new());
    }
    let staffed = {
        let mut conn = state.db.acquire().await?;
        db::approval_rules::staffed(&mut conn).await?
    };
    Ok(crate::policy::approvals::problems(
        &view.record.approvals,
        &view.visible,
        Some(&staffed),
    ))
}

/// Tells the approvers of `row` where they already are: one POST per webhook configured for
/// one of its approvers, in the background, retried with backoff (1 s doubling, five tries).
/// Not durable: a request whose webhook could not be delivered still waits in the inbox.
fn notify(state: &AppState, row: &ApprovalRow) {
    let hooks: Vec<url::Url> = state
        .settings
        .approval_webhooks
        .iter()
        .filter(|(who, _)| row.approvers.contains(who))
        .map(|(_, url)| url.clone())
        .collect();
    if hooks.is_empty() {
        return;
    }
    let link = format!(
        "{}/admin/approvals#approval-{}",
        state.settings.issuer, row.id
    );
    let person = row
        .person
        .as_deref()
        .map(|p| format!(" for {p}"))
        .unwrap_or_default();
    // Names only (agents, tools, people and approver sets are restricted to plain
    // characters), never the arguments: they are the agent's words, and a chat would render
    // them. The arguments' digest identifies the call.
    let body = json!({
        "text": format!(
            "Agent `{}`{person} asks to call `{}` (rule on `{}`). Approve or deny: {link}",
            row.agent, row.tool, row.rule_target
        ),
        "approval": {
            "id": row.id,
            "agent": row.agent,
            "person": row.person,
            "client_id": row.client_id,
            "tool": row.tool,
            "rule": row.rule_target,
            "approvers": row.approvers,
            "arguments_sha256": row.arguments_sha256,
            "definition_sha256": row.definition_sha256,
            "expires_at": row.expires_at,
            "link": link,
        },
    })
    .to_string();
    let secret = state.settings.approval_webhook_secret.clone();
    let metrics = state.metrics.clone();
    let id = row.id;
    for url in hooks {
        let body = body.clone();
        let secret = secret.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let Ok(http) = oauth2::reqwest::ClientBuilder::new()
                .redirect(oauth2::reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(5))
                .build()
            else {
                return;
            };
            let mut backoff = Duration::from_secs(1);
            for attempt in 1..=5 {
                let mut req = http
                    .post(url.clone())
                    .header("content-type", "application/json")
                    .header("x-toolgate-approval", id.to_string());
                if let Some(secret) = &secret {
                    req = req.header("x-toolgate-signature", signature(secret, &body));
                }
                match req.body(body.clone()).send().await {
                    Ok(r) if r.status().is_success() => {
                        metrics
                            .approval_webhooks
                            .with_label_values(&["delivered"])
                            .inc();
                        return;
                    }
                    Ok(r) => {
                        tracing::warn!(approval = %id, url = %url, status = r.status().as_u16(), attempt, "approval webhook refused")
                    }
                    Err(e) => {
                        tracing::warn!(approval = %id, url = %url, error = %e, attempt, "approval webhook failed")
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            metrics
                .approval_webhooks
                .with_label_values(&["failed"])
                .inc();
        });
    }
}

/// `t=<unix time>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`: the time is signed with the
/// body, so a receiver can refuse an old delivery replayed.
pub fn signature(secret: &str, body: &str) -> String {
    let t = chrono::Utc::now().timestamp();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(tag.as_ref()))
}

/// The `requestState` of an `InputRequiredResult` for a call that waits (SEP-2322): the
/// request's id and the caller it is bound to, signed with the token signing key (so any
/// instance verifies it with the published keys, and a rotation does not break it). It holds
/// nothing the caller does not already know, so it is signed, not encrypted.
pub async fn seal_state(state: &AppState, principal: &Principal, id: Uuid) -> Result<String> {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let key = db::keys::current_signing_key(&state.db)
        .await?
        .ok_or_else(|| ServiceError::Other(anyhow::anyhow!("no signing key")))?;
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(&key.private_pkcs8)
        .map_err(|_| ServiceError::Other(anyhow::anyhow!("the signing key does not read")))?;
    let body = json!({
        "v": 1,
        "approval": id,
        "agent": principal.agent,
        "client_id": principal.client_id,
        "person": principal.person,
        "kid": key.kid,
    })
    .to_string();
    let signed = URL_SAFE_NO_PAD.encode(body.as_bytes());
    let sig = pair.sign(signed.as_bytes());
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref())))
}

/// The request a `requestState` names, if it is one this gateway signed for this caller.
pub fn open_state(snapshot: &PolicySnapshot, principal: &Principal, sealed: &str) -> Option<Uuid> {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    if sealed.len() > 4096 {
        return None;
    }
    let (signed, sig) = sealed.split_once('.')?;
    let body: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(signed).ok()?).ok()?;
    let public = snapshot.verify_key(body["kid"].as_str()?)?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
        .verify(signed.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).ok()?)
        .ok()?;
    let bound = body["v"] == 1
        && body["agent"].as_str() == Some(principal.agent.as_str())
        && body["client_id"].as_str() == Some(principal.client_id.as_str())
        && body["person"].as_str() == principal.person.as_deref();
    bound.then(|| Uuid::parse_str(body["approval"].as_str()?).ok())?
}

/// Waits up to `hold` for request `id` to leave `pending` (polled: a decision on any instance
/// is seen within a quarter of a second).
pub async fn hold(state: &AppState, id: Uuid, hold: Duration) {
    let until = tokio::time::Instant::now() + hold;
    while tokio::time::Instant::now() < until {
        match get(state, id).await {
            Ok(row) if row.state == "pending" && row.expires_at > chrono::Utc::now() => {}
            Ok(row) if row.state == "granted" || row.state == "running" => {}
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
