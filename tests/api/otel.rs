//! Traces: a real `toolgate serve` exporting OTLP/HTTP to a receiver in the test, which decodes
//! what arrives with the official OpenTelemetry protobuf types. The exporter is process-wide,
//! so the gateway runs as its own process.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::durability::free_port;
use crate::helpers::{single_op, write_group};

const ADMIN: &str = "otel-admin-secret";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP trace receiver: every span of every `POST /v1/traces`, decoded.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    service_names: Arc<Mutex<Vec<String>>>,
    arrived: Arc<tokio::sync::Notify>,
}

async fn export(State(r): State<Receiver>, headers: http::HeaderMap, body: Bytes) -> Vec<u8> {
    assert_eq!(
        headers.get(http::header::CONTENT_TYPE).unwrap(),
        "application/x-protobuf"
    );
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    for rs in request.resource_spans {
        if let Some(res) = &rs.resource {
            let name = res
                .attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            if let Some(Any::StringValue(n)) = name {
                r.service_names.lock().unwrap().push(n);
            }
        }
        for ss in rs.scope_spans {
            r.spans.lock().unwrap().extend(ss.spans);
        }
    }
    r.arrived.notify_waiters();
    // An empty ExportTraceServiceResponse: everything accepted.
    Vec::new()
}

impl Receiver {
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (receiver, url)
    }

    /// Waits, until a deadline, for a span that `matches`; returns it.
    async fn wait_for(&self, what: &str, matches: impl Fn(&Span) -> bool) -> Span {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let arrived = self.arrived.notified();
            if let Some(s) = self.spans.lock().unwrap().iter().find(|s| matches(s)) {
                return s.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no span {what} arrived");
            let _ = tokio::time::timeout(left, arrived).await;
        }
    }
}

fn attr(span: &Span, key: &str) -> Option<Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

fn text_attr(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// A small MCP server (the official SDK's) with one tool, `echo`, that counts the calls it
/// is sent.
#[derive(Clone)]
struct Echo {
    calls: Arc<AtomicUsize>,
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}});
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        Ok(ListToolsResult::with_all_items(vec![
            rmcp::model::Tool::new("echo", "Says it back.", Arc::new(schema)),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let message = request
            .arguments
            .and_then(|a| a.get("message").cloned())
            .unwrap_or_default();
        Ok(CallToolResult::success(vec![ContentBlock::text(message.to_string())]).into())
    }
}

/// What [`start_upstream`]'s server saw: the `traceparent` header of every POST, how many
/// tool calls reached it, and the address of every connection a request came on.
pub(crate) struct Upstream {
    pub traceparents: Arc<Mutex<Vec<String>>>,
    pub calls: Arc<AtomicUsize>,
    pub connections: Arc<Mutex<std::collections::HashSet<std::net::SocketAddr>>>,
    pub url: String,
}

/// [`Echo`] over Streamable HTTP at `url`.
pub(crate) async fn start_upstream() -> Upstream {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let echo = Echo {
        calls: calls.clone(),
    };
    let service = StreamableHttpService::new(
        move || Ok(echo.clone()),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true),
    );
    let record = {
        let seen = seen.clone();
        let connections = connections.clone();
        move |axum::extract::ConnectInfo(from): axum::extract::ConnectInfo<std::net::SocketAddr>,
              req: axum::extract::Request,
              next: axum::middleware::Next| {
            let seen = seen.clone();
            connections.lock().unwrap().insert(from);
            async move {
                if let Some(tp) = req.headers().get("traceparent") {
                    seen.lock()
                        .unwrap()
                        .push(tp.to_str().unwrap_or_default().to_owned());
                }
                next.run(req).await
            }
        }
    };
    let app = Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(record));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap()
    });
    Upstream {
        traceparents: seen,
        calls,
        connections,
        url,
    }
}

async fn db_url(pool: &PgPool) -> String {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let o = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{db}",
        o.get_username(),
        o.get_host(),
        o.get_port()
    )
}

/// A real `toolgate serve` exporting to `otlp`, each batch sent after `batch_delay_ms` (or
/// when it holds 4096 spans).
async fn serve(
    pool: &PgPool,
    tools: &std::path::Path,
    otlp: &str,
    batch_delay_ms: u64,
) -> (tokio::process::Child, String) {
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--database-url", &db_url(pool).await])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .arg("--tools-dir")
        .arg(tools)
        .args(["--policies-dir", "/nonexistent"])
        .env("TOOLGATE_ADMIN_TOKEN", ADMIN)
        .env("TOOLGATE_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_SERVICE_NAME", "toolgate-under-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", batch_delay_ms.to_string())
        // However slowly it starts (each readiness poll is a span), no batch fills up early.
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
        .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/readyz"))
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
    (child, base)
}

