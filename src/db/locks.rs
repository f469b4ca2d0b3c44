//! The advisory locks: every id in one place, so two uses cannot collide by accident.
//!
//! Each is a transaction lock (`pg_advisory_xact_lock`): held from the call until the
//! transaction commits or rolls back, across every instance on the database, and never
//! released by hand.

use sqlx::PgConnection;

/// What a lock serialises. The ids are what the database sees; they never change (an
/// instance of the old version and one of the new must take the same lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub enum Lock {
    /// Creating the first signing key: two instances starting on an empty database must not
    /// both create one.
    FirstSigningKey = 7470111,
    /// Applying the policies folder: a concurrent apply would compute its diff from a stale
    /// read.
    PolicyApply = 7470112,
    /// Appending to the control-plane audit chain: one writer at a time, so each event links
    /// to the one before it.
    ControlPlaneChain = 7470113,
    /// Pinned tools: recording held definitions and approving them, so a check that finds no
    /// approval cannot race an approval being written.
    Pins = 7470114,
}

/// Lock spaces keyed by a name (the second key is the name's hash); the first key is in the
/// 32-bit range the two-key form takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Keyed {
    /// Delivering one audit sink (or the rollup follower): one instance at a time.
    AuditCursor = 7470115,
}

/// Takes `space`/`name` for the rest of the caller's transaction if nobody holds it; false
/// when another session does. Unlike a row lock it gives the transaction no id, so holding it
/// does not hold back readers that wait for older transactions to end (`after_id`).
pub async fn try_hold(conn: &mut PgConnection, space: Keyed, name: &str) -> sqlx::Result<bool> {
    let space = space as i32;
    sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock($1, hashtext($2)) AS "held!""#,
        space,
        name
    )
    .fetch_one(&mut *conn)
    .await
}

/// Takes `lock` for the rest of the caller's transaction, waiting for whoever holds it.
pub async fn hold(conn: &mut PgConnection, lock: Lock) -> sqlx::Result<()> {
    let id = lock as i64;
    // The function returns `void`: the one row it answers carries nothing.
    sqlx::query_scalar!("SELECT pg_advisory_xact_lock($1)", id)
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}
