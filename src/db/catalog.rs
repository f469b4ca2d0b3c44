//! The shared catalog table.

use sqlx::PgPool;

use crate::pool::Catalog;

/// Makes the `tools` table match the catalog this instance loaded from `origin`.
pub async fn sync(pool: &PgPool, catalog: &Catalog, origin: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let names: Vec<String> = catalog
        .tools()
        .map(|t| t.name.as_str().to_owned())
        .collect();
    sqlx::query("DELETE FROM tools WHERE origin = $1 AND NOT (name = ANY($2))")
        .bind(origin)
        .bind(&names)
        .execute(&mut *tx)
        .await?;
    for t in catalog.tools() {
        sqlx::query(
            "INSERT INTO tools (name, group_name, title, description, input_schema, content_hash, source, origin, definition)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (name) DO UPDATE SET group_name = EXCLUDED.group_name, title = EXCLUDED.title,
                 description = EXCLUDED.description, input_schema = EXCLUDED.input_schema,
                 content_hash = EXCLUDED.content_hash, source = EXCLUDED.source, origin = EXCLUDED.origin,
                 definition = EXCLUDED.definition, updated_at = now()
             WHERE tools.content_hash IS DISTINCT FROM EXCLUDED.content_hash OR tools.origin <> EXCLUDED.origin
                 OR tools.definition IS NULL",
        )
        .bind(t.name.as_str())
        .bind(&t.group)
        .bind(&t.title)
        .bind(&t.description)
        .bind(serde_json::Value::Object((*t.input_schema).clone()))
        .bind(&t.content_hash)
        .bind(t.source.label())
        .bind(origin)
        .bind(t.definition())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Tool names currently in the table, for checks run without loading the pool.
pub async fn names(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT name FROM tools ORDER BY name")
        .fetch_all(pool)
        .await
}
