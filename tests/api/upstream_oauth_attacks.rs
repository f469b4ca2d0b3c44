//! Attacks on a person's connection to an upstream's own authorization server ("Connect" on
//! My connections): hostile discovery documents, forged and replayed callbacks, another
//! person's slot, a hostile token endpoint, and typed values in a connected slot.
//!
//! The upstream here is a hostile server this test controls completely: one axum server that
//! is an MCP server (the official SDK, rmcp, answering with JSON), publishes whatever
//! protected-resource and authorization-server metadata a test wants under its own origin, and
//! plays the authorization server's token endpoint. The browser's visit to the authorization
//! endpoint is not needed: the test takes `state` from toolgate's redirect and comes back to
//! the callback with a code the fake token endpoint knows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, Request, StatusCode, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::authcode::{document_server, query_of};
use crate::helpers::{Reply, TestApp, repo_path, until};
use crate::upstream::{put_upstream, text, wait_for_tools};
use crate::web::{Browser, csrf_of, location};

/// What the upstream's catalog is read with (the upstream's own credential).
const LISTER: &str = "lister-token-0123456789";
const CLIENT: &str = "toolgate-at-hostile";
/// The host's redirect URI and PKCE verifier, for host tokens of people acting as `assistant`.
/// Bytes a hostile token endpoint streams when told to be enormous.
const ENORMOUS: usize = 64 << 20;

/// One metadata document as the hostile server serves it.
#[derive(Clone)]
enum Doc {
    /// The well-behaved document for this server.
    Good,
    Json(Value),
    /// 128 KiB of JSON-ish bytes streamed without a length.
    Huge,
    /// The headers, one byte, then nothing, ever.
    Stall,
    /// A 302 to `to`.
    Redirect(String),
}

/// What the hostile server does, and what it saw.
struct Plan {
    base: String,
    prm: Doc,
    asm: Doc,
    /// `expires_in` of the grants it issues.
    expires_in: u64,
    /// Every form posted to its token endpoint.
    token_requests: Vec<HashMap<String, String>>,
    /// Requests for its metadata documents.
    discovery_hits: usize,
    /// Headers of every request to `/mcp`.
    mcp_headers: Vec<HeaderMap>,
}

struct Hostile {
    plan: Arc<Mutex<Plan>>,
    /// Bytes of enormous answers the client pulled.
    pulled: Arc<AtomicUsize>,
    addr: SocketAddr,
}

impl Hostile {
    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn set(&self, f: impl FnOnce(&mut Plan)) {
        f(&mut self.plan.lock().unwrap());
    }

    fn token_requests(&self) -> Vec<HashMap<String, String>> {
        self.plan.lock().unwrap().token_requests.clone()
    }

    fn discovery_hits(&self) -> usize {
        self.plan.lock().unwrap().discovery_hits
    }

    /// Every value of `name` the upstream received on `/mcp`.
    fn mcp_header_values(&self, name: &str) -> Vec<Vec<u8>> {
        self.plan
            .lock()
            .unwrap()
            .mcp_headers
            .iter()
            .flat_map(|h| h.get_all(name).iter().map(|v| v.as_bytes().to_vec()))
            .collect()
    }

    fn mcp_header_names(&self) -> Vec<String> {
        self.plan
            .lock()
            .unwrap()
            .mcp_headers
            .iter()
            .flat_map(|h| h.keys().map(|k| k.as_str().to_owned()))
            .collect()
    }
}

/// The MCP side: `whoami` says whose token this call carried (the part of `at-<who>-…`),
/// `leak` repeats the Authorization header it received.
#[derive(Clone)]
struct Mcp;

fn tool(name: &str, description: &str) -> rmcp::model::Tool {
    let Value::Object(schema) = json!({"type": "object"}) else {
        unreachable!()
    };
    rmcp::model::Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
}

impl ServerHandler for Mcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            tool("whoami", "Says whose token the call carried."),
            tool("leak", "Repeats the Authorization header it was sent."),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let auth = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("authorization")?.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let said = match request.name.as_ref() {
            "whoami" => match auth.strip_prefix("Bearer at-") {
                Some(rest) => rest.split('-').next().unwrap_or("").to_owned(),
                None if auth == format!("Bearer {LISTER}") => "lister".to_owned(),
                None => "nobody".to_owned(),
            },
            "leak" => format!("my token is {auth} (that is: {auth})"),
            _ => return Err(ErrorData::invalid_params("no such tool", None)),
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(said)]).into())
    }
}

