//! Admin sign-in throttling, shared by every instance: one GCRA row per key.

use std::time::Duration;

use sqlx::PgPool;

/// Longest throttle key stored (the column's check says the same).
pub const MAX_KEY: usize = 80;

/// Charges one attempt to `key` under "`burst` at once, then one per `period`", or says how
/// long to wait when its budget is spent (nothing is charged then).
///
/// The check and the charge are one statement: concurrent attempts on any instances are
/// serialised by the row lock, so a burst of guesses cannot all pass before any is counted.
pub async fn charge(
    pool: &PgPool,
    key: &str,
    period: Duration,
    burst: u32,
) -> sqlx::Result<Result<(), Duration>> {
    let charged = sqlx::query!(
        r#"WITH prev AS (SELECT tat FROM admin_signin_throttle WHERE key = $1),
         charged AS (
           INSERT INTO admin_signin_throttle AS t (key, tat)
           VALUES ($1, now() + make_interval(secs => $2))
           ON CONFLICT (key) DO UPDATE
             SET tat = GREATEST(t.tat, now()) + make_interval(secs => $2)
             WHERE GREATEST(t.tat, now()) <= now() + make_interval(secs => $2 * ($3 - 1))
           RETURNING tat
         )
         SELECT EXISTS (SELECT 1 FROM charged) AS "admitted!",
                EXTRACT(EPOCH FROM (SELECT tat FROM prev)
                        - now() - make_interval(secs => $2 * ($3 - 1)))::float8 AS wait"#,
        key,
        period.as_secs_f64(),
        i32::try_from(burst.max(1)).unwrap_or(i32::MAX),
    )
    .fetch_one(pool)
    .await?;
    let (admitted, wait) = (charged.admitted, charged.wait);
    if admitted {
        return Ok(Ok(()));
    }
    // No earlier row seen (another instance inserted it meanwhile): one period is the bound.
    let wait = wait
        .filter(|w| w.is_finite() && *w > 0.0)
        .map_or(period, Duration::from_secs_f64);
    Ok(Err(wait))
}

/// Deletes keys back at their full burst (a missing row means the same); returns how many.
pub async fn prune(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM admin_signin_throttle WHERE tat < now()")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
