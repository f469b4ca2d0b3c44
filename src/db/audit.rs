//! The audit table: batched appends, monthly partitions, filtered reads and streams.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use futures::{Stream, StreamExt};
use sqlx::{PgConnection, PgExecutor, PgPool, Postgres, QueryBuilder};

use crate::audit::chain::{self, ChainHead, ChainedEvent, Expectations, Retired};
use crate::audit::checkpoint::SignedCheckpoint;
use crate::audit::{AuditEvent, EventKind, Outcome};

/// The columns of [`AuditRow`], for the queries built at run time (filters, batches). The one
/// query that reads a row by id (see [`get`]) names them in its text, checked at compile time.
const COLUMNS: &str = "id, at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome, agent, client_id, jti, \
    admin_user, tool, resource, remote_addr, user_agent, request_id, call_id, exit_code, error, latency_us, bytes_in, \
    bytes_out, arguments, result_sha256, result, details, flags, person";

/// The first day of `at`'s month and of the month after.
fn month_bounds(at: DateTime<Utc>) -> (NaiveDate, NaiveDate) {
    let start = NaiveDate::from_ymd_opt(at.year(), at.month(), 1).unwrap_or_default();
    let next = if at.month() == 12 {
        NaiveDate::from_ymd_opt(at.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(at.year(), at.month() + 1, 1)
    }
    .unwrap_or_default();
    (start, next)
}

pub fn partition_name(at: DateTime<Utc>) -> String {
    format!("audit_events_y{:04}m{:02}", at.year(), at.month())
}

/// Creates the month partition holding `at` if it does not exist. It runs with the owner's
/// rights (a SECURITY DEFINER function), so a serving role without CREATE can call it.
pub async fn ensure_partition(conn: &mut PgConnection, at: DateTime<Utc>) -> sqlx::Result<()> {
    // The function returns `void`: the one row it answers carries nothing.
    sqlx::query_scalar!("SELECT audit_ensure_partition($1)", at)
        .fetch_one(&mut *conn)
        .await
        .map(|_| ())
}

fn push_row(
    b: &mut sqlx::query_builder::Separated<'_, '_, Postgres, &'static str>,
    r: &ChainedEvent,
) {
    let e = &r.event;
    b.push_bind(e.at)
        .push_bind(r.chain.clone())
        .push_bind(r.chain_seq)
        .push_bind(r.prev_hash.clone())
        .push_bind(r.hash.clone())
        .push_bind(r.instance.clone())
        .push_bind(e.event_type.clone())
        .push_bind(e.outcome.clone())
        .push_bind(e.agent.clone())
        .push_bind(e.client_id.clone())
        .push_bind(e.jti.clone())
        .push_bind(e.admin_user.clone())
        .push_bind(e.tool.clone())
        .push_bind(e.resource.clone())
        .push_bind(e.remote_addr.clone())
        .push_bind(e.user_agent.clone())
        .push_bind(e.request_id.clone())
        .push_bind(e.call_id.clone())
        .push_bind(e.exit_code)
        .push_bind(e.error.clone())
        .push_bind(e.latency_us)
        .push_bind(e.bytes_in)
        .push_bind(e.bytes_out)
        .push_bind(e.arguments.clone())
        .push_bind(e.result_sha256.clone())
        .push_bind(e.result.clone())
        .push_bind(e.details.clone())
        .push_bind(r.flags.clone())
        .push_bind(e.person.clone());
}

const INSERT: &str = "INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome, \
    agent, client_id, jti, admin_user, tool, resource, remote_addr, user_agent, request_id, call_id, exit_code, error, \
    latency_us, bytes_in, bytes_out, arguments, result_sha256, result, details, flags, person) ";

/// Bind parameters per row; Postgres allows 65535 per statement.
const PARAMS_PER_ROW: usize = 29;

/// The most rows [`insert_batch`] takes.
pub const MAX_INSERT_ROWS: usize = 65535 / PARAMS_PER_ROW;

/// Appends rows in one multi-row insert: one round trip, one commit, all or nothing (a
/// batch split over statements could half-commit and leave the writer's chain behind).
pub async fn insert_batch(pool: &PgPool, rows: &[ChainedEvent]) -> sqlx::Result<()> {
    assert!(
        rows.len() <= MAX_INSERT_ROWS,
        "an audit batch of {} rows is over the {MAX_INSERT_ROWS} one insert can carry",
        rows.len()
    );
    if rows.is_empty() {
        return Ok(());
    }
    // Built at run time: one statement of as many rows as the batch has, each row its 29
    // parameters, which no fixed query text can say.
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(INSERT);
    qb.push_values(rows, |mut b, r| push_row(&mut b, r));
    qb.build().execute(pool).await?;
    Ok(())
}

/// Whether the database refused the rows themselves (their values), as opposed to being
/// unreachable or refusing everyone: only then can leaving rows out let the others commit.
pub fn is_refused_data(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("22") || c.starts_with("23") || c.starts_with("54")),
        _ => false,
    }
}

