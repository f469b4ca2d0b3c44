//! Graceful drain of a real `toolgate serve` at SIGTERM: readiness drops at once, calls in
//! flight finish with their full answer and both audit rows, and the process exits within
//! its drain deadline. Synchronised on events: each script call leaves a marker file when it
//! starts and waits for a release file the test writes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{single_op, write_group};

const ADMIN_TOKEN: &str = "drain-admin-token";

pub(crate) struct Server {
    pub(crate) child: tokio::process::Child,
    base: String,
    logs: tempfile::NamedTempFile,
    http: reqwest::Client,
}

/// A tools folder with `slow__wait`, which marks its start in `sync` and waits for
/// `sync/release`; a policies folder granting it to the agent `drainer`.
fn fixture(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let tools = root.join("tools");
    let policies = root.join("policies");
    let sync = root.join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    let script = format!(
        "#!/bin/sh\nPATH=/usr/bin:/bin\ncat >/dev/null\ntouch '{dir}/started.'$$\n\
         while [ ! -e '{dir}/release' ]; do sleep 0.02; done\necho '{{\"done\": true}}'\n",
        dir = sync.display()
    );
    write_group(
        &tools,
        "slow",
        &single_op("wait", json!({"type": "object"}), json!({})),
        &[("wait", &script)],
    );
    let agent = policies.join("agents/drainer");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("agent.md"),
        "---\ndescription: Waits.\ntools: [slow]\n---\n",
    )
    .unwrap();
    (tools, policies, sync)
}

fn database_url(pool: &PgPool) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap()
    )
}

pub(crate) async fn start(pool: &PgPool, root: &Path, drain: &[&str]) -> Server {
    let (tools, policies, _) = fixture(root);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let logs = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"));
    cmd.args(["serve", "--database-url", &database_url(pool)])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .arg("--tools-dir")
        .arg(&tools)
        .arg("--policies-dir")
        .arg(&policies)
        .args(["--admin-token", ADMIN_TOKEN])
        // Confinement is not what is tested, and the scripts reach the test's folder.
        .args(["--script-sandbox", "off"])
        .args(["--script-timeout-ms", "60000"])
        .args(drain)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(logs.reopen().unwrap())
        .kill_on_drop(true);
    let child = cmd.spawn().unwrap();
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
        logs,
        http: reqwest::Client::new(),
    };
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = server.http.get(server.url("/readyz")).send().await
            && r.status() == 200
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "serve did not start: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path()).unwrap_or_default()
    }

    pub(crate) async fn token(&self) -> String {
        let r: Value = self
            .http
            .post(self.url("/api/v1/agents/drainer/clients"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let (id, secret) = (
            r["client_id"].as_str().unwrap(),
            r["client_secret"].as_str().unwrap(),
        );
        let t: Value = self
            .http
            .post(self.url("/oauth/token"))
            .basic_auth(id, Some(secret))
            .form(&[("grant_type", "client_credentials")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        t["access_token"].as_str().unwrap().to_owned()
    }

    /// One call of `slow__wait` on its own connection; its status and whole body.
    pub(crate) fn call(
        &self,
        token: &str,
    ) -> tokio::task::JoinHandle<Result<(u16, String), String>> {
        let url = self.url("/tools/slow/wait");
        let token = token.to_owned();
        tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let r = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({}))
                .send()
                .await
                .map_err(|e| format!("{e:?}"))?;
            let status = r.status().as_u16();
            let body = r.text().await.map_err(|e| format!("{e:?}"))?;
            Ok((status, body))
        })
    }

    async fn readyz(&self) -> Option<u16> {
        self.http
            .get(self.url("/readyz"))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    pub(crate) fn sigterm(&self) {
        kill(
            Pid::from_raw(self.child.id().unwrap() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
    }
}

fn started_calls(sync: &Path) -> usize {
    std::fs::read_dir(sync)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("started."))
        })
        .count()
}

