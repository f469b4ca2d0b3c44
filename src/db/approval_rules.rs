//! An agent's approval rules, per tool, group or `@destructive`.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::record_change;
use crate::audit::AdminAction;
use crate::policy::approvals::{self, ApprovalRule};

/// Sets (creates or replaces) an agent's approval rule for one target. Returns whether the
/// agent exists.
pub async fn set_approval_rule(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    rule: &ApprovalRule,
) -> sqlx::Result<bool> {
    let value = rule.to_value();
    let before: Option<Option<Value>> = sqlx::query_scalar!(
        "SELECT (SELECT r.rule FROM agent_approval_rules r WHERE r.agent_id = a.id AND r.target = $2)
         FROM agents a WHERE a.name = $1",
        agent,
        &rule.target,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(before) = before else {
        return Ok(false);
    };
    sqlx::query!(
        "INSERT INTO agent_approval_rules (agent_id, target, rule, created_by)
         SELECT id, $2, $3, $4 FROM agents WHERE name = $1
         ON CONFLICT (agent_id, target) DO UPDATE
             SET rule = EXCLUDED.rule, created_by = EXCLUDED.created_by, updated_at = now()",
        agent,
        &rule.target,
        &value,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::ApprovalRuleSet,
        &format!("agent:{agent}/approval:{}", rule.target),
        before,
        Some(value),
    )
    .await?;
    Ok(true)
}

/// Removes an agent's approval rule for one target. Returns whether there was one.
pub async fn delete_approval_rule(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    target: &str,
) -> sqlx::Result<bool> {
    let gone: Option<Value> = sqlx::query_scalar!(
        "DELETE FROM agent_approval_rules r USING agents a
         WHERE r.agent_id = a.id AND a.name = $1 AND r.target = $2 RETURNING r.rule",
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
        AdminAction::ApprovalRuleDelete,
        &format!("agent:{agent}/approval:{target}"),
        Some(before),
        None,
    )
    .await?;
    Ok(true)
}

/// Every agent's approval rules, by agent id.
pub(super) async fn by_agent(
    conn: &mut PgConnection,
) -> sqlx::Result<HashMap<Uuid, Vec<ApprovalRule>>> {
    let mut out: HashMap<Uuid, Vec<ApprovalRule>> = HashMap::new();
    for r in sqlx::query!("SELECT agent_id, target, rule FROM agent_approval_rules ORDER BY target")
        .fetch_all(&mut *conn)
        .await?
    {
        // Checked when written; a row that does not parse is a corrupt database, reported as
        // such rather than served without the approval it asks for.
        let rule = approvals::parse(&r.target, &r.rule)
            .map_err(|e| sqlx::Error::Decode(format!("agent_approval_rules row: {e}").into()))?;
        out.entry(r.agent_id).or_default().push(rule);
    }
    Ok(out)
}

/// The roles and approver sets some enabled account holds: an approver outside it names
/// nobody.
pub async fn staffed(conn: &mut PgConnection) -> sqlx::Result<std::collections::BTreeSet<String>> {
    let rows =
        sqlx::query!("SELECT role, approver_sets FROM admin_users WHERE disabled_at IS NULL")
            .fetch_all(&mut *conn)
            .await?;
    let mut out = std::collections::BTreeSet::new();
    for r in rows {
        out.insert(r.role);
        out.extend(r.approver_sets);
    }
    Ok(out)
}