/// The last stored `(chain_seq, hash)` of `chain`, or none if it has no row.
pub async fn last_link(pool: &PgPool, chain: &str) -> sqlx::Result<Option<(i64, String)>> {
    last_link_of(pool, chain).await
}

async fn last_link_of(
    conn: impl PgExecutor<'_>,
    chain: &str,
) -> sqlx::Result<Option<(i64, String)>> {
    Ok(sqlx::query!(
        "SELECT chain_seq, hash FROM audit_events WHERE chain = $1 ORDER BY chain_seq DESC LIMIT 1",
        chain,
    )
    .fetch_optional(conn)
    .await?
    .map(|r| (r.chain_seq, r.hash)))
}

/// Appends one event to the control-plane chain inside the caller's transaction, so that an
/// admin change and its audit record commit or fail together.
pub async fn append_in_tx(
    conn: &mut PgConnection,
    instance: &str,
    event: AuditEvent,
) -> sqlx::Result<()> {
    append_many_in_tx(conn, instance, vec![event]).await
}

/// Appends `events`, in order, to the control-plane chain inside the caller's transaction:
/// what as many [`append_in_tx`] calls would store, in a few statements instead of four per
/// event (a first start that applies 10,000 agents writes 20,000 events).
pub async fn append_many_in_tx(
    conn: &mut PgConnection,
    instance: &str,
    events: Vec<AuditEvent>,
) -> sqlx::Result<()> {
    let mut months: Vec<DateTime<Utc>> = Vec::new();
    for e in &events {
        if !months
            .iter()
            .any(|m| month_bounds(*m) == month_bounds(e.at))
        {
            months.push(e.at);
        }
    }
    for at in months {
        ensure_partition(conn, at).await?;
    }
    // One writer of this chain at a time; held until the caller commits.
    super::locks::hold(conn, super::locks::Lock::ControlPlaneChain).await?;
    let last = last_link_of(&mut *conn, chain::CONTROL_PLANE).await?;
    let (mut seq, mut hash) = last.unwrap_or((0, chain::GENESIS.to_owned()));
    let mut rows = Vec::with_capacity(events.len().min(MAX_INSERT_ROWS));
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        rows.clear();
        for event in events.by_ref().take(MAX_INSERT_ROWS) {
            let row = chain::extend(chain::CONTROL_PLANE, (seq, &hash), instance, event);
            seq = row.chain_seq;
            hash = row.hash.clone();
            rows.push(row);
        }
        // Built at run time, as in `insert_batch`: one multi-row insert.
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(INSERT);
        qb.push_values(&rows, |mut b, r| push_row(&mut b, r));
        qb.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// A row of `audit_events` as stored: read by [`get`] (`query_as!`, checked at compile time)
/// and, by column name, by the queries built at run time.
#[derive(sqlx::FromRow)]
struct AuditRow {
    id: i64,
    at: DateTime<Utc>,
    chain: String,
    chain_seq: i64,
    prev_hash: String,
    hash: String,
    instance: String,
    event_type: String,
    outcome: String,
    agent: Option<String>,
    client_id: Option<String>,
    jti: Option<String>,
    admin_user: Option<String>,
    tool: Option<String>,
    resource: Option<String>,
    remote_addr: Option<String>,
    user_agent: Option<String>,
    request_id: Option<String>,
    call_id: Option<String>,
    exit_code: Option<i32>,
    error: Option<String>,
    latency_us: Option<i64>,
    bytes_in: Option<i64>,
    bytes_out: Option<i64>,
    arguments: Option<String>,
    result_sha256: Option<String>,
    result: Option<String>,
    details: Option<String>,
    flags: Option<String>,
    person: Option<String>,
}

impl From<AuditRow> for ChainedEvent {
    fn from(r: AuditRow) -> Self {
        ChainedEvent {
            id: Some(r.id),
            chain: r.chain,
            chain_seq: r.chain_seq,
            prev_hash: r.prev_hash,
            hash: r.hash,
            instance: r.instance,
            flags: r.flags,
            event: AuditEvent {
                at: r.at,
                event_type: r.event_type,
                outcome: r.outcome,
                agent: r.agent,
                client_id: r.client_id,
                jti: r.jti,
                admin_user: r.admin_user,
                tool: r.tool,
                resource: r.resource,
                remote_addr: r.remote_addr,
                user_agent: r.user_agent,
                request_id: r.request_id,
                call_id: r.call_id,
                exit_code: r.exit_code,
                error: r.error,
                latency_us: r.latency_us,
                bytes_in: r.bytes_in,
                bytes_out: r.bytes_out,
                arguments: r.arguments,
                result_sha256: r.result_sha256,
                result: r.result,
                details: r.details,
                person: r.person,
            },
        }
    }
}

/// Filters shared by listing, export and the admin UI.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AuditFilter {
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub agent: Option<String>,
    pub tool: Option<String>,
    /// Parsed where the filter is written: an unknown kind is refused there, not matched
    /// against nothing.
    #[serde(default, deserialize_with = "crate::audit::blank_is_none")]
    pub event_type: Option<EventKind>,
    #[serde(default, deserialize_with = "crate::audit::blank_is_none")]
    pub outcome: Option<Outcome>,
    /// A person: "what did alice do": the events of tokens a host obtained for her (`act`),
    /// through any host, as any agent, and what she did herself (her sign-ins, her consents
    /// and revocations, her changes as an admin).
    #[serde(default)]
    pub person: Option<String>,
    /// One OAuth client: an agent's deployment or a host.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Only rows committed after this one, for incremental pulls: see [`AuditFilter::push`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::audit::number_or_text"
    )]
    pub after_id: Option<i64>,
    /// Only rows that took at least this long (tool calls and upstream requests: the rows that
    /// record a latency).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::audit::number_or_text"
    )]
    pub min_latency_ms: Option<i64>,
    /// The transaction of the `after_id` row, when the reader kept it (a follower's cursor):
    /// the read then does not need that row to exist still.
    #[serde(skip)]
    pub after_tx: Option<String>,
}

