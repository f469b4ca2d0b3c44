//! Upstream MCP servers behind the gateway, with a real server nobody here wrote:
//! `@modelcontextprotocol/server-everything` from the npm registry.

use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// Installs the reference server once per checkout (under `target/`), from the npm registry.
///
/// Tests run in parallel processes: each installs into its own directory and renames it into
/// place, so a half-written install is never seen and the first complete one wins.
pub fn everything_entry() -> PathBuf {
    let dir = repo_path("target/test-deps");
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.is_file() {
        let staging = repo_path(&format!("target/test-deps.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).unwrap();
        let out = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&staging)
            .arg(EVERYTHING)
            .output()
            .expect("npm is needed to fetch the reference MCP server");
        assert!(
            out.status.success(),
            "npm install failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if dir.exists() && !entry.is_file() {
            // A broken earlier install (no entry point): replace it.
            let _ = std::fs::remove_dir_all(&dir);
        }
        if std::fs::rename(&staging, &dir).is_err() {
            // Another test process finished first.
            let _ = std::fs::remove_dir_all(&staging);
        }
    }
    assert!(
        entry.is_file(),
        "{} is missing after install",
        entry.display()
    );
    entry
}

pub async fn wait_for_tools(app: &TestApp, token: &str, group: &str) -> Vec<String> {
    // Up to 120 s: on a 2-core machine running the whole suite beside other builds, starting
    // the reference server with node, its first listing and the first-use approval of a
    // pinned upstream group have taken over a minute.
    for _ in 0..600 {
        let names: Vec<String> = app
            .tool_names(token)
            .await
            .into_iter()
            .filter(|n| n.starts_with(&format!("{group}__")))
            .collect();
        if !names.is_empty() {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the tools of upstream `{group}` never appeared");
}

pub fn text(r: &Value) -> String {
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub async fn put_upstream(app: &TestApp, name: &str, spec: Value) {
    let r = app
        .admin("PUT", &format!("/api/v1/upstreams/{name}"), Some(spec))
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stdio_upstream_is_served_under_grants_and_audit(pool: PgPool) {
    let entry = everything_entry();
    let app = TestApp::new(pool.clone()).await;
    put_upstream(&app, "everything", json!({"transport": "stdio", "command": "node", "args": [entry, "stdio"], "refresh_secs": 2})).await;
    let granted = app.agent("explorer", &["everything"]).await;
    let other = app.token_for("assistant").await;

    let names = wait_for_tools(&app, &granted, "everything").await;
    assert!(names.contains(&"everything__echo".to_owned()), "{names:?}");
    assert!(
        names.contains(&"everything__get-sum".to_owned()),
        "{names:?}"
    );
    assert_eq!(
        app.tool_names(&other).await,
        ["search__get", "search__query"],
        "an ungranted agent sees upstream tools"
    );

    let echo = app
        .call(
            &granted,
            "everything__echo",
            json!({"message": "through the gateway"}),
        )
        .await;
    assert_ne!(echo.body["result"]["isError"], true, "{}", echo.text);
    assert!(
        text(&echo.body).contains("through the gateway"),
        "{}",
        echo.text
    );
    let sum = app
        .post_json(
            "/tools/everything/get-sum",
            Some(&granted),
            json!({"a": 2, "b": 3}),
        )
        .await;
    assert_eq!(sum.status, StatusCode::OK, "{}", sum.text);
    let failing = app
        .call(
            &granted,
            "everything__get-resource-reference",
            json!({"resourceId": 1.5}),
        )
        .await;
    assert_eq!(failing.body["result"]["isError"], true, "{}", failing.text);
    assert!(
        text(&failing.body).contains("Invalid resourceId"),
        "{}",
        failing.text
    );
    let hidden = app
        .call(&other, "everything__echo", json!({"message": "x"}))
        .await;
    assert_eq!(hidden.body["error"]["code"], -32602);

    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE event_type = 'tool.result' AND tool LIKE 'everything__%'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audited, 3);
    let health = app.admin("GET", "/api/v1/upstreams", None).await;
    assert_eq!(
        health.body["upstreams"][0]["health"]["state"], "up",
        "{}",
        health.text
    );

    // One child process per upstream, and it goes when the upstream is removed.
    let children = || {
        std::process::Command::new("pgrep")
            .args(["-f", &format!("{} stdio$", entry.display())])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0)
    };
    assert_eq!(children(), 1);
    assert_eq!(
        app.admin("DELETE", "/api/v1/upstreams/everything", None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    for _ in 0..50 {
        if children() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(children(), 0, "the stdio child outlived its upstream");
    assert!(app.tool_names(&granted).await.is_empty());
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The reference server over Streamable HTTP, its stderr kept in a file so a failed start says why.
struct HttpServer {
    child: std::process::Child,
    stderr: tempfile::NamedTempFile,
}

impl HttpServer {
    fn spawn(entry: &std::path::Path, port: u16) -> Self {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let child = std::process::Command::new("node")
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap();
        Self { child, stderr }
    }

    /// Waits for the server to listen: up to 30 s, as Node starts slowly on a loaded machine
    /// (the whole suite runs beside it). `Err` carries what the server said if it exited first.
    async fn listening(&mut self, port: u16) -> Result<(), String> {
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let said = std::fs::read_to_string(self.stderr.path()).unwrap_or_default();
                return Err(format!(
                    "exited ({status}) before listening on {port}: {said}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("nothing listens on {port} after 30 s");
    }
}

/// A failed assertion must not leave Node running beside the suite.
impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on `port`. A port found free can be taken before Node binds it (another
/// test's outgoing connection picks it from the same ephemeral range): then it tries again,
/// on a fresh port when `port` is `None`, else on the same one once it is released.
async fn start_http(entry: &std::path::Path, port: Option<u16>) -> (HttpServer, u16) {
    let mut said = Vec::new();
    for _ in 0..5 {
        let p = port.unwrap_or_else(free_port);
        let mut server = HttpServer::spawn(entry, p);
        match server.listening(p).await {
            Ok(()) => return (server, p),
            Err(e) => said.push(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the upstream server did not start: {said:#?}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_http_upstream_fails_clearly_when_it_dies_and_recovers_when_it_returns(pool: PgPool) {
    let entry = everything_entry();
    let (server, port) = start_http(&entry, None).await;
    let app = TestApp::new(pool).await;
    put_upstream(
        &app,
        "remote",
        json!({"transport": "http", "url": format!("http://127.0.0.1:{port}/mcp"), "timeout_ms": 3000, "refresh_secs": 1}),
    )
    .await;
    let token = app.agent("explorer", &["remote", "weather"]).await;
    wait_for_tools(&app, &token, "remote").await;
    let ok = app
        .call(&token, "remote__echo", json!({"message": "hello"}))
        .await;
    assert!(text(&ok.body).contains("hello"), "{}", ok.text);

    drop(server);
    let dead = app
        .call(&token, "remote__echo", json!({"message": "anyone?"}))
        .await;
    assert_eq!(dead.body["result"]["isError"], true, "{}", dead.text);
    assert!(
        text(&dead.body).contains("upstream `remote`"),
        "{}",
        dead.text
    );
    let others = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(
        others.body["result"]["isError"], false,
        "other groups must keep working: {}",
        others.text
    );

    let (server, _) = start_http(&entry, Some(port)).await;
    let mut back = None;
    for _ in 0..120 {
        let r = app
            .call(&token, "remote__echo", json!({"message": "again"}))
            .await;
        if text(&r.body).contains("again") {
            back = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(server);
    assert!(
        back.is_some(),
        "the gateway did not recover when the upstream came back"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn hanging_and_garbage_upstreams_are_reported_and_nothing_else_breaks(pool: PgPool) {
    let app = TestApp::new(pool).await;
    put_upstream(&app, "hangs", json!({"transport": "stdio", "command": "sh", "args": ["-c", "sleep 600"], "timeout_ms": 1000})).await;
    put_upstream(&app, "garbage", json!({"transport": "stdio", "command": "sh", "args": ["-c", "while true; do echo 'not json-rpc'; sleep 0.1; done"], "timeout_ms": 1000})).await;
    let token = app.token_for("meteo").await;

    let mut states = Value::Null;
    for _ in 0..60 {
        states = app.admin("GET", "/api/v1/upstreams", None).await.body;
        let down = states["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["health"]["last_error"].is_string())
            .count();
        if down == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for u in states["upstreams"].as_array().unwrap() {
        assert!(u["health"]["last_error"].is_string(), "{states}");
        assert_ne!(u["health"]["state"], "up", "{states}");
    }
    let weather = app
        .call(&token, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(weather.body["result"]["isError"], false, "{}", weather.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_hung_call_times_out_and_a_stdio_server_killed_mid_call_is_restarted(pool: PgPool) {
    let entry = everything_entry();
    let app = TestApp::new(pool).await;
    // A marker argument makes this test's child findable among other tests' children.
    let marker = format!("midcall-{}", std::process::id());
    put_upstream(
        &app,
        "slow",
        json!({"transport": "stdio", "command": "node", "args": [entry, "stdio", marker], "timeout_ms": 1500, "refresh_secs": 1}),
    )
    .await;
    let token = app.agent("patient", &["slow"]).await;
    wait_for_tools(&app, &token, "slow").await;

    // The upstream takes 10 s; the gateway gives up at its 1.5 s timeout with a tool error.
    let started = std::time::Instant::now();
    let hung = app
        .call(
            &token,
            "slow__trigger-long-running-operation",
            json!({"duration": 10, "steps": 2}),
        )
        .await;
    assert_eq!(hung.body["result"]["isError"], true, "{}", hung.text);
    assert!(
        text(&hung.body).contains("did not answer within 1500 ms"),
        "{}",
        hung.text
    );
    assert!(started.elapsed() < Duration::from_secs(8));

    // Killed in the middle of a call: the caller gets a tool error, not a hang.
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f", &marker])
            .status();
    };
    let (dying, ()) = tokio::join!(
        app.call(
            &token,
            "slow__trigger-long-running-operation",
            json!({"duration": 1, "steps": 1})
        ),
        kill
    );
    assert_eq!(dying.body["result"]["isError"], true, "{}", dying.text);

    // The supervisor restarts the server with backoff; its tools work again.
    let mut back = false;
    for _ in 0..120 {
        let r = app
            .call(&token, "slow__echo", json!({"message": "restarted"}))
            .await;
        if text(&r.body).contains("restarted") {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(back, "the stdio upstream was not restarted after it died");
}

/// An HTTP upstream's calls go out on kept connections, not a new one each (a connect per
/// call, as the SDK's own client makes, costs every proxied call its handshake).
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_http_upstreams_calls_reuse_their_connections(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let upstream = crate::otel::start_upstream().await;
    put_upstream(
        &app,
        "kept",
        json!({"transport": "http", "url": upstream.url, "timeout_ms": 5000}),
    )
    .await;
    let token = app.agent("caller", &["kept"]).await;
    wait_for_tools(&app, &token, "kept").await;
    let before = upstream.connections.lock().unwrap().clone();
    for i in 0..10 {
        let r = app
            .call(&token, "kept__echo", json!({"message": format!("m{i}")}))
            .await;
        assert!(r.text.contains(&format!("m{i}")), "{}", r.text);
    }
    let new = upstream
        .connections
        .lock()
        .unwrap()
        .difference(&before)
        .count();
    // One for the first call if the listing's was closed in between; ten without reuse.
    assert!(
        new <= 1,
        "ten sequential calls opened {new} new connections to the upstream"
    );
}
