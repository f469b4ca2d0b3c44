//! Issued tokens: revocation by `jti`.

use super::{Result, refresh};
use crate::db;
use crate::policy::snapshot::Parts;
use crate::state::AppState;

/// Revokes a token by `jti` (admin action); the revocation lasts until `expires_at`.
pub async fn revoke(
    state: &AppState,
    actor: &str,
    jti: uuid::Uuid,
    expires_at: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    db::revocations::revoke(&mut tx, actor, jti, expires_at).await?;
    tx.commit().await?;
    refresh(state, Parts::REVOKED).await;
    Ok(())
}
