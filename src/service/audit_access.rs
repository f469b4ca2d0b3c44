//! Reading the audit log, which is itself on record.
//!
//! Every access to the log's rows, from the admin UI, the JSON API or the command line, goes
//! through here and leaves an `audit.read` or `audit.export` row in the control-plane chain
//! before a single row is shown: who, through which channel, from where (the request's
//! address and agent, or the command line's account) and with what filter. Writing that
//! record is the price of the read: when it cannot be written the read is refused, so there
//! is no access to the log that the log does not show (PCI DSS 10.2.1.3).

use futures::Stream;
use serde::Serialize;
use serde_json::{Value, json};

use super::{Plane, Result, ServiceError};
use crate::audit::chain::ChainedEvent;
use crate::audit::export::{self, Format};
use crate::audit::{AuditEvent, EventKind, Outcome};
use crate::db;
use crate::db::audit::AuditFilter;

/// Through what the log was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// The admin UI: a person signed in.
    Ui,
    /// The JSON API, with the admin token.
    Api,
    /// The command line, with database credentials.
    Cli,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Ui => "ui",
            Channel::Api => "api",
            Channel::Cli => "cli",
        }
    }
}

/// Who reads the log, and through what.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    /// As the audit log names actors: `admin:<username>`, `api:admin-token`, `cli`.
    pub who: &'a str,
    pub channel: Channel,
}

/// What a read covered, as the record of it says.
enum Access<'a> {
    Rows {
        filter: &'a AuditFilter,
        before: Option<i64>,
        limit: i64,
    },
    One(i64),
    Export {
        format: Format,
        filter: &'a AuditFilter,
    },
}

/// The account the command line runs as, for the record of its reads: the database
/// credentials say little about the person at the terminal.
fn os_account() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .filter(|u| !u.is_empty())
        .map(|u| u.chars().take(64).collect())
}

fn access_event(reader: Reader<'_>, access: &Access<'_>) -> AuditEvent {
    let (kind, mut details) = match access {
        Access::Rows {
            filter,
            before,
            limit,
        } => (
            EventKind::AuditRead,
            json!({"filter": filter, "before": before, "limit": limit}),
        ),
        Access::One(id) => (EventKind::AuditRead, json!({"id": id})),
        Access::Export { format, filter } => (
            EventKind::AuditExport,
            json!({"format": format.as_str(), "filter": filter}),
        ),
    };
    details["channel"] = Value::from(reader.channel.as_str());
    if reader.channel == Channel::Cli {
        details["os_user"] = os_account().map_or(Value::Null, Value::from);
    }
    // The request's address, agent and id (the HTTP layer's task-local origin); none on the
    // command line.
    let mut e = AuditEvent::new(kind, Outcome::Success).from_current_origin();
    e.admin_user = Some(reader.who.to_owned());
    e.resource = Some("audit_events".into());
    e.details = Some(details.to_string());
    e
}

/// Makes the record of an access durable, in the control-plane chain, before the access.
async fn record(on: Plane<'_>, reader: Reader<'_>, access: &Access<'_>) -> Result<()> {
    let event = access_event(reader, access);
    let mut tx = on.db().begin().await?;
    db::audit::append_in_tx(&mut tx, crate::audit::instance_name(), event)
        .await
        .map_err(|e| {
            ServiceError::Other(anyhow::anyhow!(
                "the audit log is not shown: recording this access to it failed: {e}"
            ))
        })?;
    tx.commit().await?;
    Ok(())
}

/// A page of rows, newest first, older than `before` when given.
pub async fn rows<'a>(
    on: impl Into<Plane<'a>>,
    reader: Reader<'_>,
    filter: &AuditFilter,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<ChainedEvent>> {
    let on = on.into();
    record(
        on,
        reader,
        &Access::Rows {
            filter,
            before,
            limit,
        },
    )
    .await?;
    Ok(db::audit::list(on.db(), filter, before, limit).await?)
}

/// One row by id.
pub async fn row<'a>(
    on: impl Into<Plane<'a>>,
    reader: Reader<'_>,
    id: i64,
) -> Result<ChainedEvent> {
    let on = on.into();
    record(on, reader, &Access::One(id)).await?;
    db::audit::get(on.db(), id)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("audit event {id}")))
}

/// The export of every row `filter` selects, streamed (one row in memory at a time), once its
/// record is durable.
pub async fn export<'a>(
    on: impl Into<Plane<'a>>,
    reader: Reader<'_>,
    format: Format,
    filter: AuditFilter,
) -> Result<impl Stream<Item = Result<bytes::Bytes, sqlx::Error>> + Send + 'static> {
    let on = on.into();
    record(
        on,
        reader,
        &Access::Export {
            format,
            filter: &filter,
        },
    )
    .await?;
    Ok(export::stream(on.db().clone(), format, filter))
}

/// Calls and refusals since `since`: totals, not rows (the dashboard's figures), so not a
/// read of the log's contents.
pub async fn counts_since<'a>(
    on: impl Into<Plane<'a>>,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<(i64, i64)> {
    Ok(db::audit::counts_since(on.into().db(), since).await?)
}