impl AuditFilter {
    /// Whether any row could be left out.
    pub fn is_filtered(&self) -> bool {
        self.since.is_some()
            || self.until.is_some()
            || self.event_type.is_some()
            || self.outcome.is_some()
            || self.after_id.is_some()
            || self.min_latency_ms.is_some()
            || [&self.agent, &self.tool, &self.person, &self.client_id]
                .iter()
                .any(|v| v.as_ref().is_some_and(|v| !v.is_empty()))
    }

    /// Adds the filters that are set to a query built at run time. The reads below stay
    /// dynamic for this: a fixed text with `($n IS NULL OR col = $n)` for every filter is one
    /// plan for all combinations, which cannot pick the index of the filter that is set
    /// (`agent`, `at`) nor skip the month partitions outside `since`..`until`.
    fn push(&self, qb: &mut QueryBuilder<'_, Postgres>) {
        qb.push(" WHERE TRUE");
        if let Some(v) = self.since {
            qb.push(" AND at >= ").push_bind(v);
        }
        if let Some(v) = self.until {
            qb.push(" AND at < ").push_bind(v);
        }
        for (col, v) in [
            ("agent", self.agent.as_deref()),
            ("tool", self.tool.as_deref()),
            ("event_type", self.event_type.map(EventKind::as_str)),
            ("outcome", self.outcome.map(Outcome::as_str)),
            ("client_id", self.client_id.as_deref()),
        ] {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                qb.push(format!(" AND {col} = ")).push_bind(v.to_owned());
            }
        }
        if let Some(p) = self.person.as_deref().filter(|p| !p.is_empty()) {
            // What a host did for them, and what they did themselves: signed in to the UI
            // and changed things (`admin:<name>`), consented to a host (`user:<name>`).
            qb.push(" AND (person = ")
                .push_bind(p.to_owned())
                .push(" OR admin_user IN (")
                .push_bind(format!("admin:{p}"))
                .push(", ")
                .push_bind(format!("user:{p}"))
                .push("))");
        }
        if let Some(ms) = self.min_latency_ms {
            qb.push(" AND latency_us >= ")
                .push_bind(ms.saturating_mul(1000));
        }
        if let Some(after) = self.after_id {
            // Commit order, not id order (see the migration that added `tx`): rows after the
            // cursor row's position, written by transactions older than any still running, so
            // none can later appear behind what this read returns. The cursor row exists
            // (checked before the read); 0 is the start of the log.
            match (&self.after_tx, after > 0) {
                (Some(tx), true) => {
                    qb.push(" AND (tx, id) > ((")
                        .push_bind(tx.clone())
                        .push("::text)::xid8, ")
                        .push_bind(after)
                        .push(")");
                }
                (None, true) => {
                    qb.push(" AND (tx, id) > (SELECT tx, id FROM audit_events WHERE id = ")
                        .push_bind(after)
                        .push(" LIMIT 1)");
                }
                (_, false) => {}
            }
            qb.push(" AND tx < pg_snapshot_xmin(pg_current_snapshot())");
        }
    }
}

