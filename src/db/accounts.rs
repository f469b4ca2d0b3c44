//! Account management: listing, enabling, disabling, deleting and re-roling admin UI accounts,
//! their sessions, one-time password reset links, and federated (OpenID Connect) accounts with
//! the sign-in flows in flight at the provider.
//!
//! Every change records an `admin.change` event in the same transaction (see
//! [`super::record_change`]).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::record_change;

/// An account as the account pages and the API show it (never its password hash).
#[derive(Debug, Clone)]
pub struct Account {
    pub id: Uuid,
    pub username: String,
    pub role: String,
    pub disabled: bool,
    /// The OpenID Provider that vouches for this account; `None` for a local account.
    pub oidc_issuer: Option<String>,
    pub has_password: bool,
    pub created_at: DateTime<Utc>,
    pub last_sign_in_at: Option<DateTime<Utc>>,
    /// Live sessions (not expired; the idle timeout is not applied here).
    pub sessions: i64,
}

const ACCOUNT_COLUMNS: &str = "u.id, u.username, u.role, u.disabled_at IS NOT NULL, u.oidc_issuer,
    u.password_hash IS NOT NULL, u.created_at, u.last_sign_in_at,
    (SELECT count(*) FROM admin_sessions s WHERE s.user_id = u.id AND s.expires_at > now())";

fn account(r: &sqlx::postgres::PgRow) -> Account {
    Account {
        id: r.get(0),
        username: r.get(1),
        role: r.get(2),
        disabled: r.get(3),
        oidc_issuer: r.get(4),
        has_password: r.get(5),
        created_at: r.get(6),
        last_sign_in_at: r.get(7),
        sessions: r.get(8),
    }
}

/// Every account, by username.
pub async fn list(pool: &PgPool) -> sqlx::Result<Vec<Account>> {
    Ok(sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM admin_users u ORDER BY u.username"
    ))
    .fetch_all(pool)
    .await?
    .iter()
    .map(account)
    .collect())
}

pub async fn get(conn: &mut PgConnection, username: &str) -> sqlx::Result<Option<Account>> {
    Ok(sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM admin_users u WHERE u.username = $1"
    ))
    .bind(username)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(account))
}

/// Locks the rows of every enabled admin for the rest of the transaction and returns their
/// usernames, so two concurrent changes cannot both remove "the other" last admin.
pub async fn lock_enabled_admins(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT username FROM admin_users WHERE role = 'admin' AND disabled_at IS NULL
         ORDER BY id FOR UPDATE",
    )
    .fetch_all(conn)
    .await
}

/// Disables or enables an account; disabling also ends its sessions and revokes what hosts it
/// authorized may do for it. `false` if unknown.
pub async fn set_disabled(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    disabled: bool,
) -> sqlx::Result<bool> {
    let id: Option<Uuid> = sqlx::query_scalar(
        "UPDATE admin_users
         SET disabled_at = CASE WHEN $2 THEN COALESCE(disabled_at, now()) ELSE NULL END,
             updated_at = now()
         WHERE username = $1 RETURNING id",
    )
    .bind(username)
    .bind(disabled)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(id) = id else { return Ok(false) };
    let (ended, hosts) = if disabled {
        (
            delete_sessions_of(conn, id).await?,
            super::authorizations::revoke_all_of(conn, actor, username, "the account is disabled")
                .await?,
        )
    } else {
        (0, 0)
    };
    record_change(
        conn,
        actor,
        if disabled {
            "admin_user.disable"
        } else {
            "admin_user.enable"
        },
        &format!("admin_user:{username}"),
        None,
        Some(json!({"disabled": disabled, "sessions_ended": ended, "host_authorizations_revoked": hosts})),
    )
    .await?;
    Ok(true)
}

/// Changes an account's role; `None` if unknown, else the role it had.
pub async fn set_role(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    role: &str,
) -> sqlx::Result<Option<String>> {
    let before: Option<String> = sqlx::query_scalar(
        "UPDATE admin_users u SET role = $2, updated_at = now()
         FROM (SELECT id, role FROM admin_users WHERE username = $1 FOR UPDATE) old
         WHERE u.id = old.id RETURNING old.role",
    )
    .bind(username)
    .bind(role)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(before) = &before {
        record_change(
            conn,
            actor,
            "admin_user.role",
            &format!("admin_user:{username}"),
            Some(json!({"role": before})),
            Some(json!({"role": role})),
        )
        .await?;
    }
    Ok(before)
}

