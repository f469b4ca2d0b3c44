//! The REST surface and the per-caller OpenAPI document.

use http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::TestApp;

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn path_query_and_body_parameters_reach_the_script(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let assistant = app.token_for("assistant").await;
    let meteo = app.token_for("meteo").await;

    let by_path = app
        .get("/tools/search/notes/on-call.md", Some(&assistant))
        .await;
    let by_query = app
        .get("/tools/weather/forecast?city=Tokyo&days=2", Some(&meteo))
        .await;
    let by_body = app
        .post_json(
            "/tools/search/query",
            Some(&assistant),
            json!({"q": "rollback", "limit": 2}),
        )
        .await;

    assert_eq!(by_path.status, StatusCode::OK, "{}", by_path.text);
    assert_eq!(by_path.body["name"], "on-call.md");
    assert_eq!(by_query.status, StatusCode::OK, "{}", by_query.text);
    assert_eq!(by_query.body["forecast"].as_array().unwrap().len(), 2);
    assert_eq!(by_body.status, StatusCode::OK, "{}", by_body.text);
    assert!(by_body.body["results"].as_array().unwrap().len() <= 2);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rest_and_mcp_give_the_script_the_same_arguments(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let meteo = app.token_for("meteo").await;

    let rest = app
        .get("/tools/weather/forecast?city=Cairo&days=3", Some(&meteo))
        .await;
    let mcp = app
        .call(
            &meteo,
            "weather__forecast",
            json!({"city": "Cairo", "days": 3}),
        )
        .await;

    assert_eq!(rest.body, mcp.body["result"]["structuredContent"]);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rest_errors_have_the_documented_statuses(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let meteo = app.token_for("meteo").await;

    let invalid = app
        .get("/tools/weather/forecast?city=Cairo&days=nine", Some(&meteo))
        .await;
    let failed = app
        .get("/tools/weather/current?city=Atlantis", Some(&meteo))
        .await;
    let ungranted = app
        .post_json("/tools/search/query", Some(&meteo), json!({"q": "x"}))
        .await;
    let missing = app.get("/tools/weather/nothing", Some(&meteo)).await;
    let anonymous = app.get("/tools/weather/current?city=Paris", None).await;

    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert!(
        invalid.body["violations"][0]
            .as_str()
            .unwrap()
            .contains("days"),
        "{}",
        invalid.text
    );
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(failed.body["exit_code"], 1);
    assert!(failed.body["stderr"].as_str().unwrap().contains("Atlantis"));
    assert_eq!(ungranted.status, StatusCode::NOT_FOUND);
    assert_eq!(ungranted.body, missing.body);
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn openapi_json_describes_only_the_callers_operations(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let meteo = app.token_for("meteo").await;

    let doc = app.get("/openapi.json", Some(&meteo)).await;

    let mut paths: Vec<&str> = doc.body["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    paths.sort();
    assert_eq!(paths, ["/tools/weather/current", "/tools/weather/forecast"]);
    assert_eq!(
        doc.body["paths"]["/tools/weather/current"]["get"]["operationId"],
        "weather__current"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn every_response_carries_a_request_id(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let r = app.get("/healthz", None).await;
    assert!(r.headers.get("x-request-id").is_some());
    let metrics = app.get("/metrics", None).await;
    assert!(
        metrics.text.contains("toolgate_pool_tools 5"),
        "{}",
        metrics.text
    );
}
