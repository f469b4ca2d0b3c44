//! Argument rules: grants that narrow a tool's parameters, over MCP, REST, the API and files.

use std::process::Command;

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};

async fn put_rules(
    app: &TestApp,
    agent: &str,
    target: &str,
    rules: Value,
) -> crate::helpers::Reply {
    app.admin(
        "PUT",
        &format!("/api/v1/agents/{agent}/arguments/{target}"),
        Some(rules),
    )
    .await
}

fn listed<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_rule_narrows_the_listed_schema_and_refuses_calls_outside_it(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.agent("planner", &["weather"]).await;

    let set = put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"days": {"maximum": 3}}),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text);
    assert_eq!(set.body["problems"], json!([]), "{}", set.text);

    // The model is shown the narrowed schema: the tool's own bounds, tightened, and required.
    let list = app.mcp(Some(&token), "tools/list", json!({})).await;
    let forecast = listed(&list.body, "weather__forecast");
    let days = &forecast["inputSchema"]["properties"]["days"];
    assert_eq!(days["maximum"], 3, "{days}");
    assert_eq!(days["minimum"], 1, "{days}");
    assert_eq!(days["type"], "integer");
    assert!(
        forecast["inputSchema"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("days")),
        "{forecast}"
    );
    // Other tools of the group, and other agents, are untouched.
    let current = listed(&list.body, "weather__current");
    assert!(current["inputSchema"]["properties"].get("days").is_none());
    let other = app.agent("other", &["weather"]).await;
    let other_list = app.mcp(Some(&other), "tools/list", json!({})).await;
    assert_eq!(
        listed(&other_list.body, "weather__forecast")["inputSchema"]["properties"]["days"]["maximum"],
        7
    );

    // Inside the rule: runs.
    let ok = app
        .call(
            &token,
            "weather__forecast",
            json!({"city": "Paris", "days": 2}),
        )
        .await;
    assert_eq!(ok.body["result"]["isError"], json!(false), "{}", ok.text);

    // Outside: refused before anything runs, naming the parameter and the rule.
    let refused = app
        .call(
            &token,
            "weather__forecast",
            json!({"city": "Paris", "days": 5}),
        )
        .await;
    assert_eq!(refused.body["result"]["isError"], true, "{}", refused.text);
    let text = refused.body["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(text.contains("`days`"), "{text}");
    assert!(text.contains(r#"{"maximum":3}"#), "{text}");
    assert!(text.contains("weather__forecast"), "{text}");
    // Leaving the parameter out does not get round the rule (the tool defaults to 3, but a
    // tool's default could be anything).
    let omitted = app
        .call(&token, "weather__forecast", json!({"city": "Paris"}))
        .await;
    assert_eq!(omitted.body["result"]["isError"], true, "{}", omitted.text);
    // The other agent is not limited.
    let free = app
        .call(
            &other,
            "weather__forecast",
            json!({"city": "Paris", "days": 5}),
        )
        .await;
    assert_eq!(
        free.body["result"]["isError"],
        json!(false),
        "{}",
        free.text
    );

    // Audited as denied, with the rule, and no `started` row for it.
    let rows: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT outcome, error, details FROM audit_events
         WHERE agent = 'planner' AND tool = 'weather__forecast' AND event_type = 'tool.call'
         ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let outcomes: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(outcomes, ["started", "denied", "denied"], "{rows:?}");
    let (_, error, details) = &rows[1];
    assert!(error.as_deref().unwrap().contains("`days`"), "{error:?}");
    let details: Value = serde_json::from_str(details.as_deref().unwrap()).unwrap();
    assert_eq!(
        details["argument_rules"],
        json!([{"on": "weather__forecast", "param": "days", "rule": {"maximum": 3}}])
    );

    // The API shows the rules.
    let agent = app.admin("GET", "/api/v1/agents/planner", None).await;
    assert_eq!(
        agent.body["agent"]["arguments"],
        json!([{"target": "weather__forecast", "params": {"days": {"maximum": 3}}}])
    );

    // Removed: the tool's own schema again.
    let gone = app
        .admin(
            "DELETE",
            "/api/v1/agents/planner/arguments/weather__forecast",
            None,
        )
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let again = app
        .call(
            &token,
            "weather__forecast",
            json!({"city": "Paris", "days": 5}),
        )
        .await;
    assert_eq!(
        again.body["result"]["isError"],
        json!(false),
        "{}",
        again.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rest_and_openapi_follow_the_rule(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.agent("planner", &["weather"]).await;
    // Keyed by the group: applies to every tool of it that has the parameter.
    let set = put_rules(
        &app,
        "planner",
        "weather",
        json!({"city": {"enum": ["Paris", "Berlin"]}}),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text);

    let doc = app.get("/openapi.json", Some(&token)).await;
    for path in ["/tools/weather/current", "/tools/weather/forecast"] {
        let params = doc.body["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap();
        let city = params.iter().find(|p| p["name"] == "city").unwrap();
        assert_eq!(
            city["schema"]["enum"],
            json!(["Paris", "Berlin"]),
            "{path}: {city}"
        );
    }

    let ok = app
        .get("/tools/weather/current?city=Berlin", Some(&token))
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    let refused = app
        .get("/tools/weather/current?city=Tokyo", Some(&token))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text);
    let v = refused.body["violations"][0].as_str().unwrap();
    assert!(v.contains("`city`") && v.contains("Paris"), "{v}");

    // Two rules on one tool: the audit row names the one that refused.
    put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"days": {"maximum": 3}}),
    )
    .await;
    let refused = app
        .get("/tools/weather/forecast?city=Tokyo&days=2", Some(&token))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text);
    let details: String = sqlx::query_scalar(
        "SELECT details FROM audit_events WHERE tool = 'weather__forecast' AND outcome = 'denied'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let details: Value = serde_json::from_str(&details).unwrap();
    assert_eq!(
        details["argument_rules"],
        json!([{"on": "weather", "param": "city", "rule": {"enum": ["Paris", "Berlin"]}}]),
        "{details}"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn wrong_rules_are_flagged_with_what_is_wrong(pool: PgPool) {
    let app = TestApp::new(pool).await;
    app.agent("planner", &["weather__forecast"]).await;

    let typo = put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"dayz": {"maximum": 3}}),
    )
    .await;
    assert_eq!(typo.status, StatusCode::OK, "{}", typo.text);
    assert_eq!(
        typo.body["problems"][0]["kind"], "unknown_parameter",
        "{}",
        typo.text
    );
    assert_eq!(typo.body["problems"][0]["suggestion"], "days");

    let crossed = put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"days": {"minimum": 5, "maximum": 3}}),
    )
    .await;
    assert_eq!(
        crossed.body["problems"][0]["kind"], "unsatisfiable",
        "{}",
        crossed.text
    );
    let beyond = put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"days": {"minimum": 8}}),
    )
    .await;
    assert_eq!(
        beyond.body["problems"][0]["kind"], "unsatisfiable",
        "{}",
        beyond.text
    );

    let typed = put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"city": {"maximum": 3}}),
    )
    .await;
    assert_eq!(
        typed.body["problems"][0]["kind"], "wrong_type",
        "{}",
        typed.text
    );

    let ungranted = put_rules(
        &app,
        "planner",
        "weather__current",
        json!({"city": {"enum": ["Paris"]}}),
    )
    .await;
    assert_eq!(
        ungranted.body["problems"][0]["kind"], "not_granted",
        "{}",
        ungranted.text
    );

    // Every problem is on the agent and counted in the metric.
    let agent = app.admin("GET", "/api/v1/agents/planner", None).await;
    assert_eq!(
        agent.body["agent"]["problems"].as_array().unwrap().len(),
        2,
        "{}",
        agent.text
    );
    let metrics = app.get("/metrics", None).await;
    assert!(
        metrics.text.contains("toolgate_argument_rule_problems 2"),
        "{}",
        metrics.text
    );

    // A malformed rule is refused outright.
    for bad in [
        json!({"days": {"maximun": 3}}),
        json!({"days": {"default": 3}}),
        json!({"days": 3}),
        json!({"city": {"pattern": "(("}}),
        json!([]),
    ] {
        let r = put_rules(&app, "planner", "weather__forecast", bad.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text);
    }
    let r = put_rules(
        &app,
        "nobody",
        "weather__forecast",
        json!({"days": {"maximum": 1}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_unsatisfiable_rule_refuses_every_call_rather_than_none(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.agent("planner", &["weather"]).await;
    put_rules(
        &app,
        "planner",
        "weather__forecast",
        json!({"days": {"minimum": 5, "maximum": 3}}),
    )
    .await;
    for days in [1, 3, 4, 5, 7] {
        let r = app
            .call(
                &token,
                "weather__forecast",
                json!({"city": "Paris", "days": days}),
            )
            .await;
        assert_eq!(r.body["result"]["isError"], true, "days {days}: {}", r.text);
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rules_round_trip_through_export_and_apply(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    put_rules(
        &app,
        "meteo",
        "weather__forecast",
        json!({"days": {"maximum": 3}, "city": {"enum": ["Paris"]}}),
    )
    .await;
    let catalog = app.state.policy.catalog();
    let out = tempfile::tempdir().unwrap();
    toolgate::policy::files::export(&pool, out.path())
        .await
        .unwrap();
    let text = std::fs::read_to_string(out.path().join("agents/meteo/agent.md")).unwrap();
    assert!(text.contains("arguments:"), "{text}");
    let report =
        toolgate::policy::files::apply_dir(&pool, out.path(), &catalog, "test", true, false, false)
            .await
            .unwrap();
    assert!(report.changes.is_empty(), "{:?}", report.changes);

    // Removing them from the file removes them from the database.
    let path = out.path().join("agents/meteo/agent.md");
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("arguments:") && !l.starts_with("  "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, without).unwrap();
    let report = toolgate::policy::files::apply_dir(
        &pool,
        out.path(),
        &catalog,
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap();
    let diff: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert!(
        diff.contains(&"- argument rules meteo -> weather__forecast".to_owned()),
        "{diff:?}"
    );
}

#[test]
fn policy_check_flags_a_misspelt_parameter_with_file_line_and_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agents/planner");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("agent.md"),
        "---\ntools: [weather]\narguments:\n  weather__forecast:\n    dayz: {maximum: 3}\n  weather:\n    city: {minLength: 70}\n---\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(dir.path())
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("agents/planner/agent.md:5: `weather__forecast` has no parameter `dayz`; did you mean `days`?"),
        "{stdout}"
    );
    assert!(
        stdout.contains("agent.md:7: rule on `city` of `weather__current` refuses every call"),
        "{stdout}"
    );

    // A malformed rule is an error of the file, which `apply` refuses even without --strict.
    std::fs::write(
        agent.join("agent.md"),
        "---\ntools: [weather]\narguments:\n  weather__forecast:\n    days: {maximun: 3}\n---\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(dir.path())
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("did you mean `maximum`?"), "{stdout}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_rule_is_rechecked_when_the_tool_changes_under_it(pool: PgPool) {
    let tools = tempfile::tempdir().unwrap();
    let schema = |max: u64| json!({"type": "object", "properties": {"n": {"type": "integer", "maximum": max}}});
    crate::helpers::write_group(
        tools.path(),
        "calc",
        &crate::helpers::single_op("add", schema(10), json!({})),
        &[("add.sh", "#!/bin/sh\ncat\n")],
    );
    let app = TestApp::with(pool, tools.path(), None, &["--script-sandbox", "off"]).await;
    let token = app.agent("a", &["calc"]).await;
    let r = put_rules(&app, "a", "calc__add", json!({"n": {"minimum": 5}})).await;
    assert_eq!(r.body["problems"], json!([]), "{}", r.text);

    // The tool's own bound moves below the rule's: every call would be refused, and it says so.
    crate::helpers::write_group(
        tools.path(),
        "calc",
        &crate::helpers::single_op("add", schema(3), json!({})),
        &[("add.sh", "#!/bin/sh\ncat\n")],
    );
    app.state.reload_pool();
    let agent = app.admin("GET", "/api/v1/agents/a", None).await;
    assert_eq!(
        agent.body["agent"]["problems"][0]["kind"], "unsatisfiable",
        "{}",
        agent.text
    );
    let r = app.call(&token, "calc__add", json!({"n": 3})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
}

/// What a rule check adds to a call: the same `#!/bin/sh cat` tool called in turns by an agent
/// with a rule on it and by one without, through the in-process router (audit on, sandbox
/// off), p50 of each; then the check alone, timed over many runs. A measurement, not a timed
/// test: `cargo nextest run --run-ignored only -E 'test(rule_check_cost)' --no-capture`.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on demand"]
async fn rule_check_cost(pool: PgPool) {
    let tools = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {
        "n": {"type": "integer"}, "repo": {"type": "string"}}});
    crate::helpers::write_group(
        tools.path(),
        "bench",
        &crate::helpers::single_op("echo", schema, json!({})),
        &[("echo.sh", "#!/bin/sh\ncat\n")],
    );
    let app = TestApp::with(pool, tools.path(), None, &["--script-sandbox", "off"]).await;
    let ruled = app.agent("ruled", &["bench"]).await;
    let free = app.agent("free", &["bench"]).await;
    put_rules(
        &app,
        "ruled",
        "bench__echo",
        json!({"n": {"minimum": 0, "maximum": 100}, "repo": {"enum": ["acme/web", "acme/api"]}}),
    )
    .await;
    let args = json!({"n": 7, "repo": "acme/web"});
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..420 {
        for (i, token) in [&ruled, &free].into_iter().enumerate() {
            let t = std::time::Instant::now();
            let r = app
                .post_json("/tools/bench/echo", Some(token), args.clone())
                .await;
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            if round >= 20 {
                times[i].push(us);
            }
        }
    }
    let p = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q) as usize]
    };
    let (r50, f50) = (p(&mut times[0], 0.5), p(&mut times[1], 0.5));
    println!(
        "call p50: with a rule {r50:.0} µs, without {f50:.0} µs; ratio {:.3}, difference {:.0} µs",
        r50 / f50,
        r50 - f50
    );
    let snapshot = app.state.policy.load();
    let principal = toolgate::policy::snapshot::Principal {
        agent: "ruled".into(),
        client_id: "c".into(),
        jti: None,
        person: None,
        scope: toolgate::policy::TokenScope::Only(vec![
            toolgate::policy::GrantTarget::parse("bench").unwrap(),
        ]),
    };
    let tool = snapshot.resolve(&principal, "bench__echo").unwrap();
    let narrowing = tool
        .narrowing
        .clone()
        .expect("the ruled agent's copy is narrowed");
    let n = 100_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(narrowing.violations(std::hint::black_box(&args)).is_empty());
    }
    println!(
        "the check alone (two rules): {:.2} µs per call",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn search_results_show_the_narrowed_schema(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app
        .agent_in_mode("finder", Some("search"), &["weather"])
        .await;
    put_rules(
        &app,
        "finder",
        "weather__forecast",
        json!({"days": {"maximum": 2}}),
    )
    .await;
    let r = app
        .call(
            &token,
            "search_tools",
            json!({"query": "forecast for the next days"}),
        )
        .await;
    let hits = r.body["result"]["structuredContent"]["tools"]
        .as_array()
        .unwrap();
    let forecast = hits
        .iter()
        .find(|t| t["name"] == "weather__forecast")
        .unwrap_or_else(|| panic!("{}", r.text));
    assert_eq!(
        forecast["inputSchema"]["properties"]["days"]["maximum"], 2,
        "{forecast}"
    );
    // Called through the meta-tool, the rule holds too.
    let refused = app
        .call(
            &token,
            "call_tool",
            json!({"name": "weather__forecast", "arguments": {"city": "Paris", "days": 3}}),
        )
        .await;
    assert_eq!(refused.body["result"]["isError"], true, "{}", refused.text);
    assert!(refused.text.contains("maximum"), "{}", refused.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn apply_warns_about_a_wrong_rule_and_strict_refuses_it(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agents/planner");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("agent.md"),
        "---\ntools: [weather]\narguments:\n  weather__forecast: {dayz: {maximum: 3}}\n---\n",
    )
    .unwrap();
    let strict =
        toolgate::policy::files::apply_dir(&pool, dir.path(), &catalog, "test", false, true, false)
            .await;
    assert!(
        matches!(strict, Err(toolgate::policy::files::ApplyError::Strict(_))),
        "{strict:?}"
    );
    let report = toolgate::policy::files::apply_dir(
        &pool,
        dir.path(),
        &catalog,
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.message.contains("did you mean `days`")),
        "{:?}",
        report.warnings
    );
    app.state.reload_policy().await.unwrap();
    let agent = app.admin("GET", "/api/v1/agents/planner", None).await;
    assert_eq!(
        agent.body["agent"]["problems"][0]["kind"], "unknown_parameter",
        "{}",
        agent.text
    );
}

/// A group whose `take` operation has a parameter of two types (`n`) and an untyped one (`u`),
/// served by a script that answers with its arguments.
fn loose_group() -> tempfile::TempDir {
    let tools = tempfile::tempdir().unwrap();
    crate::helpers::write_group(
        tools.path(),
        "loose",
        &crate::helpers::single_op(
            "take",
            json!({"type": "object", "properties": {
                "n": {"type": ["integer", "string"]},
                "u": {"description": "anything"}}}),
            json!({}),
        ),
        &[("take.sh", "#!/bin/sh\ncat\n")],
    );
    tools
}

/// Finding: `{"maximum": 3}` on a parameter typed `["integer","string"]` or untyped let
/// `"999"`, `[100]` and `{"v":100}` through (JSON Schema's `maximum` ignores what is not a
/// number), over MCP and REST, and nothing said the rule was loose.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_number_rule_refuses_values_that_are_not_numbers(pool: PgPool) {
    let tools = loose_group();
    let app = TestApp::with(
        pool.clone(),
        tools.path(),
        None,
        &["--script-sandbox", "off"],
    )
    .await;
    let token = app.agent("a", &["loose"]).await;
    let set = put_rules(
        &app,
        "a",
        "loose__take",
        json!({"n": {"maximum": 3}, "u": {"maximum": 3}}),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text);

    for param in ["n", "u"] {
        let other = if param == "n" { "u" } else { "n" };
        for bad in [json!("999"), json!([100]), json!({"v": 100}), json!(true)] {
            let args = json!({param: bad, other: 1});
            let mcp = app.call(&token, "loose__take", args.clone()).await;
            assert_eq!(
                mcp.body["result"]["isError"], true,
                "MCP let {args} through: {}",
                mcp.text
            );
            let rest = app
                .post_json("/tools/loose/take", Some(&token), args.clone())
                .await;
            assert_eq!(
                rest.status,
                StatusCode::BAD_REQUEST,
                "REST let {args} through: {}",
                rest.text
            );
        }
    }
    // What the rule allows still runs, on both surfaces.
    let ok = app
        .call(&token, "loose__take", json!({"n": 3, "u": 2.5}))
        .await;
    assert_eq!(ok.body["result"]["isError"], false, "{}", ok.text);
    let ok = app
        .post_json("/tools/loose/take", Some(&token), json!({"n": -1, "u": 0}))
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    // Nothing refused ever ran.
    let started: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE tool = 'loose__take' AND outcome = 'started'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(started, 2);

    // The model is told the type the rule holds it to.
    let list = app.mcp(Some(&token), "tools/list", json!({})).await;
    let props = &listed(&list.body, "loose__take")["inputSchema"]["properties"];
    assert_eq!(props["n"]["type"], json!(["integer"]), "{props}");
    assert_eq!(props["u"]["type"], "number", "{props}");

    // And the API says that the rule narrows the type too: a warning on each parameter.
    let problems = set.body["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{}", set.text);
    for p in problems {
        assert_eq!(p["kind"], "other_types", "{p}");
        assert_eq!(p["severity"], "warning", "{p}");
        assert!(
            p["message"]
                .as_str()
                .unwrap()
                .contains("refuses every value that is not a number"),
            "{p}"
        );
    }
    let agent = app.admin("GET", "/api/v1/agents/a", None).await;
    assert_eq!(
        agent.body["agent"]["problems"].as_array().unwrap().len(),
        2,
        "{}",
        agent.text
    );
    // So does the admin UI, on the rules page and the dashboard.
    let mut admin = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let page = admin.get("/admin/agents/a/arguments").await;
    assert_eq!(
        page.text
            .matches(r#"data-problem="other_types" data-severity="warning""#)
            .count(),
        2,
        "{}",
        page.text
    );
    let dashboard = admin.get("/admin").await;
    assert!(
        dashboard.text.contains("Argument rule warning"),
        "{}",
        dashboard.text
    );
}

#[test]
fn policy_check_flags_a_number_rule_on_a_parameter_of_other_types() {
    let tools = loose_group();
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agents/a");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("agent.md"),
        "---\ntools: [loose]\narguments:\n  loose__take:\n    n: {maximum: 3}\n    u: {pattern: '^a'}\n---\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(dir.path())
        .arg("--tools-dir")
        .arg(tools.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("agents/a/agent.md:5: warning: rule on `n` of `loose__take`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("agents/a/agent.md:6: warning: rule on `u` of `loose__take`"),
        "{stdout}"
    );
    assert!(stdout.contains("not a string"), "{stdout}");
}
