//! Audit sink cursors: where each sink (and the rollup follower) has delivered to.

use sqlx::{PgConnection, PgPool};

/// Makes sure `sink` has a cursor (at the start of the log for a new sink).
pub async fn ensure(pool: &PgPool, sink: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO audit_sink_cursors (sink) VALUES ($1) ON CONFLICT (sink) DO NOTHING",
        sink
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A position in commit order: the row id and its transaction (as text; `None` only for the
/// start of the log). See the migration that added `tx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub id: i64,
    pub tx: Option<String>,
}

/// Takes `sink`'s cursor for this transaction, or none when another instance holds it. An
/// advisory lock rather than `FOR UPDATE`: a row lock would give the transaction an id, which
/// would hold back every incremental reader for as long as a slow receiver takes.
pub async fn claim(conn: &mut PgConnection, sink: &str) -> sqlx::Result<Option<Position>> {
    if !super::locks::try_hold(conn, super::locks::Keyed::AuditCursor, sink).await? {
        return Ok(None);
    }
    Ok(sqlx::query!(
        "SELECT after_id, after_tx::text AS after_tx FROM audit_sink_cursors WHERE sink = $1",
        sink
    )
    .fetch_optional(conn)
    .await?
    .map(|r| Position {
        id: r.after_id,
        tx: r.after_tx,
    }))
}

/// Moves the cursor past a delivered batch.
pub async fn advance(
    conn: &mut PgConnection,
    sink: &str,
    to: &Position,
    rows: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE audit_sink_cursors SET after_id = $2, after_tx = ($3::text)::xid8,
                delivered = delivered + $4, last_error = NULL, updated_at = now()
         WHERE sink = $1",
        sink,
        to.id,
        to.tx.as_deref(),
        rows
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Records why the last delivery failed (the cursor stays).
pub async fn failed(pool: &PgPool, sink: &str, error: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE audit_sink_cursors SET last_error = $2, updated_at = now() WHERE sink = $1",
        sink,
        error
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Each sink's cursor, rows delivered, last error, and rows waiting (counted up to `cap`).
pub async fn status(
    pool: &PgPool,
    cap: i64,
) -> sqlx::Result<Vec<(String, i64, i64, Option<String>, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT s.sink, s.after_id, s.delivered, s.last_error,
                  (SELECT count(*) FROM (SELECT 1 FROM audit_events e
                     WHERE s.after_id = 0 OR (e.tx, e.id) > (s.after_tx, s.after_id)
                     LIMIT $1) w) AS "waiting!"
           FROM audit_sink_cursors s ORDER BY s.sink"#,
        cap
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.sink, r.after_id, r.delivered, r.last_error, r.waiting))
        .collect())
}
