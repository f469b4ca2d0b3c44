//! Argument rules: what an agent may pass to a tool or a group.

use serde::Serialize;
use serde_json::Value;

use super::{Result, ServiceError, refresh};
use crate::db;
use crate::policy::GrantTarget;
use crate::policy::arguments::{self, ArgumentRules, RuleProblem};
use crate::policy::snapshot::{Parts, PolicySnapshot};
use crate::state::AppState;

/// What setting argument rules did: the rules' problems, which are warnings (a rule on a
/// parameter the tool lacks is kept, and flagged, like a zero-match grant).
#[derive(Debug, Serialize)]
pub struct ArgumentsSet {
    pub agent: String,
    pub target: String,
    pub problems: Vec<RuleProblem>,
}

/// Sets an agent's argument rules for one tool or group (`params`: parameter → rule).
pub async fn set(
    state: &AppState,
    actor: &str,
    agent: &str,
    target: &str,
    params: &Value,
) -> Result<ArgumentsSet> {
    GrantTarget::parse(target).map_err(ServiceError::Invalid)?;
    let params = arguments::parse_params(params).map_err(ServiceError::Invalid)?;
    let rules = ArgumentRules {
        target: target.to_owned(),
        params,
    };
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::arguments::set_argument_rules(&mut tx, actor, agent, &rules).await? {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    let problems = state
        .policy
        .load()
        .agent(agent)
        .map(|a| {
            a.argument_problems
                .iter()
                .filter(|p| p.target == target)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Ok(ArgumentsSet {
        agent: agent.to_owned(),
        target: target.to_owned(),
        problems,
    })
}

/// A preview of argument rules: their problems, and each touched tool's narrowed schema.
pub type RulesPreview = (Vec<RuleProblem>, Vec<(String, Value)>);

/// What argument rules would do, before saving them (the editor's preview): their problems
/// and the narrowed input schema of every tool of the agent they touch.
pub fn preview(
    snapshot: &PolicySnapshot,
    agent: &str,
    target: &str,
    params: &Value,
) -> Result<RulesPreview> {
    GrantTarget::parse(target).map_err(ServiceError::Invalid)?;
    let params = arguments::parse_params(params).map_err(ServiceError::Invalid)?;
    let view = snapshot
        .agent(agent)
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{agent}`")))?;
    let mut rules: Vec<ArgumentRules> = view
        .record
        .arguments
        .iter()
        .filter(|r| r.target != target)
        .cloned()
        .collect();
    rules.push(ArgumentRules {
        target: target.to_owned(),
        params,
    });
    // The agent's tools as the pool has them: the rules are applied afresh.
    let granted: Vec<_> = snapshot
        .catalog
        .tools()
        .filter(|t| view.grants.iter().any(|g| g.matches(t.name.as_str())))
        .filter(|t| !snapshot.is_held(t.name.as_str()))
        .cloned()
        .collect();
    let analysis = arguments::analyse(agent, &rules, &granted, &snapshot.catalog);
    let problems = analysis
        .problems
        .into_iter()
        .filter(|p| p.target == target)
        .collect();
    let parsed = GrantTarget::parse(target).map_err(ServiceError::Invalid)?;
    let mut schemas: Vec<(String, Value)> = analysis
        .narrowed
        .into_iter()
        .filter(|(name, _)| parsed.matches(name))
        .map(|(name, t)| (name, Value::Object((*t.input_schema).clone())))
        .collect();
    schemas.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((problems, schemas))
}

pub async fn delete(state: &AppState, actor: &str, agent: &str, target: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::arguments::delete_argument_rules(&mut tx, actor, agent, target).await? {
        return Err(ServiceError::NotFound(format!(
            "argument rules on `{target}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}
