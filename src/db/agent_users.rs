//! Who may act as which agent: the people an interactive host may sign in for it.

use std::collections::HashMap;

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::authorizations::revoke;
use super::record_change;
use crate::audit::AdminAction;

/// Usernames allowed to act as each agent, by agent id.
pub async fn agent_users(conn: &mut PgConnection) -> sqlx::Result<HashMap<Uuid, Vec<String>>> {
    let mut out: HashMap<Uuid, Vec<String>> = HashMap::new();
    for r in sqlx::query!("SELECT agent_id, username FROM agent_users ORDER BY username")
        .fetch_all(&mut *conn)
        .await?
    {
        out.entry(r.agent_id).or_default().push(r.username);
    }
    Ok(out)
}

/// Lets `username` act as `agent`; `false` if the agent does not exist.
pub async fn add_agent_user(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    username: &str,
) -> sqlx::Result<bool> {
    let Some(agent_id) = super::agents::agent_id(conn, agent).await? else {
        return Ok(false);
    };
    let inserted = sqlx::query!(
        "INSERT INTO agent_users (agent_id, username) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        agent_id,
        username,
    )
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::AgentUserAdd,
            &format!("agent:{agent}/user:{username}"),
            None,
            Some(json!({"agent": agent, "username": username})),
        )
        .await?;
    }
    Ok(true)
}

/// Stops `username` acting as `agent`, and revokes what they authorized for it: the mapping
/// is what the consent rested on. `false` if there was no such mapping.
pub async fn remove_agent_user(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    username: &str,
) -> sqlx::Result<bool> {
    let Some(agent_id) = super::agents::agent_id(conn, agent).await? else {
        return Ok(false);
    };
    let gone = sqlx::query!(
        "DELETE FROM agent_users WHERE agent_id = $1 AND username = $2",
        agent_id,
        username,
    )
    .execute(&mut *conn)
    .await?;
    if gone.rows_affected() == 0 {
        return Ok(false);
    }
    record_change(
        conn,
        actor,
        AdminAction::AgentUserRemove,
        &format!("agent:{agent}/user:{username}"),
        Some(json!({"agent": agent, "username": username})),
        None,
    )
    .await?;
    let ids: Vec<Uuid> = sqlx::query_scalar!(
        "SELECT id FROM oauth_authorizations WHERE agent_id = $1 AND username = $2 AND revoked_at IS NULL",
        agent_id,
        username,
    )
    .fetch_all(&mut *conn)
    .await?;
    for id in ids {
        revoke(
            conn,
            actor,
            id,
            None,
            "the person may no longer act as the agent",
        )
        .await?;
    }
    Ok(true)
}

/// Replaces the users of an agent (for `policy apply`), recording each difference.
pub async fn set_agent_users(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    users: &[String],
) -> sqlx::Result<()> {
    let Some(agent_id) = super::agents::agent_id(conn, agent).await? else {
        return Ok(());
    };
    let current: Vec<String> = sqlx::query_scalar!(
        "SELECT username FROM agent_users WHERE agent_id = $1",
        agent_id,
    )
    .fetch_all(&mut *conn)
    .await?;
    for u in current.iter().filter(|u| !users.contains(u)) {
        remove_agent_user(conn, actor, agent, u).await?;
    }
    for u in users.iter().filter(|u| !current.contains(u)) {
        add_agent_user(conn, actor, agent, u).await?;
    }
    Ok(())
}