async fn admin(http: &reqwest::Client, method: reqwest::Method, url: String, body: Value) -> Value {
    let r = http
        .request(method, url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

async fn token(http: &reqwest::Client, base: &str, agent: &str, grants: &[&str]) -> String {
    let post = reqwest::Method::POST;
    admin(
        http,
        post.clone(),
        format!("{base}/api/v1/agents"),
        json!({"name": agent}),
    )
    .await;
    for g in grants {
        admin(
            http,
            post.clone(),
            format!("{base}/api/v1/agents/{agent}/grants"),
            json!({"target": g}),
        )
        .await;
    }
    let client = admin(
        http,
        post,
        format!("{base}/api/v1/agents/{agent}/clients"),
        json!({}),
    )
    .await;
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
    token["access_token"].as_str().unwrap().to_owned()
}

/// The official client, sending the caller's trace context with each request.
async fn mcp_client(
    base: &str,
    token: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let mut headers = HashMap::new();
    headers.insert(
        http::HeaderName::from_static("traceparent"),
        http::HeaderValue::from_str(&format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")).unwrap(),
    );
    headers.insert(
        http::HeaderName::from_static("tracestate"),
        http::HeaderValue::from_static("agentvendor=t61rcWkgMzE"),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"))
        .auth_header(token.to_owned())
        .custom_headers(headers);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP handshake with toolgate")
}

fn call_params(name: &str, args: Value) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_owned());
    if let Value::Object(m) = args {
        p.arguments = Some(m);
    }
    p
}

fn is_call_of(s: &Span, tool: &str) -> bool {
    hex(&s.trace_id) == TRACE_ID && text_attr(s, "toolgate.tool").as_deref() == Some(tool)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const SHOW_ENV: &str = r#"#!/bin/sh
cat >/dev/null
printf '{"traceparent":"%s","tracestate":"%s"}\n' "$TRACEPARENT" "$TRACESTATE"
"#;

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_call_continues_the_callers_trace_into_scripts_and_upstreams(pool: PgPool) {
    let (receiver, otlp) = Receiver::start().await;
    let Upstream {
        traceparents: upstream_saw,
        url: upstream_url,
        ..
    } = start_upstream().await;
    let tools = tempfile::tempdir().unwrap();
    write_group(
        tools.path(),
        "env",
        &single_op("show", json!({"type": "object"}), json!({})),
        &[("show.sh", SHOW_ENV)],
    );
    let (_server, base) = serve(&pool, tools.path(), &otlp, 50).await;
    let http = reqwest::Client::new();
    admin(
        &http,
        reqwest::Method::PUT,
        format!("{base}/api/v1/upstreams/up"),
        json!({"transport": "http", "url": upstream_url, "timeout_ms": 5000, "refresh_secs": 1}),
    )
    .await;
    let token = token(&http, &base, "tracer", &["env", "up"]).await;
    let client = mcp_client(&base, &token).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .any(|t| t.name == "up__echo")
    {
        assert!(
            Instant::now() < deadline,
            "the upstream's tool never appeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A script tool: its span continues the caller's trace, and the script is handed it.
    let shown = client
        .call_tool(call_params("env__show", json!({})))
        .await
        .unwrap();
    assert_ne!(shown.is_error, Some(true), "{shown:?}");
    let env = shown.structured_content.expect("the script's JSON");
    let span = receiver
        .wait_for("for the env__show call", |s| is_call_of(s, "env__show"))
        .await;
    assert_eq!(
        hex(&span.parent_span_id),
        CLIENT_SPAN,
        "parent is the client's span"
    );
    assert_eq!(span.name, "POST /mcp");
    assert_eq!(span.kind, 2, "a server span");
    assert_eq!(
        text_attr(&span, "toolgate.agent").as_deref(),
        Some("tracer")
    );
    assert_eq!(
        text_attr(&span, "toolgate.outcome").as_deref(),
        Some("success")
    );
    assert_eq!(
        text_attr(&span, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(text_attr(&span, "http.route").as_deref(), Some("/mcp"));
    assert_eq!(
        attr(&span, "http.response.status_code"),
        Some(Any::IntValue(200))
    );
    let (call_id, details): (String, String) = sqlx::query_as(
        "SELECT call_id, details FROM audit_events WHERE tool = 'env__show' AND event_type = 'tool.result'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(text_attr(&span, "toolgate.call_id"), Some(call_id));
    let details: Value = serde_json::from_str(&details).unwrap();
    assert_eq!(
        details["trace_id"], TRACE_ID,
        "the audit row names the trace"
    );
    // The core path's steps are children of the request's span; the script's parent is the
    // run's span, in the caller's trace, with its state.
    let request_span = hex(&span.span_id);
    let child = |name: &'static str| {
        let request_span = request_span.clone();
        let receiver = &receiver;
        async move {
            receiver
                .wait_for(name, |s| {
                    s.name.starts_with(name) && hex(&s.parent_span_id) == request_span
                })
                .await
        }
    };
    for step in ["toolgate.resolve", "toolgate.limit"] {
        child(step).await;
    }
    // The started row and the result, each committed in a span of its own.
    let commits = || {
        receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == "toolgate.audit.commit" && hex(&s.parent_span_id) == request_span)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while commits() < 2 {
        assert!(Instant::now() < deadline, "{} commit span(s)", commits());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(commits(), 2);
    let run = child("execute_tool env__show").await;
    assert_eq!(
        text_attr(&run, "gen_ai.tool.name").as_deref(),
        Some("env__show")
    );
    assert_eq!(
        env["traceparent"],
        format!("00-{TRACE_ID}-{}-01", hex(&run.span_id)),
        "{env}"
    );
    assert_eq!(env["tracestate"], "agentvendor=t61rcWkgMzE");

    // The REST projection of the same tool is traced the same way, under its route.
    let rest = http
        .post(format!("{base}/tools/env/show"))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 200);
    let rest_env: Value = rest.json().await.unwrap();
    let span = receiver
        .wait_for("for the REST call", |s| {
            is_call_of(s, "env__show") && s.name == "POST /tools/{*path}"
        })
        .await;
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        text_attr(&span, "url.path").as_deref(),
        Some("/tools/env/show")
    );
    let rest_span = hex(&span.span_id);
    let run = receiver
        .wait_for("the REST call's run", |s| {
            s.name == "execute_tool env__show" && hex(&s.parent_span_id) == rest_span
        })
        .await;
    assert_eq!(
        rest_env["traceparent"],
        format!("00-{TRACE_ID}-{}-01", hex(&run.span_id))
    );

    // An upstream tool: the upstream is sent the trace as a header.
    let echoed = client
        .call_tool(call_params("up__echo", json!({"message": "hi"})))
        .await
        .unwrap();
    assert_ne!(echoed.is_error, Some(true), "{echoed:?}");
    let span = receiver
        .wait_for("for the up__echo call", |s| is_call_of(s, "up__echo"))
        .await;
    assert_eq!(
        text_attr(&span, "toolgate.outcome").as_deref(),
        Some("success")
    );
    let up_span = hex(&span.span_id);
    let run = receiver
        .wait_for("the upstream call's run", |s| {
            s.name == "execute_tool up__echo" && hex(&s.parent_span_id) == up_span
        })
        .await;
    let expected = format!("00-{TRACE_ID}-{}-01", hex(&run.span_id));
    let saw = upstream_saw.lock().unwrap().clone();
    assert!(
        saw.contains(&expected),
        "upstream saw {saw:?}, not {expected}"
    );
    // Its own background traffic (the tool list) belongs to no caller's trace.
    assert_eq!(
        saw.iter().filter(|t| t.contains(TRACE_ID)).count(),
        1,
        "{saw:?}"
    );

    // A refused call is traced with its outcome too.
    let refused = client
        .call_tool(call_params("secret__tool", json!({})))
        .await;
    assert!(refused.is_err() || refused.unwrap().is_error == Some(true));
    let span = receiver
        .wait_for("for the refused call", |s| is_call_of(s, "secret__tool"))
        .await;
    assert_eq!(
        text_attr(&span, "toolgate.outcome").as_deref(),
        Some("unknown_tool")
    );
    assert_eq!(
        receiver
            .service_names
            .lock()
            .unwrap()
            .first()
            .map(String::as_str),
        Some("toolgate-under-test")
    );
    client.cancel().await.unwrap();
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_malformed_traceparent_starts_a_new_trace_and_spans_are_flushed_at_exit(pool: PgPool) {
    let (receiver, otlp) = Receiver::start().await;
    let tools = tempfile::tempdir().unwrap();
    // Batches wait ten minutes: whatever arrives was sent by the shutdown flush.
    let (mut server, base) = serve(&pool, tools.path(), &otlp, 600_000).await;
    let http = reqwest::Client::new();
    for bad in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "garbage",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        let r = http
            .get(format!("{base}/.well-known/oauth-authorization-server"))
            .header("traceparent", bad)
            .header("tracestate", "=,,bad key")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    drop(http);
    assert!(
        receiver.spans.lock().unwrap().is_empty(),
        "exported before exit"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("toolgate did not stop on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = receiver.spans.lock().unwrap().clone();
    let metadata: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "GET /.well-known/oauth-authorization-server")
        .collect();
    assert!(
        metadata.len() >= 3,
        "the last spans were not flushed: {spans:?}"
    );
    // The readiness polls that waited for the server to start left no trace.
    assert!(
        !spans
            .iter()
            .any(|s| s.name.contains("/readyz") || s.name.contains("/healthz")),
        "health probes were traced: {spans:?}"
    );
    for s in metadata {
        assert!(
            s.parent_span_id.is_empty(),
            "a bad traceparent was followed: {s:?}"
        );
        assert_ne!(hex(&s.trace_id), TRACE_ID);
    }
}
