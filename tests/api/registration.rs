//! Dynamic Client Registration (RFC 7591) for interactive hosts: what `mcp-remote` and the
//! desktop hosts behind it do before their first sign-in. A registration is bounded (per
//! address, in size, in total, in time) and, by default, held until an admin approves it;
//! until then no person can sign in through it and its redirect URIs are never followed.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Request, StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, repo_path};
use crate::web::Browser;
use toolgate::limits::REGISTRATIONS_PER_IP;
use toolgate::service::clients::MAX_UNUSED_REGISTRATIONS;

const VERIFIER: &str = "a-verifier-long-enough-for-pkce-0123456789-abcdefghij";
const CALLBACK: &str = "http://localhost:3334/oauth/callback";

/// What `mcp-remote` 0.15 sends.
fn mcp_remote_metadata() -> Value {
    json!({
        "redirect_uris": [CALLBACK],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "client_name": "MCP CLI Client",
        "client_uri": "https://github.com/modelcontextprotocol/mcp-cli",
        "software_id": "2e6dc280-f3c3-4e01-99a7-8181dbd1d23d",
        "software_version": "0.15.1",
        "scope": "openid email profile",
    })
}

async fn register_from(app: &TestApp, ip: &str, body: &str, content_type: &str) -> Reply {
    let mut req = Request::post("/oauth/register")
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let addr = SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 40_000);
    req.extensions_mut().insert(ConnectInfo(addr));
    app.send(req).await
}

async fn register(app: &TestApp, ip: &str, metadata: &Value) -> Reply {
    register_from(app, ip, &metadata.to_string(), "application/json").await
}

fn authorize_url(client_id: &str) -> String {
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(VERIFIER.as_bytes()));
    format!(
        "/oauth/authorize?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("response_type", "code"),
                ("client_id", client_id),
                ("redirect_uri", "http://localhost:40123/oauth/callback"),
                ("state", "st-1"),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
                ("scope", "openid email profile"),
            ])
            .finish()
    )
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field");
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