async fn wait_for(what: &str, server: &Server, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn sigterm_drains_calls_in_flight_with_their_answers_and_audit_rows(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let sync = root.path().join("sync");
    let server = start(
        &pool,
        root.path(),
        // A grace long enough for a loaded machine to accept the call sent during it.
        &["--drain-timeout-secs", "30", "--drain-grace-secs", "8"],
    )
    .await;
    let token = server.token().await;

    let mut calls: Vec<_> = (0..4).map(|_| server.call(&token)).collect();
    wait_for("four calls to start", &server, || started_calls(&sync) == 4).await;

    let signalled = Instant::now();
    server.sigterm();
    // Readiness drops while all four calls are still running (they wait for the release).
    let mut readiness = server.readyz().await;
    while readiness == Some(200) {
        assert!(
            signalled.elapsed() < Duration::from_secs(2),
            "readiness still 200"
        );
        readiness = server.readyz().await;
    }
    assert_eq!(readiness, Some(503), "{}", server.log());
    // Every answer now moves its client off the keep-alive connection.
    let r = server
        .http
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["connection"], "close");
    assert!(calls.iter().all(|c| !c.is_finished()));
    // In the grace period a new request is still accepted and served.
    calls.push(server.call(&token));
    wait_for("the call sent while draining to start", &server, || {
        assert!(
            !calls[4].is_finished(),
            "the call sent in the grace period was not served"
        );
        started_calls(&sync) == 5
    })
    .await;
    std::fs::write(sync.join("release"), b"").unwrap();

    for (i, call) in calls.into_iter().enumerate() {
        let (status, body) = call
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("call {i} got no full answer: {e}"));
        assert_eq!(status, 200, "call {i}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v, json!({"done": true}), "call {i}");
    }
    let mut child = server.child;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the process outlived its drain deadline")
        .unwrap();
    let log = std::fs::read_to_string(server.logs.path()).unwrap();
    assert!(status.success(), "{status:?}: {log}");
    assert!(signalled.elapsed() < Duration::from_secs(30));
    assert!(log.contains("every request has finished"), "{log}");

    // Both rows of each of the five calls are in the audit table, paired by call id.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT event_type, outcome, call_id FROM audit_events
         WHERE tool = 'slow__wait' AND event_type IN ('tool.call', 'tool.result')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let started: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.0 == "tool.call" && r.1 == "started")
        .map(|r| r.2.as_str())
        .collect();
    let finished: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.0 == "tool.result" && r.1 == "success")
        .map(|r| r.2.as_str())
        .collect();
    assert_eq!(started.len(), 5, "{rows:?}");
    assert_eq!(started, finished, "{rows:?}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_call_that_outlives_the_drain_deadline_is_abandoned_and_the_process_exits(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let sync = root.path().join("sync");
    let server = start(
        &pool,
        root.path(),
        &["--drain-timeout-secs", "3", "--drain-grace-secs", "0"],
    )
    .await;
    let token = server.token().await;
    let stuck = server.call(&token);
    wait_for("the call to start", &server, || started_calls(&sync) == 1).await;

    let signalled = Instant::now();
    server.sigterm();
    let mut child = server.child;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the process did not exit")
        .unwrap();
    let took = signalled.elapsed();
    let log = std::fs::read_to_string(server.logs.path()).unwrap();

    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(8),
        "exited after {took:?}: {log}"
    );
    assert!(!status.success(), "{log}");
    assert!(log.contains("drain deadline reached"), "{log}");
    // The caller learns the call did not complete (the connection ended without an answer).
    assert!(stuck.await.unwrap().is_err());
    // The call's start was durable before it ran, so the log shows it was begun.
    let started: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE tool = 'slow__wait' AND outcome = 'started'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(started, 1);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn mcp_offers_no_standing_event_stream_to_hold_a_drain(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let server = start(&pool, root.path(), &[]).await;
    let token = server.token().await;

    let r = server
        .http
        .get(server.url("/mcp"))
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();

    assert_eq!(r.status(), 405);
}

/// The rows written since the last periodic checkpoint are signed at drain: the instance's
/// last row is covered when the process has exited.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_drain_signs_a_checkpoint_over_the_last_row(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("checkpoint.key");
    let keygen = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["audit", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(keygen.status.success());
    // No periodic checkpoint after the first: only the drain can sign the call's rows.
    let server = start(
        &pool,
        root.path(),
        &[
            "--audit-checkpoint-key",
            key.to_str().unwrap(),
            "--audit-checkpoint-secs",
            "3600",
            "--drain-grace-secs",
            "0",
        ],
    )
    .await;
    std::fs::write(root.path().join("sync/release"), b"").unwrap();
    let token = server.token().await;
    let (status, body) = server.call(&token).await.unwrap().unwrap();
    assert_eq!(status, 200, "{body}");

    server.sigterm();
    let mut child = server.child;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the process outlived its drain deadline")
        .unwrap();
    let log = std::fs::read_to_string(server.logs.path()).unwrap();
    assert!(status.success(), "{status:?}: {log}");

    let (chain, last, hash): (String, i64, String) = sqlx::query_as(
        "SELECT chain, last_seq, last_hash FROM audit_chain_heads WHERE chain <> 'control-plane'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let bodies: Vec<String> =
        sqlx::query_scalar("SELECT body FROM audit_checkpoints ORDER BY id DESC")
            .fetch_all(&pool)
            .await
            .unwrap();
    let newest: Value = serde_json::from_str(&bodies[0]).unwrap();
    assert!(
        newest["heads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["chain"] == chain && h["last_seq"] == last && h["last_hash"] == hash),
        "the newest checkpoint does not cover row {last} of {chain}: {newest}\n{log}"
    );
}
