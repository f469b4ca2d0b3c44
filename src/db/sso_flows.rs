//! Sign-ins sent to the OpenID Provider, waiting for its callback.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

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
    sqlx::query!("DELETE FROM admin_sso_flows WHERE expires_at < now()")
        .execute(pool)
        .await?;
    sqlx::query!(
        "INSERT INTO admin_sso_flows (state_sha256, nonce, pkce_verifier, next_url, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
        state_sha256,
        &flow.nonce,
        &flow.pkce_verifier,
        &flow.next_url,
        expires_at,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes a live flow out (a callback is answered once).
pub async fn take_flow(pool: &PgPool, state_sha256: &str) -> sqlx::Result<Option<SsoFlow>> {
    sqlx::query_as!(
        SsoFlow,
        "DELETE FROM admin_sso_flows WHERE state_sha256 = $1 AND expires_at > now()
         RETURNING nonce, pkce_verifier, next_url",
        state_sha256,
    )
    .fetch_optional(pool)
    .await
}
