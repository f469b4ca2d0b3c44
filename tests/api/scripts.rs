//! Hostile tool folders and misbehaving scripts: each gets a clear error and the gateway
//! keeps serving every other tool.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, single_op, write_group};

fn obj() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": true})
}

/// A pool with one healthy group and the misbehaving ones; `marker` names the hung script's
/// background child.
fn hostile_pool(root: &std::path::Path, marker: &str) {
    write_group(
        root,
        "ok",
        &single_op("echo", obj(), json!({})),
        &[("echo.sh", "#!/bin/sh\ncat\n")],
    );
    write_group(
        root,
        "fails",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho 'disk on fire' >&2\nexit 3\n")],
    );
    write_group(
        root,
        "garbage",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho 'this is not json'\n")],
    );
    write_group(
        root,
        "huge",
        &single_op("run", obj(), json!({})),
        &[(
            "run.sh",
            "#!/bin/sh\nhead -c 104857600 /dev/zero | tr '\\0' 'x'\n",
        )],
    );
    write_group(
        root,
        "hangs",
        &single_op("run", obj(), json!({"x-toolgate-timeout-ms": 700})),
        &[("run.sh", &format!("#!/bin/sh\nsleep {marker} &\nwait\n"))],
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn misbehaving_scripts_get_clear_errors(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let marker = crate::sandbox::unique_sleep();
    hostile_pool(root.path(), &marker);
    let app = TestApp::with(pool, root.path(), None, &[]).await;
    let token = app
        .agent("tester", &["ok", "fails", "garbage", "huge", "hangs"])
        .await;

    let failed = app
        .post_json("/tools/fails/run", Some(&token), json!({}))
        .await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(failed.body["exit_code"], 3);
    assert_eq!(failed.body["stderr"], "disk on fire\n");

    let garbage = app.call(&token, "garbage__run", json!({})).await;
    assert_eq!(garbage.body["result"]["isError"], true);
    assert!(
        garbage.body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("not JSON"),
        "{}",
        garbage.text
    );

    let started = Instant::now();
    let huge = app
        .post_json("/tools/huge/run", Some(&token), json!({}))
        .await;
    assert_eq!(huge.status, StatusCode::BAD_GATEWAY, "{}", huge.text);
    assert!(
        huge.body["error"].as_str().unwrap().contains("exceeded"),
        "{}",
        huge.text
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 100 MB script was not stopped early"
    );

    let hung = app
        .post_json("/tools/hangs/run", Some(&token), json!({}))
        .await;
    assert_eq!(hung.status, StatusCode::GATEWAY_TIMEOUT, "{}", hung.text);
    // The script's background child dies with it.
    crate::sandbox::wait_until_gone(&marker).await;

    let ok = app
        .post_json("/tools/ok/echo", Some(&token), json!({"still": "serving"}))
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.body, json!({"still": "serving"}));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_environment_is_cleared_except_the_allow_list(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let mut doc = single_op("env", obj(), json!({}));
    // cargo and nextest set CARGO_* variables for the test process; only the declared one passes.
    doc["x-toolgate-env"] = json!(["CARGO_PKG_NAME"]);
    write_group(
        root.path(),
        "envs",
        &doc,
        &[(
            "env.sh",
            "#!/bin/sh\nprintf '{\"vars\": \"%s\", \"cwd\": \"%s\"}' \"$(env | cut -d= -f1 | sort | tr '\\n' ' ')\" \"$(pwd)\"\n",
        )],
    );
    assert!(std::env::var("CARGO_PKG_NAME").is_ok() && std::env::var("CARGO_MANIFEST_DIR").is_ok());
    let app = TestApp::with(pool, root.path(), None, &[]).await;
    let token = app.agent("tester", &["envs"]).await;

    let r = app
        .post_json("/tools/envs/env", Some(&token), json!({}))
        .await;

    let vars = r.body["vars"].as_str().unwrap();
    assert!(vars.contains("CARGO_PKG_NAME"), "{vars}");
    assert!(vars.contains("PATH"), "{vars}");
    assert!(!vars.contains("CARGO_MANIFEST_DIR"), "{vars}");
    assert!(!vars.contains("DATABASE_URL"), "{vars}");
    assert!(
        r.body["cwd"].as_str().unwrap().ends_with("/envs"),
        "{}",
        r.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn broken_groups_are_reported_with_file_and_reason(pool: PgPool) {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    write_group(
        root.path(),
        "ok",
        &single_op("echo", obj(), json!({})),
        &[("echo.sh", "#!/bin/sh\ncat\n")],
    );
    std::fs::create_dir_all(root.path().join("badjson")).unwrap();
    std::fs::write(
        root.path().join("badjson/openapi.json"),
        "{\"openapi\": \"3.1.0\", \"paths\": {",
    )
    .unwrap();
    write_group(
        root.path(),
        "noexec",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho {}\n")],
    );
    std::fs::set_permissions(
        root.path().join("noexec/run.sh"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    write_group(
        root.path(),
        "noscript",
        &single_op("run", obj(), json!({})),
        &[],
    );
    write_group(
        root.path(),
        "stray",
        &single_op("run", obj(), json!({})),
        &[
            ("run.sh", "#!/bin/sh\necho {}\n"),
            ("renamed.sh", "#!/bin/sh\n"),
        ],
    );
    let mut dup = single_op("echo", obj(), json!({}));
    dup["x-toolgate-group"] = json!("ok");
    write_group(
        root.path(),
        "zz-duplicate",
        &dup,
        &[("echo.sh", "#!/bin/sh\ncat\n")],
    );
    let app = TestApp::with(pool, root.path(), None, &[]).await;

    let r = app.admin("GET", "/api/v1/pool/errors", None).await;

    let errors = r.body["errors"].as_array().unwrap();
    let reason = |folder: &str| -> String {
        errors
            .iter()
            .find(|e| e["folder"] == folder)
            .map(|e| format!("{} {}", e["file"], e["reason"]))
            .unwrap_or_default()
    };
    assert!(
        reason("badjson").contains("badjson/openapi.json")
            && reason("badjson").contains("invalid JSON"),
        "{}",
        r.text
    );
    assert!(reason("noexec").contains("not executable"), "{}", r.text);
    assert!(reason("noscript").contains("has no script"), "{}", r.text);
    assert!(
        reason("stray").contains("unknown operationId"),
        "{}",
        r.text
    );
    assert!(
        reason("zz-duplicate").contains("duplicate tool name `ok__echo`"),
        "{}",
        r.text
    );
    assert_eq!(errors.len(), 5, "{}", r.text);
    let token = app.agent("tester", &["ok"]).await;
    assert_eq!(app.tool_names(&token).await, ["ok__echo"]);
}

/// A tool's concurrency bound holds across every copy of it: the same folder loaded twice (a
/// reload that shortened the timeout) takes its permits from the one semaphore of the script,
/// so a call beyond the bound waits for the timeout and is refused as busy, while a call of
/// the first copy is still running.
#[tokio::test]
async fn the_concurrency_bound_holds_across_reloads_of_a_tool() {
    use toolgate::pool::loader::{LoaderSettings, load_group};
    use toolgate::pool::sandbox::{Mode, SandboxSettings};
    use toolgate::pool::{Execution, runner};

    let root = tempfile::tempdir().unwrap();
    let (started, release) = (root.path().join("started"), root.path().join("release"));
    for fifo in [&started, &release] {
        nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    }
    let script = format!(
        "#!/bin/sh\necho up > '{}'\ncat '{}'\n",
        started.display(),
        release.display()
    );
    let settings = LoaderSettings {
        max_concurrency_per_tool: 1,
        sandbox: std::sync::Arc::new(SandboxSettings::new(Mode::Off, None, &[])),
        ..LoaderSettings::default()
    };
    let load = |timeout_ms: u64| {
        write_group(
            root.path(),
            "slow",
            &single_op("run", obj(), json!({"x-toolgate-timeout-ms": timeout_ms})),
            &[("run.sh", &script)],
        );
        let tools = load_group(&root.path().join("slow"), "slow", &settings).unwrap();
        match &tools[0].exec {
            Execution::Script(s) => s.clone(),
            Execution::Upstream { .. } => unreachable!(),
        }
    };
    let (first, reloaded) = (load(30_000), load(300));
    let limits = runner::OutputLimits::default();

    let running = tokio::spawn({
        let limits = limits.clone();
        async move { runner::run(&first, &json!({}), &limits, &Default::default()).await }
    });
    // The script says it is up through the first FIFO: from here it holds the permit.
    let up = tokio::task::spawn_blocking(move || std::fs::read_to_string(started).unwrap());
    assert_eq!(up.await.unwrap().trim(), "up");

    let refused = runner::run(&reloaded, &json!({}), &limits, &Default::default()).await;
    assert!(
        matches!(refused, runner::ScriptOutcome::Busy),
        "{refused:?}"
    );

    tokio::task::spawn_blocking(move || std::fs::write(release, "{\"done\": true}").unwrap())
        .await
        .unwrap();
    let done = running.await.unwrap();
    assert!(
        matches!(&done, runner::ScriptOutcome::Success { output, .. } if output["done"] == true),
        "{done:?}"
    );
}
