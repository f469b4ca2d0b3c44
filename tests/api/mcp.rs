//! The MCP surface, in process.

use http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::TestApp;

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn each_agent_lists_only_its_granted_tools(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let assistant = app.token_for("assistant").await;
    let meteo = app.token_for("meteo").await;

    assert_eq!(
        app.tool_names(&assistant).await,
        ["search__get", "search__query"]
    );
    assert_eq!(
        app.tool_names(&meteo).await,
        ["weather__current", "weather__forecast"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_filtered_list_is_private_and_never_cached(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let r = app
        .send(
            http::Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/list")
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::from(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {}
                    }}})
                    .to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["result"]["cacheScope"], "private");
    assert_eq!(r.body["result"]["ttlMs"], 0);
    assert_eq!(r.body["result"]["tools"].as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_json_object_result_is_structured_content_and_text(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("meteo").await;

    let r = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;

    let result = &r.body["result"];
    assert_eq!(result["isError"], false, "{}", r.text);
    assert_eq!(result["structuredContent"]["city"], "Paris");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(text).unwrap(),
        result["structuredContent"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn unknown_and_ungranted_tools_look_the_same(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;

    let ungranted = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    let unknown = app.call(&token, "nope__nothing", json!({})).await;

    assert_eq!(
        ungranted.body["error"]["code"], -32602,
        "{}",
        ungranted.text
    );
    assert_eq!(unknown.body["error"]["code"], -32602, "{}", unknown.text);
    assert_eq!(
        ungranted.body["error"]["message"],
        "Unknown tool: weather__current"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn schema_violations_are_a_tool_error_listing_each_one(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("meteo").await;

    let r = app
        .call(
            &token,
            "weather__forecast",
            json!({"days": 9, "extra": true}),
        )
        .await;

    let result = &r.body["result"];
    assert_eq!(result["isError"], true, "{}", r.text);
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("city"),
        "missing required property not reported: {text}"
    );
    assert!(
        text.contains("9 is greater than the maximum of 7"),
        "{text}"
    );
    assert!(
        text.contains("extra"),
        "unknown property not reported: {text}"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_failing_script_returns_its_stderr_and_exit_code(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("meteo").await;

    let r = app
        .call(&token, "weather__current", json!({"city": "Atlantis"}))
        .await;

    let result = &r.body["result"];
    assert_eq!(result["isError"], true);
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("exit code 1"), "{text}");
    assert!(text.contains("unknown city 'Atlantis'"), "{text}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn tools_list_pages_with_an_opaque_cursor(pool: PgPool) {
    let tools = crate::helpers::repo_path("tools");
    let app = TestApp::with(
        pool,
        &tools,
        Some(&crate::helpers::repo_path("policies")),
        &["--page-size", "1"],
    )
    .await;
    let token = app
        .agent("everything", &["search", "weather", "text"])
        .await;

    let names = app.tool_names(&token).await;

    assert_eq!(
        names,
        [
            "search__get",
            "search__query",
            "text__wordcount",
            "weather__current",
            "weather__forecast"
        ]
    );
    let bad = app
        .mcp(
            Some(&token),
            "tools/list",
            json!({"cursor": "!!not-a-cursor"}),
        )
        .await;
    assert_eq!(bad.body["error"]["code"], -32602, "{}", bad.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn malformed_json_rpc_is_refused_and_the_gateway_keeps_serving(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;

    let r = app
        .send(
            http::Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::from(
                    "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ",
                ))
                .unwrap(),
        )
        .await;

    assert!(r.status.is_client_error(), "{} {}", r.status, r.text);
    assert_eq!(
        app.tool_names(&token).await,
        ["search__get", "search__query"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn prompts_and_resources_lists_answer_empty(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    for (method, key) in [
        ("prompts/list", "prompts"),
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
    ] {
        let r = app.mcp(Some(&token), method, json!({})).await;
        assert_eq!(r.body["result"][key], json!([]), "{method}: {}", r.text);
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_foreign_origin_is_refused(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let r = app
        .send(
            http::Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .header("origin", "http://evil.example")
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::from(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
}
