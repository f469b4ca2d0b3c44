//! Nothing is lost: a killed process, a database that goes away.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::helpers::{TestApp, single_op, write_group};

/// A TCP proxy in front of Postgres that a test can cut and restore, so the gateway sees its
/// database vanish without stopping the server every other test uses.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    links: Arc<std::sync::Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let links: Arc<std::sync::Mutex<Vec<AbortHandle>>> = Arc::default();
        let (u, l) = (up.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !u.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused in effect
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                l.lock().unwrap().push(task.abort_handle());
            }
        });
        Self { port, up, links }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for l in self.links.lock().unwrap().drain(..) {
            l.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

fn marker_group(root: &std::path::Path, marks: &std::path::Path, sleep: &str) {
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let script = format!(
        "#!/bin/sh\nread -r line\necho \"$line\" >> '{}'\nsleep {sleep}\necho '{{\"ok\": true}}'\n",
        marks.display()
    );
    write_group(
        root,
        "mark",
        &single_op("mark", schema, json!({})),
        &[("mark.sh", &script)],
    );
}

fn marks(path: &std::path::Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?.get("n")?.as_i64())
        .collect()
}

/// The test's database, reached through a [`Proxy`] the test can cut.
async fn behind_proxy(pool: &PgPool) -> (Proxy, PgPool) {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let proxied = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect(&format!("postgres://root@127.0.0.1:{}/{db}", proxy.port))
        .await
        .unwrap();
    (proxy, proxied)
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn without_its_database_the_gateway_fails_closed_and_recovers(pool: PgPool) {
    let (proxy, proxied) = behind_proxy(&pool).await;
    let root = tempfile::tempdir().unwrap();
    let marks_file = root.path().join("marks.jsonl");
    let tools = root.path().join("tools");
    marker_group(&tools, &marks_file, "0");
    // The marks file, the test's witness of what ran, is outside the script's folder.
    let app = TestApp::with(proxied.clone(), &tools, None, &["--script-sandbox", "off"]).await;
    let token = app.agent("worker", &["mark"]).await;

    let before = app
        .post_json("/tools/mark/mark", Some(&token), json!({"n": 1}))
        .await;
    assert_eq!(before.status, http::StatusCode::OK, "{}", before.text);

    proxy.cut();
    let down = app
        .post_json("/tools/mark/mark", Some(&token), json!({"n": 2}))
        .await;
    let down_again = app
        .post_json("/tools/mark/mark", Some(&token), json!({"n": 3}))
        .await;
    let mcp_down = app.call(&token, "mark__mark", json!({"n": 4})).await;

    assert_eq!(
        down.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        down.text
    );
    assert!(
        down.body["error"]
            .as_str()
            .unwrap()
            .contains("audit log is unavailable"),
        "{}",
        down.text
    );
    assert_eq!(
        down_again.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        down_again.text
    );
    assert_eq!(
        mcp_down.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        mcp_down.text
    );
    assert_eq!(
        marks(&marks_file),
        [1],
        "a tool ran while its call could not be audited"
    );

    proxy.restore();
    let mut recovered = None;
    for _ in 0..40 {
        let r = app
            .post_json("/tools/mark/mark", Some(&token), json!({"n": 5}))
            .await;
        if r.status == http::StatusCode::OK {
            recovered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        recovered.is_some(),
        "the gateway did not recover when its database came back"
    );
    assert_eq!(marks(&marks_file), [1, 5]);
    let started: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE outcome = 'started'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(started, 2);
    proxied.close().await;
}

/// The call folders (`$TMPDIR` of one call) this process has: in the temporary directory, or in
/// a group jail's folder there.
fn call_dirs() -> Vec<std::path::PathBuf> {
    let ours = format!(
        "{}{}-",
        toolgate::pool::jail::TMP_PREFIX,
        std::process::id()
    );
    let named_ours = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&ours))
            .map(|e| e.path())
            .collect()
    };
    let top = named_ours(&std::env::temp_dir());
    let mut all: Vec<_> = top.iter().flat_map(|d| named_ours(d)).collect();
    all.extend(top);
    all.sort();
    all
}

