//! MCP request handling: one HTTP request to `/mcp` through the real router in process, as the
//! dev agent `fuzzer`, which is granted the group `open` and the tool `mixed__allowed` of a
//! pool that also holds `mixed__hidden` and the group `secret`. Scripts really run.
//!
//! Input: either a bare request body (sent as a POST with the usual MCP headers), or
//! `<METHOD>\n<Name: value lines>\n\n<body>` with every header given (Host defaults to
//! 127.0.0.1). A body that starts with a space is sent to an agent whose discovery mode is
//! search (a search meta-tool and pinned tools), any other to one that lists in full.
//!
//! Invariants beyond "no panic": no 500; a JSON response is JSON and every JSON-RPC message in
//! it is a result or an error object with an integer code and a message; a `tools/list` answer
//! names only granted tools (and the meta tools); nothing an ungranted tool's definition says
//! is ever sent (beyond what the input itself holds, which an error may echo).

#![no_main]

use std::net::SocketAddr;
use std::sync::LazyLock;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use clap::Parser;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use tower::ServiceExt;

use toolgate::state::{AppState, Settings};
use toolgate::audit::writer::AuditLog;
use toolgate::config::{Cli, Command};
use toolgate::policy::snapshot::{AgentRecord, Discovery, GrantRecord, PolicyState};

/// Written only in the definitions of tools the agent is not granted.
const MARKER: &str = "UNGRANTEDMARKER";
/// The ungranted tools' whole descriptions.
const HIDDEN_TEXTS: [&str; 2] = ["UNGRANTEDMARKER hidden tool", "UNGRANTEDMARKER secret tool"];
const VISIBLE: [&str; 2] = ["open__echo", "mixed__allowed"];

struct Fixture {
    rt: tokio::runtime::Runtime,
    full: Router,
    search: Router,
}

fn group(root: &std::path::Path, name: &str, ops: &[(&str, &str)]) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut paths = serde_json::Map::new();
    for (op, description) in ops {
        paths.insert(
            format!("/{op}"),
            json!({"post": {"operationId": op, "summary": op, "description": description,
                "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                    "properties": {"text": {"type": "string", "maxLength": 64, "x-mcp-header": "Text"},
                                   "n": {"type": "integer", "minimum": 0}},
                    "additionalProperties": false}}}},
                "responses": {"200": {"description": "ok"}}}}),
        );
        toolgate_fuzz::script(
            &dir.join(format!("{op}.sh")),
            "#!/bin/sh\ncat >/dev/null\necho '{\"ok\": true}'\n",
        );
    }
    let doc = json!({"openapi": "3.1.0", "info": {"title": name, "version": "1"}, "paths": paths});
    std::fs::write(dir.join("openapi.json"), doc.to_string()).unwrap();
}

fn app(rt: &tokio::runtime::Runtime, tools: &std::path::Path, discovery: Discovery) -> Router {
    let args = [
        "toolgate",
        "serve",
        "--tools-dir",
        tools.to_str().unwrap(),
        "--dev-agent",
        "fuzzer",
        "--bind",
        "127.0.0.1:8080",
        "--script-timeout-ms",
        "5000",
    ];
    let Command::Serve(serve) = Cli::parse_from(args).command else {
        unreachable!()
    };
    let settings = Settings::from_args(&serve).unwrap();
    let surfaces = toolgate::app::Surfaces::from_args(&serve, &settings).unwrap();
    let _guard = rt.enter();
    // Nothing on this path may need the database; a refused port fails fast if it tries.
    let db = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(200))
        .connect_lazy("postgres://fuzz@127.0.0.1:1/none")
        .unwrap();
    let state = AppState::with_audit(settings, db, AuditLog::disabled_for_benchmarks());
    state.reload_pool();
    let grant = |target: &str| GrantRecord {
        id: uuid::Uuid::now_v7(),
        target: target.into(),
        created_by: "fuzz".into(),
        created_at: chrono::Utc::now(),
    };
    state.policy.set_state(PolicyState {
        agents: vec![AgentRecord {
            id: uuid::Uuid::now_v7(),
            name: "fuzzer".into(),
            description: String::new(),
            notes: String::new(),
            discovery,
            pinned: vec!["mixed__allowed".into()],
            managed: None,
            grants: vec![grant("open"), grant("mixed__allowed")],
            limits: Vec::new(),
            // Calls of this tool also go through the argument-rule check.
            arguments: vec![toolgate::policy::arguments::ArgumentRules {
                target: "mixed__allowed".into(),
                params: toolgate::policy::arguments::parse_params(&json!({"n": {"maximum": 10}}))
                    .unwrap(),
            }],
            approvals: Vec::new(),
            users: Vec::new(),
        }],
        ..PolicyState::default()
    });
    assert_eq!(
        state.policy.load().catalog.len(),
        4,
        "the fixture pool loads"
    );
    toolgate::app::router(state, surfaces)
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tools = toolgate_fuzz::scratch("mcp").join("tools");
    group(&tools, "open", &[("echo", "Echoes its input.")]);
    group(
        &tools,
        "mixed",
        &[("allowed", "An allowed tool."), ("hidden", HIDDEN_TEXTS[0])],
    );
    group(&tools, "secret", &[("peek", HIDDEN_TEXTS[1])]);
    let full = app(&rt, &tools, Discovery::Full);
    let search = app(&rt, &tools, Discovery::Search);
    Fixture { rt, full, search }
});

