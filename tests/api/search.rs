//! Tool search (deferred loading) over MCP, in process: discovery modes, `search_tools`,
//! `call_tool`, pinned tools, the `auto` budget and the API's token accounting.

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};

/// Creates an agent with a discovery mode and grants through the admin API; returns a token.
async fn agent_with(app: &TestApp, name: &str, discovery: &str, grants: &[&str]) -> String {
    app.agent_in_mode(name, Some(discovery), grants).await
}

/// The names `search_tools` returned, checking that text and structured content agree.
fn found(r: &crate::helpers::Reply) -> Vec<String> {
    let result = &r.body["result"];
    assert_eq!(result["isError"], false, "{}", r.text);
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        result["structuredContent"]
    );
    result["structuredContent"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn audit_count(app: &TestApp, agent: &str, event_type: &str, tool: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE agent = $1 AND event_type = $2 \
         AND ($3::text IS NULL OR tool = $3)",
    )
    .bind(agent)
    .bind(event_type)
    .bind(tool)
    .fetch_one(&app.state.db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_agent_in_search_mode_finds_a_tool_and_calls_it_both_ways(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = agent_with(&app, "finder", "search", &["search", "weather", "text"]).await;
    let full = agent_with(&app, "lister", "full", &["search", "weather", "text"]).await;

    assert_eq!(app.tool_names(&token).await, ["call_tool", "search_tools"]);

    let r = app
        .call(
            &token,
            "search_tools",
            json!({"query": "what is the weather like in Paris right now", "limit": 3}),
        )
        .await;
    let names = found(&r);
    assert_eq!(names[0], "weather__current", "{names:?}");
    assert!(names.len() <= 3);
    // Each definition says what tools/list says about calling the tool: the same name,
    // description, parameters with their types, descriptions and enums, and required ones.
    let listed = app.mcp(Some(&full), "tools/list", json!({})).await;
    let listed = listed.body["result"]["tools"].as_array().unwrap().clone();
    for def in r.body["result"]["structuredContent"]["tools"]
        .as_array()
        .unwrap()
    {
        let full_def = listed
            .iter()
            .find(|l| l["name"] == def["name"])
            .unwrap_or_else(|| panic!("{def} is not in tools/list"));
        assert_eq!(def["description"], full_def["description"]);
        let (schema, full_schema) = (&def["inputSchema"], &full_def["inputSchema"]);
        assert_eq!(schema["required"], full_schema["required"], "{def}");
        let props = full_schema["properties"].as_object().unwrap();
        assert_eq!(schema["properties"].as_object().unwrap().len(), props.len());
        for (name, p) in props {
            for key in ["type", "description", "enum", "default"] {
                assert_eq!(schema["properties"][name][key], p[key], "{name}.{key}");
            }
        }
    }

    // Found tools are callable directly by name (not listed, but visible) ...
    let direct = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(direct.body["result"]["isError"], false, "{}", direct.text);
    assert_eq!(direct.body["result"]["structuredContent"]["city"], "Paris");
    // ... and through call_tool, with the same result.
    let via = app
        .call(
            &token,
            "call_tool",
            json!({"name": "weather__current", "arguments": {"city": "Paris"}}),
        )
        .await;
    assert_eq!(via.body["result"], direct.body["result"], "{}", via.text);

    // Both went through the shared call path: two started/result pairs in the audit log.
    assert_eq!(
        audit_count(&app, "finder", "tool.result", Some("weather__current")).await,
        2
    );
    assert_eq!(audit_count(&app, "finder", "tools/search", None).await, 1);
    // call_tool validates like a direct call.
    let bad = app
        .call(
            &token,
            "call_tool",
            json!({"name": "weather__forecast", "arguments": {"days": 9}}),
        )
        .await;
    assert_eq!(bad.body["result"]["isError"], true, "{}", bad.text);
    assert!(
        bad.body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("city")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn search_and_call_tool_reach_only_granted_tools(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = agent_with(&app, "narrow", "search", &["search"]).await;

    let r = app
        .call(
            &token,
            "search_tools",
            json!({"query": "weather forecast temperature city", "limit": 20}),
        )
        .await;
    let names = found(&r);
    assert!(names.iter().all(|n| n.starts_with("search__")), "{names:?}");

    let via = app
        .call(
            &token,
            "call_tool",
            json!({"name": "weather__current", "arguments": {"city": "Paris"}}),
        )
        .await;
    assert_eq!(via.body["result"]["isError"], true, "{}", via.text);
    assert!(
        via.body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Unknown tool: weather__current"),
        "{}",
        via.text
    );
    let direct = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(direct.body["error"]["code"], -32602, "{}", direct.text);
    assert_eq!(
        audit_count(&app, "narrow", "tool.call", Some("weather__current")).await,
        2,
        "both refusals are audited"
    );

    // A removed grant is gone from search on the very next request.
    let r = app
        .admin("DELETE", "/api/v1/agents/narrow/grants/search", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let r = app
        .call(&token, "search_tools", json!({"query": "notes search"}))
        .await;
    assert_eq!(found(&r), Vec::<String>::new());
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_full_mode_agent_has_no_meta_tools(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    assert_eq!(
        app.tool_names(&token).await,
        ["search__get", "search__query"]
    );
    let r = app
        .call(&token, "search_tools", json!({"query": "notes"}))
        .await;
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn pinned_tools_are_listed_when_visible_and_pages_follow_the_cursor(pool: PgPool) {
    let policies = tempfile::tempdir().unwrap();
    let dir = policies.path().join("agents/pinner");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("agent.md"),
        "---\ntools: [search, weather]\ndiscovery: search\npinned: [weather__current]\n---\n",
    )
    .unwrap();
    let app = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(policies.path()),
        &["--page-size", "1"],
    )
    .await;
    let (id, secret) = app.client_for("pinner").await;
    let token = app.token_with(&id, &secret).await;

    assert_eq!(
        app.tool_names(&token).await,
        ["call_tool", "search_tools", "weather__current"]
    );

    // A token scoped to `search` does not see the pinned weather tool, so it is not listed.
    let r = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("scope", "tools:search"),
            ],
            Some((&id, &secret)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let scoped = r.body["access_token"].as_str().unwrap();
    assert_eq!(app.tool_names(scoped).await, ["call_tool", "search_tools"]);
    let r = app
        .call(scoped, "search_tools", json!({"query": "current weather"}))
        .await;
    assert!(
        found(&r).iter().all(|n| n.starts_with("search__")),
        "{}",
        r.text
    );
}

/// `tokens.visible_tokens` of an agent, as the admin API reports it.
async fn visible_tokens(app: &TestApp, agent: &str) -> u64 {
    let r = app
        .admin("GET", &format!("/api/v1/agents/{agent}"), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.body["tokens"]["visible_tokens"].as_u64().unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn auto_lists_in_full_up_to_the_budget_then_the_index_then_searches(pool: PgPool) {
    let tools = repo_path("tools");
    let app = TestApp::with(pool.clone(), &tools, None, &[]).await;
    agent_with(&app, "auto", "auto", &["weather"]).await;
    let budget = visible_tokens(&app, "auto").await;
    let weather = ["weather__current", "weather__forecast"];

    // Exactly at the budget: still in full.
    let at = TestApp::with(
        pool.clone(),
        &tools,
        None,
        &["--search-token-budget", &budget.to_string()],
    )
    .await;
    let token = at.token_for("auto").await;
    assert_eq!(at.tool_names(&token).await, weather);
    let r = at.admin("GET", "/api/v1/agents/auto", None).await;
    assert_eq!(
        r.body["tokens"]["effective_discovery"], "full",
        "{}",
        r.text
    );
    assert_eq!(r.body["tokens"]["discovery"], "auto");
    assert_eq!(r.body["tokens"]["token_budget"], budget);

    // One token under it, with no room for the index: search.
    let under = TestApp::with(
        pool.clone(),
        &tools,
        None,
        &[
            "--search-token-budget",
            &(budget - 1).to_string(),
            "--index-token-budget",
            "0",
        ],
    )
    .await;
    let token = under.token_for("auto").await;
    assert_eq!(
        under.tool_names(&token).await,
        ["call_tool", "search_tools"]
    );
    let r = under.admin("GET", "/api/v1/agents/auto", None).await;
    assert_eq!(r.body["tokens"]["effective_discovery"], "search");
    assert_eq!(
        r.body["tokens"]["listed_tokens"],
        r.body["tokens"]["search_tokens"]
    );
    let reason = r.body["tokens"]["reason"].as_str().unwrap();
    assert!(reason.contains("index budget (0)"), "{reason}");
    let index_tokens = r.body["tokens"]["index_tokens"].as_u64().unwrap();

    // With the index's budget exactly its size: the index.
    let indexed = TestApp::with(
        pool.clone(),
        &tools,
        None,
        &[
            "--search-token-budget",
            &(budget - 1).to_string(),
            "--index-token-budget",
            &index_tokens.to_string(),
        ],
    )
    .await;
    let itoken = indexed.token_for("auto").await;
    assert_eq!(
        indexed.tool_names(&itoken).await,
        ["call_tool", "load_tools", "search_tools"]
    );
    let r = indexed.admin("GET", "/api/v1/agents/auto", None).await;
    assert_eq!(
        r.body["tokens"]["effective_discovery"], "index",
        "{}",
        r.text
    );
    assert_eq!(r.body["tokens"]["listed_tokens"], index_tokens);
    let reason = r.body["tokens"]["reason"].as_str().unwrap();
    assert!(reason.contains("fits the index budget"), "{reason}");
    // Real tools stay callable by name.
    let r = under
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(r.body["result"]["isError"], false, "{}", r.text);

    // At the budget, a new grant pushes the agent over it: the next list is the index (which
    // fits the default index budget).
    let r = at
        .admin(
            "POST",
            "/api/v1/agents/auto/grants",
            Some(json!({"target": "text"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let token = at.token_for("auto").await;
    assert_eq!(
        at.tool_names(&token).await,
        ["call_tool", "load_tools", "search_tools"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_api_reports_tokens_against_the_pool_and_the_effective_mode(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let r = app.admin("GET", "/api/v1/agents/assistant", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let t = &r.body["tokens"];
    assert_eq!(t["visible_tools"], 2);
    assert_eq!(t["pool_tools"], 5);
    let visible = t["visible_tokens"].as_u64().unwrap();
    let pool_tokens = t["pool_tokens"].as_u64().unwrap();
    assert!(0 < visible && visible < pool_tokens, "{t}");
    assert_eq!(t["discovery"], "full");
    assert_eq!(t["effective_discovery"], "full");
    assert_eq!(t["listed_tokens"], visible);
    assert_eq!(t["token_budget"], 5000);
    assert_eq!(t["index_token_budget"], 8000);
    assert!(t["search_tokens"].as_u64().unwrap() > 0);
    assert!(t["index_tokens"].as_u64().unwrap() > t["search_tokens"].as_u64().unwrap());
    assert_eq!(t["reason"], "configured `full`");
}

/// `--search-embeddings` is read at start, as hostile input: a missing file, a file of another
/// format and a truncated table each stop the start with a message naming the problem (and
/// nothing is installed, so the rest of this process still ranks with words alone).
#[test]
fn a_bad_embedding_table_stops_the_start_with_a_clear_error() {
    use clap::Parser;
    use toolgate::config::{Cli, Command};
    use toolgate::state::Settings;

    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("model.gguf");
    std::fs::write(&other, b"GGUF\x03\0\0\0 not a table").unwrap();
    let truncated = dir.path().join("cut.bin");
    let mut head = b"TGE1".to_vec();
    head.extend(30_000u32.to_le_bytes());
    head.extend(128u32.to_le_bytes());
    head.extend([5, b'a']);
    std::fs::write(&truncated, head).unwrap();
    let missing = dir.path().join("absent.bin");
    for (file, says) in [
        (&missing, "cannot read embedding table"),
        (&other, "bad magic"),
        (&truncated, "truncated"),
    ] {
        let args = [
            "toolgate",
            "serve",
            "--search-embeddings",
            file.to_str().unwrap(),
        ];
        let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
            unreachable!()
        };
        let err = Settings::from_args(&serve).unwrap_err().to_string();
        assert!(err.contains(says), "{}: {err}", file.display());
    }
    assert!(toolgate::search::embed::installed().is_none());
}
