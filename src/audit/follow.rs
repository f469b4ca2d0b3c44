//! Followers of the log (each sink, and the rollups): each reads the rows after its own cursor
//! in commit order, and moves the cursor in the same transaction as what it did with them, so
//! whichever instance holds the cursor, a row is handled once (at least once for a sink whose
//! receiver saw a batch the cursor did not record).

use sqlx::{PgConnection, PgPool};

use super::chain::ChainedEvent;
use crate::db;
use crate::db::sinks::Position;

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A cursor from before positions were kept whose row retention has dropped: where it
    /// stood in commit order is lost.
    #[error(
        "its cursor row {0} is gone (retention dropped it before delivery); reset the cursor in audit_sink_cursors"
    )]
    CursorGone(i64),
}

/// The rows after a cursor, and the position of the last.
pub struct Batch {
    pub rows: Vec<ChainedEvent>,
    /// The cursor before the batch: where to come back to if the receiver lost it.
    pub from: Position,
    pub last: Position,
}

/// Claims `cursor` for the transaction `conn` and reads up to `limit` rows after it; none
/// when another instance holds it or nothing is new.
pub async fn next(
    pool: &PgPool,
    conn: &mut PgConnection,
    cursor: &str,
    limit: i64,
) -> Result<Option<Batch>, FollowError> {
    let Some(mut at) = db::sinks::claim(conn, cursor).await? else {
        return Ok(None);
    };
    if at.id > 0 && at.tx.is_none() {
        at.tx = Some(
            db::audit::position(pool, at.id)
                .await?
                .ok_or(FollowError::CursorGone(at.id))?,
        );
    }
    let filter = db::audit::AuditFilter {
        after_id: Some(at.id),
        after_tx: at.tx,
        ..Default::default()
    };
    let rows = db::audit::list(pool, &filter, None, limit).await?;
    let from = Position {
        id: at.id,
        tx: filter.after_tx.clone(),
    };
    let Some(id) = rows.last().and_then(|r| r.id) else {
        return Ok(None);
    };
    // The row was just read, and rows are never deleted but by retention of old months.
    let tx = db::audit::position(pool, id).await?;
    Ok(Some(Batch {
        rows,
        from,
        last: Position { id, tx },
    }))
}

/// Moves `cursor` past `batch`, in the transaction that claimed it (committed by the caller).
/// Moves `cursor` back to `to`, so that the rows after it are delivered again; nothing when
/// another instance holds the cursor (it has its own connection, and its own view of it).
pub async fn rewind(pool: &PgPool, cursor: &str, to: &Position) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    if db::sinks::claim(&mut tx, cursor).await?.is_some() {
        db::sinks::advance(&mut tx, cursor, to, 0).await?;
    }
    tx.commit().await
}

pub async fn done(conn: &mut PgConnection, cursor: &str, batch: &Batch) -> sqlx::Result<()> {
    db::sinks::advance(conn, cursor, &batch.last, batch.rows.len() as i64).await
}
