//! The group-commit writer: concurrent requests' events go into one multi-row insert, and
//! each request is released only when its batch is durable.
//!
//! One writer task per instance owns this instance's hash chain, so rows are chained in the
//! order they are written without any lock in Postgres.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use super::AuditEvent;
use super::chain::{self, ChainedEvent, GENESIS};
use crate::db;

/// Largest batch written in one insert.
const MAX_BATCH: usize = 1024;
const _: () = assert!(MAX_BATCH <= db::audit::MAX_INSERT_ROWS);
/// Queue depth before callers wait for room (back-pressure instead of unbounded memory).
const QUEUE: usize = 8192;

/// Seconds one batch took to become durable (the group commit), per batch.
pub static COMMIT_SECONDS: std::sync::LazyLock<prometheus::Histogram> =
    std::sync::LazyLock::new(|| {
        prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "audit_commit_seconds",
                "Time for one audit batch to become durable",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
                10.0,
            ]),
        )
        .unwrap_or_else(|_| panic!("invalid metric definition"))
    });

/// Rows this process made durable.
pub static ROWS_WRITTEN: std::sync::LazyLock<prometheus::IntCounter> =
    std::sync::LazyLock::new(|| {
        prometheus::IntCounter::new("audit_rows_written_total", "Audit rows made durable")
            .unwrap_or_else(|_| panic!("invalid metric definition"))
    });

/// Events the writer could not make durable (their callers failed closed).
pub static WRITE_FAILURES: std::sync::LazyLock<prometheus::IntCounter> =
    std::sync::LazyLock::new(|| {
        prometheus::IntCounter::new(
            "audit_write_failures_total",
            "Audit events that could not be made durable",
        )
        .unwrap_or_else(|_| panic!("invalid metric definition"))
    });

/// The audit log could not make an event durable: the caller must fail closed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the audit log is unavailable: {0}")]
pub struct AuditUnavailable(pub String);

struct Pending {
    /// `None` for a flush marker, acknowledged once everything queued before it is written.
    event: Option<AuditEvent>,
    done: Option<oneshot::Sender<Result<(), AuditUnavailable>>>,
}

/// Handle to the writer task.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Pending>,
    instance: String,
    healthy: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl AuditLog {
    /// Starts the writer. `chain` names this writer's hash chain; it must be unique per
    /// running process (an instance restarts with a new chain).
    pub fn spawn(pool: PgPool, chain: String, instance: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let healthy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        tokio::spawn(run(pool, chain, instance.clone(), rx, healthy.clone()));
        Self {
            tx,
            instance,
            healthy,
        }
    }

    /// A log that acknowledges every event without writing it. For benchmarks that measure
    /// what auditing costs; nothing in the server or the command line constructs it.
    pub fn disabled_for_benchmarks() -> Self {
        let (tx, mut rx) = mpsc::channel::<Pending>(QUEUE);
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                if let Some(done) = p.done {
                    let _ = done.send(Ok(()));
                }
            }
        });
        Self {
            tx,
            instance: "benchmark".into(),
            healthy: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Whether the last write succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set_healthy(&self, ok: bool) {
        self.healthy.store(ok, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Events queued and not yet written.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Appends `event` and waits until it is durable.
    pub async fn record(&self, event: AuditEvent) -> Result<(), AuditUnavailable> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Pending {
                event: Some(event),
                done: Some(done),
            })
            .await
            .map_err(|_| AuditUnavailable("the audit writer stopped".into()))?;
        wait.await
            .map_err(|_| AuditUnavailable("the audit writer stopped".into()))?
    }

    /// Waits until every event queued before this call, detached ones included, has been
    /// written; an error if the last of those writes failed (for shutdown).
    pub async fn flush(&self) -> Result<(), AuditUnavailable> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Pending {
                event: None,
                done: Some(done),
            })
            .await
            .map_err(|_| AuditUnavailable("the audit writer stopped".into()))?;
        wait.await
            .map_err(|_| AuditUnavailable("the audit writer stopped".into()))?
    }

    /// Appends `event` without waiting (for events that must never delay or block a
    /// response, such as a refused token).
    pub fn record_detached(&self, event: AuditEvent) {
        if self
            .tx
            .try_send(Pending {
                event: Some(event),
                done: None,
            })
            .is_err()
        {
            tracing::warn!("audit queue full; a detached audit event was dropped");
        }
    }
}

