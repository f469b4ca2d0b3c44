//! `tools/list` answered before the SDK (`mcp::list`): the same bytes as the SDK's answer, in
//! both protocol eras, for every shape of list; and every request it is not sure of left to
//! the SDK.
//!
//! Two gateways over one database, one with the fast path and one without (`--mcp-fast-list
//! off`), are sent the same requests; their answers must be identical byte for byte, and the
//! fast path's counter says which requests it answered.

use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, repo_path};

const MODERN: &str = "2026-07-28";

struct Pair {
    fast: TestApp,
    sdk: TestApp,
}

impl Pair {
    /// Two gateways over `pool` with the repository's tools and these policies.
    async fn new(pool: PgPool, policies: &std::path::Path) -> Self {
        let tools = repo_path("tools");
        let args = ["--page-size", "2"];
        let fast = TestApp::with(pool.clone(), &tools, Some(policies), &args).await;
        let mut off = args.to_vec();
        off.extend(["--mcp-fast-list", "off"]);
        let sdk = TestApp::with(pool, &tools, None, &off).await;
        Self { fast, sdk }
    }

    /// Both gateways read what the other wrote (clients, rules) from Postgres.
    async fn sync(&self) {
        self.fast.state.reload_policy().await.unwrap();
        self.sdk.state.reload_policy().await.unwrap();
    }

    fn answered(&self) -> u64 {
        self.fast.state.metrics.mcp_fast_lists.get()
    }

    /// Sends `build()` to both; asserts identical answers and returns the fast one, with
    /// whether the fast path answered it.
    async fn both(&self, build: impl Fn() -> Request<Body>) -> (Reply, bool) {
        let before = self.answered();
        let fast = self.fast.send(build()).await;
        let took = self.answered() > before;
        let sdk = self.sdk.send(build()).await;
        assert_eq!(self.sdk.state.metrics.mcp_fast_lists.get(), 0);
        assert_eq!(fast.status, sdk.status, "{} / {}", fast.text, sdk.text);
        assert_eq!(fast.text, sdk.text, "the bodies differ");
        assert_eq!(
            fast.headers.get("content-type"),
            sdk.headers.get("content-type")
        );
        (fast, took)
    }
}

/// A `tools/list` request: legacy (no `_meta`) unless `modern`; `headers` added as given.
fn list(token: &str, id: Value, params: Value, headers: &[(&str, &str)]) -> Request<Body> {
    crate::helpers::mcp_request(Some(token), id, "tools/list", params, headers)
}

const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");

fn modern_meta(extra: Value) -> Value {
    let mut params = json!({"_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}
    }});
    if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
        p.extend(e);
    }
    params
}

fn policies() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, front) in [
        ("lister", "tools: [search, weather, text]"),
        (
            "finder",
            "tools: [search, weather]\ndiscovery: search\npinned: [weather__current]",
        ),
    ] {
        let d = dir.path().join("agents").join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("agent.md"), format!("---\n{front}\n---\n")).unwrap();
    }
    dir
}

