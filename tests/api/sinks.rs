//! Audit sinks: every row reaches the receiver, through a receiver restart mid-stream, from a
//! cursor in the database shared by the instances. Receivers: an HTTP endpoint taking JSON
//! lines, and an OTLP/HTTP logs endpoint decoded with the official OpenTelemetry messages.
//! (rsyslog, from Debian's packages, is the syslog receiver in `.ci/syslog.sh`.)

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::TestApp;
use toolgate::audit::sink::{self, Sink};

#[derive(Clone, Default)]
struct Received {
    ids: Arc<Mutex<Vec<i64>>>,
    auth: Arc<Mutex<HashSet<String>>>,
}

async fn jsonl(State(r): State<Received>, headers: HeaderMap, body: Bytes) -> &'static str {
    if let Some(a) = headers.get("authorization") {
        r.auth
            .lock()
            .unwrap()
            .insert(a.to_str().unwrap().to_owned());
    }
    for line in String::from_utf8_lossy(&body).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["format"], "toolgate-audit-v2");
        r.ids.lock().unwrap().push(v["id"].as_i64().unwrap());
    }
    "ok"
}

async fn otlp(State(r): State<Received>, body: Bytes) -> &'static str {
    let req = ExportLogsServiceRequest::decode(body).unwrap();
    for rl in req.resource_logs {
        for sl in rl.scope_logs {
            for rec in sl.log_records {
                let id = rec
                    .attributes
                    .iter()
                    .find(|a| a.key == "toolgate.audit.id")
                    .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                        Any::IntValue(i) => Some(*i),
                        _ => None,
                    })
                    .unwrap();
                // The body is the OCSF record, carrying the same id.
                let Some(Any::StringValue(b)) = rec.body.and_then(|b| b.value) else {
                    panic!("no body")
                };
                let ocsf: Value = serde_json::from_str(&b).unwrap();
                assert_eq!(ocsf["metadata"]["uid"], id.to_string());
                r.ids.lock().unwrap().push(id);
            }
        }
    }
    "ok"
}

/// Serves `router` on `addr` until the returned handle is aborted.
async fn serve_on(addr: std::net::SocketAddr, router: Router) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    })
}

async fn free_addr() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

async fn all_ids(pool: &PgPool) -> HashSet<i64> {
    sqlx::query_scalar::<_, i64>("SELECT id FROM audit_events")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Calls, a receiver killed and started again mid-stream, more calls: waits until the receiver
/// holds every row the log holds.
async fn through_a_restart(
    pool: PgPool,
    sink_url: impl Fn(std::net::SocketAddr) -> String,
    router: fn(Received) -> Router,
) -> Received {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    let received = Received::default();
    let addr = free_addr().await;
    let server = serve_on(addr, router(received.clone())).await;
    // Two instances deliver the same sink: the cursor row's lock lets one at a time.
    let s = Sink::parse(&sink_url(addr)).unwrap();
    let metrics = toolgate::metrics::Metrics::new();
    sink::spawn(pool.clone(), vec![s.clone(), s], metrics.clone());
    for _ in 0..10 {
        app.call(&token, "weather__current", json!({"city": "Paris"}))
            .await;
    }
    // The receiver dies mid-stream; calls go on (the sink never slows them).
    server.abort();
    let _ = server.await;
    let started = Instant::now();
    for _ in 10..20 {
        app.call(&token, "weather__current", json!({"city": "Paris"}))
            .await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "calls were slowed by a sink that is down"
    );
    // The sink has found the receiver down (and kept its cursor) before it comes back.
    let name = Sink::parse(&sink_url(addr)).unwrap().name;
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics
        .sink_errors
        .with_label_values(&[name.as_str()])
        .get()
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the sink never tried the dead receiver"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every row of the calls before, during and after the outage.
    let want = all_ids(&pool).await;
    assert!(want.len() >= 40, "two rows per call: {}", want.len());
    let server = serve_on(addr, router(received.clone())).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: HashSet<i64> = received.ids.lock().unwrap().iter().copied().collect();
        let missing: Vec<&i64> = want.difference(&got).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rows never delivered: {missing:?} ({} of {})",
            got.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.abort();
    let cursor: i64 = sqlx::query_scalar("SELECT delivered FROM audit_sink_cursors")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(cursor > 0);
    received
}

fn jsonl_router(r: Received) -> Router {
    Router::new().route("/ingest", post(jsonl)).with_state(r)
}

fn otlp_router(r: Received) -> Router {
    Router::new().route("/v1/logs", post(otlp)).with_state(r)
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_http_receiver_gets_every_row_through_a_restart(pool: PgPool) {
    let r = through_a_restart(
        pool,
        |a| format!("http://:sink-token@{a}/ingest?format=jsonl"),
        jsonl_router,
    )
    .await;
    let auth = r.auth.lock().unwrap().clone();
    assert_eq!(auth, HashSet::from(["Bearer sink-token".to_owned()]));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_otlp_receiver_gets_every_row_through_a_restart(pool: PgPool) {
    through_a_restart(pool, |a| format!("otlp+http://{a}"), otlp_router).await;
}
