//! An agent's grants: the tools and groups it may call.

use std::collections::HashMap;

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::snapshot::GrantRecord;

/// Adds a grant; `None` if the agent already has it.
pub async fn add_grant(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<Option<Uuid>> {
    let id = Uuid::now_v7();
    let inserted = sqlx::query!(
        "INSERT INTO agent_grants (id, agent_id, target, created_by)
         SELECT $1, id, $3, $4 FROM agents WHERE name = $2
         ON CONFLICT (agent_id, target) DO NOTHING",
        id,
        agent,
        target,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(None);
    }
    record_change(
        conn,
        actor,
        AdminAction::GrantCreate,
        &format!("agent:{agent}/grant:{target}"),
        None,
        Some(json!({"agent": agent, "target": target})),
    )
    .await?;
    Ok(Some(id))
}

/// Removes a grant of an agent. Returns whether it existed.
pub async fn remove_grant(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query!(
        "DELETE FROM agent_grants g USING agents a WHERE g.agent_id = a.id AND a.name = $1 AND g.target = $2",
        agent,
        target,
    )
    .execute(&mut *conn)
    .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::GrantDelete,
            &format!("agent:{agent}/grant:{target}"),
            Some(json!({"agent": agent, "target": target})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}

/// Every grant, by agent id.
pub(super) async fn by_agent(
    conn: &mut PgConnection,
) -> sqlx::Result<HashMap<Uuid, Vec<GrantRecord>>> {
    let mut grants: HashMap<Uuid, Vec<GrantRecord>> = HashMap::new();
    for r in sqlx::query!(
        "SELECT id, agent_id, target, created_by, created_at FROM agent_grants ORDER BY target"
    )
    .fetch_all(&mut *conn)
    .await?
    {
        grants.entry(r.agent_id).or_default().push(GrantRecord {
            id: r.id,
            target: r.target,
            created_by: r.created_by,
            created_at: r.created_at,
        });
    }
    Ok(grants)
}
