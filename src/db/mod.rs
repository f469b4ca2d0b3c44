//! All SQL lives under this module, one file per aggregate (the table or tables that change
//! together); the rest of the code speaks in domain types. [`snapshot`] reads them all for
//! the policy snapshot, [`locks`] names the advisory locks.

pub mod accounts;
pub mod agent_users;
pub mod agents;
pub mod approval_rules;
pub mod approvals;
pub mod arguments;
pub mod assertions;
pub mod audit;
pub mod authorizations;
pub mod catalog;
pub mod checkpoints;
pub mod clients;
pub mod credentials;
pub mod grants;
pub mod groups;
pub mod keys;
pub mod limits;
pub mod locks;
pub mod password_resets;
pub mod pins;
pub mod policy_applied;
pub mod public_clients;
pub mod revocations;
pub mod roles;
pub mod rollups;
pub mod sessions;
pub mod signin;
pub mod sinks;
pub mod snapshot;
pub mod sso_flows;
pub mod upstreams;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// The schema migrations, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Why the database could not be opened, in words an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "cannot reach PostgreSQL at {url}: {reason}. Start one (a local PostgreSQL, or `docker compose up -d db`) or point --database-url / DATABASE_URL at it"
    )]
    Unreachable { url: String, reason: String },
    #[error("cannot create database `{name}` at {url}: {reason}")]
    Create {
        name: String,
        url: String,
        reason: String,
    },
    #[error("migrating the database at {url} failed: {reason}")]
    Migrate { url: String, reason: String },
    #[error("invalid database URL: {0}")]
    BadUrl(String),
    #[error(
        "database `{name}` does not exist at {url}; check --database-url / DATABASE_URL, or create it with `toolgate migrate`"
    )]
    Missing { name: String, url: String },
}

/// Whether opening a database may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfMissing {
    /// For `serve` and `migrate`: a fresh install starts from nothing.
    Create,
    /// For every other command: a mistyped URL must not leave an empty database behind and then
    /// answer "not found" about everything.
    Fail,
}

/// Hides the password when a URL is printed.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Connects, creating the database if it does not exist yet.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, ConnectError> {
    open(url, max_connections, IfMissing::Create).await
}

/// Connects to a database that must already exist.
pub async fn connect_existing(url: &str, max_connections: u32) -> Result<PgPool, ConnectError> {
    open(url, max_connections, IfMissing::Fail).await
}

async fn open(
    url: &str,
    max_connections: u32,
    if_missing: IfMissing,
) -> Result<PgPool, ConnectError> {
    let shown = redact_url(url);
    let options =
        PgConnectOptions::from_str(url).map_err(|e| ConnectError::BadUrl(e.to_string()))?;
    let options = options.log_statements(tracing::log::LevelFilter::Trace);
    match options.connect().await {
        Ok(conn) => {
            let _ = conn.close().await;
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
            if if_missing == IfMissing::Fail {
                return Err(ConnectError::Missing {
                    name: options.get_database().unwrap_or_default().to_owned(),
                    url: shown,
                });
            }
            create_database(&options, &shown).await?;
        }
        Err(e) => {
            return Err(ConnectError::Unreachable {
                url: shown,
                reason: e.to_string(),
            });
        }
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|e| ConnectError::Unreachable {
            url: shown,
            reason: e.to_string(),
        })
}

async fn create_database(options: &PgConnectOptions, shown: &str) -> Result<(), ConnectError> {
    let name = options.get_database().unwrap_or("toolgate").to_owned();
    let admin = options.clone().database("postgres");
    let mut conn = admin
        .connect()
        .await
        .map_err(|e| ConnectError::Unreachable {
            url: shown.to_owned(),
            reason: e.to_string(),
        })?;
    // A database's name is no bind parameter (and the query macros need a database to check
    // against): built here, quoted as an identifier.
    let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    match sqlx::query(&sql).execute(&mut conn).await {
        Ok(_) => {
            tracing::info!(database = %name, "created database");
            Ok(())
        }
        // Another instance created it at the same moment.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => Ok(()),
        Err(e) => Err(ConnectError::Create {
            name,
            url: shown.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Whether the database answers (readiness, and the audit log's recovery check).
pub async fn ping(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query_scalar!(r#"SELECT 1 AS "one!""#)
        .fetch_one(pool)
        .await
        .map(|_| ())
}

/// Applies pending migrations (sqlx takes an advisory lock, so instances may race safely).
///
/// When every migration is already applied nothing is run, so a serving role that may not
/// create tables (see `toolgate migrate --serving-role`) starts on a database its owner
/// migrated.
pub async fn migrate(pool: &PgPool, url: &str) -> Result<(), ConnectError> {
    if roles::all_migrations_applied(pool).await.unwrap_or(false) {
        return Ok(());
    }
    MIGRATOR.run(pool).await.map_err(|e| {
        let denied = match &e {
            sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(d)) => {
                matches!(
                    d.code().as_deref(),
                    Some(INSUFFICIENT_PRIVILEGE | NO_SCHEMA_TO_CREATE_IN)
                )
            }
            _ => false,
        } || e.to_string().contains("permission denied");
        ConnectError::Migrate {
            url: redact_url(url),
            reason: if denied {
                format!(
                    "{e}. This role may not change the schema: migrate as the database's owner and grant this role what it needs with `toolgate migrate --serving-role <this role>` (DATABASE_URL set to the owner's URL), then start again"
                )
            } else {
                e.to_string()
            },
        }
    })
}

/// SQLSTATE of "permission denied".
const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// SQLSTATE of "no schema has been selected to create in": the role may not even use `public`.
const NO_SCHEMA_TO_CREATE_IN: &str = "3F000";

/// Records one control-plane change in the same transaction as the change.
///
/// Every mutation of agents, grants, limits, clients, keys and tokens goes through here: it
/// appends an `admin.change` event to the audit log's control-plane chain, so the change and
/// its record commit or fail together, saying who changed what, from what, to what.
pub async fn record_change(
    tx: &mut sqlx::PgConnection,
    actor: &str,
    action: crate::audit::AdminAction,
    resource: &str,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> sqlx::Result<()> {
    let event = change_event(actor, action, resource, before, after);
    audit::append_in_tx(tx, crate::audit::instance_name(), event).await
}

/// The `admin.change` event [`record_change`] appends.
pub fn change_event(
    actor: &str,
    action: crate::audit::AdminAction,
    resource: &str,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> crate::audit::AuditEvent {
    let mut event = crate::audit::AuditEvent::new(
        crate::audit::EventKind::AdminChange,
        crate::audit::Outcome::Success,
    )
    .from_current_origin();
    event.admin_user = Some(actor.to_owned());
    event.resource = Some(resource.to_owned());
    event.details = Some(
        serde_json::json!({"action": action.as_str(), "before": before, "after": after})
            .to_string(),
    );
    event
}

/// Records many control-plane changes (events of [`change_event`]), in order, in the same
/// transaction as the changes: what as many [`record_change`] calls would record.
pub async fn record_changes(
    tx: &mut sqlx::PgConnection,
    events: Vec<crate::audit::AuditEvent>,
) -> sqlx::Result<()> {
    audit::append_many_in_tx(tx, crate::audit::instance_name(), events).await
}