/// Deletes an account (its sessions and reset links go with it, its host authorizations are
/// revoked); `false` if unknown.
pub async fn delete(conn: &mut PgConnection, actor: &str, username: &str) -> sqlx::Result<bool> {
    let role: Option<String> =
        sqlx::query_scalar("DELETE FROM admin_users WHERE username = $1 RETURNING role")
            .bind(username)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(role) = role else { return Ok(false) };
    super::authorizations::revoke_all_of(conn, actor, username, "the account is deleted").await?;
    record_change(
        conn,
        actor,
        "admin_user.delete",
        &format!("admin_user:{username}"),
        Some(json!({"username": username, "role": role})),
        None,
    )
    .await?;
    Ok(true)
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
    Ok(sqlx::query(
        "SELECT s.id, s.created_at, s.last_seen_at, s.expires_at, s.remote_addr, s.user_agent
         FROM admin_sessions s JOIN admin_users u ON u.id = s.user_id
         WHERE u.username = $1 AND s.expires_at > now()
         ORDER BY s.created_at DESC",
    )
    .bind(username)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| SessionInfo {
        id: r.get(0),
        created_at: r.get(1),
        last_seen_at: r.get(2),
        expires_at: r.get(3),
        remote_addr: r.get(4),
        user_agent: r.get(5),
    })
    .collect())
}

async fn delete_sessions_of(conn: &mut PgConnection, user_id: Uuid) -> sqlx::Result<u64> {
    Ok(sqlx::query("DELETE FROM admin_sessions WHERE user_id = $1")
        .bind(user_id)
        .execute(conn)
        .await?
        .rows_affected())
}

/// Ends one session of `username` (`Some(id)`) or all of them; how many ended, `None` if the
/// account is unknown.
pub async fn end_sessions(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    session: Option<Uuid>,
) -> sqlx::Result<Option<u64>> {
    let user: Option<Uuid> = sqlx::query_scalar("SELECT id FROM admin_users WHERE username = $1")
        .bind(username)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(user) = user else { return Ok(None) };
    let ended = sqlx::query(
        "DELETE FROM admin_sessions WHERE user_id = $1 AND ($2::uuid IS NULL OR id = $2)",
    )
    .bind(user)
    .bind(session)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    record_change(
        conn,
        actor,
        "admin_session.end",
        &format!("admin_user:{username}"),
        None,
        Some(json!({"session": session, "ended": ended})),
    )
    .await?;
    Ok(Some(ended))
}

/// Stores a reset link for a local account (replacing any earlier one); `false` if unknown.
pub async fn create_reset(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    token_sha256: &str,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let user: Option<Uuid> = sqlx::query_scalar("SELECT id FROM admin_users WHERE username = $1")
        .bind(username)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(user) = user else { return Ok(false) };
    sqlx::query("DELETE FROM admin_password_resets WHERE user_id = $1 OR expires_at < now()")
        .bind(user)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO admin_password_resets (token_sha256, user_id, created_by, expires_at)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(token_sha256)
    .bind(user)
    .bind(actor)
    .bind(expires_at)
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        "admin_user.password_reset_link",
        &format!("admin_user:{username}"),
        None,
        Some(json!({"expires_at": expires_at})),
    )
    .await?;
    Ok(true)
}

/// The enabled local account a live reset link is for.
pub async fn reset_target(pool: &PgPool, token_sha256: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT u.username FROM admin_password_resets r JOIN admin_users u ON u.id = r.user_id
         WHERE r.token_sha256 = $1 AND r.expires_at > now() AND u.disabled_at IS NULL
           AND u.oidc_issuer IS NULL",
    )
    .bind(token_sha256)
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
    let row: Option<(Uuid, String)> = sqlx::query_as(
        "DELETE FROM admin_password_resets r USING admin_users u
         WHERE r.token_sha256 = $1 AND u.id = r.user_id AND r.expires_at > now()
           AND u.disabled_at IS NULL AND u.oidc_issuer IS NULL
         RETURNING u.id, u.username",
    )
    .bind(token_sha256)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((user, username)) = row else {
        return Ok(None);
    };
    sqlx::query("UPDATE admin_users SET password_hash = $2, updated_at = now() WHERE id = $1")
        .bind(user)
        .bind(password_hash)
        .execute(&mut *conn)
        .await?;
    let ended = delete_sessions_of(conn, user).await?;
    record_change(
        conn,
        &format!("admin:{username}"),
        "admin_user.password_set",
        &format!("admin_user:{username}"),
        None,
        Some(json!({"sessions_ended": ended})),
    )
    .await?;
    Ok(Some(username))
}

/// What a federated sign-in found or made.
#[derive(Debug, Clone)]
pub enum Federated {
    /// An enabled account, with the role it now has.
    Account { id: Uuid, username: String },
    /// The account exists and is disabled.
    Disabled { username: String },
}

