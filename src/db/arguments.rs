//! An agent's argument rules, per tool or group.

use std::collections::HashMap;

use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::arguments::ArgumentRules;

/// Sets (creates or replaces) an agent's argument rules for one tool or group. Returns
/// whether the agent exists.
pub async fn set_argument_rules(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    rules: &ArgumentRules,
) -> sqlx::Result<bool> {
    let params = json!(rules.params);
    let before: Option<Option<Value>> = sqlx::query_scalar!(
        "SELECT (SELECT r.params FROM agent_argument_rules r WHERE r.agent_id = a.id AND r.target = $2)
         FROM agents a WHERE a.name = $1",
        agent,
        &rules.target,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = before else {
        return Ok(false);
    };
    sqlx::query!(
        "INSERT INTO agent_argument_rules (agent_id, target, params, created_by)
         SELECT id, $2, $3, $4 FROM agents WHERE name = $1
         ON CONFLICT (agent_id, target) DO UPDATE
             SET params = EXCLUDED.params, created_by = EXCLUDED.created_by, updated_at = now()",
        agent,
        &rules.target,
        &params,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::ArgumentsSet,
        &format!("agent:{agent}/arguments:{}", rules.target),
        before,
        Some(params),
    )
    .await?;
    Ok(true)
}

/// Removes an agent's argument rules for one tool or group. Returns whether there were any.
pub async fn delete_argument_rules(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<bool> {
    let gone: Option<Value> = sqlx::query_scalar!(
        "DELETE FROM agent_argument_rules r USING agents a
         WHERE r.agent_id = a.id AND a.name = $1 AND r.target = $2 RETURNING r.params",
        agent,
        target,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = gone else {
        return Ok(false);
    };
    record_change(
        conn,
        actor,
        AdminAction::ArgumentsDelete,
        &format!("agent:{agent}/arguments:{target}"),
        Some(before),
        None,
    )
    .await?;
    Ok(true)
}

/// Every agent's argument rules, by agent id.
pub(super) async fn by_agent(
    conn: &mut PgConnection,
) -> sqlx::Result<HashMap<Uuid, Vec<ArgumentRules>>> {
    let mut arguments: HashMap<Uuid, Vec<ArgumentRules>> = HashMap::new();
    for r in
        sqlx::query!("SELECT agent_id, target, params FROM agent_argument_rules ORDER BY target")
            .fetch_all(&mut *conn)
            .await?
    {
        let params: Value = r.params;
        // Checked when written; a row that does not parse is a corrupt database, reported as
        // such rather than served without its rules.
        let params = crate::policy::arguments::parse_params(&params)
            .map_err(|e| sqlx::Error::Decode(format!("agent_argument_rules row: {e}").into()))?;
        arguments
            .entry(r.agent_id)
            .or_default()
            .push(ArgumentRules {
                target: r.target,
                params,
            });
    }
    Ok(arguments)
}
