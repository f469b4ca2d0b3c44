//! Agent rate limits shared in Redis (the real one on 127.0.0.1:6379) by several instances,
//! and what happens when Redis stops answering. Each test counts under its own key prefix.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{TestApp, repo_path};

const REDIS: &str = "redis://127.0.0.1:6379";

fn prefix() -> String {
    format!("toolgate-test:{}:", uuid::Uuid::new_v4())
}

/// An instance over `pool` counting in `url` (when given) with `extra` flags; the first one
/// built on a database also loads the example policies.
async fn instance(
    pool: &PgPool,
    first: bool,
    redis: Option<(&str, &str)>,
    extra: &[&str],
) -> TestApp {
    let mut args: Vec<&str> = Vec::new();
    if let Some((url, prefix)) = redis {
        args.extend(["--redis-url", url, "--redis-key-prefix", prefix]);
    }
    args.extend_from_slice(extra);
    let policies = repo_path("policies");
    TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        first.then_some(policies.as_path()),
        &args,
    )
    .await
}

async fn set_limits(app: &TestApp, agent: &str, limits: Value) {
    let r = app
        .admin(
            "PUT",
            &format!("/api/v1/agents/{agent}/rate-limits"),
            Some(json!({ "rate_limits": limits })),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
}

/// REST: 429. MCP: a tool error with `_meta.retry_after_ms` for a call, the server-range
/// JSON-RPC error with `data.retry_after_ms` for anything else.
fn is_rate_limited(r: &crate::helpers::Reply) -> bool {
    r.status == StatusCode::TOO_MANY_REQUESTS
        || (r.body["error"]["code"] == toolgate::mcp::RATE_LIMITED
            && r.body["error"]["data"]["retry_after_ms"].as_u64().is_some())
        || (r.body["result"]["isError"] == true
            && r.body["result"]["_meta"]["retry_after_ms"]
                .as_u64()
                .is_some())
}

/// `tools/list`s alternating between `a` and `b`, back to back; how many were admitted.
async fn alternate(a: &TestApp, b: &TestApp, token: &str, n: usize) -> usize {
    let mut allowed = 0;
    for i in 0..n {
        let app = if i % 2 == 0 { a } else { b };
        let r = app.mcp(Some(token), "tools/list", json!({})).await;
        if is_rate_limited(&r) {
            continue;
        }
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(r.body["result"]["tools"].is_array(), "{}", r.text);
        allowed += 1;
    }
    allowed
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn two_instances_draw_on_one_budget_in_redis(pool: PgPool) {
    let prefix = prefix();
    let a = instance(&pool, true, Some((REDIS, &prefix)), &[]).await;
    let b = instance(&pool, false, Some((REDIS, &prefix)), &[]).await;
    let token = a.agent("shared", &["weather"]).await;
    set_limits(&a, "shared", json!([{"per_second": 1, "burst": 4}])).await;
    b.state.reload_policy().await.unwrap();

    let started = Instant::now();
    let allowed = alternate(&a, &b, &token, 12).await;
    let took = started.elapsed();

    println!("redis-backed: {allowed} of 12 allowed across two instances in {took:?}");
    // The burst, plus one more per whole second the calls took.
    assert!(allowed >= 4, "only {allowed} of 12 allowed");
    assert!(
        allowed as u64 <= 4 + took.as_secs(),
        "{allowed} of 12 allowed in {took:?}: the instances did not share the limit"
    );

    // The same two instances without Redis each count their own share: the reference that
    // shows the figure above is the store's doing.
    let c = instance(&pool, false, None, &[]).await;
    let d = instance(&pool, false, None, &[]).await;
    let started = Instant::now();
    let apart = alternate(&c, &d, &token, 12).await;
    println!(
        "in-memory: {apart} of 12 allowed across two instances in {:?}",
        started.elapsed()
    );
    assert!(apart >= 8, "{apart}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_call_refused_by_one_limit_is_charged_to_none(pool: PgPool) {
    let prefix = prefix();
    let app = instance(&pool, true, Some((REDIS, &prefix)), &[]).await;
    let token = app.agent("layered", &["weather"]).await;
    set_limits(
        &app,
        "layered",
        json!([{"per_hour": 100, "burst": 3}, {"pattern": "weather__current", "per_hour": 100, "burst": 1}]),
    )
    .await;

    let call = || app.call(&token, "weather__current", json!({"city": "Paris"}));
    assert!(!is_rate_limited(&call().await));
    // Refused by the per-tool limit: the agent-wide one must keep its two remaining requests.
    for _ in 0..3 {
        assert!(is_rate_limited(&call().await));
    }
    // Over REST the refusal names the tool's limit: 1 request, whole again in 36 s.
    let rest = app
        .get("/tools/weather/current?city=Paris", Some(&token))
        .await;
    assert_eq!(rest.status, StatusCode::TOO_MANY_REQUESTS, "{}", rest.text);
    assert_eq!(
        rest.headers["ratelimit-policy"],
        "\"weather__current\";q=1;w=36"
    );
    let t = &rest.headers["ratelimit"];
    assert!(
        t.to_str()
            .unwrap()
            .starts_with("\"weather__current\";r=0;t="),
        "{t:?}"
    );
    let list = || app.mcp(Some(&token), "tools/list", json!({}));
    assert!(
        !is_rate_limited(&list().await),
        "a refused call was charged"
    );
    assert!(
        !is_rate_limited(&list().await),
        "a refused call was charged"
    );
    assert!(is_rate_limited(&list().await));

    let mut redis = redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        // Idle keys vanish: at most the time to refill a burst of 3 at 100 an hour.
        assert!(ttl > 0 && ttl <= 3 * 36_000 + 1, "{key}: {ttl}");
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_fractional_per_minute_limit_gives_its_retry_after(pool: PgPool) {
    let prefix = prefix();
    let shared = instance(&pool, true, Some((REDIS, &prefix)), &[]).await;
    let local = instance(&pool, false, None, &[]).await;
    let token = shared.agent("slow", &["weather"]).await;
    // 1.5 a minute: one request every 40 s.
    set_limits(&shared, "slow", json!([{"per_minute": 1.5, "burst": 1}])).await;
    local.state.reload_policy().await.unwrap();

    for app in [&shared, &local] {
        let first = app.get("/openapi.json", Some(&token)).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text);
        let r = app.get("/openapi.json", Some(&token)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
        let secs: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        let ms = r.body["retry_after_ms"].as_u64().unwrap();
        assert_eq!(secs, 40, "{r:?}", r = r.text);
        assert!((39_000..=40_000).contains(&ms), "{ms}");
        assert_eq!(secs, ms.div_ceil(1000), "header and body disagree");
        // The IETF fields: the limit (1 request, whole again in 40 s) and none left for 40 s.
        assert_eq!(r.headers["ratelimit-policy"], "\"agent\";q=1;w=40");
        assert_eq!(r.headers["ratelimit"], "\"agent\";r=0;t=40");
        let mcp = app.mcp(Some(&token), "tools/list", json!({})).await;
        let mcp_ms = mcp.body["error"]["data"]["retry_after_ms"]
            .as_u64()
            .unwrap();
        assert!((39_000..=40_000).contains(&mcp_ms), "{}", mcp.text);
    }
}

/// A port where nothing listens.
async fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// A server that accepts connections and never answers: a hung Redis.
async fn hung_server() -> (u16, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    (port, task)
}

/// A proxy to the real Redis on `port` (0: any) that can be cut: open connections drop, new
/// ones are refused.
async fn cuttable_proxy(port: u16) -> (u16, tokio::sync::watch::Sender<bool>) {
    // The port of a proxy just cut is free once its listener is dropped, which its task does
    // as it ends.
    let mut tries = 0;
    let l = loop {
        match TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => break l,
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("cannot listen on {port}: {e}"),
        }
    };
    let port = l.local_addr().unwrap().port();
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    let mut accept_rx = cut_rx.clone();
    tokio::spawn(async move {
        loop {
            let mut client = tokio::select! {
                a = l.accept() => match a { Ok((s, _)) => s, Err(_) => return },
                _ = accept_rx.changed() => return,
            };
            let mut rx = cut_rx.clone();
            tokio::spawn(async move {
                let mut server = TcpStream::connect("127.0.0.1:6379").await.unwrap();
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = rx.changed() => {}
                }
            });
        }
    });
    (port, cut)
}

fn store_errors(app_metrics: &str) -> u64 {
    app_metrics
        .lines()
        .find_map(|l| l.strip_prefix("toolgate_rate_limit_store_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn fail_open_counts_in_the_instance_when_redis_is_unreachable(pool: PgPool) {
    let url = format!("redis://127.0.0.1:{}", dead_port().await);
    let app = instance(
        &pool,
        true,
        Some((&url, &prefix())),
        &["--redis-failure-mode", "open"],
    )
    .await;
    let token = app.agent("open", &["weather"]).await;
    set_limits(&app, "open", json!([{"per_minute": 1, "burst": 2}])).await;

    let started = Instant::now();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(is_rate_limited(
            &app.mcp(Some(&token), "tools/list", json!({})).await,
        ));
    }
    // Served, and still limited: by this instance's own counters.
    assert_eq!(outcomes, [false, false, true]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let metrics = app.get("/metrics", None).await.text;
    assert!(store_errors(&metrics) >= 1, "{metrics}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn fail_open_takes_over_when_redis_stops_talking_mid_way(pool: PgPool) {
    let (port, cut) = cuttable_proxy(0).await;
    let url = format!("redis://127.0.0.1:{port}");
    let prefix = prefix();
    let app = instance(&pool, true, Some((&url, &prefix)), &[]).await;
    let token = app.agent("midway", &["weather"]).await;
    set_limits(&app, "midway", json!([{"per_minute": 1, "burst": 3}])).await;
    let list = || app.mcp(Some(&token), "tools/list", json!({}));

    // Two requests counted in Redis.
    assert!(!is_rate_limited(&list().await));
    assert!(!is_rate_limited(&list().await));
    let mut redis = redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let counted: bool = redis::cmd("EXISTS")
        .arg(format!("{prefix}{{midway}}:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(counted, "the requests were not counted in Redis");
    assert_eq!(store_errors(&app.get("/metrics", None).await.text), 0);

    cut.send(true).unwrap();
    // The instance now counts on its own, from a full burst of 3, without stalling.
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        outcomes.push(is_rate_limited(&list().await));
    }
    assert_eq!(outcomes, [false, false, false, true]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(store_errors(&app.get("/metrics", None).await.text) >= 1);

    // Redis back: the connection manager reconnects, and the next request is counted there
    // again (Redis has one request of the burst left; this instance's own counters none).
    let key = format!("{prefix}{{midway}}:*");
    let tat = |mut redis: redis::aio::MultiplexedConnection| {
        let key = key.clone();
        async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<String>>(&mut redis)
                .await
                .unwrap()
        }
    };
    let before = tat(redis.clone()).await;
    let (_, _back) = cuttable_proxy(port).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut admitted = false;
    while Instant::now() < deadline {
        if !is_rate_limited(&list().await) {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "never counted in Redis again after it came back");
    assert_ne!(
        tat(redis.clone()).await,
        before,
        "admitted, but not by Redis"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn fail_closed_refuses_with_503_when_redis_hangs(pool: PgPool) {
    let (port, _server) = hung_server().await;
    let url = format!("redis://127.0.0.1:{port}");
    let app = instance(
        &pool,
        true,
        Some((&url, &prefix())),
        &["--redis-failure-mode", "closed", "--redis-timeout-ms", "50"],
    )
    .await;
    let token = app.agent("closed", &["weather"]).await;
    set_limits(&app, "closed", json!([{"per_second": 10}])).await;

    let started = Instant::now();
    let r = app.get("/openapi.json", Some(&token)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.headers["retry-after"], "1");
    assert!(
        r.text.contains("rate-limit store is unavailable"),
        "{}",
        r.text
    );
    let mcp = app.mcp(Some(&token), "tools/list", json!({})).await;
    assert!(
        mcp.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("rate-limit store is unavailable")),
        "{}",
        mcp.text
    );
    let metrics = app.get("/metrics", None).await.text;
    assert!(store_errors(&metrics) >= 1, "{metrics}");

    // An agent without limits needs no store and is served.
    let free = app.agent("unlimited", &["weather"]).await;
    assert_eq!(
        app.get("/openapi.json", Some(&free)).await.status,
        StatusCode::OK
    );
}

/// What a Redis-backed check costs over an in-memory one, on this machine:
/// `cargo nextest run --run-ignored only -E 'test(check_latency)' --no-capture`
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement, not a test"]
async fn check_latency(pool: PgPool) {
    const N: usize = 5000;
    let app = instance(&pool, true, Some((REDIS, &prefix())), &[]).await;
    app.agent("fast", &["weather"]).await;
    set_limits(
        &app,
        "fast",
        json!([{"per_second": 1000000, "burst": 1000000}, {"pattern": "weather", "per_second": 1000000, "burst": 1000000}]),
    )
    .await;
    let snapshot = app.state.policy.load();
    let agent = snapshot.agent("fast").unwrap();
    let local = toolgate::limits::RateLimits::new(5, 20);

    let mut redis_ns = Vec::with_capacity(N);
    let mut local_ns = Vec::with_capacity(N);
    // Interleaved, so both see the same machine load.
    for _ in 0..N {
        let t = Instant::now();
        app.state
            .limits
            .check(agent, Some("weather__current"))
            .await
            .unwrap();
        redis_ns.push(t.elapsed().as_nanos() as u64);
        let t = Instant::now();
        local.check(agent, Some("weather__current")).await.unwrap();
        local_ns.push(t.elapsed().as_nanos() as u64);
    }
    let pct = |v: &mut Vec<u64>, p: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p) as usize]
    };
    let (r50, r99) = (pct(&mut redis_ns, 0.5), pct(&mut redis_ns, 0.99));
    let (l50, l99) = (pct(&mut local_ns, 0.5), pct(&mut local_ns, 0.99));
    println!(
        "{N} checks of 2 limits each: redis p50 {:.1} us p99 {:.1} us; in-memory p50 {:.1} us p99 {:.1} us; redis adds {:.1} us at p50",
        r50 as f64 / 1e3,
        r99 as f64 / 1e3,
        l50 as f64 / 1e3,
        l99 as f64 / 1e3,
        (r50 as f64 - l50 as f64) / 1e3
    );
}

/// Limits stored before periods existed (whole requests per second) survive the migration
/// unchanged in meaning, and load.
#[sqlx::test(migrations = false)]
async fn limits_stored_per_second_survive_the_migration(pool: PgPool) {
    let all = &toolgate::db::MIGRATOR;
    let at = all
        .iter()
        .position(|m| m.description.contains("rate limit periods"))
        .expect("the migration is there");
    let before = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(all.iter().take(at).cloned().collect()),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    before.run(&pool).await.unwrap();
    let agent = uuid::Uuid::now_v7();
    sqlx::query("INSERT INTO agents (id, name) VALUES ($1, 'legacy')")
        .bind(agent)
        .execute(&pool)
        .await
        .unwrap();
    for (pattern, per_second, burst) in [(None, 5, 10), (Some("weather"), 2_000_000_000, 3)] {
        sqlx::query("INSERT INTO rate_limits (id, agent_id, pattern, per_second, burst) VALUES ($1, $2, $3, $4, $5)")
            .bind(uuid::Uuid::now_v7())
            .bind(agent)
            .bind(pattern)
            .bind(per_second)
            .bind(burst)
            .execute(&pool)
            .await
            .unwrap();
    }

    all.run(&pool).await.unwrap();

    let state = toolgate::db::snapshot::load_state(&pool).await.unwrap();
    let legacy = state.agents.iter().find(|a| a.name == "legacy").unwrap();
    let shown: Vec<String> = legacy.limits.iter().map(|l| l.limit.to_string()).collect();
    assert_eq!(shown, ["5/second burst 10", "1000000/second burst 3"]);
}

#[test]
fn a_redis_url_the_client_cannot_use_stops_serve_at_start() {
    use clap::Parser;
    use toolgate::config::{Cli, Command};
    for (url, mode) in [("http://127.0.0.1:6379", "open"), ("not a url", "closed")] {
        let Command::Serve(serve) = Cli::try_parse_from([
            "toolgate",
            "serve",
            "--redis-url",
            url,
            "--redis-failure-mode",
            mode,
        ])
        .unwrap()
        .command
        else {
            unreachable!()
        };
        let err = toolgate::state::Settings::from_args(&serve).unwrap_err();
        assert!(err.to_string().contains("--redis-url"), "{url}: {err}");
    }
    assert!(
        Cli::try_parse_from(["toolgate", "serve", "--redis-failure-mode", "maybe"]).is_err(),
        "an unknown failure mode was accepted"
    );
}
