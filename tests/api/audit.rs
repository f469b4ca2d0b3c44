//! The audit log: complete, durable before answers, tamper-evident, fail-closed.

use std::time::Duration;

use futures::{FutureExt, StreamExt};
use http::StatusCode;
use serde_json::{Value, json};
use sqlx::{PgPool, Row};

use crate::helpers::{TestApp, repo_path, single_op, write_group};
use toolgate::audit::chain::Verifier;
use toolgate::db::audit::AuditFilter;

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn concurrent_calls_leave_exactly_their_records(pool: PgPool) {
    // A shell tool that answers at once, with a generous timeout: the test is about the log,
    // not about how fast 20 interpreters start on a loaded 2-core machine.
    let root = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let op = single_op("echo", schema, json!({"x-toolgate-timeout-ms": 120000}));
    write_group(root.path(), "bulk", &op, &[("echo.sh", "#!/bin/sh\ncat\n")]);
    let app = TestApp::with(pool.clone(), root.path(), None, &[]).await;
    let token = app.agent("bulk", &["bulk"]).await;
    let n = 20;

    let calls = (0..n).map(|i| {
        app.post_owned(
            "/tools/bulk/echo".to_owned(),
            token.clone(),
            json!({"n": i}),
        )
    });
    let replies = futures::future::join_all(calls).await;

    assert!(replies.iter().all(|s| *s == StatusCode::OK), "{replies:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started'").await, n as i64);
    assert_eq!(count(&pool, "SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND outcome = 'success'").await, n as i64);
    let incomplete = count(
        &pool,
        "SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND (agent IS NULL OR client_id IS NULL OR jti IS NULL
           OR tool IS NULL OR request_id IS NULL OR latency_us IS NULL OR bytes_in IS NULL OR bytes_out IS NULL
           OR result_sha256 IS NULL OR call_id IS NULL OR instance IS NULL)",
    )
    .await;
    assert_eq!(incomplete, 0, "call records with missing fields");
    let unpaired = count(
        &pool,
        "SELECT count(*) FROM audit_events s WHERE s.outcome = 'started'
           AND NOT EXISTS (SELECT 1 FROM audit_events r WHERE r.event_type = 'tool.result' AND r.call_id = s.call_id)",
    )
    .await;
    assert_eq!(unpaired, 0);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn denials_and_token_events_are_recorded(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let token = app.token_with(&id, &secret).await;

    app.call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    app.get("/openapi.json", Some("not-a-token")).await;
    app.token_request(
        &[("grant_type", "client_credentials")],
        Some((&id, "wrong")),
    )
    .await;
    app.token_request(
        &[
            ("grant_type", "client_credentials"),
            ("scope", "tools:weather"),
        ],
        Some((&id, &secret)),
    )
    .await;
    app.tool_names(&token).await;

    // The refused-token event is written without making the 401 wait for it.
    for _ in 0..50 {
        if count(
            &pool,
            "SELECT count(*) FROM audit_events WHERE event_type IN ('auth.rejected', 'tools/list')",
        )
        .await
            >= 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kinds: Vec<(String, String)> =
        sqlx::query_as("SELECT event_type, outcome FROM audit_events ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    for expected in [
        ("token.issued", "success"),
        ("tool.call", "denied"),
        ("auth.rejected", "denied"),
        ("client_auth.failed", "denied"),
        ("token.issued", "denied"),
        ("tools/list", "success"),
        ("admin.change", "success"),
    ] {
        assert!(
            kinds.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} missing from {kinds:?}"
        );
    }
    let shown: String =
        sqlx::query_scalar("SELECT details FROM audit_events WHERE event_type = 'tools/list'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["shown"],
        json!(["search__get", "search__query"])
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn arguments_are_redacted_and_results_kept_as_hashes(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {"user": {"type": "string"}, "password": {"type": "string"}, "card": {"type": "object"}}});
    let mut doc = single_op("login", schema.clone(), json!({}));
    doc["x-toolgate-audit"] = json!({"redact": ["/card/number"]});
    write_group(
        root.path(),
        "bank",
        &doc,
        &[("login.sh", "#!/bin/sh\necho '{\"balance\": 12}'\n")],
    );
    let mut open = single_op("echo", schema, json!({}));
    open["x-toolgate-audit"] = json!({"store_results": true});
    write_group(
        root.path(),
        "open",
        &open,
        &[("echo.sh", "#!/bin/sh\necho '{\"ok\": true}'\n")],
    );
    let app = TestApp::with(pool.clone(), root.path(), None, &[]).await;
    let token = app.agent("teller", &["bank", "open"]).await;

    app.call(
        &token,
        "bank__login",
        json!({"user": "ann", "password": "hunter2", "card": {"number": "4111", "exp": "12/30"}}),
    )
    .await;
    app.call(&token, "open__echo", json!({"user": "bob"})).await;

    let rows = sqlx::query("SELECT tool, arguments, result, result_sha256 FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started' ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let args: Value = serde_json::from_str(rows[0].get::<&str, _>(1)).unwrap();
    assert_eq!(
        args,
        json!({"user": "ann", "password": "[REDACTED]", "card": {"number": "[REDACTED]", "exp": "12/30"}})
    );
    let results: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT tool, result, result_sha256 FROM audit_events WHERE event_type = 'tool.result' ORDER BY id").fetch_all(&pool).await.unwrap();
    assert_eq!(results[0].1, None, "a result was stored without opt-in");
    assert_eq!(results[0].2.as_ref().map(String::len), Some(64));
    assert_eq!(results[1].1.as_deref(), Some("{\"ok\":true}"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn verify_passes_on_a_clean_log_and_finds_an_edited_row(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    for city in ["Paris", "Tokyo", "Atlantis"] {
        app.call(&token, "weather__current", json!({"city": city}))
            .await;
    }
    assert_eq!(walk(&pool).await, Ok(()));

    // An export verifies offline with the CLI.
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = cli(&pool, &["export"]).await.stdout;
    std::fs::write(file.path(), &out).unwrap();
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["audit", "verify", "--file"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );

    // Someone with SQL access quietly turns a failure into a success.
    sqlx::query("ALTER TABLE audit_events DISABLE TRIGGER USER")
        .execute(&pool)
        .await
        .unwrap();
    for part in sqlx::query_scalar::<_, String>("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relkind = 'r'").fetch_all(&pool).await.unwrap() {
        sqlx::query(&format!("ALTER TABLE {part} DISABLE TRIGGER USER")).execute(&pool).await.unwrap();
    }
    let edited: i64 = sqlx::query_scalar(
        "UPDATE audit_events SET outcome = 'success', error = NULL WHERE id = (SELECT min(id) FROM audit_events WHERE outcome = 'tool_error') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let broken = walk(&pool).await.unwrap_err();
    assert_eq!(broken.0, Some(edited));
    assert!(broken.1.contains("edited"), "{}", broken.1);

    let tampered = String::from_utf8(out).unwrap().replacen(
        "\"outcome\":\"tool_error\"",
        "\"outcome\":\"success\"",
        1,
    );
    std::fs::write(file.path(), tampered).unwrap();
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["audit", "verify", "--file"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stdout).contains("BROKEN"),
        "{}",
        String::from_utf8_lossy(&bad.stdout)
    );
}

async fn walk(pool: &PgPool) -> Result<(), (Option<i64>, String)> {
    let mut v = Verifier::default();
    let mut rows = std::pin::pin!(toolgate::db::audit::stream(
        pool.clone(),
        AuditFilter::default()
    ));
    while let Some(r) = rows.next().await {
        v.check(&r.unwrap()).map_err(|b| (b.id, b.reason))?;
    }
    assert!(v.rows > 0);
    Ok(())
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_burst_beyond_the_limit_is_refused_and_other_agents_are_unaffected(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let meteo = app.token_for("meteo").await;
    let assistant = app.token_for("assistant").await;
    let r = app
        .admin("PUT", "/api/v1/agents/meteo/rate-limits", Some(json!({"rate_limits": [{"pattern": "weather__current", "per_second": 1, "burst": 2}]})))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Calls without their required argument are refused in microseconds, after the limit is
    // taken: the burst is spent well within one second, whatever the machine's load.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(app.get("/tools/weather/current", Some(&meteo)).await);
    }
    let mcp = app.call(&meteo, "weather__current", json!({})).await;
    let other_tool = app
        .get("/tools/weather/forecast?city=Paris", Some(&meteo))
        .await;
    let other_agent = app
        .post_json(
            "/tools/search/query",
            Some(&assistant),
            json!({"q": "deploy"}),
        )
        .await;

    assert_eq!(statuses[0].status, StatusCode::BAD_REQUEST);
    assert_eq!(statuses[1].status, StatusCode::BAD_REQUEST);
    assert_eq!(statuses[2].status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses[2].headers["retry-after"], "1");
    // A rate-limited call is a tool error the model reads, with the wait in `_meta`.
    assert_eq!(mcp.body["result"]["isError"], true, "{}", mcp.text);
    assert!(
        mcp.body["result"]["_meta"]["retry_after_ms"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(other_tool.status, StatusCode::OK);
    assert_eq!(other_agent.status, StatusCode::OK);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM audit_events WHERE outcome = 'rate_limited'"
        )
        .await,
        2
    );
}

/// A filter naming a kind or an outcome the log never records is a 400 that names the known
/// ones, on the export and the list alike, not an empty answer; a blank one filters nothing.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_unknown_event_type_or_outcome_filter_is_refused(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    for (query, typo, known) in [
        ("event_type=tool.reslt", "tool.reslt", "tool.result"),
        ("outcome=sucess", "sucess", "success"),
    ] {
        for path in [
            format!("/api/v1/audit/export?format=jsonl&{query}"),
            format!("/api/v1/audit?{query}"),
        ] {
            let r = app.admin("GET", &path, None).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.text);
            assert!(
                r.text.contains("unknown") && r.text.contains(&format!("`{typo}`")),
                "{path}: {}",
                r.text
            );
            assert!(r.text.contains(known), "{path}: {}", r.text);
        }
    }
    let blank = app
        .admin("GET", "/api/v1/audit?event_type=&outcome=", None)
        .await;
    assert_eq!(blank.status, StatusCode::OK, "{}", blank.text);
    // The UI: its export refuses, its page says so above the rows.
    let mut auditor = crate::web::Browser::signed_in(&app, "aud", "auditor").await;
    let ui_export = auditor
        .get("/admin/audit/export?format=csv&event_type=tool.reslt")
        .await;
    assert_eq!(
        ui_export.status,
        StatusCode::BAD_REQUEST,
        "{}",
        ui_export.text
    );
    assert!(ui_export.text.contains("tool.reslt"), "{}", ui_export.text);
    let ui_page = auditor.get("/admin/audit?outcome=sucess").await;
    assert!(
        ui_page.text.contains("unknown outcome") && ui_page.text.contains("sucess"),
        "{}",
        ui_page.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn export_is_filtered_and_csv_neutralises_formulas(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("assistant").await;
    app.send(
        http::Request::post("/tools/search/query")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("user-agent", "=HYPERLINK(\"http://evil.example\")")
            .body(axum::body::Body::from(json!({"q": "deploy"}).to_string()))
            .unwrap(),
    )
    .await;

    let csv = app
        .admin(
            "GET",
            "/api/v1/audit/export?format=csv&tool=search__query",
            None,
        )
        .await;
    let jsonl = app
        .admin(
            "GET",
            "/api/v1/audit/export?format=jsonl&event_type=tool.result",
            None,
        )
        .await;
    let page = app.admin("GET", "/api/v1/audit?limit=2", None).await;

    assert_eq!(csv.status, StatusCode::OK);
    assert!(csv.text.starts_with("id,at,chain"), "{}", csv.text);
    assert_eq!(
        csv.text.lines().count(),
        3,
        "header + started + result: {}",
        csv.text
    );
    // The user agent cell would start with `=`: it is exported with a leading apostrophe.
    assert!(
        csv.text
            .contains(",\"'=HYPERLINK(\"\"http://evil.example\"\")\","),
        "{}",
        csv.text
    );
    assert!(
        !csv.text.contains(",=HYPERLINK") && !csv.text.contains(",\"=HYPERLINK"),
        "{}",
        csv.text
    );
    let lines: Vec<Value> = jsonl
        .text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // A header saying what was selected, the rows, a closing line counting them.
    assert_eq!(
        lines[0]["filter"]["event_type"], "tool.result",
        "{}",
        jsonl.text
    );
    let rows = &lines[1..lines.len() - 1];
    assert!(!rows.is_empty() && rows.iter().all(|r| r["event_type"] == "tool.result"));
    assert_eq!(lines[lines.len() - 1]["rows"], rows.len());
    assert_eq!(page.body["events"].as_array().unwrap().len(), 2);
    let before = page.body["next_before"].as_i64().unwrap();
    let next = app
        .admin(
            "GET",
            &format!("/api/v1/audit?limit=2&before={before}"),
            None,
        )
        .await;
    assert!(next.body["events"][0]["id"].as_i64().unwrap() < before);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn retention_drops_old_partitions_records_them_and_verify_says_so(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    // The writer's chain begins with rows old enough for retention, then goes on today.
    let old = chrono::Utc::now() - chrono::Duration::days(800);
    for n in 0..3 {
        let mut e = toolgate::audit::AuditEvent::new(
            toolgate::audit::EventKind::ToolCall,
            toolgate::audit::Outcome::Success,
        );
        e.at = old + chrono::Duration::seconds(n);
        app.state.audit.record(e).await.unwrap();
    }
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    let name = toolgate::db::audit::partition_name(old);

    let dropped = toolgate::audit::apply_retention(&pool, 365).await.unwrap();

    assert_eq!(dropped, std::slice::from_ref(&name));
    let note: String = sqlx::query_scalar(
        "SELECT details FROM audit_events WHERE event_type = 'audit.retention' AND chain = 'control-plane'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(note.contains(&name), "{note}");
    let (by, rows): (String, i64) = sqlx::query_as(
        "SELECT dropped_by, (chains -> 0 ->> 'rows')::bigint FROM audit_retention_ledger WHERE partition = $1",
    )
    .bind(&name)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((by.as_str(), rows), ("root", 3));
    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("rows 1 to 3 were dropped by retention") && out.contains(&name),
        "{out}"
    );
}

/// The database URL of the test's own database.
pub(crate) async fn db_url(pool: &PgPool) -> String {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    format!("postgres://root@127.0.0.1:5432/{db}")
}

/// Runs the real `toolgate audit <args>` against the test database.
pub(crate) async fn cli(pool: &PgPool, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("audit")
        .args(args)
        .env("DATABASE_URL", db_url(pool).await)
        .env("TOOLGATE_LOG", "warn")
        .output()
        .await
        .unwrap()
}

/// `toolgate audit verify` on the database: whether it passed, and what it printed.
pub(crate) async fn verify_db(pool: &PgPool, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["verify"];
    args.extend_from_slice(extra);
    let out = cli(pool, &args).await;
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A log with a few calls on the instance chain and admin changes on the control plane.
async fn seeded(pool: &PgPool) -> (TestApp, String) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    for city in ["Paris", "Tokyo", "Lima"] {
        app.call(&token, "weather__current", json!({"city": city}))
            .await;
    }
    let chain = app_chain(pool).await;
    // The heads count every row once, whichever trigger saw it.
    let off = count(
        pool,
        "SELECT count(*) FROM audit_chain_heads h WHERE row_count <> (SELECT count(*) FROM audit_events e WHERE e.chain = h.chain)
           OR last_seq <> (SELECT max(chain_seq) FROM audit_events e WHERE e.chain = h.chain)",
    )
    .await;
    assert_eq!(off, 0, "chain heads disagree with the rows");
    let (ok, out) = verify_db(pool, &[]).await;
    assert!(ok, "a clean log must verify: {out}");
    (app, chain)
}

/// The instance chain (the one that is not the control plane).
async fn app_chain(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT chain FROM audit_events WHERE chain <> 'control-plane' LIMIT 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn partitions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'audit_events'::regclass",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

pub(crate) async fn exec(pool: &PgPool, sql: &str) -> Result<(), String> {
    sqlx::query(sql)
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn truncate_is_refused_on_the_table_and_every_partition_even_future_ones(pool: PgPool) {
    let (_app, _) = seeded(&pool).await;
    let next_year = chrono::Utc::now() + chrono::Duration::days(400);
    let mut conn = pool.acquire().await.unwrap();
    toolgate::db::audit::ensure_partition(&mut conn, next_year)
        .await
        .unwrap();
    drop(conn);
    let parts = partitions(&pool).await;
    assert!(parts.contains(&toolgate::db::audit::partition_name(next_year)));

    let whole = exec(&pool, "TRUNCATE audit_events").await;
    assert!(
        whole.as_ref().unwrap_err().contains("append-only"),
        "{whole:?}"
    );
    for p in &parts {
        let one = exec(&pool, &format!("TRUNCATE {p}")).await;
        assert!(
            one.as_ref().unwrap_err().contains("append-only"),
            "{p}: {one:?}"
        );
    }
    for table in ["audit_retention_ledger", "audit_checkpoints"] {
        assert!(
            exec(&pool, &format!("TRUNCATE {table}")).await.is_err(),
            "{table}"
        );
    }
    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(ok, "{out}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_detached_partition_fails_verify_naming_the_missing_rows(pool: PgPool) {
    let (_app, chain) = seeded(&pool).await;
    let part = partitions(&pool).await.remove(0);
    let last: i64 = sqlx::query_scalar("SELECT max(chain_seq) FROM audit_events WHERE chain = $1")
        .bind(&chain)
        .fetch_one(&pool)
        .await
        .unwrap();

    exec(
        &pool,
        &format!("ALTER TABLE audit_events DETACH PARTITION {part}"),
    )
    .await
    .unwrap();

    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("chain {chain}: rows 1 to {last} are missing")),
        "{out}"
    );
    assert!(out.contains("chain control-plane: rows 1 to"), "{out}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_dropped_partition_fails_verify(pool: PgPool) {
    let (_app, chain) = seeded(&pool).await;
    let part = partitions(&pool).await.remove(0);

    exec(&pool, &format!("DROP TABLE {part}")).await.unwrap();

    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("chain {chain}: rows 1 to")), "{out}");
    assert!(out.contains("no retention dropped them"), "{out}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_table_truncated_around_its_triggers_fails_verify(pool: PgPool) {
    let (_app, chain) = seeded(&pool).await;
    // The owner (or a superuser) can switch the trigger off; the heads still remember.
    for p in partitions(&pool).await {
        exec(
            &pool,
            &format!("ALTER TABLE {p} DISABLE TRIGGER audit_no_truncate"),
        )
        .await
        .unwrap();
        exec(&pool, &format!("TRUNCATE {p}")).await.unwrap();
    }
    let left = count(&pool, "SELECT count(*) FROM audit_events").await;
    assert_eq!(left, 0);

    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("chain {chain}: rows 1 to")), "{out}");
}

/// Lets a test edit rows as a database user with the rights to do so.
pub(crate) async fn disable_row_triggers(pool: &PgPool) {
    for p in partitions(pool).await {
        exec(pool, &format!("ALTER TABLE {p} DISABLE TRIGGER USER"))
            .await
            .unwrap();
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn deleting_a_chains_first_rows_is_not_blamed_on_retention(pool: PgPool) {
    let (_app, chain) = seeded(&pool).await;
    disable_row_triggers(&pool).await;

    sqlx::query("DELETE FROM audit_events WHERE chain = $1 AND chain_seq <= 2")
        .bind(&chain)
        .execute(&pool)
        .await
        .unwrap();

    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "chain {chain}: rows 1 to 2 are missing and no retention dropped them"
        )),
        "{out}"
    );
}

/// Rewrites `chain` from `seq` on as a careful forger would: the row at `seq` edited, every
/// later hash recomputed, the recorded head moved along.
async fn rehash_from(pool: &PgPool, chain: &str, seq: i64) {
    use toolgate::audit::chain::{canonical, link};
    disable_row_triggers(pool).await;
    sqlx::query("UPDATE audit_events SET outcome = 'forged' WHERE chain = $1 AND chain_seq = $2")
        .bind(chain)
        .bind(seq)
        .execute(pool)
        .await
        .unwrap();
    let rows: Vec<_> = {
        let mut s = std::pin::pin!(toolgate::db::audit::stream(
            pool.clone(),
            AuditFilter::default()
        ));
        let mut v = Vec::new();
        while let Some(r) = s.next().await {
            let r = r.unwrap();
            if r.chain == chain && r.chain_seq >= seq {
                v.push(r);
            }
        }
        v
    };
    let mut prev: String = sqlx::query_scalar(
        "SELECT prev_hash FROM audit_events WHERE chain = $1 AND chain_seq = $2",
    )
    .bind(chain)
    .bind(seq)
    .fetch_one(pool)
    .await
    .unwrap();
    for r in rows {
        let hash = link(
            &prev,
            &canonical(
                &r.chain,
                r.chain_seq,
                &r.instance,
                r.flags.as_deref(),
                &r.event,
            ),
        );
        sqlx::query(
            "UPDATE audit_events SET prev_hash = $1, hash = $2 WHERE chain = $3 AND chain_seq = $4",
        )
        .bind(&prev)
        .bind(&hash)
        .bind(chain)
        .bind(r.chain_seq)
        .execute(pool)
        .await
        .unwrap();
        prev = hash;
    }
    sqlx::query("UPDATE audit_chain_heads SET last_hash = $1 WHERE chain = $2")
        .bind(&prev)
        .bind(chain)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_rehashed_chain_is_caught_by_a_signed_checkpoint_online_and_offline(pool: PgPool) {
    let (app, chain) = seeded(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("checkpoint.key");
    let public = dir.path().join("checkpoint.key.pub");
    let out = cli(&pool, &["keygen", "--out", key.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&pool, &["checkpoint", "--key", key.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A copy of the checkpoints kept away from the database.
    let kept = dir.path().join("checkpoints.jsonl");
    std::fs::write(&kept, cli(&pool, &["checkpoints"]).await.stdout).unwrap();
    // The log goes on after the checkpoint.
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Oslo"}))
        .await;
    let pk = ["--public-key", public.to_str().unwrap()];
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(ok && out.contains("checkpoints: 1 verified"), "{out}");

    rehash_from(&pool, &chain, 2).await;
    // The forger also removes the stored checkpoints.
    exec(&pool, "ALTER TABLE audit_checkpoints DISABLE TRIGGER USER")
        .await
        .unwrap();
    exec(&pool, "DELETE FROM audit_checkpoints").await.unwrap();

    let (ok, unkeyed) = verify_db(&pool, &[]).await;
    assert!(ok, "without the key the forgery cannot be seen: {unkeyed}");
    assert!(
        unkeyed.contains("warning: no --public-key given"),
        "{unkeyed}"
    );
    let (ok, keyed) = verify_db(
        &pool,
        &[&pk[..], &["--checkpoints", kept.to_str().unwrap()]].concat(),
    )
    .await;
    assert!(!ok, "{keyed}");
    assert!(
        keyed.contains(&format!("BROKEN: chain {chain}")) && keyed.contains("re-hashed"),
        "{keyed}"
    );

    // Offline: an export of the forged log, checked against the kept checkpoints.
    let export = cli(&pool, &["export"]).await;
    assert!(export.status.success());
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, &export.stdout).unwrap();
    let offline = cli(
        &pool,
        &[
            &["verify", "--file", file.to_str().unwrap()],
            &pk[..],
            &["--checkpoints", kept.to_str().unwrap()],
        ]
        .concat(),
    )
    .await;
    let text = String::from_utf8_lossy(&offline.stdout);
    assert!(!offline.status.success(), "{text}");
    assert!(text.contains("re-hashed"), "{text}");
}

/// A request as if it came over TCP from `ip`, so per-address limits apply to it.
fn from_ip(mut req: http::Request<axum::body::Body>, ip: &str) -> http::Request<axum::body::Body> {
    let addr: std::net::SocketAddr = format!("{ip}:40000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    req
}

fn hostile_token_request(i: usize) -> http::Request<axum::body::Body> {
    from_ip(
        http::Request::post("/oauth/token")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(axum::body::Body::from(format!(
                "grant_type=client_credentials&client_id=a%00b{i}&client_secret=x%00y"
            )))
            .unwrap(),
        "203.0.113.9",
    )
}

/// Polls `sql` (one bigint) until it reaches `want` or ten seconds pass; returns the last value.
async fn eventually(pool: &PgPool, sql: &str, want: i64) -> i64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = count(pool, sql).await;
        if n >= want || std::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An app with one cheap shell tool (`bulk__echo`) that many calls can run at once, so a
/// failure can only come from the audit log, not from a loaded machine.
async fn echo_app(pool: &PgPool) -> TestApp {
    echo_app_with(pool, &[]).await
}

async fn echo_app_with(pool: &PgPool, extra: &[&str]) -> TestApp {
    let root = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "q": {"type": "string"}}, "additionalProperties": true});
    let op = single_op("echo", schema, json!({"x-toolgate-timeout-ms": 120000}));
    write_group(root.path(), "bulk", &op, &[("echo.sh", "#!/bin/sh\ncat\n")]);
    let args = [&["--max-concurrency-per-tool", "1000"], extra].concat();
    let app = TestApp::with(pool.clone(), root.path(), None, &args).await;
    // The scripts are read at call time: the folder must outlive the app.
    std::mem::forget(root);
    app
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_outsider_flooding_nul_bytes_fails_no_legit_call(pool: PgPool) {
    // A small per-address budget, so that part of the flood is refused by the limit (and
    // audited as such) however slowly this machine sends it.
    let limit = ["--token-rate-per-ip", "1", "--token-burst-per-ip", "5"];
    let app = echo_app_with(&pool, &limit).await;
    let alice = app.agent("alice", &["bulk"]).await;
    let (bob_id, bob_secret) = {
        app.agent("bob", &["bulk"]).await;
        app.client_for("bob").await
    };
    // An agent of our own turned hostile: NUL in a tool name, an argument key and a value.
    let mallory = app.agent("mallory", &["bulk"]).await;
    let rounds = 30;
    let listed_before = count(
        &pool,
        "SELECT count(*) FROM audit_events WHERE event_type = 'tools/list' AND agent = 'alice'",
    )
    .await;

    let mut legit = Vec::new();
    let mut hostile = Vec::new();
    for i in 0..rounds {
        hostile.push(app.send(hostile_token_request(i)).boxed_local());
        hostile.push(
            app.send(
                http::Request::post("/tools/bulk/echo%00x")
                    .header("authorization", format!("Bearer {mallory}"))
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(json!({"q": "a"}).to_string()))
                    .unwrap(),
            )
            .boxed_local(),
        );
        legit.push(
            app.post_json("/tools/bulk/echo", Some(&alice), json!({"n": i}))
                .boxed_local(),
        );
        hostile.push(
            app.mcp(
                Some(&mallory),
                "tools/call",
                json!({"name": "bulk__echo\u{0}", "arguments": {"q": "b"}}),
            )
            .boxed_local(),
        );
        hostile.push(
            app.call(
                &mallory,
                "bulk__echo",
                json!({"q": "c\u{0}d", "k\u{0}ey": "v\u{0}"}),
            )
            .boxed_local(),
        );
        legit.push(app.mcp(Some(&alice), "tools/list", json!({})).boxed_local());
        if i % 10 == 0 {
            legit.push(
                app.token_request(
                    &[("grant_type", "client_credentials")],
                    Some((&bob_id, &bob_secret)),
                )
                .boxed_local(),
            );
        }
    }
    // Both sides at once, so hostile and legit events share the writer's batches.
    let (legit, _) = futures::future::join(
        futures::future::join_all(legit),
        futures::future::join_all(hostile),
    )
    .await;

    let failed: Vec<_> = legit
        .iter()
        .filter(|r| r.status != StatusCode::OK || r.body.get("error").is_some())
        .map(|r| (r.status, r.text.clone()))
        .collect();
    println!(
        "legit calls failed while an outsider sent NUL bytes: {} of {}",
        failed.len(),
        legit.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    // Listings are recorded without making the answer wait: none may be lost.
    let listed = eventually(
        &pool,
        "SELECT count(*) FROM audit_events WHERE event_type = 'tools/list' AND agent = 'alice'",
        listed_before + rounds as i64,
    )
    .await;
    assert_eq!(
        listed,
        listed_before + rounds as i64,
        "listing events were lost"
    );
    // Every refused token request is on record, including those refused by the per-address
    // limit (identical ones from this address counted in a summary row), with the NUL
    // escaped and the row flagged.
    let hostile_tokens = crate::helpers::refusals_on_record(
        &app,
        "remote_addr = '203.0.113.9' AND event_type IN ('client_auth.failed', 'token.issued')",
    )
    .await;
    assert_eq!(hostile_tokens, rounds as i64);
    assert!(
        count(
            &pool,
            r"SELECT count(*) FROM audit_events WHERE starts_with(client_id, 'a\u0000b')
                AND flags LIKE '%client_id%'"
        )
        .await
            > 0
    );
    assert!(
        count(&pool, r"SELECT count(*) FROM audit_events WHERE outcome = 'rate_limited' AND starts_with(client_id, 'a\u0000b')").await > 0,
        "the flood never reached the per-address limit"
    );
    let stored_args: Vec<String> = sqlx::query_scalar(
        r"SELECT arguments FROM audit_events WHERE agent = 'mallory' AND arguments LIKE '%k\\u0000ey%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(stored_args.len() >= rounds, "{}", stored_args.len());
    assert_eq!(
        serde_json::from_str::<Value>(&stored_args[0]).unwrap()["k\u{0}ey"],
        "v\u{0}",
        "escaped JSON arguments still mean what was sent"
    );
    assert_eq!(walk(&pool).await, Ok(()));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_row_the_database_refuses_is_isolated_and_the_others_commit(pool: PgPool) {
    let app = echo_app(&pool).await;
    let alice = app.agent("alice", &["bulk"]).await;
    let bob = app.agent("bob", &["bulk"]).await;
    // Whatever the sanitizer does not foresee: here Postgres refuses one user agent.
    sqlx::query(
        "ALTER TABLE audit_events ADD CONSTRAINT refuse_probe CHECK (user_agent IS DISTINCT FROM 'refuse-me')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rounds = 20;

    let mut legit = Vec::new();
    let mut probes = Vec::new();
    for _ in 0..rounds {
        legit.push(
            app.post_json("/tools/bulk/echo", Some(&alice), json!({}))
                .boxed_local(),
        );
        probes.push(
            app.send(
                http::Request::post("/tools/bulk/echo")
                    .header("authorization", format!("Bearer {bob}"))
                    .header("content-type", "application/json")
                    .header("user-agent", "refuse-me")
                    .body(axum::body::Body::from(json!({"q": "deploy"}).to_string()))
                    .unwrap(),
            )
            .boxed_local(),
        );
    }
    let (legit, probes) = futures::future::join(
        futures::future::join_all(legit),
        futures::future::join_all(probes),
    )
    .await;

    assert!(
        legit.iter().all(|r| r.status == StatusCode::OK),
        "{:?}",
        legit.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // The refused rows were stored as placeholders, so their own calls went through too.
    assert!(
        probes.iter().all(|r| r.status == StatusCode::OK),
        "{:?}",
        probes.iter().map(|r| &r.text).collect::<Vec<_>>()
    );
    let placeholders = count(
        &pool,
        "SELECT count(*) FROM audit_events WHERE flags::jsonb ->> 'placeholder' = 'true'
           AND flags::jsonb ->> 'isolated' LIKE '%refuse_probe%' AND user_agent IS NULL",
    )
    .await;
    assert_eq!(
        placeholders,
        2 * rounds as i64,
        "a started and a result row per probe"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND agent = 'alice'"
        )
        .await,
        rounds as i64
    );
    assert_eq!(walk(&pool).await, Ok(()));
}

#[sqlx::test(migrations = false)]
async fn a_serving_role_that_may_only_append_serves_and_cannot_rewrite_the_log(pool: PgPool) {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (owner, serving) = (format!("tg_owner_{suffix}"), format!("tg_serve_{suffix}"));
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    for r in [&owner, &serving] {
        exec(&pool, &format!("CREATE ROLE {r} LOGIN"))
            .await
            .unwrap();
    }
    // The owner owns the database (and so, on PostgreSQL 15, its public schema).
    exec(&pool, &format!("ALTER DATABASE \"{db}\" OWNER TO {owner}"))
        .await
        .unwrap();
    let url = |role: &str| format!("postgres://{role}@127.0.0.1:5432/{db}");

    let migrate = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "migrate",
            "--database-url",
            &url(&owner),
            "--serving-role",
            &serving,
        ])
        .env("TOOLGATE_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );

    let root = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let op = single_op("echo", schema, json!({"x-toolgate-timeout-ms": 120000}));
    write_group(root.path(), "bulk", &op, &[("echo.sh", "#!/bin/sh\ncat\n")]);
    let port = crate::durability::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut server = crate::durability::serve(&url(&serving), root.path(), port);
    crate::durability::wait_ready(&http, &base).await;
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth("kill-test");
    for (path, body) in [
        ("/api/v1/agents", json!({"name": "worker"})),
        ("/api/v1/agents/worker/grants", json!({"target": "bulk"})),
    ] {
        let r = admin(http.post(format!("{base}{path}")))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{path}: {}",
            r.text().await.unwrap()
        );
    }
    let client: Value = admin(http.post(format!("{base}/api/v1/agents/worker/clients")))
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
    let call = http
        .post(format!("{base}/tools/bulk/echo"))
        .bearer_auth(token["access_token"].as_str().unwrap())
        .json(&json!({"n": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 200, "{}", call.text().await.unwrap());
    server.kill().await.unwrap();

    let as_serving = PgPool::connect(&url(&serving)).await.unwrap();
    assert_eq!(
        count(&as_serving, "SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND agent = 'worker'").await,
        1,
        "the call was audited by the serving role"
    );
    let part = partitions(&as_serving).await.remove(0);
    for attack in [
        "UPDATE audit_events SET outcome = 'success'".to_owned(),
        "DELETE FROM audit_events".to_owned(),
        "TRUNCATE audit_events".to_owned(),
        format!("TRUNCATE {part}"),
        format!("DROP TABLE {part}"),
        format!("ALTER TABLE audit_events DETACH PARTITION {part}"),
        "ALTER TABLE audit_events DISABLE TRIGGER USER".to_owned(),
        format!("DELETE FROM {part}"),
        "UPDATE audit_chain_heads SET last_hash = ''".to_owned(),
        "DELETE FROM audit_retention_ledger".to_owned(),
        "DELETE FROM audit_checkpoints".to_owned(),
    ] {
        let r = exec(&as_serving, &attack).await;
        assert!(
            r.as_ref().is_err_and(|e| e.contains("permission denied")
                || e.contains("must be owner")
                || e.contains("append-only")),
            "{attack}: {r:?}"
        );
    }
    as_serving.close().await;
    let (ok, out) = {
        let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["audit", "verify", "--database-url", &url(&serving)])
            .output()
            .await
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    assert!(ok, "the serving role can verify: {out}");

    // Roles are cluster-wide: leave none behind.
    exec(
        &pool,
        &format!("ALTER DATABASE \"{db}\" OWNER TO CURRENT_USER"),
    )
    .await
    .unwrap();
    exec(&pool, &format!("REASSIGN OWNED BY {owner} TO CURRENT_USER"))
        .await
        .unwrap();
    for r in [&owner, &serving] {
        exec(&pool, &format!("DROP OWNED BY {r}")).await.unwrap();
        exec(&pool, &format!("DROP ROLE {r}")).await.unwrap();
    }
}

/// `toolgate audit verify --file` on `content`: whether it passed, and what it printed.
pub(crate) async fn verify_text(pool: &PgPool, content: &str) -> (bool, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), content).unwrap();
    let out = cli(pool, &["verify", "--file", file.path().to_str().unwrap()]).await;
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_filtered_export_says_so_and_a_cut_or_edited_one_is_still_caught(pool: PgPool) {
    let (app, _) = seeded(&pool).await;
    let other = app.token_for("assistant").await;
    app.post_json("/tools/search/query", Some(&other), json!({"q": "deploy"}))
        .await;

    // Every filter is named in the verdict.
    let both = cli(
        &pool,
        &["export", "--agent", "meteo", "--person", "nobody-here"],
    )
    .await;
    let (ok, out) = verify_text(&pool, &String::from_utf8(both.stdout).unwrap()).await;
    assert!(
        ok && out.contains("filtered export (agent=meteo, person=nobody-here)"),
        "{out}"
    );

    let export = cli(&pool, &["export", "--agent", "meteo"]).await;
    assert!(export.status.success());
    let text = String::from_utf8(export.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let rows = lines.len() - 2;
    assert!(rows >= 6, "{text}");

    let (ok, out) = verify_text(&pool, &text).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("filtered export (agent=meteo): {rows} rows")),
        "{out}"
    );
    assert!(!out.contains("retention"), "{out}");

    // Cut short: the closing line is gone.
    let cut = lines[..lines.len() - 2].join("\n");
    let (ok, out) = verify_text(&pool, &cut).await;
    assert!(!ok && out.contains("cut short"), "{out}");
    // A row taken out of the middle, closing line kept.
    let mut removed = lines.clone();
    removed.remove(3);
    let (ok, out) = verify_text(&pool, &removed.join("\n")).await;
    assert!(!ok && out.contains("rows were removed"), "{out}");
    // A row edited.
    let edited = text.replacen("\"outcome\":\"success\"", "\"outcome\":\"denied\"", 1);
    assert_ne!(edited, text);
    let (ok, out) = verify_text(&pool, &edited).await;
    assert!(!ok && out.contains("edited after it was written"), "{out}");

    // The whole log, exported, verifies as complete.
    let whole = String::from_utf8(cli(&pool, &["export"]).await.stdout).unwrap();
    let (ok, out) = verify_text(&pool, &whole).await;
    assert!(
        ok && out.contains("complete up to its recorded head"),
        "{out}"
    );
    // One row edited in the middle of the whole log: that row is named, and only it; the walk
    // goes on from it (no "rows N to M are missing" for the rows after it).
    let rows: Vec<&str> = whole.lines().collect();
    let middle = rows.len() / 2;
    assert!(
        rows[middle].starts_with("{\"format\":\"toolgate-audit-v2\""),
        "{}",
        rows[middle]
    );
    let mut one_edited: Vec<String> = rows.iter().map(|l| (*l).to_owned()).collect();
    one_edited[middle] = if one_edited[middle].contains("\"outcome\":\"success\"") {
        one_edited[middle].replacen("\"outcome\":\"success\"", "\"outcome\":\"denied\"", 1)
    } else {
        one_edited[middle].replacen("\"outcome\":\"", "\"outcome\":\"x", 1)
    };
    let (ok, out) = verify_text(&pool, &one_edited.join("\n")).await;
    assert!(!ok, "{out}");
    assert_eq!(
        out.matches("edited after it was written").count(),
        1,
        "{out}"
    );
    assert!(!out.contains("missing"), "{out}");

    // ... and a whole chain taken out of it is named.
    let without_cp: Vec<&str> = whole
        .lines()
        .filter(|l| {
            !(l.starts_with("{\"format\":\"toolgate-audit-v2\"")
                && l.contains("\"chain\":\"control-plane\""))
        })
        .collect();
    let fixed = without_cp.join("\n");
    let (ok, out) = verify_text(&pool, &fixed).await;
    assert!(
        !ok && out.contains("chain control-plane: rows 1 to"),
        "{out}"
    );
}

/// Durable rows per second through the group-commit writer, with the chain-heads trigger
/// and, as the reference in the same run, without it. A measurement, not a check: run it
/// with `cargo nextest run --release --run-ignored only -E 'test(/writer_throughput/)' --no-capture`.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on demand"]
async fn writer_throughput_with_and_without_the_heads_trigger(pool: PgPool) {
    use toolgate::audit::AuditEvent;
    use toolgate::audit::writer::AuditLog;
    async fn rate(pool: &PgPool) -> f64 {
        let log = AuditLog::spawn(
            pool.clone(),
            format!("bench/{}", uuid::Uuid::now_v7()),
            "bench".into(),
        );
        let (writers, per) = (256, 200);
        let started = std::time::Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let log = log.clone();
                tokio::spawn(async move {
                    for _ in 0..per {
                        let mut e = AuditEvent::new(
                            toolgate::audit::EventKind::ToolResult,
                            toolgate::audit::Outcome::Success,
                        );
                        e.agent = Some("bench".into());
                        e.tool = Some("bench__echo".into());
                        log.record(e).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        f64::from(writers * per) / started.elapsed().as_secs_f64()
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        exec(
            &pool,
            "ALTER TABLE audit_events ENABLE TRIGGER audit_events_track_heads",
        )
        .await
        .unwrap();
        on.push(rate(&pool).await);
        exec(
            &pool,
            "ALTER TABLE audit_events DISABLE TRIGGER audit_events_track_heads",
        )
        .await
        .unwrap();
        off.push(rate(&pool).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (on, off) = (median(&mut on), median(&mut off));
    println!(
        "durable audit rows/s, median of 3 runs of 51,200: {on:.0} with the heads trigger, {off:.0} without (ratio {:.2})",
        on / off
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_user_agent_that_is_not_utf8_is_recorded_with_the_bad_bytes_replaced(pool: PgPool) {
    let app = echo_app(&pool).await;
    let alice = app.agent("alice", &["bulk"]).await;
    let ua = http::HeaderValue::from_bytes(b"probe/1 \xff\xfe").unwrap();

    let r = app
        .send(
            http::Request::post("/tools/bulk/echo")
                .header("authorization", format!("Bearer {alice}"))
                .header("content-type", "application/json")
                .header("user-agent", ua)
                .body(axum::body::Body::from("{}"))
                .unwrap(),
        )
        .await;

    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT user_agent FROM audit_events WHERE agent = 'alice' AND event_type = 'tool.result'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored, ["probe/1 \u{fffd}\u{fffd}"]);
    assert_eq!(walk(&pool).await, Ok(()));
}

/// The `audit.export` and `audit.read` rows, oldest first: kind, actor, chain, request id,
/// user agent and details.
async fn accesses(
    pool: &PgPool,
) -> Vec<(
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Value,
)> {
    sqlx::query(
        "SELECT event_type, admin_user, chain, request_id, user_agent, details FROM audit_events
         WHERE event_type IN ('audit.export', 'audit.read') ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|r| {
        let details: String = r.get("details");
        (
            r.get("event_type"),
            r.get("admin_user"),
            r.get("chain"),
            r.get("request_id"),
            r.get("user_agent"),
            serde_json::from_str(&details).unwrap(),
        )
    })
    .collect()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn every_channel_leaves_a_record_of_reading_the_log(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("assistant").await;
    app.call(&token, "search__query", json!({"q": "deploy"}))
        .await;

    // The API, with a user agent to be recognised by.
    let api_export = app
        .send(
            http::Request::get(
                "/api/v1/audit/export?format=jsonl&agent=assistant&tool=search__query",
            )
            .header(
                "authorization",
                format!("Bearer {}", crate::helpers::ADMIN_TOKEN),
            )
            .header("user-agent", "siem-puller/1.0")
            .body(axum::body::Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(api_export.status, StatusCode::OK, "{}", api_export.text);
    let api_page = app
        .admin("GET", "/api/v1/audit?limit=5&agent=assistant", None)
        .await;
    assert_eq!(api_page.status, StatusCode::OK, "{}", api_page.text);
    let first_id = api_page.body["events"][0]["id"].as_i64().unwrap();
    let api_one = app
        .admin("GET", &format!("/api/v1/audit/{first_id}"), None)
        .await;
    assert_eq!(api_one.status, StatusCode::OK, "{}", api_one.text);
    // The UI, signed in as an auditor.
    let mut auditor = crate::web::Browser::signed_in(&app, "aud", "auditor").await;
    let ui_export = auditor
        .get("/admin/audit/export?format=csv&event_type=tool.result")
        .await;
    assert_eq!(ui_export.status, StatusCode::OK, "{}", ui_export.text);
    let ui_page = auditor.get("/admin/audit?agent=assistant").await;
    assert_eq!(ui_page.status, StatusCode::OK);
    // The command line, run by a named operating-system account.
    let cli_export = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "audit",
            "export",
            "--format",
            "jsonl",
            "--outcome",
            "denied",
        ])
        .env("DATABASE_URL", db_url(&pool).await)
        .env("TOOLGATE_LOG", "warn")
        .env("USER", "grace")
        .output()
        .await
        .unwrap();
    assert!(
        cli_export.status.success(),
        "{}",
        String::from_utf8_lossy(&cli_export.stderr)
    );

    let rows = accesses(&pool).await;
    let kinds: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str(), r.5["channel"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("audit.export", "api:admin-token", "api"),
            ("audit.read", "api:admin-token", "api"),
            ("audit.read", "api:admin-token", "api"),
            ("audit.export", "admin:aud", "ui"),
            ("audit.read", "admin:aud", "ui"),
            ("audit.export", "cli", "cli"),
        ]
    );
    // Every one in the control-plane chain, which `audit verify` walks like any other.
    assert!(rows.iter().all(|r| r.2 == "control-plane"), "{rows:?}");
    // From where: the request (its id, and the user agent the puller sent), or the account
    // that ran the command.
    assert_eq!(rows[0].4.as_deref(), Some("siem-puller/1.0"));
    assert!(rows[..5].iter().all(|r| r.3.is_some()), "{rows:?}");
    assert_eq!(rows[5].5["os_user"], "grace");
    assert!(rows[5].3.is_none());
    // With what filter, every field of it.
    assert_eq!(rows[0].5["format"], "jsonl");
    assert_eq!(rows[0].5["filter"]["agent"], "assistant");
    assert_eq!(rows[0].5["filter"]["tool"], "search__query");
    assert_eq!(rows[1].5["filter"]["agent"], "assistant");
    assert_eq!(rows[1].5["limit"], 5);
    assert_eq!(rows[2].5["id"], first_id);
    assert_eq!(rows[3].5["format"], "csv");
    assert_eq!(rows[3].5["filter"]["event_type"], "tool.result");
    assert_eq!(rows[4].5["filter"]["agent"], "assistant");
    assert_eq!(rows[5].5["filter"]["outcome"], "denied");
    // The chain still verifies with the records of its reading in it.
    let (ok, out) = verify_db(&pool, &[]).await;
    assert!(ok, "{out}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_read_that_cannot_be_recorded_is_refused(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    // A database user who may read the log but whose writes to it fail: the record of the
    // read cannot be made, so neither the page nor the export is served.
    sqlx::query(
        "CREATE FUNCTION refuse_reads_record() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.event_type IN ('audit.read', 'audit.export') THEN
             RAISE EXCEPTION 'no writes';
           END IF;
           RETURN NEW;
         END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_reads_record BEFORE INSERT ON audit_events
         FOR EACH ROW EXECUTE FUNCTION refuse_reads_record()",
    )
    .execute(&pool)
    .await
    .unwrap();

    let page = app.admin("GET", "/api/v1/audit", None).await;
    let export = app
        .admin("GET", "/api/v1/audit/export?format=csv", None)
        .await;

    assert!(
        page.status.is_server_error(),
        "{}: {}",
        page.status,
        page.text
    );
    assert!(page.body.get("events").is_none(), "{}", page.text);
    assert!(
        export.status.is_server_error(),
        "{}: {}",
        export.status,
        export.text
    );
    assert!(!export.text.starts_with("id,at"), "{}", export.text);
}

/// The deploy mistake the Kubernetes example used to make: the owner migrates without
/// `--serving-role`, and the app role starts on a schema it has no rights to. The error must
/// say what to run, not only "permission denied".
#[sqlx::test(migrations = false)]
async fn a_serving_role_without_grants_is_told_to_run_migrate_serving_role(pool: PgPool) {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (owner, serving) = (format!("tg_owner_{suffix}"), format!("tg_serve_{suffix}"));
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    for r in [&owner, &serving] {
        exec(&pool, &format!("CREATE ROLE {r} LOGIN"))
            .await
            .unwrap();
    }
    exec(&pool, &format!("ALTER DATABASE \"{db}\" OWNER TO {owner}"))
        .await
        .unwrap();
    let url = |role: &str| format!("postgres://{role}@127.0.0.1:5432/{db}");
    let toolgate = |args: Vec<String>| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .env("TOOLGATE_LOG", "warn")
            .kill_on_drop(true)
            .output()
    };
    let plain = toolgate(vec!["migrate".into(), "--database-url".into(), url(&owner)])
        .await
        .unwrap();
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let port = crate::durability::free_port();
    let serve = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        toolgate(vec![
            "serve".into(),
            "--database-url".into(),
            url(&serving),
            "--bind".into(),
            format!("127.0.0.1:{port}"),
            "--tools-dir".into(),
            repo_path("tools").to_string_lossy().into_owned(),
        ]),
    )
    .await
    .expect("serve gives up at start")
    .unwrap();
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert!(!serve.status.success());
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(
        stderr.contains("toolgate migrate --serving-role"),
        "{stderr}"
    );
    // Roles are cluster-wide: leave none behind.
    exec(
        &pool,
        &format!("ALTER DATABASE \"{db}\" OWNER TO CURRENT_USER"),
    )
    .await
    .unwrap();
    exec(&pool, &format!("REASSIGN OWNED BY {owner} TO CURRENT_USER"))
        .await
        .unwrap();
    for r in [&owner, &serving] {
        exec(&pool, &format!("DROP OWNED BY {r}")).await.unwrap();
        exec(&pool, &format!("DROP ROLE {r}")).await.unwrap();
    }
}

/// Inserts one chained tool-call row with a latency, a person and a client, as a writer would.
async fn insert_timed(pool: &PgPool, chain_name: &str, latency_ms: i64) -> i64 {
    use toolgate::audit::chain::{self, GENESIS};
    use toolgate::audit::{AuditEvent, EventKind, Outcome};
    let mut e = AuditEvent::new(EventKind::ToolResult, Outcome::Success);
    e.agent = Some("assistant".into());
    e.tool = Some("weather__current".into());
    e.person = Some("ada".into());
    e.client_id = Some("https://host.example/client.json".into());
    e.latency_us = Some(latency_ms * 1000);
    let r = chain::extend(chain_name, (0, GENESIS), "test", e);
    sqlx::query_scalar(
        "INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type,
                                   outcome, agent, tool, person, client_id, latency_us)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id",
    )
    .bind(r.event.at)
    .bind(&r.chain)
    .bind(r.chain_seq)
    .bind(&r.prev_hash)
    .bind(&r.hash)
    .bind(&r.instance)
    .bind(&r.event.event_type)
    .bind(&r.event.outcome)
    .bind(&r.event.agent)
    .bind(&r.event.tool)
    .bind(&r.event.person)
    .bind(&r.event.client_id)
    .bind(r.event.latency_us)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_list_shows_person_client_and_latency_and_filters_on_latency(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let fast = insert_timed(&pool, "fast", 3).await;
    let slow = insert_timed(&pool, "slow", 1500).await;

    let ids = |body: &Value| -> Vec<i64> {
        body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_i64().unwrap())
            .collect()
    };
    let api = app
        .admin("GET", "/api/v1/audit?min_latency_ms=1000", None)
        .await;
    assert_eq!(api.status, StatusCode::OK, "{}", api.text);
    assert_eq!(ids(&api.body), vec![slow]);
    let all = app
        .admin("GET", "/api/v1/audit?min_latency_ms=0", None)
        .await;
    let all = ids(&all.body);
    assert!(all.contains(&fast) && all.contains(&slow), "{all:?}");
    // The export says it was filtered, naming the latency bound.
    let export = app
        .admin(
            "GET",
            "/api/v1/audit/export?format=jsonl&min_latency_ms=1000",
            None,
        )
        .await;
    assert_eq!(export.status, StatusCode::OK, "{}", export.text);
    let rows: Vec<Value> = export
        .text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v.get("event_type").is_some())
        .collect();
    assert_eq!(rows.len(), 1, "{}", export.text);
    assert_eq!(rows[0]["id"], json!(slow));
    assert!(
        export.text.contains("\"min_latency_ms\":1000"),
        "the export names its filter: {}",
        export.text
    );

    let mut b = crate::web::Browser::signed_in(&app, "aud", "auditor").await;
    let page = b.get("/admin/audit").await;
    assert_eq!(page.status, StatusCode::OK);
    for want in [
        ">Person</th>",
        ">Client</th>",
        ">Latency</th>",
        "href=\"/admin/audit?person=ada\"",
        "https://host.example/client.json",
        "3.0 ms",
        "1500 ms",
    ] {
        assert!(page.text.contains(want), "{want} missing from the list");
    }
    let filtered = b.get("/admin/audit?min_latency_ms=1000").await;
    assert!(filtered.text.contains("1500 ms") && !filtered.text.contains("3.0 ms"));
    assert!(
        filtered.text.contains("value=\"1000\""),
        "the form keeps the bound"
    );
    let bad = b.get("/admin/audit?min_latency_ms=slow").await;
    assert!(
        bad.text.contains("is not a number of milliseconds"),
        "{}",
        bad.text
    );
    // Attacker-controlled text in the new columns is escaped.
    let mut e = toolgate::audit::AuditEvent::new(
        toolgate::audit::EventKind::ToolResult,
        toolgate::audit::Outcome::Success,
    );
    e.client_id = Some("<script>x</script>".into());
    let r = toolgate::audit::chain::extend("hostile", (0, toolgate::audit::chain::GENESIS), "t", e);
    sqlx::query(
        "INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type,
                                   outcome, client_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)",
    )
    .bind(r.event.at)
    .bind(&r.chain)
    .bind(r.chain_seq)
    .bind(&r.prev_hash)
    .bind(&r.hash)
    .bind(&r.instance)
    .bind(&r.event.event_type)
    .bind(&r.event.outcome)
    .bind(&r.event.client_id)
    .execute(&pool)
    .await
    .unwrap();
    let page = b.get("/admin/audit").await;
    assert!(!page.text.contains("<script>x</script>"));
    assert!(page.text.contains("&#60;script&#62;x&#60;/script&#62;"));
}
