//! A hostile upstream MCP server behind a real `toolgate serve`: it quotes the credential the
//! gateway sends it, floods notifications, answers with 100 MB, or never answers. The
//! upstream is the official SDK's server (rmcp) in this test process, reached over Streamable
//! HTTP or over stdio (the gateway spawns a byte relay to it), so the test sees what arrives
//! there; the gateway runs as its own process, so its memory can be measured.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    NumberOrString, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig, ServerNotification, ToolListChangedNotification,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::audit::db_url;
use crate::durability::free_port;
use crate::helpers::{single_op, write_group};

const ADMIN: &str = "hostile-admin-secret";
/// What the gateway sends the HTTP upstream as its own credential.
const HTTP_SECRET: &str = "upstream-bearer-9f8e7d6c5b4a";
/// What the gateway gives the stdio upstream in its environment.
const STDIO_SECRET: &str = "sk-live-0a1b2c3d4e5f6a7b";

/// What the upstream saw, for the test to wait on and count.
#[derive(Default)]
struct Seen {
    lists: AtomicUsize,
    hung: AtomicUsize,
    cancelled: AtomicUsize,
    event: tokio::sync::Notify,
}

impl Seen {
    /// Waits until `done` holds, woken by each event the upstream records.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let woken = self.event.notified();
            if done(self) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the upstream never saw {what}");
            let _ = tokio::time::timeout(left, woken).await;
        }
    }

    fn bump(&self, n: &AtomicUsize) {
        n.fetch_add(1, Ordering::SeqCst);
        self.event.notify_waiters();
    }
}

/// The hostile server: `echo` behaves; `leak`, `flood`, `huge` and `hang` do not.
#[derive(Clone)]
struct Hostile {
    seen: Arc<Seen>,
    /// The credential it was configured with (over stdio it cannot see the relay's
    /// environment, so it is told); over HTTP it quotes the header it received instead.
    secret: &'static str,
}

fn tool(name: &str, description: &str) -> rmcp::model::Tool {
    let Value::Object(schema) = json!({"type": "object"}) else {
        unreachable!()
    };
    rmcp::model::Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
}

fn text(t: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(t.into())]).into()
}

