//! Admin accounts: what the account pages, the `/api/v1/users` API and `toolgate admin
//! create-user` do, with the rules they share (the last enabled admin stays, federated accounts
//! have no password to reset).

use crate::auth::secrets;
use crate::db;
use crate::db::accounts::Account;
use crate::db::sessions::SessionInfo;
use crate::service::ServiceError;

use super::Role;

/// Shortest password accepted for an admin account.
pub const MIN_PASSWORD_CHARS: usize = 12;

/// Creates an account with an argon2id hash of `password`.
pub async fn create_user(
    pool: &sqlx::PgPool,
    actor: &str,
    username: &str,
    password: &str,
    role: &str,
) -> Result<(), ServiceError> {
    if username.is_empty()
        || username.len() > 64
        || !username
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
    {
        return Err(ServiceError::Invalid(format!(
            "username `{username}` must be 1-64 letters, digits, `_`, `.`, `@` or `-`"
        )));
    }
    let role = Role::parse(role).ok_or_else(|| {
        ServiceError::Invalid(format!(
            "role must be admin, auditor, viewer or member, not `{role}`"
        ))
    })?;
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(ServiceError::Invalid(format!(
            "the password must have at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    let password = password.to_owned();
    let hash = tokio::task::spawn_blocking(move || secrets::hash(&password))
        .await
        .map_err(anyhow::Error::from)??;
    let mut tx = pool.begin().await?;
    if !db::accounts::create_user(&mut tx, actor, username, &hash, role.as_str()).await? {
        return Err(ServiceError::Conflict(format!(
            "an admin user `{username}` already exists"
        )));
    }
    tx.commit().await?;
    Ok(())
}

/// How long a password reset link works.
pub const RESET_MINUTES: i64 = 30;

pub async fn list(pool: &sqlx::PgPool) -> Result<Vec<Account>, ServiceError> {
    Ok(db::accounts::list(pool).await?)
}

pub async fn get(pool: &sqlx::PgPool, username: &str) -> Result<Account, ServiceError> {
    let mut conn = pool.acquire().await?;
    db::accounts::get(&mut conn, username)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("account `{username}`")))
}

fn missing(username: &str) -> ServiceError {
    ServiceError::NotFound(format!("account `{username}`"))
}

/// Refuses a change that would leave no enabled admin (nobody could then manage accounts),
/// with the admin rows locked until the caller's transaction ends.
async fn keep_an_admin(conn: &mut sqlx::PgConnection, username: &str) -> Result<(), ServiceError> {
    let admins = db::accounts::lock_enabled_admins(conn).await?;
    if admins.len() == 1 && admins[0] == username {
        return Err(ServiceError::Conflict(format!(
            "`{username}` is the last enabled admin; make another account admin first"
        )));
    }
    Ok(())
}

/// Disables (ending its sessions at once) or enables an account.
pub async fn set_disabled(
    state: &crate::state::AppState,
    actor: &str,
    username: &str,
    disabled: bool,
) -> Result<(), ServiceError> {
    let mut tx = state.db.begin().await?;
    if disabled {
        keep_an_admin(&mut tx, username).await?;
    }
    if !db::accounts::set_disabled(&mut tx, actor, username, disabled).await? {
        return Err(missing(username));
    }
    tx.commit().await?;
    refresh_hosts(state).await;
    Ok(())
}

/// Host tokens of a disabled or deleted person must fail on their next request here, not
/// only once NOTIFY has reached this instance.
async fn refresh_hosts(state: &crate::state::AppState) {
    if let Err(e) = state.reload_policy().await {
        tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
    }
}

pub async fn delete(
    state: &crate::state::AppState,
    actor: &str,
    username: &str,
) -> Result<(), ServiceError> {
    let mut tx = state.db.begin().await?;
    keep_an_admin(&mut tx, username).await?;
    if !db::accounts::delete(&mut tx, actor, username).await? {
        return Err(missing(username));
    }
    tx.commit().await?;
    refresh_hosts(state).await;
    Ok(())
}

/// Changes the role. A federated account's role comes back from the provider's claims at its
/// next sign-in; the change holds until then.
pub async fn set_role(
    pool: &sqlx::PgPool,
    actor: &str,
    username: &str,
    role: &str,
) -> Result<(), ServiceError> {
    let role = Role::parse(role).ok_or_else(|| {
        ServiceError::Invalid(format!(
            "role must be admin, auditor, viewer or member, not `{role}`"
        ))
    })?;
    let mut tx = pool.begin().await?;
    if role != Role::Admin {
        keep_an_admin(&mut tx, username).await?;
    }
    if db::accounts::set_role(&mut tx, actor, username, role.as_str())
        .await?
        .is_none()
    {
        return Err(missing(username));
    }
    tx.commit().await?;
    Ok(())
}

/// A one-time reset link token for a local account (shown once; only its hash is stored),
/// and when it stops working.
pub async fn reset_link(
    pool: &sqlx::PgPool,
    actor: &str,
    username: &str,
) -> Result<(String, chrono::DateTime<chrono::Utc>), ServiceError> {
    let account = get(pool, username).await?;
    if account.oidc_issuer.is_some() {
        return Err(ServiceError::Invalid(format!(
            "`{username}` signs in through the OpenID Provider and has no password here"
        )));
    }
    if account.disabled {
        return Err(ServiceError::Invalid(format!(
            "`{username}` is disabled; enable it first"
        )));
    }
    let token = super::session::random_token();
    let expires = chrono::Utc::now() + chrono::Duration::minutes(RESET_MINUTES);
    let mut tx = pool.begin().await?;
    if !db::password_resets::create_reset(
        &mut tx,
        actor,
        username,
        &super::session::sha256_hex(&token),
        expires,
    )
    .await?
    {
        return Err(missing(username));
    }
    tx.commit().await?;
    Ok((token, expires))
}

/// Sets a new password through a reset link, once; every session of the account ends.
pub async fn use_reset_link(
    pool: &sqlx::PgPool,
    token: &str,
    password: &str,
) -> Result<String, ServiceError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(ServiceError::Invalid(format!(
            "the password must have at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    if password.len() > 1024 {
        return Err(ServiceError::Invalid("the password is too long".into()));
    }
    let password = password.to_owned();
    let hash = tokio::task::spawn_blocking(move || secrets::hash(&password))
        .await
        .map_err(anyhow::Error::from)??;
    let mut tx = pool.begin().await?;
    let Some(username) =
        db::password_resets::use_reset(&mut tx, &super::session::sha256_hex(token), &hash).await?
    else {
        return Err(ServiceError::NotFound("reset link".into()));
    };
    tx.commit().await?;
    Ok(username)
}

pub async fn sessions(
    pool: &sqlx::PgPool,
    username: &str,
) -> Result<Vec<SessionInfo>, ServiceError> {
    get(pool, username).await?;
    Ok(db::sessions::sessions_of(pool, username).await?)
}

/// Ends one session (`Some(id)`) or all of an account's; how many ended.
pub async fn end_sessions(
    pool: &sqlx::PgPool,
    actor: &str,
    username: &str,
    session: Option<uuid::Uuid>,
) -> Result<u64, ServiceError> {
    let mut tx = pool.begin().await?;
    let ended = db::sessions::end_sessions(&mut tx, actor, username, session)
        .await?
        .ok_or_else(|| missing(username))?;
    tx.commit().await?;
    Ok(ended)
}
