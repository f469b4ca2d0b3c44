//! Token signing keys: the current one signs, it and the one before it verify.

use serde_json::json;
use sqlx::{PgConnection, PgPool};

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::VerifyKey;

/// The key that signs new tokens.
pub struct SigningKey {
    pub kid: String,
    pub private_pkcs8: Vec<u8>,
}

pub async fn current_signing_key(pool: &PgPool) -> sqlx::Result<Option<SigningKey>> {
    sqlx::query_as!(
        SigningKey,
        "SELECT kid, private_pkcs8 FROM signing_keys WHERE retired_at IS NULL
         ORDER BY created_at DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await
}

/// Adds a new signing key and retires the others from signing (they still verify until the
/// next rotation).
pub async fn insert_signing_key(
    conn: &mut PgConnection,
    actor: &str,
    kid: &str,
    private_pkcs8: &[u8],
    public_key: &[u8],
) -> sqlx::Result<()> {
    sqlx::query!("UPDATE signing_keys SET retired_at = now() WHERE retired_at IS NULL")
        .execute(&mut *conn)
        .await?;
    sqlx::query!(
        "INSERT INTO signing_keys (kid, algorithm, private_pkcs8, public_key)
         VALUES ($1, 'EdDSA', $2, $3)",
        kid,
        private_pkcs8,
        public_key,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::KeyRotate,
        &format!("key:{kid}"),
        None,
        Some(json!({"kid": kid})),
    )
    .await
}

pub async fn has_signing_key(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM signing_keys WHERE retired_at IS NULL) AS "exists!""#
    )
    .fetch_one(&mut *conn)
    .await
}

/// Public keys to publish in JWKS (current and previous).
pub async fn published_keys(pool: &PgPool) -> sqlx::Result<Vec<VerifyKey>> {
    let mut conn = pool.acquire().await?;
    verify_keys(&mut conn).await
}

/// The signing key and the one before it: JWKS publishes both so rotation does not cut off
/// tokens already issued.
pub(super) async fn verify_keys(conn: &mut PgConnection) -> sqlx::Result<Vec<VerifyKey>> {
    sqlx::query_as!(
        VerifyKey,
        "SELECT kid, public_key FROM signing_keys ORDER BY created_at DESC LIMIT 2"
    )
    .fetch_all(&mut *conn)
    .await
}