/// Finds the account of `issuer` + `subject`, or provisions it under the first free username
/// of `candidates`; sets its role to `role` when that changed. Never links to an account made
/// another way: a local `alice` and the provider's `alice` are different accounts.
pub async fn sign_in_federated(
    conn: &mut PgConnection,
    issuer: &str,
    subject: &str,
    candidates: &[String],
    role: &str,
) -> sqlx::Result<Federated> {
    let actor = format!("sso:{issuer}");
    let found: Option<(Uuid, String, String, bool)> = sqlx::query_as(
        "SELECT id, username, role, disabled_at IS NOT NULL FROM admin_users
         WHERE oidc_issuer = $1 AND oidc_subject = $2 FOR UPDATE",
    )
    .bind(issuer)
    .bind(subject)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((id, username, old_role, disabled)) = found {
        if disabled {
            return Ok(Federated::Disabled { username });
        }
        if old_role != role {
            sqlx::query("UPDATE admin_users SET role = $2, updated_at = now() WHERE id = $1")
                .bind(id)
                .bind(role)
                .execute(&mut *conn)
                .await?;
            record_change(
                conn,
                &actor,
                "admin_user.role",
                &format!("admin_user:{username}"),
                Some(json!({"role": old_role})),
                Some(json!({"role": role, "reason": "mapped from the provider's claims"})),
            )
            .await?;
        }
        touch_sign_in(conn, id).await?;
        return Ok(Federated::Account { id, username });
    }
    for username in candidates {
        let id = Uuid::now_v7();
        let inserted = sqlx::query(
            "INSERT INTO admin_users (id, username, password_hash, role, oidc_issuer, oidc_subject, last_sign_in_at)
             VALUES ($1, $2, NULL, $3, $4, $5, now())
             ON CONFLICT (username) DO NOTHING",
        )
        .bind(id)
        .bind(username)
        .bind(role)
        .bind(issuer)
        .bind(subject)
        .execute(&mut *conn)
        .await?;
        if inserted.rows_affected() == 1 {
            record_change(
                conn,
                &actor,
                "admin_user.create",
                &format!("admin_user:{username}"),
                None,
                Some(json!({"username": username, "role": role, "issuer": issuer, "subject": subject})),
            )
            .await?;
            return Ok(Federated::Account {
                id,
                username: username.clone(),
            });
        }
    }
    Err(sqlx::Error::Protocol(
        "no free username for a federated account".into(),
    ))
}

/// Records the time of a successful sign-in.
pub async fn touch_sign_in(conn: &mut PgConnection, user_id: Uuid) -> sqlx::Result<()> {
    sqlx::query("UPDATE admin_users SET last_sign_in_at = now() WHERE id = $1")
        .bind(user_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A sign-in sent to the provider, waiting for its callback.
#[derive(Debug, Clone)]
pub struct SsoFlow {
    pub nonce: String,
    pub pkce_verifier: String,
    pub next_url: String,
}

/// Stores a flow under the hash of its `state`, and drops expired ones while at it.
pub async fn insert_flow(
    pool: &PgPool,
    state_sha256: &str,
    flow: &SsoFlow,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM admin_sso_flows WHERE expires_at < now()")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO admin_sso_flows (state_sha256, nonce, pkce_verifier, next_url, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(state_sha256)
    .bind(&flow.nonce)
    .bind(&flow.pkce_verifier)
    .bind(&flow.next_url)
    .bind(expires_at)
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes a live flow out (a callback is answered once).
pub async fn take_flow(pool: &PgPool, state_sha256: &str) -> sqlx::Result<Option<SsoFlow>> {
    Ok(sqlx::query(
        "DELETE FROM admin_sso_flows WHERE state_sha256 = $1 AND expires_at > now()
         RETURNING nonce, pkce_verifier, next_url",
    )
    .bind(state_sha256)
    .fetch_optional(pool)
    .await?
    .map(|r| SsoFlow {
        nonce: r.get(0),
        pkce_verifier: r.get(1),
        next_url: r.get(2),
    }))
}

/// Ends the sessions of the federated account of `issuer` + `subject`, if there is one: the
/// provider no longer maps it to a role. How many ended.
pub async fn end_federated_sessions(
    conn: &mut PgConnection,
    issuer: &str,
    subject: &str,
) -> sqlx::Result<u64> {
    let user: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, username FROM admin_users WHERE oidc_issuer = $1 AND oidc_subject = $2",
    )
    .bind(issuer)
    .bind(subject)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((id, username)) = user else {
        return Ok(0);
    };
    let ended = delete_sessions_of(conn, id).await?;
    if ended > 0 {
        record_change(
            conn,
            &format!("sso:{issuer}"),
            "admin_session.end",
            &format!("admin_user:{username}"),
            None,
            Some(json!({"ended": ended, "reason": "the provider's claims map to no role"})),
        )
        .await?;
    }
    Ok(ended)
}