fn serve_doc(doc: Doc, good: Value) -> Response {
    match doc {
        Doc::Good => axum::Json(good).into_response(),
        Doc::Json(v) => axum::Json(v).into_response(),
        Doc::Huge => {
            let chunk = bytes::Bytes::from(vec![b' '; 16 * 1024]);
            let s =
                futures::stream::iter((0..8).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
            Body::from_stream(s).into_response()
        }
        Doc::Stall => {
            use futures::StreamExt;
            let s =
                futures::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from("{")) })
                    .chain(futures::stream::pending());
            Body::from_stream(s).into_response()
        }
        Doc::Redirect(to) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
    }
}

/// The hostile upstream and its authorization server, on one loopback port.
async fn hostile() -> Hostile {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}");
    let plan = Arc::new(Mutex::new(Plan {
        base: base.clone(),
        prm: Doc::Good,
        asm: Doc::Good,
        expires_in: 3600,
        token_requests: Vec::new(),
        discovery_hits: 0,
        mcp_headers: Vec::new(),
    }));
    let pulled = Arc::new(AtomicUsize::new(0));

    let prm = {
        let plan = plan.clone();
        move || {
            let plan = plan.clone();
            async move {
                let (doc, base) = {
                    let mut p = plan.lock().unwrap();
                    p.discovery_hits += 1;
                    (p.prm.clone(), p.base.clone())
                };
                serve_doc(
                    doc,
                    json!({"resource": format!("{base}/mcp"),
                           "authorization_servers": [format!("{base}/as")]}),
                )
            }
        }
    };
    let asm = {
        let plan = plan.clone();
        move || {
            let plan = plan.clone();
            async move {
                let (doc, base) = {
                    let mut p = plan.lock().unwrap();
                    p.discovery_hits += 1;
                    (p.asm.clone(), p.base.clone())
                };
                serve_doc(doc, good_as(&base))
            }
        }
    };
    let token = {
        let plan = plan.clone();
        let pulled = pulled.clone();
        move |form: axum::Form<HashMap<String, String>>| {
            let plan = plan.clone();
            let pulled = pulled.clone();
            async move { token_endpoint(&plan, &pulled, form.0) }
        }
    };
    let mcp = StreamableHttpService::new(
        || Ok(Mcp),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true),
    );
    let seen = {
        let plan = plan.clone();
        move |req: Request<Body>, next: axum::middleware::Next| {
            let plan = plan.clone();
            async move {
                if req.uri().path().starts_with("/mcp") {
                    plan.lock().unwrap().mcp_headers.push(req.headers().clone());
                }
                next.run(req).await
            }
        }
    };
    let app = Router::new()
        .nest_service("/mcp", mcp)
        .route("/.well-known/oauth-protected-resource/mcp", get(prm))
        .route("/.well-known/oauth-authorization-server/as", get(asm))
        .route("/as/token", post(token))
        .layer(axum::middleware::from_fn(seen));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Hostile { plan, pulled, addr }
}

fn good_as(base: &str) -> Value {
    json!({
        "issuer": format!("{base}/as"),
        "authorization_endpoint": format!("{base}/as/authorize"),
        "token_endpoint": format!("{base}/as/token"),
        "code_challenge_methods_supported": ["S256"],
    })
}

