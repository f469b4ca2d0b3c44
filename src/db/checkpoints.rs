//! Signed checkpoints of the audit chains.

use futures::StreamExt;
use sqlx::{PgConnection, PgPool};

use crate::audit::checkpoint::SignedCheckpoint;

/// Stores a signed checkpoint.
pub async fn insert_checkpoint(pool: &PgPool, c: &SignedCheckpoint) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO audit_checkpoints (at, key_id, body, signature) VALUES ($1, $2, $3, $4) RETURNING id",
        c.at,
        &c.key_id,
        &c.body,
        &c.signature,
    )
    .fetch_one(pool)
    .await
}

/// Calls `each` on every stored checkpoint with an id above `after`, oldest first, one row
/// in memory at a time (a serving instance signs one every few seconds while rows arrive).
pub async fn each_checkpoint<E: From<sqlx::Error>>(
    conn: &mut PgConnection,
    after: Option<i64>,
    mut each: impl FnMut(SignedCheckpoint) -> Result<(), E>,
) -> Result<(), E> {
    let mut rows = sqlx::query!(
        "SELECT id, at, key_id, body, signature FROM audit_checkpoints WHERE id > $1 ORDER BY id",
        after.unwrap_or(0),
    )
    .fetch(&mut *conn);
    while let Some(row) = rows.next().await {
        let r = row?;
        each(SignedCheckpoint {
            id: Some(r.id),
            at: r.at,
            key_id: r.key_id,
            body: r.body,
            signature: r.signature,
        })?;
    }
    Ok(())
}

/// The stored checkpoints a verifier needs (see [`Needed`]): per key and chain, the one
/// that signed the chain furthest.
///
/// [`Needed`]: crate::audit::checkpoint::Needed
pub async fn needed_checkpoints(conn: &mut PgConnection) -> sqlx::Result<Vec<SignedCheckpoint>> {
    let mut needed = crate::audit::checkpoint::Needed::default();
    each_checkpoint::<sqlx::Error>(conn, None, |c| {
        needed.offer(c);
        Ok(())
    })
    .await?;
    Ok(needed.into_vec())
}
