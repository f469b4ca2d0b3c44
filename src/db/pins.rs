//! Pinned groups: which tool definitions an admin approved, which are held for approval, and
//! the audit of every change, approval and rejection, in the control-plane chain and in the
//! transaction of the change it records.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

use crate::audit::{AuditEvent, EventKind, Outcome};
use crate::policy::snapshot::PinState;
use crate::pool::{Catalog, Tool, ToolSource};

/// Who approves the first listing of an upstream group that never had an approval.
pub const FIRST_USE: &str = "first-use";

/// Who carries an approval made under the first form of a script tool's hash over to the
/// second, when the tool's content is still the one approved (see [`detect`]).
pub const HASH_UPGRADE: &str = "hash-upgrade";

/// A query macro (`$mac`, with a record type first if it takes one) over `$before`, then the
/// query of the groups pinned now, then `$after`: the rule is written once, and checked in
/// each query that uses it (the query macros take only string literals, joined by `+`).
///
/// A group is pinned when `groups.yaml` (or the API) says `pin: true`, or it is an upstream
/// whose spec does not say `pin: false` and `groups.yaml` says nothing.
macro_rules! with_pinned_groups {
    ($mac:ident!($($record:ident,)? $before:literal, $after:literal)) => {
        sqlx::$mac!(
            $($record,)?
            $before
                + r#"SELECT name AS "name!" FROM tool_groups WHERE pin
                     UNION
                     SELECT u.name FROM upstreams u LEFT JOIN tool_groups g ON g.name = u.name
                     WHERE g.pin IS NULL
                       AND CASE WHEN jsonb_typeof(u.spec->'pin') = 'boolean'
                           THEN (u.spec->'pin')::boolean ELSE true END"#
                + $after
        )
    };
}

/// Serialises recording changes with approving them, across instances: a check that finds no
/// approval must not race an approval being written.
async fn lock(conn: &mut PgConnection) -> sqlx::Result<()> {
    super::locks::hold(conn, super::locks::Lock::Pins).await
}

pub async fn pinned_groups(conn: &mut PgConnection) -> sqlx::Result<BTreeSet<String>> {
    Ok(with_pinned_groups!(query_scalar!("", ""))
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect())
}

/// What the snapshot needs: the pinned groups and every approved hash.
pub async fn load(conn: &mut PgConnection) -> sqlx::Result<PinState> {
    let groups = pinned_groups(conn).await?.into_iter().collect();
    let approved = sqlx::query!("SELECT name, content_hash FROM tool_approvals")
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| (r.name, r.content_hash))
        .collect();
    Ok(PinState { groups, approved })
}

fn source_word(t: &Tool) -> &'static str {
    match t.source {
        ToolSource::Script { .. } => "folder",
        ToolSource::Upstream { .. } => "upstream",
    }
}

async fn audit(
    conn: &mut PgConnection,
    kind: EventKind,
    tool: &str,
    actor: Option<&str>,
    details: Value,
) -> sqlx::Result<()> {
    let mut event = AuditEvent::new(kind, Outcome::Success).from_current_origin();
    event.admin_user = actor.map(str::to_owned);
    event.tool = Some(tool.to_owned());
    event.resource = Some(format!("tool:{tool}"));
    event.details = Some(details.to_string());
    super::audit::append_in_tx(conn, crate::audit::instance_name(), event).await
}

