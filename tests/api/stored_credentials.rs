//! Credentials per agent, per person and shared: stored encrypted, write-only, handed to a
//! script as the slots its group declares, each caller its own value and nobody else's.

use std::path::Path;

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, single_op, write_group};

const GH_A: &str = "ghp_agent_a_secret_value_0001";
const GH_B: &str = "ghp_agent_b_secret_value_0002";
const SHARED: &str = "org-wide-secret-0003";

fn key(id: &str) -> String {
    toolgate::credentials::KeyRing::generate(id).unwrap()
}

/// `gh__whoami`: prints the token it was given (a tool that leaks what it gets, which the audit
/// log must still not hold), and `ORG`, a shared slot.
fn gh_group(root: &Path) {
    let mut doc = single_op(
        "whoami",
        json!({"type": "object"}),
        json!({"summary": "Who the upstream thinks we are"}),
    );
    doc["x-toolgate-credentials"] = json!({
        "GH_TOKEN": {"per": "agent", "inject": "env"},
        "ORG": {"per": "shared"}
    });
    doc["x-toolgate-audit"] = json!({"store_results": true});
    write_group(
        root,
        "gh",
        &doc,
        &[(
            "whoami.sh",
            "#!/bin/sh\ncat >/dev/null\necho \"token in stderr: $GH_TOKEN\" >&2\nprintf '{\"token\":\"%s\",\"org\":\"%s\"}' \"$GH_TOKEN\" \"$ORG\"\n",
        )],
    );
}

async fn app_with(pool: PgPool, dir: &Path, keys: &str) -> TestApp {
    TestApp::with(
        pool,
        dir,
        None,
        &["--script-sandbox", "off", "--credential-key", keys],
    )
    .await
}

async fn put(app: &TestApp, path: &str, value: &str) -> crate::helpers::Reply {
    app.admin("PUT", path, Some(json!({"value": value}))).await
}