/// Whether row `id` exists: an `after_id` cursor must name a row, or the read would silently
/// return nothing.
pub async fn cursor_exists(pool: &PgPool, id: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM audit_events WHERE id = $1) AS "e!""#,
        id
    )
    .fetch_one(pool)
    .await
}

/// Row `id`'s position in commit order (its transaction, as text), if the row exists.
pub async fn position(pool: &PgPool, id: i64) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"SELECT tx::text AS "tx!" FROM audit_events WHERE id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The row of the latest commit position `filter` selects with its `after_id` cursor: the
/// cursor to pass next. None when nothing is new.
pub async fn next_cursor(
    conn: &mut PgConnection,
    filter: &AuditFilter,
) -> sqlx::Result<Option<i64>> {
    let mut qb = QueryBuilder::new("SELECT id FROM audit_events");
    filter.push(&mut qb);
    qb.push(" ORDER BY tx DESC, id DESC LIMIT 1");
    qb.build_query_scalar::<i64>().fetch_optional(conn).await
}

/// Newest first, keyset-paginated on `id`; with an `after_id` cursor, oldest first in commit
/// order.
pub async fn list(
    pool: &PgPool,
    filter: &AuditFilter,
    before_id: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<ChainedEvent>> {
    // Built at run time, for its filters: see `AuditFilter::push`.
    let mut qb = QueryBuilder::new(format!("SELECT {COLUMNS} FROM audit_events"));
    filter.push(&mut qb);
    if let Some(b) = before_id {
        qb.push(" AND id < ").push_bind(b);
    }
    if filter.after_id.is_some() {
        // An incremental read walks forward, in the order its cursor is defined over.
        qb.push(" ORDER BY tx, id LIMIT ").push_bind(limit);
    } else {
        qb.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    }
    Ok(qb
        .build_query_as::<AuditRow>()
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(ChainedEvent::from)
        .collect())
}

pub async fn get(pool: &PgPool, id: i64) -> sqlx::Result<Option<ChainedEvent>> {
    Ok(sqlx::query_as!(
        AuditRow,
        "SELECT id, at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome, agent,
                client_id, jti, admin_user, tool, resource, remote_addr, user_agent, request_id,
                call_id, exit_code, error, latency_us, bytes_in, bytes_out, arguments,
                result_sha256, result, details, flags, person
         FROM audit_events WHERE id = $1",
        id,
    )
    .fetch_optional(pool)
    .await?
    .map(ChainedEvent::from))
}

/// Streams matching rows in chain order, holding one row at a time: constant memory for any
/// range. The stream owns its connection.
pub fn stream(
    pool: PgPool,
    filter: AuditFilter,
) -> impl Stream<Item = sqlx::Result<ChainedEvent>> + Send + 'static {
    async_stream(pool, filter)
}

