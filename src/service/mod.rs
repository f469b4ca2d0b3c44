//! Control-plane operations, one module per aggregate, shared by the JSON API, the admin UI,
//! the OAuth endpoints and the command line: the only code that changes what the gateway
//! enforces. Surfaces translate their input into these calls and never write `db/` themselves.
//!
//! Each operation runs in a transaction that also records the change (`admin.change`, with a
//! typed action, in the control-plane chain of the audit log), and refreshes this instance's
//! snapshot before returning, so that the caller's next request already sees it; other
//! instances follow on Postgres NOTIFY.

pub mod accounts;
pub mod agents;
pub mod approvals;
pub mod arguments;
pub mod audit_access;
pub mod authorizations;
pub mod clients;
pub mod connections;
pub mod credentials;
pub mod grants;
pub mod keys;
pub mod pins;
pub mod policy;
pub mod tokens;
pub mod upstreams;

use sqlx::PgConnection;

use crate::db;
use crate::policy::snapshot::{Managed, Parts};
use crate::state::AppState;

/// Why a control-plane operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

impl From<crate::names::NameError> for ServiceError {
    fn from(e: crate::names::NameError) -> Self {
        ServiceError::Invalid(e.to_string())
    }
}

/// Refuses a change to an agent that its policy file manages (`managed: files`), with where
/// to make it instead; and to one that does not exist. Run inside the change's transaction:
/// it locks the agent's row, so an apply that marks it managed meanwhile is waited for.
async fn editable_agent(conn: &mut PgConnection, agent: &str) -> Result<()> {
    match db::agents::managed_by(conn, agent).await? {
        None => Err(ServiceError::NotFound(format!("agent `{agent}`"))),
        Some(Some(Managed::Files)) => Err(ServiceError::Conflict(format!(
            "agent `{agent}` is managed by files: edit policies/agents/{agent}/agent.md and run `toolgate policy apply`"
        ))),
        Some(None) => Ok(()),
    }
}

/// As [`editable_agent`], for a group's metadata (`managed: files` in `policies/groups.yaml`).
async fn editable_group(conn: &mut PgConnection, group: &str) -> Result<()> {
    match db::groups::managed_by(conn, group).await? {
        Some(Managed::Files) => Err(ServiceError::Conflict(format!(
            "group `{group}` is managed by files: edit policies/groups.yaml and run `toolgate policy apply`"
        ))),
        None => Ok(()),
    }
}

/// Brings this instance's snapshot up to a change just committed, so that the caller's next
/// request sees it; other instances (and this one again) follow the NOTIFY. `parts` is
/// everything unless the change is a frequent one that touches one known table: a change
/// reaches further than its own table (removing a person from an agent revokes their
/// authorizations), and a stale part here would last until the notification arrives.
async fn refresh(state: &AppState, parts: Parts) {
    if let Err(e) = state.reload_parts(parts).await {
        tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
    }
}

/// Where a change is made: in a serving instance, whose snapshot is brought up to the change
/// before the call returns, or from the command line, against the database alone (serving
/// instances follow the NOTIFY the change's transaction sends).
///
/// Only the operations the command line offers take a `Plane`; the others read this
/// instance's snapshot (an agent's limits before the change, the catalog a grant matches) and
/// take the live state itself.
#[derive(Clone, Copy)]
pub enum Plane<'a> {
    Live(&'a AppState),
    Offline(&'a sqlx::PgPool),
}

impl Plane<'_> {
    pub fn db(&self) -> &sqlx::PgPool {
        match self {
            Plane::Live(state) => &state.db,
            Plane::Offline(pool) => pool,
        }
    }

    /// The live state, when there is one.
    pub fn live(&self) -> Option<&AppState> {
        match self {
            Plane::Live(state) => Some(state),
            Plane::Offline(_) => None,
        }
    }

    async fn refresh(&self, parts: Parts) {
        if let Plane::Live(state) = self {
            refresh(state, parts).await;
        }
    }

    /// Reloads the whole snapshot: what a change to a person needs, so that their host
    /// tokens fail on their next request here, not only once NOTIFY has reached this instance.
    async fn reload(&self) {
        if let Plane::Live(state) = self
            && let Err(e) = state.reload_policy().await
        {
            tracing::warn!(error = %e, "refreshing the policy snapshot failed; NOTIFY will catch up");
        }
    }
}

impl<'a> From<&'a AppState> for Plane<'a> {
    fn from(state: &'a AppState) -> Self {
        Plane::Live(state)
    }
}

impl<'a> From<&'a sqlx::PgPool> for Plane<'a> {
    fn from(pool: &'a sqlx::PgPool) -> Self {
        Plane::Offline(pool)
    }
}