/// A tool is made ready while its call's `started` row commits (a script's slot, environment
/// and sandboxed call folder; an upstream's connection and request) and acts only once the row
/// is durable. With the database cut, neither acts, on either surface, and nothing prepared
/// is left behind.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_call_that_cannot_be_recorded_never_reaches_its_tool(pool: PgPool) {
    let (proxy, proxied) = behind_proxy(&pool).await;
    let root = tempfile::tempdir().unwrap();
    let tools = root.path().join("tools");
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    write_group(
        &tools,
        "probe",
        &single_op("cat", schema, json!({})),
        &[("cat.sh", "#!/bin/sh\ncat\n")],
    );
    // The sandbox as deployed (`auto`): each call gets a folder of its own, prepared early.
    let app = TestApp::with(proxied.clone(), &tools, None, &[]).await;
    let upstream = crate::otel::start_upstream().await;
    crate::upstream::put_upstream(
        &app,
        "echo",
        json!({"transport": "http", "url": upstream.url, "timeout_ms": 5000, "refresh_secs": 1}),
    )
    .await;
    let token = app.agent("worker", &["probe", "echo"]).await;
    crate::upstream::wait_for_tools(&app, &token, "echo").await;
    let echoed = app
        .call(&token, "echo__echo", json!({"message": "recorded"}))
        .await;
    assert!(echoed.text.contains("recorded"), "{}", echoed.text);
    let ran = app.call(&token, "probe__cat", json!({"n": 1})).await;
    assert_ne!(ran.body["result"]["isError"], true, "{}", ran.text);
    assert!(ran.text.contains("structuredContent"), "{}", ran.text);
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 1);
    let prepared_before = call_dirs();

    proxy.cut();
    let refused = [
        app.call(&token, "echo__echo", json!({"message": "unrecorded"}))
            .await,
        app.post_json(
            "/tools/echo/echo",
            Some(&token),
            json!({"message": "unrecorded"}),
        )
        .await,
        app.call(&token, "probe__cat", json!({"n": 2})).await,
        app.post_json("/tools/probe/cat", Some(&token), json!({"n": 3}))
            .await,
    ];
    // Refused, saying why: REST with 503, MCP with 503 or, once the request was accepted, a
    // JSON-RPC error.
    for r in &refused {
        assert!(
            r.text.contains("audit log is unavailable") && r.body.get("result").is_none(),
            "{}",
            r.text
        );
    }
    assert_eq!(refused[1].status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused[3].status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        upstream.calls.load(Ordering::SeqCst),
        1,
        "a call reached its upstream while it could not be recorded"
    );
    assert_eq!(
        call_dirs(),
        prepared_before,
        "a call that was not recorded left its prepared folder behind"
    );
    proxy.restore();
    proxied.close().await;
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn serve(db_url: &str, tools: &std::path::Path, port: u16) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "serve",
            "--database-url",
            db_url,
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--admin-token",
            "kill-test",
        ])
        .arg("--tools-dir")
        .arg(tools)
        .args(["--policies-dir", "/nonexistent"])
        // The marks file, the test's witness of what ran, is outside the script's folder.
        .args(["--script-sandbox", "off"])
        .env("TOOLGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

pub(crate) async fn wait_ready(http: &reqwest::Client, base: &str) {
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server at {base} never became ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_under_load_loses_no_call() {
    let db = format!("toolgate_kill_{}", uuid::Uuid::new_v4().simple());
    let url = format!("postgres://root@127.0.0.1:5432/{db}");
    let root = tempfile::tempdir().unwrap();
    let marks_file = root.path().join("marks.jsonl");
    let tools = root.path().join("tools");
    marker_group(&tools, &marks_file, "0.3");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut server = serve(&url, &tools, port);
    wait_ready(&http, &base).await;
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth("kill-test");
    admin(http.post(format!("{base}/api/v1/agents")))
        .json(&json!({"name": "worker"}))
        .send()
        .await
        .unwrap();
    admin(http.post(format!("{base}/api/v1/agents/worker/grants")))
        .json(&json!({"target": "mark"}))
        .send()
        .await
        .unwrap();
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
    let token = token["access_token"].as_str().unwrap().to_owned();

    // Calls start every 40 ms over 1.6 s; the kill lands at 1 s, with calls in flight
    // (each script sleeps 0.3 s) and later ones not yet sent.
    let calls: Vec<_> = (0..40)
        .map(|n| {
            let (http, base, token) = (http.clone(), base.clone(), token.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(40 * n as u64)).await;
                let r = http
                    .post(format!("{base}/tools/mark/mark"))
                    .bearer_auth(token)
                    .json(&json!({"n": n}))
                    .send()
                    .await;
                (n, r.map(|r| r.status().as_u16()).ok())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.kill().await.unwrap();
    let mut answered = Vec::new();
    for c in calls {
        if let (n, Some(200)) = c.await.unwrap() {
            answered.push(n);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The restarted server serves again from the same database.
    let mut server = serve(&url, &tools, port);
    wait_ready(&http, &base).await;
    let pool = PgPool::connect(&url).await.unwrap();
    let started: Vec<String> = sqlx::query_scalar(
        "SELECT arguments FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let started: Vec<i64> = started
        .iter()
        .map(|a| {
            serde_json::from_str::<Value>(a).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let finished: Vec<String> = sqlx::query_scalar(
        "SELECT s.arguments FROM audit_events r JOIN audit_events s ON s.call_id = r.call_id AND s.outcome = 'started'
         WHERE r.event_type = 'tool.result' AND r.outcome = 'success'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let finished: Vec<i64> = finished
        .iter()
        .map(|a| {
            serde_json::from_str::<Value>(a).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let ran = marks(&marks_file);

    assert!(
        !answered.is_empty() && answered.len() < 40,
        "the kill did not land mid-load: {} answered",
        answered.len()
    );
    for n in &ran {
        assert!(
            started.contains(n),
            "call {n} ran its script but is not in the audit log"
        );
    }
    for n in &answered {
        assert!(
            finished.contains(n),
            "call {n} was answered but its result is not in the audit log"
        );
    }
    server.kill().await.unwrap();
    pool.close().await;
    let admin_pool = PgPool::connect("postgres://root@127.0.0.1:5432/postgres")
        .await
        .unwrap();
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&admin_pool)
        .await;
}
