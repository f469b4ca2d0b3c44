//! Admin UI accounts: local and federated (OpenID Connect), their roles, enabling, disabling
//! and deleting them.
//!
//! Every change records an `admin.change` event in the same transaction (see
//! [`super::record_change`]).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use super::sessions::delete_sessions_of;
use crate::audit::AdminAction;

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
    /// The approver sets this person belongs to, beside their role.
    pub approver_sets: Vec<String>,
}

/// `SELECT`s [`Account`]s, the rest of the query (`$rest`: a string literal) saying which. A
/// macro, so that the one list of columns is checked in each query: the query macros take
/// only string literals, joined by `+`.
macro_rules! select_accounts {
    ($rest:literal $(, $arg:expr)*) => {
        sqlx::query_as!(
            Account,
            r#"SELECT u.id, u.username, u.role, u.disabled_at IS NOT NULL AS "disabled!",
                   u.oidc_issuer, u.password_hash IS NOT NULL AS "has_password!", u.created_at,
                   u.last_sign_in_at,
                   (SELECT count(*) FROM admin_sessions s
                    WHERE s.user_id = u.id AND s.expires_at > now()) AS "sessions!",
                   u.approver_sets
               FROM admin_users u "# + $rest
            $(, $arg)*
        )
    };
}

/// Every account, by username.
pub async fn list(pool: &PgPool) -> sqlx::Result<Vec<Account>> {
    select_accounts!("ORDER BY u.username")
        .fetch_all(pool)
        .await
}

pub async fn get(conn: &mut PgConnection, username: &str) -> sqlx::Result<Option<Account>> {
    select_accounts!("WHERE u.username = $1", username)
        .fetch_optional(conn)
        .await
}

/// Locks the rows of every enabled admin for the rest of the transaction and returns their
/// usernames, so two concurrent changes cannot both remove "the other" last admin.
pub async fn lock_enabled_admins(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT username FROM admin_users WHERE role = 'admin' AND disabled_at IS NULL
         ORDER BY id FOR UPDATE"
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
    let id: Option<Uuid> = sqlx::query_scalar!(
        "UPDATE admin_users
         SET disabled_at = CASE WHEN $2 THEN COALESCE(disabled_at, now()) ELSE NULL END,
             updated_at = now()
         WHERE username = $1 RETURNING id",
        username,
        disabled,
    )
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
            AdminAction::AdminUserDisable
        } else {
            AdminAction::AdminUserEnable
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
    let before: Option<String> = sqlx::query_scalar!(
        "UPDATE admin_users u SET role = $2, updated_at = now()
         FROM (SELECT id, role FROM admin_users WHERE username = $1 FOR UPDATE) old
         WHERE u.id = old.id RETURNING old.role",
        username,
        role,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(before) = &before {
        record_change(
            conn,
            actor,
            AdminAction::AdminUserRole,
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
    let role: Option<String> = sqlx::query_scalar!(
        "DELETE FROM admin_users WHERE username = $1 RETURNING role",
        username,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(role) = role else { return Ok(false) };
    super::authorizations::revoke_all_of(conn, actor, username, "the account is deleted").await?;
    record_change(
        conn,
        actor,
        AdminAction::AdminUserDelete,
        &format!("admin_user:{username}"),
        Some(json!({"username": username, "role": role})),
        None,
    )
    .await?;
    Ok(true)
}

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

/// Creates an account; `false` if the username is taken.
pub async fn create_user(
    conn: &mut PgConnection,
    actor: &str,
    username: &str,
    password_hash: &str,
    role: &str,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query!(
        "INSERT INTO admin_users (id, username, password_hash, role) VALUES ($1, $2, $3, $4)
         ON CONFLICT (username) DO NOTHING",
        Uuid::now_v7(),
        username,
        password_hash,
        role,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        AdminAction::AdminUserCreate,
        &format!("admin_user:{username}"),
        None,
        Some(json!({"username": username, "role": role})),
    )
    .await?;
    Ok(true)
}

pub async fn find_user(pool: &PgPool, username: &str) -> sqlx::Result<Option<AdminUserRecord>> {
    sqlx::query_as!(
        AdminUserRecord,
        r#"SELECT id, username, password_hash, role, disabled_at IS NOT NULL AS "disabled!"
           FROM admin_users WHERE username = $1"#,
        username,
    )
    .fetch_optional(pool)
    .await
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
    let found = sqlx::query!(
        r#"SELECT id, username, role, disabled_at IS NOT NULL AS "disabled!" FROM admin_users
           WHERE oidc_issuer = $1 AND oidc_subject = $2 FOR UPDATE"#,
        issuer,
        subject,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(found) = found {
        let (id, username, old_role) = (found.id, found.username, found.role);
        if found.disabled {
            return Ok(Federated::Disabled { username });
        }
        if old_role != role {
            sqlx::query!(
                "UPDATE admin_users SET role = $2, updated_at = now() WHERE id = $1",
                id,
                role,
            )
            .execute(&mut *conn)
            .await?;
            record_change(
                conn,
                &actor,
                AdminAction::AdminUserRole,
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
        let inserted = sqlx::query!(
            "INSERT INTO admin_users (id, username, password_hash, role, oidc_issuer, oidc_subject, last_sign_in_at)
             VALUES ($1, $2, NULL, $3, $4, $5, now())
             ON CONFLICT (username) DO NOTHING",
            id,
            username,
            role,
            issuer,
            subject,
        )
        .execute(&mut *conn)
        .await?;
        if inserted.rows_affected() == 1 {
            record_change(
                conn,
                &actor,
                AdminAction::AdminUserCreate,
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
    sqlx::query!(
        "UPDATE admin_users SET last_sign_in_at = now() WHERE id = $1",
        user_id,
    )
    .execute(conn)
    .await?;
    Ok(())
}
