//! Grants: which tools an agent may see and call.

use serde::Serialize;

use super::{Result, ServiceError, refresh};
use crate::db;
use crate::policy::GrantTarget;
use crate::policy::snapshot::{Parts, PolicySnapshot};
use crate::state::AppState;

/// What adding a grant did, with the zero-match warning when it matches nothing.
#[derive(Debug, Serialize)]
pub struct GrantAdded {
    pub agent: String,
    pub target: String,
    pub matched_tools: usize,
    pub suggestions: Vec<String>,
    pub warning: Option<String>,
    /// Which of the agent's tokens see the grant, and when.
    pub reaches: &'static str,
}

/// What a grant change reaches: said by the API and the admin UI beside every grant.
pub const GRANT_REACH: &str = "Live: tokens issued with scope `tools` (the default) see a grant added or removed on their next request; tokens issued for explicit `tools:…` scopes lose a removed grant at once and never gain one.";

/// Which tools a grant would match, before saving it (the grant editor's preview).
pub fn preview(snapshot: &PolicySnapshot, target: &str) -> Result<(Vec<String>, Vec<String>)> {
    let parsed = GrantTarget::parse(target).map_err(ServiceError::Invalid)?;
    let matched: Vec<String> = parsed
        .matched(&snapshot.catalog)
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    let suggestions = if matched.is_empty() {
        crate::policy::suggestions(target, &snapshot.catalog)
    } else {
        Vec::new()
    };
    Ok((matched, suggestions))
}

pub async fn add(
    state: &AppState,
    actor: &str,
    agent: &str,
    target: &GrantTarget,
) -> Result<GrantAdded> {
    // Stored as it is written back: trimmed, in its one spelling.
    let target = &target.to_string();
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if db::grants::add_grant(&mut tx, actor, agent, target)
        .await?
        .is_none()
    {
        return Err(ServiceError::Conflict(format!(
            "agent `{agent}` already has the grant `{target}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    let (matched, suggestions) = preview(&state.policy.load(), target)?;
    let warning = matched.is_empty().then(|| {
        let hint = suggestions
            .first()
            .map(|s| format!(" Did you mean `{s}`?"))
            .unwrap_or_default();
        format!("the grant `{target}` matches no tool.{hint}")
    });
    Ok(GrantAdded {
        agent: agent.to_owned(),
        target: target.to_owned(),
        matched_tools: matched.len(),
        suggestions,
        warning,
        reaches: GRANT_REACH,
    })
}

pub async fn remove(state: &AppState, actor: &str, agent: &str, target: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::grants::remove_grant(&mut tx, actor, agent, target).await? {
        return Err(ServiceError::NotFound(format!(
            "grant `{target}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}
