//! `TestApp`: the real router over a fresh database, driven in process.

use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::Body;
use clap::Parser;
use http::{Request, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;

use toolgate::config::{Cli, Command};
use toolgate::state::{AppState, Settings};

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// The repository's own example tools and policies.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub struct TestApp {
    pub state: AppState,
    pub router: Router,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl TestApp {
    /// The example tools and policies, as `toolgate serve` would load them.
    pub async fn new(pool: PgPool) -> Self {
        Self::with(pool, &repo_path("tools"), Some(&repo_path("policies")), &[]).await
    }

    pub async fn with(
        pool: PgPool,
        tools: &Path,
        policies: Option<&Path>,
        extra_args: &[&str],
    ) -> Self {
        let mut args = vec![
            "toolgate",
            "serve",
            "--tools-dir",
            tools.to_str().unwrap(),
            "--admin-token",
            ADMIN_TOKEN,
        ];
        args.extend_from_slice(extra_args);
        let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
            unreachable!()
        };
        let settings = Settings::from_args(&serve).unwrap();
        let surfaces = toolgate::app::Surfaces::from_args(&serve, &settings).unwrap();
        toolgate::service::keys::ensure_first(&pool).await.unwrap();
        if let Some(dir) = policies {
            let catalog = toolgate::pool::loader::load_pool(tools, None, &settings.loader);
            toolgate::policy::files::apply_dir(&pool, dir, &catalog, "test", false, false, false)
                .await
                .unwrap();
        }
        let state = AppState::new(settings, pool);
        state.reload_pool();
        state.reload_policy().await.unwrap();
        let router = toolgate::app::router(state.clone(), surfaces);
        Self { state, router }
    }

    pub async fn send(&self, mut req: Request<Body>) -> Reply {
        // A real client always sends Host; the MCP transport checks it against the allow-list.
        if !req.headers().contains_key("host") {
            req.headers_mut()
                .insert("host", http::HeaderValue::from_static("127.0.0.1:8787"));
        }
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
            text,
        }
    }

    pub async fn get(&self, uri: &str, token: Option<&str>) -> Reply {
        let mut req = Request::get(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        self.send(req.body(Body::empty()).unwrap()).await
    }

    pub async fn post_json(&self, uri: &str, token: Option<&str>, body: Value) -> Reply {
        let mut req = Request::post(uri).header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        self.send(req.body(Body::from(body.to_string())).unwrap())
            .await
    }

    pub async fn admin(&self, method: &str, uri: &str, body: Option<Value>) -> Reply {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("content-type", "application/json");
        self.send(
            req.body(body.map(|b| Body::from(b.to_string())).unwrap_or_default())
                .unwrap(),
        )
        .await
    }

    /// Creates an OAuth client for `agent` through the admin API.
    pub async fn client_for(&self, agent: &str) -> (String, String) {
        let r = self
            .admin("POST", &format!("/api/v1/agents/{agent}/clients"), None)
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        (
            r.body["client_id"].as_str().unwrap().to_owned(),
            r.body["client_secret"].as_str().unwrap().to_owned(),
        )
    }

    pub async fn token_request(&self, form: &[(&str, &str)], basic: Option<(&str, &str)>) -> Reply {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let mut req = Request::post("/oauth/token")
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some((id, secret)) = basic {
            use base64::Engine;
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
            req = req.header("authorization", format!("Basic {b}"));
        }
        self.send(req.body(Body::from(body)).unwrap()).await
    }

    /// A fresh access token for `agent` (client_secret_basic).
    pub async fn token_for(&self, agent: &str) -> String {
        let (id, secret) = self.client_for(agent).await;
        self.token_with(&id, &secret).await
    }

    pub async fn token_with(&self, id: &str, secret: &str) -> String {
        let r = self
            .token_request(&[("grant_type", "client_credentials")], Some((id, secret)))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body["access_token"].as_str().unwrap().to_owned()
    }

    /// One JSON-RPC request on /mcp as a legacy (2025-11-25) client, statelessly.
    pub async fn mcp(&self, token: Option<&str>, method: &str, params: Value) -> Reply {
        let headers = [
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        self.send(mcp_request(token, json!(1), method, params, &headers))
            .await
    }

    /// Names from `tools/list`, following every cursor.
    pub async fn tool_names(&self, token: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let r = self.mcp(Some(token), "tools/list", params).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            let result = &r.body["result"];
            names.extend(
                result["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_owned()),
            );
            match result["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return names,
            }
        }
    }

    pub async fn call(&self, token: &str, name: &str, args: Value) -> Reply {
        self.mcp(
            Some(token),
            "tools/call",
            json!({"name": name, "arguments": args}),
        )
        .await
    }
}

/// Writes a tool group folder: `openapi.json` plus executable scripts.
/// A JSON-RPC POST to /mcp with the bearer `token` and `headers` as given, nothing more.
pub fn mcp_request(
    token: Option<&str>,
    id: Value,
    method: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> Request<Body> {
    let mut req = Request::post("/mcp").header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    req.body(Body::from(body.to_string())).unwrap()
}

pub fn write_group(root: &Path, folder: &str, openapi: &Value, scripts: &[(&str, &str)]) {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(folder);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("openapi.json"),
        serde_json::to_vec_pretty(openapi).unwrap(),
    )
    .unwrap();
    for (name, body) in scripts {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A one-operation OpenAPI document: `POST /<op>` with the given body schema.
pub fn single_op(op: &str, body_schema: Value, extra: Value) -> Value {
    let mut operation = json!({
        "operationId": op,
        "summary": format!("The {op} operation"),
        "requestBody": {"required": true, "content": {"application/json": {"schema": body_schema}}},
        "responses": {"200": {"description": "ok"}}
    });
    if let (Value::Object(o), Value::Object(e)) = (&mut operation, extra) {
        o.extend(e);
    }
    json!({"openapi": "3.1.0", "info": {"title": op, "version": "1"}, "paths": {format!("/{op}"): {"post": operation}}})
}

impl TestApp {
    /// Creates an agent with grants and returns a token for it.
    pub async fn agent(&self, name: &str, grants: &[&str]) -> String {
        self.agent_in_mode(name, None, grants).await
    }

    /// Creates an agent with a discovery mode (default: the server's) and grants through the
    /// admin API; returns a token for it.
    pub async fn agent_in_mode(
        &self,
        name: &str,
        discovery: Option<&str>,
        grants: &[&str],
    ) -> String {
        let mut body = json!({"name": name});
        if let Some(d) = discovery {
            body["discovery"] = json!(d);
        }
        let r = self.admin("POST", "/api/v1/agents", Some(body)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        for g in grants {
            let r = self
                .admin(
                    "POST",
                    &format!("/api/v1/agents/{name}/grants"),
                    Some(json!({"target": g})),
                )
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        }
        self.token_for(name).await
    }
}

impl TestApp {
    /// A JSON POST whose future owns its arguments, for running many at once.
    pub async fn post_owned(&self, uri: String, token: String, body: Value) -> StatusCode {
        self.post_json(&uri, Some(&token), body).await.status
    }
}

/// Polls `check` every 20 ms until it holds; panics with `what` after `deadline`.
pub async fn until<F, Fut>(
    deadline: std::time::Duration,
    what: &str,
    mut check: F,
) -> std::time::Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < deadline {
        if check().await {
            return start.elapsed();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {deadline:?}");
}

/// Refusals on record among the audit rows matching `filter` (an SQL condition): one per row,
/// plus the repeats each summary row counts (identical refusals from one source are written as
/// their first row and one row with their count, see `toolgate::limits::refusals`). The open
/// summaries and the audit log are flushed first, so every refusal made so far is counted.
pub async fn refusals_on_record(app: &TestApp, filter: &str) -> i64 {
    app.state.refusals.flush();
    app.state.audit.flush().await.unwrap();
    sqlx::query_scalar(&format!(
        "SELECT COALESCE(SUM(COALESCE((details::jsonb #>> '{{summary,repeats}}')::bigint, 1)), 0)::bigint
         FROM audit_events WHERE {filter}"
    ))
    .fetch_one(&app.state.db)
    .await
    .unwrap()
}

/// p50 latency, in µs, of REST calls to `paths[0]` and `paths[1]` with `token`, interleaved
/// over `rounds` (the first 20 are warm-up and not counted), each answer checked by `check`:
/// the two figures of one run that a cost ratio compares.
pub async fn interleaved_p50(
    app: &TestApp,
    token: &str,
    paths: [&str; 2],
    rounds: usize,
    check: impl Fn(&Reply),
) -> (f64, f64) {
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, path) in paths.into_iter().enumerate() {
            let started = std::time::Instant::now();
            let r = app.post_json(path, Some(token), json!({})).await;
            let us = started.elapsed().as_secs_f64() * 1e6;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            check(&r);
            if round >= 20 {
                times[i].push(us);
            }
        }
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[(v.len() - 1) / 2]
    };
    (p50(&mut times[0]), p50(&mut times[1]))
}
