//! One-time password reset links of local accounts.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use super::sessions::delete_sessions_of;
use crate::audit::AdminAction;

/// Stores a reset link for a local account (replacing any earlier one); `false` if unknown.
pub async fn create_reset(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    token_sha256: &str,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let user: Option<Uuid> =
        sqlx::query_scalar!("SELECT id FROM admin_users WHERE username = $1", username)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(user) = user else { return Ok(false) };
    sqlx::query!(
        "DELETE FROM admin_password_resets WHERE user_id = $1 OR expires_at < now()",
        user,
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "INSERT INTO admin_password_resets (token_sha256, user_id, created_by, expires_at)
         VALUES ($1, $2, $3, $4)",
        token_sha256,
        user,
        actor,
        expires_at,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::AdminUserPasswordResetLink,
        &format!("admin_user:{username}"),
        None,
        Some(json!({"expires_at": expires_at})),
    )
    .await?;
    Ok(true)
}

/// The enabled local account a live reset link is for.
pub async fn reset_target(pool: &PgPool, token_sha256: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT u.username FROM admin_password_resets r JOIN admin_users u ON u.id = r.user_id
         WHERE r.token_sha256 = $1 AND r.expires_at > now() AND u.disabled_at IS NULL
           AND u.oidc_issuer IS NULL",
        token_sha256,
    )
    .fetch_optional(pool)
    .await
}

/// Uses a reset link once: sets the new password hash, deletes the link and ends every
/// session of the account. `None` if the link is unknown, used or expired.
pub async fn use_reset(
    conn: &mut PgConnection,
    token_sha256: &str,
    password_hash: &str,
) -> sqlx::Result<Option<String>> {
    let row = sqlx::query!(
        "DELETE FROM admin_password_resets r USING admin_users u
         WHERE r.token_sha256 = $1 AND u.id = r.user_id AND r.expires_at > now()
           AND u.disabled_at IS NULL AND u.oidc_issuer IS NULL
         RETURNING u.id, u.username",
        token_sha256,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let (user, username) = (row.id, row.username);
    sqlx::query!(
        "UPDATE admin_users SET password_hash = $2, updated_at = now() WHERE id = $1",
        user,
        password_hash,
    )
    .execute(&mut *conn)
    .await?;
    let ended = delete_sessions_of(conn, user).await?;
    record_change(
        conn,
        &format!("admin:{username}"),
        AdminAction::AdminUserPasswordSet,
        &format!("admin_user:{username}"),
        None,
        Some(json!({"sessions_ended": ended})),
    )
    .await?;
    Ok(Some(username))
}
