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
async fn the_environment_is_cleared_except_the_fixed_and_declared_variables(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let mut doc = single_op("env", obj(), json!({}));
    // cargo and nextest set CARGO_* variables for the test process: declared or not, none is
    // the script's (a declared variable's value comes from TOOLGATE_SCRIPT_ENV_<NAME>).
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
    assert!(vars.contains("PATH"), "{vars}");
    assert!(!vars.contains("CARGO_PKG_NAME"), "{vars}");
    assert!(!vars.contains("CARGO_MANIFEST_DIR"), "{vars}");
    assert!(!vars.contains("DATABASE_URL"), "{vars}");
    assert!(
        r.body["cwd"].as_str().unwrap().ends_with("/envs"),
        "{}",
        r.text
    );
}

/// A script that prints every variable it got, as one JSON object.
const PRINT_ENV: &str =
    "#!/usr/bin/env python3\nimport json, os\nprint(json.dumps(dict(os.environ)))\n";

/// Issue 28, finding 1: a group listing the gateway's own variables in `x-toolgate-env` got
/// their values (the admin token, the database URL, the OIDC client secret). Performed against
/// a real `toolgate serve` holding them where an operator puts them, in its environment.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_group_naming_the_gateways_variables_gets_none_of_them(pool: PgPool) {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let db_url = format!("postgres://root@127.0.0.1:5432/{db}");
    let root = tempfile::tempdir().unwrap();
    for (group, names) in [
        // The gateway's own configuration, by name: refused at load.
        (
            "grab",
            json!(["TOOLGATE_ADMIN_TOKEN", "TOOLGATE_OIDC_CLIENT_SECRET"]),
        ),
        // Names the gateway's environment has too: the script gets only what the operator
        // declared for scripts, under TOOLGATE_SCRIPT_ENV_<NAME>.
        ("leak", json!(["DATABASE_URL", "PGPASSWORD", "API_KEY"])),
    ] {
        let mut doc = single_op("env", obj(), json!({}));
        doc["x-toolgate-env"] = names;
        write_group(root.path(), group, &doc, &[("env.py", PRINT_ENV)]);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let base = format!("http://127.0.0.1:{port}");
    let admin_token = "env-admin-secret-5f1c";
    let _server = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--tools-dir")
        .arg(root.path())
        .args(["--policies-dir", "/nonexistent"])
        .env("DATABASE_URL", &db_url)
        .env("TOOLGATE_ADMIN_TOKEN", admin_token)
        .env("TOOLGATE_OIDC_CLIENT_SECRET", "oidc-secret-77ab")
        .env("PGPASSWORD", "pg-password-3e9d")
        .env("API_KEY", "the-gateways-own-api-key")
        .env("TOOLGATE_SCRIPT_ENV_API_KEY", "the-scripts-api-key")
        .env("TOOLGATE_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "toolgate serve never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth(admin_token);
    let r = admin(http.post(format!("{base}/api/v1/agents")))
        .json(&json!({"name": "author"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    for g in ["grab", "leak"] {
        admin(http.post(format!("{base}/api/v1/agents/author/grants")))
            .json(&json!({"target": g}))
            .send()
            .await
            .unwrap();
    }
    let client: Value = admin(http.post(format!("{base}/api/v1/agents/author/clients")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token: Value = http
        .post(format!("{base}/oauth/token"))
        .basic_auth(
            client["client_id"].as_str().unwrap(),
            client["client_secret"].as_str(),
        )
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["access_token"].as_str().unwrap();
    let call = |group: &str| {
        http.post(format!("{base}/tools/{group}/env"))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
    };
    let secrets = [
        admin_token,
        "oidc-secret-77ab",
        "pg-password-3e9d",
        "the-gateways-own-api-key",
        db_url.as_str(),
    ];

    let grab = call("grab").await.unwrap();
    let (status, text) = (grab.status(), grab.text().await.unwrap());
    for s in secrets {
        assert!(!text.contains(s), "the script got {s}: {text}");
    }
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let errors: Value = admin(http.get(format!("{base}/api/v1/pool/errors")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reason = errors["errors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["folder"] == "grab")
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("grab loaded: {errors}"));
    assert!(
        reason.contains("`TOOLGATE_ADMIN_TOKEN` is the gateway's own configuration"),
        "{reason}"
    );

    let leak = call("leak").await.unwrap();
    let (status, text) = (leak.status(), leak.text().await.unwrap());
    for s in secrets {
        assert!(!text.contains(s), "the script got {s}: {text}");
    }
    assert_eq!(status, StatusCode::OK, "{text}");
    let vars: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(vars["API_KEY"], "the-scripts-api-key", "{vars}");
    assert!(vars.get("DATABASE_URL").is_none(), "{vars}");
    assert!(vars.get("PGPASSWORD").is_none(), "{vars}");
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
        async move {
            runner::run(
                &first,
                &json!({}),
                &limits,
                &Default::default(),
                &[],
                toolgate::audit::Durable::now(),
            )
            .await
        }
    });
    // The script says it is up through the first FIFO: from here it holds the permit.
    let up = tokio::task::spawn_blocking(move || std::fs::read_to_string(started).unwrap());
    assert_eq!(up.await.unwrap().trim(), "up");

    let refused = runner::run(
        &reloaded,
        &json!({}),
        &limits,
        &Default::default(),
        &[],
        toolgate::audit::Durable::now(),
    )
    .await;
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
