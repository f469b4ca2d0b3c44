//! What the last real `policy apply` wrote from the files: agents, grants and users.

use sqlx::PgConnection;

/// One thing the files wrote: `(agent, kind, value)`, kind `agent` (value empty), `grant` or
/// `user`.
pub type AppliedRow = (String, String, String);

/// Everything the last real apply wrote.
pub async fn load(conn: &mut PgConnection) -> sqlx::Result<Vec<AppliedRow>> {
    Ok(
        sqlx::query!("SELECT agent, kind, value FROM policy_applied ORDER BY agent, kind, value")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| (r.agent, r.kind, r.value))
            .collect(),
    )
}

/// Replaces the record with what this apply's files hold (every agent in the files; agents
/// no longer in them lose theirs).
pub async fn replace(conn: &mut PgConnection, rows: &[AppliedRow]) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM policy_applied")
        .execute(&mut *conn)
        .await?;
    let agents: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let kinds: Vec<String> = rows.iter().map(|r| r.1.clone()).collect();
    let values: Vec<String> = rows.iter().map(|r| r.2.clone()).collect();
    sqlx::query!(
        "INSERT INTO policy_applied (agent, kind, value)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[])
         ON CONFLICT DO NOTHING",
        &agents,
        &kinds,
        &values,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}