async fn everything_on_record(pool: &PgPool) -> String {
    sqlx::query_scalar::<_, Option<String>>("SELECT string_agg(e::text, '\n') FROM audit_events e")
        .fetch_one(pool)
        .await
        .unwrap()
        .unwrap_or_default()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn each_agent_gets_its_own_value_and_nobody_sees_one_again(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    gh_group(dir.path());
    let app = app_with(pool.clone(), dir.path(), &key("k1")).await;
    let a = app.agent("a", &["gh"]).await;
    let b = app.agent("b", &["gh"]).await;
    let c = app.agent("c", &["gh"]).await;
    assert_eq!(
        put(&app, "/api/v1/agents/a/credentials/gh/GH_TOKEN", GH_A)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        put(&app, "/api/v1/agents/b/credentials/gh/GH_TOKEN", GH_B)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        put(&app, "/api/v1/credentials/gh/ORG", SHARED).await.status,
        StatusCode::OK
    );

    // An agent that cannot fill its tools' slots is flagged, like a zero-match grant.
    let shown = app.admin("GET", "/api/v1/agents/c", None).await;
    let flags = shown.body["agent"]["credential_problems"].to_string();
    assert!(
        flags.contains("GH_TOKEN") && flags.contains("/api/v1/agents/c/credentials/gh/GH_TOKEN"),
        "{}",
        shown.text
    );
    let shown = app.admin("GET", "/api/v1/agents/a", None).await;
    assert_eq!(
        shown.body["agent"]["credential_problems"],
        json!([]),
        "{}",
        shown.text
    );
    let mut ada = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let page = ada.get("/admin/agents/c").await;
    assert!(
        page.text.contains("data-problem=\"credential\""),
        "{}",
        page.text
    );

    // REST and MCP: each agent's script sees its own value, and the shared one.
    let r = app.post_json("/tools/gh/whoami", Some(&a), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body, json!({"token": GH_A, "org": SHARED}));
    let r = app.call(&b, "gh__whoami", json!({})).await;
    assert_eq!(
        r.body["result"]["structuredContent"],
        json!({"token": GH_B, "org": SHARED}),
        "{}",
        r.text
    );

    // No value for c: a clear error naming the slot and how to fill it, over REST and MCP.
    let r = app.post_json("/tools/gh/whoami", Some(&c), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let said = r.body["error"].as_str().unwrap();
    assert!(said.contains("`GH_TOKEN`"), "{said}");
    assert!(
        said.contains("PUT /api/v1/agents/c/credentials/gh/GH_TOKEN"),
        "{said}"
    );
    let r = app.call(&c, "gh__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert!(r.text.contains("GH_TOKEN"), "{}", r.text);

    // Write-only: the list names them, never a value; a bad body is not echoed.
    let listed = app.admin("GET", "/api/v1/agents/a/credentials", None).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.body["credentials"][0]["name"], "GH_TOKEN");
    assert!(!listed.text.contains(GH_A), "{}", listed.text);
    let bad = app
        .admin(
            "PUT",
            "/api/v1/agents/a/credentials/gh/GH_TOKEN",
            Some(json!({"valu": "ghp_typo_secret"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(!bad.text.contains("ghp_typo_secret"), "{}", bad.text);
    let bad = app
        .admin(
            "PUT",
            "/api/v1/agents/a/credentials/gh/PATH",
            Some(json!({"value": "x"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    let nobody = put(&app, "/api/v1/agents/ghost/credentials/gh/GH_TOKEN", "x").await;
    assert_eq!(nobody.status, StatusCode::NOT_FOUND);

    // Not in the database in the clear, and not in the audit log, though the script printed
    // the token to stdout (results are kept for this group) and stderr.
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT ciphertext FROM credentials")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(stored.len(), 3);
    for c in &stored {
        assert!(
            !c.windows(8)
                .any(|w| w == &GH_A.as_bytes()[..8] || w == &GH_B.as_bytes()[..8])
        );
    }
    let record = everything_on_record(&pool).await;
    for secret in [GH_A, GH_B, SHARED] {
        assert!(!record.contains(secret), "{secret} is in the audit log");
    }
    assert!(
        record.contains("credential.set"),
        "the changes are on record"
    );
    // Each run names the slots and whose values it used.
    let used: Vec<String> = sqlx::query_scalar(
        "SELECT details FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started' AND agent = 'a'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let details: Value = serde_json::from_str(&used[0]).unwrap();
    assert_eq!(
        details["credentials"],
        json!([{"slot": "GH_TOKEN", "per": "agent", "owner": "a"}, {"slot": "ORG", "per": "shared", "owner": ""}]),
        "{details}"
    );

    // Deleted: the next call says so.
    let gone = app
        .admin("DELETE", "/api/v1/agents/a/credentials/gh/GH_TOKEN", None)
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let r = app.post_json("/tools/gh/whoami", Some(&a), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_value_moved_to_another_agents_row_in_the_database_does_not_open(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    gh_group(dir.path());
    let app = app_with(pool.clone(), dir.path(), &key("k1")).await;
    let a = app.agent("a", &["gh"]).await;
    app.agent("b", &["gh"]).await;
    put(&app, "/api/v1/agents/a/credentials/gh/GH_TOKEN", GH_A).await;
    put(&app, "/api/v1/agents/b/credentials/gh/GH_TOKEN", GH_B).await;
    put(&app, "/api/v1/credentials/gh/ORG", SHARED).await;
    // A database user copies b's sealed token onto a's row.
    sqlx::query(
        "UPDATE credentials SET wrapped_key = b.wrapped_key, ciphertext = b.ciphertext
         FROM credentials b
         WHERE credentials.owner = 'a' AND b.owner = 'b' AND b.name = 'GH_TOKEN' AND credentials.name = 'GH_TOKEN'",
    )
    .execute(&pool)
    .await
    .unwrap();
    app.state.reload_policy().await.unwrap();
    let r = app.post_json("/tools/gh/whoami", Some(&a), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("cannot be used"), "{}", r.text);
    assert!(!r.text.contains(GH_B), "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_new_key_is_rolled_out_under_load_without_losing_a_value_or_a_call(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    gh_group(dir.path());
    let old = key("old");
    let new = key("new");
    let before = app_with(pool.clone(), dir.path(), &old).await;
    let mut tokens = Vec::new();
    for i in 0..20 {
        let name = format!("agent{i}");
        tokens.push((
            before.agent(&name, &["gh"]).await,
            format!("secret-of-{name}"),
        ));
        put(
            &before,
            &format!("/api/v1/agents/{name}/credentials/gh/GH_TOKEN"),
            &format!("secret-of-{name}"),
        )
        .await;
    }
    put(&before, "/api/v1/credentials/gh/ORG", SHARED).await;

    // Instances restarted with the new key first and the old one still given.
    let both = format!("{new},{old}");
    let app = app_with(pool.clone(), dir.path(), &both).await;
    let ring = toolgate::credentials::KeyRing::parse(&[new.clone(), old.clone()]).unwrap();
    let calls = async {
        let mut failures = Vec::new();
        for round in 0..3 {
            let replies = futures::future::join_all(
                tokens
                    .iter()
                    .map(|(t, _)| app.post_json("/tools/gh/whoami", Some(t), json!({}))),
            )
            .await;
            for (r, (_, want)) in replies.iter().zip(&tokens) {
                if r.status != StatusCode::OK || r.body["token"] != *want {
                    failures.push(format!("round {round}: {} {}", r.status, r.text));
                }
            }
        }
        failures
    };
    let rotate = toolgate::service::credentials::rotate_kek(&pool, &ring, "test");
    let (failures, rotated) = tokio::join!(calls, rotate);
    let rotated = rotated.unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(rotated.rewrapped + rotated.raced, 21, "{rotated:?}");
    let kinds: Vec<String> = sqlx::query_scalar("SELECT DISTINCT kek_id FROM credentials")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(kinds, ["new"]);

    // The old key can now be dropped: an instance given only the new one opens every value.
    let after = app_with(pool.clone(), dir.path(), &new).await;
    for (t, want) in &tokens {
        let r = after
            .post_json("/tools/gh/whoami", Some(t), json!({}))
            .await;
        assert_eq!(r.body["token"], *want, "{}", r.text);
    }
    assert!(
        everything_on_record(&pool)
            .await
            .contains("credential.rekey")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn without_a_key_nothing_is_stored_and_the_call_says_why(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    gh_group(dir.path());
    let app = TestApp::with(pool, dir.path(), None, &["--script-sandbox", "off"]).await;
    let a = app.agent("a", &["gh"]).await;
    let r = put(&app, "/api/v1/agents/a/credentials/gh/GH_TOKEN", GH_A).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("--credential-key"), "{}", r.text);
    let r = app.post_json("/tools/gh/whoami", Some(&a), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let _: &Value = &r.body;
}

/// The cost of a call that uses a stored credential (opened for the call: two AES-GCM opens)
/// next to the same script with a value of its own (no slot), interleaved in one run. A benchmark, not a timed test:
/// `cargo nextest run --run-ignored only -E 'test(credential_call_cost)' --no-capture`.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on its own"]
async fn credential_call_cost(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    // The same script either way; without the slot it uses a value of its own.
    let script = "#!/bin/sh\ncat >/dev/null\nTOKEN=${TOKEN:-static-token-value}\nprintf '{\"n\":%s}' \"${#TOKEN}\"\n";
    let mut stored = single_op("run", json!({"type": "object"}), json!({}));
    stored["x-toolgate-credentials"] = json!({"TOKEN": {"per": "agent"}});
    write_group(dir.path(), "stored", &stored, &[("run.sh", script)]);
    let fixed = single_op("run", json!({"type": "object"}), json!({}));
    write_group(dir.path(), "fixed", &fixed, &[("run.sh", script)]);
    let app = app_with(pool, dir.path(), &key("k1")).await;
    let t = app.agent("bench", &["stored", "fixed"]).await;
    put(
        &app,
        "/api/v1/agents/bench/credentials/stored/TOKEN",
        "stored-token-value",
    )
    .await;
    let (s50, f50) = crate::helpers::interleaved_p50(
        &app,
        &t,
        ["/tools/stored/run", "/tools/fixed/run"],
        420,
        |r| {
            assert_eq!(r.body["n"], 18, "{}", r.text);
        },
    )
    .await;
    println!(
        "call p50: stored per-agent credential {s50:.0} µs, same script without a slot {f50:.0} µs; ratio {:.3}",
        s50 / f50
    );
}
