//! Upstream MCP servers: the spec of each upstream group.

use serde_json::{Value, json};
use sqlx::PgConnection;

use super::record_change;
use crate::audit::AdminAction;

/// Upstream specs by group name.
pub async fn upstreams(
    conn: &mut PgConnection,
) -> sqlx::Result<std::collections::BTreeMap<String, Value>> {
    Ok(
        sqlx::query!("SELECT name, spec FROM upstreams ORDER BY name")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| (r.name, r.spec))
            .collect(),
    )
}

pub async fn set_upstream(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
    before: Option<&Value>,
    spec: &Value,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO upstreams (name, spec) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()",
        name,
        spec,
    )
    .execute(&mut *conn)
    .await?;
    record_change(
        conn,
        actor,
        AdminAction::UpstreamSet,
        &format!("upstream:{name}"),
        before.map(crate::upstream::on_record),
        Some(crate::upstream::on_record(spec)),
    )
    .await
}

pub async fn delete_upstream(
    conn: &mut PgConnection,
    actor: &str,
    name: &str,
) -> sqlx::Result<bool> {
    let gone = sqlx::query!("DELETE FROM upstreams WHERE name = $1", name)
        .execute(&mut *conn)
        .await?;
    if gone.rows_affected() > 0 {
        record_change(
            conn,
            actor,
            AdminAction::UpstreamDelete,
            &format!("upstream:{name}"),
            Some(json!({"name": name})),
            None,
        )
        .await?;
    }
    Ok(gone.rows_affected() > 0)
}
