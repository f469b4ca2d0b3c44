//! The policy snapshot's read: every aggregate it is built from, in one transaction.

use sqlx::PgPool;

use crate::policy::snapshot::{Parts, PolicyState};

/// Reads everything the policy snapshot is built from, in one repeatable-read transaction so
/// that the snapshot never mixes two states.
pub async fn load_state(pool: &PgPool) -> sqlx::Result<PolicyState> {
    load_parts(pool, Parts::ALL).await
}

/// Reads the `parts` of the policy state, in one repeatable-read transaction; the other
/// fields are left empty, for [`crate::policy::snapshot::PolicyHandle::merge_state`].
pub async fn load_parts(pool: &PgPool, parts: Parts) -> sqlx::Result<PolicyState> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let mut state = PolicyState::default();
    if parts.contains(Parts::AGENTS) {
        state.agents = super::agents::records(&mut tx).await?;
    }
    if parts.contains(Parts::CLIENTS) {
        state.clients = super::clients::records(&mut tx).await?;
    }
    if parts.contains(Parts::REVOKED) {
        state.revoked = super::revocations::live(&mut tx).await?;
    }
    if parts.contains(Parts::KEYS) {
        state.keys = super::keys::verify_keys(&mut tx).await?;
    }
    if parts.contains(Parts::PINS) {
        state.pins = super::pins::load(&mut tx).await?;
    }
    if parts.contains(Parts::AUTHORIZATIONS) {
        state.authorizations = super::authorizations::live(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(state)
}
