//! Hot reload: folder changes apply without a restart; a broken edit keeps the last good
//! version serving and is reported.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{TestApp, single_op, write_group};

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"x": {"type": "integer"}}})
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_broken_edit_keeps_the_last_good_version_until_fixed(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    write_group(
        root.path(),
        "calc",
        &single_op("double", schema(), json!({})),
        &[("double.sh", "#!/bin/sh\necho '{\"v\": 2}'\n")],
    );
    let app = TestApp::with(pool.clone(), root.path(), None, &[]).await;
    let token = app.agent("tester", &["calc"]).await;
    assert_eq!(app.tool_names(&token).await, ["calc__double"]);

    // Break the group: the tool keeps serving from the last good load, and the error shows.
    std::fs::write(root.path().join("calc/openapi.json"), "{ not json").unwrap();
    app.state.reload_pool();
    assert_eq!(app.tool_names(&token).await, ["calc__double"]);
    let errors = app.admin("GET", "/api/v1/pool/errors", None).await;
    assert_eq!(
        errors.body["errors"][0]["folder"], "calc",
        "{}",
        errors.text
    );

    // Fix it with a second operation: both serve, the error is gone.
    let mut doc = single_op("double", schema(), json!({}));
    doc["paths"]["/triple"] =
        json!({"post": {"operationId": "triple", "responses": {"200": {"description": "ok"}}}});
    write_group(
        root.path(),
        "calc",
        &doc,
        &[("triple.sh", "#!/bin/sh\necho '{\"v\": 3}'\n")],
    );
    app.state.reload_pool();
    assert_eq!(
        app.tool_names(&token).await,
        ["calc__double", "calc__triple"]
    );
    let errors = app.admin("GET", "/api/v1/pool/errors", None).await;
    assert_eq!(errors.body["errors"], json!([]));

    // The catalog table follows (written in the background).
    let mut names: Vec<String> = Vec::new();
    for _ in 0..200 {
        names = sqlx::query_scalar("SELECT name FROM tools ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
        if names.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(names, ["calc__double", "calc__triple"]);

    // Removing the folder removes its tools, and the grant turns zero-match.
    std::fs::remove_dir_all(root.path().join("calc")).unwrap();
    app.state.reload_pool();
    assert!(app.tool_names(&token).await.is_empty());
    let agent = app.admin("GET", "/api/v1/agents/tester", None).await;
    assert_eq!(
        agent.body["agent"]["grants"][0]["matched_tools"], 0,
        "{}",
        agent.text
    );
    assert_eq!(agent.body["agent"]["sees_nothing"], true);
}

#[tokio::test]
async fn the_watcher_reloads_after_a_change_settles() {
    let root = tempfile::tempdir().unwrap();
    let reloads = Arc::new(AtomicUsize::new(0));
    let counter = reloads.clone();
    let _watcher = toolgate::pool::watcher::spawn(
        root.path().to_path_buf(),
        Duration::from_millis(500),
        move || {
            counter.fetch_add(1, Ordering::SeqCst);
        },
    )
    .unwrap();

    write_group(
        root.path(),
        "calc",
        &single_op("double", schema(), json!({})),
        &[("double.sh", "#!/bin/sh\necho {}\n")],
    );

    for _ in 0..200 {
        if reloads.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several file writes in one burst make one reload, not one per write.
    assert_eq!(reloads.load(Ordering::SeqCst), 1);
}

/// A folder touched without pause (by a tool author, to keep a swapped script from ever being
/// loaded and recorded) still gets reloaded: the quiet period is not waited for forever.
#[tokio::test]
async fn a_folder_touched_without_pause_is_still_reloaded() {
    let root = tempfile::tempdir().unwrap();
    let reloads = Arc::new(AtomicUsize::new(0));
    let counter = reloads.clone();
    let debounce = Duration::from_millis(100);
    let _watcher = toolgate::pool::watcher::spawn(root.path().to_path_buf(), debounce, move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let started = std::time::Instant::now();
    let mut first = None;
    // A write every 20 ms, for 3 s: never a quiet period of 100 ms.
    while started.elapsed() < Duration::from_secs(3) {
        std::fs::write(
            root.path().join("noise"),
            format!("{:?}", started.elapsed()),
        )
        .unwrap();
        if first.is_none() && reloads.load(Ordering::SeqCst) > 0 {
            first = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = first.expect("no reload while the folder kept changing");
    assert!(
        first < Duration::from_secs(2),
        "first reload after {first:?}"
    );
    assert!(
        reloads.load(Ordering::SeqCst) >= 2,
        "one reload per burst window"
    );
}