fn async_stream(
    pool: PgPool,
    filter: AuditFilter,
) -> impl Stream<Item = sqlx::Result<ChainedEvent>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<sqlx::Result<ChainedEvent>>(256);
    tokio::spawn(async move {
        // Built at run time, for its filters: see `AuditFilter::push`.
        let mut qb = QueryBuilder::new(format!("SELECT {COLUMNS} FROM audit_events"));
        filter.push(&mut qb);
        qb.push(" ORDER BY chain, chain_seq");
        let query = qb.build_query_as::<AuditRow>();
        let mut rows = query.fetch(&pool);
        while let Some(row) = rows.next().await {
            if tx.send(row.map(ChainedEvent::from)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Drops whole month partitions that end before `cutoff`; returns their names.
///
/// Each drop commits together with its retention-ledger entry (which rows of which chain
/// went) and an `audit.retention` event in the control-plane chain, so `audit verify` can
/// tell rows retention dropped from rows someone removed.
pub async fn drop_partitions_before(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    retention_days: u32,
) -> sqlx::Result<Vec<String>> {
    let names: Vec<String> = sqlx::query_scalar!(
        r#"SELECT c.relname::text AS "relname!" FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'audit_events'::regclass ORDER BY c.relname"#
    )
    .fetch_all(pool)
    .await?;
    let mut dropped = Vec::new();
    for name in names {
        let Some(end) = partition_end(&name) else {
            continue;
        };
        if end > cutoff {
            continue;
        }
        let mut tx = pool.begin().await?;
        // This statement and the DROP below name the partition, and a table's name is no bind
        // parameter: they are built here, from a name `partition_end` parsed as ours.
        let chains: serde_json::Value = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('chain', chain, 'first_seq', first_seq,
                 'last_seq', last_seq, 'last_hash', last_hash, 'rows', n) ORDER BY chain), '[]'::jsonb)
             FROM (SELECT chain, min(chain_seq) AS first_seq, max(chain_seq) AS last_seq,
                 (array_agg(hash ORDER BY chain_seq DESC))[1] AS last_hash, count(*) AS n
               FROM {name} GROUP BY chain) s"
        ))
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query!(
            "INSERT INTO audit_retention_ledger (partition, range_end, chains) VALUES ($1, $2, $3)",
            &name,
            end,
            &chains,
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!("DROP TABLE {name}"))
            .execute(&mut *tx)
            .await?;
        let mut e = AuditEvent::new(
            crate::audit::EventKind::Retention,
            crate::audit::Outcome::Success,
        );
        e.admin_user = Some("toolgate".into());
        e.resource = Some(name.clone());
        e.details = Some(
            serde_json::json!({"dropped_partition": name, "chains": chains, "retention_days": retention_days, "cutoff": cutoff})
                .to_string(),
        );
        append_in_tx(&mut tx, crate::audit::instance_name(), e).await?;
        tx.commit().await?;
        dropped.push(name);
    }
    Ok(dropped)
}