/// The token endpoint: `code-<who>` gives `at-<who>-<n>…`; `crlf-<who>` a token carrying a
/// second header; `huge` an enormous token streamed without a length; a refresh gives a
/// fresh token; anything else is refused.
fn token_endpoint(
    plan: &Mutex<Plan>,
    pulled: &Arc<AtomicUsize>,
    form: HashMap<String, String>,
) -> Response {
    let (n, expires_in) = {
        let mut p = plan.lock().unwrap();
        p.token_requests.push(form.clone());
        (p.token_requests.len(), p.expires_in)
    };
    let grant = |access: String, who: &str| {
        axum::Json(json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": expires_in,
            "refresh_token": format!("rt-{who}-0123456789"),
        }))
        .into_response()
    };
    let refused = || {
        (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant"})),
        )
            .into_response()
    };
    let code = form.get("code").cloned().unwrap_or_default();
    match form.get("grant_type").map(String::as_str) {
        Some("refresh_token") => {
            let rt = form.get("refresh_token").cloned().unwrap_or_default();
            let who = rt.split('-').nth(1).unwrap_or("x").to_owned();
            grant(format!("at-{who}-{n}-refreshed-padding"), &who)
        }
        Some("authorization_code") if code == "huge" => {
            let head = bytes::Bytes::from(
                r#"{"token_type":"Bearer","expires_in":3600,"access_token":"at-huge-"#,
            );
            let chunk = bytes::Bytes::from(vec![b'a'; 64 * 1024]);
            let tail = bytes::Bytes::from(r#""}"#);
            let pulled = pulled.clone();
            let parts = std::iter::once(head)
                .chain((0..ENORMOUS / chunk.len()).map(move |_| chunk.clone()))
                .chain(std::iter::once(tail))
                .map(move |b| {
                    pulled.fetch_add(b.len(), Ordering::SeqCst);
                    Ok::<_, std::io::Error>(b)
                });
            (
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(futures::stream::iter(parts)),
            )
                .into_response()
        }
        Some("authorization_code") => {
            if let Some(who) = code.strip_prefix("code-") {
                grant(format!("at-{who}-{n}-0123456789abcdef"), who)
            } else if let Some(who) = code.strip_prefix("crlf-") {
                grant(format!("at-{who}-{n}-x\r\nX-Smuggled: yes"), who)
            } else {
                refused()
            }
        }
        _ => refused(),
    }
}

// ---------------------------------------------------------------------------------------------
// The gateway, its people and their hosts.

struct Gate {
    app: TestApp,
    key: String,
    docs: SocketAddr,
    pool: PgPool,
}

/// A gateway with alice and bob as people of agent `assistant`, which is granted upstream
/// `hostile` (slot `LINK`, filled by connecting to its authorization server).
async fn gate(pool: PgPool, up: &Hostile) -> Gate {
    let key = crate::upstream_credentials::key();
    let docs = document_server().await;
    let app = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &["--oauth-cimd-allow-private", "--credential-key", &key],
    )
    .await;
    for person in ["alice", "bob"] {
        let r = app
            .admin(
                "PUT",
                &format!("/api/v1/agents/assistant/users/{person}"),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    }
    put_hostile(&app, "hostile", &up.url()).await;
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "hostile"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let own = app.token_for("assistant").await;
    wait_for_tools(&app, &own, "hostile").await;
    Gate {
        app,
        key,
        docs,
        pool,
    }
}

async fn put_hostile(app: &TestApp, name: &str, url: &str) {
    put_upstream(
        app,
        name,
        json!({
            "transport": "http",
            "url": url,
            "headers": {"Authorization": format!("Bearer {LISTER}")},
            "credentials": {"LINK": {"per": "person", "inject": "header Authorization \"Bearer {}\"",
                                     "oauth": {"client_id": CLIENT, "scopes": ["openid"]}}},
            "pin": false
        }),
    )
    .await;
}

/// Presses Connect on `slot` (`group/name`) on My connections.
async fn press_connect(b: &mut Browser<'_>, slot: &str) -> Reply {
    let csrf = csrf_of(&b.get("/admin/connections").await.text);
    b.post(
        &format!("/admin/connections/{slot}/connect"),
        &[("csrf", &csrf)],
    )
    .await
}

/// Where Connect sent the browser on to, if it did: a redirect, or a page that moves on by
/// itself (its `continue` link); `None` when it came back to My connections.
fn sent_on(r: &Reply) -> Option<String> {
    if r.status == StatusCode::SEE_OTHER {
        let to = location(r);
        return (to != "/admin/connections").then(|| to.to_owned());
    }
    let at = r.text.find("id=\"continue\" href=\"")?;
    let rest = &r.text[at + "id=\"continue\" href=\"".len()..];
    Some(unescape(&rest[..rest.find('"')?]))
}

