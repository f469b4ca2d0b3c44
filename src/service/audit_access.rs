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

/// An `after_id` cursor must name a row: a mistyped or retired one would otherwise read as
/// "nothing new" forever.
async fn check_cursor(on: Plane<'_>, filter: &AuditFilter) -> Result<()> {
    match filter.after_id {
        Some(id) if id < 0 => Err(ServiceError::Invalid(format!(
            "after_id {id}: pass 0 to start from the beginning, or an id from the previous read"
        ))),
        Some(id) if id > 0 && !db::audit::cursor_exists(on.db(), id).await? => {
            Err(ServiceError::Invalid(format!(
                "after_id {id} names no row of the audit log (retention may have dropped it): pass an id from the previous read, or 0 with since= to start again"
            )))
        }
        _ => Ok(()),
    }
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
    check_cursor(on, filter).await?;
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
    check_cursor(on, &filter).await?;
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

/// Calls and refusals since `since`: totals from the rollups (the dashboard's figures, never a
/// scan of the log), so not a read of the log's contents.
pub async fn counts_since<'a>(
    on: impl Into<Plane<'a>>,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<(i64, i64)> {
    Ok(db::rollups::counts_since(on.into().db(), since).await?)
}

/// The span a chart covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Range {
    #[default]
    Hour,
    Day,
    Week,
}

impl Range {
    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
        }
    }

    /// The whole span and one bar's width, in seconds.
    /// The rollup granularity a chart of this span reads.
    pub fn granularity(self) -> &'static str {
        match self {
            Range::Hour | Range::Day => "minute",
            Range::Week => "hour",
        }
    }

    pub fn span_and_step(self) -> (i64, i64) {
        match self {
            Range::Hour => (3600, 60),
            Range::Day => (86_400, 900),
            Range::Week => (604_800, 3600),
        }
    }
}

/// One bar of a chart: calls that succeeded, failed, or were refused, and latency.
#[derive(Debug, Clone, Default)]
pub struct Point {
    pub start: chrono::DateTime<chrono::Utc>,
    pub ok: i64,
    pub errors: i64,
    pub denials: i64,
    pub p50_ms: Option<i64>,
    pub p95_ms: Option<i64>,
}

/// Tool calls over `range`, from the rollups (totals, not rows: not a read of the log's
/// contents), of everything, one agent or one tool. Every bar is present, empty ones at zero.
pub async fn activity<'a>(
    on: impl Into<Plane<'a>>,
    range: Range,
    scope: &db::rollups::Scope,
) -> Result<Vec<Point>> {
    use crate::audit::rollup::quantile;
    let (span, step) = range.span_and_step();
    let now = chrono::Utc::now().timestamp();
    let first = (now - span) / step * step + step;
    let since = chrono::DateTime::from_timestamp(first, 0).unwrap_or_default();
    let buckets =
        db::rollups::series(on.into().db(), since, step, range.granularity(), scope).await?;
    let n = (span / step) as usize;
    let mut points: Vec<Point> = (0..n)
        .map(|i| Point {
            start: chrono::DateTime::from_timestamp(first + i as i64 * step, 0).unwrap_or_default(),
            ..Point::default()
        })
        .collect();
    let mut hist: Vec<Vec<i64>> = vec![vec![0; crate::audit::rollup::BOUNDS_MS.len() + 1]; n];
    for b in buckets {
        let i = (b.start.timestamp() - first) / step;
        let Some(p) = usize::try_from(i).ok().and_then(|i| points.get_mut(i)) else {
            continue;
        };
        match Outcome::parse(&b.outcome) {
            Some(Outcome::Success) => p.ok += b.calls,
            Some(Outcome::Denied | Outcome::RateLimited | Outcome::InvalidArguments) => {
                p.denials += b.calls
            }
            _ => p.errors += b.calls,
        }
        if let Some(h) = hist.get_mut(i as usize) {
            for (a, v) in h.iter_mut().zip(&b.latency_ms) {
                *a += v;
            }
        }
    }
    for (p, h) in points.iter_mut().zip(&hist) {
        p.p50_ms = quantile(h, 0.5);
        p.p95_ms = quantile(h, 0.95);
    }
    Ok(points)
}

/// Refusals over `range` by agent, tool, reason and rule, most first (twenty at most); of
/// one agent or one tool when given.
pub async fn refusals<'a>(
    on: impl Into<Plane<'a>>,
    range: Range,
    agent: Option<&str>,
    tool: Option<&str>,
) -> Result<Vec<db::rollups::Refusals>> {
    let since = chrono::Utc::now() - chrono::Duration::seconds(range.span_and_step().0);
    Ok(db::rollups::refusals(on.into().db(), since, agent, tool, 20).await?)
}