impl ServerHandler for Hostile {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.seen.bump(&self.seen.lists);
        Ok(ListToolsResult::with_all_items(vec![
            tool("echo", "Says it back."),
            tool("leak", "Quotes the credential it was sent."),
            tool("flood", "Floods notifications, then answers."),
            tool("huge", "Answers with megabytes."),
            tool("hang", "Never answers."),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let arg = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
        match request.name.as_ref() {
            "echo" => Ok(text(arg("message").as_str().unwrap_or_default())),
            "leak" => {
                let credential = ctx
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|p| p.headers.get("authorization")?.to_str().ok())
                    .unwrap_or(self.secret)
                    .to_owned();
                let said = format!("the upstream refused credential {credential} for this call");
                match arg("how").as_str() {
                    Some("error") => Err(ErrorData::invalid_request(said, None)),
                    Some("is_error") => {
                        Ok(CallToolResult::error(vec![ContentBlock::text(said)]).into())
                    }
                    _ => Ok(CallToolResult::structured(json!({"note": said})).into()),
                }
            }
            // Logging is deprecated in the newest protocol, but servers of the older ones send it.
            #[allow(deprecated)]
            "flood" => {
                let n = arg("count").as_u64().unwrap_or(1000);
                let token = ProgressToken(NumberOrString::String("flood".into()));
                for i in 0..n {
                    let _ = ctx
                        .peer
                        .notify_progress(ProgressNotificationParam::new(token.clone(), i as f64))
                        .await;
                    let _ = ctx
                        .peer
                        .notify_logging_message(LoggingMessageNotificationParam::new(
                            LoggingLevel::Info,
                            json!({"flood": i, "pad": "x".repeat(200)}),
                        ))
                        .await;
                    let _ = ctx
                        .peer
                        .send_notification(ServerNotification::ToolListChangedNotification(
                            ToolListChangedNotification {
                                method: Default::default(),
                                extensions: Default::default(),
                            },
                        ))
                        .await;
                }
                Ok(text("flooded"))
            }
            "huge" => {
                let mb = arg("mb").as_u64().unwrap_or(100) as usize;
                Ok(text("x".repeat(mb << 20)))
            }
            "hang" => {
                self.seen.bump(&self.seen.hung);
                ctx.ct.cancelled().await;
                self.seen.bump(&self.seen.cancelled);
                Err(ErrorData::internal_error("cancelled", None))
            }
            _ => Err(ErrorData::invalid_params("no such tool", None)),
        }
    }
}

/// Serves the hostile server over Streamable HTTP; its URL. With `json`, stateless and
/// answering each POST with a JSON body; otherwise with sessions, answering with SSE.
async fn serve_http(seen: Arc<Seen>, json: bool) -> String {
    let factory = move || {
        Ok(Hostile {
            seen: seen.clone(),
            secret: "",
        })
    };
    let app = if json {
        axum::Router::new().nest_service(
            "/mcp",
            StreamableHttpService::new(
                factory,
                Arc::new(NeverSessionManager::default()),
                StreamableHttpServerConfig::default()
                    .with_legacy_session_mode(false)
                    .with_json_response(true),
            ),
        )
    } else {
        axum::Router::new().nest_service(
            "/mcp",
            StreamableHttpService::new(
                factory,
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            ),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A byte relay between its stdin/stdout and a Unix socket: what the gateway spawns as the
/// stdio upstream, so that the server it reaches runs here.
const RELAY: &str = r#"import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def up():
    while True:
        b = os.read(0, 65536)
        if not b:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(b)
threading.Thread(target=up, daemon=True).start()
out = sys.stdout.buffer
while True:
    b = s.recv(65536)
    if not b:
        break
    out.write(b)
    out.flush()
"#;

/// Serves the hostile server to every connection on a Unix socket in `dir`; the upstream
/// spec that reaches it over stdio through the relay.
async fn serve_stdio(seen: Arc<Seen>, dir: &Path) -> Value {
    let socket = dir.join("hostile.sock");
    let relay = dir.join("relay.py");
    std::fs::write(&relay, RELAY).unwrap();
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let server = Hostile {
                seen: seen.clone(),
                secret: STDIO_SECRET,
            };
            tokio::spawn(async move {
                let (r, w) = stream.into_split();
                if let Ok(running) = server.serve((r, w)).await {
                    let _ = running.waiting().await;
                }
            });
        }
    });
    json!({
        "transport": "stdio",
        "command": "python3",
        "args": [relay, socket],
        "env": {"HOSTILE_API_KEY": STDIO_SECRET},
        "pin": false,
    })
}

/// A real `toolgate serve` with one local script group, `local` (`local__ping`).
struct Gateway {
    child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Gateway {
    async fn start(pool: &PgPool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("tools");
        write_group(
            &tools,
            "local",
            &single_op("ping", json!({"type": "object"}), json!({})),
            &[(
                "ping",
                "#!/bin/sh\ncat >/dev/null\necho '{\"pong\": true}'\n",
            )],
        );
        let port = free_port();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--database-url", &db_url(pool).await])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .arg("--tools-dir")
            .arg(&tools)
            .args(["--policies-dir", "/nonexistent"])
            // Confinement is not what is tested here.
            .args(["--script-sandbox", "off"])
            .env("TOOLGATE_ADMIN_TOKEN", ADMIN)
            .env("TOOLGATE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let gw = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !gw
            .http
            .get(format!("{}/readyz", gw.base))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "toolgate serve never became ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gw
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn upstream(&self, name: &str, spec: Value) {
        self.admin(
            reqwest::Method::PUT,
            &format!("/api/v1/upstreams/{name}"),
            spec,
        )
        .await;
    }

    /// A token for a new agent granted `grants`.
    async fn token(&self, agent: &str, grants: &[&str]) -> String {
        let post = reqwest::Method::POST;
        self.admin(post.clone(), "/api/v1/agents", json!({"name": agent}))
            .await;
        for g in grants {
            self.admin(
                post.clone(),
                &format!("/api/v1/agents/{agent}/grants"),
                json!({"target": g}),
            )
            .await;
        }
        let client = self
            .admin(post, &format!("/api/v1/agents/{agent}/clients"), json!({}))
            .await;
        let token: Value = self
            .http
            .post(format!("{}/oauth/token", self.base))
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
        token["access_token"].as_str().unwrap().to_owned()
    }

    /// One JSON-RPC request on /mcp; the whole response body as text.
    async fn mcp(&self, token: &str, method: &str, params: Value) -> String {
        self.http
            .post(format!("{}/mcp", self.base))
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A tool call over MCP: the response body as text, and parsed.
    async fn call(&self, token: &str, name: &str, args: Value) -> (String, Value) {
        let body = self
            .mcp(
                token,
                "tools/call",
                json!({"name": name, "arguments": args}),
            )
            .await;
        let v = serde_json::from_str(&body).unwrap_or(Value::Null);
        (body, v)
    }

    /// Waits until the agent of `token` sees `tool`.
    async fn wait_for(&self, token: &str, tool: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = self.mcp(token, "tools/list", json!({})).await;
            if list.contains(&format!("\"{tool}\"")) {
                return;
            }
            assert!(Instant::now() < deadline, "{tool} never appeared: {list}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The gateway's peak resident memory so far, in KiB.
    fn peak_kib(&self) -> u64 {
        let pid = self.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

/// Every stored audit row of calls to `tool`, each as one JSON text.
async fn audit_rows(pool: &PgPool, tool: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT row_to_json(e)::text FROM audit_events e WHERE tool = $1 ORDER BY id",
    )
    .bind(tool)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The `tool.result` row of the last call to `tool`: (outcome, error).
async fn last_result(pool: &PgPool, tool: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT outcome, error FROM audit_events WHERE tool = $1 AND event_type = 'tool.result'
         ORDER BY id DESC LIMIT 1",
    )
    .bind(tool)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn result_text(v: &Value) -> String {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// (a) The upstream echoes the credential the gateway sent it (a bearer header over HTTP,
/// an API key in a stdio server's environment) in a JSON-RPC error, an `isError` result and
/// a structured result. Neither the agent, over MCP or REST, nor any audit row, nor the
/// upstream's health shown to admins, holds it; the rest of what the upstream said arrives.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_upstream_quoting_its_credential_reaches_neither_the_agent_nor_the_audit_log(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let url = serve_http(seen.clone(), false).await;
    let stdio = serve_stdio(seen.clone(), dir.path()).await;
    let gw = Gateway::start(&pool).await;
    gw.upstream(
        "hhttp",
        json!({"transport": "http", "url": url, "pin": false,
               "headers": {"Authorization": format!("Bearer {HTTP_SECRET}")}}),
    )
    .await;
    gw.upstream("hstdio", stdio).await;
    let token = gw.token("victim", &["hhttp", "hstdio"]).await;

    for (group, secret) in [("hhttp", HTTP_SECRET), ("hstdio", STDIO_SECRET)] {
        let tool = format!("{group}__leak");
        gw.wait_for(&token, &tool).await;
        for how in ["error", "is_error", "result"] {
            let (body, _) = gw.call(&token, &tool, json!({"how": how})).await;
            assert!(
                body.contains("the upstream refused credential"),
                "{group} {how}: the upstream's words did not arrive: {body}"
            );
            assert!(
                !body.contains(secret),
                "{group} {how}: the agent saw the credential: {body}"
            );
        }
        let rest = gw
            .http
            .post(format!("{}/tools/{group}/leak", gw.base))
            .bearer_auth(&token)
            .json(&json!({"how": "error"}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(rest.contains("refused credential"), "{rest}");
        assert!(
            !rest.contains(secret),
            "REST: the agent saw the credential: {rest}"
        );
        let rows = audit_rows(&pool, &tool).await;
        assert_eq!(rows.len(), 8, "{rows:?}");
        for row in rows {
            assert!(
                !row.contains(secret),
                "an audit row holds the credential: {row}"
            );
        }
    }
    let listed = gw
        .admin(reqwest::Method::GET, "/api/v1/upstreams", Value::Null)
        .await;
    for u in listed["upstreams"].as_array().unwrap() {
        let health = u["health"].to_string();
        assert!(
            !health.contains(HTTP_SECRET) && !health.contains(STDIO_SECRET),
            "{health}"
        );
    }
}

/// (b) The upstream sends 20,000 each of progress, log and `tools/list_changed`
/// notifications in one call. Meanwhile another agent's calls, to a script and to the same
/// upstream, are answered; the gateway re-lists the upstream's tools at a bounded rate, not
/// once per notification; its memory stays bounded.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_notification_flood_leaves_memory_bounded_and_other_callers_unaffected(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let mut spec = serve_stdio(seen.clone(), dir.path()).await;
    // No periodic re-list: every list the upstream sees is one the flood caused.
    spec["refresh_secs"] = json!(3600);
    spec["timeout_ms"] = json!(120_000);
    let gw = Gateway::start(&pool).await;
    gw.upstream("noisy", spec).await;
    let flooder = gw.token("flooder", &["noisy"]).await;
    let bystander = gw.token("bystander", &["noisy", "local"]).await;
    gw.wait_for(&bystander, "noisy__echo").await;
    let (_, warm) = gw.call(&bystander, "local__ping", json!({})).await;
    assert_eq!(warm["result"]["isError"], false, "{warm}");
    let lists = seen.lists.load(Ordering::SeqCst);
    let peak = gw.peak_kib();

    let started = Instant::now();
    let flood = {
        let (http, base) = (gw.http.clone(), gw.base.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/mcp"))
                .bearer_auth(flooder)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "noisy__flood", "arguments": {"count": 20_000}}}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    let mut calls = 0;
    let mut slowest = Duration::ZERO;
    while !flood.is_finished() {
        for (tool, args, want) in [
            ("local__ping", json!({}), "pong"),
            (
                "noisy__echo",
                json!({"message": "still here"}),
                "still here",
            ),
        ] {
            let t = Instant::now();
            let (body, v) = gw.call(&bystander, tool, args).await;
            slowest = slowest.max(t.elapsed());
            assert_eq!(v["result"]["isError"], false, "{tool}: {body}");
            assert!(body.contains(want), "{tool}: {body}");
            calls += 1;
        }
    }
    let flooded = flood.await.unwrap();
    let took = started.elapsed();
    assert!(flooded.contains("flooded"), "{flooded}");
    assert!(calls >= 2, "no call ran during the flood");
    assert!(
        slowest < Duration::from_secs(5),
        "a bystander's call took {slowest:?}"
    );
    let relists = seen.lists.load(Ordering::SeqCst) - lists;
    // At most one re-list a second, plus the one the last notification asks for.
    let bound = took.as_secs() as usize + 2;
    assert!(
        relists <= bound,
        "60,000 notifications in {took:?} made the gateway re-list {relists} times"
    );
    let grew = gw.peak_kib().saturating_sub(peak);
    eprintln!(
        "flood: {took:?}, {relists} re-lists, {calls} bystander calls, slowest {slowest:?}, peak memory {peak} KiB before, grew by {grew} KiB"
    );
    assert!(
        grew < 64 * 1024,
        "the gateway's peak memory grew by {grew} KiB"
    );
}

/// (c) The upstream answers a call with 100 MB, over stdio and over HTTP (as an SSE event
/// and as a JSON body). The call fails at
/// once with an error naming the limit (4 MiB by default, `max_result_bytes` per upstream),
/// the audit row says so, the gateway's memory grows by a few times the limit at most (the
/// answer is not buffered), and the upstream's other tools keep working.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_100_mb_result_is_refused_at_the_limit_with_memory_bounded(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let sse = serve_http(seen.clone(), false).await;
    let json_body = serve_http(seen.clone(), true).await;
    let mut stdio = serve_stdio(seen.clone(), dir.path()).await;
    stdio["timeout_ms"] = json!(20_000);
    let gw = Gateway::start(&pool).await;
    for (group, url) in [("bigh", sse), ("bigj", json_body)] {
        gw.upstream(
            group,
            json!({"transport": "http", "url": url, "pin": false, "timeout_ms": 20_000}),
        )
        .await;
    }
    gw.upstream("bigs", stdio).await;
    let groups = ["bigh", "bigj", "bigs"];
    let token = gw.token("reader", &groups).await;
    for group in groups {
        gw.wait_for(&token, &format!("{group}__huge")).await;
        let (_, ok) = gw
            .call(
                &token,
                &format!("{group}__echo"),
                json!({"message": "warm"}),
            )
            .await;
        assert_eq!(result_text(&ok), "warm", "{ok}");
    }
    let peak = gw.peak_kib();

    for group in groups {
        let tool = format!("{group}__huge");
        let started = Instant::now();
        let (body, v) = gw.call(&token, &tool, json!({"mb": 100})).await;
        let took = started.elapsed();
        assert_eq!(v["result"]["isError"], true, "{group}: {body}");
        let said = result_text(&v);
        assert!(
            said.contains("larger than 4194304 bytes"),
            "{group}: not a clear refusal after {took:?}: {said}"
        );
        // Refused by the size limit, not by the 20 s call timeout: the message above says so;
        // how long the upstream takes to write its 100 MB depends on the machine's load.
        assert!(
            took < Duration::from_secs(20),
            "{group}: refused after {took:?}"
        );
        eprintln!("{group}: 100 MB answer refused after {took:?}");
        let (outcome, error) = last_result(&pool, &tool).await;
        assert_eq!(outcome, "tool_error");
        assert!(
            error
                .as_deref()
                .unwrap_or_default()
                .contains("larger than 4194304 bytes"),
            "{error:?}"
        );
        let (_, after) = gw
            .call(
                &token,
                &format!("{group}__echo"),
                json!({"message": "after"}),
            )
            .await;
        assert_eq!(result_text(&after), "after", "{group}: {after}");
    }
    let grew = gw.peak_kib().saturating_sub(peak);
    eprintln!("peak memory: {peak} KiB before, grew by {grew} KiB");
    assert!(
        grew < 48 * 1024,
        "the gateway's peak memory grew by {grew} KiB"
    );
}

/// (d) The upstream never answers. Each call fails after the upstream's timeout with an
/// error saying so, its audit row is a `timeout` that says so, the upstream is told the call
/// was cancelled, and after three such calls another agent still reaches the upstream's
/// other tools and the gateway's scripts.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_upstream_that_never_answers_times_out_and_affects_no_other_caller(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let mut spec = serve_stdio(seen.clone(), dir.path()).await;
    spec["timeout_ms"] = json!(1000);
    let gw = Gateway::start(&pool).await;
    gw.upstream("stuck", spec).await;
    let caller = gw.token("patient", &["stuck"]).await;
    let other = gw.token("other", &["stuck", "local"]).await;
    gw.wait_for(&other, "stuck__hang").await;

    for n in 1..=3 {
        let started = Instant::now();
        let (body, v) = gw.call(&caller, "stuck__hang", json!({})).await;
        let took = started.elapsed();
        assert_eq!(v["result"]["isError"], true, "{body}");
        assert!(
            result_text(&v).contains("did not answer within 1000 ms"),
            "{body}"
        );
        assert!(took < Duration::from_secs(5), "answered after {took:?}");
        let (outcome, error) = last_result(&pool, "stuck__hang").await;
        assert_eq!(outcome, "timeout");
        assert!(
            error
                .as_deref()
                .unwrap_or_default()
                .contains("did not answer within 1000 ms"),
            "{error:?}"
        );
        seen.until("the call cancelled", |s| {
            s.cancelled.load(Ordering::SeqCst) == n
        })
        .await;
    }
    assert_eq!(seen.hung.load(Ordering::SeqCst), 3);

    let (body, v) = gw
        .call(&other, "stuck__echo", json!({"message": "unaffected"}))
        .await;
    assert_eq!(result_text(&v), "unaffected", "{body}");
    let (body, v) = gw.call(&other, "local__ping", json!({})).await;
    assert_eq!(v["result"]["isError"], false, "{body}");
}