/// HTML character references, as a browser reads an attribute.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let c = match entity {
            "amp" => Some('&'),
            "quot" => Some('"'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "apos" => Some('\''),
            e if e.starts_with("#x") || e.starts_with("#X") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Starts a connection that reaches the authorization server; the `state` it carries.
async fn start(b: &mut Browser<'_>, up: &Hostile) -> String {
    let r = press_connect(b, "hostile/LINK").await;
    let to = sent_on(&r).unwrap_or_default();
    if !to.starts_with(&format!("http://{}/as/authorize?", up.addr)) {
        let page = b.get("/admin/connections").await;
        panic!("Connect went to {to:?} ({}): {}", r.status, page.text);
    }
    let q = query_of(&to);
    assert_eq!(b.cookies_value("toolgate_connect"), q["state"]);
    q["state"].clone()
}

/// The way back from the authorization server, in `b` (with whatever flow cookie it holds).
async fn come_back(b: &mut Browser<'_>, state: &str, code: &str) -> Reply {
    b.get(&format!(
        "/admin/connections/callback?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([("state", state), ("code", code)])
            .finish()
    ))
    .await
}

/// A callback request carrying exactly `cookie` (a flow cookie set by hand) and `query`.
async fn callback_with_cookie(app: &TestApp, cookie: &str, query: &[(&str, &str)]) -> Reply {
    let q = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(query)
        .finish();
    let req = Request::get(format!("/admin/connections/callback?{q}"))
        .header(header::COOKIE, format!("toolgate_connect={cookie}"))
        .body(Body::empty())
        .unwrap();
    app.send(req).await
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn stored(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM credentials").await
}

async fn flows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM credential_connect_flows").await
}

async fn connected_on_record(pool: &PgPool, person: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM audit_events WHERE event_type = 'admin.change'
           AND details::jsonb->>'action' = 'credential.connected'
           AND details::jsonb->'after'->>'owner' = $1",
    )
    .bind(person)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The grant stored for `person`, opened with the test's key.
async fn stored_grant(g: &Gate, person: &str) -> Option<toolgate::credentials::oauth::Grant> {
    crate::authcode::stored_grant(&g.pool, &g.key, person, "hostile").await
}

/// A host token for `b`'s person acting as `assistant`.
async fn host_token(g: &Gate, b: &mut Browser<'_>) -> String {
    crate::authcode::host_token(&g.app, g.docs, b, "assistant").await
}

// ---------------------------------------------------------------------------------------------
// 1. Hostile discovery.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn hostile_discovery_documents_are_refused_at_connect(pool: PgPool) {
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let base = format!("http://{}", up.addr);
    let script = "<script>alert('prm')</script>";

    // (what the resource metadata is, what the server metadata is, what the flash must say)
    let cases: Vec<(&str, Doc, Doc, &str)> = vec![
        (
            "metadata about another resource (and HTML in it)",
            Doc::Json(
                json!({"resource": format!("https://elsewhere.example/{script}"),
                             "authorization_servers": [format!("{base}/as")]}),
            ),
            Doc::Good,
            "is for",
        ),
        (
            "an authorization server on plain http, not loopback",
            Doc::Json(json!({"resource": format!("{base}/mcp"),
                             "authorization_servers": ["http://as.example.com/"]})),
            Doc::Good,
            "must be https",
        ),
        (
            "a javascript: authorization server",
            Doc::Json(json!({"resource": format!("{base}/mcp"),
                             "authorization_servers": ["javascript:alert(document.cookie)"]})),
            Doc::Good,
            "must be https",
        ),
        (
            "no authorization server at all",
            Doc::Json(json!({"resource": format!("{base}/mcp"), "authorization_servers": []})),
            Doc::Good,
            "names no authorization server",
        ),
        (
            "a resource metadata document over 64 KiB without a length",
            Doc::Huge,
            Doc::Good,
            "more than 65536 bytes",
        ),
        (
            "a redirect to elsewhere",
            Doc::Redirect("https://evil.example/.well-known/oauth-protected-resource".into()),
            Doc::Good,
            "302",
        ),
        (
            "server metadata naming another issuer (mix-up)",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m["issuer"] = json!("https://honest-as.example");
                m
            }),
            "names another issuer",
        ),
        (
            "server metadata without S256",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m["code_challenge_methods_supported"] = json!(["plain"]);
                m
            }),
            "S256",
        ),
        (
            "server metadata without code_challenge_methods_supported",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m.as_object_mut()
                    .unwrap()
                    .remove("code_challenge_methods_supported");
                m
            }),
            "S256",
        ),
        (
            "an authorization endpoint on plain http, not loopback",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m["authorization_endpoint"] = json!("http://as.example.com/authorize");
                m
            }),
            "must be https",
        ),
        (
            "a javascript: authorization endpoint",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m["authorization_endpoint"] = json!("javascript:alert(1)//");
                m
            }),
            "must be https",
        ),
        (
            "a token endpoint on plain http, not loopback",
            Doc::Good,
            Doc::Json({
                let mut m = good_as(&base);
                m["token_endpoint"] = json!("http://as.example.com/token");
                m
            }),
            "must be https",
        ),
        (
            "server metadata over 64 KiB without a length",
            Doc::Good,
            Doc::Huge,
            "more than 65536 bytes",
        ),
        (
            "server metadata redirecting elsewhere",
            Doc::Good,
            Doc::Redirect("https://evil.example/.well-known/oauth-authorization-server".into()),
            "302",
        ),
        (
            "a resource metadata document that stalls",
            Doc::Stall,
            Doc::Good,
            "cannot be used right now",
        ),
        (
            "server metadata that stalls",
            Doc::Good,
            Doc::Stall,
            "cannot be used right now",
        ),
    ];
    for (what, prm, asm, says) in cases {
        up.set(|p| {
            p.prm = prm;
            p.asm = asm;
        });
        let hits = up.discovery_hits();
        let began = Instant::now();
        let r = press_connect(&mut alice, "hostile/LINK").await;
        let took = began.elapsed();
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{what}: {}", r.text);
        assert_eq!(sent_on(&r), None, "{what}: the browser was sent on");
        assert!(
            r.headers
                .get_all(header::SET_COOKIE)
                .iter()
                .all(|c| !c.to_str().unwrap().starts_with("toolgate_connect=")),
            "{what}: a flow cookie was set"
        );
        assert!(
            took < Duration::from_secs(25),
            "{what}: Connect took {took:?}"
        );
        assert!(up.discovery_hits() > hits, "{what}: nothing was asked");
        let page = alice.get("/admin/connections").await;
        assert_eq!(page.status, StatusCode::OK, "{what}: {}", page.text);
        assert!(
            page.text.contains("flash-warn") && page.text.contains(says),
            "{what}: the page does not say `{says}`: {}",
            page.text
        );
        assert!(
            !page.text.contains(script),
            "{what}: the server's words are not escaped: {}",
            page.text
        );
        assert_eq!(flows(&pool).await, 0, "{what}: a flow was stored");
        assert_eq!(stored(&pool).await, 0, "{what}: a credential was stored");
    }

    // The same server behaving: Connect goes on to it, with PKCE S256 and the upstream as the
    // resource, and the flow cookie is HttpOnly, Lax and scoped to the callback.
    up.set(|p| {
        p.prm = Doc::Good;
        p.asm = Doc::Good;
    });
    let r = press_connect(&mut alice, "hostile/LINK").await;
    let to = sent_on(&r).expect("sent on to the authorization server");
    assert!(to.starts_with(&format!("{base}/as/authorize?")), "{to}");
    let q = query_of(&to);
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(q["resource"], up.url());
    assert_eq!(q["client_id"], CLIENT);
    let cookie = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("toolgate_connect="))
        .expect("a flow cookie");
    for attr in [
        "HttpOnly",
        "SameSite=Lax",
        "Path=/admin/connections/callback",
    ] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert_eq!(flows(&pool).await, 1);
}