async fn token(app: &TestApp, agent: &str) -> String {
    let (id, secret) = app.client_for(agent).await;
    app.token_with(&id, &secret).await
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_fast_list_is_the_sdks_answer_byte_for_byte_in_both_eras(pool: PgPool) {
    let dir = policies();
    let pair = Pair::new(pool.clone(), dir.path()).await;
    let lister = token(&pair.fast, "lister").await;
    let finder = token(&pair.fast, "finder").await;
    // A narrowed copy has a definition of its own, which must be the one listed.
    let r = pair
        .fast
        .admin(
            "PUT",
            "/api/v1/agents/lister/arguments/weather__forecast",
            Some(json!({"days": {"maximum": 3}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    pair.sync().await;

    let legacy_versions: [&[(&str, &str)]; 4] = [
        &[ACCEPT],
        &[ACCEPT, ("mcp-protocol-version", "2025-03-26")],
        &[ACCEPT, ("mcp-protocol-version", "2025-06-18")],
        &[ACCEPT, ("mcp-protocol-version", "2025-11-25")],
    ];
    let modern: &[(&str, &str)] = &[
        ACCEPT,
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/list"),
    ];
    let mut pages_seen = 0;
    for t in [&lister, &finder] {
        for ids in [json!(1), json!("a\"tools\":[]"), json!(-7)] {
            for headers in legacy_versions.iter().copied().chain([modern]) {
                let is_modern = headers.len() == 3;
                let params = |cursor: Option<&str>| {
                    let c = cursor.map_or(json!({}), |c| json!({"cursor": c}));
                    if is_modern { modern_meta(c) } else { c }
                };
                // Every page, following the cursor.
                let mut cursor: Option<String> = None;
                loop {
                    let (r, took) = pair
                        .both(|| list(t, ids.clone(), params(cursor.as_deref()), headers))
                        .await;
                    assert!(took, "not answered by the fast path: {headers:?}");
                    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
                    assert_eq!(r.body["id"], ids);
                    assert_eq!(r.body["result"]["resultType"].is_string(), is_modern);
                    pages_seen += 1;
                    match r.body["result"]["nextCursor"].as_str() {
                        Some(c) => cursor = Some(c.to_owned()),
                        None => break,
                    }
                }
            }
        }
    }
    // lister sees 5 tools (3 pages of 2), finder 3 entries (2 pages), in 3 ids × 5 versions.
    assert_eq!(pages_seen, (3 + 2) * 3 * 5);

    // The narrowed schema is what is listed, by both.
    let (r, _) = pair
        .both(|| {
            list(
                &lister,
                json!(1),
                json!({"cursor": cursor_after("text__wordcount")}),
                &[ACCEPT],
            )
        })
        .await;
    let forecast = r.body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "weather__forecast")
        .cloned()
        .unwrap_or_else(|| panic!("{}", r.text));
    assert_eq!(forecast["inputSchema"]["properties"]["days"]["maximum"], 3);

    // A bad cursor is the same in-band error.
    let (r, took) = pair
        .both(|| list(&lister, json!(2), json!({"cursor": "%%%"}), &[ACCEPT]))
        .await;
    assert!(took);
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);

    // Every list was audited, by both, with what it showed: the same rows from each.
    pair.fast.state.audit.flush().await.unwrap();
    pair.sdk.state.audit.flush().await.unwrap();
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT coalesce(agent, '') FROM audit_events WHERE event_type = 'tools/list' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // (The bad cursor showed nothing, so it left no row.)
    assert_eq!(rows.len(), 2 * (pages_seen + 1), "{rows:?}");
}

/// What is odd about a request, its params and its headers.
type Case = (&'static str, Value, Vec<(&'static str, &'static str)>);

fn cursor_after(name: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn requests_the_fast_path_is_not_sure_of_go_to_the_sdk(pool: PgPool) {
    let dir = policies();
    let pair = Pair::new(pool, dir.path()).await;
    let t = token(&pair.fast, "lister").await;
    pair.sync().await;
    let meta = modern_meta(json!({}));
    let missing_caps = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}});
    let old_meta = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-06-18"}});
    let cases: Vec<Case> = vec![
        (
            "an Origin",
            json!({}),
            vec![ACCEPT, ("origin", "http://127.0.0.1:8787")],
        ),
        (
            "a foreign Origin",
            json!({}),
            vec![ACCEPT, ("origin", "https://evil.example")],
        ),
        (
            "a foreign Host",
            json!({}),
            vec![ACCEPT, ("host", "evil.example")],
        ),
        (
            "no event stream in Accept",
            json!({}),
            vec![("accept", "application/json")],
        ),
        (
            "a quality value",
            json!({}),
            vec![("accept", "application/json, text/event-stream;q=0")],
        ),
        (
            "an unknown revision",
            json!({}),
            vec![ACCEPT, ("mcp-protocol-version", "2099-01-01")],
        ),
        (
            "a modern header without _meta",
            json!({}),
            vec![
                ACCEPT,
                ("mcp-protocol-version", MODERN),
                ("mcp-method", "tools/list"),
            ],
        ),
        (
            "_meta without a header",
            meta.clone(),
            vec![ACCEPT, ("mcp-method", "tools/list")],
        ),
        (
            "_meta naming another revision",
            meta.clone(),
            vec![
                ACCEPT,
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-method", "tools/list"),
            ],
        ),
        (
            "no Mcp-Method",
            meta.clone(),
            vec![ACCEPT, ("mcp-protocol-version", MODERN)],
        ),
        (
            "a wrong Mcp-Method",
            meta.clone(),
            vec![
                ACCEPT,
                ("mcp-protocol-version", MODERN),
                ("mcp-method", "tools/call"),
            ],
        ),
        (
            "an Mcp-Name",
            meta.clone(),
            vec![
                ACCEPT,
                ("mcp-protocol-version", MODERN),
                ("mcp-method", "tools/list"),
                ("mcp-name", "eA"),
            ],
        ),
        (
            "_meta missing a key",
            missing_caps,
            vec![
                ACCEPT,
                ("mcp-protocol-version", MODERN),
                ("mcp-method", "tools/list"),
            ],
        ),
        (
            "an older revision in _meta",
            old_meta,
            vec![ACCEPT, ("mcp-protocol-version", "2025-06-18")],
        ),
    ];
    for (what, params, headers) in cases {
        let (r, took) = pair
            .both(|| list(&t, json!(1), params.clone(), &headers))
            .await;
        assert!(
            !took,
            "the fast path answered a request with {what}: {}",
            r.text
        );
    }
    // Not a list at all.
    let (_, took) = pair
        .both(|| {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
            Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", ACCEPT.1)
                .header("authorization", format!("Bearer {t}"))
                .body(Body::from(body.to_string()))
                .unwrap()
        })
        .await;
    assert!(!took);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stranger_gets_no_list_from_the_fast_path(pool: PgPool) {
    let dir = policies();
    let pair = Pair::new(pool, dir.path()).await;
    for auth in [None, Some("Bearer not-a-token")] {
        let (r, took) = pair
            .both(|| {
                let mut req = Request::post("/mcp")
                    .header("content-type", "application/json")
                    .header("accept", ACCEPT.1);
                if let Some(a) = auth {
                    req = req.header("authorization", a);
                }
                let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
                req.body(Body::from(body.to_string())).unwrap()
            })
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
        assert!(!took);
    }
}
