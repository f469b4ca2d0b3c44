//! Policies as code: check, apply, export.

use std::process::Command;

use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path, until};

#[test]
fn policy_check_names_file_line_and_suggestion_for_a_typo() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(repo_path("tests/fixtures/policies-typo"))
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);

    assert!(
        !out.status.success(),
        "policy check passed a misspelled grant"
    );
    assert!(
        stdout.contains("policies-typo/agents/assistant/agent.md:4: unknown group `serch`"),
        "{stdout}"
    );
    assert!(stdout.contains("did you mean `search`?"), "{stdout}");
    assert!(
        stdout.contains("agent `assistant` sees no tools at all"),
        "{stdout}"
    );
}

#[test]
fn policy_check_passes_the_shipped_examples() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(repo_path("policies"))
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn export_then_apply_is_no_change(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let out = tempfile::tempdir().unwrap();

    toolgate::policy::files::export(&pool, out.path())
        .await
        .unwrap();
    let report =
        toolgate::policy::files::apply_dir(&pool, out.path(), &catalog, "test", true, false, false)
            .await
            .unwrap();

    assert!(report.changes.is_empty(), "{:?}", report.changes);
    let meteo = std::fs::read_to_string(out.path().join("agents/meteo/agent.md")).unwrap();
    assert!(meteo.contains("rate_limit:"), "{meteo}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn apply_makes_the_database_match_the_folder_and_warns_on_zero_match(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let dir = repo_path("tests/fixtures/policies-typo");

    let strict =
        toolgate::policy::files::apply_dir(&pool, &dir, &catalog, "test", false, true, false).await;
    assert!(strict.is_err(), "--strict applied a zero-match grant");

    let report =
        toolgate::policy::files::apply_dir(&pool, &dir, &catalog, "test", false, false, false)
            .await
            .unwrap();
    let diff: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert!(
        diff.contains(&"+ grant assistant -> serch".to_owned()),
        "{diff:?}"
    );
    assert!(
        diff.contains(&"- grant assistant -> search".to_owned()),
        "{diff:?}"
    );
    assert!(
        report.warnings.iter().any(|w| w.message.contains("serch")),
        "{:?}",
        report.warnings
    );

    app.state.reload_policy().await.unwrap();
    let agent = app.admin("GET", "/api/v1/agents/assistant", None).await;
    assert_eq!(agent.body["agent"]["grants"][0]["target"], "serch");
    assert_eq!(agent.body["agent"]["grants"][0]["matched_tools"], 0);
    assert_eq!(agent.body["agent"]["grants"][0]["suggestions"][0], "search");
    let metrics = app.get("/metrics", None).await;
    assert!(
        metrics.text.contains("toolgate_zero_match_grants 1"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.text.contains("toolgate_agents_without_tools 1"),
        "{}",
        metrics.text
    );

    let changes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE event_type = 'admin.change' AND admin_user = 'test' AND details::jsonb->>'action' = 'grant.create' AND resource = 'agent:assistant/grant:serch'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(changes >= 1, "grant changes were not recorded");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn apply_refuses_invalid_grants_and_limits_with_file_and_line(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let agent_dir = dir.path().join("policies/agents/intruder");
    std::fs::create_dir_all(&agent_dir).unwrap();
    std::fs::write(
        agent_dir.join("agent.md"),
        "---\ndescription: tries what the database refuses\ntools:\n  - search\n  - \"weather current\"\n  - \"../etc\"\nrate_limit: {per_second: 0, burst: 1}\ntool_limits:\n  \"se arch\": {per_second: 1, burst: 3000000000}\n---\nBody.\n",
    )
    .unwrap();
    let policies = dir.path().join("policies");
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events")
        .fetch_one(&pool)
        .await
        .unwrap();

    let err = toolgate::policy::files::apply_dir(
        &pool,
        &policies,
        &app.state.policy.catalog(),
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap_err();
    let toolgate::policy::files::ApplyError::Invalid(problems) = &err else {
        panic!("not refused as invalid: {err}");
    };
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let file = "policies/agents/intruder/agent.md";
    for expected in [
        format!("{file}:5: `weather current` is not a valid group name"),
        format!("{file}:6: `../etc` is not a valid group name"),
        format!("{file}:7: `rate_limit`: per_second must be a number above 0"),
        format!("{file}:9: `se arch` in tool_limits is not a group or tool name"),
        format!("{file}:9: `se arch`: burst must be a whole number from 1 to 1000000"),
    ] {
        assert!(
            shown.iter().any(|s| s.starts_with(&expected)),
            "missing {expected:?} in {shown:#?}"
        );
    }
    let agents: i64 = sqlx::query_scalar("SELECT count(*) FROM agents WHERE name = 'intruder'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(agents, 0, "an invalid folder was partly applied");
    assert_eq!(before, after, "an invalid folder left admin changes");

    // The command line says the same, and no raw database error.
    let o = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "apply", "--database-url", &url, "--dir"])
        .arg(&policies)
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{file}:5:")), "{stderr}");
    assert!(!stderr.contains("constraint"), "{stderr}");

    // `policy check` reports them as well.
    let check = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(&policies)
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success());
    assert!(
        stdout.contains(&format!("{file}:9: `se arch`: burst must be")),
        "{stdout}"
    );
}

#[test]
fn policy_check_locates_each_bad_rate_by_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let agent_dir = dir.path().join("policies/agents/rates");
    std::fs::create_dir_all(&agent_dir).unwrap();
    std::fs::write(
        agent_dir.join("agent.md"),
        "---\ntools: [weather__current]\nrate_limit: {per_second: 1, per_minute: 60}\ntool_limits:\n  search: {per_hour: .nan}\n  weather: {per_second: -2}\n  weather__forecast: {per_minute: 30, burst: 0}\n---\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(dir.path().join("policies"))
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let file = "policies/agents/rates/agent.md";
    for expected in [
        format!(
            "{file}:3: `rate_limit`: give only one of per_second, per_minute or per_hour, not per_second and per_minute"
        ),
        format!("{file}:5: `search`: per_hour must be a number above 0, not NaN"),
        format!("{file}:6: `weather`: per_second must be a number above 0, not -2"),
        format!(
            "{file}:7: `weather__forecast`: burst must be a whole number from 1 to 1000000, not 0"
        ),
    ] {
        assert!(
            stdout.contains(&expected),
            "missing {expected:?} in {stdout}"
        );
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn fractional_limits_keep_their_written_form_through_api_export_and_apply(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let limits = serde_json::json!({"rate_limits": [
        {"pattern": null, "per_minute": 1.5},
        {"pattern": "weather", "per_hour": 100, "burst": 10},
        {"pattern": "weather__current", "per_second": 0.2, "burst": 1},
    ]});
    let put = app
        .admin(
            "PUT",
            "/api/v1/agents/meteo/rate-limits",
            Some(limits.clone()),
        )
        .await;
    assert_eq!(put.status, http::StatusCode::OK, "{}", put.text);
    assert_eq!(
        put.body, limits,
        "the API shows a limit other than as written"
    );
    let got = app
        .admin("GET", "/api/v1/agents/meteo/rate-limits", None)
        .await;
    assert_eq!(got.body, limits);

    for bad in [
        serde_json::json!({"per_second": 1, "per_minute": 60}),
        serde_json::json!({"per_second": 0}),
        serde_json::json!({"per_hour": -1}),
        serde_json::json!({"per_second": 1, "burst": 0}),
        serde_json::json!({"burst": 3}),
    ] {
        let r = app
            .admin(
                "PUT",
                "/api/v1/agents/meteo/rate-limits",
                Some(serde_json::json!({"rate_limits": [bad]})),
            )
            .await;
        assert!(r.status.is_client_error(), "{bad} accepted: {}", r.text);
        assert!(
            r.text.contains("per_") || r.text.contains("burst"),
            "{bad}: no reason given: {}",
            r.text
        );
    }

    let out = tempfile::tempdir().unwrap();
    toolgate::policy::files::export(&pool, out.path())
        .await
        .unwrap();
    let meteo = std::fs::read_to_string(out.path().join("agents/meteo/agent.md")).unwrap();
    assert!(meteo.contains("per_minute: 1.5"), "{meteo}");
    assert!(meteo.contains("per_hour: 100\n"), "{meteo}");
    assert!(meteo.contains("per_second: 0.2"), "{meteo}");
    let report = toolgate::policy::files::apply_dir(
        &pool,
        out.path(),
        &app.state.policy.catalog(),
        "test",
        true,
        false,
        false,
    )
    .await
    .unwrap();
    assert!(report.changes.is_empty(), "{:?}", report.changes);
}

/// Changes agent `x`'s description with the triggers off: no notification is sent.
async fn edit_unannounced(pool: &PgPool, description: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE agents SET description = $1 WHERE name = 'x'")
        .bind(description)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn description(app: &TestApp, agent: &str) -> Option<String> {
    let snapshot = app.state.policy.load();
    snapshot.agent(agent).map(|a| a.record.description.clone())
}

/// A notification re-reads what it names and nothing else: a new client on another instance
/// reaches this one without re-reading every agent (at 10,000 agents that read was most of the
/// wait before a new client's token was accepted), and a table it does not know re-reads all.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_notification_re_reads_only_the_parts_it_names(pool: PgPool) {
    use std::time::Duration;
    use toolgate::policy::snapshot::Parts;

    // Every table that notifies maps to the parts it feeds, none to "everything".
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT c.relname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_proc p ON p.oid = t.tgfoid WHERE p.proname = 'toolgate_notify_policy'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(tables.len() >= 12, "{tables:?}");
    for table in &tables {
        assert_ne!(Parts::of_table(table), Parts::ALL, "{table} is not mapped");
    }

    let a = TestApp::with(pool.clone(), &repo_path("tools"), None, &[]).await;
    let b = TestApp::with(pool.clone(), &repo_path("tools"), None, &[]).await;
    toolgate::state::spawn_policy_listener(b.state.clone());
    a.agent("x", &["weather"]).await;
    until(Duration::from_secs(5), "B sees the agent", || async {
        description(&b, "x").is_some()
    })
    .await;
    // The listener is up (it delivered the agent); settle anything still in flight from that
    // change before the agent is edited behind the triggers' back.
    b.state.reload_policy().await.unwrap();
    edit_unannounced(&pool, "edited unannounced").await;

    // A client created on A: B accepts its token once B re-read the clients...
    let (id, secret) = a.client_for("x").await;
    let token = a.token_with(&id, &secret).await;
    until(
        Duration::from_secs(5),
        "B accepts the new client's token",
        || async {
            b.mcp(Some(&token), "tools/list", serde_json::json!({}))
                .await
                .status
                == 200
        },
    )
    .await;
    // ...and did not re-read the agents to get there.
    assert_eq!(description(&b, "x").as_deref(), Some(""));

    // A notification naming the agents re-reads them; so does one naming no known table.
    sqlx::query("SELECT pg_notify('toolgate_policy', 'agents')")
        .execute(&pool)
        .await
        .unwrap();
    until(Duration::from_secs(5), "B re-reads the agents", || async {
        description(&b, "x").as_deref() == Some("edited unannounced")
    })
    .await;
    sqlx::query("UPDATE agents SET description = 'second edit' WHERE name = 'x'")
        .execute(&pool)
        .await
        .unwrap();
    until(Duration::from_secs(5), "B follows a plain edit", || async {
        description(&b, "x").as_deref() == Some("second edit")
    })
    .await;
    edit_unannounced(&pool, "third edit").await;
    sqlx::query("SELECT pg_notify('toolgate_policy', 'a_table_of_a_newer_version')")
        .execute(&pool)
        .await
        .unwrap();
    until(
        Duration::from_secs(5),
        "an unknown table re-reads everything",
        || async { description(&b, "x").as_deref() == Some("third edit") },
    )
    .await;
}

/// A client made through one instance for an agent made a moment ago through another, before
/// any notification arrived: its first token carries the agent's grants, not none.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_client_made_on_another_instance_than_its_agent_gets_the_agents_grants(pool: PgPool) {
    // Neither instance listens: only what each request re-reads is known to it.
    let a = TestApp::with(pool.clone(), &repo_path("tools"), None, &[]).await;
    let b = TestApp::with(pool.clone(), &repo_path("tools"), None, &[]).await;
    a.agent("x", &["weather"]).await;
    let (id, secret) = b.client_for("x").await;
    let token = b.token_with(&id, &secret).await;
    let names = b.tool_names(&token).await;
    assert!(
        !names.is_empty() && names.iter().all(|n| n.starts_with("weather__")),
        "{names:?}"
    );
}

/// Copies the shipped policies into a folder the test may edit.
fn editable_policies() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for agent in ["assistant", "meteo"] {
        let to = dir.path().join("agents").join(agent);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(
            repo_path(&format!("policies/agents/{agent}/agent.md")),
            to.join("agent.md"),
        )
        .unwrap();
    }
    dir
}

/// A live host authorization of `username` for `agent`.
async fn authorize(pool: &PgPool, agent: &str, username: &str) {
    let mut conn = pool.acquire().await.unwrap();
    let created = toolgate::db::authorizations::create(
        &mut conn,
        "test",
        &toolgate::db::authorizations::NewAuthorization {
            id: uuid::Uuid::new_v4(),
            client_id: "test-host",
            client_name: "Test host",
            agent,
            username,
            scope: "tools",
            code_hash: &uuid::Uuid::new_v4().simple().to_string(),
            redirect_uri: "http://127.0.0.1:9/callback",
            code_challenge: "challenge",
            resource: "http://127.0.0.1:8787/mcp",
            code_expires: chrono::Utc::now() + chrono::Duration::minutes(5),
        },
    )
    .await
    .unwrap();
    assert!(created, "the authorization was not created");
}

async fn live_authorizations(pool: &PgPool, username: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM oauth_authorizations WHERE username = $1 AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(username)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn lines<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn policy_apply_keeps_what_the_ui_added_unless_pruned(pool: PgPool) {
    // The shipped policies were applied (and recorded) by the test app's start.
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let dir = editable_policies();
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(serde_json::json!({"target": "weather"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    let r = app
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    authorize(&pool, "assistant", "alice").await;
    let apply = |dry_run: bool, prune: bool| {
        toolgate::policy::files::apply_dir(
            &pool,
            dir.path(),
            &catalog,
            "test",
            dry_run,
            false,
            prune,
        )
    };
    let kept = vec![
        "kept grant assistant -> weather (added outside the files; --prune removes it)".to_owned(),
        "kept user assistant -> alice (added outside the files; --prune removes it, revoking 1 host authorization(s))".to_owned(),
    ];

    for dry_run in [true, false] {
        let report = apply(dry_run, false).await.unwrap();
        assert!(report.changes.is_empty(), "{:?}", report.changes);
        assert_eq!(lines(&report.kept), kept, "dry run: {dry_run}");
        assert!(report.revocations.is_empty(), "{:?}", report.revocations);
    }
    app.state.reload_policy().await.unwrap();
    let agent = app.admin("GET", "/api/v1/agents/assistant", None).await;
    let grants: Vec<&str> = agent.body["agent"]["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["target"].as_str().unwrap())
        .collect();
    assert!(grants.contains(&"weather"), "{grants:?}");
    let users = app
        .state
        .policy
        .load()
        .agent("assistant")
        .unwrap()
        .record
        .users
        .clone();
    assert_eq!(users, ["alice"]);
    assert_eq!(live_authorizations(&pool, "alice").await, 1);

    // The command line says the same, and exits 3: applied, but something was kept.
    let url = {
        let o = pool.connect_options();
        format!(
            "postgres://{}@{}:{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap()
        )
    };
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "apply", "--dry-run", "--dir"])
        .arg(dir.path())
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .args(["--database-url", &url])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains(&kept[0]) && stdout.contains(&kept[1]),
        "{stdout}"
    );

    let report = apply(true, true).await.unwrap();
    assert_eq!(
        lines(&report.revocations),
        ["would revoke 1 host authorization(s) of alice for assistant"]
    );
    assert_eq!(live_authorizations(&pool, "alice").await, 1);
    let report = apply(false, true).await.unwrap();
    let diff = lines(&report.changes);
    assert!(
        diff.contains(&"- grant assistant -> weather".to_owned()),
        "{diff:?}"
    );
    assert!(
        diff.contains(&"~ users assistant: [\"alice\"] -> []".to_owned()),
        "{diff:?}"
    );
    assert!(report.kept.is_empty(), "{:?}", report.kept);
    assert_eq!(
        lines(&report.revocations),
        ["revoked 1 host authorization(s) of alice for assistant"]
    );
    assert_eq!(live_authorizations(&pool, "alice").await, 0);
    app.state.reload_policy().await.unwrap();
    let record = app
        .state
        .policy
        .load()
        .agent("assistant")
        .unwrap()
        .record
        .clone();
    assert!(record.users.is_empty(), "{:?}", record.users);
    assert!(
        record.grants.iter().all(|g| g.target != "weather"),
        "{:?}",
        record.grants
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn policy_apply_removes_what_the_files_wrote_and_then_dropped(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let dir = editable_policies();
    let file = dir.path().join("agents/assistant/agent.md");
    let text = std::fs::read_to_string(&file).unwrap();
    let apply = || {
        toolgate::policy::files::apply_dir(&pool, dir.path(), &catalog, "test", false, false, false)
    };

    std::fs::write(
        &file,
        text.replace("tools: [search]", "tools: [search, weather]\nusers: [bob]"),
    )
    .unwrap();
    let report = apply().await.unwrap();
    assert!(
        lines(&report.changes).contains(&"+ grant assistant -> weather".to_owned()),
        "{:?}",
        report.changes
    );
    authorize(&pool, "assistant", "bob").await;

    // The lines deleted (as in git): the files wrote them, so they go without --prune.
    std::fs::write(&file, &text).unwrap();
    let report = apply().await.unwrap();
    let diff = lines(&report.changes);
    assert!(
        diff.contains(&"- grant assistant -> weather".to_owned()),
        "{diff:?}"
    );
    assert!(
        diff.contains(&"~ users assistant: [\"bob\"] -> []".to_owned()),
        "{diff:?}"
    );
    assert!(report.kept.is_empty(), "{:?}", report.kept);
    assert_eq!(
        lines(&report.revocations),
        ["revoked 1 host authorization(s) of bob for assistant"]
    );

    // An agent the files wrote and dropped goes; one added through the API is kept.
    let r = app
        .admin(
            "POST",
            "/api/v1/agents",
            Some(serde_json::json!({"name": "scratch"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    std::fs::remove_dir_all(dir.path().join("agents/meteo")).unwrap();
    let report = apply().await.unwrap();
    assert!(
        lines(&report.changes)
            .iter()
            .any(|c| c.starts_with("- agent meteo")),
        "{:?}",
        report.changes
    );
    assert_eq!(
        lines(&report.kept),
        ["kept agent scratch (added outside the files; --prune removes it)"]
    );
}

/// Marks an agent file of `dir` `managed: files` (a front-matter line after the opening `---`).
fn mark_managed(dir: &std::path::Path, agent: &str, value: &str) {
    let path = dir.join("agents").join(agent).join("agent.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replacen("---\n", &format!("---\nmanaged: {value}\n"), 1);
    std::fs::write(&path, text).unwrap();
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_managed_agent_is_read_only_in_the_ui_and_the_api(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let catalog = app.state.policy.catalog();
    let dir = editable_policies();
    mark_managed(dir.path(), "assistant", "files");
    let apply = || {
        toolgate::policy::files::apply_dir(&pool, dir.path(), &catalog, "test", false, false, false)
    };
    let report = apply().await.unwrap();
    assert_eq!(
        lines(&report.changes),
        ["~ agent assistant managed ui -> files"]
    );
    app.state.reload_policy().await.unwrap();
    let grants_before = app
        .state
        .policy
        .load()
        .agent("assistant")
        .unwrap()
        .record
        .grants
        .len();

    // Every change the API offers for an agent's policy is refused, saying where to make it.
    let said = "agent `assistant` is managed by files: edit policies/agents/assistant/agent.md and run `toolgate policy apply`";
    let attempts = [
        (
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "weather"})),
        ),
        ("DELETE", "/api/v1/agents/assistant/grants/search", None),
        ("PUT", "/api/v1/agents/assistant/users/alice", None),
        (
            "PUT",
            "/api/v1/agents/assistant/rate-limits",
            Some(json!({"rate_limits": [{"per_minute": 5}]})),
        ),
        (
            "PUT",
            "/api/v1/agents/assistant/arguments/search",
            Some(json!({"query": {"maxLength": 10}})),
        ),
        ("DELETE", "/api/v1/agents/assistant", None),
    ];
    for (method, uri, body) in attempts {
        let r = app.admin(method, uri, body).await;
        assert_eq!(
            r.status,
            http::StatusCode::CONFLICT,
            "{method} {uri}: {}",
            r.text
        );
        assert_eq!(r.body["error"], said, "{method} {uri}");
    }
    let snapshot = app.state.policy.load();
    let agent = snapshot.agent("assistant").unwrap();
    assert_eq!(agent.record.grants.len(), grants_before);
    assert!(agent.record.users.is_empty() && agent.record.limits.is_empty());
    // The API says it is managed; an agent not marked stays editable.
    let shown = app.admin("GET", "/api/v1/agents/assistant", None).await;
    assert_eq!(shown.body["agent"]["managed"], "files", "{}", shown.text);
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/meteo/grants",
            Some(json!({"target": "search"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    // A group's metadata likewise.
    std::fs::write(
        dir.path().join("groups.yaml"),
        "groups: {weather: {description: Forecasts, managed: files}}\n",
    )
    .unwrap();
    apply().await.unwrap();
    let r = app
        .admin(
            "PUT",
            "/api/v1/groups/weather/pin",
            Some(json!({"pin": true})),
        )
        .await;
    assert_eq!(r.status, http::StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(
        r.body["error"],
        "group `weather` is managed by files: edit policies/groups.yaml and run `toolgate policy apply`"
    );

    // The UI shows it read-only with where to edit it, and refuses a forged form.
    let mut b = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let page = b.get("/admin/agents/assistant").await.text;
    assert!(page.contains("data-managed=\"files\""), "{page}");
    assert!(
        page.contains("policies/agents/assistant/agent.md"),
        "{page}"
    );
    assert!(!page.contains("data-grant-form"), "{page}");
    assert!(!page.contains("/admin/agents/assistant/users\""), "{page}");
    assert!(!page.contains("Delete this agent"), "{page}");
    for (sub, save) in [("limits", "Save limits"), ("arguments", "Save rules")] {
        let page = b.get(&format!("/admin/agents/assistant/{sub}")).await.text;
        assert!(page.contains("data-managed=\"files\""), "{sub}: {page}");
        assert!(!page.contains(save), "{sub}: {page}");
    }
    let editable = b.get("/admin/agents/meteo").await.text;
    assert!(editable.contains("data-grant-form") && !editable.contains("data-managed"));
    let r = b
        .submit(
            "/admin/agents/meteo",
            "/admin/grants",
            &[
                ("agent", "assistant"),
                ("target", "weather"),
                ("action", "save"),
            ],
        )
        .await;
    assert_eq!(r.status, http::StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("is managed by files"), "{}", r.text);

    // Export writes the mark back; apply without it hands the agent back to the UI.
    let out = tempfile::tempdir().unwrap();
    toolgate::policy::files::export(&pool, out.path())
        .await
        .unwrap();
    let exported = std::fs::read_to_string(out.path().join("agents/assistant/agent.md")).unwrap();
    assert!(exported.contains("managed: files"), "{exported}");
    let path = dir.path().join("agents/assistant/agent.md");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("managed: files\n", "", 1)).unwrap();
    let report = apply().await.unwrap();
    assert_eq!(
        lines(&report.changes),
        ["~ agent assistant managed files -> ui"]
    );
    app.state.reload_policy().await.unwrap();
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "weather"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
}

#[test]
fn a_managed_value_other_than_files_is_a_located_problem() {
    let dir = editable_policies();
    mark_managed(dir.path(), "meteo", "git");
    let (_, problems) = toolgate::policy::files::read_dir(dir.path());
    let shown = lines(&problems);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(
        shown[0].contains("meteo/agent.md:2:")
            && shown[0].contains("unknown variant `git`, expected `files`"),
        "{shown:?}"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn policy_export_keeps_the_style_it_read(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let dir = editable_policies();
    let assistant = std::fs::read_to_string(dir.path().join("agents/assistant/agent.md")).unwrap();
    // A comment survives where nothing changed.
    let meteo_path = dir.path().join("agents/meteo/agent.md");
    let meteo = std::fs::read_to_string(&meteo_path).unwrap();
    let commented = assistant.replacen("---\n", "---\n# reviewed by the platform team\n", 1);
    std::fs::write(dir.path().join("agents/assistant/agent.md"), &commented).unwrap();
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/meteo/grants",
            Some(json!({"target": "search"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);

    toolgate::policy::files::export(&pool, dir.path())
        .await
        .unwrap();

    let after = std::fs::read_to_string(dir.path().join("agents/assistant/agent.md")).unwrap();
    assert_eq!(after, commented, "an unchanged agent's file was rewritten");
    let after = std::fs::read_to_string(&meteo_path).unwrap();
    assert_eq!(
        after,
        meteo.replace("tools: [weather]", "tools: [search, weather]"),
        "the changed file changed in more than its one line"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_dashboard_shows_drift_between_the_folder_and_the_database(pool: PgPool) {
    let dir = editable_policies();
    let folder = dir.path().to_str().unwrap();
    let app = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(dir.path()),
        &["--policies-dir", folder],
    )
    .await;
    let mut b = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let page = b.get("/admin").await.text;
    assert!(page.contains("data-drift=\"none\""), "{page}");

    // A grant added in the UI is drift that apply keeps; a file edited is drift apply makes.
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "weather"})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    let meteo = dir.path().join("agents/meteo/agent.md");
    let text = std::fs::read_to_string(&meteo).unwrap();
    std::fs::write(
        &meteo,
        text.replace("tools: [weather]", "tools: [weather, search]"),
    )
    .unwrap();
    let page = b.get("/admin").await.text;
    assert!(page.contains("data-drift=\"drifted\""), "{page}");
    assert!(
        page.contains(
            "kept grant assistant -&#62; weather (added outside the files; --prune removes it)"
        ),
        "{page}"
    );
    assert!(page.contains("+ grant meteo -&#62; search"), "{page}");

    // A folder that does not read is said so, not compared.
    std::fs::write(&meteo, "---\ntools: [weather\n---\n").unwrap();
    let page = b.get("/admin").await.text;
    assert!(page.contains("data-drift=\"unreadable\""), "{page}");
    assert!(page.contains("meteo/agent.md:"), "{page}");
}