async fn public_clients(app: &TestApp) -> Vec<Value> {
    let r = app.admin("GET", "/api/v1/public-clients", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.body["public_clients"].as_array().unwrap().clone()
}

async fn changes_of(app: &TestApp, client_id: &str) -> Vec<String> {
    app.state.audit.flush().await.unwrap();
    sqlx::query_scalar::<_, String>(
        "SELECT (details::jsonb ->> 'action') || ' by ' || admin_user FROM audit_events
         WHERE event_type = 'admin.change' AND resource = $1 ORDER BY id",
    )
    .bind(format!("public_client:{client_id}"))
    .fetch_all(&app.state.db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_host_registers_itself_waits_for_an_admin_then_signs_a_person_in(pool: PgPool) {
    let app = TestApp::with(pool, &repo_path("tools"), Some(&repo_path("policies")), &[]).await;
    let r = app
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let m = app
        .get("/.well-known/oauth-authorization-server", None)
        .await
        .body;
    assert_eq!(
        m["registration_endpoint"],
        json!("http://127.0.0.1:8787/oauth/register")
    );

    let r = register(&app, "192.0.2.10", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let client_id = r.body["client_id"].as_str().unwrap().to_owned();
    assert!(client_id.starts_with("dyn-"), "{client_id}");
    assert_eq!(r.body["token_endpoint_auth_method"], "none");
    assert_eq!(r.body["redirect_uris"], json!([CALLBACK]));
    assert_eq!(r.body["toolgate_status"], "held");
    assert!(r.body.get("client_secret").is_none());
    assert_eq!(r.headers[header::CACHE_CONTROL], "no-store");

    // Held: a person following the sign-in link gets a page, never a redirect.
    let mut alice = Browser::signed_in(&app, "alice", "viewer").await;
    let held = alice.get(&authorize_url(&client_id)).await;
    assert_eq!(held.status, StatusCode::BAD_REQUEST, "{}", held.text);
    assert!(held.headers.get(header::LOCATION).is_none());
    assert!(
        held.text
            .contains("waits for an administrator&#39;s approval")
            || held.text.contains("waits for an administrator's approval"),
        "{}",
        held.text
    );
    // Nor can it get a token some other way.
    let r = app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", "made-up"),
                ("code_verifier", VERIFIER),
                ("redirect_uri", "http://localhost:40123/oauth/callback"),
            ],
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // A viewer may look, not approve.
    let page = alice.get("/admin/hosts").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    let r = alice
        .post(
            &format!("/admin/hosts/{client_id}/approve"),
            &[("csrf", &csrf_of(&page.text))],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);

    // The admin sees it held, with whose word its name is, and approves it.
    let mut admin = Browser::signed_in(&app, "root", "admin").await;
    let page = admin.get("/admin/hosts").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(
        page.text.contains(&format!(
            "data-client-id=\"{client_id}\" data-status=\"held\""
        )),
        "{}",
        page.text
    );
    assert!(page.text.contains("self-registered"));
    assert!(page.text.contains("from 192.0.2.10"));
    let r = admin
        .post(
            &format!("/admin/hosts/{client_id}/approve"),
            &[("csrf", &csrf_of(&page.text))],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let c = public_clients(&app).await;
    assert_eq!(c[0]["status"], "active");
    assert_eq!(c[0]["approved_by"], "admin:root");
    // Approving twice is a clear "not found", not a second row.
    let r = app
        .admin(
            "POST",
            &format!("/api/v1/public-clients/{client_id}/approve"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Now alice signs the host in: consent, code, token, tools.
    let r = alice.get(&authorize_url(&client_id)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let to = r.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(to.starts_with("/admin/consent?"), "{to}");
    let page = alice.get(&to).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("MCP CLI Client"));
    let mut form: Vec<(String, String)> = Vec::new();
    for part in page.text.split("<input type=\"hidden\" name=\"").skip(1) {
        let (name, rest) = part.split_once('"').unwrap();
        let value = rest.split("value=\"").nth(1).unwrap();
        let value = &value[..value.find('"').unwrap()];
        let value = value
            .replace("&#x2f;", "/")
            .replace("&#x2F;", "/")
            .replace("&#39;", "'")
            .replace("&amp;", "&");
        form.push((name.to_owned(), value));
    }
    form.push(("agent".into(), "assistant".into()));
    form.push(("decision".into(), "allow".into()));
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = alice.post("/admin/consent", &form).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let back = url::Url::parse(r.headers[header::LOCATION].to_str().unwrap()).unwrap();
    assert_eq!(back.port(), Some(40123));
    let code = back
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    let t = app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", &code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", "http://localhost:40123/oauth/callback"),
            ],
            None,
        )
        .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    // The OpenID scopes it asked for are ignored; it is granted the agent's tools.
    assert_eq!(t.body["scope"], "tools");
    let access = t.body["access_token"].as_str().unwrap();
    assert_eq!(
        app.tool_names(access).await,
        ["search__get", "search__query"]
    );

    assert_eq!(
        changes_of(&app, &client_id).await,
        [
            "public_client.register by oauth:register",
            "public_client.approve by admin:root"
        ]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_registration_that_cannot_be_honoured_is_refused_and_leaves_nothing(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let with = |k: &str, v: Value| {
        let mut m = mcp_remote_metadata();
        m[k] = v;
        m
    };
    let cases = [
        (with("redirect_uris", json!([])), "invalid_redirect_uri"),
        (
            with("redirect_uris", json!(["http://evil.example/cb"])),
            "invalid_redirect_uri",
        ),
        (
            with("redirect_uris", json!(["javascript:alert(1)"])),
            "invalid_redirect_uri",
        ),
        (
            with("redirect_uris", json!(["https://a.example/cb#frag"])),
            "invalid_redirect_uri",
        ),
        (
            with(
                "redirect_uris",
                json!(
                    (0..6)
                        .map(|i| format!("http://127.0.0.1/{i}"))
                        .collect::<Vec<_>>()
                ),
            ),
            "invalid_redirect_uri",
        ),
        (
            with("token_endpoint_auth_method", json!("client_secret_basic")),
            "invalid_client_metadata",
        ),
        (
            with("grant_types", json!(["client_credentials"])),
            "invalid_client_metadata",
        ),
        (
            with("response_types", json!(["token"])),
            "invalid_client_metadata",
        ),
        (
            with("client_name", json!("Claude\u{202e}edualC")),
            "invalid_client_metadata",
        ),
        (
            with("client_name", json!("x".repeat(201))),
            "invalid_client_metadata",
        ),
        (
            with("redirect_uris", json!("http://127.0.0.1/cb")),
            "invalid_client_metadata",
        ),
    ];
    // Each from its own address: the per-address budget is not what refuses them.
    for (i, (metadata, error)) in cases.iter().enumerate() {
        let r = register(&app, &format!("198.51.100.{i}"), metadata).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{metadata}: {}", r.text);
        assert_eq!(r.body["error"], *error, "{metadata}: {}", r.text);
    }
    let r = register_from(
        &app,
        "203.0.113.1",
        "client_name=x",
        "application/x-www-form-urlencoded",
    )
    .await;
    assert_eq!(r.body["error"], "invalid_client_metadata", "{}", r.text);
    let r = register_from(&app, "203.0.113.2", "{not json", "application/json").await;
    assert_eq!(r.body["error"], "invalid_client_metadata", "{}", r.text);
    let big = json!({"redirect_uris": [CALLBACK], "client_name": "x", "pad": "y".repeat(20_000)});
    let r = register(&app, "203.0.113.3", &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
    assert!(public_clients(&app).await.is_empty());
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn registrations_are_bounded_per_address_in_total_and_in_time(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (burst, _) = REGISTRATIONS_PER_IP;
    for _ in 0..burst {
        let r = register(&app, "192.0.2.1", &mcp_remote_metadata()).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let r = register(&app, "192.0.2.1", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert!(r.headers.contains_key(header::RETRY_AFTER));
    // Another address is not held back by that one.
    let r = register(&app, "192.0.2.2", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    // In total: however many addresses, at most MAX_UNUSED_REGISTRATIONS wait for a first use.
    let have = i64::from(burst) + 1;
    sqlx::query(
        "INSERT INTO oauth_public_clients
             (client_id, client_name, redirect_uris, created_by, registration, status, expires_at)
         SELECT 'dyn-fill' || i, 'filler', ARRAY['http://127.0.0.1/cb'], 'oauth:register',
                'dynamic', 'held', now() + interval '1 hour'
         FROM generate_series(1, $1) AS i",
    )
    .bind(MAX_UNUSED_REGISTRATIONS - have)
    .execute(&pool)
    .await
    .unwrap();
    let r = register(&app, "192.0.2.3", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.body["error"], "temporarily_unavailable");

    // In time: a registration nobody approved in time goes at the next registration, on record.
    sqlx::query(
        "UPDATE oauth_public_clients SET expires_at = now() - interval '1 second'
         WHERE client_id LIKE 'dyn-fill%'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let r = register(&app, "192.0.2.4", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(public_clients(&app).await.len() as i64, have + 1);
    assert_eq!(
        changes_of(&app, "dyn-fill1").await,
        ["public_client.delete by oauth:register"]
    );
    // An expired held registration is refused on a page, not followed.
    let id = r.body["client_id"].as_str().unwrap().to_owned();
    sqlx::query("UPDATE oauth_public_clients SET expires_at = now() - interval '1 second' WHERE client_id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let mut alice = Browser::signed_in(&app, "alice", "viewer").await;
    let r = alice.get(&authorize_url(&id)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("expired"), "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn off_offers_no_endpoint_and_open_needs_no_approval(pool: PgPool) {
    let off = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        None,
        &["--oauth-registration", "off"],
    )
    .await;
    let m = off
        .get("/.well-known/oauth-authorization-server", None)
        .await
        .body;
    assert!(m.get("registration_endpoint").is_none(), "{m}");
    let r = register(&off, "192.0.2.1", &mcp_remote_metadata()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    let open = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &["--oauth-registration", "open"],
    )
    .await;
    let mut metadata = mcp_remote_metadata();
    metadata["client_name"] = json!("<script>alert(1)</script>");
    let r = register(&open, "192.0.2.1", &metadata).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert!(r.body.get("toolgate_status").is_none());
    let id = r.body["client_id"].as_str().unwrap().to_owned();
    let mut admin = Browser::signed_in(&open, "root", "admin").await;
    let r = admin.get(&authorize_url(&id)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    // Its redirect URIs are only its own word: an error is shown on a page, not sent there.
    let bad = authorize_url(&id).replace("response_type=code", "response_type=token");
    let r = admin.get(&bad).await;
    assert!(r.headers.get(header::LOCATION).is_none(), "{}", r.text);
    // A stranger's name is text on the admin's page, never markup.
    let page = admin.get("/admin/hosts").await;
    assert!(!page.text.contains("<script>alert(1)</script>"));
    assert!(
        page.text.contains("&#60;script&#62;alert(1)"),
        "{}",
        page.text
    );
}
