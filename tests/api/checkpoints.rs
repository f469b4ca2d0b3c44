//! The newest audit rows are signed too: a serving instance signs a checkpoint within seconds
//! of rows arriving (and none while nothing arrives), and `verify --public-key` names the rows
//! no checkpoint covers yet, so that deleting them is at least visible as a shrinking tail.
//!
//! The attacker is the database owner: they delete the newest rows and rewrite the chain
//! heads to match, which the hash chain alone cannot show.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::audit::{cli, disable_row_triggers, exec, verify_db};
use crate::drain::start;
use crate::helpers::TestApp;

/// A new key pair from `toolgate audit keygen`: (private, public).
async fn keygen(pool: &PgPool, dir: &Path) -> (PathBuf, PathBuf) {
    let key = dir.join("checkpoint.key");
    let out = cli(pool, &["keygen", "--out", key.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (key.clone(), dir.join("checkpoint.key.pub"))
}

/// The instance chain's recorded head: (chain, last_seq, last_hash).
async fn instance_head(pool: &PgPool) -> (String, i64, String) {
    sqlx::query_as(
        "SELECT chain, last_seq, last_hash FROM audit_chain_heads WHERE chain <> 'control-plane'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The id of a stored checkpoint that signed exactly this row of `chain`, if one did.
async fn covering(pool: &PgPool, chain: &str, seq: i64, hash: &str) -> Option<i64> {
    let stored: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, body FROM audit_checkpoints ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    stored.into_iter().find_map(|(id, body)| {
        let body: Value = serde_json::from_str(&body).unwrap();
        body["heads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["chain"] == chain && h["last_seq"] == seq && h["last_hash"] == hash)
            .then_some(id)
    })
}

async fn checkpoint_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_checkpoints")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What the database owner does: the rows of `chain` after `keep` are deleted and the head is
/// rewritten to end at `keep`, as if they had never been written.
async fn truncate_after(pool: &PgPool, chain: &str, keep: i64) {
    disable_row_triggers(pool).await;
    sqlx::query("DELETE FROM audit_events WHERE chain = $1 AND chain_seq > $2")
        .bind(chain)
        .bind(keep)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE audit_chain_heads h SET last_seq = $2,
             last_hash = (SELECT hash FROM audit_events WHERE chain = $1 AND chain_seq = $2),
             row_count = (SELECT count(*) FROM audit_events WHERE chain = $1)
         WHERE chain = $1",
    )
    .bind(chain)
    .bind(keep)
    .execute(pool)
    .await
    .unwrap();
}

/// With the default interval, the last row a serving instance wrote is covered by a signed
/// checkpoint within seconds; deleting it (heads rewritten, the stored checkpoints deleted
/// too, a copy kept elsewhere) fails verify.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rows_of_a_serving_instance_are_signed_within_seconds_so_their_truncation_is_caught(
    pool: PgPool,
) {
    let root = tempfile::tempdir().unwrap();
    let (key, public) = keygen(&pool, root.path()).await;
    let server = start(
        &pool,
        root.path(),
        &["--audit-checkpoint-key", key.to_str().unwrap()],
    )
    .await;
    std::fs::write(root.path().join("sync/release"), b"").unwrap();
    let token = server.token().await;
    for _ in 0..3 {
        let (status, body) = server.call(&token).await.unwrap().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let (chain, last, hash) = instance_head(&pool).await;

    // Polled: the event is a row another process inserts.
    let wrote = Instant::now();
    let signed = loop {
        if let Some(id) = covering(&pool, &chain, last, &hash).await {
            break id;
        }
        assert!(
            wrote.elapsed() < Duration::from_secs(20),
            "no checkpoint covered row {last} of {chain} within 20 s: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = wrote.elapsed();
    assert!(took < Duration::from_secs(12), "signed after {took:?}");
    let kept = root.path().join("checkpoints.jsonl");
    std::fs::write(&kept, cli(&pool, &["checkpoints"]).await.stdout).unwrap();
    // A copy kept elsewhere is extended with what came after its last line.
    let newer = cli(
        &pool,
        &["checkpoints", "--after", &(signed - 1).to_string()],
    )
    .await;
    let ids: Vec<i64> = String::from_utf8(newer.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids.first(), Some(&signed), "{ids:?}");
    let mut child = server.child;
    child.kill().await.unwrap();

    let pk = ["--public-key", public.to_str().unwrap()];
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(ok, "{out}");
    assert!(out.contains("unsigned tail: none"), "{out}");

    truncate_after(&pool, &chain, last - 2).await;
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(!ok, "the truncation passed: {out}");
    assert!(
        out.contains(&format!(
            "chain {chain}: row {last}, signed by checkpoint #{signed}, is missing"
        )),
        "{out}"
    );
    // The owner removes the stored checkpoints as well; the copy kept elsewhere still tells.
    exec(&pool, "ALTER TABLE audit_checkpoints DISABLE TRIGGER USER")
        .await
        .unwrap();
    exec(&pool, "DELETE FROM audit_checkpoints").await.unwrap();
    let (ok, out) = verify_db(
        &pool,
        &[&pk[..], &["--checkpoints", kept.to_str().unwrap()]].concat(),
    )
    .await;
    assert!(!ok, "the truncation passed: {out}");
    assert!(
        out.contains(&format!("chain {chain}: row {last}, signed by")),
        "{out}"
    );
}

/// No row, no checkpoint: an idle instance adds nothing to the table; the next row is
/// signed in a checkpoint that lists only the chain that moved.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn nothing_is_signed_while_no_row_arrives(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let (key, _) = keygen(&pool, root.path()).await;
    let server = start(
        &pool,
        root.path(),
        &[
            "--audit-checkpoint-key",
            key.to_str().unwrap(),
            "--audit-checkpoint-secs",
            "1",
        ],
    )
    .await;
    std::fs::write(root.path().join("sync/release"), b"").unwrap();
    let token = server.token().await;
    let (status, _) = server.call(&token).await.unwrap().unwrap();
    assert_eq!(status, 200);
    let (chain, last, hash) = instance_head(&pool).await;
    let until = Instant::now() + Duration::from_secs(20);
    while covering(&pool, &chain, last, &hash).await.is_none() {
        assert!(Instant::now() < until, "never signed: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // An absence can only be seen over a window: three intervals with nothing written.
    let before = checkpoint_count(&pool).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        checkpoint_count(&pool).await,
        before,
        "checkpoints were signed while no row arrived"
    );

    let (status, _) = server.call(&token).await.unwrap().unwrap();
    assert_eq!(status, 200);
    let (_, last, hash) = instance_head(&pool).await;
    let until = Instant::now() + Duration::from_secs(20);
    let id = loop {
        if let Some(id) = covering(&pool, &chain, last, &hash).await {
            break id;
        }
        assert!(Instant::now() < until, "never signed: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let body: String = sqlx::query_scalar("SELECT body FROM audit_checkpoints WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&body).unwrap();
    let chains: Vec<&str> = body["heads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["chain"].as_str().unwrap())
        .collect();
    assert_eq!(chains, [chain.as_str()], "{body}");
}

/// Rows past the newest checkpoint cannot be vouched for; verify says how many and since
/// when, and a truncation among them shows as a shorter tail from the same time.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rows_past_the_newest_checkpoint_are_reported_as_an_unsigned_tail(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let token = app.token_for("meteo").await;
    app.call(&token, "weather__current", json!({"city": "Oslo"}))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(&pool, dir.path()).await;
    let out = cli(&pool, &["checkpoint", "--key", key.to_str().unwrap()]).await;
    assert!(out.status.success());
    let pk = ["--public-key", public.to_str().unwrap()];
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(ok && out.contains("unsigned tail: none"), "{out}");

    // Two calls after the checkpoint: four rows (started, result) no checkpoint covers.
    let (chain, signed, _) = instance_head(&pool).await;
    for city in ["Paris", "Lima"] {
        app.call(&token, "weather__current", json!({"city": city}))
            .await;
    }
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT at FROM audit_events WHERE chain = $1 AND chain_seq = $2")
            .bind(&chain)
            .bind(signed + 1)
            .fetch_one(&pool)
            .await
            .unwrap();
    let since = first.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("unsigned tail: 4 rows since {since}")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "chain {chain}: 4 rows, {} to {}, since {since} (signed through row {signed})",
            signed + 1,
            signed + 4
        )),
        "{out}"
    );

    // The owner deletes the last two and rewrites the head: the chain still verifies (nothing
    // signed is missing), but the tail that is left starts at the same time and is shorter.
    truncate_after(&pool, &chain, signed + 2).await;
    let (ok, out) = verify_db(&pool, &pk).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("unsigned tail: 2 rows since {since}")),
        "{out}"
    );
}
