//! The side-by-side harness: every hot path of the gateway against a reference doing the same
//! minimal work, in one run, printed as ratios (figures P1–P4 of `bench/README.md`; P6 is
//! `bench/scale.sh`, and `bench/run.sh` runs both).
//!
//! - P1 `tools/list` throughput, 32 connections, an agent seeing 20 tools of a large pool,
//!   against a reference handler written here: parse the JSON-RPC body, verify the same EdDSA
//!   JWT, answer the same bytes.
//! - P2 a script tool's `tools/call` (`#!/bin/sh cat`) at one client, against the floor the
//!   audit promise sets (a durable single-row INSERT, the bare spawn, a second durable INSERT,
//!   in order) and against a bare spawn of the same script from async Rust (write stdin, read
//!   stdout, wait); the sandboxed spawn alone is shown between the two.
//! - P3 a proxied upstream `tools/call` against the same upstream called directly with the same
//!   client (rmcp over Streamable HTTP, `@modelcontextprotocol/server-everything`).
//! - P4 the P2 call with the audit log on against the same gateway with it off; and the
//!   durable audit rows per second of the group-commit writer.
//! - P7 the P2 call from 32 clients at once (calls/s), audit on and off, against 32 loops
//!   spawning the script bare; and the P3 call from 32 callers at once against the upstream
//!   called directly at 32.
//! - The peer: with `TOOLGATE_PEER_BIN` naming an `mcp-proxy` binary (bench/run.sh builds
//!   0.6.0), the P3 call through it, in front of the same upstream with a bearer check, at one
//!   caller and at 32, beside toolgate's with audit on and off.
//!
//! Run: `cargo bench --bench gateway` (release; needs PostgreSQL, `DATABASE_URL` names the
//! server, default `postgres://root@127.0.0.1:5432/postgres`; a scratch database is created
//! and dropped). `cargo test --bench gateway` (or `-- --smoke`) runs the same steps with few
//! samples and a small pool: it checks that the harness works, and its figures mean nothing.
//! Options: `--pool-tools N` (default 10,000), `--seconds S` (P1 duration, default 5),
//! `--samples N` (sequential samples of P2–P4, default 500).

// Test code: a panic is a failed test with its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use clap::Parser;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;

use toolgate::audit::AuditEvent;
use toolgate::audit::writer::AuditLog;
use toolgate::config::{Cli, Command};
use toolgate::state::{AppState, Settings};

struct Options {
    smoke: bool,
    pool_tools: usize,
    seconds: u64,
    samples: usize,
}

impl Options {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        // `cargo bench` passes `--bench`; `cargo test --bench` passes nothing: a smoke run.
        let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
        let mut o = if smoke {
            Options {
                smoke,
                pool_tools: 200,
                seconds: 1,
                samples: 20,
            }
        } else {
            Options {
                smoke,
                pool_tools: 10_000,
                seconds: 5,
                samples: 500,
            }
        };
        let value = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .map(|v| {
                    v.parse::<u64>()
                        .unwrap_or_else(|_| panic!("{name} takes a number"))
                })
        };
        if let Some(v) = value("--pool-tools") {
            o.pool_tools = v as usize;
        }
        if let Some(v) = value("--seconds") {
            o.seconds = v;
        }
        if let Some(v) = value("--samples") {
            o.samples = v as usize;
        }
        o
    }
}

#[derive(Clone, Copy)]
struct Stats {
    p50: f64,
    p99: f64,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    assert!(!samples.is_empty(), "no samples");
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Stats {
        p50: ms(samples[samples.len() / 2]),
        p99: ms(samples[(samples.len() * 99 / 100).min(samples.len() - 1)]),
    }
}

/// One line of the summary: ours against its reference, and the goal of the ratio.
struct Figure {
    name: &'static str,
    ours: String,
    reference: String,
    ratio: String,
    goal: &'static str,
}

async fn app(url: &str, tools: &Path, audited: bool, extra: &[&str]) -> (AppState, String) {
    let mut args = vec![
        "toolgate",
        "serve",
        "--tools-dir",
        tools.to_str().unwrap(),
        "--admin-token",
        "bench",
        "--bind",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let Command::Serve(serve) = Cli::parse_from(args).command else {
        unreachable!()
    };
    let settings = Settings::from_args(&serve).unwrap();
    let surfaces = toolgate::app::Surfaces::from_args(&serve, &settings).unwrap();
    let pool = toolgate::db::connect(url, 16).await.unwrap();
    toolgate::db::migrate(&pool, url).await.unwrap();
    toolgate::service::keys::ensure_first(&pool).await.unwrap();
    let state = if audited {
        AppState::new(settings, pool)
    } else {
        AppState::with_audit(settings, pool, AuditLog::disabled_for_benchmarks())
    };
    state.reload_pool();
    state.reload_policy().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = toolgate::app::router(state.clone(), surfaces);
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
    });
    (state, format!("http://{addr}"))
}

