//! Control-plane operations, shared by the JSON API, the admin UI and the command line.
//!
//! Each one runs in a transaction, records the change, and refreshes this instance's snapshot
//! before returning, so that the caller's next request already sees it; other instances
//! follow on Postgres NOTIFY.

use serde::Serialize;
use serde_json::Value;

use crate::auth::secrets;
use crate::db;
use crate::db::agents::AgentSettings;
use crate::policy::GrantTarget;
use crate::policy::arguments::{self, ArgumentRules, RuleProblem};
use crate::policy::snapshot::{Discovery, GrantMatch, Parts, PolicySnapshot, RateLimitRecord};
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

fn valid_agent_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(crate::pool::is_name_char) {
        return Err(ServiceError::Invalid(format!(
            "agent name `{name}` must be 1-64 letters, digits, `_`, `.` or `-`"
        )));
    }
    Ok(())
}

/// An agent as the API and the UI show it.
#[derive(Debug, Serialize)]
pub struct AgentSummary {
    pub name: String,
    pub description: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
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
}

pub fn agent_summaries(snapshot: &PolicySnapshot) -> Vec<AgentSummary> {
    snapshot
        .agents()
        .into_iter()
        .map(|a| AgentSummary {
            name: a.record.name.clone(),
            description: a.record.description.clone(),
            discovery: a.record.discovery,
            pinned: a.record.pinned.clone(),
            grants: a.grant_matches.clone(),
            visible_tools: a.visible.len(),
            sees_nothing: a.visible.is_empty(),
            zero_match_grants: a.zero_match_grants().count(),
            rate_limits: a.record.limits.clone(),
            arguments: a.record.arguments.clone(),
            problems: a.argument_problems.clone(),
        })
        .collect()
}

pub async fn create_agent(
    state: &AppState,
    actor: &str,
    name: &str,
    description: &str,
    discovery: Option<&str>,
) -> Result<()> {
    valid_agent_name(name)?;
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
    };
    db::agents::create_agent(&mut tx, actor, name, &settings).await?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

