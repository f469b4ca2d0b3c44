//! Host authorizations: what a person let a desktop host do as an agent.

use super::{Result, ServiceError, refresh};
use crate::db;
use crate::policy::snapshot::Parts;
use crate::state::AppState;

/// Revokes a host authorization: of `only_of` alone when given (a person revoking their own),
/// anyone's otherwise (an admin).
pub async fn revoke(
    state: &AppState,
    actor: &str,
    id: uuid::Uuid,
    only_of: Option<&str>,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::authorizations::revoke(&mut tx, actor, id, only_of, "revoked").await? {
        return Err(ServiceError::NotFound(format!("authorization `{id}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::AUTHORIZATIONS).await;
    Ok(())
}
