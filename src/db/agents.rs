//! Agents: their settings, and their creation in bulk (with grants) for `policy apply`.

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::{AgentRecord, Discovery, Managed};

/// The fields of an agent that policies and the API set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    pub description: String,
    pub notes: String,
    pub discovery: Discovery,
    pub pinned: Vec<String>,
    pub managed: Option<Managed>,
}

pub async fn agent_id(conn: &mut PgConnection, name: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!("SELECT id FROM agents WHERE name = $1", name)
        .fetch_optional(&mut *conn)
        .await
}

pub async fn create_agent(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    s: &AgentSettings,
) -> sqlx::Result<Uuid> {
    let id = Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO agents (id, name, description, notes, discovery, pinned, managed_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        id,
        name,
        &s.description,
        &s.notes,
        s.discovery.as_str(),
        &s.pinned,
        s.managed.map(Managed::as_str),
    )
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        AdminAction::AgentCreate,
        &format!("agent:{name}"),
        None,
        Some(settings_json(s)),
    )
    .await?;
    Ok(id)
}

pub async fn update_agent(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    before: &AgentSettings,
    s: &AgentSettings,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE agents SET description = $2, notes = $3, discovery = $4, pinned = $5, managed_by = $6, updated_at = now() WHERE name = $1",
        name,
        &s.description,
        &s.notes,
        s.discovery.as_str(),
        &s.pinned,
        s.managed.map(Managed::as_str),
    )
        .execute(&mut *conn)
        .await?;
    record_change(
        conn,
        actor,
        AdminAction::AgentUpdate,
        &format!("agent:{name}"),
        Some(settings_json(before)),
        Some(settings_json(s)),
    )
    .await
}

/// Whether the agent exists (`None` when not) and is managed by files; locks its row, so that
/// an apply that marks it managed waits for, or is waited on by, the change being checked.
pub async fn managed_by(
    conn: &mut PgConnection,
    name: &str,
) -> sqlx::Result<Option<Option<Managed>>> {
    Ok(sqlx::query_scalar!(
        "SELECT managed_by FROM agents WHERE name = $1 FOR UPDATE",
        name
    )
    .fetch_optional(&mut *conn)
    .await?
    .map(|m| m.as_deref().and_then(Managed::parse)))
}

