//! An agent's rate limits.

use std::collections::HashMap;

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::agents::agent_id;
use super::record_change;
use crate::audit::AdminAction;
use crate::limits::{Limit, Period};
use crate::policy::GrantTarget;
use crate::policy::snapshot::RateLimitRecord;

/// Replaces an agent's rate limits.
pub async fn set_limits(
    conn: &mut PgConnection,
    actor: &str,
    agent: &str,
    before: &[RateLimitRecord],
    limits: &[RateLimitRecord],
) -> sqlx::Result<()> {
    let Some(agent_id) = agent_id(conn, agent).await? else {
        return Ok(());
    };
    sqlx::query!("DELETE FROM rate_limits WHERE agent_id = $1", agent_id)
        .execute(&mut *conn)
        .await?;
    for l in limits {
        sqlx::query!(
            "INSERT INTO rate_limits (id, agent_id, pattern, rate, period, burst) VALUES ($1, $2, $3, $4, $5, $6)",
            Uuid::now_v7(),
            agent_id,
            l.pattern.as_ref().map(ToString::to_string),
            l.limit.count(),
            l.limit.period().as_str(),
            l.limit.burst_written().map(|b| b as i32),
        )
            .execute(&mut *conn)
            .await?;
    }
    record_change(
        conn,
        actor,
        AdminAction::RateLimitSet,
        &format!("agent:{agent}"),
        Some(json!(before)),
        Some(json!(limits)),
    )
    .await
}

/// Every rate limit, by agent id.
pub(super) async fn by_agent(
    conn: &mut PgConnection,
) -> sqlx::Result<HashMap<Uuid, Vec<RateLimitRecord>>> {
    let mut limits: HashMap<Uuid, Vec<RateLimitRecord>> = HashMap::new();
    for r in sqlx::query!("SELECT agent_id, pattern, rate, period, burst FROM rate_limits ORDER BY pattern NULLS FIRST")
    .fetch_all(&mut *conn)
    .await?
    {
        let period: String = r.period;
        let limit = Period::parse(&period)
            .ok_or_else(|| format!("unknown period {period:?}"))
            .and_then(|p| {
                let burst = r.burst.map(|b| b.max(0) as u32);
                Limit::new(r.rate, p, burst)
            })
            // The table's checks admit only what `Limit::new` does; a row that slips past
            // them is a corrupt database, reported as such rather than served loosely.
            .map_err(|e| sqlx::Error::Decode(format!("rate_limits row: {e}").into()))?;
        // Every way in parses the pattern before it is stored; one that does not parse (an
        // edit by hand) never matched a call, and is left out as it always was in effect.
        let pattern = match r.pattern.as_deref().map(GrantTarget::parse).transpose() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(agent_id = %r.agent_id, error = %e, "rate limit with an unreadable pattern ignored");
                continue;
            }
        };
        limits
            .entry(r.agent_id)
            .or_default()
            .push(RateLimitRecord { pattern, limit });
    }
    Ok(limits)
}
