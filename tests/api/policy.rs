//! Policies as code: check, apply, export.

use std::process::Command;

use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};

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
        toolgate::policy::files::apply_dir(&pool, out.path(), &catalog, "test", true, false)
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
        toolgate::policy::files::apply_dir(&pool, &dir, &catalog, "test", false, true).await;
    assert!(strict.is_err(), "--strict applied a zero-match grant");

    let report = toolgate::policy::files::apply_dir(&pool, &dir, &catalog, "test", false, false)
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
