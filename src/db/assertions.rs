//! Client-assertion ids already used: RFC 7523 single use, shared by every instance.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Longest `client_id` stored (the column's check says the same).
pub const MAX_CLIENT_ID: usize = 128;
/// Longest `jti` stored (the column's check says the same).
pub const MAX_JTI: usize = 256;

/// Records `(client_id, jti)` as used until `expires_at`; `true` if this is its first use.
///
/// One statement decides, so two instances racing with the same assertion cannot both see a
/// first use. A row left over from an assertion that has expired (not yet pruned) does not
/// block a new assertion reusing the id after it.
pub async fn first_use(
    pool: &PgPool,
    client_id: &str,
    jti: &str,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "INSERT INTO used_client_assertions AS u (client_id, jti, expires_at) VALUES ($1, $2, $3)
         ON CONFLICT (client_id, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at
         WHERE u.expires_at < now()",
        client_id,
        jti,
        expires_at,
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Deletes the ids of assertions that can no longer be presented; returns how many.
pub async fn prune(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM used_client_assertions WHERE expires_at < now()")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