const METHODS: [&str; 5] = ["POST", "GET", "DELETE", "PUT", "OPTIONS"];

fn request(data: &[u8]) -> Option<(bool, http::Request<Body>)> {
    let mut builder = http::Request::builder().uri("/mcp");
    let structured = METHODS
        .iter()
        .find(|m| data.starts_with(m.as_bytes()) && data.get(m.len()) == Some(&b'\n'));
    let (search, body) = match structured {
        Some(method) => {
            let rest = &data[method.len() + 1..];
            let split = rest.windows(2).position(|w| w == b"\n\n");
            let (head, body) = match split {
                Some(i) => (&rest[..i], &rest[i + 2..]),
                None => (rest, &b""[..]),
            };
            builder = builder.method(*method);
            let mut host = false;
            for line in head.split(|b| *b == b'\n') {
                let Some(colon) = line.iter().position(|b| *b == b':') else {
                    continue;
                };
                let name = http::HeaderName::from_bytes(&line[..colon]);
                let value = http::HeaderValue::from_bytes(line[colon + 1..].trim_ascii());
                if let (Ok(name), Ok(value)) = (name, value) {
                    host |= name == http::header::HOST;
                    builder = builder.header(name, value);
                }
            }
            if !host {
                builder = builder.header(http::header::HOST, "127.0.0.1");
            }
            (body.first() == Some(&b' '), body)
        }
        None => {
            builder = builder
                .method("POST")
                .header(http::header::HOST, "127.0.0.1")
                .header(http::header::ACCEPT, "application/json, text/event-stream")
                .header(http::header::CONTENT_TYPE, "application/json")
                .header("mcp-protocol-version", "2025-06-18");
            (data.first() == Some(&b' '), data)
        }
    };
    let req = builder
        .extension(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40000))))
        .body(Body::from(body.to_vec()))
        .ok()?;
    Some((search, req))
}

/// Checks one JSON-RPC message of an answer.
fn check_message(m: &Value) {
    let Some(obj) = m.as_object() else {
        panic!("a JSON-RPC answer that is not an object: {m}");
    };
    assert_eq!(obj.get("jsonrpc"), Some(&json!("2.0")), "{m}");
    match (obj.get("result"), obj.get("error")) {
        (Some(result), None) => {
            if let Some(tools) = result.get("tools").and_then(Value::as_array) {
                for t in tools {
                    let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
                    assert!(
                        VISIBLE.contains(&name) || toolgate::search::is_meta_tool(name),
                        "tools/list names `{name}`, which is not granted: {m}"
                    );
                }
            }
        }
        (None, Some(error)) => {
            assert!(
                error.get("code").is_some_and(Value::is_i64),
                "error without an integer code: {m}"
            );
            assert!(
                error.get("message").is_some_and(Value::is_string),
                "error without a message: {m}"
            );
        }
        // A request or notification from the server has neither.
        (None, None) if obj.contains_key("method") => {}
        _ => panic!("a JSON-RPC answer with both or neither of result and error: {m}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let f = &*FIXTURE;
    let Some((search, req)) = request(data) else {
        return;
    };
    let router = if search { &f.search } else { &f.full };
    let (status, content_type, body) = f.rt.block_on(async {
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, content_type, body)
    });
    assert_ne!(
        status,
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "500: {}",
        String::from_utf8_lossy(&body)
    );
    // The server may echo what it was sent (an unknown method's name, in its error): text the
    // input holds is no leak. Without the marker in the input, none of it may come back; with
    // it, no ungranted tool's description the input does not hold.
    let contains =
        |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    let leaked = if contains(data, MARKER) {
        HIDDEN_TEXTS
            .iter()
            .any(|t| contains(&body, t) && !contains(data, t))
    } else {
        contains(&body, MARKER)
    };
    assert!(
        !leaked,
        "an ungranted tool's definition was sent: {}",
        String::from_utf8_lossy(&body)
    );
    if body.is_empty() {
        return;
    }
    let messages: Vec<Value> = if content_type.starts_with("application/json") {
        let v: Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "a JSON answer that is not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            )
        });
        match v {
            Value::Array(list) => list,
            v => vec![v],
        }
    } else if content_type.starts_with("text/event-stream") {
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_json::from_str(d.trim()).expect("an SSE event that is not JSON"))
            .collect()
    } else {
        Vec::new()
    };
    for m in &messages {
        // Plain HTTP errors (401, 406...) are JSON objects, not JSON-RPC.
        if m.get("jsonrpc").is_some() {
            check_message(m);
        }
    }
});