/// Where a month partition named by [`partition_name`] ends.
fn partition_end(name: &str) -> Option<DateTime<Utc>> {
    let rest = name.strip_prefix("audit_events_y")?;
    let (y, m) = (
        rest.get(..4)?.parse::<i32>().ok()?,
        rest.get(5..)?.parse::<u32>().ok()?,
    );
    let start = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
    let (_, end) = month_bounds(start);
    Some(Utc.from_utc_datetime(&end.and_hms_opt(0, 0, 0)?))
}

/// What the database says must exist: chain heads and what retention dropped.
pub async fn expectations(conn: &mut PgConnection) -> sqlx::Result<Expectations> {
    let heads = sqlx::query_as!(
        ChainHead,
        "SELECT chain, first_seq, last_seq, last_hash, row_count AS rows
         FROM audit_chain_heads ORDER BY chain"
    )
    .fetch_all(&mut *conn)
    .await?;
    let retired = sqlx::query!(
        "SELECT partition, dropped_at, dropped_by, chains FROM audit_retention_ledger ORDER BY id"
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| Retired {
        partition: r.partition,
        dropped_at: r.dropped_at,
        dropped_by: r.dropped_by,
        chains: serde_json::from_value(r.chains).unwrap_or_default(),
    })
    .collect();
    Ok(Expectations { heads, retired })
}

/// An export or a verification pass: first what must exist (read in the same snapshot as
/// the rows), then the rows in chain order.
// Rows are the many items; boxing them would allocate once per row for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Snapshot {
    Expect(Box<(Expectations, Vec<SignedCheckpoint>)>),
    /// For an incremental read (`after_id`): the cursor to pass next, from the same snapshot;
    /// none when nothing is new. Sent before the rows.
    Cursor(Option<i64>),
    Row(ChainedEvent),
}

/// Streams [`Snapshot`] items from one REPEATABLE READ transaction, so the heads describe
/// exactly the rows that follow. Constant memory for any range.
pub fn snapshot(
    pool: PgPool,
    filter: AuditFilter,
) -> impl Stream<Item = sqlx::Result<Snapshot>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<sqlx::Result<Snapshot>>(256);
    tokio::spawn(async move {
        let run = async {
            let mut conn = pool.acquire().await?;
            sqlx::query!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *conn)
                .await?;
            let expect = expectations(&mut conn).await?;
            let checkpoints = super::checkpoints::needed_checkpoints(&mut conn).await?;
            if tx
                .send(Ok(Snapshot::Expect(Box::new((expect, checkpoints)))))
                .await
                .is_err()
            {
                return Ok(());
            }
            if filter.after_id.is_some() {
                let next = next_cursor(&mut conn, &filter).await?;
                if tx.send(Ok(Snapshot::Cursor(next))).await.is_err() {
                    return Ok(());
                }
            }
            // Built at run time, for its filters: see `AuditFilter::push`.
            let mut qb = QueryBuilder::new(format!("SELECT {COLUMNS} FROM audit_events"));
            filter.push(&mut qb);
            qb.push(" ORDER BY chain, chain_seq");
            let query = qb.build_query_as::<AuditRow>();
            let mut rows = query.fetch(&mut *conn);
            while let Some(row) = rows.next().await {
                if tx.send(row.map(|r| Snapshot::Row(r.into()))).await.is_err() {
                    return Ok(());
                }
            }
            drop(rows);
            sqlx::query!("COMMIT").execute(&mut *conn).await?;
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = run.await {
            let _ = tx.send(Err(e)).await;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