/// Deletes an agent with its grants, limits and clients. Returns whether it existed.
pub async fn delete_agent(conn: &mut PgConnection, actor: &str, name: &str) -> sqlx::Result<bool> {
    let gone = sqlx::query!("DELETE FROM agents WHERE name = $1", name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::AgentDelete,
            &format!("agent:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

fn settings_json(s: &AgentSettings) -> Value {
    json!({
        "description": s.description,
        "discovery": s.discovery.as_str(),
        "pinned": s.pinned,
        "managed": s.managed.map(Managed::as_str),
    })
}

/// A new agent or a new grant, for [`create_many`].
pub enum Creation<'a> {
    Agent {
        name: &'a str,
        settings: &'a AgentSettings,
    },
    Grant {
        agent: &'a str,
        target: &'a str,
    },
}

/// Does what [`create_agent`] and [`add_grant`](super::grants::add_grant), called for `items`
/// in order, would do, with the same audit events in the same order, in a few statements:
/// applying a policies folder of 10,000 agents was 100,000 round trips. A grant may name an
/// agent created earlier in `items`.
pub async fn create_many(
    conn: &mut PgConnection,
    actor: &str,
    items: &[Creation<'_>],
) -> sqlx::Result<()> {
    // Ids in item order, as the one-by-one calls would draw them.
    let ids: Vec<Uuid> = items.iter().map(|_| Uuid::now_v7()).collect();
    let (mut a_ids, mut names, mut descriptions, mut notes, mut discovery, mut pinned) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut managed: Vec<Option<&str>> = Vec::new();
    let (mut g_ids, mut g_agents, mut g_targets) = (Vec::new(), Vec::new(), Vec::new());
    for (item, id) in items.iter().zip(&ids) {
        match item {
            Creation::Agent { name, settings } => {
                a_ids.push(*id);
                names.push(*name);
                descriptions.push(settings.description.as_str());
                notes.push(settings.notes.as_str());
                discovery.push(settings.discovery.as_str());
                // Arrays of arrays do not unnest row by row: each list goes as JSON text.
                pinned.push(Value::from(settings.pinned.clone()).to_string());
                managed.push(settings.managed.map(Managed::as_str));
            }
            Creation::Grant { agent, target } => {
                g_ids.push(*id);
                g_agents.push(*agent);
                g_targets.push(*target);
            }
        }
    }
    // The macros check an array argument as `&[String]`; the casts say `&[&str]` (also
    // `text[]`), so that no name is copied to be sent.
    if !a_ids.is_empty() {
        sqlx::query!(
            "INSERT INTO agents (id, name, description, notes, discovery, pinned, managed_by)
             SELECT id, name, d, n, disc, ARRAY(SELECT jsonb_array_elements_text(p::jsonb)), m
             FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
                 AS u(id, name, d, n, disc, p, m)",
            &a_ids,
            &names as &[&str],
            &descriptions as &[&str],
            &notes as &[&str],
            &discovery as &[&str],
            &pinned,
            &managed as &[Option<&str>],
        )
        .execute(&mut *conn)
        .await?;
    }
    // A grant the agent already has, or of an agent that does not exist, is not inserted
    // and not recorded, as in `add_grant`.
    let inserted: std::collections::HashSet<Uuid> = if g_ids.is_empty() {
        Default::default()
    } else {
        sqlx::query_scalar!(
            "INSERT INTO agent_grants (id, agent_id, target, created_by)
             SELECT u.id, a.id, u.target, $4
             FROM UNNEST($1::uuid[], $2::text[], $3::text[]) AS u(id, agent, target)
             JOIN agents a ON a.name = u.agent
             ON CONFLICT (agent_id, target) DO NOTHING
             RETURNING id",
            &g_ids,
            &g_agents as &[&str],
            &g_targets as &[&str],
            actor,
        )
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect()
    };
    let events = items
        .iter()
        .zip(&ids)
        .filter_map(|(item, id)| match item {
            Creation::Agent { name, settings } => Some(super::change_event(
                actor,
                AdminAction::AgentCreate,
                &format!("agent:{name}"),
                None,
                Some(settings_json(settings)),
            )),
            Creation::Grant { agent, target } => inserted.contains(id).then(|| {
                super::change_event(
                    actor,
                    AdminAction::GrantCreate,
                    &format!("agent:{agent}/grant:{target}"),
                    None,
                    Some(json!({"agent": agent, "target": target})),
                )
            }),
        })
        .collect();
    super::record_changes(conn, events).await
}

/// Whether any agent exists (first start applies the policies folder into an empty database).
pub async fn is_empty(pool: &PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"SELECT NOT EXISTS (SELECT 1 FROM agents) AS "empty!""#)
        .fetch_one(pool)
        .await
}

/// Every agent with its grants, limits, argument rules and users, for the policy snapshot.
pub(super) async fn records(conn: &mut PgConnection) -> sqlx::Result<Vec<AgentRecord>> {
    let mut grants = super::grants::by_agent(&mut *conn).await?;
    let mut limits = super::limits::by_agent(&mut *conn).await?;
    let mut arguments = super::arguments::by_agent(&mut *conn).await?;
    let mut approvals = super::approval_rules::by_agent(&mut *conn).await?;
    let mut users = super::agent_users::agent_users(&mut *conn).await?;
    let rows = sqlx::query!(
        "SELECT id, name, description, notes, discovery, pinned, managed_by FROM agents ORDER BY name"
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let id = r.id;
            AgentRecord {
                id,
                name: r.name,
                description: r.description,
                notes: r.notes,
                discovery: Discovery::parse(&r.discovery).unwrap_or_default(),
                pinned: r.pinned,
                managed: r.managed_by.as_deref().and_then(Managed::parse),
                grants: grants.remove(&id).unwrap_or_default(),
                limits: limits.remove(&id).unwrap_or_default(),
                arguments: arguments.remove(&id).unwrap_or_default(),
                approvals: approvals.remove(&id).unwrap_or_default(),
                users: users.remove(&id).unwrap_or_default(),
            }
        })
        .collect())
}
