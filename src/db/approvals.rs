//! Requests for approval of one call each, and what became of them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

/// What a request is bound to: a decision applies to exactly this call and no other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub agent: String,
    pub person: Option<String>,
    pub client_id: String,
    pub tool: String,
    pub arguments_sha256: String,
    pub definition_sha256: String,
    pub rule_sha256: String,
}

/// A new request.
#[derive(Debug)]
pub struct NewRequest {
    pub id: Uuid,
    pub binding: Binding,
    pub jti: Option<Uuid>,
    pub scope: Value,
    pub surface: String,
    pub rule_target: String,
    pub approvers: Vec<String>,
    pub arguments: Value,
    pub shown_arguments: String,
    pub expires_at: DateTime<Utc>,
}

/// One request as stored (its arguments only through [`claim_run`]).
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRow {
    pub id: Uuid,
    pub state: String,
    pub agent: String,
    pub person: Option<String>,
    pub client_id: String,
    #[serde(skip)]
    pub jti: Option<Uuid>,
    #[serde(skip)]
    pub scope: Value,
    pub surface: String,
    pub tool: String,
    pub arguments_sha256: String,
    pub definition_sha256: String,
    pub rule_sha256: String,
    pub rule_target: String,
    pub approvers: Vec<String>,
    pub shown_arguments: String,
    pub requested_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
    pub reason: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub outcome: Option<Value>,
    pub call_id: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// The columns of [`ApprovalRow`], for `RETURNING` and `SELECT`.
macro_rules! row_query {
    ($sql:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ApprovalRow,
            $sql
            $(, $arg)*
        )
    };
}

