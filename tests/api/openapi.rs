//! The admin API's OpenAPI document: served without a token, and in step with the router.

use std::collections::BTreeSet;

use http::StatusCode;
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};

/// `(METHOD, /api/v1/path)` of every route the API modules register, read from their source:
/// the document is generated from annotations, so this is what could drift from it.
fn routes_in_source() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for module in [
        "agents",
        "audit",
        "clients",
        "credentials",
        "tools",
        "users",
    ] {
        let src = std::fs::read_to_string(repo_path(&format!("src/api/{module}.rs"))).unwrap();
        let flat: String = src.split_whitespace().collect::<Vec<_>>().join(" ");
        for call in flat.split(".route(").skip(1) {
            let path = call.split('"').nth(1).unwrap();
            // This `.route(...)`'s own arguments: up to its closing parenthesis.
            let mut depth = 1;
            let end = call
                .char_indices()
                .find(|(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(call.len(), |(i, _)| i);
            let handlers = &call[..end];
            for method in ["get", "post", "put", "delete", "patch"] {
                if handlers.contains(&format!(" {method}("))
                    || handlers.contains(&format!(".{method}("))
                {
                    out.insert((method.to_uppercase(), format!("/api/v1{path}")));
                }
            }
        }
    }
    out
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_openapi_document_lists_every_route_and_each_is_served(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let r = app.get("/api/v1/openapi.json", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let doc = &r.body;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
    assert_eq!(
        doc["components"]["securitySchemes"]["admin_token"]["scheme"],
        "bearer"
    );

    let mut documented = BTreeSet::new();
    let mut operation_ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            documented.insert((method.to_uppercase(), path.clone()));
            // Generated from handler names: two modules' handlers of one name would clash.
            let id = op["operationId"].as_str().unwrap_or_default().to_owned();
            assert!(
                operation_ids.insert(id.clone()),
                "operationId `{id}` is not unique"
            );
            assert!(op["summary"].is_string(), "{method} {path} has no summary");
            assert!(op["responses"]["401"].is_object(), "{method} {path}");
        }
    }
    let routed = routes_in_source();
    assert!(routed.len() > 40, "reading the routes failed: {routed:?}");
    assert_eq!(documented, routed, "document and router differ");

    // Each documented operation reaches a handler: never axum's bare 404 or 405.
    for (method, path) in &documented {
        let uri = path
            .replace("{id}", "1")
            .replace('{', "no-such-")
            .replace('}', "");
        let req = http::Request::builder()
            .method(method.as_str())
            .uri(&uri)
            .header(
                "authorization",
                format!("Bearer {}", crate::helpers::ADMIN_TOKEN),
            )
            .header("content-type", "application/json")
            .body(axum::body::Body::from("{}"))
            .unwrap();
        let r = app.send(req).await;
        assert_ne!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert!(
            r.status != StatusCode::NOT_FOUND || r.body["error"].is_string(),
            "{method} {uri}: unrouted 404"
        );
    }
}