/// Creates `agent` with one grant (unless it exists) and returns a token of a new client.
async fn token(http: &reqwest::Client, base: &str, agent: &str, grant: &str) -> String {
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth("bench");
    let _ = admin(http.post(format!("{base}/api/v1/agents")))
        .json(&json!({"name": agent}))
        .send()
        .await
        .unwrap();
    let _ = admin(http.post(format!("{base}/api/v1/agents/{agent}/grants")))
        .json(&json!({"target": grant}))
        .send()
        .await
        .unwrap();
    let c: Value = admin(http.post(format!("{base}/api/v1/agents/{agent}/clients")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let t: Value = http
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

fn mcp_post(
    http: &reqwest::Client,
    url: &str,
    tok: &str,
    body: &'static str,
) -> reqwest::RequestBuilder {
    http.post(url)
        .bearer_auth(tok)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
}

/// `conns` clients sending `body` back to back for `secs`: requests per second and latency.
async fn throughput(
    http: &reqwest::Client,
    url: &str,
    tok: &str,
    body: &'static str,
    conns: usize,
    secs: u64,
) -> (f64, Stats) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (http, url, tok) = (http.clone(), url.to_owned(), tok.to_owned());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let r = mcp_post(&http, &url, &tok, body).send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::OK);
                    let b = r.bytes().await.unwrap();
                    assert!(!b.is_empty());
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    (rate, stats(all))
}

/// The physical limit of `tools/list`: what any gateway must do at least — parse the JSON-RPC
/// body, verify the caller's EdDSA JWT — and then answer bytes computed in advance.
struct Reference {
    key: jsonwebtoken::DecodingKey,
    validation: jsonwebtoken::Validation,
    answer: Bytes,
    content_type: header::HeaderValue,
}

async fn reference_handler(
    axum::extract::State(r): axum::extract::State<Arc<Reference>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if request["method"] != "tools/list" {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let Some(tok) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if jsonwebtoken::decode::<Value>(tok, &r.key, &r.validation).is_err() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    (
        [(header::CONTENT_TYPE, r.content_type.clone())],
        r.answer.clone(),
    )
        .into_response()
}

async fn start_reference(
    http: &reqwest::Client,
    base: &str,
    tok: &str,
    list: &'static str,
) -> String {
    let jwks: Value = http
        .get(format!("{base}/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let x = jwks["keys"][0]["x"].as_str().unwrap();
    let key = jsonwebtoken::DecodingKey::from_ed_components(x).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.validate_aud = false;
    let r = mcp_post(http, &format!("{base}/mcp"), tok, list)
        .send()
        .await
        .unwrap();
    let content_type = r.headers()[header::CONTENT_TYPE].clone();
    let answer = r.bytes().await.unwrap();
    let reference = Arc::new(Reference {
        key,
        validation,
        answer,
        content_type,
    });
    let router = axum::Router::new()
        .route("/mcp", axum::routing::post(reference_handler))
        .with_state(reference);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/mcp")
}

/// Script groups `g00000`… of 20 tools each, `pool_tools` in all, plus the `bench` group whose
/// `cat` operation is the script of P2.
fn write_pool(tools: &Path, pool_tools: usize) {
    let op = |id: &str, summary: &str| {
        json!({"post": {
            "operationId": id, "summary": summary,
            "description": format!("{summary}: a generated tool of the benchmark pool."),
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"n": {"type": "integer"}, "q": {"type": "string", "maxLength": 100}}}}}},
            "responses": {"200": {"description": "ok"}}}})
    };
    for g in 0..pool_tools.div_ceil(20) {
        let name = format!("g{g:05}");
        let dir = tools.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut paths = serde_json::Map::new();
        for o in 0..20.min(pool_tools - g * 20) {
            let id = format!("op{o:02}");
            paths.insert(
                format!("/{id}"),
                op(&id, &format!("Operation {o} of {name}")),
            );
            let script = dir.join(format!("{id}.sh"));
            std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(
            dir.join("openapi.json"),
            json!({"openapi": "3.1.0", "info": {"title": name, "version": "1"}, "paths": paths})
                .to_string(),
        )
        .unwrap();
    }
    let dir = tools.join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("openapi.json"),
        json!({"openapi": "3.1.0", "info": {"title": "bench", "version": "1"},
               "paths": {"/cat": op("cat", "Echo the arguments")}})
        .to_string(),
    )
    .unwrap();
    let script = dir.join("cat.sh");
    std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bench__cat","arguments":{"n":1}}}"#;