/// Serialises the requests of one agent for the rest of the transaction: its count of waiting
/// requests is then exact when a new one is added.
pub async fn lock_agent(conn: &mut PgConnection, agent: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtext('toolgate.approvals:' || $1::text))",
        agent
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Adds a request; `None` when an open one for the same binding exists already (an identical
/// call raced this one).
pub async fn insert(conn: &mut PgConnection, r: &NewRequest) -> sqlx::Result<Option<ApprovalRow>> {
    row_query!(
        r#"INSERT INTO approval_requests
            (id, state, agent, person, client_id, jti, scope, surface, tool, arguments_sha256,
             definition_sha256, rule_sha256, rule_target, approvers, arguments, shown_arguments,
             expires_at)
         VALUES ($1, 'pending', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT DO NOTHING
         RETURNING id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at"#,
        r.id,
        r.binding.agent,
        r.binding.person,
        r.binding.client_id,
        r.jti,
        r.scope,
        r.surface,
        r.binding.tool,
        r.binding.arguments_sha256,
        r.binding.definition_sha256,
        r.binding.rule_sha256,
        r.rule_target,
        &r.approvers,
        r.arguments,
        r.shown_arguments,
        r.expires_at,
    )
    .fetch_optional(conn)
    .await
}

/// The caller's latest request for exactly this call whose outcome it has not been given.
pub async fn open_for(conn: &mut PgConnection, b: &Binding) -> sqlx::Result<Option<ApprovalRow>> {
    row_query!(
        r#"SELECT id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at
         FROM approval_requests
         WHERE agent = $1 AND tool = $2 AND arguments_sha256 = $3 AND delivered_at IS NULL
           AND client_id = $4 AND person IS NOT DISTINCT FROM $5
           AND definition_sha256 = $6 AND rule_sha256 = $7
         ORDER BY requested_at DESC LIMIT 1"#,
        b.agent,
        b.tool,
        b.arguments_sha256,
        b.client_id,
        b.person,
        b.definition_sha256,
        b.rule_sha256,
    )
    .fetch_optional(conn)
    .await
}

pub async fn get(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<ApprovalRow>> {
    row_query!(
        r#"SELECT id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at
         FROM approval_requests WHERE id = $1"#,
        id,
    )
    .fetch_optional(conn)
    .await
}

/// Requests in `state` (any when `None`), newest first.
pub async fn list(
    conn: &mut PgConnection,
    state: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<ApprovalRow>> {
    row_query!(
        r#"SELECT id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at
         FROM approval_requests WHERE $1::text IS NULL OR state = $1
         ORDER BY requested_at DESC LIMIT $2"#,
        state,
        limit,
    )
    .fetch_all(conn)
    .await
}

/// Decides a pending, unexpired request: `granted` or `denied`. `None` when it is not
/// pending any more (decided, expired, or unknown): a decision is made once.
pub async fn decide(
    conn: &mut PgConnection,
    id: Uuid,
    state: &str,
    by: &str,
    reason: Option<&str>,
) -> sqlx::Result<Option<ApprovalRow>> {
    row_query!(
        r#"UPDATE approval_requests
         SET state = $2, decided_at = now(), decided_by = $3, reason = $4,
             arguments = CASE WHEN $2 = 'denied' THEN NULL ELSE arguments END
         WHERE id = $1 AND state = 'pending' AND expires_at > now()
         RETURNING id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at"#,
        id,
        state,
        by,
        reason,
    )
    .fetch_optional(conn)
    .await
}

/// Takes a granted request to run it: exactly one caller ever gets its arguments.
pub async fn claim_run(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<(ApprovalRow, Value)>> {
    let claimed: Option<Value> = sqlx::query_scalar!(
        "UPDATE approval_requests SET state = 'running'
         WHERE id = $1 AND state = 'granted' RETURNING arguments",
        id,
    )
    .fetch_optional(&mut *conn)
    .await?
    .flatten();
    let Some(args) = claimed else {
        return Ok(None);
    };
    Ok(get(conn, id).await?.map(|r| (r, args)))
}

/// Records how the approved call ended (`done`) or why it could not run (`failed`), and
/// erases its arguments.
pub async fn finish(
    conn: &mut PgConnection,
    id: Uuid,
    state: &str,
    outcome: &Value,
    call_id: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE approval_requests
         SET state = $2, outcome = $3, call_id = $4, finished_at = now(), arguments = NULL
         WHERE id = $1 AND state IN ('granted', 'running')",
        id,
        state,
        outcome,
        call_id,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks the outcome as given to the caller; `false` if another retry gave it first.
pub async fn deliver(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE approval_requests SET delivered_at = now()
         WHERE id = $1 AND delivered_at IS NULL AND state IN ('done', 'failed', 'denied', 'expired')",
        id,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Expires the pending requests whose time is up, erasing their arguments.
pub async fn expire_due(conn: &mut PgConnection) -> sqlx::Result<Vec<ApprovalRow>> {
    row_query!(
        r#"UPDATE approval_requests SET state = 'expired', arguments = NULL, decided_at = now()
         WHERE state = 'pending' AND expires_at <= now()
         RETURNING id, state, agent, person, client_id, jti, scope, surface, tool,
             arguments_sha256, definition_sha256, rule_sha256, rule_target, approvers,
             shown_arguments, requested_at, expires_at, decided_at, decided_by, reason,
             finished_at, outcome, call_id, delivered_at"#,
    )
    .fetch_all(conn)
    .await
}

/// Granted requests nobody has run: an instance that approved and died before running.
pub async fn granted_unclaimed(conn: &mut PgConnection) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "SELECT id FROM approval_requests WHERE state = 'granted'
         AND decided_at < now() - interval '10 seconds'"
    )
    .fetch_all(conn)
    .await
}

/// How many requests wait, for the metrics.
pub async fn pending_count(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM approval_requests WHERE state = 'pending'"#)
        .fetch_one(conn)
        .await
}

/// Removes requests that ended more than `days` ago (their record stays in the audit log).
pub async fn purge_finished(conn: &mut PgConnection, days: i32) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        "DELETE FROM approval_requests
         WHERE state IN ('done', 'failed', 'denied', 'expired')
           AND coalesce(finished_at, decided_at, requested_at) < now() - make_interval(days => $1)",
        days
    )
    .execute(conn)
    .await?
    .rows_affected())
}

/// Whether the audit log holds the grant of request `id`: a row set to `granted` by hand in
/// the database is not a person's decision.
pub async fn granted_on_record(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM audit_events
            WHERE event_type = 'approval.granted' AND resource = $1) AS "on_record!""#,
        format!("approval:{id}")
    )
    .fetch_one(conn)
    .await
}

