//! Rollups for the charts: a follower reads the log in commit order from its own cursor and
//! adds each tool call's outcome and latency to totals per minute and per hour (for all, per
//! agent, per tool), and each refusal to a per-minute row naming its reason and rule, in the
//! same transaction that moves its cursor, so every row is counted exactly once whichever
//! instance reads it. Pages read the rollups: what a chart costs follows the time range, not
//! the size of the log.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use sqlx::PgPool;

use super::chain::ChainedEvent;
use super::{EventKind, Outcome};
use crate::db;
use crate::db::rollups::Scope;

/// The follower's cursor, beside the sinks'.
pub const CURSOR: &str = "internal:rollup";
/// Upper bounds of the latency buckets, in milliseconds; one more bucket holds the rest.
pub const BOUNDS_MS: [i64; 14] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000,
];
const BUCKETS: usize = BOUNDS_MS.len() + 1;
const BATCH: i64 = 2000;

/// Starts the follower (one per instance; the cursor's lock lets one work at a time).
pub fn spawn(pool: PgPool) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(1);
        loop {
            match step(&pool).await {
                Ok(n) => {
                    backoff = Duration::from_secs(1);
                    if n < BATCH as usize {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "audit rollups: a batch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
}

/// What one counted row adds.
struct Counted {
    minute: DateTime<Utc>,
    agent: String,
    tool: String,
    outcome: String,
    latency_ms: Option<i64>,
    /// Why it was refused, and by which rule (`""` when the reason is the whole story).
    refusal: Option<(&'static str, String)>,
}

/// A totals row's key: granularity, start, scope, outcome.
type TotalKey = (&'static str, DateTime<Utc>, Scope, String);
/// A refusals row's key: minute, agent, tool, reason, rule.
type RefusalKey = (DateTime<Utc>, String, String, &'static str, String);
/// Calls and their latency histogram.
type Counts = (i64, [i64; BUCKETS]);

/// What a row adds to the rollups, if anything.
fn counted(r: &ChainedEvent) -> Option<Counted> {
    let e = &r.event;
    let kind = EventKind::parse(&e.event_type)?;
    let outcome = Outcome::parse(&e.outcome)?;
    // A call that ran is counted by its result; one refused before it ran by its call row.
    let counts = match kind {
        EventKind::ToolResult => true,
        EventKind::ToolCall => outcome != Outcome::Started,
        _ => false,
    };
    if !counts {
        return None;
    }
    let refusal = match outcome {
        Outcome::Denied => Some(argument_rule(e.details.as_deref()).map_or_else(
            || ("not granted", String::new()),
            |rule| ("argument rule", rule),
        )),
        Outcome::RateLimited => Some(("rate limit", String::new())),
        Outcome::InvalidArguments => Some(("input schema", String::new())),
        _ => None,
    };
    Some(Counted {
        minute: e.at.duration_trunc(chrono::Duration::minutes(1)).ok()?,
        agent: e.agent.clone().unwrap_or_default(),
        tool: e.tool.clone().unwrap_or_default(),
        outcome: e.outcome.clone(),
        latency_ms: e.latency_us.map(|us| us / 1000),
        refusal,
    })
}

/// The argument rules a denial names (`<tool or group>.<parameter>`, comma-separated), from
/// the details the gate wrote; none for a call refused as not granted.
fn argument_rule(details: Option<&str>) -> Option<String> {
    let details: serde_json::Value = serde_json::from_str(details?).ok()?;
    let rules = details.get("argument_rules")?.as_array()?;
    let names: Vec<String> = rules
        .iter()
        .map(|r| {
            format!(
                "{}.{}",
                r["on"].as_str().unwrap_or_default(),
                r["param"].as_str().unwrap_or_default()
            )
        })
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// The bucket a latency falls in.
pub fn bucket(ms: i64) -> usize {
    BOUNDS_MS
        .iter()
        .position(|b| ms <= *b)
        .unwrap_or(BOUNDS_MS.len())
}

/// A quantile (0..1) of a latency histogram, as the upper bound of its bucket (the last
/// bucket reads as its lower bound); none when empty.
pub fn quantile(hist: &[i64], q: f64) -> Option<i64> {
    let total: i64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as i64;
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(
                BOUNDS_MS
                    .get(i)
                    .copied()
                    .unwrap_or(BOUNDS_MS[BOUNDS_MS.len() - 1]),
            );
        }
    }
    None
}

/// One batch: rows read (0 when nothing is new or another instance holds the cursor).
pub async fn step(pool: &PgPool) -> Result<usize, super::follow::FollowError> {
    db::sinks::ensure(pool, CURSOR).await?;
    let mut tx = pool.begin().await?;
    let Some(batch) = super::follow::next(pool, &mut tx, CURSOR, BATCH).await? else {
        return Ok(0);
    };
    let rows = &batch.rows;
    // Summed in memory first: one upsert per key, not per row.
    let mut totals: HashMap<TotalKey, Counts> = HashMap::new();
    let mut refusals: HashMap<RefusalKey, i64> = HashMap::new();
    for c in rows.iter().filter_map(counted) {
        let hour = c
            .minute
            .duration_trunc(chrono::Duration::hours(1))
            .unwrap_or(c.minute);
        // An empty name would read as the all-row's key: such a row counts only there.
        let mut scopes = vec![Scope::All];
        if !c.agent.is_empty() {
            scopes.push(Scope::Agent(c.agent.clone()));
        }
        if !c.tool.is_empty() {
            scopes.push(Scope::Tool(c.tool.clone()));
        }
        for granularity_start in [("minute", c.minute), ("hour", hour)] {
            for scope in &scopes {
                let key = (
                    granularity_start.0,
                    granularity_start.1,
                    scope.clone(),
                    c.outcome.clone(),
                );
                let t = totals.entry(key).or_insert((0, [0; BUCKETS]));
                t.0 += 1;
                if let Some(ms) = c.latency_ms {
                    t.1[bucket(ms)] += 1;
                }
            }
        }
        if let Some((reason, rule)) = c.refusal {
            *refusals
                .entry((c.minute, c.agent, c.tool, reason, rule))
                .or_default() += 1;
        }
    }
    for ((granularity, start, scope, outcome), (calls, hist)) in &totals {
        db::rollups::add_total(&mut tx, granularity, *start, scope, outcome, *calls, hist).await?;
    }
    for ((minute, agent, tool, reason, rule), calls) in &refusals {
        db::rollups::add_refusals(&mut tx, *minute, agent, tool, reason, rule, *calls).await?;
    }
    super::follow::done(&mut tx, CURSOR, &batch).await?;
    tx.commit().await?;
    Ok(batch.rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(1_000_000), BOUNDS_MS.len());
        let mut h = [0i64; BUCKETS];
        h[bucket(3)] = 50; // ≤ 5 ms
        h[bucket(150)] = 45; // ≤ 200 ms
        h[bucket(900)] = 5; // ≤ 1000 ms
        assert_eq!(quantile(&h, 0.5), Some(5));
        assert_eq!(quantile(&h, 0.95), Some(200));
        assert_eq!(quantile(&h, 0.99), Some(1000));
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
    }
}
