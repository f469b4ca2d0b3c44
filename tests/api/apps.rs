//! MCP Apps through the gateway: a script tool's UI, under the tool's grants.

use serde_json::json;
use sqlx::PgPool;

use crate::helpers::TestApp;

const URI: &str = "ui://weather/ui/forecast.html";

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_granted_agent_reads_the_ui_of_its_tool_and_no_one_else_does(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let meteo = app.token_for("meteo").await;
    let assistant = app.token_for("assistant").await;

    let list = app.mcp(Some(&meteo), "tools/list", json!({})).await;
    let current = list.body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "weather__current")
        .unwrap()
        .clone();
    assert_eq!(current["_meta"]["ui"]["resourceUri"], URI, "{current}");

    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}});
    let with_ui = app.mcp(Some(&meteo), "initialize", init.clone()).await;
    let without_ui = app.mcp(Some(&assistant), "initialize", init).await;
    assert_eq!(
        with_ui.body["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/ui"]["mimeTypes"],
        json!(["text/html;profile=mcp-app"]),
        "{}",
        with_ui.text
    );
    assert!(
        without_ui.body["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/ui"]
            .is_null(),
        "{}",
        without_ui.text
    );

    let resources = app.mcp(Some(&meteo), "resources/list", json!({})).await;
    assert_eq!(
        resources.body["result"]["resources"][0]["uri"], URI,
        "{}",
        resources.text
    );
    let read = app
        .mcp(Some(&meteo), "resources/read", json!({"uri": URI}))
        .await;
    let contents = &read.body["result"]["contents"][0];
    assert_eq!(
        contents["mimeType"], "text/html;profile=mcp-app",
        "{}",
        read.text
    );
    assert!(
        contents["text"].as_str().unwrap().contains("<html"),
        "{}",
        read.text
    );

    let denied = app
        .mcp(Some(&assistant), "resources/read", json!({"uri": URI}))
        .await;
    assert!(denied.body["error"]["code"].is_i64(), "{}", denied.text);
    let empty = app.mcp(Some(&assistant), "resources/list", json!({})).await;
    assert_eq!(empty.body["result"]["resources"], json!([]));
    let traversal = app
        .mcp(
            Some(&meteo),
            "resources/read",
            json!({"uri": "ui://weather/../../etc/passwd"}),
        )
        .await;
    assert!(
        traversal.body["error"]["code"].is_i64(),
        "{}",
        traversal.text
    );
}