async fn upsert_approval(
    conn: &mut PgConnection,
    name: &str,
    group: &str,
    hash: &str,
    definition: &Value,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO tool_approvals (name, group_name, content_hash, definition, approved_by, approved_at)
         VALUES ($1, $2, $3, $4, $5, now())
         ON CONFLICT (name) DO UPDATE SET group_name = EXCLUDED.group_name,
             content_hash = EXCLUDED.content_hash, definition = EXCLUDED.definition,
             approved_by = EXCLUDED.approved_by, approved_at = EXCLUDED.approved_at",
        name,
        group,
        hash,
        definition,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What [`detect`] recorded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Detected {
    /// New pending definitions (each with its `tool.definition_changed` event).
    pub held: usize,
    /// Tools of upstream groups approved on first use.
    pub first_use: usize,
    /// Approvals carried over from the first form of the script hash to the second.
    pub upgraded: usize,
}

/// Records, for every tool of a pinned group in `catalog` whose hash is not approved, a pending
/// row with its `tool.definition_changed` event, once however many instances see it; the
/// first listing of an upstream group that never had an approval or a pending definition is
/// approved as `first-use` instead (trust on first use).
///
/// A script tool whose approval was made under the first form of the hash (which covered the
/// MCP definition and the files, not the whole operation nor the group's settings), and whose
/// content is still the approved one under that form, has its approval carried over to the
/// second form, as `hash-upgrade`, with its `tool.definition_approved` event: an upgrade of
/// the gateway does not take every pinned tool offline, and what it newly covers (responses,
/// method, path, settings) is approved as it is served at that moment, as when a group is
/// pinned. A pending definition of the first form becomes the same definition of the second.
///
/// Writes nothing when nothing is new, so calling it after every reload is cheap.
pub async fn detect(pool: &PgPool, catalog: &Catalog) -> sqlx::Result<Detected> {
    let mut tx = pool.begin().await?;
    lock(&mut tx).await?;
    let pinned = pinned_groups(&mut tx).await?;
    let tools: Vec<&Arc<Tool>> = catalog
        .tools()
        .filter(|t| pinned.contains(t.group()))
        .collect();
    let mut done = Detected::default();
    if tools.is_empty() {
        tx.commit().await?;
        return Ok(done);
    }
    let names: Vec<String> = tools.iter().map(|t| t.name.as_str().to_owned()).collect();
    let groups: Vec<String> = tools
        .iter()
        .map(|t| t.group().to_owned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let approved: HashMap<String, (String, Value)> = sqlx::query!(
        "SELECT name, content_hash, definition FROM tool_approvals WHERE name = ANY($1)",
        &names,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| (r.name, (r.content_hash, r.definition)))
    .collect();
    let pending: HashSet<(String, String)> = sqlx::query!(
        "SELECT name, content_hash FROM tool_pending WHERE name = ANY($1)",
        &names,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| (r.name, r.content_hash))
    .collect();
    let known: HashSet<String> = sqlx::query_scalar!(
        r#"SELECT group_name AS "group_name!" FROM tool_approvals WHERE group_name = ANY($1)
           UNION SELECT group_name FROM tool_pending WHERE group_name = ANY($1)"#,
        &groups,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    for t in tools {
        let name = t.name.as_str();
        let previous = approved.get(name);
        if previous.is_some_and(|(h, _)| *h == t.content_hash) {
            continue;
        }
        if previous.is_some() && !pending.contains(&(name.to_owned(), t.content_hash.hex())) {
            // Read only here: a tool whose approval is not for its hash, once.
            if let Some(legacy) = crate::pool::loader::legacy_hash(t) {
                let legacy = legacy.hex();
                if previous.is_some_and(|(h, _)| *h == legacy) {
                    let carried = sqlx::query!(
                        "UPDATE tool_approvals SET content_hash = $3, definition = $4,
                             approved_by = $5, approved_at = now()
                         WHERE name = $1 AND content_hash = $2",
                        name,
                        &legacy,
                        t.content_hash.hex(),
                        t.definition(),
                        HASH_UPGRADE,
                    )
                    .execute(&mut *tx)
                    .await?;
                    if carried.rows_affected() == 1 {
                        audit(
                            &mut tx,
                            EventKind::ToolDefinitionApproved,
                            name,
                            Some(HASH_UPGRADE),
                            json!({"group": t.group(), "hash": t.content_hash,
                                   "previous_hash": legacy, "hash_upgrade": true,
                                   "source": source_word(t)}),
                        )
                        .await?;
                        done.upgraded += 1;
                    }
                    continue;
                }
                // Held under the first form: the same definition, held under the second.
                let moved = sqlx::query!(
                    "UPDATE tool_pending SET content_hash = $3, definition = $4
                     WHERE name = $1 AND content_hash = $2
                       AND NOT EXISTS (SELECT 1 FROM tool_pending WHERE name = $1 AND content_hash = $3)",
                    name,
                    &legacy,
                    t.content_hash.hex(),
                    t.definition(),
                )
                .execute(&mut *tx)
                .await?;
                if moved.rows_affected() == 1 {
                    continue;
                }
            }
        }
        let upstream = matches!(t.source, ToolSource::Upstream { .. });
        if upstream && !known.contains(t.group()) {
            let inserted = sqlx::query!(
                "INSERT INTO tool_approvals (name, group_name, content_hash, definition, approved_by)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
                name,
                t.group(),
                t.content_hash.hex(),
                t.definition(),
                FIRST_USE,
            )
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() == 1 {
                audit(
                    &mut tx,
                    EventKind::ToolDefinitionApproved,
                    name,
                    Some(FIRST_USE),
                    json!({"group": t.group(), "hash": t.content_hash, "previous_hash": null,
                           "first_use": true, "source": source_word(t)}),
                )
                .await?;
                done.first_use += 1;
            }
            continue;
        }
        if pending.contains(&(name.to_owned(), t.content_hash.hex())) {
            continue;
        }
        let inserted = sqlx::query!(
            "INSERT INTO tool_pending (name, content_hash, group_name, definition, previous_hash,
                 previous_definition, source)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name, content_hash) DO NOTHING",
            name,
            t.content_hash.hex(),
            t.group(),
            t.definition(),
            previous.map(|(h, _)| h),
            previous.map(|(_, d)| d),
            source_word(t),
        )
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 1 {
            audit(
                &mut tx,
                EventKind::ToolDefinitionChanged,
                name,
                None,
                json!({"group": t.group(), "previous_hash": previous.map(|(h, _)| h),
                       "new_hash": t.content_hash, "source": source_word(t)}),
            )
            .await?;
            done.held += 1;
        }
    }
    tx.commit().await?;
    Ok(done)
}

/// Records a `tool.definition_changed` event for each tool of a pinned group whose files were
/// changed on disk and restored between two loads (see [`crate::pool::Restored`]): the content
/// is the one it had, so nothing is held, but the change happened and is on record, with the
/// files it touched.
pub async fn record_restored(
    pool: &PgPool,
    restored: &[crate::pool::Restored],
) -> sqlx::Result<()> {
    if restored.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    let pinned = pinned_groups(&mut tx).await?;
    for r in restored.iter().filter(|r| pinned.contains(r.tool.group())) {
        let t = &r.tool;
        audit(
            &mut tx,
            EventKind::ToolDefinitionChanged,
            t.name.as_str(),
            None,
            json!({"group": t.group(), "previous_hash": t.content_hash,
                   "new_hash": t.content_hash, "source": source_word(t),
                   "restored": true, "files": r.files,
                   "note": "changed on disk and restored before the next load: the content is the one it had"}),
        )
        .await?;
    }
    tx.commit().await
}

/// Approves what `group` serves now, recorded as approved by `actor`: the baseline a group
/// gets when it is pinned. The definitions are `catalog`'s, and for tools it lacks (upstream
/// tools, when pinned from the command line) the ones the instances wrote to the `tools`
/// table. Returns how many approvals changed.
pub async fn baseline(
    conn: &mut PgConnection,
    actor: &str,
    group: &str,
    catalog: &Catalog,
) -> sqlx::Result<usize> {
    lock(conn).await?;
    let mut defs: BTreeMap<String, (String, Value)> = catalog
        .tools()
        .filter(|t| t.group() == group)
        .map(|t| {
            (
                t.name.as_str().to_owned(),
                (t.content_hash.hex(), t.definition()),
            )
        })
        .collect();
    for r in sqlx::query!(
        r#"SELECT name, content_hash, definition AS "definition!" FROM tools
           WHERE group_name = $1 AND definition IS NOT NULL"#,
        group,
    )
    .fetch_all(&mut *conn)
    .await?
    {
        defs.entry(r.name).or_insert((r.content_hash, r.definition));
    }
    let current: HashMap<String, String> = sqlx::query!(
        "SELECT name, content_hash FROM tool_approvals WHERE group_name = $1",
        group,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.name, r.content_hash))
    .collect();
    let mut n = 0;
    for (name, (hash, definition)) in &defs {
        let previous = current.get(name);
        if previous == Some(hash) {
            continue;
        }
        upsert_approval(conn, name, group, hash, definition, actor).await?;
        sqlx::query!("DELETE FROM tool_pending WHERE name = $1", name)
            .execute(&mut *conn)
            .await?;
        audit(
            conn,
            EventKind::ToolDefinitionApproved,
            name,
            Some(actor),
            json!({"group": group, "hash": hash, "previous_hash": previous, "baseline": true}),
        )
        .await?;
        n += 1;
    }
    Ok(n)
}

