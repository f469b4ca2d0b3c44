//! Token signing keys: the first one, and rotation.

use sqlx::PgPool;

use super::Plane;
use crate::auth::keys;
use crate::db;

/// Creates the first signing key if the database has none.
pub async fn ensure_first(pool: &PgPool) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    // Two instances starting on an empty database must not both create a key.
    db::locks::hold(&mut tx, db::locks::Lock::FirstSigningKey).await?;
    if !db::keys::has_signing_key(&mut tx).await? {
        let key = keys::generate()?;
        db::keys::insert_signing_key(
            &mut tx,
            "toolgate",
            &key.kid,
            &key.private_pkcs8,
            &key.public_key,
        )
        .await?;
        tracing::info!(kid = %key.kid, "created the first token signing key");
    }
    tx.commit().await?;
    Ok(())
}

/// Rotates the signing key; returns the new kid.
pub async fn rotate<'a>(on: impl Into<Plane<'a>>, actor: &str) -> anyhow::Result<String> {
    let on = on.into();
    let key = keys::generate()?;
    let mut tx = on.db().begin().await?;
    db::keys::insert_signing_key(
        &mut tx,
        actor,
        &key.kid,
        &key.private_pkcs8,
        &key.public_key,
    )
    .await?;
    tx.commit().await?;
    Ok(key.kid)
}
