//! Attacks on the one core path: whatever surface a request comes through, an ungranted
//! tool is indistinguishable from a missing one, every request counts against its agent, and
//! what is redacted stays redacted. Each test performs the attack and asserts the safe outcome.

use std::io::{Read, Write};
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, single_op, write_group};

/// Audit rows of `event_type` with `outcome`, written or still queued: waits (bounded) for
/// the detached writer.
async fn audited(pool: &PgPool, event_type: &str, outcome: &str, at_least: i64) -> i64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_events WHERE event_type = $1 AND outcome = $2",
        )
        .bind(event_type)
        .bind(outcome)
        .fetch_one(pool)
        .await
        .unwrap();
        if n >= at_least || std::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn raw(method: &str, uri: &str, token: &str, content_type: &str, body: Vec<u8>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_ungranted_rest_tool_answers_like_a_missing_one_whatever_the_body(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    // meteo may use weather, not search.
    let meteo = app.token_for("meteo").await;
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("application/json", b"{not json".to_vec()),
        ("application/json", b"[1, 2]".to_vec()),
        ("text/plain", b"hello".to_vec()),
        ("application/json", vec![b' '; 5 * 1024 * 1024]),
    ];
    for (ct, body) in bodies {
        let ungranted = app
            .send(raw("POST", "/tools/search/query", &meteo, ct, body.clone()))
            .await;
        let missing = app
            .send(raw("POST", "/tools/nosuchgroup/query", &meteo, ct, body))
            .await;
        assert_eq!(
            ungranted.status,
            StatusCode::NOT_FOUND,
            "{ct}: {}",
            ungranted.text
        );
        assert_eq!(ungranted.status, missing.status);
        assert_eq!(ungranted.text, missing.text);
    }
    // Both were refused on the record, as calls.
    assert!(audited(&pool, "tool.call", "denied", 8).await >= 8);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_granted_rest_tool_with_a_bad_body_is_audited_and_counted(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let assistant = app.token_for("assistant").await;
    let not_json = app
        .send(raw(
            "POST",
            "/tools/search/query",
            &assistant,
            "application/json",
            b"{not json".to_vec(),
        ))
        .await;
    let wrong_type = app
        .send(raw(
            "POST",
            "/tools/search/query",
            &assistant,
            "text/plain",
            b"q=x".to_vec(),
        ))
        .await;
    assert_eq!(
        not_json.status,
        StatusCode::BAD_REQUEST,
        "{}",
        not_json.text
    );
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(audited(&pool, "tool.call", "invalid_arguments", 2).await, 2);
}

/// A tool whose `tenant` argument must also travel as the `Mcp-Param-Tenant` header.
fn header_tool(dir: &std::path::Path) {
    write_group(
        dir,
        "hdr",
        &single_op(
            "op",
            json!({"type": "object", "properties": {"tenant": {"type": "string", "x-mcp-header": "Tenant"}}}),
            json!({}),
        ),
        &[("op", "#!/bin/sh\necho '{}'\n")],
    );
    write_group(
        dir,
        "other",
        &single_op("op", json!({"type": "object"}), json!({})),
        &[("op", "#!/bin/sh\necho '{}'\n")],
    );
}

async fn modern_call(app: &TestApp, token: &str, name: &str) -> crate::helpers::Reply {
    app.send(
        Request::post("/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", name)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": name, "arguments": {"tenant": "acme"},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}
                }}})
                .to_string(),
            ))
            .unwrap(),
    )
    .await
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn mcp_param_headers_cannot_tell_an_ungranted_tool_from_a_missing_one(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    header_tool(dir.path());
    let app = TestApp::with(pool, dir.path(), None, &[]).await;
    let outsider = app.agent("outsider", &["other"]).await;
    let insider = app.agent("insider", &["hdr"]).await;

    // The header the schema asks for is missing from every request below.
    let granted = modern_call(&app, &insider, "hdr__op").await;
    let ungranted = modern_call(&app, &outsider, "hdr__op").await;
    let missing = modern_call(&app, &outsider, "hdr__nothing").await;

    // For the caller who may use it, the header rule is enforced...
    assert_eq!(granted.body["error"]["code"], -32020, "{}", granted.text);
    // ...and for anyone else the tool does not exist, header rule and all.
    assert_eq!(ungranted.status, missing.status);
    assert_eq!(
        ungranted.body["error"]["code"],
        missing.body["error"]["code"]
    );
    assert_eq!(
        ungranted.body["error"]["message"]
            .as_str()
            .unwrap()
            .replace("hdr__op", "X"),
        missing.body["error"]["message"]
            .as_str()
            .unwrap()
            .replace("hdr__nothing", "X"),
        "{} / {}",
        ungranted.text,
        missing.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn strangers_do_not_learn_the_catalog_from_metadata(pool: PgPool) {
    let app = TestApp::new(pool).await;
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
    ] {
        let r = app.get(path, None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        for group in ["search", "weather", "text"] {
            assert!(
                !r.text.contains(&format!("tools:{group}")),
                "{path} names the group {group}: {}",
                r.text
            );
        }
    }
}

/// An agent allowed two requests at once and one a second more.
async fn limited_agent(app: &TestApp, name: &str) -> String {
    let token = app.agent(name, &["weather"]).await;
    let r = app
        .admin(
            "PUT",
            &format!("/api/v1/agents/{name}/rate-limits"),
            Some(json!({"rate_limits": [{"per_second": 1, "burst": 2}]})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    token
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

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn every_surface_counts_against_the_agents_limit(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    type Probe = fn(&TestApp, String) -> futures::future::BoxFuture<'_, crate::helpers::Reply>;
    let probes: Vec<(&str, Probe)> = vec![
        ("openapi", |app, t| {
            Box::pin(async move { app.get("/openapi.json", Some(&t)).await })
        }),
        ("resources/list", |app, t| {
            Box::pin(async move { app.mcp(Some(&t), "resources/list", json!({})).await })
        }),
        ("resources/read", |app, t| {
            Box::pin(async move {
                app.mcp(
                    Some(&t),
                    "resources/read",
                    json!({"uri": "ui://weather/ui/forecast.html"}),
                )
                .await
            })
        }),
        ("prompts/list", |app, t| {
            Box::pin(async move { app.mcp(Some(&t), "prompts/list", json!({})).await })
        }),
        ("initialize", |app, t| {
            Box::pin(async move {
                app.mcp(
                    Some(&t),
                    "initialize",
                    json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
                )
                .await
            })
        }),
        ("unknown tool", |app, t| {
            Box::pin(async move { app.call(&t, "nothing__here", json!({})).await })
        }),
        ("REST body that does not parse", |app, t| {
            Box::pin(async move {
                app.send(raw(
                    "GET",
                    "/tools/weather/current?city=Paris",
                    &t,
                    "application/json",
                    b"{oops".to_vec(),
                ))
                .await
            })
        }),
    ];
    for (i, (what, probe)) in probes.into_iter().enumerate() {
        let token = limited_agent(&app, &format!("limited{i}")).await;
        let mut refused = 0;
        for _ in 0..4 {
            let r = probe(&app, token.clone()).await;
            if is_rate_limited(&r) {
                refused += 1;
            }
        }
        // Four requests in well under a second against a burst of two: at least one refused.
        assert!(refused >= 1, "{what}: no request was rate limited");
    }
    assert!(audited(&pool, "openapi", "rate_limited", 1).await >= 1);
    assert!(audited(&pool, "initialize", "rate_limited", 1).await >= 1);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_script_echoing_its_input_to_stderr_leaks_no_redacted_value(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    write_group(
        dir.path(),
        "login",
        &single_op(
            "check",
            json!({"type": "object", "properties": {"user": {"type": "string"}, "password": {"type": "string"}, "ssn": {"type": "string"}}}),
            json!({}),
        ),
        &[(
            "check",
            "#!/bin/sh\ncat >&2\necho 'ssn was 123-45-6789' >&2\nexit 3\n",
        )],
    );
    // The group also redacts `ssn`.
    let doc_path = dir.path().join("login/openapi.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&doc_path).unwrap()).unwrap();
    doc["x-toolgate-audit"] = json!({"redact": ["ssn"], "store_results": true});
    std::fs::write(&doc_path, doc.to_string()).unwrap();
    let app = TestApp::with(pool.clone(), dir.path(), None, &[]).await;
    let token = app.agent("leaky", &["login"]).await;

    let r = app
        .call(
            &token,
            "login__check",
            json!({"user": "ann", "password": "hunter2-correct-horse", "ssn": "123-45-6789"}),
        )
        .await;
    // The caller sent the secret and gets its tool's stderr back...
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);

    // ...but no row of the log holds it, in any column.
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT to_jsonb(a)::text FROM audit_events a WHERE tool = 'login__check'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2, "started and result");
    for (row,) in &rows {
        assert!(
            !row.contains("hunter2"),
            "a password reached the log: {row}"
        );
        assert!(
            !row.contains("123-45-6789"),
            "a redacted value reached the log: {row}"
        );
    }
    let result: (Option<String>,) = sqlx::query_as(
        "SELECT error FROM audit_events WHERE tool = 'login__check' AND event_type = 'tool.result'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(result.0.unwrap().contains("[REDACTED]"));

    // The viewer's event page shows the scrubbed text only.
    let page = app
        .admin("GET", "/api/v1/audit?tool=login__check", None)
        .await;
    assert!(!page.text.contains("hunter2"), "{}", page.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn malformed_json_rpc_gets_the_json_rpc_error_it_deserves(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let post = |body: &'static str| {
        Request::post("/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(body))
            .unwrap()
    };
    let not_json = app
        .send(post("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": "))
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.body["error"]["code"], -32700, "{}", not_json.text);

    let batch = app
        .send(post(
            r#"[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]"#,
        ))
        .await;
    assert_eq!(batch.status, StatusCode::BAD_REQUEST);
    assert_eq!(batch.body["error"]["code"], -32600, "{}", batch.text);
    assert!(
        batch.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batch")
    );

    let array_args = app
        .send(post(
            r#"{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search__query", "arguments": [1]}}"#,
        ))
        .await;
    assert_eq!(array_args.body["id"], 7, "{}", array_args.text);
    assert_eq!(
        array_args.body["error"]["code"], -32602,
        "{}",
        array_args.text
    );
    assert!(
        array_args.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`arguments` must be an object"),
        "{}",
        array_args.text
    );

    let no_version = app.send(post(r#"{"id": 1, "method": "tools/list"}"#)).await;
    assert_eq!(
        no_version.body["error"]["code"], -32600,
        "{}",
        no_version.text
    );
}

/// Serves the app on a real socket, as `toolgate serve` does.
async fn serve(app: &TestApp) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = app.router.clone();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Reads one HTTP/1.1 response (headers and a Content-Length body) from `s`.
fn read_response(s: &mut std::net::TcpStream) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some((status, head))
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_refused_request_leaves_its_keep_alive_connection_usable(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let addr = serve(&app).await;
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "pad": "x".repeat(2000)})
            .to_string();
        for i in 0..200 {
            let req = format!(
                "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).unwrap();
            let (status, head) = read_response(&mut s)
                .unwrap_or_else(|| panic!("request {i}: the connection closed without an answer"));
            assert_eq!(status, 401, "{head}");
            assert!(!head.to_lowercase().contains("connection: close"), "{head}");
        }
    })
    .await
    .unwrap();
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn admin_changes_record_where_they_came_from(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let addr = serve(&app).await;
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/api/v1/agents"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("user-agent", "compliance-probe/1")
        .header("x-request-id", "req-4711")
        .json(&json!({"name": "traced"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let row: (Option<String>, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT remote_addr, user_agent, request_id FROM audit_events
         WHERE event_type = 'admin.change' AND resource LIKE '%traced%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.0.as_deref(), Some("127.0.0.1"));
    assert_eq!(row.1.as_deref(), Some("compliance-probe/1"));
    assert_eq!(row.2.as_deref(), Some("req-4711"));
}