/// A definition waiting for an admin (or rejected by one: still held).
#[derive(Debug, Clone, Serialize)]
pub struct PendingTool {
    pub name: String,
    pub group: String,
    pub hash: String,
    pub definition: Value,
    pub previous_hash: Option<String>,
    pub previous_definition: Option<Value>,
    /// `folder` (a script folder was edited) or `upstream` (an upstream re-list).
    pub source: String,
    pub first_seen: DateTime<Utc>,
    pub rejected_by: Option<String>,
    pub rejected_at: Option<DateTime<Utc>>,
}

/// Pending definitions of the groups pinned now, newest first.
pub async fn pending(conn: &mut PgConnection) -> sqlx::Result<Vec<PendingTool>> {
    with_pinned_groups!(query_as!(
        PendingTool,
        "SELECT name, group_name AS group, content_hash AS hash, definition, previous_hash,
                previous_definition, source, first_seen, rejected_by, rejected_at
         FROM tool_pending WHERE group_name IN (",
        ") ORDER BY first_seen DESC, name"
    ))
    .fetch_all(&mut *conn)
    .await
}

/// What an approval or a rejection decided.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub name: String,
    pub group: String,
    pub hash: String,
    pub previous_hash: Option<String>,
    pub by: String,
}

/// The pending row of `name` with `hash`, or its newest one (for a rejection, its newest one
/// not yet rejected), locked.
async fn pending_row(
    conn: &mut PgConnection,
    name: &str,
    hash: Option<&str>,
    skip_rejected: bool,
) -> sqlx::Result<Option<(String, String, Value, DateTime<Utc>)>> {
    Ok(sqlx::query!(
        "SELECT content_hash, group_name, definition, first_seen FROM tool_pending
         WHERE name = $1 AND ($2::text IS NULL OR content_hash = $2)
           AND NOT ($3 AND $2::text IS NULL AND rejected_at IS NOT NULL)
         ORDER BY first_seen DESC LIMIT 1 FOR UPDATE",
        name,
        hash,
        skip_rejected,
    )
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| (r.content_hash, r.group_name, r.definition, r.first_seen)))
}

