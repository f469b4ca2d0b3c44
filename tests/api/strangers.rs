//! Strangers who prove nothing: failed bearer and credential checks from one source draw on
//! one budget (429 past it, shared by every instance through Redis), identical refusals from a
//! source are written as their first row and one row with their count, and nobody can spend
//! the budget of a legitimate agent from another source.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{Request, StatusCode, header};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, mcp_request, refusals_on_record, repo_path};
use toolgate::limits::FAILURES_PER_IP;

/// `req` as it arrives from `ip` over a real connection.
fn from(ip: &str, mut req: Request<Body>) -> Request<Body> {
    let addr = SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 40_000);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// `tools/list` on /mcp from `ip` with `token`.
async fn list(app: &TestApp, ip: &str, token: &str) -> Reply {
    let headers = [
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let req = mcp_request(Some(token), json!(1), "tools/list", json!({}), &headers);
    app.send(from(ip, req)).await
}

async fn token_from(app: &TestApp, ip: &str, id: &str, secret: &str) -> Reply {
    let req = Request::post("/oauth/token")
        .header("content-type", "application/x-www-form-urlencoded")
        .header(
            "authorization",
            format!("Basic {}", STANDARD.encode(format!("{id}:{secret}"))),
        )
        .body(Body::from("grant_type=client_credentials"))
        .unwrap();
    app.send(from(ip, req)).await
}

async fn rows(pool: &PgPool, filter: &str) -> Vec<(String, Option<String>, Option<String>)> {
    sqlx::query_as(&format!(
        "SELECT outcome, error, details FROM audit_events WHERE {filter} ORDER BY id"
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Finding 10: 300 requests with a bad bearer token to /mcp from one address.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_bad_bearer_flood_is_limited_and_summarised_not_written_row_by_row(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let good = app.token_with(&id, &secret).await;
    let stranger = "198.51.100.7";

    let mut statuses = Vec::new();
    for batch in 0..10 {
        let sent = (0..30).map(|i| {
            let app = &app;
            async move { list(app, stranger, &format!("not.a.token{batch}-{i}")).await }
        });
        statuses.extend(futures::future::join_all(sent).await);
    }
    let unauthorized = statuses
        .iter()
        .filter(|r| r.status == StatusCode::UNAUTHORIZED)
        .count();
    let limited: Vec<&Reply> = statuses
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    println!(
        "300 bad bearer tokens: {unauthorized} x 401, {} x 429",
        limited.len()
    );
    assert_eq!(unauthorized + limited.len(), 300);
    assert!(
        !limited.is_empty(),
        "no request was refused by the source's budget"
    );
    assert!(unauthorized >= FAILURES_PER_IP.0 as usize);
    let wait: u64 = limited[0].headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);

    // The agent's valid token works from the flooded address and from any other.
    for ip in [stranger, "203.0.113.20"] {
        let r = list(&app, ip, &good).await;
        assert_eq!(r.status, StatusCode::OK, "{ip}: {}", r.text);
    }

    // Every refusal is on record, in far fewer rows than refusals.
    let filter = format!("event_type = 'auth.rejected' AND remote_addr = '{stranger}'");
    assert_eq!(refusals_on_record(&app, &filter).await, 300);
    let written = rows(&pool, &filter).await;
    println!("audit rows for them: {}", written.len());
    assert!(written.len() <= 6, "{written:?}");
    // The first refusal is its own row, written as it happened.
    let (outcome, error, details) = &written[0];
    assert_eq!(outcome, "denied");
    assert!(error.as_deref().unwrap().contains("token"), "{error:?}");
    assert!(details.is_none());
    // And the counts say what followed.
    let counted: Vec<(String, u64)> = written
        .iter()
        .filter_map(|(o, _, d)| {
            let d: serde_json::Value = serde_json::from_str(d.as_deref()?).ok()?;
            Some((o.clone(), d["summary"]["repeats"].as_u64()?))
        })
        .collect();
    assert!(
        counted
            .iter()
            .any(|(o, n)| o == "rate_limited" && *n as usize == limited.len() - 1),
        "{counted:?}"
    );
}

/// A stranger who knows an agent's client id and fails against it from many addresses spends
/// that client id's budget, but not for the source the agent signs in from.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stranger_cannot_lock_an_agent_out_by_failing_against_its_client_id(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;
    let agent_host = "192.0.2.40";
    let r = token_from(&app, agent_host, &id, &secret).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let mut limited = false;
    for i in 0..60 {
        let r = token_from(
            &app,
            &format!("10.9.{}.{}", i / 200, i % 200),
            &id,
            "tgs_guess",
        )
        .await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            limited = true;
            break;
        }
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    }
    assert!(limited, "the client id's budget never ran out");
    // The guesses are still refused from new addresses...
    let r = token_from(&app, "10.9.9.9", &id, &secret).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    // ...but the agent, from where it authenticated before, gets its token.
    let r = token_from(&app, agent_host, &id, &secret).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// With Redis, a source's failures count on every instance: spending half the budget on one
/// and the rest on another is refused.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_source_that_failed_on_one_instance_is_limited_on_another(pool: PgPool) {
    let prefix = format!("toolgate-test:{}:", uuid::Uuid::new_v4());
    let redis = [
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--redis-key-prefix",
        &prefix,
    ];
    let a = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &redis,
    )
    .await;
    let b = TestApp::with(pool.clone(), &repo_path("tools"), None, &redis).await;
    let stranger = "198.51.100.77";
    let half = FAILURES_PER_IP.0 * 3 / 4;
    for i in 0..half {
        let r = list(&a, stranger, &format!("bad{i}")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    }
    let mut refused_on_b = None;
    for i in 0..half {
        let r = list(&b, stranger, &format!("bad{i}")).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            refused_on_b = Some(i);
            break;
        }
    }
    let Some(after) = refused_on_b else {
        panic!("{half} failures on each of two instances and neither refused the source")
    };
    println!("instance b refused the source after {after} failures of its own");
    assert!(after < half);
    // Another source is not affected on either.
    let r = list(&b, "198.51.100.78", "bad").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}
