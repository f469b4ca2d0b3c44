//! What one durable audit row costs at one writer, side by side with a bare durable one-row
//! `INSERT` into a two-column table through the same pool: the part of an audited call's
//! latency that is the audit log's. A script call writes two such rows (`started` before the
//! spawn, the result before the answer).
//!
//! Run: DATABASE_URL=postgres://root@127.0.0.1:5432/toolgate_latency \
//!      cargo run --release --example audit_latency
//! (the database is created if missing; the example writes audit rows on its own chain and
//! drops the table it made.)

// A measuring tool run by hand: a panic says which step failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use toolgate::audit::writer::AuditLog;
use toolgate::audit::{AuditEvent, EventKind, Outcome};

const ROUNDS: usize = 2000;
const WARM_UP: usize = 200;

fn p50_p90(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[t.len() * 9 / 10])
}

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let pool = toolgate::db::connect(&url, 10).await.expect("connect");
    toolgate::db::MIGRATOR.run(&pool).await.expect("migrate");
    sqlx::query("CREATE TABLE IF NOT EXISTS audit_latency_reference (id bigserial, v text)")
        .execute(&pool)
        .await
        .expect("reference table");
    let log = AuditLog::spawn(
        pool.clone(),
        format!("latency/{}", uuid::Uuid::now_v7()),
        "latency".into(),
    );
    // Interleaved, so that the machine's noise falls on both alike.
    let (mut audit, mut bare) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS + WARM_UP {
        let mut e = AuditEvent::new(EventKind::ToolCall, Outcome::Started);
        e.tool = Some("bench__cat".into());
        e.agent = Some("caller".into());
        e.call_id = Some(format!("call-{i}"));
        e.arguments = Some(format!("{{\"n\":{i}}}"));
        let s = Instant::now();
        log.record(e).await.expect("audit row");
        let took_audit = s.elapsed().as_secs_f64() * 1000.0;
        let s = Instant::now();
        sqlx::query("INSERT INTO audit_latency_reference (v) VALUES ($1)")
            .bind(format!("call-{i}"))
            .execute(&pool)
            .await
            .expect("reference row");
        let took_bare = s.elapsed().as_secs_f64() * 1000.0;
        if i >= WARM_UP {
            audit.push(took_audit);
            bare.push(took_bare);
        }
    }
    sqlx::query("DROP TABLE audit_latency_reference")
        .execute(&pool)
        .await
        .expect("drop the reference table");
    let ((a50, a90), (b50, b90)) = (p50_p90(audit), p50_p90(bare));
    println!("{ROUNDS} rounds, interleaved, one writer:");
    println!("  bare durable one-row INSERT  p50 {b50:.3} ms  p90 {b90:.3} ms");
    println!(
        "  one audit row (AuditLog::record)  p50 {a50:.3} ms  p90 {a90:.3} ms  ({:.2}x, +{:.3} ms)",
        a50 / b50,
        a50 - b50
    );
}
