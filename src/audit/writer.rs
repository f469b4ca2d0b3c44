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
/// Queue depth before callers wait for room (back-pressure instead of unbounded memory).
const QUEUE: usize = 8192;

/// The audit log could not make an event durable: the caller must fail closed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the audit log is unavailable: {0}")]
pub struct AuditUnavailable(pub String);

struct Pending {
    event: AuditEvent,
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

    /// Appends `event` and waits until it is durable.
    pub async fn record(&self, event: AuditEvent) -> Result<(), AuditUnavailable> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Pending {
                event,
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
        if self.tx.try_send(Pending { event, done: None }).is_err() {
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
    let mut last_seq: i64 = 0;
    let mut last_hash = GENESIS.to_owned();
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
        let mut seq = last_seq;
        let mut hash = last_hash.clone();
        let rows: Vec<ChainedEvent> = batch
            .iter()
            .map(|p| {
                let row = chain::extend(&chain, (seq, &hash), &instance, p.event.clone());
                seq = row.chain_seq;
                hash = row.hash.clone();
                row
            })
            .collect();
        let result = write(&pool, &rows, &mut months).await;
        healthy.store(result.is_ok(), std::sync::atomic::Ordering::Relaxed);
        match &result {
            Ok(()) => {
                // The chain advances only over rows that are really stored.
                last_seq = seq;
                last_hash = hash;
            }
            Err(e) => tracing::error!(error = %e, rows = rows.len(), "writing audit events failed"),
        }
        for p in batch.drain(..) {
            if let Some(done) = p.done {
                let _ = done.send(result.clone().map_err(|e| AuditUnavailable(e.clone())));
            }
        }
    }
}

async fn write(
    pool: &PgPool,
    rows: &[ChainedEvent],
    months: &mut HashSet<String>,
) -> Result<(), String> {
    let attempt = async {
        for r in rows {
            let name = db::audit::partition_name(r.event.at);
            if !months.contains(&name) {
                let mut conn = pool.acquire().await?;
                db::audit::ensure_partition(&mut conn, r.event.at).await?;
                months.insert(name);
            }
        }
        db::audit::insert_batch(pool, rows).await
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out writing to the database".into()),
    }
}
