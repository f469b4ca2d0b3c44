//! The audit log where a SIEM reads it: incremental pulls that never skip a row, the v2 JSONL
//! rows, OCSF and CEF. (The OCSF records are validated against the OCSF schema, and their
//! chain re-verified from the records alone, by the CI step that runs
//! `tests/clients/siem_check.py` on a live gateway's export.)

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::audit::verify_text;
use crate::helpers::TestApp;
use toolgate::audit::chain::{self, GENESIS};
use toolgate::audit::{AuditEvent, EventKind, Outcome};

fn jsonl(text: &str) -> (Vec<Value>, Value) {
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let trailer = lines.last().cloned().unwrap();
    assert!(trailer.get("toolgate_audit_export_end").is_some(), "{text}");
    (lines[1..lines.len() - 1].to_vec(), trailer)
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

/// Inserts one chained row inside `tx` (its own chain), as another instance's writer would.
async fn insert_row(tx: &mut sqlx::PgConnection, chain_name: &str) -> i64 {
    let e = AuditEvent::new(EventKind::ToolCall, Outcome::Started);
    let r = chain::extend(chain_name, (0, GENESIS), "another-instance", e);
    sqlx::query_scalar(
        "INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(r.event.at)
    .bind(&r.chain)
    .bind(r.chain_seq)
    .bind(&r.prev_hash)
    .bind(&r.hash)
    .bind(&r.instance)
    .bind(&r.event.event_type)
    .bind(&r.event.outcome)
    .fetch_one(tx)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_incremental_export_never_skips_a_row_another_instance_committed_late(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Lima"}))
        .await;

    // Instance B's transaction starts first; instance A's takes an id, then B's takes a larger
    // one and commits while A's is still in flight. An id cursor would move past A's row.
    let mut b = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *b)
        .await
        .unwrap();
    let mut a = pool.begin().await.unwrap();
    let late = insert_row(&mut a, "instance-a").await;
    let early = insert_row(&mut b, "instance-b").await;
    assert!(early > late);
    b.commit().await.unwrap();

    // B's row is read once every transaction older than it has ended: other tests' share
    // this database server, so wait for it (A's stays open).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (seen, trailer) = loop {
        let first = app
            .admin("GET", "/api/v1/audit/export?format=jsonl&after_id=0", None)
            .await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text);
        let (rows, trailer) = jsonl(&first.text);
        let seen = ids(&rows);
        assert!(!seen.contains(&late), "A's row is not committed yet");
        if seen.contains(&early) {
            break (seen, trailer);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B's committed row never came: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let next = trailer["next_after_id"].as_i64().unwrap();
    assert!(seen.contains(&next));
    assert!(next >= early, "the cursor moved past the late row's id");

    a.commit().await.unwrap();
    // Other tests' transactions may still hold the watermark back: pull until A's row comes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let seen2 = loop {
        let second = app
            .admin(
                "GET",
                &format!("/api/v1/audit/export?format=jsonl&after_id={next}"),
                None,
            )
            .await;
        assert_eq!(second.status, StatusCode::OK, "{}", second.text);
        let (rows2, _) = jsonl(&second.text);
        let seen2 = ids(&rows2);
        if seen2.contains(&late) {
            break seen2;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the row committed late comes with the next pull: {seen2:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        seen2.iter().all(|i| !seen.contains(i)),
        "no overlap: {seen:?} then {seen2:?}"
    );
    // Together the pulls hold every row up to the last they returned.
    let mut got: Vec<i64> = seen.iter().chain(&seen2).copied().collect();
    got.sort_unstable();
    let all: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM audit_events WHERE id <= $1 ORDER BY id")
            .bind(got.last().copied().unwrap())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(got, all, "an incremental pull missed rows");

    // The list API walks the same order, page by page.
    let page = app
        .admin("GET", "/api/v1/audit?after_id=0&limit=500", None)
        .await;
    assert_eq!(page.status, StatusCode::OK);
    let listed: Vec<i64> = page.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert!(listed.contains(&late) && listed.contains(&early));
    assert_eq!(page.body["next_after"], json!(listed.last().unwrap()));

    // A cursor that names no row is refused, not read as "nothing new".
    let bad = app
        .admin(
            "GET",
            "/api/v1/audit/export?format=jsonl&after_id=99999999",
            None,
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    assert!(bad.text.contains("names no row"), "{}", bad.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn one_call_as_jsonl_ocsf_and_cef(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    // The call's first row: what was asked, with what, by whom (its result follows).
    let q = "event_type=tool.call&agent=meteo";
    let get = |format: &'static str| {
        let app = &app;
        async move {
            let r = app
                .admin(
                    "GET",
                    &format!("/api/v1/audit/export?format={format}&{q}"),
                    None,
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{format}: {}", r.text);
            r
        }
    };
    let (j, o, c) = (get("jsonl").await, get("ocsf").await, get("cef").await);

    // JSONL v2: every field present, JSON text as JSON, and it still verifies offline.
    let (rows, _) = jsonl(&j.text);
    assert_eq!(rows.len(), 1, "{}", j.text);
    let row = &rows[0];
    assert_eq!(row["format"], "toolgate-audit-v2");
    assert_eq!(row["category"], "tool");
    assert_eq!(row["outcome"], "started", "{row}");
    assert_eq!(row["severity"], "info", "{row}");
    for field in ["person", "flags", "admin_user", "result", "error"] {
        assert!(
            row.get(field).is_some(),
            "{field} is present (null when empty)"
        );
    }
    assert!(
        row["arguments"].is_object(),
        "arguments are native JSON: {row}"
    );
    let (ok, out) = verify_text(&pool, &j.text).await;
    assert!(ok, "a v2 export verifies: {out}");

    // OCSF: API Activity, Invoke, the tool as the service, the chain in record_integrity.
    let rec: Value = serde_json::from_str(o.text.lines().next().unwrap()).unwrap();
    assert_eq!(o.text.lines().count(), 1);
    assert_eq!(rec["class_uid"], 6003);
    assert_eq!(rec["activity_id"], 99);
    assert_eq!(rec["activity_name"], "Invoke");
    assert_eq!(rec["api"]["service"]["name"], "weather__current");
    assert_eq!(rec["actor"]["app_name"], "meteo");
    assert_eq!(rec["metadata"]["version"], "1.8.0");
    assert_eq!(
        rec["metadata"]["uid"],
        row["id"].as_i64().unwrap().to_string()
    );
    assert_eq!(
        rec["unmapped"]["record_integrity"]["fingerprint"]["value"],
        row["hash"]
    );
    assert_eq!(
        rec["unmapped"]["record_integrity"]["prev_event"]["fingerprint"]["value"],
        row["prev_hash"]
    );

    // CEF: one line, the chain in its custom fields.
    assert_eq!(c.text.lines().count(), 1);
    let line = c.text.lines().next().unwrap();
    assert!(line.starts_with("CEF:0|toolgate|toolgate|"), "{line}");
    assert!(line.contains("|tool.call|tool.call started|3|"), "{line}");
    assert!(
        !line.contains("cn2Label"),
        "no label without its value: {line}"
    );
    assert!(line.contains(&format!("cs6={}", row["hash"].as_str().unwrap())));
    assert!(line.contains("cs2=weather__current"));
    println!(
        "JSONL: {}\nOCSF: {}\nCEF: {line}",
        serde_json::to_string(row).unwrap(),
        o.text.trim()
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn mcp_operations_are_measured_per_tool_and_agent_with_no_label_from_a_made_up_name(
    pool: PgPool,
) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    // Unknown to everyone, and a real tool meteo is not granted: neither becomes a label.
    app.call(&token, "made_up__zzz_probe", json!({})).await;
    app.call(&token, "search__query", json!({"q": "x"})).await;
    app.mcp(Some(&token), "tools/list", json!({})).await;

    let text = app.get("/metrics", None).await.text;
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in:\n{text}"))
            .to_owned()
    };
    let ok = line(
        "mcp_server_operation_duration_seconds_count{agent=\"meteo\",error_type=\"\",gen_ai_tool_name=\"weather__current\",mcp_method_name=\"tools/call\"}",
    );
    assert!(ok.ends_with(" 1"), "{ok}");
    line(
        "mcp_server_operation_duration_seconds_count{agent=\"meteo\",error_type=\"\",gen_ai_tool_name=\"\",mcp_method_name=\"tools/list\"}",
    );
    assert!(
        !text.contains("made_up__zzz_probe"),
        "a made-up name became a label"
    );
    assert!(
        !text.contains("search__query"),
        "an ungranted tool became a label"
    );
    let unknown: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("mcp_server_operation_duration_seconds_count")
                && l.contains("gen_ai_tool_name=\"\"")
                && l.contains("mcp_method_name=\"tools/call\"")
        })
        .collect();
    assert_eq!(
        unknown.len(),
        1,
        "both refusals under one unnamed series: {unknown:?}"
    );
    assert!(unknown[0].ends_with(" 2") && !unknown[0].contains("error_type=\"\""));
    for family in [
        "process_resident_memory_bytes",
        "toolgate_build_info{version=",
        "toolgate_audit_commit_seconds_count",
        "toolgate_audit_rows_written_total",
        "toolgate_audit_queue_events",
        "toolgate_db_pool_connections{state=\"in_use\"}",
    ] {
        line(family);
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rollups_count_every_call_once_and_the_dashboard_agent_and_tool_pages_chart_them(
    pool: PgPool,
) {
    use toolgate::audit::rollup;
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    let rule = app
        .admin(
            "PUT",
            "/api/v1/agents/meteo/arguments/weather__forecast",
            Some(json!({"days": {"maximum": 3}})),
        )
        .await;
    assert_eq!(rule.status, StatusCode::OK, "{}", rule.text);
    for _ in 0..3 {
        app.call(&token, "weather__current", json!({"city": "Paris"}))
            .await;
    }
    app.call(&token, "weather__current", json!({"city": "Atlantis"}))
        .await;
    app.call(&token, "search__query", json!({"q": "x"})).await; // not granted
    // Refused by the argument rule, twice.
    for _ in 0..2 {
        app.call(
            &token,
            "weather__forecast",
            json!({"city": "Paris", "days": 7}),
        )
        .await;
    }
    // Two followers (two instances) over the same log: each row counted once.
    let (a, b) = (pool.clone(), pool.clone());
    let run = |p: PgPool| async move {
        let mut total = 0;
        loop {
            let n = rollup::step(&p).await.unwrap();
            if n == 0 {
                return total;
            }
            total += n;
        }
    };
    let (ra, rb) = tokio::join!(run(a), run(b));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        ra + rb <= rows as usize,
        "rows read more than once: {ra} + {rb} of {rows}"
    );
    let counted = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    const ALL: &str =
        "FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = ''";
    // A follower stops at a batch of 0, which is also what it reads while the other holds the
    // cursor, or while a transaction older than these rows (another test's, on this server)
    // is still open: rows are read in commit order, never past one that might yet commit.
    // So it steps on until the seven calls are counted, or 30 s have passed.
    for _ in 0..600 {
        let counted: i64 =
            sqlx::query_scalar(&format!("SELECT coalesce(sum(calls), 0)::bigint {ALL}"))
                .fetch_one(&pool)
                .await
                .unwrap();
        if counted >= 7 {
            break;
        }
        rollup::step(&pool).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        counted("SELECT coalesce(sum(calls), 0)::bigint FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = '' AND outcome = 'success'").await,
        counted("SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND outcome = 'success'").await,
    );
    assert_eq!(
        counted("SELECT coalesce(sum(calls), 0)::bigint FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = '' AND outcome = 'denied'").await,
        counted("SELECT count(*) FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'denied'").await,
    );
    let total: i64 = sqlx::query_scalar(&format!("SELECT sum(calls)::bigint {ALL}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        total, 7,
        "three successes, one tool error, one refusal as not granted, two by a rule"
    );
    // The hour rows, the agent's and each tool's add up to the same.
    for (sql, want) in [
        (
            "SELECT sum(calls)::bigint FROM audit_rollup_totals WHERE granularity = 'hour' AND agent = '' AND tool = ''",
            7,
        ),
        (
            "SELECT sum(calls)::bigint FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = 'meteo' AND tool = ''",
            7,
        ),
        (
            "SELECT sum(calls)::bigint FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = 'weather__current'",
            4,
        ),
        (
            "SELECT sum(calls)::bigint FROM audit_rollup_totals WHERE granularity = 'minute' AND agent = '' AND tool = 'weather__forecast'",
            2,
        ),
    ] {
        assert_eq!(counted(sql).await, want, "{sql}");
    }
    let refusals: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT tool, reason, rule, sum(calls)::bigint FROM audit_rollup_refusals
         WHERE agent = 'meteo' GROUP BY 1, 2, 3 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        refusals,
        vec![
            (
                "search__query".into(),
                "not granted".into(),
                String::new(),
                1
            ),
            (
                "weather__forecast".into(),
                "argument rule".into(),
                "weather__forecast.days".into(),
                2
            ),
        ]
    );

    let mut browser = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let dash = browser.get("/admin?range=hour").await.text;
    assert!(
        dash.contains(&format!("data-chart=\"calls\" data-total=\"{total}\"")),
        "{dash}"
    );
    assert!(dash.contains("data-chart=\"latency\"") && dash.contains("class=\"line-p95\""));
    assert!(dash.contains("data-table=\"refusals\""));
    assert!(dash.contains("<code>weather__forecast.days</code>") && dash.contains(">not granted<"));
    assert!(
        dash.contains(
            "href=\"/admin/audit?agent=meteo&#38;tool=weather__forecast&#38;outcome=denied\""
        ),
        "each refusal links to its rows: {dash}"
    );
    let agent = browser.get("/admin/agents/meteo?range=day").await.text;
    assert!(agent.contains("data-range=\"day\""));
    assert!(agent.contains(&format!("data-chart=\"calls\" data-total=\"{total}\"")));
    assert!(agent.contains("<code>weather__forecast.days</code>"));
    let other = browser.get("/admin/agents/assistant").await.text;
    assert!(
        other.contains("data-chart=\"calls\" data-total=\"0\""),
        "another agent's page counts only its own calls"
    );
    let tool = browser
        .get("/admin/tools/weather__current?range=week")
        .await;
    assert_eq!(tool.status, StatusCode::OK);
    assert!(tool.text.contains("data-range=\"week\""));
    assert!(
        tool.text.contains("data-chart=\"calls\" data-total=\"4\""),
        "the tool's page counts its own calls"
    );
    assert!(tool.text.contains("No refusals for this tool"));
    let forecast = browser.get("/admin/tools/weather__forecast").await.text;
    assert!(forecast.contains("data-chart=\"calls\" data-total=\"2\""));
    assert!(forecast.contains("<code>weather__forecast.days</code>"));
    assert!(
        !forecast.contains(">not granted<"),
        "only this tool's refusals"
    );
    let missing = browser.get("/admin/tools/nope__nothing").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn metrics_can_have_a_listener_of_their_own_and_leave_the_public_address(pool: PgPool) {
    use crate::durability::{free_port, wait_ready};
    let (port, metrics_port) = (free_port(), free_port());
    let tools = tempfile::tempdir().unwrap();
    let _server = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--database-url"])
        .arg(crate::audit::db_url(&pool).await)
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .args(["--metrics-bind", &format!("127.0.0.1:{metrics_port}")])
        .arg("--tools-dir")
        .arg(tools.path())
        .args(["--policies-dir", "/nonexistent"])
        .env("TOOLGATE_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let public = format!("http://127.0.0.1:{port}");
    let private = format!("http://127.0.0.1:{metrics_port}");
    wait_ready(&http, &public).await;
    wait_ready(&http, &private).await;
    let on_public = http.get(format!("{public}/metrics")).send().await.unwrap();
    assert_eq!(on_public.status(), StatusCode::NOT_FOUND);
    let scraped = http.get(format!("{private}/metrics")).send().await.unwrap();
    assert_eq!(scraped.status(), StatusCode::OK);
    let text = scraped.text().await.unwrap();
    for family in ["toolgate_build_info", "process_resident_memory_bytes"] {
        assert!(text.contains(family), "{family} missing: {text}");
    }
    // Only metrics and probes there: nothing else of the gateway.
    for path in ["/mcp", "/admin", "/api/v1/agents", "/oauth/token"] {
        let r = http.get(format!("{private}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn followers_go_on_after_retention_drops_the_row_their_cursor_stands_on(pool: PgPool) {
    use toolgate::audit::rollup;
    let app = TestApp::new(pool.clone()).await;
    // Three old results, the only rows the follower reads first: its cursor stands on the last.
    let old = chrono::Utc::now() - chrono::Duration::days(800);
    for n in 0..3 {
        let mut e = AuditEvent::new(EventKind::ToolResult, Outcome::Success);
        e.at = old + chrono::Duration::seconds(n);
        e.agent = Some("meteo".into());
        e.tool = Some("weather__current".into());
        app.state.audit.record(e).await.unwrap();
    }
    let calls = |tool: &'static str, since: chrono::DateTime<chrono::Utc>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT coalesce(sum(calls), 0)::bigint FROM audit_rollup_totals
                 WHERE granularity = 'minute' AND agent = '' AND tool = $1 AND start >= $2",
            )
            .bind(tool)
            .bind(since)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // Rows become readable once no older transaction runs (another test's may): poll.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let today = chrono::Utc::now() - chrono::Duration::hours(1);
    while calls("weather__current", old - chrono::Duration::minutes(1)).await < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the old rows were never counted"
        );
        if rollup::step(&pool).await.unwrap() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let at: i64 = sqlx::query_scalar("SELECT after_id FROM audit_sink_cursors WHERE sink = $1")
        .bind(rollup::CURSOR)
        .fetch_one(&pool)
        .await
        .unwrap();
    let gone = toolgate::audit::apply_retention(&pool, 365).await.unwrap();
    assert_eq!(gone.len(), 1, "{gone:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE id = $1")
        .bind(at)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the cursor's row {at} is dropped");

    // A call after the drop is counted, once, and nothing old is counted again.
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while calls("weather__current", today).await < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the follower stopped at the dropped row"
        );
        if rollup::step(&pool).await.unwrap() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    while rollup::step(&pool).await.unwrap() > 0 {}
    assert_eq!(calls("weather__current", today).await, 1);
    let ever: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM audit_rollup_totals
         WHERE granularity = 'minute' AND agent = '' AND tool = 'weather__current'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(ever <= 4, "rows counted twice: {ever}");
}