/// One `tools/call` of the `cat` script, checked to have succeeded.
async fn call_cat(http: &reqwest::Client, url: &str, tok: &str) {
    let r = mcp_post(http, url, tok, CALL).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let b = r.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&b);
    assert!(
        text.contains("\"result\"") && !text.contains("\"isError\":true"),
        "the call failed: {text}"
    );
}

/// Sequential `tools/call`s of the `cat` script at one client.
async fn calls(http: &reqwest::Client, base: &str, tok: &str, n: usize) -> Stats {
    let url = format!("{base}/mcp");
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        call_cat(http, &url, tok).await;
        // The first tenth warms connections and caches.
        if i >= n / 10 {
            v.push(t.elapsed());
        }
    }
    stats(v)
}

/// The same script spawned from async Rust with nothing else: the floor of P2.
async fn bare_spawns(script: &Path, n: usize) -> Stats {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        bare_spawn(script).await;
        if i >= n / 10 {
            v.push(t.elapsed());
        }
    }
    stats(v)
}

/// A row the size of a call's audit row, for the floor's INSERTs.
const FLOOR_ROW: &str = r#"{"event_type":"tool.call_started","agent":"caller","tool":"bench__cat","surface":"mcp","client_id":"tg_0123456789abcdef","arguments":{"n":1},"instance":"bench:1","request_id":"0193c1f0-0000-7000-8000-000000000000"}"#;

/// The floor's table: one row per INSERT, durable at commit like the audit log's.
async fn floor_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY,
             at timestamptz NOT NULL DEFAULT now(), body jsonb NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn floor_row(pool: &PgPool) {
    sqlx::query("INSERT INTO bench_floor (body) VALUES ($1::jsonb)")
        .bind(FLOOR_ROW)
        .execute(pool)
        .await
        .unwrap();
}

/// The minimal work the audit promise requires of one call, with nothing of the gateway: a
/// durable INSERT, the bare spawn of the same script, a second durable INSERT, in order,
/// through one pooled connection (`spawn: false`: the two INSERTs alone).
async fn floor(script: &Path, pool: &PgPool, n: usize, spawn: bool) -> Stats {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        floor_row(pool).await;
        if spawn {
            bare_spawn(script).await;
        }
        floor_row(pool).await;
        if i >= n / 10 {
            v.push(t.elapsed());
        }
    }
    stats(v)
}

