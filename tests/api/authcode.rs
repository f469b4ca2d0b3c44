//! Interactive hosts: authorization code + PKCE, Client ID Metadata Documents, consent, the
//! `act` claim and revocation, driven by HTTP like a host and a browser would, against a
//! real Postgres and a real local HTTP server publishing the metadata documents.

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, repo_path};
use crate::web::Browser;

pub(crate) const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk-and-some-more";
pub(crate) const REDIRECT: &str = "http://127.0.0.1/callback";
/// Where an outsider's metadata document sends browsers back to.
const ATTACKER: &str = "https://attacker.example/phish";

fn urlencoding(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// Serves metadata documents: `/client.json` (valid), `/big.json` (over 64 KiB, streamed
/// without a length), `/stalls.json` (headers, then nothing).
pub(crate) async fn document_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}");
    let doc = {
        let base = base.clone();
        move || {
            let base = base.clone();
            async move {
                (
                    [(header::CACHE_CONTROL, "max-age=60")],
                    axum::Json(json!({
                        "client_id": format!("{base}/client.json"),
                        "client_name": "Desk <b>Host</b>",
                        "redirect_uris": [REDIRECT],
                        "token_endpoint_auth_method": "none",
                        "grant_types": ["authorization_code", "refresh_token"],
                    })),
                )
            }
        }
    };
    // An outsider's document: its redirect URI is the outsider's own https page.
    let evil = {
        let base = base.clone();
        move || {
            let base = base.clone();
            async move {
                axum::Json(json!({
                    "client_id": format!("{base}/evil.json"),
                    "client_name": "Helpful Host",
                    "redirect_uris": [ATTACKER],
                }))
            }
        }
    };
    let big = || async {
        let chunk = bytes::Bytes::from(vec![b' '; 16 * 1024]);
        let s = futures::stream::iter((0..8).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
        Body::from_stream(s).into_response()
    };
    let stalls = || async {
        let s = futures::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from("{")) })
            .chain(futures::stream::pending());
        Body::from_stream(s).into_response()
    };
    use futures::StreamExt;
    let app = Router::new()
        .route("/client.json", get(doc))
        .route("/evil.json", get(evil))
        .route("/big.json", get(big))
        .route("/stalls.json", get(stalls));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Host {
    app: TestApp,
    docs: SocketAddr,
}

impl Host {
    fn client_id(&self) -> String {
        format!("http://{}/client.json", self.docs)
    }
}

/// The example policies (agents `assistant` and `meteo`), documents on 127.0.0.1 (allowed
/// by the development flag), and `alice`, a viewer who may act as `assistant` only.
async fn setup(pool: PgPool) -> Host {
    let docs = document_server().await;
    let app = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &["--oauth-cimd-allow-private"],
    )
    .await;
    let r = app
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    Host { app, docs }
}

pub(crate) fn authorize_url(client_id: &str, redirect: &str, extra: &[(&str, &str)]) -> String {
    let ch = challenge(VERIFIER);
    let mut pairs: Vec<(&str, &str)> = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", redirect),
        ("state", "st-123"),
        ("code_challenge", &ch),
        ("code_challenge_method", "S256"),
        ("resource", "http://127.0.0.1:8787/mcp"),
    ];
    for (k, v) in extra {
        pairs.retain(|(pk, _)| pk != k);
        if !v.is_empty() {
            pairs.push((k, v));
        }
    }
    format!(
        "/oauth/authorize?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    )
}

fn location(r: &Reply) -> String {
    r.headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

pub(crate) fn query_of(loc: &str) -> HashMap<String, String> {
    url::Url::parse(loc)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field");
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// The hidden fields of the consent form, as a browser would post them.
fn hidden_fields(html: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for part in html.split("<input type=\"hidden\" name=\"").skip(1) {
        let (name, rest) = part.split_once('"').unwrap();
        let value = rest.split("value=\"").nth(1).unwrap();
        let value = &value[..value.find('"').unwrap()];
        let value = value
            .replace("&#x2f;", "/")
            .replace("&#x2F;", "/")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        out.push((name.to_owned(), value));
    }
    out
}

/// A host token for `b`'s person acting as `agent` (authorization code + PKCE at the gateway,
/// the host identified by its metadata document at `docs`).
pub(crate) async fn host_token(
    app: &TestApp,
    docs: SocketAddr,
    b: &mut Browser<'_>,
    agent: &str,
) -> String {
    let client_id = format!("http://{docs}/client.json");
    let page = consent_page(b, &authorize_url(&client_id, REDIRECT, &[])).await;
    let r = consent(b, &page, agent).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let code = query_of(crate::web::location(&r))["code"].clone();
    let t = app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", &code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("resource", "http://127.0.0.1:8787/mcp"),
            ],
            None,
        )
        .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    t.body["access_token"].as_str().unwrap().to_owned()
}

/// Opens the authorize URL signed in, and returns the consent page.
pub(crate) async fn consent_page(b: &mut Browser<'_>, url: &str) -> Reply {
    let r = b.get(url).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let to = location(&r);
    assert!(to.starts_with("/admin/consent?"), "{to}");
    let page = b.get(&to).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    page
}

/// Allows as `agent` on the consent page; the redirect back to the host.
pub(crate) async fn consent(b: &mut Browser<'_>, page: &Reply, agent: &str) -> Reply {
    let fields = hidden_fields(&page.text);
    let mut form: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    form.push(("agent", agent));
    form.push(("decision", "allow"));
    b.post("/admin/consent", &form).await
}

/// The whole dance up to the code.
async fn code_for(h: &Host, b: &mut Browser<'_>, redirect: &str) -> String {
    let page = consent_page(b, &authorize_url(&h.client_id(), redirect, &[])).await;
    let r = consent(b, &page, "assistant").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let q = query_of(&location(&r));
    assert_eq!(q["state"], "st-123");
    q["code"].clone()
}

async fn exchange(h: &Host, code: &str, verifier: &str, redirect: &str) -> Reply {
    let client_id = h.client_id();
    h.app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", code),
                ("code_verifier", verifier),
                ("redirect_uri", redirect),
                ("resource", "http://127.0.0.1:8787/mcp"),
            ],
            None,
        )
        .await
}

async fn refresh(h: &Host, token: &str) -> Reply {
    let client_id = h.client_id();
    h.app
        .token_request(
            &[
                ("grant_type", "refresh_token"),
                ("client_id", &client_id),
                ("refresh_token", token),
            ],
            None,
        )
        .await
}

