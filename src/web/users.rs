//! Admin accounts: created from the command line (`toolgate admin create-user`).

use crate::auth::secrets;
use crate::db;
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
            "role must be admin, auditor or viewer, not `{role}`"
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
    if !db::admin::create_user(&mut tx, actor, username, &hash, role.as_str()).await? {
        return Err(ServiceError::Conflict(format!(
            "an admin user `{username}` already exists"
        )));
    }
    tx.commit().await?;
    Ok(())
}