async fn run(
    pool: PgPool,
    chain: String,
    instance: String,
    mut rx: mpsc::Receiver<Pending>,
    healthy: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut head: Link = (0, GENESIS.to_owned());
    // After a failed write the database may hold more of this chain than we know (a commit
    // whose answer was lost): the head is read back before the chain is extended again.
    let mut resync = false;
    let mut months: HashSet<String> = HashSet::new();
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        // Everything that queued while the previous batch was being written goes now.
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let flushes: Vec<bool> = batch.iter().map(|p| p.event.is_none()).collect();
        let events: Vec<AuditEvent> = batch.iter_mut().filter_map(|p| p.event.take()).collect();
        let started = std::time::Instant::now();
        let results = if events.is_empty() {
            Vec::new()
        } else if resync {
            match db::audit::last_link(&pool, &chain).await {
                Ok(last) => {
                    head = last.unwrap_or((0, GENESIS.to_owned()));
                    resync = false;
                    write(&pool, &chain, &instance, &mut head, &events, &mut months).await
                }
                Err(e) => vec![Err(e.to_string()); events.len()],
            }
        } else {
            write(&pool, &chain, &instance, &mut head, &events, &mut months).await
        };
        let failed = results.iter().filter(|r| r.is_err()).count();
        if !events.is_empty() {
            COMMIT_SECONDS.observe(started.elapsed().as_secs_f64());
            ROWS_WRITTEN.inc_by((events.len() - failed) as u64);
            WRITE_FAILURES.inc_by(failed as u64);
        }
        if failed > 0 {
            resync = true;
            tracing::error!(
                error = results
                    .iter()
                    .find_map(|r| r.clone().err())
                    .unwrap_or_default(),
                rows = events.len(),
                failed,
                "writing audit events failed"
            );
        }
        if !events.is_empty() {
            healthy.store(failed == 0, std::sync::atomic::Ordering::Relaxed);
        }
        let flushed = if resync {
            Err(AuditUnavailable("the last audit write failed".into()))
        } else {
            Ok(())
        };
        let mut results = results.into_iter();
        for (p, flush) in batch.drain(..).zip(flushes) {
            let r = if flush {
                flushed.clone()
            } else {
                results
                    .next()
                    .unwrap_or_else(|| Err("not written".into()))
                    .map_err(AuditUnavailable)
            };
            if let Some(done) = p.done {
                let _ = done.send(r);
            }
        }
    }
}

/// A chain's last `(chain_seq, hash)`.
type Link = (i64, String);

