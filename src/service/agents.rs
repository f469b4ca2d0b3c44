//! Agents: who they are, their rate limits, and the people who may act as them.

use serde::Serialize;

use super::{Result, ServiceError, refresh};
use crate::db;
use crate::db::agents::AgentSettings;
use crate::names::{AgentName, Username};
use crate::policy::arguments::{ArgumentRules, RuleProblem};
use crate::policy::snapshot::{
    Discovery, GrantMatch, Managed, Parts, PolicySnapshot, RateLimitRecord,
};
use crate::state::AppState;

/// An agent as the API and the UI show it.
#[derive(Debug, Serialize)]
pub struct AgentSummary {
    pub name: String,
    pub description: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
    /// `files`: read-only here, changed by `policy apply` from its policy file.
    pub managed: Option<Managed>,
    pub grants: Vec<GrantMatch>,
    pub visible_tools: usize,
    /// Grants match nothing at all: this agent sees no tools.
    pub sees_nothing: bool,
    pub zero_match_grants: usize,
    pub rate_limits: Vec<RateLimitRecord>,
    /// Argument rules per tool or group, as written.
    pub arguments: Vec<ArgumentRules>,
    /// Argument rules that cannot do what their author meant.
    pub problems: Vec<RuleProblem>,
    /// Which calls wait for a person.
    pub approvals: Vec<crate::policy::approvals::ApprovalRule>,
    /// Approval rules that never trigger, or that nobody can decide (the latter only where
    /// the accounts were read: [`crate::service::approvals::problems`]).
    pub approval_problems: Vec<crate::policy::approvals::ApprovalProblem>,
    /// Credential slots of its tools it cannot fill (filled where the store was read:
    /// [`crate::service::credentials::problems`]).
    pub credential_problems: Vec<String>,
}

pub fn summaries(snapshot: &PolicySnapshot) -> Vec<AgentSummary> {
    snapshot
        .agents()
        .into_iter()
        .map(|a| AgentSummary {
            name: a.record.name.clone(),
            description: a.record.description.clone(),
            discovery: a.record.discovery,
            pinned: a.record.pinned.clone(),
            managed: a.record.managed,
            grants: a.grant_matches.clone(),
            visible_tools: a.visible.len(),
            sees_nothing: a.visible.is_empty(),
            zero_match_grants: a.zero_match_grants().count(),
            rate_limits: a.record.limits.clone(),
            arguments: a.record.arguments.clone(),
            problems: a.argument_problems.clone(),
            approvals: a.record.approvals.clone(),
            approval_problems: crate::policy::approvals::problems(
                &a.record.approvals,
                &a.visible,
                None,
            ),
            credential_problems: Vec::new(),
        })
        .collect()
}

pub async fn create(
    state: &AppState,
    actor: &str,
    name: &AgentName,
    description: &str,
    discovery: Option<&str>,
) -> Result<()> {
    let discovery = match discovery {
        None => Discovery::Full,
        Some(d) => Discovery::parse(d).ok_or_else(|| {
            ServiceError::Invalid(format!("discovery must be full, search or auto, not `{d}`"))
        })?,
    };
    let mut tx = state.db.begin().await?;
    if db::agents::agent_id(&mut tx, name).await?.is_some() {
        return Err(ServiceError::Conflict(format!(
            "agent `{name}` already exists"
        )));
    }
    let settings = AgentSettings {
        description: description.to_owned(),
        notes: String::new(),
        discovery,
        pinned: Vec::new(),
        managed: None,
    };
    db::agents::create_agent(&mut tx, actor, name, &settings).await?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

pub async fn delete(state: &AppState, actor: &str, name: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, name).await?;
    if !db::agents::delete_agent(&mut tx, actor, name).await? {
        return Err(ServiceError::NotFound(format!("agent `{name}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Replaces an agent's rate limits.
pub async fn set_limits(
    state: &AppState,
    actor: &str,
    agent: &str,
    limits: Vec<RateLimitRecord>,
) -> Result<()> {
    // Each limit's pattern, rate and burst were checked when it was read (`Limit` admits no
    // other).
    let mut seen = std::collections::HashSet::new();
    for l in &limits {
        if !seen.insert(l.pattern.as_ref()) {
            return Err(ServiceError::Invalid(format!(
                "two limits for {}",
                l.pattern
                    .as_ref()
                    .map_or("the whole agent".to_owned(), |p| format!("`{p}`"))
            )));
        }
    }
    let before = state
        .policy
        .load()
        .agent(agent)
        .map(|a| a.record.limits.clone())
        .ok_or_else(|| ServiceError::NotFound(format!("agent `{agent}`")))?;
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    db::limits::set_limits(&mut tx, actor, agent, &before, &limits).await?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Lets a person act as an agent through an interactive host.
pub async fn add_user(
    state: &AppState,
    actor: &str,
    agent: &str,
    username: &Username,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::agent_users::add_agent_user(&mut tx, actor, agent, username).await? {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Stops a person acting as an agent; what they authorized for it is revoked with it.
pub async fn remove_user(state: &AppState, actor: &str, agent: &str, username: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    super::editable_agent(&mut tx, agent).await?;
    if !db::agent_users::remove_agent_user(&mut tx, actor, agent, username).await? {
        return Err(ServiceError::NotFound(format!(
            "user `{username}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}
