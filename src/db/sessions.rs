//! Admin UI sessions: created at sign-in, checked on each request, ended by their person or
//! an admin.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;

/// The signed-in user behind a live session.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub username: String,
    pub role: String,
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
}

/// Stores a new session under the sha256 of its id, and drops expired ones while at it.
pub async fn create_session(
    pool: &PgPool,
    token_sha256: &str,
    user_id: Uuid,
    csrf_token: &str,
    expires_at: DateTime<Utc>,
    remote_addr: Option<&str>,
    user_agent: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM admin_sessions WHERE expires_at < now()")
        .execute(pool)
        .await?;
    sqlx::query!(
        "INSERT INTO admin_sessions (token_sha256, user_id, csrf_token, expires_at, remote_addr, user_agent)
         VALUES ($1, $2, $3, $4, $5, $6)",
        token_sha256,
        user_id,
        csrf_token,
        expires_at,
        remote_addr,
        user_agent,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The live session with this id hash: not past its absolute expiry, used within `idle`, and
/// of an enabled account (a disabled account's sessions fail here at once).
///
/// Using a session moves its idle deadline, but the row is written at most once per
/// [`TOUCH_EVERY_SECS`]: a write per page view makes each one wait for a WAL flush (measured:
/// p50 0.8 ms → 4.4 ms). The idle timeout is therefore exact to within that much.
pub async fn session(
    pool: &PgPool,
    token_sha256: &str,
    idle: std::time::Duration,
) -> sqlx::Result<Option<SessionRecord>> {
    let Some(r) = sqlx::query!(
        r#"SELECT u.username, u.role, s.csrf_token, s.expires_at,
                s.last_seen_at < now() - make_interval(secs => $3) AS "stale!"
         FROM admin_sessions s JOIN admin_users u ON u.id = s.user_id
         WHERE s.token_sha256 = $1 AND s.expires_at > now()
           AND s.last_seen_at > now() - make_interval(secs => $2) AND u.disabled_at IS NULL"#,
        token_sha256,
        idle.as_secs_f64(),
        TOUCH_EVERY_SECS,
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    if r.stale {
        // Still within the idle limit: a session that ran out meanwhile is not revived.
        sqlx::query!(
            "UPDATE admin_sessions SET last_seen_at = now()
             WHERE token_sha256 = $1 AND last_seen_at > now() - make_interval(secs => $2)",
            token_sha256,
            idle.as_secs_f64(),
        )
        .execute(pool)
        .await?;
    }
    Ok(Some(SessionRecord {
        username: r.username,
        role: r.role,
        csrf_token: r.csrf_token,
        expires_at: r.expires_at,
    }))
}

/// How stale a session's `last_seen_at` may get before a request writes it again.
pub const TOUCH_EVERY_SECS: f64 = 60.0;

pub async fn delete_session(pool: &PgPool, token_sha256: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM admin_sessions WHERE token_sha256 = $1",
        token_sha256,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The shown id of the session with this id hash.
pub async fn session_id(pool: &PgPool, token_sha256: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "SELECT id FROM admin_sessions WHERE token_sha256 = $1",
        token_sha256,
    )
    .fetch_optional(pool)
    .await
}

/// A session as an admin sees it in the account pages.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub remote_addr: Option<String>,
    pub user_agent: Option<String>,
}

/// The account's live sessions, newest first.
pub async fn sessions_of(pool: &PgPool, username: &str) -> sqlx::Result<Vec<SessionInfo>> {
    sqlx::query_as!(
        SessionInfo,
        "SELECT s.id, s.created_at, s.last_seen_at, s.expires_at, s.remote_addr, s.user_agent
         FROM admin_sessions s JOIN admin_users u ON u.id = s.user_id
         WHERE u.username = $1 AND s.expires_at > now()
         ORDER BY s.created_at DESC",
        username,
    )
    .fetch_all(pool)
    .await
}

pub(super) async fn delete_sessions_of(
    conn: &mut PgConnection,
    user_id: Uuid,
) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM admin_sessions WHERE user_id = $1", user_id)
            .execute(conn)
            .await?
            .rows_affected(),
    )
}

/// Ends one session of `username` (`Some(id)`) or all of them; how many ended, `None` if the
/// account is unknown.
pub async fn end_sessions(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    session: Option<Uuid>,
) -> sqlx::Result<Option<u64>> {
    let user: Option<Uuid> =
        sqlx::query_scalar!("SELECT id FROM admin_users WHERE username = $1", username)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(user) = user else { return Ok(None) };
    let ended = sqlx::query!(
        "DELETE FROM admin_sessions WHERE user_id = $1 AND ($2::uuid IS NULL OR id = $2)",
        user,
        session,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    record_change(
        conn,
        actor,
        AdminAction::AdminSessionEnd,
        &format!("admin_user:{username}"),
        None,
        Some(json!({"session": session, "ended": ended})),
    )
    .await?;
    Ok(Some(ended))
}

/// Ends the sessions of the federated account of `issuer` + `subject`, if there is one: the
/// provider no longer maps it to a role. How many ended.
pub async fn end_federated_sessions(
    conn: &mut PgConnection,
    issuer: &str,
    subject: &str,
) -> sqlx::Result<u64> {
    let user = sqlx::query!(
        "SELECT id, username FROM admin_users WHERE oidc_issuer = $1 AND oidc_subject = $2",
        issuer,
        subject,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(user) = user else {
        return Ok(0);
    };
    let (id, username) = (user.id, user.username);
    let ended = delete_sessions_of(conn, id).await?;
    if ended > 0 {
        record_change(
            conn,
            &format!("sso:{issuer}"),
            AdminAction::AdminSessionEnd,
            &format!("admin_user:{username}"),
            None,
            Some(json!({"ended": ended, "reason": "the provider's claims map to no role"})),
        )
        .await?;
    }
    Ok(ended)
}