/// How long one batch may take, isolation of refused rows included.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// Writes `events` after `head` in one insert and advances `head` over what is stored.
///
/// If the database refuses the batch for its content, the batch is halved until the refused
/// rows are alone; each of those is stored escaped and flagged (or, refused again, as a
/// placeholder), so one hostile value never fails anyone else's row. Rows are re-chained
/// at every attempt: the chain runs only over stored rows, in order.
async fn write(
    pool: &PgPool,
    chain: &str,
    instance: &str,
    head: &mut Link,
    events: &[AuditEvent],
    months: &mut HashSet<String>,
) -> Vec<Result<(), String>> {
    let mut results: Vec<Result<(), String>> = vec![Err("not written".into()); events.len()];
    let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
    if let Err(e) = ensure_partitions(pool, events, months, deadline).await {
        return vec![Err(e); events.len()];
    }
    let mut todo: std::collections::VecDeque<(usize, usize)> = [(0, events.len())].into();
    while let Some((lo, hi)) = todo.pop_front() {
        let rows = chained(chain, instance, head, &events[lo..hi]);
        match insert(pool, &rows, deadline).await {
            Ok(()) => {
                advance(head, &rows);
                results[lo..hi].iter_mut().for_each(|r| *r = Ok(()));
            }
            Err(Refusal::Data(e)) if hi - lo > 1 => {
                let mid = lo + (hi - lo) / 2;
                todo.push_front((mid, hi));
                todo.push_front((lo, mid));
                tracing::debug!(error = %e, rows = hi - lo, "audit batch refused; isolating");
            }
            Err(Refusal::Data(e)) => {
                results[lo] = isolate(pool, chain, instance, head, &events[lo], &e, deadline).await;
                if results[lo].is_err() && tokio::time::Instant::now() >= deadline {
                    break;
                }
            }
            Err(Refusal::Unavailable(e)) => {
                results[lo..hi].iter_mut().for_each(|r| *r = Err(e.clone()));
                for (l, h) in todo.drain(..) {
                    results[l..h].iter_mut().for_each(|r| *r = Err(e.clone()));
                }
                break;
            }
        }
    }
    results
}

/// Stores one refused event escaped and flagged, or failing that as a placeholder.
async fn isolate(
    pool: &PgPool,
    chain: &str,
    instance: &str,
    head: &mut Link,
    event: &AuditEvent,
    refusal: &str,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    tracing::warn!(error = %refusal, event_type = %event.event_type, "the database refused an audit row; storing it escaped and flagged");
    let mut last = refusal.to_owned();
    for (e, flags) in [
        chain::quarantine(event, refusal),
        chain::placeholder(event, refusal),
    ] {
        let row = chain::extend_flagged(chain, (head.0, &head.1), instance, Some(flags), e);
        match insert(pool, std::slice::from_ref(&row), deadline).await {
            Ok(()) => {
                advance(head, std::slice::from_ref(&row));
                return Ok(());
            }
            Err(Refusal::Data(e)) => last = e,
            Err(Refusal::Unavailable(e)) => return Err(e),
        }
    }
    tracing::error!(error = %last, "the database refused even the placeholder of an audit row");
    Err(last)
}

fn chained(chain: &str, instance: &str, head: &Link, events: &[AuditEvent]) -> Vec<ChainedEvent> {
    let (mut seq, mut hash) = head.clone();
    events
        .iter()
        .map(|e| {
            let row = chain::extend(chain, (seq, &hash), instance, e.clone());
            seq = row.chain_seq;
            hash.clone_from(&row.hash);
            row
        })
        .collect()
}

fn advance(head: &mut Link, stored: &[ChainedEvent]) {
    if let Some(last) = stored.last() {
        *head = (last.chain_seq, last.hash.clone());
    }
}

enum Refusal {
    /// The database refused these rows' values; other rows may pass.
    Data(String),
    /// The database is unreachable, too slow or refuses everything.
    Unavailable(String),
}

async fn insert(
    pool: &PgPool,
    rows: &[ChainedEvent],
    deadline: tokio::time::Instant,
) -> Result<(), Refusal> {
    match tokio::time::timeout_at(deadline, db::audit::insert_batch(pool, rows)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if db::audit::is_refused_data(&e) => Err(Refusal::Data(e.to_string())),
        Ok(Err(e)) => Err(Refusal::Unavailable(e.to_string())),
        Err(_) => Err(Refusal::Unavailable(
            "timed out writing to the database".into(),
        )),
    }
}

async fn ensure_partitions(
    pool: &PgPool,
    events: &[AuditEvent],
    months: &mut HashSet<String>,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    let attempt = async {
        for e in events {
            let name = db::audit::partition_name(e.at);
            if !months.contains(&name) {
                let mut conn = pool.acquire().await?;
                db::audit::ensure_partition(&mut conn, e.at).await?;
                months.insert(name);
            }
        }
        Ok::<_, sqlx::Error>(())
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("timed out writing to the database".into()),
    }
}