async fn bare_spawn(script: &Path) {
    let mut child = tokio::process::Command::new(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(br#"{"n":1}"#).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success() && out.stdout == br#"{"n":1}"#);
}

/// `conns` loops running `one` back to back for `secs`: runs per second.
async fn per_second<F, Fut>(conns: usize, secs: u64, one: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                while Instant::now() < deadline {
                    one().await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// P7's reference: `conns` loops spawning the script bare: spawns/s.
async fn concurrent_spawns(script: &Path, conns: usize, secs: u64) -> f64 {
    let script = Arc::new(script.to_path_buf());
    per_second(conns, secs, move || {
        let script = script.clone();
        async move { bare_spawn(&script).await }
    })
    .await
}

/// P7: `conns` clients calling the `cat` script: calls/s, each call checked to have
/// succeeded (a refused or failed call is not a call).
async fn concurrent_calls(
    http: &reqwest::Client,
    base: &str,
    tok: &str,
    conns: usize,
    secs: u64,
) -> f64 {
    let target = Arc::new((http.clone(), format!("{base}/mcp"), tok.to_owned()));
    per_second(conns, secs, move || {
        let target = target.clone();
        async move {
            let (http, url, tok) = &*target;
            call_cat(http, url, tok).await;
        }
    })
    .await
}

fn ratio(ours: f64, reference: f64) -> String {
    format!("{:.2}×", ours / reference)
}

#[tokio::main]
async fn main() {
    let o = Options::parse();
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/postgres".into());
    let base_url = server.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap();
    let db = format!("toolgate_bench_{}", std::process::id());
    let url = format!("{base_url}/{db}");
    let tools = tempfile_dir();
    write_pool(&tools, o.pool_tools);
    let http = reqwest::Client::new();
    let mut figures = Vec::new();
    println!(
        "toolgate side-by-side harness{}: a pool of {} tools, P1 for {} s at 32 connections, {} samples for P2–P4\n",
        if o.smoke {
            " (SMOKE: few samples, figures mean nothing)"
        } else {
            ""
        },
        o.pool_tools + 1,
        o.seconds,
        o.samples
    );

    let (state, base) = app(&url, &tools, true, &[]).await;
    let (plain, base_off) = app(&url, &tools, false, &[]).await;
    let (_sdk, base_sdk) = app(&url, &tools, true, &["--mcp-fast-list", "off"]).await;

    // P1: the agent `lister` sees one group of 20 tools of the pool.
    let list_tok = token(&http, &base, "lister", "g00000").await;
    let reference = start_reference(&http, &base, &list_tok, LIST).await;
    let ours_url = format!("{base}/mcp");
    let _ = throughput(&http, &ours_url, &list_tok, LIST, 32, 1).await;
    let _ = throughput(&http, &reference, &list_tok, LIST, 32, 1).await;
    let (ours, ours_lat) = throughput(&http, &ours_url, &list_tok, LIST, 32, o.seconds).await;
    let (refr, ref_lat) = throughput(&http, &reference, &list_tok, LIST, 32, o.seconds).await;
    // The same list with the audit log off: what the list's audit row costs.
    let off_tok = token(&http, &base_off, "lister", "g00000").await;
    let off_url = format!("{base_off}/mcp");
    let (off, off_lat) = throughput(&http, &off_url, &off_tok, LIST, 32, o.seconds).await;
    // The same list through the SDK's dispatch and typed serialization: what the fast path saves.
    let sdk_tok = token(&http, &base_sdk, "lister", "g00000").await;
    let sdk_url = format!("{base_sdk}/mcp");
    let (sdk, sdk_lat) = throughput(&http, &sdk_url, &sdk_tok, LIST, 32, o.seconds).await;
    assert!(
        state.metrics.mcp_fast_lists.get() > 0,
        "the lists were not answered by the fast path"
    );
    figures.push(Figure {
        name: "P1 tools/list, 20 of the pool, 32 connections (req/s)",
        ours: format!(
            "{ours:.0} (p50 {:.2} p99 {:.2} ms)",
            ours_lat.p50, ours_lat.p99
        ),
        reference: format!(
            "{refr:.0} (p50 {:.2} p99 {:.2} ms)",
            ref_lat.p50, ref_lat.p99
        ),
        ratio: ratio(ours, refr),
        goal: "≥ 0.7×",
    });
    figures.push(Figure {
        name: "P1 (part) the same list with audit off (req/s)",
        ours: format!(
            "{off:.0} (p50 {:.2} p99 {:.2} ms)",
            off_lat.p50, off_lat.p99
        ),
        reference: format!("{refr:.0}"),
        ratio: ratio(off, refr),
        goal: "-",
    });
    figures.push(Figure {
        name: "P1 (part) the same list through the SDK, --mcp-fast-list off (req/s)",
        ours: format!(
            "{sdk:.0} (p50 {:.2} p99 {:.2} ms)",
            sdk_lat.p50, sdk_lat.p99
        ),
        reference: format!("{refr:.0}"),
        ratio: ratio(sdk, refr),
        goal: "-",
    });

    // P2: a script tool's call against a bare spawn; the sandboxed spawn alone in between.
    let call_tok = token(&http, &base, "caller", "bench").await;
    let call_tok_off = token(&http, &base_off, "caller", "bench").await;
    let script = tools.join("bench/cat.sh");
    let bare = bare_spawns(&script, o.samples).await;
    let catalog = state.policy.catalog();
    let toolgate::pool::Execution::Script(spec) = &catalog.get("bench__cat").unwrap().exec else {
        unreachable!("bench__cat is a script")
    };
    let mut sandboxed = Vec::new();
    for i in 0..o.samples {
        let t = Instant::now();
        toolgate::pool::runner::run(
            spec,
            &json!({"n": i}),
            &state.settings.output,
            &Default::default(),
            &[],
            toolgate::audit::Durable::now(),
        )
        .await;
        sandboxed.push(t.elapsed());
    }
    let sandboxed = stats(sandboxed);
    let on = calls(&http, &base, &call_tok, o.samples).await;
    let off = calls(&http, &base_off, &call_tok_off, o.samples).await;
    // The floor: the bare spawn with two durable single-row INSERTs around it, in order, in
    // the gateway's database through a pool of its own.
    let floor_pool = PgPool::connect(&url).await.unwrap();
    floor_table(&floor_pool).await;
    let floor_call = floor(&script, &floor_pool, o.samples, true).await;
    let two_rows = floor(&script, &floor_pool, o.samples, false).await;
    let ms = |s: Stats| format!("p50 {:.3} p99 {:.3} ms", s.p50, s.p99);
    figures.push(Figure {
        name: "P2 script tools/call, audit on, vs the floor (bare spawn + two durable rows)",
        ours: ms(on),
        reference: ms(floor_call),
        ratio: ratio(on.p50, floor_call.p50),
        goal: "≤ 1.1×",
    });
    figures.push(Figure {
        name: "P2 script tools/call, audit on, vs a bare spawn",
        ours: ms(on),
        reference: ms(bare),
        ratio: ratio(on.p50, bare.p50),
        goal: "≤ 1.3×",
    });
    figures.push(Figure {
        name: "P2 (part) the floor vs a bare spawn; two durable rows alone",
        ours: ms(floor_call),
        reference: ms(bare),
        ratio: format!(
            "{} (rows {})",
            ratio(floor_call.p50, bare.p50),
            ms(two_rows)
        ),
        goal: "-",
    });
    figures.push(Figure {
        name: "P2 (part) the sandboxed spawn alone, vs a bare spawn",
        ours: ms(sandboxed),
        reference: ms(bare),
        ratio: ratio(sandboxed.p50, bare.p50),
        goal: "-",
    });
    figures.push(Figure {
        name: "P4 the same call, audit on vs audit off",
        ours: ms(on),
        reference: ms(off),
        ratio: ratio(on.p50, off.p50),
        goal: "≤ 1.2×",
    });

    // P7: many calls at once: 32 clients calling the script, audit on and off, against 32
    // loops spawning it bare.
    let secs = o.seconds;
    let spawned = concurrent_spawns(&script, 32, secs).await;
    let called = concurrent_calls(&http, &base, &call_tok, 32, secs).await;
    let called_off = concurrent_calls(&http, &base_off, &call_tok_off, 32, secs).await;
    figures.push(Figure {
        name: "P7 script tools/call at 32 clients, audit on (calls/s), vs a bare spawner at 32",
        ours: format!("{called:.0}"),
        reference: format!("{spawned:.0}"),
        ratio: ratio(called, spawned),
        goal: "≥ 0.8×",
    });
    figures.push(Figure {
        name: "P7 (part) the same with audit off (calls/s)",
        ours: format!("{called_off:.0}"),
        reference: format!("{spawned:.0}"),
        ratio: ratio(called_off, spawned),
        goal: "-",
    });

    // P4: durable audit rows per second through the group-commit writer, 256 writers.
    let pool = PgPool::connect(&url).await.unwrap();
    let log = AuditLog::spawn(
        pool.clone(),
        format!("bench/{}", uuid::Uuid::now_v7()),
        "bench".into(),
    );
    let started = Instant::now();
    let per = if o.smoke { 10 } else { 400 };
    let writers: Vec<_> = (0..256)
        .map(|_| {
            let log = log.clone();
            tokio::spawn(async move {
                for _ in 0..per {
                    let mut e = AuditEvent::new(
                        toolgate::audit::EventKind::ToolResult,
                        toolgate::audit::Outcome::Success,
                    );
                    e.agent = Some("bench".into());
                    e.tool = Some("bench__cat".into());
                    log.record(e).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let rows = 256 * per;
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    figures.push(Figure {
        name: "P4 durable audit rows/s, 256 writers (each waits for its commit)",
        ours: format!("{rate:.0}"),
        reference: "10000 (goal)".into(),
        ratio: ratio(rate, 10_000.0),
        goal: "≥ 1×",
    });

    // P3: a proxied call against the same upstream called directly with the same client.
    // The same through the gateway with audit off: how much of the added time is the call's two
    // durable audit commits.
    match proxied_vs_direct(
        (&state, &base),
        (&plain, &base_off),
        &http,
        (o.samples, o.seconds),
        &floor_pool,
    )
    .await
    {
        Some(Proxied {
            direct,
            direct_fresh,
            direct_as_peer,
            floor: floor_proxied,
            via,
            via_off,
            peer,
            at32,
        }) => {
            let added = |name, via: Stats, goal| Figure {
                name,
                ours: ms(via),
                reference: ms(direct),
                ratio: format!(
                    "{:+.2} ms ({})",
                    via.p50 - direct.p50,
                    ratio(via.p50, direct.p50)
                ),
                goal,
            };
            figures.push(added(
                "P3 proxied upstream tools/call, added p50 over direct",
                via,
                "≤ two rows + 0.3 ms",
            ));
            figures.push(Figure {
                name: "P3 the same, vs the floor (the direct call between two durable rows)",
                ours: ms(via),
                reference: ms(floor_proxied),
                ratio: format!(
                    "{:+.2} ms ({})",
                    via.p50 - floor_proxied.p50,
                    ratio(via.p50, floor_proxied.p50)
                ),
                goal: "≤ +0.3 ms",
            });
            figures.push(added("P3 (part) the same with audit off", via_off, "-"));
            figures.push(added(
                "P3 (part) the direct call by the SDK's default client (a new connection per call)",
                direct_fresh,
                "-",
            ));
            let two_rows = floor_proxied.p50 - direct.p50;
            match peer {
                Some(peer) => {
                    figures.push(added(
                        "peer: the same call through mcp-proxy 0.6.0 (bearer check, no durable audit), vs the SDK client's direct call",
                        peer,
                        "-",
                    ));
                    figures.push(Figure {
                        name: "peer: the same, added over the direct call as the peer sends it (no MCP-Protocol-Version)",
                        ours: ms(peer),
                        reference: ms(direct_as_peer),
                        ratio: format!(
                            "{:+.2} ms ({})",
                            peer.p50 - direct_as_peer.p50,
                            ratio(peer.p50, direct_as_peer.p50)
                        ),
                        goal: "-",
                    });
                    // Each side's added time over its own direct call: toolgate's requests
                    // and the peer's are answered differently by the reference server.
                    let peer_added = peer.p50 - direct_as_peer.p50;
                    figures.push(Figure {
                        name: "peer: toolgate audit off vs mcp-proxy, added p50 (each over its own direct call)",
                        ours: format!("{:+.2} ms", via_off.p50 - direct.p50),
                        reference: format!("{peer_added:+.2} ms"),
                        ratio: format!("{:+.2} ms", via_off.p50 - direct.p50 - peer_added),
                        goal: "≤ 0",
                    });
                    figures.push(Figure {
                        name: "peer: toolgate audit on vs mcp-proxy + two durable rows, added p50",
                        ours: format!("{:+.2} ms", via.p50 - direct.p50),
                        reference: format!("{:+.2} ms", peer_added + two_rows),
                        ratio: format!("{:+.2} ms", via.p50 - direct.p50 - (peer_added + two_rows)),
                        goal: "≤ 0",
                    });
                }
                None => println!(
                    "peer skipped: TOOLGATE_PEER_BIN is not set (bench/run.sh builds mcp-proxy and sets it)"
                ),
            }
            figures.push(Figure {
                name: "P7 proxied tools/call at 32 callers, audit on (calls/s), vs direct at 32",
                ours: format!("{:.0}", at32.via),
                reference: format!("{:.0}", at32.direct),
                ratio: ratio(at32.via, at32.direct),
                goal: "≥ 0.8×",
            });
            figures.push(Figure {
                name: "P7 (part) the same with audit off (calls/s)",
                ours: format!("{:.0}", at32.via_off),
                reference: format!("{:.0}", at32.direct),
                ratio: ratio(at32.via_off, at32.direct),
                goal: "-",
            });
            if let Some(peer) = at32.peer {
                figures.push(Figure {
                    name: "peer: proxied calls/s at 32 callers, toolgate audit on vs mcp-proxy",
                    ours: format!("{:.0} (audit off {:.0})", at32.via, at32.via_off),
                    reference: format!("{peer:.0}"),
                    ratio: ratio(at32.via, peer),
                    goal: "≥ 1×",
                });
            }
        }
        None => println!("P3 skipped: npm could not install the reference upstream"),
    }

    println!("| figure | toolgate | reference | ratio | goal |");
    println!("| --- | --- | --- | --- | --- |");
    for f in &figures {
        println!(
            "| {} | {} | {} | {} | {} |",
            f.name, f.ours, f.reference, f.ratio, f.goal
        );
    }

    pool.close().await;
    floor_pool.close().await;
    state.db.close().await;
    plain.db.close().await;
    let admin = PgPool::connect(&server).await.unwrap();
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&admin)
        .await;
    let _ = std::fs::remove_dir_all(&tools);
}

/// `@modelcontextprotocol/server-everything` over Streamable HTTP, called directly and through
/// the gateway (token, grants, limits, two audit rows, forwarding), by the same rmcp client;
/// then through the instance with audit off, and through the peer (`TOOLGATE_PEER_BIN`, an
/// `mcp-proxy` binary) when given; `n` sequential calls each, then 32 at once for `secs`.
async fn proxied_vs_direct(
    (state, base): (&AppState, &str),
    (off, base_off): (&AppState, &str),
    http: &reqwest::Client,
    (n, secs): (usize, u64),
    floor_pool: &PgPool,
) -> Option<Proxied> {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let deps = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-deps");
    let entry = deps.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.is_file() {
        let ok = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&deps)
            .arg("@modelcontextprotocol/server-everything@2026.8.31")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return None;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut upstream = std::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(listens(port).await, "the reference upstream did not start");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let spec: toolgate::upstream::UpstreamSpec =
        serde_json::from_value(json!({"transport": "http", "url": url})).unwrap();
    let name = toolgate::names::GroupName::parse("everything").unwrap();
    toolgate::service::upstreams::set(state, "bench", &name, spec)
        .await
        .unwrap();
    let tok = token(http, base, "proxied", "everything").await;
    // The audit-off instance has no policy listener: it re-reads the upstreams and the
    // approval of their first listing itself.
    off.reload_policy().await.unwrap();
    let tok_off = token(http, base_off, "proxied", "everything").await;
    let mut listed = false;
    for _ in 0..600 {
        // In the catalog, and no longer held: an upstream group is pinned, and its first
        // definitions are approved on first use, a moment after they arrive.
        let ready = |s: &AppState| {
            let snapshot = s.policy.load();
            snapshot.catalog.get("everything__echo").is_some()
                && !snapshot.is_held("everything__echo")
        };
        if ready(state) && ready(off) {
            listed = true;
            break;
        }
        off.reload_policy().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(listed, "the upstream's tools never reached the catalog");
    let direct = ()
        .serve(kept(StreamableHttpClientTransportConfig::with_uri(
            url.as_str(),
        )))
        .await
        .unwrap();
    let via_client = async |base: &str, tok: String| {
        let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"));
        config.auth_header = Some(tok);
        ().serve(kept(config)).await.unwrap()
    };
    let via = via_client(base, tok).await;
    let via_off = via_client(base_off, tok_off).await;
    let peer = match std::env::var_os("TOOLGATE_PEER_BIN") {
        Some(bin) => {
            let (process, port) = start_peer(Path::new(&bin), &url).await;
            let mut config =
                StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/"));
            config.auth_header = Some(PEER_TOKEN.into());
            let client = ().serve(kept(config)).await.unwrap();
            Some((process, client))
        }
        None => None,
    };
    // `floor`: a durable INSERT before the call and one after it, as the floor of P2.
    let run = async |client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
                     name: &str,
                     floor: Option<&PgPool>| {
        let mut v = Vec::new();
        for i in 0..n + n / 10 {
            let mut p = CallToolRequestParams::new(name.to_owned());
            p.arguments = json!({"message": format!("m{i}")}).as_object().cloned();
            let t = Instant::now();
            if let Some(pool) = floor {
                floor_row(pool).await;
            }
            let r = client.call_tool(p).await.unwrap();
            assert_ne!(r.is_error, Some(true));
            if let Some(pool) = floor {
                floor_row(pool).await;
            }
            if i >= n / 10 {
                v.push(t.elapsed());
            }
        }
        stats(v)
    };
    // One untimed round first: the reference server compiles its hot paths as it serves, and
    // the first series measured would pay for it.
    run(&direct, "echo", None).await;
    let d = run(&direct, "echo", None).await;
    let fresh = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url.as_str()),
        ))
        .await
        .unwrap();
    let d_fresh = run(&fresh, "echo", None).await;
    let _ = fresh.cancel().await;
    let d_as_peer = as_the_peer_calls(http, &url, n).await;
    let f = run(&direct, "echo", Some(floor_pool)).await;
    let g = run(&via, "everything__echo", None).await;
    let g_off = run(&via_off, "everything__echo", None).await;
    let p = match &peer {
        Some((_, client)) => Some(run(client, "everything/echo", None).await),
        None => None,
    };
    // 32 calls at once, each caller sending its next as soon as its last is answered, through
    // one client each way (the SDK's client sends concurrent requests as concurrent POSTs).
    let at32 = async |client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
                      name: &'static str| {
        let peer = client.peer().clone();
        per_second(32, secs, move || {
            let peer = peer.clone();
            async move {
                let mut p = CallToolRequestParams::new(name);
                p.arguments = json!({"message": "m"}).as_object().cloned();
                let r = peer.call_tool(p).await.unwrap();
                assert_ne!(r.is_error, Some(true), "{r:?}");
            }
        })
        .await
    };
    let at32 = At32 {
        direct: at32(&direct, "echo").await,
        via: at32(&via, "everything__echo").await,
        via_off: at32(&via_off, "everything__echo").await,
        peer: match &peer {
            Some((_, client)) => Some(at32(client, "everything/echo").await),
            None => None,
        },
    };
    if let Some((mut process, client)) = peer {
        let _ = client.cancel().await;
        let _ = process.kill();
        let _ = process.wait();
    }
    let _ = direct.cancel().await;
    let _ = via.cancel().await;
    let _ = via_off.cancel().await;
    let _ = upstream.kill();
    let _ = upstream.wait();
    Some(Proxied {
        direct: d,
        direct_fresh: d_fresh,
        direct_as_peer: d_as_peer,
        floor: f,
        via: g,
        via_off: g_off,
        peer: p,
        at32,
    })
}

/// The SDK's client transport, keeping its connections between calls. Every MCP client of
/// the harness (direct, through toolgate, through the peer) is this one: the SDK's default
/// opens a connection per message, and the reference must not pay a connect the measured
/// path does not (toolgate and the peer both keep theirs to the upstream).
fn kept(
    config: rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
) -> rmcp::transport::StreamableHttpClientTransport<reqwest013::Client> {
    let client = reqwest013::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    rmcp::transport::StreamableHttpClientTransport::with_client(client, config)
}

/// `n` direct calls of `echo` at `url` made as the peer makes them upstream: a POST carrying
/// the session but no `MCP-Protocol-Version` header (the header the specification asks of
/// every request after `initialize`, which `mcp-proxy` 0.6.0 leaves out there). The
/// reference server answers such a request as an older client's, without the resumable
/// stream's first event, and sooner (by ~1.5 ms here): so the peer's added time is taken
/// over this call, not over the SDK client's.
async fn as_the_peer_calls(http: &reqwest::Client, url: &str, n: usize) -> Stats {
    let post = |body: Value, session: Option<&str>| {
        let mut r = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}});
    let answer = post(init, None).await.unwrap();
    let session = answer.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = answer.bytes().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(initialized, Some(&session)).await.unwrap();
    let mut v = Vec::new();
    for i in 0..n + n / 10 {
        let call = json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": format!("m{i}")}}});
        let t = Instant::now();
        let answer = post(call, Some(&session)).await.unwrap();
        assert!(answer.status().is_success());
        // The stream ends after its one answer: read to its end, as the peer reads it.
        let body = answer.text().await.unwrap();
        assert!(body.contains("Echo: m"), "{body}");
        if i >= n / 10 {
            v.push(t.elapsed());
        }
    }
    stats(v)
}

/// The bearer token the peer checks.
const PEER_TOKEN: &str = "peer-bench-token";

/// `mcp-proxy` in front of the upstream at `url`, checking a bearer token, as its README
/// configures it: the process and its port, once it listens.
async fn start_peer(bin: &Path, url: &str) -> (std::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = tempfile_dir().join("peer.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nname = \"bench-peer\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\
             [[backends]]\nname = \"everything\"\ntransport = \"http\"\nurl = \"{url}\"\n\
             [auth]\ntype = \"bearer\"\ntokens = [\"{PEER_TOKEN}\"]\n"
        ),
    )
    .unwrap();
    let mut process = std::process::Command::new(bin)
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    if listens(port).await {
        return (process, port);
    }
    let _ = process.kill();
    let _ = process.wait();
    panic!("the peer ({}) did not start", bin.display());
}

/// Whether something listens on `port` within 30 s. Polling a port is the only signal a child
/// process gives that it listens.
async fn listens(port: u16) -> bool {
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// P7's proxied figures: calls per second at 32 callers.
struct At32 {
    direct: f64,
    via: f64,
    via_off: f64,
    peer: Option<f64>,
}

/// P3's samples: the upstream called directly (kept connections; a new one per call; as the
/// peer calls it), directly between two durable INSERTs (the
/// floor), through the gateway, and through the gateway with audit off.
struct Proxied {
    direct: Stats,
    /// The direct call by the SDK's default client, which opens a connection per message.
    direct_fresh: Stats,
    /// The direct call as the peer sends it (see [`as_the_peer_calls`]).
    direct_as_peer: Stats,
    floor: Stats,
    via: Stats,
    via_off: Stats,
    peer: Option<Stats>,
    at32: At32,
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("toolgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