/// How many requests of `agent` wait.
pub async fn pending_for(conn: &mut PgConnection, agent: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM approval_requests WHERE state = 'pending' AND agent = $1"#,
        agent
    )
    .fetch_one(conn)
    .await
}

/// An account's approver sets and whether it is enabled, by username.
pub async fn approver(
    conn: &mut PgConnection,
    username: &str,
) -> sqlx::Result<Option<(String, Vec<String>)>> {
    Ok(sqlx::query!(
        "SELECT role, approver_sets FROM admin_users WHERE username = $1 AND disabled_at IS NULL",
        username,
    )
    .fetch_optional(conn)
    .await?
    .map(|r| (r.role, r.approver_sets)))
}

/// Sets an account's approver sets.
pub async fn set_approver_sets(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    sets: &[String],
) -> sqlx::Result<bool> {
    let before: Option<Vec<String>> = sqlx::query_scalar!(
        "SELECT approver_sets FROM admin_users WHERE username = $1",
        username
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = before else {
        return Ok(false);
    };
    sqlx::query!(
        "UPDATE admin_users SET approver_sets = $2 WHERE username = $1",
        username,
        sets,
    )
    .execute(&mut *conn)
    .await?;
    super::record_change(
        conn,
        actor,
        crate::audit::AdminAction::AdminUserApproverSets,
        &format!("admin_user:{username}"),
        Some(serde_json::json!(before)),
        Some(serde_json::json!(sets)),
    )
    .await?;
    Ok(true)
}

/// Keeps the definition a request was made against (once per content hash).
pub async fn remember_definition(
    conn: &mut PgConnection,
    content_hash: &str,
    tool: &str,
    definition: &Value,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO approval_definitions (content_hash, tool, definition) VALUES ($1, $2, $3)
         ON CONFLICT (content_hash) DO NOTHING",
        content_hash,
        tool,
        definition
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Notes that a person approved a call made against this definition.
pub async fn definition_approved(conn: &mut PgConnection, content_hash: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE approval_definitions SET last_approved_at = now() WHERE content_hash = $1",
        content_hash
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A kept definition, and when a call made against it was last approved.
#[derive(Debug, Clone)]
pub struct KeptDefinition {
    pub content_hash: String,
    pub tool: String,
    pub definition: Value,
    pub last_approved_at: Option<DateTime<Utc>>,
}

/// The definitions with these hashes.
pub async fn definitions(
    conn: &mut PgConnection,
    hashes: &[String],
) -> sqlx::Result<Vec<KeptDefinition>> {
    sqlx::query_as!(
        KeptDefinition,
        "SELECT content_hash, tool, definition, last_approved_at FROM approval_definitions
         WHERE content_hash = ANY($1)",
        hashes
    )
    .fetch_all(conn)
    .await
}

/// For each of these tools, the definition a person last approved a call of.
pub async fn last_approved_definitions(
    conn: &mut PgConnection,
    tools: &[String],
) -> sqlx::Result<Vec<KeptDefinition>> {
    sqlx::query_as!(
        KeptDefinition,
        "SELECT DISTINCT ON (tool) content_hash, tool, definition, last_approved_at
         FROM approval_definitions
         WHERE tool = ANY($1) AND last_approved_at IS NOT NULL
         ORDER BY tool, last_approved_at DESC",
        tools
    )
    .fetch_all(conn)
    .await
}

/// Removes definitions no request refers to any more, except each tool's last approved one.
pub async fn purge_definitions(conn: &mut PgConnection) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        "DELETE FROM approval_definitions d
         WHERE NOT EXISTS (SELECT 1 FROM approval_requests r
                           WHERE r.definition_sha256 = d.content_hash)
           AND d.content_hash IS DISTINCT FROM (
               SELECT k.content_hash FROM approval_definitions k
               WHERE k.tool = d.tool AND k.last_approved_at IS NOT NULL
               ORDER BY k.last_approved_at DESC LIMIT 1)"
    )
    .execute(conn)
    .await?
    .rows_affected())
}
