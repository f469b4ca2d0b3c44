//! Upstream MCP servers, declared at run time.

use super::{Result, ServiceError, refresh};
use crate::db;
use crate::names::GroupName;
use crate::policy::snapshot::Parts;
use crate::state::AppState;

/// Declares or replaces an upstream MCP server; its supervisor starts on every instance.
pub async fn set(
    state: &AppState,
    actor: &str,
    // An upstream's tools are named `<upstream>__<tool>`: its name is their group's.
    name: &GroupName,
    spec: crate::upstream::UpstreamSpec,
) -> Result<()> {
    let name = name.as_str();
    if state
        .policy
        .load()
        .catalog
        .tools()
        .any(|t| t.group() == name && matches!(t.source, crate::pool::ToolSource::Script { .. }))
    {
        return Err(ServiceError::Conflict(format!(
            "`{name}` is already a script tool group"
        )));
    }
    spec.validate().map_err(ServiceError::Invalid)?;
    let spec = serde_json::to_value(&spec).map_err(anyhow::Error::from)?;
    let mut tx = state.db.begin().await?;
    let before = db::upstreams::upstreams(&mut tx).await?.remove(name);
    db::upstreams::set_upstream(&mut tx, actor, name, before.as_ref(), &spec).await?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

pub async fn delete(state: &AppState, actor: &str, name: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::upstreams::delete_upstream(&mut tx, actor, name).await? {
        return Err(ServiceError::NotFound(format!("upstream `{name}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}