pub async fn delete_agent(state: &AppState, actor: &str, name: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::agents::delete_agent(&mut tx, actor, name).await? {
        return Err(ServiceError::NotFound(format!("agent `{name}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// What adding a grant did, with the zero-match warning when it matches nothing.
#[derive(Debug, Serialize)]
pub struct GrantAdded {
    pub agent: String,
    pub target: String,
    pub matched_tools: usize,
    pub suggestions: Vec<String>,
    pub warning: Option<String>,
}

/// Which tools a grant would match, before saving it (the grant editor's preview).
pub fn preview_grant(
    snapshot: &PolicySnapshot,
    target: &str,
) -> Result<(Vec<String>, Vec<String>)> {
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

pub async fn add_grant(
    state: &AppState,
    actor: &str,
    agent: &str,
    target: &str,
) -> Result<GrantAdded> {
    let target = target.trim();
    GrantTarget::parse(target).map_err(ServiceError::Invalid)?;
    let mut tx = state.db.begin().await?;
    if db::agents::agent_id(&mut tx, agent).await?.is_none() {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
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
    let (matched, suggestions) = preview_grant(&state.policy.load(), target)?;
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
    })
}

pub async fn remove_grant(state: &AppState, actor: &str, agent: &str, target: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::grants::remove_grant(&mut tx, actor, agent, target).await? {
        return Err(ServiceError::NotFound(format!(
            "grant `{target}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// A client's credentials, shown once.
#[derive(Debug, Serialize)]
pub struct NewClient {
    pub client_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    pub agent: String,
}

/// Creates an OAuth client: with a secret, or with public keys for private_key_jwt.
pub async fn create_client(
    pool: &sqlx::PgPool,
    actor: &str,
    agent: &str,
    description: &str,
    jwks: Option<Value>,
) -> Result<NewClient> {
    if let Some(j) = &jwks {
        serde_json::from_value::<jsonwebtoken::jwk::JwkSet>(j.clone())
            .map_err(|e| ServiceError::Invalid(format!("jwks is not a JWK set: {e}")))?;
    }
    let (client_id, secret) = secrets::new_client_credentials();
    let secret = if jwks.is_some() { None } else { Some(secret) };
    let hash = match &secret {
        Some(s) => {
            let s = s.clone();
            Some(
                tokio::task::spawn_blocking(move || secrets::hash(&s))
                    .await
                    .map_err(anyhow::Error::from)??,
            )
        }
        None => None,
    };
    let mut tx = pool.begin().await?;
    if !db::clients::create_client(
        &mut tx,
        actor,
        agent,
        &client_id,
        hash.as_deref(),
        jwks.as_ref(),
        description,
    )
    .await?
    {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    Ok(NewClient {
        client_id,
        client_secret: secret,
        agent: agent.to_owned(),
    })
}

pub async fn create_client_live(
    state: &AppState,
    actor: &str,
    agent: &str,
    description: &str,
    jwks: Option<Value>,
) -> Result<NewClient> {
    let c = create_client(&state.db, actor, agent, description, jwks).await?;
    // The agents too: the client's first token takes its agent's grants from this snapshot,
    // and the agent may have been made a moment ago through another instance.
    refresh(state, Parts::of_table("oauth_clients") | Parts::AGENTS).await;
    Ok(c)
}

pub async fn delete_client(state: &AppState, actor: &str, client_id: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::clients::delete_client(&mut tx, actor, client_id).await? {
        return Err(ServiceError::NotFound(format!("client `{client_id}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::of_table("oauth_clients")).await;
    Ok(())
}

/// Revokes a token by `jti` (admin action); the revocation lasts until `expires_at`.
pub async fn revoke_jti(
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

/// Replaces an agent's rate limits.
pub async fn set_limits(
    state: &AppState,
    actor: &str,
    agent: &str,
    limits: Vec<RateLimitRecord>,
) -> Result<()> {
    // Each limit's rate and burst were checked when it was read (`Limit` admits no other).
    let mut seen = std::collections::HashSet::new();
    for l in &limits {
        if let Some(p) = &l.pattern {
            GrantTarget::parse(p).map_err(ServiceError::Invalid)?;
        }
        if !seen.insert(l.pattern.as_deref()) {
            return Err(ServiceError::Invalid(format!(
                "two limits for {}",
                l.pattern
                    .as_deref()
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
    db::limits::set_limits(&mut tx, actor, agent, &before, &limits).await?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// What setting argument rules did: the rules' problems, which are warnings (a rule on a
/// parameter the tool lacks is kept, and flagged, like a zero-match grant).
#[derive(Debug, Serialize)]
pub struct ArgumentsSet {
    pub agent: String,
    pub target: String,
    pub problems: Vec<RuleProblem>,
}

/// Sets an agent's argument rules for one tool or group (`params`: parameter → rule).
pub async fn set_argument_rules(
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
pub fn preview_argument_rules(
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

pub async fn delete_argument_rules(
    state: &AppState,
    actor: &str,
    agent: &str,
    target: &str,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::arguments::delete_argument_rules(&mut tx, actor, agent, target).await? {
        return Err(ServiceError::NotFound(format!(
            "argument rules on `{target}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Declares or replaces an upstream MCP server; its supervisor starts on every instance.
pub async fn set_upstream(
    state: &AppState,
    actor: &str,
    name: &str,
    spec: crate::upstream::UpstreamSpec,
) -> Result<()> {
    if name.is_empty()
        || !name.chars().all(crate::pool::is_name_char)
        || name.contains("__")
        || name.ends_with('_')
    {
        return Err(ServiceError::Invalid(format!(
            "upstream name `{name}` must be letters, digits, `_`, `.` or `-`, without `__`"
        )));
    }
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

pub async fn delete_upstream(state: &AppState, actor: &str, name: &str) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::upstreams::delete_upstream(&mut tx, actor, name).await? {
        return Err(ServiceError::NotFound(format!("upstream `{name}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// A held definition as the API and the UI show it.
#[derive(Debug, Serialize)]
pub struct PendingView {
    #[serde(flatten)]
    pub tool: db::pins::PendingTool,
    /// `pending`, or `rejected` (still held).
    pub status: &'static str,
    /// This instance's catalog has this very definition now; `false` for one superseded by a
    /// later change (approving it would hold what is served instead).
    pub served: bool,
    /// Unified line diff of the approved definition against this one (pretty JSON, sorted
    /// keys); empty when only the script or App file behind the definition changed.
    pub diff: String,
}

fn parse_tool_name(name: &str) -> Result<crate::pool::ToolName> {
    crate::pool::ToolName::parse(name).map_err(ServiceError::Invalid)
}

/// A content hash as the catalog writes them: 64 lowercase hex digits.
pub fn parse_hash(hash: &str) -> Result<&str> {
    if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(hash)
    } else {
        Err(ServiceError::Invalid(
            "hash must be 64 lowercase hexadecimal digits (a tool's content_hash)".into(),
        ))
    }
}

/// Held definitions of the pinned groups, newest first, with their diffs.
pub async fn pending_tools(state: &AppState) -> Result<Vec<PendingView>> {
    let mut conn = state.db.acquire().await?;
    let rows = db::pins::pending(&mut conn).await?;
    let catalog = state.policy.catalog();
    Ok(rows
        .into_iter()
        .map(|tool| PendingView {
            status: if tool.rejected_at.is_some() {
                "rejected"
            } else {
                "pending"
            },
            served: catalog
                .get(&tool.name)
                .is_some_and(|t| t.content_hash == tool.hash),
            diff: crate::pool::definition::diff(
                tool.previous_definition.as_ref(),
                &tool.definition,
            ),
            tool,
        })
        .collect())
}

/// The hash an approval or rejection is for: the one given, else the one this instance serves
/// (so that an admin never approves a superseded definition by accident), else the newest.
fn decided_hash(state: &AppState, name: &str, hash: Option<&str>) -> Result<Option<String>> {
    match hash {
        Some(h) => Ok(Some(parse_hash(h)?.to_owned())),
        None => Ok(state
            .policy
            .catalog()
            .get(name)
            .map(|t| t.content_hash.hex())),
    }
}

/// Approves or rejects the held definition of `name` (see `db::pins::decide`).
pub async fn decide_tool(
    state: &AppState,
    actor: &str,
    name: &str,
    hash: Option<&str>,
    verdict: db::pins::Verdict,
) -> Result<db::pins::Decision> {
    let name = parse_tool_name(name)?;
    let hash = decided_hash(state, name.as_str(), hash)?;
    let mut tx = state.db.begin().await?;
    let decided = db::pins::decide(&mut tx, actor, name.as_str(), hash.as_deref(), verdict)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("a held definition of tool `{name}`")))?;
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(decided)
}

/// What pinning a group did.
#[derive(Debug, Serialize)]
pub struct GroupPin {
    pub group: String,
    /// As set (`None`: the default).
    pub pin: Option<bool>,
    /// Whether the group is pinned now, defaults included.
    pub pinned: bool,
    /// Definitions approved as the group's baseline by this change.
    pub approved: usize,
}

/// Sets a group's pin; a group pinned by it has what it serves now approved by `actor`.
pub async fn set_group_pin(
    state: &AppState,
    actor: &str,
    group: &str,
    pin: Option<bool>,
) -> Result<GroupPin> {
    if group.is_empty()
        || group.len() > crate::pool::MAX_TOOL_NAME
        || !group.chars().all(crate::pool::is_name_char)
        || group.contains(crate::pool::SEPARATOR)
    {
        return Err(ServiceError::Invalid(format!(
            "group name `{group}` must be 1-64 letters, digits, `_`, `.` or `-`, without `__`"
        )));
    }
    let catalog = state.policy.catalog();
    let mut tx = state.db.begin().await?;
    let before = db::pins::pinned_groups(&mut tx).await?;
    db::groups::set_pin(&mut tx, actor, group, pin).await?;
    let pinned = db::pins::pinned_groups(&mut tx).await?.contains(group);
    let approved = if pinned && !before.contains(group) {
        db::pins::baseline(&mut tx, actor, group, &catalog).await?
    } else {
        0
    };
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(GroupPin {
        group: group.to_owned(),
        pin,
        pinned,
        approved,
    })
}

/// A username as accounts spell them.
fn valid_username(username: &str) -> Result<()> {
    if username.is_empty()
        || username.len() > 64
        || !username
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
    {
        return Err(ServiceError::Invalid(format!(
            "username `{username}` must be 1-64 letters, digits, `_`, `.`, `@` or `-`"
        )));
    }
    Ok(())
}

/// Lets a person act as an agent through an interactive host.
pub async fn add_agent_user(
    state: &AppState,
    actor: &str,
    agent: &str,
    username: &str,
) -> Result<()> {
    valid_username(username)?;
    let mut tx = state.db.begin().await?;
    if !db::agent_users::add_agent_user(&mut tx, actor, agent, username).await? {
        return Err(ServiceError::NotFound(format!("agent `{agent}`")));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Stops a person acting as an agent; what they authorized for it is revoked with it.
pub async fn remove_agent_user(
    state: &AppState,
    actor: &str,
    agent: &str,
    username: &str,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::agent_users::remove_agent_user(&mut tx, actor, agent, username).await? {
        return Err(ServiceError::NotFound(format!(
            "user `{username}` of agent `{agent}`"
        )));
    }
    tx.commit().await?;
    refresh(state, Parts::ALL).await;
    Ok(())
}

/// Registers (or replaces) a public client for hosts without a metadata document.
pub async fn put_public_client(
    pool: &sqlx::PgPool,
    actor: &str,
    client_id: &str,
    client_name: &str,
    redirect_uris: &[String],
) -> Result<()> {
    if client_id.is_empty()
        || client_id.len() > 128
        || !client_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
        || crate::auth::cimd::is_url_client_id(client_id)
    {
        return Err(ServiceError::Invalid(format!(
            "client id `{client_id}` must be 1-128 letters, digits, `_`, `.`, `:` or `-` (and not a URL: URL client ids are metadata documents)"
        )));
    }
    let name = client_name.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(ServiceError::Invalid(
            "client_name must be 1-200 characters without control characters".into(),
        ));
    }
    if redirect_uris.is_empty() || redirect_uris.len() > 20 {
        return Err(ServiceError::Invalid(
            "redirect_uris must list 1 to 20 URLs".into(),
        ));
    }
    for u in redirect_uris {
        crate::auth::redirect::check_registered_redirect(u).map_err(ServiceError::Invalid)?;
    }
    let mut tx = pool.begin().await?;
    db::public_clients::put_public_client(&mut tx, actor, client_id, name, redirect_uris).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn delete_public_client(pool: &sqlx::PgPool, actor: &str, client_id: &str) -> Result<()> {
    let mut tx = pool.begin().await?;
    if !db::public_clients::delete_public_client(&mut tx, actor, client_id).await? {
        return Err(ServiceError::NotFound(format!(
            "public client `{client_id}`"
        )));
    }
    tx.commit().await?;
    Ok(())
}

pub async fn delete_public_client_live(
    state: &AppState,
    actor: &str,
    client_id: &str,
) -> Result<()> {
    delete_public_client(&state.db, actor, client_id).await?;
    refresh(state, Parts::of_table("oauth_clients")).await;
    Ok(())
}

/// Revokes a host authorization: of `only_of` alone when given (a person revoking their own),
/// anyone's otherwise (an admin).
pub async fn revoke_authorization(
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