// ---------------------------------------------------------------------------------------------
// 2. Callbacks.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn forged_replayed_and_hostile_callbacks_store_nothing_or_once(pool: PgPool) {
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let mut bob = Browser::signed_in(&g.app, "bob", "viewer").await;

    let a = start(&mut alice, &up).await;
    let b = start(&mut bob, &up).await;
    assert_eq!(flows(&pool).await, 2);

    // Bob's state in alice's browser (her cookie holds her own state): refused, and bob's
    // flow is not spent by it.
    let r = come_back(&mut alice, &b, "code-alice").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("did not start in this browser"),
        "{}",
        r.text
    );
    // A state with no cookie at all, and an empty state with an empty cookie.
    let r = callback_with_cookie(&g.app, "", &[("state", &b), ("code", "code-mallory")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = callback_with_cookie(&g.app, "", &[("state", ""), ("code", "code-mallory")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(up.token_requests().is_empty(), "a code was exchanged");
    assert_eq!(stored(&pool).await, 0);
    assert_eq!(flows(&pool).await, 2);

    // Bob finishes his own: stored for bob, nobody else.
    let r = come_back(&mut bob, &b, "code-bob").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Connected"), "{}", r.text);
    let tr = up.token_requests();
    assert_eq!(tr.len(), 1);
    // The exchange carries the PKCE verifier of the challenge sent, and the resource.
    assert_eq!(tr[0]["resource"], up.url());
    assert!(tr[0]["code_verifier"].len() >= 43);
    assert!(stored_grant(&g, "bob").await.is_some());
    assert!(stored_grant(&g, "alice").await.is_none());

    // Replay of bob's finished callback, with his flow cookie set again by hand (in his
    // browser, and in a stranger's): nothing is exchanged or stored again.
    for code in ["code-bob", "code-mallory"] {
        let r = callback_with_cookie(&g.app, &b, &[("state", &b), ("code", code)]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        assert!(r.text.contains("already finished"), "{}", r.text);
    }
    assert_eq!(
        up.token_requests().len(),
        1,
        "a replay reached the token endpoint"
    );
    assert_eq!(
        stored_grant(&g, "bob")
            .await
            .unwrap()
            .access_token
            .split('-')
            .nth(1),
        Some("bob")
    );
    assert!(stored_grant(&g, "mallory").await.is_none());
    g.app.state.audit.flush().await.unwrap();
    assert_eq!(connected_on_record(&pool, "bob").await, 1);

    // An `error` with markup, in the browser that started it: escaped, nothing stored.
    let evil = "access_denied<script>alert(document.cookie)</script><img src=x onerror=alert(1)>";
    let r = g
        .app
        .send(
            Request::get(format!(
                "/admin/connections/callback?{}",
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs([("state", a.as_str()), ("error", evil)])
                    .finish()
            ))
            .header(header::COOKIE, format!("toolgate_connect={a}"))
            .body(Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("did not connect you"), "{}", r.text);
    assert!(!r.text.contains("<script>alert"), "{}", r.text);
    assert!(!r.text.contains("<img src=x"), "{}", r.text);
    assert!(
        unescape(&r.text).contains("<script>alert(document.cookie)</script>"),
        "{}",
        r.text
    );
    assert!(stored_grant(&g, "alice").await.is_none());

    // A huge code on a live flow: the server refuses it; the page answers, bounded,
    // does not repeat the code, and nothing is stored.
    let a2 = start(&mut alice, &up).await;
    // (As long as a request line may be: 60 000 characters.)
    let huge = "c".repeat(60_000);
    let r = come_back(&mut alice, &a2, &huge).await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        &r.text[..r.text.len().min(500)]
    );
    assert!(
        r.text.len() < 16 * 1024,
        "the page is {} bytes",
        r.text.len()
    );
    assert!(!r.text.contains(&huge[..1000]));
    assert!(stored_grant(&g, "alice").await.is_none());
    assert_eq!(stored(&pool).await, 1);

    // After all that alice can still connect, and it is hers.
    let a3 = start(&mut alice, &up).await;
    let r = come_back(&mut alice, &a3, "code-alice").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let grant = stored_grant(&g, "alice").await.unwrap();
    assert!(grant.access_token.starts_with("at-alice-"));
    assert!(
        stored_grant(&g, "bob")
            .await
            .unwrap()
            .access_token
            .starts_with("at-bob-")
    );
}

// ---------------------------------------------------------------------------------------------
// 3. People.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_person_connects_only_slots_they_reach_and_calls_stay_theirs(pool: PgPool) {
    let up = hostile().await;
    let other = hostile().await;
    let g = gate(pool.clone(), &up).await;
    // `elsewhere` has the same slot, granted to `meteo` only (alice and bob are not its people).
    put_hostile(&g.app, "elsewhere", &other.url()).await;
    let r = g
        .app
        .admin(
            "POST",
            "/api/v1/agents/meteo/grants",
            Some(json!({"target": "elsewhere"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let meteo = g.app.token_for("meteo").await;
    wait_for_tools(&g.app, &meteo, "elsewhere").await;

    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let page = alice.get("/admin/connections").await;
    assert!(!page.text.contains("elsewhere"), "{}", page.text);
    let hits = other.discovery_hits();
    for slot in [
        "elsewhere/LINK",
        "hostile/OTHER",
        "nonexistent/LINK",
        "hostile/link",
    ] {
        let r = press_connect(&mut alice, slot).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{slot}: {}", r.text);
    }
    assert_eq!(
        other.discovery_hits(),
        hits,
        "discovery ran for a slot alice cannot reach"
    );
    assert_eq!(flows(&pool).await, 0);

    // Alice and bob connect; their hosts' calls interleaved at random, many at once, each
    // carry their own token, never the other's.
    let mut bob = Browser::signed_in(&g.app, "bob", "viewer").await;
    for (b, who) in [(&mut alice, "alice"), (&mut bob, "bob")] {
        let s = start(b, &up).await;
        let r = come_back(b, &s, &format!("code-{who}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let ta = host_token(&g, &mut alice).await;
    let tb = host_token(&g, &mut bob).await;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..4 {
        let mut calls = Vec::new();
        for _ in 0..8 {
            let (token, who) = if next() & 1 == 0 {
                (ta.clone(), "alice")
            } else {
                (tb.clone(), "bob")
            };
            let app = &g.app;
            calls.push(async move {
                let r = app.call(&token, "hostile__whoami", json!({})).await;
                (who, r)
            });
        }
        for (who, r) in futures::future::join_all(calls).await {
            assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
            assert_eq!(text(&r.body), who, "{}", r.text);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. A hostile token endpoint.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_enormous_token_answer_is_refused_and_not_read_whole(pool: PgPool) {
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let s = start(&mut alice, &up).await;
    let began = Instant::now();
    let r = come_back(&mut alice, &s, "huge").await;
    let took = began.elapsed();
    let pulled = up.pulled.load(Ordering::SeqCst);
    assert!(took < Duration::from_secs(25), "the callback took {took:?}");
    assert!(
        r.text.len() < 16 * 1024,
        "the callback page is {} bytes",
        r.text.len()
    );
    let grant = stored_grant(&g, "alice").await;
    assert!(
        grant.is_none(),
        "an enormous token answer was stored: an access token of {} bytes",
        grant.map(|g| g.access_token.len()).unwrap_or_default()
    );
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        &r.text[..r.text.len().min(500)]
    );
    assert!(
        pulled < ENORMOUS / 4,
        "the gateway read {pulled} bytes of a token answer (of {ENORMOUS} offered)"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_token_smuggling_a_header_fails_for_its_person_only_and_a_leaked_token_is_scrubbed(
    pool: PgPool,
) {
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let mut bob = Browser::signed_in(&g.app, "bob", "viewer").await;
    // Alice's grant carries CR LF and a second header; bob's is an ordinary one.
    let s = start(&mut alice, &up).await;
    let done = come_back(&mut alice, &s, "crlf-alice").await;
    let s = start(&mut bob, &up).await;
    let r = come_back(&mut bob, &s, "code-bob").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ta = host_token(&g, &mut alice).await;
    let tb = host_token(&g, &mut bob).await;

    // Refused at the callback, or refused at the call: either way alice's call fails and says
    // which slot, and the upstream never sees the smuggled header.
    let r = g.app.call(&ta, "hostile__whoami", json!({})).await;
    assert_eq!(
        r.body["result"]["isError"], true,
        "{}\n(callback: {})",
        r.text, done.text
    );
    let said = text(&r.body);
    assert!(
        said.contains("LINK") || done.status == StatusCode::BAD_REQUEST,
        "the failure does not name the slot: {said}"
    );
    assert!(!said.contains("X-Smuggled"), "{said}");
    assert!(
        !up.mcp_header_names()
            .iter()
            .any(|n| n.eq_ignore_ascii_case("x-smuggled")),
        "the upstream received a smuggled header"
    );
    assert!(
        up.mcp_header_values("authorization")
            .iter()
            .all(|v| !v.windows(5).any(|w| w == b"alice")),
        "alice's broken token reached the upstream"
    );
    // Bob is untouched.
    let r = g.app.call(&tb, "hostile__whoami", json!({})).await;
    assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
    assert_eq!(text(&r.body), "bob", "{}", r.text);

    // The upstream repeats bob's token back: the answer is scrubbed of it (and of the header
    // it went in), over MCP and over REST.
    let token = stored_grant(&g, "bob").await.unwrap().access_token;
    let r = g.app.call(&tb, "hostile__leak", json!({})).await;
    assert!(text(&r.body).starts_with("my token is"), "{}", r.text);
    assert!(!r.text.contains(&token), "the token came back: {}", r.text);
    let r = g
        .app
        .post_json("/tools/hostile/leak", Some(&tb), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!r.text.contains(&token), "the token came back: {}", r.text);
    g.app.state.audit.flush().await.unwrap();
    let record: String =
        sqlx::query_scalar("SELECT coalesce(string_agg(e::text, '\n'), '') FROM audit_events e")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!record.contains(&token), "the token is on record");
}

// ---------------------------------------------------------------------------------------------
// 5. Typed values.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_connected_slot_takes_no_typed_value(pool: PgPool) {
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    toolgate::service::accounts::create(
        &g.app.state.db,
        "test",
        "alice",
        "pw-alice-123456",
        "viewer",
    )
    .await
    .unwrap();
    let r = g
        .app
        .admin(
            "PUT",
            "/api/v1/users/alice/credentials/hostile/LINK",
            Some(json!({"value": "typed-by-an-admin-0123"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("connecting"), "{}", r.text);
    // Nor a grant-shaped value that would point the refresher at a server of the typist's.
    let forged = json!({"access_token": "at-alice-forged-000000", "refresh_token": "rt-x",
                        "expires_at": 1, "token_endpoint": "https://evil.example/token",
                        "resource": up.url()})
    .to_string();
    let r = g
        .app
        .admin(
            "PUT",
            "/api/v1/users/alice/credentials/hostile/LINK",
            Some(json!({"value": forged})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(stored(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// Beyond the brief: the refresher against a server that issues tokens that are already due.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn grants_that_expire_at_once_do_not_spin_the_refresher(pool: PgPool) {
    use toolgate::credentials::{KeyRing, Per, SlotKey};
    let up = hostile().await;
    let g = gate(pool.clone(), &up).await;
    // Sixteen people's grants (one refresher batch), due now, at a server whose every new
    // token expires at once.
    up.set(|p| p.expires_in = 0);
    let ring = KeyRing::parse(&[g.key.as_str()]).unwrap();
    let now = chrono::Utc::now();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..16 {
        let slot = SlotKey {
            per: Per::Person,
            owner: format!("p{i}"),
            group: "hostile".into(),
            name: "LINK".into(),
        };
        let grant = toolgate::credentials::oauth::Grant {
            access_token: format!("at-p{i}-0-0123456789"),
            refresh_token: Some(format!("rt-p{i}-0123456789")),
            expires_at: Some(now.timestamp() + 3600),
            token_endpoint: format!("http://{}/as/token", up.addr),
            resource: up.url(),
            failed: None,
        };
        let sealed = toolgate::credentials::seal(&ring, &slot, &grant.to_bytes()).unwrap();
        toolgate::db::credentials::put(
            &mut tx,
            "test",
            toolgate::audit::AdminAction::CredentialConnected,
            &slot,
            &sealed,
            Some(now),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    toolgate::service::connections::spawn_refresher(g.app.state.clone());
    let refreshes = || {
        up.token_requests()
            .iter()
            .filter(|f| f.get("grant_type").map(String::as_str) == Some("refresh_token"))
            .count()
    };
    until(Duration::from_secs(30), "the first refreshes", || async {
        refreshes() >= 16
    })
    .await;
    // Over the next four seconds (less than one refresher tick): a refresher that spins on
    // grants due again at once sends hundreds of requests; one that keeps its pace, a batch.
    let first = refreshes();
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(4) && refreshes() < first + 16 * 8 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let more = refreshes() - first;
    assert!(
        more <= 16 * 2,
        "{more} refresh requests in {:?} for 16 grants",
        window.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Beyond the brief: a grant is for the resource it was issued for.

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_grant_is_not_sent_to_an_upstream_repointed_elsewhere(pool: PgPool) {
    let up = hostile().await;
    let elsewhere = hostile().await;
    let g = gate(pool.clone(), &up).await;
    let mut alice = Browser::signed_in(&g.app, "alice", "viewer").await;
    let s = start(&mut alice, &up).await;
    let r = come_back(&mut alice, &s, "code-alice").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ta = host_token(&g, &mut alice).await;
    let r = g.app.call(&ta, "hostile__whoami", json!({})).await;
    assert_eq!(text(&r.body), "alice", "{}", r.text);
    let token = stored_grant(&g, "alice").await.unwrap().access_token;

    // The upstream now points at another server: alice's token, issued for the first one
    // (its `resource`), must not go there.
    put_hostile(&g.app, "hostile", &elsewhere.url()).await;
    until(
        Duration::from_secs(30),
        "the upstream is re-pointed",
        || async {
            g.app.state.upstreams.url("hostile").as_deref() == Some(elsewhere.url().as_str())
        },
    )
    .await;
    let own = g.app.token_for("assistant").await;
    wait_for_tools(&g.app, &own, "hostile").await;
    let r = g.app.call(&ta, "hostile__whoami", json!({})).await;
    let got = elsewhere.mcp_header_values("authorization");
    assert!(
        got.iter().all(|v| !v.ends_with(token.as_bytes())),
        "alice's token for {} was sent to {} (the call said: {})",
        up.url(),
        elsewhere.url(),
        r.text
    );
}
