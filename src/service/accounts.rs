//! Accounts of people: what the account pages, the `/api/v1/users` API and `toolgate admin
//! create-user` do, with the rules they share (the last enabled admin stays, federated accounts
//! have no password to reset).

use super::{Plane, ServiceError};
use crate::auth::secrets::{self, random_token, sha256_hex};
use crate::db;
use crate::db::accounts::Account;
use crate::db::sessions::SessionInfo;

/// What an admin account may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Edits everything.
    Admin,
    /// Reads everything and exports the audit log; edits nothing.
    Auditor,
    /// Reads everything except tool arguments and results in the audit log.
    Viewer,
    /// May only act as agents (through an interactive host); no admin page lets it in.
    Member,
}

impl Role {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "admin" => Some(Role::Admin),
            "auditor" => Some(Role::Auditor),
            "viewer" => Some(Role::Viewer),
            "member" => Some(Role::Member),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Auditor => "auditor",
            Role::Viewer => "viewer",
            Role::Member => "member",
        }
    }

    /// Every role, most privileged first (the order in which a claim mapping picks one).
    pub const ALL: [Role; 4] = [Role::Admin, Role::Auditor, Role::Viewer, Role::Member];

    /// Whether the admin pages (other than [`MEMBER_PAGES`]) let this role in at all.
    pub fn can_use_admin_pages(self) -> bool {
        self != Role::Member
    }

    pub fn can_edit(self) -> bool {
        self == Role::Admin
    }

    pub fn can_export(self) -> bool {
        matches!(self, Role::Admin | Role::Auditor)
    }

    /// Tool arguments (and results, and messages quoting them) in the audit log.
    pub fn can_see_arguments(self) -> bool {
        matches!(self, Role::Admin | Role::Auditor)
    }
}

/// Shortest password accepted for an admin account.
pub const MIN_PASSWORD_CHARS: usize = 12;

/// Creates an account with an argon2id hash of `password`.
pub async fn create<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
    password: &str,
    role: &str,
) -> Result<(), ServiceError> {
    let username = crate::names::Username::parse(username)?;
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
    let mut tx = on.into().db().begin().await?;
    if !db::accounts::create_user(&mut tx, actor, &username, &hash, role.as_str()).await? {
        return Err(ServiceError::Conflict(format!(
            "an admin user `{username}` already exists"
        )));
    }
    tx.commit().await?;
    Ok(())
}

/// How long a password reset link works.
pub const RESET_MINUTES: i64 = 30;

pub async fn list<'a>(on: impl Into<Plane<'a>>) -> Result<Vec<Account>, ServiceError> {
    Ok(db::accounts::list(on.into().db()).await?)
}

pub async fn get<'a>(on: impl Into<Plane<'a>>, username: &str) -> Result<Account, ServiceError> {
    let mut conn = on.into().db().acquire().await?;
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
pub async fn set_disabled<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
    disabled: bool,
) -> Result<(), ServiceError> {
    let on = on.into();
    let mut tx = on.db().begin().await?;
    if disabled {
        keep_an_admin(&mut tx, username).await?;
    }
    if !db::accounts::set_disabled(&mut tx, actor, username, disabled).await? {
        return Err(missing(username));
    }
    tx.commit().await?;
    on.reload().await;
    Ok(())
}

pub async fn delete<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
) -> Result<(), ServiceError> {
    let on = on.into();
    let mut tx = on.db().begin().await?;
    keep_an_admin(&mut tx, username).await?;
    if !db::accounts::delete(&mut tx, actor, username).await? {
        return Err(missing(username));
    }
    tx.commit().await?;
    on.reload().await;
    Ok(())
}

/// Changes the role. A federated account's role comes back from the provider's claims at its
/// next sign-in; the change holds until then.
pub async fn set_role<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
    role: &str,
) -> Result<(), ServiceError> {
    let role = Role::parse(role).ok_or_else(|| {
        ServiceError::Invalid(format!(
            "role must be admin, auditor, viewer or member, not `{role}`"
        ))
    })?;
    let mut tx = on.into().db().begin().await?;
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

/// The link of a reset token. The token is in the query, which request logs leave out (they
/// record the path).
pub fn reset_url(state: &crate::state::AppState, token: &str) -> String {
    format!("{}/admin/reset?token={token}", state.settings.issuer)
}

/// A one-time reset link token for a local account (shown once; only its hash is stored),
/// and when it stops working.
pub async fn reset_link<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
) -> Result<(String, chrono::DateTime<chrono::Utc>), ServiceError> {
    let on = on.into();
    let account = get(on, username).await?;
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
    let token = random_token();
    let expires = chrono::Utc::now() + chrono::Duration::minutes(RESET_MINUTES);
    let mut tx = on.db().begin().await?;
    if !db::password_resets::create_reset(&mut tx, actor, username, &sha256_hex(&token), expires)
        .await?
    {
        return Err(missing(username));
    }
    tx.commit().await?;
    Ok((token, expires))
}

/// Sets a new password through a reset link, once; every session of the account ends.
pub async fn use_reset_link<'a>(
    on: impl Into<Plane<'a>>,
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
    let mut tx = on.into().db().begin().await?;
    let Some(username) = db::password_resets::use_reset(&mut tx, &sha256_hex(token), &hash).await?
    else {
        return Err(ServiceError::NotFound("reset link".into()));
    };
    tx.commit().await?;
    Ok(username)
}

pub async fn sessions<'a>(
    on: impl Into<Plane<'a>>,
    username: &str,
) -> Result<Vec<SessionInfo>, ServiceError> {
    let on = on.into();
    get(on, username).await?;
    Ok(db::sessions::sessions_of(on.db(), username).await?)
}

/// Ends one session (`Some(id)`) or all of an account's; how many ended.
pub async fn end_sessions<'a>(
    on: impl Into<Plane<'a>>,
    actor: &str,
    username: &str,
    session: Option<uuid::Uuid>,
) -> Result<u64, ServiceError> {
    let mut tx = on.into().db().begin().await?;
    let ended = db::sessions::end_sessions(&mut tx, actor, username, session)
        .await?
        .ok_or_else(|| missing(username))?;
    tx.commit().await?;
    Ok(ended)
}
