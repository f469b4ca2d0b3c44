//! Least privilege: what the serving role may do, granted by the owner after migrating.

use sqlx::PgPool;

/// Tables the serving role may only append to and read (or only read).
const AUDIT_TABLES: [(&str, &str); 4] = [
    ("audit_events", "SELECT, INSERT"),
    ("audit_checkpoints", "SELECT, INSERT"),
    ("audit_chain_heads", "SELECT"),
    ("audit_retention_ledger", "SELECT"),
];

/// Whether every embedded migration is recorded as applied, with the same checksum.
pub async fn all_migrations_applied(pool: &PgPool) -> sqlx::Result<bool> {
    let exists: Option<String> =
        sqlx::query_scalar!("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(pool)
            .await?;
    if exists.is_none() {
        return Ok(false);
    }
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query!("SELECT version, checksum FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|r| (r.version, r.checksum))
            .collect();
    Ok(super::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .all(|m| {
            applied
                .iter()
                .any(|(v, c)| *v == m.version && c.as_slice() == m.checksum.as_ref())
        }))
}

/// Grants `role` what `toolgate serve` needs: the control-plane and catalog tables in full,
/// the audit tables only to append and read, the partition function. Audit partitions are
/// reached only through their parent, so the role gets no right on them at all.
pub async fn grant_serving(pool: &PgPool, role: &str) -> anyhow::Result<()> {
    let exists: bool = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) AS "exists!""#,
        role,
    )
    .fetch_one(pool)
    .await?;
    if !exists {
        anyhow::bail!(
            "role {role} does not exist; create it first (CREATE ROLE {role} LOGIN PASSWORD '...')"
        );
    }
    let r: String = sqlx::query_scalar!(r#"SELECT quote_ident($1) AS "quoted!""#, role)
        .fetch_one(pool)
        .await?;
    let mut tx = pool.begin().await?;
    let tables: Vec<String> = sqlx::query_scalar!(
        r#"SELECT quote_ident(c.relname) AS "quoted!" FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
           AND NOT c.relispartition AND c.relname <> '_sqlx_migrations'
           AND c.relname NOT LIKE 'audit\_%'"#,
    )
    .fetch_all(&mut *tx)
    .await?;
    let schema: String =
        sqlx::query_scalar!(r#"SELECT quote_ident(current_schema()) AS "quoted!""#)
            .fetch_one(&mut *tx)
            .await?;
    let mut statements = vec![format!("GRANT USAGE ON SCHEMA {schema} TO {r}")];
    for t in &tables {
        statements.push(format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {r}"
        ));
    }
    for (t, rights) in AUDIT_TABLES {
        statements.push(format!("REVOKE ALL ON {t} FROM {r}"));
        statements.push(format!("GRANT {rights} ON {t} TO {r}"));
    }
    statements.push(format!("REVOKE ALL ON _sqlx_migrations FROM {r}"));
    statements.push(format!("GRANT SELECT ON _sqlx_migrations TO {r}"));
    statements.push(format!(
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {r}"
    ));
    statements.push(format!(
        "GRANT EXECUTE ON FUNCTION audit_ensure_partition(timestamptz) TO {r}"
    ));
    // Names of roles, schemas and tables are no bind parameters: these statements are built
    // here, from identifiers the database quoted above.
    for s in statements {
        sqlx::query(&s).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}