/// What an admin decides about a held definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The definition becomes the approved one and is served again.
    Approve,
    /// It stays held, shown as rejected.
    Reject,
}

/// Decides the pending definition of `name` with `hash` (by default its newest; for a
/// rejection, its newest not yet rejected). Approved, it becomes the one served, on every
/// instance, and it and the older pending rows it supersedes go; rejected, it stays held,
/// shown as rejected. `None` if there is no such pending definition.
pub async fn decide(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    hash: Option<&str>,
    verdict: Verdict,
) -> sqlx::Result<Option<Decision>> {
    lock(conn).await?;
    let Some((hash, group, definition, first_seen)) =
        pending_row(conn, name, hash, verdict == Verdict::Reject).await?
    else {
        return Ok(None);
    };
    let previous: Option<String> = sqlx::query_scalar!(
        "SELECT content_hash FROM tool_approvals WHERE name = $1",
        name,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let (kind, details) = match verdict {
        Verdict::Approve => {
            upsert_approval(conn, name, &group, &hash, &definition, actor).await?;
            sqlx::query!(
                "DELETE FROM tool_pending WHERE name = $1 AND first_seen <= $2",
                name,
                first_seen,
            )
            .execute(&mut *conn)
            .await?;
            (
                EventKind::ToolDefinitionApproved,
                json!({"group": group, "hash": hash, "previous_hash": previous}),
            )
        }
        Verdict::Reject => {
            sqlx::query!(
                "UPDATE tool_pending SET rejected_by = $3, rejected_at = now()
                 WHERE name = $1 AND content_hash = $2",
                name,
                &hash,
                actor,
            )
            .execute(&mut *conn)
            .await?;
            (
                EventKind::ToolDefinitionRejected,
                json!({"group": group, "hash": hash, "approved_hash": previous}),
            )
        }
    };
    audit(conn, kind, name, Some(actor), details).await?;
    Ok(Some(Decision {
        name: name.to_owned(),
        group,
        hash,
        previous_hash: previous,
        by: actor.to_owned(),
    }))
}
