//! The shared catalog table.

use std::collections::HashMap;

use sqlx::PgPool;

use crate::pool::Catalog;

/// Rows written per statement: large enough that a pool of 100,000 tools is a hundred round
/// trips, small enough that one batch's definitions stay a few megabytes.
const BATCH: usize = 1000;

/// Makes the `tools` table match the catalog this instance loaded from `origin`.
///
/// Only the rows that differ are written, in batches: at every start an instance syncs its
/// whole pool, and one statement per tool made that the largest cost of starting a large pool.
pub async fn sync(pool: &PgPool, catalog: &Catalog, origin: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let names: Vec<String> = catalog
        .tools()
        .map(|t| t.name.as_str().to_owned())
        .collect();
    sqlx::query!(
        "DELETE FROM tools WHERE origin = $1 AND NOT (name = ANY($2))",
        origin,
        &names,
    )
    .execute(&mut *tx)
    .await?;
    drop(names);
    // What is already there: a row is current when its hash and origin match and it has its
    // definition (the condition the upsert below also checks, for a concurrent writer).
    let current: HashMap<String, String> = sqlx::query!(
        "SELECT name, content_hash FROM tools WHERE origin = $1 AND definition IS NOT NULL",
        origin,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| (r.name, r.content_hash))
    .collect();
    let stale: Vec<_> = catalog
        .tools()
        .filter(|t| {
            !current
                .get(t.name.as_str())
                .is_some_and(|h| t.content_hash == *h)
        })
        .collect();
    drop(current);
    for batch in stale.chunks(BATCH) {
        let (mut name, mut group, mut title, mut description) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut schema, mut hash, mut source, mut definition) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for t in batch {
            name.push(t.name.as_str().to_owned());
            group.push(t.group().to_owned());
            title.push(t.title.clone());
            description.push(t.description.clone());
            schema.push(t.input_schema.text().to_owned());
            hash.push(t.content_hash.hex());
            source.push(t.source.label().to_owned());
            definition.push(t.definition().to_string());
        }
        // Titles and descriptions may be NULL: the macros check no `Option` inside an array, so
        // those two arguments go unchecked (`as _`).
        sqlx::query!(
            "INSERT INTO tools (name, group_name, title, description, input_schema, content_hash, source, origin, definition)
             SELECT n, g, t, d, s::jsonb, h, src, $8, def::jsonb
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $9::text[])
                 AS u(n, g, t, d, s, h, src, def)
             ON CONFLICT (name) DO UPDATE SET group_name = EXCLUDED.group_name, title = EXCLUDED.title,
                 description = EXCLUDED.description, input_schema = EXCLUDED.input_schema,
                 content_hash = EXCLUDED.content_hash, source = EXCLUDED.source, origin = EXCLUDED.origin,
                 definition = EXCLUDED.definition, updated_at = now()
             WHERE tools.content_hash IS DISTINCT FROM EXCLUDED.content_hash OR tools.origin <> EXCLUDED.origin
                 OR tools.definition IS NULL",
            &name,
            &group,
            title as _,
            description as _,
            &schema,
            &hash,
            &source,
            origin,
            &definition,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Tool names currently in the table, for checks run without loading the pool.
pub async fn names(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT name FROM tools ORDER BY name")
        .fetch_all(pool)
        .await
}
