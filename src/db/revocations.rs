//! Revoked access tokens, kept until they would have expired anyway.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;

pub async fn revoke(
    conn: &mut PgConnection,
    actor: &str,
    jti: Uuid,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO revoked_tokens (jti, expires_at, revoked_by) VALUES ($1, $2, $3)
         ON CONFLICT (jti) DO NOTHING",
        jti,
        expires_at,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::TokenRevoke,
        &format!("token:{jti}"),
        None,
        Some(json!({"jti": jti})),
    )
    .await
}

/// Drops revocations of tokens that have expired anyway.
pub async fn prune_revocations(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM revoked_tokens WHERE expires_at < now() - interval '1 hour'")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}

/// The ids of revoked tokens that have not expired yet, for the policy snapshot.
pub(super) async fn live(conn: &mut PgConnection) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!("SELECT jti FROM revoked_tokens WHERE expires_at > now()")
        .fetch_all(&mut *conn)
        .await
}