fn claims(token: &str) -> Value {
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_person_signs_a_host_in_as_their_agent_and_refresh_rotates(pool: PgPool) {
    let h = setup(pool.clone()).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;

    let page = consent_page(&mut b, &authorize_url(&h.client_id(), REDIRECT, &[])).await;
    // The client's own name, escaped; the agents alice may act as, and no other.
    assert!(
        page.text.contains("Desk &#60;b&#62;Host&#60;/b&#62;"),
        "{}",
        page.text
    );
    assert!(!page.text.contains("<b>Host</b>"));
    assert!(page.text.contains("value=\"assistant\""));
    assert!(!page.text.contains("value=\"meteo\""));
    let r = consent(&mut b, &page, "assistant").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let back = location(&r);
    assert!(back.starts_with("http://127.0.0.1/callback?"), "{back}");
    let q = query_of(&back);
    assert_eq!(q["state"], "st-123");
    assert_eq!(q["iss"], "http://127.0.0.1:8787");

    let t = exchange(&h, &q["code"], VERIFIER, REDIRECT).await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let c = claims(&access);
    assert_eq!(c["sub"], "assistant");
    assert_eq!(c["act"], json!({"sub": "alice"}));
    assert_eq!(c["client_id"], h.client_id());
    // Exactly the chosen agent's tools.
    assert_eq!(
        h.app.tool_names(&access).await,
        ["search__get", "search__query"]
    );

    // Every audit row made with the token names the person, the agent and the host.
    h.app.state.audit.flush().await.unwrap();
    type Row = (String, Option<String>, Option<String>, Option<String>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT event_type, person, agent, client_id FROM audit_events
         WHERE event_type IN ('tools/list', 'token.issued') AND outcome = 'success' AND jti = $1",
    )
    .bind(c["jti"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(rows.iter().any(|r| r.0 == "tools/list"), "{rows:?}");
    assert!(rows.iter().any(|r| r.0 == "token.issued"), "{rows:?}");
    for r in &rows {
        assert_eq!(r.1.as_deref(), Some("alice"), "{r:?}");
        assert_eq!(r.2.as_deref(), Some("assistant"), "{r:?}");
        assert_eq!(r.3.as_deref(), Some(h.client_id().as_str()), "{r:?}");
    }
    // Compliance asks by person.
    let by_person = h.app.admin("GET", "/api/v1/audit?person=alice", None).await;
    let events = by_person.body["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["event_type"] == "tools/list"),
        "{}",
        by_person.text
    );
    // ... which covers what she did herself: her sign-in and her consent.
    assert!(
        events.iter().all(|e| e["person"] == "alice"
            || e["admin_user"] == "admin:alice"
            || e["admin_user"] == "user:alice"),
        "{}",
        by_person.text
    );
    assert!(
        events.iter().any(|e| e["event_type"] == "admin.login"),
        "{}",
        by_person.text
    );
    assert!(
        events.iter().any(|e| e["event_type"] == "admin.change"
            && e["details"]
                .as_str()
                .is_some_and(|d| d.contains("\"action\":\"authorization.create\""))),
        "{}",
        by_person.text
    );
    // And by client.
    let by_client = h
        .app
        .admin(
            "GET",
            &format!("/api/v1/audit?client_id={}", urlencoding(&h.client_id())),
            None,
        )
        .await;
    let events = by_client.body["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["event_type"] == "tools/list")
            && events
                .iter()
                .all(|e| e["client_id"] == h.client_id().as_str()),
        "{}",
        by_client.text
    );
    // The chain still verifies with the person in it.
    let (ok, out) = crate::audit::verify_db(&pool, &[]).await;
    assert!(ok, "{out}");

    // Refresh rotates: a new refresh token each time; the old one, used again, ends the
    // whole family, including the newest refresh token and the access tokens.
    let r1 = t.body["refresh_token"].as_str().unwrap().to_owned();
    let t2 = refresh(&h, &r1).await;
    assert_eq!(t2.status, StatusCode::OK, "{}", t2.text);
    let r2 = t2.body["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(r1, r2);
    let access2 = t2.body["access_token"].as_str().unwrap().to_owned();
    assert_eq!(claims(&access2)["act"], json!({"sub": "alice"}));
    assert_eq!(h.app.tool_names(&access2).await.len(), 2);

    let reuse = refresh(&h, &r1).await;
    assert_eq!(reuse.status, StatusCode::BAD_REQUEST, "{}", reuse.text);
    assert_eq!(reuse.body["error"], "invalid_grant");
    let after = refresh(&h, &r2).await;
    assert_eq!(after.body["error"], "invalid_grant", "{}", after.text);
    let r = h.app.mcp(Some(&access2), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn pkce_is_required_s256_only_and_checked(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    for (extra, what) in [
        (vec![("code_challenge", "")], "code_challenge is required"),
        (
            vec![("code_challenge_method", "plain")],
            "code_challenge_method must be S256",
        ),
        (
            vec![("code_challenge_method", "")],
            "code_challenge_method must be S256",
        ),
    ] {
        let r = b
            .get(&authorize_url(&h.client_id(), REDIRECT, &extra))
            .await;
        refused_on_a_page(&r, what);
    }
    // The right code with the wrong verifier: refused, and the code is spent.
    let code = code_for(&h, &mut b, REDIRECT).await;
    let wrong = "x".repeat(50);
    let r = exchange(&h, &code, &wrong, REDIRECT).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["error"], "invalid_grant", "{}", r.text);
    let r = exchange(&h, &code, VERIFIER, REDIRECT).await;
    assert_eq!(r.body["error"], "invalid_grant", "{}", r.text);
    // No verifier at all.
    let code = code_for(&h, &mut b, REDIRECT).await;
    let client_id = h.client_id();
    let r = h
        .app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", &code),
                ("redirect_uri", REDIRECT),
            ],
            None,
        )
        .await;
    assert_eq!(r.body["error"], "invalid_request", "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn redirect_uris_match_exactly_but_for_the_loopback_port(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    // RFC 8252: a loopback redirect may use any port.
    let with_port = "http://127.0.0.1:54321/callback";
    let code = code_for(&h, &mut b, with_port).await;
    let r = exchange(&h, &code, VERIFIER, with_port).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Another path, host or scheme is not redirected to: a page says so.
    for bad in [
        "http://127.0.0.1:54321/callback/../evil",
        "http://127.0.0.1/callback/x",
        "http://evil.example/callback",
        "https://127.0.0.1/callback",
    ] {
        let r = b.get(&authorize_url(&h.client_id(), bad, &[])).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text);
        assert!(r.headers.get(header::LOCATION).is_none(), "{bad}");
        assert!(
            r.text.contains("not one this client registered"),
            "{}",
            r.text
        );
        // Nor from the consent form, posted by hand.
        let page = b
            .get(
                &authorize_url(&h.client_id(), bad, &[])
                    .replace("/oauth/authorize", "/admin/consent"),
            )
            .await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(page.headers.get(header::LOCATION).is_none());
    }
    // The code is bound to the redirect URI it was issued for.
    let code = code_for(&h, &mut b, REDIRECT).await;
    let r = exchange(&h, &code, VERIFIER, with_port).await;
    assert_eq!(r.body["error"], "invalid_grant", "{}", r.text);
    // An unknown client is a page too, whatever redirect it names.
    let r = b.get(&authorize_url("no-such-client", REDIRECT, &[])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.headers.get(header::LOCATION).is_none());
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_replayed_code_fails_and_revokes_what_it_issued(pool: PgPool) {
    let h = setup(pool.clone()).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut b, REDIRECT).await;
    let first = exchange(&h, &code, VERIFIER, REDIRECT).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    let access = first.body["access_token"].as_str().unwrap().to_owned();
    assert_eq!(h.app.tool_names(&access).await.len(), 2);

    let second = exchange(&h, &code, VERIFIER, REDIRECT).await;
    assert_eq!(second.status, StatusCode::BAD_REQUEST);
    assert_eq!(second.body["error"], "invalid_grant", "{}", second.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let refresh_token = first.body["refresh_token"].as_str().unwrap();
    assert_eq!(
        refresh(&h, refresh_token).await.body["error"],
        "invalid_grant"
    );
    let revoked: Option<String> =
        sqlx::query_scalar("SELECT revoked_reason FROM oauth_authorizations")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(revoked.as_deref(), Some("authorization code replayed"));
    // Only hashes are stored.
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_codes WHERE code_hash = $1")
        .bind(&code)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn state_is_required(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let r = b
        .get(&authorize_url(&h.client_id(), REDIRECT, &[("state", "")]))
        .await;
    refused_on_a_page(&r, "state is required");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn consent_needs_the_session_csrf_token_and_an_agent_the_person_may_act_as(pool: PgPool) {
    let h = setup(pool.clone()).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let page = consent_page(&mut b, &authorize_url(&h.client_id(), REDIRECT, &[])).await;
    let fields = hidden_fields(&page.text);
    let base: Vec<(&str, &str)> = fields
        .iter()
        .filter(|(k, _)| k != "csrf")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for csrf in [None, Some("forged-token")] {
        let mut form = base.clone();
        if let Some(c) = csrf {
            form.push(("csrf", c));
        }
        form.push(("agent", "assistant"));
        form.push(("decision", "allow"));
        let r = b.post("/admin/consent", &form).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{csrf:?}: {}", r.text);
        assert!(r.headers.get(header::LOCATION).is_none());
    }
    // meteo exists, but alice may not act as it.
    let r = consent(&mut b, &page, "meteo").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.headers.get(header::LOCATION).is_none());
    let codes: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_codes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(codes, 0);
    // Signed out, the authorize request leads to the sign-in page, and back.
    let mut stranger = Browser::signed_in(&h.app, "bob", "viewer").await;
    let csrf = csrf_of(&stranger.get("/admin").await.text);
    let r = stranger.post("/admin/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let r = stranger
        .get(&authorize_url(&h.client_id(), REDIRECT, &[]))
        .await;
    let r = stranger.get(&location(&r)).await;
    let login = location(&r);
    assert!(
        login.starts_with("/admin/login?next=%2Fadmin%2Fconsent%3F"),
        "{login}"
    );
    // Declining a client identified by a URL says so on a page, with a link back to the
    // host carrying the answer, for the person to follow.
    let mut form: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    form.push(("decision", "deny"));
    let r = b.post("/admin/consent", &form).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.headers.get(header::LOCATION).is_none());
    let back = link_back(&r.text).expect("a link back to the host");
    assert_eq!(query_of(&back)["error"], "access_denied");
    assert_eq!(query_of(&back)["state"], "st-123");
}

/// The page's link back to the application, if it offers one.
fn link_back(html: &str) -> Option<String> {
    let at = html.find("id=\"authorize-back\"")?;
    let rest = &html[at..];
    let href = &rest[rest.find("href=\"")? + "href=\"".len()..];
    Some(href[..href.find('"')?].replace("&amp;", "&"))
}

/// Refused with a page saying `what`, and no redirect at all.
fn refused_on_a_page(r: &Reply, what: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.headers.get(header::LOCATION).is_none(), "{:?}", r.headers);
    assert!(r.text.contains(what), "{what}: {}", r.text);
}

/// RFC 9700 §4.11.2: anyone can publish a metadata document naming their own https page as
/// its redirect URI; an authorize request that fails must not bounce a browser there.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_url_client_cannot_bounce_a_browser_to_its_redirect_uri(pool: PgPool) {
    let h = setup(pool).await;
    let evil = format!("http://{}/evil.json", h.docs);
    // The request as found: an implicit-grant response type, nobody signed in.
    let mut stranger = Browser::new(&h.app);
    let url = format!(
        "/oauth/authorize?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("client_id", evil.as_str()),
                ("redirect_uri", ATTACKER),
                ("response_type", "token"),
            ])
            .finish()
    );
    let r = stranger.get(&url).await;
    refused_on_a_page(&r, "response_type must be code");
    assert!(!r.text.contains(ATTACKER), "{}", r.text);
    // Every other error after the redirect URI is matched: a page too.
    for (extra, what) in [
        (vec![("state", "")], "state is required"),
        (vec![("code_challenge", "")], "code_challenge is required"),
        (vec![("code_challenge_method", "plain")], "S256"),
        (
            vec![("resource", "https://elsewhere.example/mcp")],
            "resource must be",
        ),
        (vec![("scope", "admin")], "unknown scope"),
    ] {
        let r = stranger.get(&authorize_url(&evil, ATTACKER, &extra)).await;
        refused_on_a_page(&r, what);
        assert!(!r.text.contains("authorize-back"), "{}", r.text);
    }
    // Signed in, the person is told, and may follow a link back; nothing redirects.
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let r = alice
        .get(
            &authorize_url(&evil, ATTACKER, &[("state", "")])
                .replace("/oauth/authorize", "/admin/consent"),
        )
        .await;
    refused_on_a_page(&r, "state is required");
    let back = link_back(&r.text).expect("a link back");
    assert!(back.starts_with(ATTACKER), "{back}");
    // A request that passes still needs the person: declining stays on a page.
    let page = consent_page(&mut alice, &authorize_url(&evil, ATTACKER, &[])).await;
    let mut form: Vec<(String, String)> = hidden_fields(&page.text);
    form.push(("decision".into(), "deny".into()));
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = alice.post("/admin/consent", &form).await;
    assert!(r.headers.get(header::LOCATION).is_none(), "{:?}", r.headers);
    // An admin-registered client, whose redirect URIs an admin vetted, is told at its URI.
    let r = h
        .app
        .admin(
            "PUT",
            "/api/v1/public-clients/inspector",
            Some(json!({"client_name": "MCP Inspector", "redirect_uris": [REDIRECT]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let r = stranger
        .get(&authorize_url("inspector", REDIRECT, &[("state", "")]))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(query_of(&location(&r))["error"], "invalid_request");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn metadata_documents_on_inside_addresses_are_refused_without_the_flag(pool: PgPool) {
    let docs = document_server().await;
    let app = TestApp::with(pool, &repo_path("tools"), Some(&repo_path("policies")), &[]).await;
    let mut b = Browser::signed_in(&app, "alice", "viewer").await;
    let port = docs.port();
    for (client_id, says) in [
        (
            format!("https://127.0.0.1:{port}/client.json"),
            "will not connect",
        ),
        (
            format!("https://localhost:{port}/client.json"),
            "will not connect",
        ),
        (
            format!("https://[::1]:{port}/client.json"),
            "will not connect",
        ),
        (
            "https://169.254.169.254/latest/meta-data".to_owned(),
            "will not connect",
        ),
        (
            "https://10.0.0.1/client.json".to_owned(),
            "will not connect",
        ),
        (format!("http://127.0.0.1:{port}/client.json"), "https"),
        (
            "https://user:pw@example.com/client.json".to_owned(),
            "credentials",
        ),
    ] {
        let r = b.get(&authorize_url(&client_id, REDIRECT, &[])).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{client_id}: {}", r.text);
        assert!(r.text.contains(says), "{client_id}: {}", r.text);
        assert!(r.headers.get(header::LOCATION).is_none());
    }
}

/// The fence before fetching an outsider's document: addresses that embed or reach an inside
/// address (IPv4-compatible, Teredo, the 6to4 relay anycast, NAT64) are refused before any
/// connection is tried, and the page never says what a name resolves to, nor whether it does.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_fetch_fence_refuses_special_blocks_and_tells_nothing_of_dns(pool: PgPool) {
    let app = TestApp::with(pool, &repo_path("tools"), Some(&repo_path("policies")), &[]).await;
    let mut b = Browser::new(&app);
    let mut refusals = Vec::new();
    for client_id in [
        "https://[::7f00:1]/client.json",
        "https://[::a00:1]/client.json",
        "https://[2001::1]/client.json",
        "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/client.json",
        "https://[64:ff9b::7f00:1]/client.json",
        "https://[2002:7f00:1::1]/client.json",
        "https://[::ffff:7f00:1]/client.json",
        "https://192.88.99.1/client.json",
        "https://192.0.0.9/client.json",
        "https://localhost/client.json",
        "https://no-such-host.invalid/client.json",
    ] {
        let r = b.get(&authorize_url(client_id, REDIRECT, &[])).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{client_id}: {}", r.text);
        assert!(r.headers.get(header::LOCATION).is_none());
        assert!(
            r.text.contains("will not connect"),
            "{client_id} must be refused before connecting: {}",
            r.text
        );
        for address in ["127.0.0.1", "::1", "0:0:0:0:0:0:0:1"] {
            assert!(
                !r.text.contains(address),
                "{client_id}: the page names an address: {}",
                r.text
            );
        }
        refusals.push(r.text);
    }
    // A name resolving inside and a name that does not resolve read the same.
    let (inside, nowhere) = (&refusals[refusals.len() - 2], &refusals[refusals.len() - 1]);
    assert_eq!(inside, nowhere);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn oversized_and_stalling_metadata_documents_are_refused(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let big = format!("http://{}/big.json", h.docs);
    let r = b.get(&authorize_url(&big, REDIRECT, &[])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("larger than 64 KiB"), "{}", r.text);
    let started = std::time::Instant::now();
    let slow = format!("http://{}/stalls.json", h.docs);
    let r = b.get(&authorize_url(&slow, REDIRECT, &[])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("took longer than 5 s"), "{}", r.text);
    println!("a stalling document refused after {:?}", started.elapsed());
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
    // A document naming another client id is not that client.
    let r = b
        .get(&authorize_url(
            &format!("http://{}/client.json?x", h.docs),
            REDIRECT,
            &[],
        ))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn revoking_an_authorization_ends_its_tokens_on_the_next_request(pool: PgPool) {
    let h = setup(pool).await;
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    assert_eq!(h.app.tool_names(&access).await.len(), 2);

    // Another viewer sees none of it and cannot revoke it.
    let mut bob = Browser::signed_in(&h.app, "bob", "viewer").await;
    let page = bob.get("/admin/authorizations").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("authz-empty"), "{}", page.text);
    let id = claims(&access)["authorization_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = bob
        .submit("/admin", &format!("/admin/authorizations/{id}/revoke"), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(h.app.tool_names(&access).await.len(), 2);

    let page = alice.get("/admin/authorizations").await;
    assert!(
        page.text.contains("Desk &#60;b&#62;Host&#60;/b&#62;"),
        "{}",
        page.text
    );
    let r = alice
        .submit(
            "/admin/authorizations",
            &format!("/admin/authorizations/{id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        refresh(&h, t.body["refresh_token"].as_str().unwrap())
            .await
            .body["error"],
        "invalid_grant"
    );

    // An admin revokes anyone's, through the API; removing the person from the agent does too.
    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let id = claims(&access)["authorization_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let list = h
        .app
        .admin("GET", "/api/v1/authorizations?username=alice", None)
        .await;
    assert_eq!(
        list.body["authorizations"].as_array().unwrap().len(),
        2,
        "{}",
        list.text
    );
    let r = h
        .app
        .admin("DELETE", &format!("/api/v1/authorizations/{id}"), None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert_eq!(
        h.app
            .mcp(Some(&access), "tools/list", json!({}))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );

    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let r = h
        .app
        .admin("DELETE", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert_eq!(
        h.app
            .mcp(Some(&access), "tools/list", json!({}))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_client_an_admin_registered_signs_in_too(pool: PgPool) {
    let h = setup(pool).await;
    let r = h
        .app
        .admin(
            "PUT",
            "/api/v1/public-clients/inspector",
            Some(json!({"client_name": "MCP Inspector", "redirect_uris": ["http://localhost:6274/oauth/callback"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let r = h
        .app
        .admin(
            "PUT",
            "/api/v1/public-clients/bad",
            Some(json!({"client_name": "x", "redirect_uris": ["http://evil.example/cb"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let page = consent_page(
        &mut b,
        &authorize_url("inspector", "http://localhost:6274/oauth/callback", &[]),
    )
    .await;
    assert!(page.text.contains("MCP Inspector"));
    let r = consent(&mut b, &page, "assistant").await;
    let code = query_of(&location(&r))["code"].clone();
    let t = h
        .app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", "inspector"),
                ("code", &code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", "http://localhost:6274/oauth/callback"),
            ],
            None,
        )
        .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    let access = t.body["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["client_id"], "inspector");
    assert_eq!(
        h.app.tool_names(access).await,
        ["search__get", "search__query"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn metadata_advertises_exactly_what_is_supported(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let m = app
        .get("/.well-known/oauth-authorization-server", None)
        .await
        .body;
    assert_eq!(m["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(m["client_id_metadata_document_supported"], json!(true));
    assert_eq!(m["response_types_supported"], json!(["code"]));
    assert_eq!(
        m["grant_types_supported"],
        json!(["client_credentials", "authorization_code", "refresh_token"])
    );
    assert!(
        m["token_endpoint_auth_methods_supported"]
            .as_array()
            .unwrap()
            .contains(&json!("none"))
    );
    // Hosts register themselves (held for an admin by default: tests/api/registration.rs).
    assert_eq!(
        m["registration_endpoint"],
        json!("http://127.0.0.1:8787/oauth/register")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn agent_users_round_trip_through_policy_files(pool: PgPool) {
    let h = setup(pool.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    toolgate::policy::files::export(&pool, dir.path())
        .await
        .unwrap();
    let file = dir.path().join("agents/assistant/agent.md");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("users:\n- alice\n"), "{text}");
    let catalog = h.app.state.policy.load().catalog.clone();
    // A real apply of the export: no change, and the files now wrote alice (she was added
    // through the API), so deleting her line removes her without --prune.
    let report = toolgate::policy::files::apply_dir(
        &pool,
        dir.path(),
        &catalog,
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap();
    assert!(report.changes.is_empty(), "{:?}", report.changes);
    assert!(report.kept.is_empty(), "{:?}", report.kept);

    std::fs::write(
        &file,
        text.replace("users:\n- alice\n", "users: [bob, carol]\n"),
    )
    .unwrap();
    let report = toolgate::policy::files::apply_dir(
        &pool,
        dir.path(),
        &catalog,
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap();
    assert_eq!(report.changes.len(), 1, "{:?}", report.changes);
    h.app.state.reload_policy().await.unwrap();
    let snapshot = h.app.state.policy.load();
    assert_eq!(
        snapshot.agent("assistant").unwrap().record.users,
        ["bob", "carol"]
    );
    assert!(!snapshot.may_act_as("alice", "assistant"));

    std::fs::write(
        &file,
        text.replace("users:\n- alice\n", "users: [\"no spaces\"]\n"),
    )
    .unwrap();
    let err = toolgate::policy::files::apply_dir(
        &pool,
        dir.path(),
        &catalog,
        "test",
        false,
        false,
        false,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("no spaces"), "{err}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn admins_edit_who_may_act_as_an_agent_on_its_page(pool: PgPool) {
    let h = setup(pool).await;
    let mut admin = Browser::signed_in(&h.app, "ada", "admin").await;
    let page = admin.get("/admin/agents/assistant").await;
    assert!(page.text.contains("<code>alice</code>"), "{}", page.text);
    let r = admin
        .submit(
            "/admin/agents/meteo",
            "/admin/agents/meteo/users",
            &[("username", "alice")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(h.app.state.policy.load().may_act_as("alice", "meteo"));
    let r = admin
        .submit(
            "/admin/agents/meteo",
            "/admin/agents/meteo/users",
            &[("username", "<script>")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // A viewer may consent for themself, not change who may act as whom.
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let r = alice
        .submit(
            "/admin",
            "/admin/agents/meteo/users/remove",
            &[("username", "alice")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let r = admin
        .submit(
            "/admin/agents/meteo",
            "/admin/agents/meteo/users/remove",
            &[("username", "alice")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(!h.app.state.policy.load().may_act_as("alice", "meteo"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn public_clients_are_registered_from_the_command_line(pool: PgPool) {
    let h = setup(pool.clone()).await;
    let url = crate::audit::db_url(&pool).await;
    let run = |args: Vec<&'static str>| {
        let url = url.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
                .arg("client")
                .args(args)
                .env("DATABASE_URL", url)
                .env("TOOLGATE_LOG", "warn")
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(vec![
        "register-public",
        "--client-id",
        "vscode",
        "--name",
        "VS Code",
        "--redirect-uri",
        "http://127.0.0.1/",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(vec![
        "register-public",
        "--client-id",
        "evil",
        "--name",
        "x",
        "--redirect-uri",
        "http://evil.example/cb",
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not loopback"));
    let list = h.app.admin("GET", "/api/v1/public-clients", None).await;
    assert_eq!(
        list.body["public_clients"][0]["client_id"], "vscode",
        "{}",
        list.text
    );
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    consent_page(
        &mut b,
        &authorize_url("vscode", "http://127.0.0.1:33333/", &[]),
    )
    .await;
    let out = run(vec!["delete-public", "vscode"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = b
        .get(&authorize_url("vscode", "http://127.0.0.1:33333/", &[]))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_host_revokes_its_refresh_token_and_the_authorization_ends(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut b, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let refresh_token = t.body["refresh_token"].as_str().unwrap().to_owned();
    let client_id = h.client_id();
    let revoke = |token: String| {
        let client_id = client_id.clone();
        let app = &h.app;
        async move {
            let body = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs([("client_id", client_id.as_str()), ("token", token.as_str())])
                .finish();
            app.send(
                http::Request::post("/oauth/revoke")
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
        }
    };
    // Someone else's or a made-up token: 200, and nothing happens.
    assert_eq!(revoke("nonsense".into()).await.status, StatusCode::OK);
    assert_eq!(h.app.tool_names(&access).await.len(), 2);
    let r = revoke(refresh_token.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        h.app
            .mcp(Some(&access), "tools/list", json!({}))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        refresh(&h, &refresh_token).await.body["error"],
        "invalid_grant"
    );
}

/// What checking a host's token costs on every request, against a client-credentials token of
/// the same agent, in one run: `tools/list` p50 and p99 over 2,000 requests each. A
/// measurement, not a timed test:
/// `cargo nextest run --test api --run-ignored only -E 'test(/authcode::measure/)' --no-capture`
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on demand"]
async fn measure_host_token_check(pool: PgPool) {
    let h = setup(pool).await;
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut b, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let host = t.body["access_token"].as_str().unwrap().to_owned();
    let machine = h.app.token_for("assistant").await;
    let mut results = Vec::new();
    for (name, token) in [("client credentials", &machine), ("host (act)", &host)] {
        for _ in 0..200 {
            h.app.mcp(Some(token), "tools/list", json!({})).await;
        }
        let mut us: Vec<f64> = Vec::with_capacity(2000);
        for _ in 0..2000 {
            let t0 = std::time::Instant::now();
            let r = h.app.mcp(Some(token), "tools/list", json!({})).await;
            us.push(t0.elapsed().as_secs_f64() * 1e6);
            assert_eq!(r.status, StatusCode::OK);
        }
        us.sort_by(f64::total_cmp);
        results.push((name, us[1000], us[1980]));
    }
    for (name, p50, p99) in &results {
        println!("tools/list with a {name} token: p50 {p50:.0} µs, p99 {p99:.0} µs");
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_admin_sees_and_revokes_anyones_authorization_on_the_page(pool: PgPool) {
    let h = setup(pool).await;
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let id = claims(&access)["authorization_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut admin = Browser::signed_in(&h.app, "ada", "admin").await;
    let page = admin.get("/admin/authorizations").await;
    assert!(
        page.text.contains(&format!("data-id=\"{id}\"")),
        "{}",
        page.text
    );
    assert!(page.text.contains("<td>alice</td>"), "{}", page.text);
    let r = admin
        .submit(
            "/admin/authorizations",
            &format!("/admin/authorizations/{id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        h.app
            .mcp(Some(&access), "tools/list", json!({}))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let page = alice.get("/admin/authorizations").await;
    assert!(page.text.contains("revoked"), "{}", page.text);
    assert!(page.text.contains("admin:ada"), "{}", page.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_member_may_consent_and_manage_their_own_authorizations_only(pool: PgPool) {
    let h = setup(pool).await;
    let r = h
        .app
        .admin("PUT", "/api/v1/agents/assistant/users/mia", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let mut mia = Browser::signed_in(&h.app, "mia", "member").await;
    let page = consent_page(&mut mia, &authorize_url(&h.client_id(), REDIRECT, &[])).await;
    let r = consent(&mut mia, &page, "assistant").await;
    let code = query_of(&location(&r))["code"].clone();
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    assert_eq!(
        claims(t.body["access_token"].as_str().unwrap())["act"],
        json!({"sub": "mia"})
    );
    let mine = mia.get("/admin/authorizations").await;
    assert_eq!(mine.status, StatusCode::OK, "{}", mine.text);
    assert!(mine.text.contains("Revoke"), "{}", mine.text);
    // The rest of the admin pages stay closed to a member.
    assert_eq!(mia.get("/admin/agents").await.status, StatusCode::FORBIDDEN);
}

/// A person's account disabled or deleted: no host goes on acting for them. Their host
/// tokens fail on the next request and their refresh tokens are dead.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn disabling_or_deleting_the_person_ends_their_host_tokens(pool: PgPool) {
    let h = setup(pool).await;
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    assert_eq!(h.app.tool_names(&access).await.len(), 2);

    let r = h
        .app
        .admin("POST", "/api/v1/users/alice/disable", None)
        .await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert_eq!(
        refresh(&h, t.body["refresh_token"].as_str().unwrap())
            .await
            .body["error"],
        "invalid_grant"
    );
    // Enabling the account again does not bring the revoked authorization back.
    let r = h
        .app
        .admin("POST", "/api/v1/users/alice/enable", None)
        .await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);

    let mut alice = Browser::signed_in(&h.app, "alice2", "viewer").await;
    let r = h
        .app
        .admin("PUT", "/api/v1/agents/assistant/users/alice2", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let code = code_for(&h, &mut alice, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    assert_eq!(h.app.tool_names(&access).await.len(), 2);
    let r = h.app.admin("DELETE", "/api/v1/users/alice2", None).await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text);
    let r = h.app.mcp(Some(&access), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
}

/// Serves `/client.json` over TLS with the test CA's certificate for `localhost` (see
/// `tests/fixtures/tls/make.sh`); the document names itself `https://localhost:<port>/client.json`.
async fn tls_document_server() -> SocketAddr {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(repo_path("tests/fixtures/tls/server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(repo_path("tests/fixtures/tls/server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client_id = format!("https://localhost:{}/client.json", addr.port());
    let app = Router::new().route(
        "/client.json",
        get(move || {
            let client_id = client_id.clone();
            async move {
                axum::Json(json!({
                    "client_id": client_id,
                    "client_name": "TLS Host",
                    "redirect_uris": [REDIRECT],
                }))
            }
        }),
    );
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                // A handshake the gateway abandons (an untrusted certificate) ends here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let mut app = app.clone();
                    async move {
                        use tower::Service;
                        app.call(req).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// A Client ID Metadata Document over https: fetched and verified against the CA the gateway
/// was told to trust (a private CA, here the test CA), and refused, saying why, without it.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_metadata_document_over_https_is_trusted_through_the_configured_ca(pool: PgPool) {
    let docs = tls_document_server().await;
    let client_id = format!("https://localhost:{}/client.json", docs.port());
    let ca = repo_path("tests/fixtures/tls/ca.pem");
    let app = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &[
            "--oauth-cimd-allow-private",
            "--oauth-cimd-ca-file",
            ca.to_str().unwrap(),
        ],
    )
    .await;
    let r = app
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let mut b = Browser::signed_in(&app, "alice", "viewer").await;
    let page = consent_page(&mut b, &authorize_url(&client_id, REDIRECT, &[])).await;
    assert!(page.text.contains("TLS Host"), "{}", page.text);
    let r = consent(&mut b, &page, "assistant").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let q = query_of(&location(&r));
    let t = app
        .token_request(
            &[
                ("grant_type", "authorization_code"),
                ("client_id", &client_id),
                ("code", &q["code"]),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("resource", "http://127.0.0.1:8787/mcp"),
            ],
            None,
        )
        .await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    let access = t.body["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["client_id"], client_id);

    // The same document, to a gateway that trusts only the public roots.
    let untrusting = TestApp::with(
        pool,
        &repo_path("tools"),
        None,
        &["--oauth-cimd-allow-private"],
    )
    .await;
    let mut b = Browser::signed_in(&untrusting, "bob", "viewer").await;
    let r = b.get(&authorize_url(&client_id, REDIRECT, &[])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("TLS certificate is not trusted")
            && r.text.contains("--oauth-cimd-ca-file"),
        "{}",
        r.text
    );
    assert!(r.headers.get(header::LOCATION).is_none());
}

/// A person fills their own credential on "My connections"; calls a host makes for them carry
/// it to the upstream (a server built with the official SDK that says whose token it got),
/// calls made for no person or by another person do not, and nobody sees the value again.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_person_connects_their_own_credential_and_the_host_calls_carry_it(pool: PgPool) {
    use crate::upstream_credentials::{Echo, LISTER, TOKEN_A, key};
    let echo = Echo::start().await;
    let docs = document_server().await;
    let app = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &["--oauth-cimd-allow-private", "--credential-key", &key()],
    )
    .await;
    let r = app
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    crate::upstream::put_upstream(
        &app,
        "pecho",
        json!({
            "transport": "http",
            "url": format!("http://127.0.0.1:{}/mcp", echo.port),
            "headers": {"Authorization": format!("Bearer {LISTER}")},
            "credentials": {"ECHO_TOKEN": {"per": "person", "inject": "header Authorization \"Bearer {}\""}},
            "pin": false
        }),
    )
    .await;
    let r = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "pecho"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let h = Host { app, docs };

    // The agent's own token acts for no person: no person's value, and no fallback.
    let own = h.app.token_for("assistant").await;
    crate::upstream::wait_for_tools(&h.app, &own, "pecho").await;
    let r = h.app.call(&own, "pecho__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert!(
        crate::upstream::text(&r.body).contains("of the person it acts for"),
        "{}",
        r.text
    );

    // Bob may act as no agent reaching `pecho`: his page names no such group, and he cannot
    // store a value under it.
    let mut bob = Browser::signed_in(&h.app, "bob", "viewer").await;
    let page = bob.get("/admin/connections").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("connections-empty"), "{}", page.text);
    assert!(!page.text.contains("pecho"), "{}", page.text);
    let csrf = csrf_of(&bob.get("/admin").await.text);
    let r = bob
        .post(
            "/admin/connections/pecho/ECHO_TOKEN",
            &[("csrf", &csrf), ("value", "tok-bob-0000000000")],
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Alice's page lists the slot as not set; she stores her token.
    let mut b = Browser::signed_in(&h.app, "alice", "viewer").await;
    let page = b.get("/admin/connections").await;
    assert!(
        page.text.contains("data-slot=\"pecho/ECHO_TOKEN\"")
            && page.text.contains("data-problem=\"credential\""),
        "{}",
        page.text
    );
    let csrf = csrf_of(&page.text);
    let r = b
        .post("/admin/connections/pecho/ECHO_TOKEN", &[("value", TOKEN_A)])
        .await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "a form without the CSRF token"
    );
    let r = b
        .post(
            "/admin/connections/pecho/ECHO_TOKEN",
            &[("csrf", &csrf), ("value", TOKEN_A)],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let page = b.get("/admin/connections").await;
    assert!(!page.text.contains("data-problem"), "{}", page.text);
    assert!(!page.text.contains(TOKEN_A), "the value is shown again");

    // A host signed in by alice as `assistant`: its calls carry alice's token.
    let code = code_for(&h, &mut b, REDIRECT).await;
    let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    let access = t.body["access_token"].as_str().unwrap().to_owned();
    let r = h.app.call(&access, "pecho__whoami", json!({})).await;
    assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
    assert_eq!(crate::upstream::text(&r.body), "agent-a");
    // Still alice's agent token: the same agent without a person is still refused.
    let r = h.app.call(&own, "pecho__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);

    // Cleared: alice's next call says where to set it again.
    let csrf = csrf_of(&b.get("/admin/connections").await.text);
    let r = b
        .post(
            "/admin/connections/pecho/ECHO_TOKEN/delete",
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let r = h.app.call(&access, "pecho__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert!(
        crate::upstream::text(&r.body).contains("/admin/connections"),
        "{}",
        r.text
    );
}

/// A slot filled by connecting: alice's browser goes through toolgate to the upstream's own
/// authorization server (panva's oidc-provider), back with a code; the upstream (official SDK)
/// checks the token it is sent at that server and answers with whose it is.
async fn connect(
    b: &mut Browser<'_>,
    auth: &crate::upstream_oauth_support::AuthServer,
    slot: &str,
    login: &str,
) -> Reply {
    let csrf = csrf_of(&b.get("/admin/connections").await.text);
    let r = b
        .post(
            &format!("/admin/connections/{slot}/connect"),
            &[("csrf", &csrf)],
        )
        .await;
    // A page that moves on to the server by itself (the UI's CSP keeps forms on this origin).
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let at = r.text.find("id=\"continue\" href=\"").expect("a link on");
    let rest = &r.text[at + "id=\"continue\" href=\"".len()..];
    let to = rest[..rest.find('"').unwrap()].replace("&#38;", "&");
    assert!(to.starts_with(&auth.issuer), "{to}");
    let q = query_of(&to);
    assert_eq!(
        q.get("code_challenge_method").map(String::as_str),
        Some("S256"),
        "{to}"
    );
    assert!(q["resource"].ends_with("/mcp"), "{to}");
    let back = auth.sign_in(&to, login).await;
    let back = url::Url::parse(&back).unwrap();
    b.get(&format!("{}?{}", back.path(), back.query().unwrap_or("")))
        .await
}

/// The grant stored in `person`'s slot `group`/`LINK`, opened as only the gateway can (the
/// test holds the key).
pub(crate) async fn stored_grant(
    pool: &PgPool,
    key: &str,
    person: &str,
    group: &str,
) -> Option<toolgate::credentials::oauth::Grant> {
    use toolgate::credentials::{KeyRing, Per, SlotKey};
    let ring = KeyRing::parse(&[key]).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let sealed = toolgate::db::credentials::load_sealed(&mut conn)
        .await
        .unwrap();
    let slot = SlotKey {
        per: Per::Person,
        owner: person.into(),
        group: group.into(),
        name: "LINK".into(),
    };
    let v = toolgate::credentials::open(&ring, &slot, sealed.get(&slot)?).unwrap();
    toolgate::credentials::oauth::Grant::parse(&v)
}

async fn changes(pool: &PgPool, action: &str, person: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM audit_events WHERE event_type = 'admin.change'
           AND details::jsonb->>'action' = $1 AND details::jsonb->'after'->>'owner' = $2",
    )
    .bind(action)
    .bind(person)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn people_connect_to_an_upstreams_own_sign_in_and_their_calls_carry_their_tokens_refreshed_before_expiry(
    pool: PgPool,
) {
    use std::time::Duration;

    use crate::upstream::text;
    use crate::upstream_credentials::{Echo, LISTER, key};
    use crate::upstream_oauth_support::AuthServer;
    const CLIENT: &str = "toolgate-upstream";
    const TTL: u64 = 20;
    let auth = AuthServer::start(
        "http://127.0.0.1:8787/admin/connections/callback",
        CLIENT,
        TTL,
    )
    .await;
    let echo = Echo::start_with(&[
        ("USERINFO_URL", &format!("{}/me", auth.issuer)),
        ("AS_ISSUER", &auth.issuer),
    ])
    .await;
    let key = key();
    let args = ["--oauth-cimd-allow-private", "--credential-key", &key];
    let docs = document_server().await;
    let one = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &args,
    )
    .await;
    let two = TestApp::with(pool.clone(), &repo_path("tools"), None, &args).await;
    for app in [&one, &two] {
        // As `serve` runs them: the refresher, and the listener that brings each instance
        // what the other changed (a new grant, a refreshed one).
        toolgate::service::connections::spawn_refresher(app.state.clone());
        toolgate::state::spawn_policy_listener(app.state.clone());
    }
    for person in ["alice", "bob"] {
        let r = one
            .admin(
                "PUT",
                &format!("/api/v1/agents/assistant/users/{person}"),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    }
    crate::upstream::put_upstream(
        &one,
        "linked",
        json!({
            "transport": "http",
            "url": format!("http://127.0.0.1:{}/mcp", echo.port),
            "headers": {"Authorization": format!("Bearer {LISTER}")},
            "credentials": {"LINK": {"per": "person", "inject": "header Authorization \"Bearer {}\"",
                                     "oauth": {"client_id": CLIENT, "scopes": ["openid"]}}},
            "pin": false
        }),
    )
    .await;
    let r = one
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "linked"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let own = one.token_for("assistant").await;
    crate::helpers::until(
        Duration::from_secs(10),
        "the second instance knows the client",
        || async { two.mcp(Some(&own), "tools/list", json!({})).await.status == StatusCode::OK },
    )
    .await;
    crate::upstream::wait_for_tools(&one, &own, "linked").await;
    crate::upstream::wait_for_tools(&two, &own, "linked").await;
    let h = Host { app: one, docs };

    // Alice's page offers Connect, not a value box; a typed value is refused.
    let mut alice = Browser::signed_in(&h.app, "alice", "viewer").await;
    let page = alice.get("/admin/connections").await;
    assert!(
        page.text.contains("data-connect=\"linked/LINK\""),
        "{}",
        page.text
    );
    assert!(page.text.contains("not connected"), "{}", page.text);
    let csrf = csrf_of(&page.text);
    let r = alice
        .post(
            "/admin/connections/linked/LINK",
            &[("csrf", &csrf), ("value", "typed-token-123")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let page = alice.get("/admin/connections").await;
    assert!(
        page.text.contains("by the person connecting"),
        "{}",
        page.text
    );
    assert!(page.text.contains("not connected"), "{}", page.text);

    // A callback that did not start in this browser, and one answered twice, connect nobody.
    let mut mallory = Browser::new(&h.app);
    let r = mallory
        .get("/admin/connections/callback?state=forged&code=abc")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("did not start in this browser"),
        "{}",
        r.text
    );

    let connected_at = std::time::Instant::now();
    let r = connect(&mut alice, &auth, "linked/LINK", "alice").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Connected"), "{}", r.text);
    let mut bob = Browser::signed_in(&h.app, "bob", "viewer").await;
    let r = connect(&mut bob, &auth, "linked/LINK", "bob").await;
    assert!(r.text.contains("Connected"), "{}", r.text);

    // Host tokens for alice and bob as `assistant`: each call carries its person's token, on
    // both instances, over MCP and REST; the agent's own token (no person) has none.
    let mut hosts = Vec::new();
    for b in [&mut alice, &mut bob] {
        let code = code_for(&h, b, REDIRECT).await;
        let t = exchange(&h, &code, VERIFIER, REDIRECT).await;
        assert_eq!(t.status, StatusCode::OK, "{}", t.text);
        hosts.push(t.body["access_token"].as_str().unwrap().to_owned());
    }
    for app in [&h.app, &two] {
        for (token, who) in hosts.iter().zip(["person:alice", "person:bob"]) {
            let r = app.call(token, "linked__whoami", json!({})).await;
            assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
            assert_eq!(text(&r.body), who);
            let r = app
                .post_json("/tools/linked/whoami", Some(token), json!({}))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            assert_eq!(r.body["content"][0]["text"], who, "{}", r.text);
        }
    }
    let r = h.app.call(&own, "linked__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);

    // Refreshed before expiry: past the first token's lifetime the calls still carry the
    // person's identity, each refresh happened once (a rotating refresh token spent twice
    // would have been refused), and none failed.
    let first = stored_grant(&pool, &key, "alice", "linked").await.unwrap();
    crate::helpers::until(
        Duration::from_secs(60),
        "alice's grant is refreshed",
        || async { changes(&pool, "credential.refreshed", "alice").await >= 1 },
    )
    .await;
    let second = stored_grant(&pool, &key, "alice", "linked").await.unwrap();
    assert_ne!(first.access_token, second.access_token);
    while connected_at.elapsed() < Duration::from_secs(TTL + 2) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for app in [&h.app, &two] {
        for (token, who) in hosts.iter().zip(["person:alice", "person:bob"]) {
            let r = app.call(token, "linked__whoami", json!({})).await;
            assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
            assert_eq!(text(&r.body), who);
        }
    }
    assert_eq!(
        changes(&pool, "credential.refresh_failed", "alice").await,
        0
    );
    assert_eq!(changes(&pool, "credential.refresh_failed", "bob").await, 0);
    assert_eq!(changes(&pool, "credential.connected", "alice").await, 1);

    // The upstream's server revokes alice's grant: her calls say to connect again (not an
    // empty list), the refresher records the refusal, and bob is untouched.
    let grant = stored_grant(&pool, &key, "alice", "linked").await.unwrap();
    auth.revoke(grant.refresh_token.as_deref().unwrap(), CLIENT)
        .await;
    auth.revoke(&grant.access_token, CLIENT).await;
    let r = h.app.call(&hosts[0], "linked__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert!(text(&r.body).contains("/admin/connections"), "{}", r.text);
    assert!(
        h.app
            .tool_names(&hosts[0])
            .await
            .contains(&"linked__whoami".to_owned()),
        "the tool stays listed"
    );
    crate::helpers::until(
        Duration::from_secs(60),
        "the refusal is on record",
        || async { changes(&pool, "credential.refresh_failed", "alice").await >= 1 },
    )
    .await;
    for app in [&h.app, &two] {
        let r = app.call(&hosts[0], "linked__whoami", json!({})).await;
        assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
        assert!(text(&r.body).contains("connect again"), "{}", r.text);
        let r = app.call(&hosts[1], "linked__whoami", json!({})).await;
        assert_eq!(text(&r.body), "person:bob", "{}", r.text);
    }
    let page = alice.get("/admin/connections").await;
    assert!(
        page.text.contains("data-problem=\"connection\""),
        "{}",
        page.text
    );
    assert!(page.text.contains("Reconnect"), "{}", page.text);

    // Reconnecting mends it.
    let r = connect(&mut alice, &auth, "linked/LINK", "alice").await;
    assert!(r.text.contains("Connected"), "{}", r.text);
    let r = h.app.call(&hosts[0], "linked__whoami", json!({})).await;
    assert_eq!(text(&r.body), "person:alice", "{}", r.text);

    // No token is on record anywhere, and no grant is readable in the database.
    h.app.state.audit.flush().await.unwrap();
    two.state.audit.flush().await.unwrap();
    let record: String =
        sqlx::query_scalar("SELECT coalesce(string_agg(e::text, '\n'), '') FROM audit_events e")
            .fetch_one(&pool)
            .await
            .unwrap();
    let latest = stored_grant(&pool, &key, "alice", "linked").await.unwrap();
    for secret in [
        &first.access_token,
        first.refresh_token.as_ref().unwrap(),
        &latest.access_token,
        latest.refresh_token.as_ref().unwrap(),
    ] {
        assert!(!record.contains(secret.as_str()), "a token is on record");
    }
    let rows: String = sqlx::query_scalar(
        "SELECT coalesce(string_agg(encode(ciphertext, 'escape'), ''), '') FROM credentials",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!rows.contains(&latest.access_token));
}
