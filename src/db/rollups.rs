//! Per-minute rollups of tool calls (see `audit::rollup`).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

/// Adds refusals to a minute's row (creating it).
pub async fn add_refusals(
    conn: &mut PgConnection,
    minute: DateTime<Utc>,
    agent: &str,
    tool: &str,
    reason: &str,
    rule: &str,
    calls: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO audit_rollup_refusals AS r (minute, agent, tool, reason, rule, calls)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (minute, agent, tool, reason, rule) DO UPDATE SET calls = r.calls + EXCLUDED.calls",
        minute,
        agent,
        tool,
        reason,
        rule,
        calls
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What a totals row counts: one agent, one tool, or everything.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    All,
    Agent(String),
    Tool(String),
}

impl Scope {
    /// The row's key columns: `(agent, tool)`, `""` where it counts all.
    fn columns(&self) -> (&str, &str) {
        match self {
            Scope::All => ("", ""),
            Scope::Agent(a) => (a, ""),
            Scope::Tool(t) => ("", t),
        }
    }
}

/// Adds counts to a totals row of `granularity` (`minute` or `hour`).
pub async fn add_total(
    conn: &mut PgConnection,
    granularity: &str,
    start: DateTime<Utc>,
    scope: &Scope,
    outcome: &str,
    calls: i64,
    latency_ms: &[i64],
) -> sqlx::Result<()> {
    let (agent, tool) = scope.columns();
    sqlx::query!(
        "INSERT INTO audit_rollup_totals AS r (granularity, start, agent, tool, outcome, calls, latency_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (granularity, agent, tool, start, outcome) DO UPDATE SET
           calls = r.calls + EXCLUDED.calls,
           latency_ms = ARRAY(SELECT a + b FROM unnest(r.latency_ms, EXCLUDED.latency_ms) AS t(a, b))",
        granularity,
        start,
        agent,
        tool,
        outcome,
        calls,
        latency_ms
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// One time bucket's calls of one outcome, and their latency histogram.
pub struct Bucket {
    pub start: DateTime<Utc>,
    pub outcome: String,
    pub calls: i64,
    pub latency_ms: Vec<i64>,
}

/// Calls since `since` in buckets of `step_secs`, by outcome, read from the totals of
/// `granularity` (`minute` or `hour`, no coarser than a bucket), of `scope`.
pub async fn series(
    pool: &PgPool,
    since: DateTime<Utc>,
    step_secs: i64,
    granularity: &str,
    scope: &Scope,
) -> sqlx::Result<Vec<Bucket>> {
    let (agent, tool) = scope.columns();
    let rows = sqlx::query!(
        r#"SELECT to_timestamp(floor(extract(epoch FROM start) / $2) * $2) AS "start!",
                  outcome, sum(calls)::bigint AS "calls!",
                  ARRAY[sum(latency_ms[1]), sum(latency_ms[2]), sum(latency_ms[3]), sum(latency_ms[4]),
                        sum(latency_ms[5]), sum(latency_ms[6]), sum(latency_ms[7]), sum(latency_ms[8]),
                        sum(latency_ms[9]), sum(latency_ms[10]), sum(latency_ms[11]), sum(latency_ms[12]),
                        sum(latency_ms[13]), sum(latency_ms[14]), sum(latency_ms[15])]::bigint[] AS "latency!"
           FROM audit_rollup_totals
           WHERE granularity = $3 AND agent = $4 AND tool = $5 AND start >= $1
           GROUP BY 1, 2 ORDER BY 1"#,
        since,
        step_secs as f64,
        granularity,
        agent,
        tool
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Bucket {
            start: r.start,
            outcome: r.outcome,
            calls: r.calls,
            latency_ms: r.latency,
        })
        .collect())
}

/// Tool calls that ran and calls refused as not granted, since `since`, from the totals.
pub async fn counts_since(pool: &PgPool, since: DateTime<Utc>) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT coalesce(sum(calls) FILTER (WHERE outcome NOT IN ('denied', 'rate_limited', 'invalid_arguments')), 0)::bigint AS "calls!",
                  coalesce(sum(calls) FILTER (WHERE outcome = 'denied'), 0)::bigint AS "denied!"
           FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = '' AND start >= $1"#,
        since
    )
    .fetch_one(pool)
    .await?;
    Ok((r.calls, r.denied))
}

/// Refusals since `since`, summed by agent, tool, reason and rule.
pub struct Refusals {
    pub agent: String,
    pub tool: String,
    pub reason: String,
    pub rule: String,
    pub calls: i64,
}

/// Refusals since `since` by agent, tool, reason and rule, most first; of one agent or one
/// tool when given.
pub async fn refusals(
    pool: &PgPool,
    since: DateTime<Utc>,
    agent: Option<&str>,
    tool: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Refusals>> {
    sqlx::query_as!(
        Refusals,
        r#"SELECT agent, tool, reason, rule, sum(calls)::bigint AS "calls!" FROM audit_rollup_refusals
           WHERE minute >= $1 AND ($2::text IS NULL OR agent = $2) AND ($3::text IS NULL OR tool = $3)
           GROUP BY agent, tool, reason, rule ORDER BY 5 DESC, 1, 2, 3, 4 LIMIT $4"#,
        since,
        agent,
        tool,
        limit
    )
    .fetch_all(pool)
    .await
}
