//! What exporting traces costs a call: two `toolgate serve` processes of the same build on one
//! database, one exporting OTLP/HTTP to a receiver in this process, one with no OTLP variable,
//! called in turn (so that load on the machine falls on both alike).
//!
//! With `TOOLGATE_REFERENCE_BIN=<another toolgate binary>` (a build from before traces, say), a
//! third process of that binary, without the variables, is called in the same turns.
//!
//! Run: `cargo bench --bench traces` (needs PostgreSQL; `DATABASE_URL` names the server,
//! default `postgres://root@127.0.0.1:5432/postgres`; a scratch database is created and
//! dropped). Figures go to stdout as a table.

// Test code: a panic is a failed test with its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;

const ADMIN: &str = "bench";
const ROUNDS: usize = 400;

fn p50_p99_mean(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean = samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64;
    (
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() * 99 / 100]),
        mean,
    )
}

fn row(name: &str, s: (f64, f64, f64)) {
    println!(
        "| {name:<44} | {:>8.3} | {:>8.3} | {:>8.3} |",
        s.0, s.1, s.2
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn serve(
    bin: &str,
    db: &str,
    tools: &std::path::Path,
    otlp: Option<&str>,
) -> (tokio::process::Child, String) {
    let port = free_port();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["serve", "--database-url", db])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        // One issuer for both, so that one token serves on either.
        .args(["--public-url", "http://127.0.0.1:1"])
        .args(["--admin-token", ADMIN])
        .arg("--tools-dir")
        .arg(tools)
        .args(["--policies-dir", "/nonexistent"])
        // The spawn's own cost (and its noise) is the same with or without traces.
        .args(["--script-sandbox", "off"])
        .env("TOOLGATE_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(url) = otlp {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", url);
    }
    let child = cmd.spawn().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "toolgate serve never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, base)
}

async fn token(http: &reqwest::Client, base: &str) -> String {
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth(ADMIN);
    admin(http.post(format!("{base}/api/v1/agents")))
        .json(&json!({"name": "bench"}))
        .send()
        .await
        .unwrap();
    admin(http.post(format!("{base}/api/v1/agents/bench/grants")))
        .json(&json!({"target": "bench"}))
        .send()
        .await
        .unwrap();
    let c: serde_json::Value = admin(http.post(format!("{base}/api/v1/agents/bench/clients")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let t: serde_json::Value = http
        .post(format!("{base}/oauth/token"))
        .basic_auth(
            c["client_id"].as_str().unwrap(),
            c["client_secret"].as_str(),
        )
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    t["access_token"].as_str().unwrap().to_owned()
}

async fn timed(http: &reqwest::Client, req: reqwest::RequestBuilder) -> Duration {
    let started = Instant::now();
    let r = http.execute(req.build().unwrap()).await.unwrap();
    let ok = r.status().is_success();
    let _ = r.bytes().await;
    assert!(ok, "a benchmarked request failed");
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/postgres".into());
    let name = format!("toolgate_bench_tracing_{}", uuid::Uuid::new_v4().simple());
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path(&name);
    let db = url.to_string();

    let tools = tempfile::tempdir().unwrap();
    let dir = tools.path().join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    let op = json!({"operationId": "echo", "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}, "responses": {"200": {"description": "ok"}}});
    std::fs::write(
        dir.join("openapi.json"),
        json!({"openapi": "3.1.0", "info": {"title": "bench", "version": "1"}, "paths": {"/echo": {"post": op}}}).to_string(),
    )
    .unwrap();
    let script = dir.join("echo.sh");
    std::fs::write(&script, "#!/bin/sh\ncat >/dev/null\necho '{}'\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    // The receiver decodes every export, as a collector would, and counts the spans.
    let spans = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let spans = spans.clone();
        axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let spans = spans.clone();
                async move {
                    let r = ExportTraceServiceRequest::decode(body).unwrap();
                    let n: usize = r
                        .resource_spans
                        .iter()
                        .flat_map(|rs| &rs.scope_spans)
                        .map(|ss| ss.spans.len())
                        .sum();
                    spans.fetch_add(n, Ordering::Relaxed);
                    Vec::<u8>::new()
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    let bin = env!("CARGO_BIN_EXE_toolgate");
    let mut servers = vec![
        ("traces off", serve(bin, &db, tools.path(), None).await),
        (
            "traces exported",
            serve(bin, &db, tools.path(), Some(&otlp)).await,
        ),
    ];
    if let Ok(reference) = std::env::var("TOOLGATE_REFERENCE_BIN") {
        servers.push((
            "reference binary",
            serve(&reference, &db, tools.path(), None).await,
        ));
    }
    let bases: Vec<String> = servers.iter().map(|(_, (_, b))| b.clone()).collect();
    let http = reqwest::Client::new();
    let token = token(&http, &bases[0]).await;
    let call = |base: &str| {
        http.post(format!("{base}/tools/bench/echo"))
            .bearer_auth(&token)
            .json(&json!({}))
    };
    let list = |base: &str| http.get(format!("{base}/openapi.json")).bearer_auth(&token);
    // The other instances learn of the grant through NOTIFY.
    for base in &bases {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !http
            .execute(call(base).build().unwrap())
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "an instance never saw the grant");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for _ in 0..50 {
        for base in &bases {
            timed(&http, call(base)).await;
        }
    }

    let n = bases.len();
    let (mut calls, mut lists) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for i in 0..ROUNDS {
        // Rotate which goes first, so none always follows the same other's work.
        for k in 0..n {
            let s = (i + k) % n;
            calls[s].push(timed(&http, call(&bases[s])).await);
        }
        for k in 0..n {
            let s = (i + k) % n;
            lists[s].push(timed(&http, list(&bases[s])).await);
        }
    }

    println!(
        "| {:<44} | {:>8} | {:>8} | {:>8} |",
        "ms per request", "p50", "p99", "mean"
    );
    println!(
        "|{}|{}|{}|{}|",
        "-".repeat(46),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(10)
    );
    let calls: Vec<_> = calls.into_iter().map(p50_p99_mean).collect();
    let lists: Vec<_> = lists.into_iter().map(p50_p99_mean).collect();
    for (k, (label, _)) in servers.iter().enumerate() {
        row(&format!("REST tool call, {label}"), calls[k]);
    }
    for (k, (label, _)) in servers.iter().enumerate() {
        row(&format!("GET /openapi.json, {label}"), lists[k]);
    }
    println!(
        "\np50 ratio exported/off: tool call {:.3}, openapi.json {:.3}",
        calls[1].0 / calls[0].0,
        lists[1].0 / lists[0].0
    );
    if n == 3 {
        println!(
            "p50 ratio off/reference: tool call {:.3}, openapi.json {:.3}",
            calls[0].0 / calls[2].0,
            lists[0].0 / lists[2].0
        );
    }

    for (_, (child, _)) in &mut servers {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }
    println!(
        "spans received by the OTLP receiver (flushed at exit included): {}",
        spans.load(Ordering::Relaxed)
    );
    let admin = sqlx::PgPool::connect(&server).await.unwrap();
    let _ = sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&admin)
        .await;
}
