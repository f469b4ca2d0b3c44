//! The admin UI, driven in process like a browser would: sign-in, cookies, CSRF, every page,
//! every role, escaping of hostile tool text.

use std::collections::HashMap;

use axum::body::Body;
use http::{Request, StatusCode, header};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, repo_path, single_op, write_group};

const PASSWORD: &str = "correct horse battery staple";

/// A cookie jar over [`TestApp`], signed in as one admin user.
pub(crate) struct Browser<'a> {
    app: &'a TestApp,
    cookies: HashMap<String, String>,
}

impl<'a> Browser<'a> {
    pub(crate) fn new(app: &'a TestApp) -> Self {
        Self {
            app,
            cookies: HashMap::new(),
        }
    }

    /// Creates `username` with `role` and signs in.
    pub(crate) async fn signed_in(app: &'a TestApp, username: &str, role: &str) -> Self {
        toolgate::service::accounts::create(&app.state.db, "test", username, PASSWORD, role)
            .await
            .unwrap();
        let mut b = Self::new(app);
        let r = b.login(username, PASSWORD).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
        b
    }

    /// Signs in as an account that already exists.
    pub(crate) async fn signed_in_existing(
        app: &'a TestApp,
        username: &str,
        password: &str,
    ) -> Self {
        let mut b = Self::new(app);
        let r = b.login(username, password).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
        b
    }

    pub(crate) async fn login(&mut self, username: &str, password: &str) -> Reply {
        let form = self.get("/admin/login").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.text);
        let csrf = csrf_of(&form.text);
        self.post(
            "/admin/login",
            &[
                ("csrf", &csrf),
                ("username", username),
                ("password", password),
                ("next", "/admin"),
            ],
        )
        .await
    }

    /// The value of one of the browser's cookies.
    pub(crate) fn cookies_value(&self, name: &str) -> String {
        self.cookies.get(name).cloned().unwrap_or_default()
    }

    fn remember(&mut self, reply: &Reply) {
        for v in reply.headers.get_all(header::SET_COOKIE) {
            let v = v.to_str().unwrap();
            let (pair, attrs) = v.split_once(';').unwrap_or((v, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if attrs.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) async fn get(&mut self, uri: &str) -> Reply {
        let req = Request::get(uri)
            .header(header::COOKIE, self.cookie_header())
            .body(Body::empty())
            .unwrap();
        let r = self.app.send(req).await;
        self.remember(&r);
        r
    }

    pub(crate) async fn post(&mut self, uri: &str, form: &[(&str, &str)]) -> Reply {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let req = Request::post(uri)
            .header(header::COOKIE, self.cookie_header())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        let r = self.app.send(req).await;
        self.remember(&r);
        r
    }

    /// A POST with this session's CSRF token, read from `page` as a browser would.
    pub(crate) async fn submit(&mut self, page: &str, uri: &str, form: &[(&str, &str)]) -> Reply {
        let html = self.get(page).await.text;
        let csrf = csrf_of(&html);
        let mut fields = vec![("csrf", csrf.as_str())];
        fields.extend_from_slice(form);
        self.post(uri, &fields).await
    }
}

pub(crate) fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF field in {html}"));
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

pub(crate) fn location(r: &Reply) -> &str {
    r.headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn grants_of(app: &TestApp, agent: &str) -> Vec<String> {
    app.state
        .policy
        .load()
        .agent(agent)
        .map(|a| a.record.grants.iter().map(|g| g.target.clone()).collect())
        .unwrap_or_default()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn signing_in_sets_a_strict_httponly_session_cookie(pool: PgPool) {
    let app = TestApp::new(pool).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);

    let r = b.login("ada", PASSWORD).await;

    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/admin");
    let session = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("toolgate_session="))
        .expect("a session cookie");
    assert!(session.contains("HttpOnly"), "{session}");
    assert!(session.contains("SameSite=Strict"), "{session}");
    assert!(session.contains("Path=/admin"), "{session}");
    // The public URL is http here, so the cookie cannot be Secure.
    assert!(!session.contains("Secure"), "{session}");
    let dash = b.get("/admin").await;
    assert_eq!(dash.status, StatusCode::OK);
    assert!(dash.text.contains("Dashboard"));
    // Only the sha256 of the session id is stored.
    let token = &b.cookies["toolgate_session"];
    let stored: Vec<String> = sqlx::query_scalar("SELECT token_sha256 FROM admin_sessions")
        .fetch_all(&app.state.db)
        .await
        .unwrap();
    assert!(!stored.contains(token));
    assert_eq!(stored.len(), 1);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_session_cookie_is_secure_when_the_public_url_is_https(pool: PgPool) {
    let app = TestApp::with(
        pool,
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &["--public-url", "https://gateway.example.com"],
    )
    .await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);

    let r = b.login("ada", PASSWORD).await;

    let cookies: Vec<String> = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let session = cookies
        .iter()
        .find(|v| v.starts_with("toolgate_session="))
        .unwrap();
    assert!(session.contains("; Secure"), "{session}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_wrong_password_is_refused_without_a_session(pool: PgPool) {
    let app = TestApp::new(pool).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);

    let wrong = b.login("ada", "not the password").await;
    let unknown = b.login("nobody", PASSWORD).await;

    for r in [&wrong, &unknown] {
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(r.text.contains("Wrong username or password."), "{}", r.text);
    }
    assert!(!b.cookies.contains_key("toolgate_session"));
    assert_eq!(b.get("/admin").await.status, StatusCode::SEE_OTHER);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn sign_in_attempts_are_rate_limited_per_username(pool: PgPool) {
    let app = TestApp::new(pool).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);

    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(b.login("ada", "guess").await);
    }

    assert!(
        statuses[..5]
            .iter()
            .all(|r| r.status == StatusCode::UNAUTHORIZED)
    );
    let limited = &statuses[5];
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.headers.contains_key(header::RETRY_AFTER));
    assert!(limited.text.contains("Too many sign-in attempts"));
    // Even the right password waits now.
    assert_eq!(
        b.login("ada", PASSWORD).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_sign_in_form_needs_its_own_csrf_token(pool: PgPool) {
    let app = TestApp::new(pool).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);

    let r = b
        .post(
            "/admin/login",
            &[
                ("username", "ada"),
                ("password", PASSWORD),
                ("csrf", "forged"),
            ],
        )
        .await;

    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(!b.cookies.contains_key("toolgate_session"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn pages_send_visitors_without_a_session_to_sign_in(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::new(&app);

    let r = b.get("/admin/agents/assistant").await;
    let post = b
        .post(
            "/admin/grants",
            &[
                ("agent", "assistant"),
                ("target", "text"),
                ("action", "save"),
            ],
        )
        .await;

    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(
        location(&r),
        "/admin/login?next=%2Fadmin%2Fagents%2Fassistant"
    );
    assert_eq!(post.status, StatusCode::FORBIDDEN);
    assert_eq!(grants_of(&app, "assistant"), vec!["search"]);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn every_page_renders_for_every_role_with_a_strict_csp(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    app.call(&token, "search__query", json!({"q": "deploy"}))
        .await;
    let event_id: i64 = sqlx::query_scalar("SELECT max(id) FROM audit_events")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    let pages = [
        "/admin".to_owned(),
        "/admin/agents".to_owned(),
        "/admin/agents/assistant".to_owned(),
        "/admin/grants".to_owned(),
        "/admin/grants/new?agent=assistant&target=serch".to_owned(),
        "/admin/tools".to_owned(),
        "/admin/tools/pending".to_owned(),
        "/admin/limits".to_owned(),
        "/admin/agents/meteo/limits".to_owned(),
        "/admin/audit".to_owned(),
        "/admin/audit?event_type=tool.call&since=2020-01-01T00:00".to_owned(),
        format!("/admin/audit/{event_id}"),
    ];
    for (user, role) in [("ada", "admin"), ("aud", "auditor"), ("vic", "viewer")] {
        let mut b = Browser::signed_in(&app, user, role).await;
        for p in &pages {
            let r = b.get(p).await;
            assert_eq!(r.status, StatusCode::OK, "{role} {p}: {}", r.text);
            let csp = r.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.contains("script-src 'self'"), "{csp}");
            assert!(!csp.contains("unsafe-inline"), "{csp}");
            assert_eq!(r.headers[header::CACHE_CONTROL], "no-store");
            assert!(
                r.text
                    .contains(&format!("<span class=\"who-name\">{user}</span>"))
            );
            // Only admins get forms that change things (sign-out aside).
            let edits =
                r.text.contains("action=\"/admin/grants\"") || r.text.contains("Remove<span");
            if role != "admin" {
                assert!(!edits, "{role} {p}");
            }
        }
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_typo_grant_is_flagged_red_with_a_suggestion_and_audited_under_the_admins_name(
    pool: PgPool,
) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let r = b
        .submit(
            "/admin/grants/new?agent=assistant",
            "/admin/grants",
            &[
                ("agent", "assistant"),
                ("target", "serch"),
                ("action", "save"),
            ],
        )
        .await;

    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(location(&r), "/admin/agents/assistant");
    let agent_page = b.get("/admin/agents/assistant").await;
    assert!(
        agent_page.text.contains("matches no tool. Did you mean"),
        "{}",
        agent_page.text
    );
    let dash = b.get("/admin").await.text;
    assert!(dash.contains("data-problem=\"zero-match\""));
    assert!(dash.contains("The grant <code>serch</code> of agent"));
    assert!(dash.contains(
        "Did you mean <a href=\"/admin/grants/new?agent=assistant&amp;target=search\"><code>search</code></a>?"
    ), "{dash}");
    let actor: String = sqlx::query_scalar(
        "SELECT admin_user FROM audit_events WHERE event_type = 'admin.change' AND resource = 'agent:assistant/grant:serch'",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(actor, "admin:ada");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_preview_shows_what_a_grant_matches_without_saving_it(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let r = b
        .submit(
            "/admin/grants/new",
            "/admin/grants",
            &[
                ("agent", "meteo"),
                ("target", "search"),
                ("action", "preview"),
            ],
        )
        .await;
    let json = b.get("/admin/grants/preview?target=serch").await;

    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.text.contains("<code>search</code> matches 2 tool(s):"),
        "{}",
        r.text
    );
    assert!(r.text.contains("<li><code>search__query</code></li>"));
    assert_eq!(grants_of(&app, "meteo"), vec!["weather"]);
    assert_eq!(json.status, StatusCode::OK);
    assert_eq!(json.body["matched_tools"], 0);
    assert_eq!(json.body["suggestions"][0], "search");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn removing_a_grant_asks_first_then_takes_effect(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let confirm = b
        .get("/admin/grants/remove?agent=assistant&target=search")
        .await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(
        confirm
            .text
            .contains("Remove the grant <code>search</code> from agent <code>assistant</code>?")
    );
    assert!(confirm.text.contains("search__query"));
    assert_eq!(grants_of(&app, "assistant"), vec!["search"]);
    let r = b
        .submit(
            "/admin/grants/remove?agent=assistant&target=search",
            "/admin/grants/remove",
            &[("agent", "assistant"), ("target", "search")],
        )
        .await;

    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert!(grants_of(&app, "assistant").is_empty());
    let page = b.get("/admin/agents/assistant").await.text;
    assert!(
        page.contains("Removed the grant <code>search</code>"),
        "{page}"
    );
    assert!(page.contains("data-problem=\"sees-nothing\""));
    // The flash is shown once.
    assert!(
        !b.get("/admin/agents/assistant")
            .await
            .text
            .contains("Removed the grant")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_auditor_or_viewer_cannot_post_a_grant(pool: PgPool) {
    let app = TestApp::new(pool).await;
    for (user, role) in [("aud", "auditor"), ("vic", "viewer")] {
        let mut b = Browser::signed_in(&app, user, role).await;

        let r = b
            .submit(
                "/admin",
                "/admin/grants",
                &[
                    ("agent", "assistant"),
                    ("target", "text"),
                    ("action", "save"),
                ],
            )
            .await;
        let remove = b
            .submit(
                "/admin",
                "/admin/grants/remove",
                &[("agent", "assistant"), ("target", "search")],
            )
            .await;

        assert_eq!(r.status, StatusCode::FORBIDDEN, "{role}");
        assert_eq!(remove.status, StatusCode::FORBIDDEN, "{role}");
        assert!(
            r.text.contains("can read but not change anything"),
            "{}",
            r.text
        );
        assert_eq!(
            b.get("/admin/grants/remove?agent=assistant&target=search")
                .await
                .status,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(grants_of(&app, "assistant"), vec!["search"]);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_post_without_the_right_csrf_token_is_refused(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;
    let form = [
        ("agent", "assistant"),
        ("target", "text"),
        ("action", "save"),
    ];

    let missing = b.post("/admin/grants", &form).await;
    let mut forged = vec![("csrf", "not-the-token")];
    forged.extend_from_slice(&form);
    let wrong = b.post("/admin/grants", &forged).await;

    for r in [&missing, &wrong] {
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert!(r.text.contains("did not come from this site"), "{}", r.text);
    }
    assert_eq!(grants_of(&app, "assistant"), vec!["search"]);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_viewer_sees_audit_events_without_tool_arguments(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let r = app
        .call(&token, "search__query", json!({"q": "pineapple rollback"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id: i64 = sqlx::query_scalar(
        "SELECT id FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started'",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    let mut viewer = Browser::signed_in(&app, "vic", "viewer").await;
    let mut auditor = Browser::signed_in(&app, "aud", "auditor").await;

    let seen_by_viewer = viewer.get(&format!("/admin/audit/{id}")).await;
    let seen_by_auditor = auditor.get(&format!("/admin/audit/{id}")).await;
    let viewer_export = viewer.get("/admin/audit/export?format=csv").await;
    let auditor_export = auditor
        .get("/admin/audit/export?format=csv&event_type=tool.call")
        .await;

    assert_eq!(seen_by_viewer.status, StatusCode::OK);
    assert!(seen_by_viewer.text.contains("search__query"));
    assert!(
        !seen_by_viewer.text.contains("pineapple"),
        "{}",
        seen_by_viewer.text
    );
    assert!(
        seen_by_viewer
            .text
            .contains("Hidden for the viewer role: Arguments")
    );
    assert!(seen_by_auditor.text.contains("pineapple rollback"));
    assert_eq!(viewer_export.status, StatusCode::FORBIDDEN);
    assert!(
        !viewer
            .get("/admin/audit")
            .await
            .text
            .contains("data-export")
    );
    assert_eq!(auditor_export.status, StatusCode::OK);
    assert!(
        auditor_export.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let mut lines = auditor_export.text.lines();
    assert!(lines.next().unwrap().starts_with("id,at,chain"));
    assert!(auditor_export.text.contains("pineapple rollback"));
    assert!(lines.all(|l| l.contains("tool.call")));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_script_tag_in_a_tool_description_renders_as_text(pool: PgPool) {
    let tools = tempfile::tempdir().unwrap();
    let hostile = "<script>alert(1)</script>";
    write_group(
        tools.path(),
        "evil",
        &single_op(
            "run",
            json!({"type": "object", "properties": {"x": {"type": "string", "description": "\"><img src=x onerror=alert(2)>"}}}),
            json!({"description": hostile}),
        ),
        &[("run.sh", "#!/bin/sh\necho '{}'\n")],
    );
    let app = TestApp::with(pool, tools.path(), None, &[]).await;
    assert!(app.state.policy.load().catalog.get("evil__run").is_some());
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let page = b.get("/admin/tools").await;

    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.text.contains(hostile));
    // askama writes `<` and `>` as numeric character references.
    assert!(
        page.text
            .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "{}",
        page.text
    );
    assert!(!page.text.contains("<img src=x"));
    assert!(!page.text.contains("<script>"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn unknown_pages_show_a_404_with_the_request_id_and_nothing_else(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let missing_page = b.get("/admin/no-such-page").await;
    let missing_agent = b.get("/admin/agents/nobody").await;
    let bad_event = b.get("/admin/audit/not-a-number").await;

    for r in [&missing_page, &missing_agent, &bad_event] {
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        let id = r.headers["x-request-id"].to_str().unwrap();
        assert!(!id.is_empty());
        assert!(r.text.contains(&format!("<code>{id}</code>")), "{}", r.text);
        assert!(
            r.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(r.headers.contains_key(header::CONTENT_SECURITY_POLICY));
    }
    assert!(
        missing_agent
            .text
            .contains("Agent <code>nobody</code> does not exist.")
            || missing_agent
                .text
                .contains("Agent `nobody` does not exist."),
        "{}",
        missing_agent.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_oauth_client_secret_is_shown_once_and_the_client_can_be_revoked(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let created = b
        .submit(
            "/admin/agents/meteo",
            "/admin/agents/meteo/clients",
            &[("description", "ci runner")],
        )
        .await;

    assert_eq!(created.status, StatusCode::OK);
    assert_eq!(created.headers[header::CACHE_CONTROL], "no-store");
    let at = created.text.find("tgs_").expect("the secret is shown");
    let secret: String = created.text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let id_at = created.text.find("tgc_").unwrap();
    let client_id: String = created.text[id_at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let token = app.token_with(&client_id, &secret).await;
    assert!(!token.is_empty());
    let agent_page = b.get("/admin/agents/meteo").await.text;
    assert!(agent_page.contains(&client_id));
    assert!(!agent_page.contains(&secret));

    let confirm = b.get(&format!("/admin/clients/{client_id}/revoke")).await;
    assert_eq!(confirm.status, StatusCode::OK);
    let r = b
        .submit(
            &format!("/admin/clients/{client_id}/revoke"),
            &format!("/admin/clients/{client_id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/admin/agents/meteo");
    let after = b.get("/admin/agents/meteo").await.text;
    assert!(after.contains(&format!("Revoked client <code>{client_id}</code>")));
    assert!(!after.contains(&format!("<code>{client_id}</code><br>")));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn rate_limits_are_edited_per_agent_and_per_tool(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let bad = b
        .submit(
            "/admin/agents/meteo/limits",
            "/admin/agents/meteo/limits",
            &[
                ("pattern_0", ""),
                ("rate_0", "many"),
                ("period_0", "second"),
                ("burst_0", "10"),
            ],
        )
        .await;
    let ok = b
        .submit(
            "/admin/agents/meteo/limits",
            "/admin/agents/meteo/limits",
            &[
                ("pattern_0", ""),
                ("rate_0", "7"),
                ("period_0", "second"),
                ("burst_0", "14"),
                ("pattern_1", "weather__forecast"),
                ("rate_1", "1.5"),
                ("period_1", "minute"),
                ("burst_1", ""),
                ("pattern_2", ""),
                ("rate_2", ""),
                ("period_2", "second"),
                ("burst_2", ""),
            ],
        )
        .await;

    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        bad.text.contains("must be a number, not <code>many</code>"),
        "{}",
        bad.text
    );
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.text);
    let limits = app
        .state
        .policy
        .load()
        .agent("meteo")
        .unwrap()
        .record
        .limits
        .clone();
    assert_eq!(limits.len(), 2);
    assert_eq!(limits[0].limit.to_string(), "7/second burst 14");
    assert_eq!(
        limits[1]
            .pattern
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("weather__forecast")
    );
    assert_eq!(limits[1].limit.to_string(), "1.5/minute");
    let overview = b.get("/admin/limits").await.text;
    assert!(overview.contains("<code>weather__forecast</code>"));
    // Shown as written, the unwritten burst as the default in force.
    assert!(overview.contains("1.5 per minute"), "{overview}");
    assert!(overview.contains("2 (default)"), "{overview}");
    let editor = b.get("/admin/agents/meteo/limits").await.text;
    assert!(editor.contains(r#"value="1.5""#), "{editor}");
    assert!(
        editor.contains(r#"<option value="minute" selected>"#),
        "{editor}"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_agent_page_shows_its_tools_and_their_token_cost_against_the_pool(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let page = b.get("/admin/agents/meteo").await.text;

    assert!(page.contains("<code>weather__current</code>"));
    assert!(!page.contains("<code>search__query</code></a>"));
    let tokens = |marker: &str| -> usize {
        let at = page.find(marker).unwrap() + marker.len();
        page[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '\u{202f}')
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let agent = tokens("data-cost=\"agent\">");
    let whole = tokens("data-cost=\"pool\">");
    assert!(agent > 50 && agent < whole, "{agent} {whole}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_audit_log_filters_and_pages_by_keyset(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;
    for target in ["text", "weather"] {
        b.submit(
            "/admin",
            "/admin/grants",
            &[
                ("agent", "assistant"),
                ("target", target),
                ("action", "save"),
            ],
        )
        .await;
    }
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM audit_events WHERE event_type = 'admin.change' ORDER BY id DESC",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();

    let filtered = b.get("/admin/audit?event_type=admin.change").await.text;
    let older = b
        .get(&format!(
            "/admin/audit?event_type=admin.change&before={}",
            ids[0]
        ))
        .await
        .text;
    let bad_time = b.get("/admin/audit?since=yesterday").await;

    assert!(filtered.contains("agent:assistant/grant:weather"));
    assert!(filtered.contains("admin:ada"));
    assert!(!filtered.contains("<code>admin.login</code>"));
    assert!(
        filtered.contains("href=\"/admin/audit/export?event_type=admin.change&#38;format=csv\""),
        "{filtered}"
    );
    assert!(!older.contains("agent:assistant/grant:weather"));
    assert!(older.contains("agent:assistant/grant:text"));
    assert!(older.contains("← Newest"));
    assert_eq!(bad_time.status, StatusCode::OK);
    assert!(
        bad_time
            .text
            .contains("<code>yesterday</code> is not a time")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn signing_out_ends_the_session(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "vic", "viewer").await;
    let old_cookie = b.cookies["toolgate_session"].clone();

    let r = b.submit("/admin", "/admin/logout", &[]).await;

    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/admin/login?signed_out=1");
    assert!(!b.cookies.contains_key("toolgate_session"));
    // The old cookie no longer works either: the session is gone from the database.
    b.cookies.insert("toolgate_session".into(), old_cookie);
    assert_eq!(b.get("/admin").await.status, StatusCode::SEE_OTHER);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn agents_are_created_and_deleted_from_the_ui(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;

    let bad = b
        .submit(
            "/admin/agents",
            "/admin/agents",
            &[("name", "no spaces"), ("description", "")],
        )
        .await;
    let ok = b
        .submit(
            "/admin/agents",
            "/admin/agents",
            &[
                ("name", "scribe"),
                ("description", "Writes"),
                ("discovery", "search"),
            ],
        )
        .await;
    let page = b.get("/admin/agents/scribe").await.text;
    let deleted = b
        .submit(
            "/admin/agents/scribe/delete",
            "/admin/agents/scribe/delete",
            &[],
        )
        .await;

    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    assert!(page.contains("It sees no tools until you add a grant."));
    assert!(page.contains("served as <strong>search</strong>"), "{page}");
    assert_eq!(deleted.status, StatusCode::SEE_OTHER);
    assert!(app.state.policy.load().agent("scribe").is_none());
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn static_assets_are_served_with_their_types(pool: PgPool) {
    let app = TestApp::new(pool).await;

    let css = app.get("/static/admin.css", None).await;
    let js = app.get("/static/admin.js", None).await;

    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    assert!(
        js.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(!js.text.contains("innerHTML"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn broken_tool_groups_are_shown_on_the_dashboard_and_in_the_catalog(pool: PgPool) {
    let tools = tempfile::tempdir().unwrap();
    write_group(
        tools.path(),
        "fine",
        &single_op("run", json!({"type": "object"}), json!({})),
        &[("run.sh", "#!/bin/sh\necho '{}'\n")],
    );
    std::fs::create_dir_all(tools.path().join("broken")).unwrap();
    std::fs::write(tools.path().join("broken/openapi.json"), "{ not json").unwrap();
    let app = TestApp::with(pool, tools.path(), None, &[]).await;
    let mut b = Browser::signed_in(&app, "vic", "viewer").await;

    let dash = b.get("/admin").await.text;
    let catalog = b.get("/admin/tools").await.text;

    for page in [&dash, &catalog] {
        assert!(
            page.contains("<span class=\"problem-tag\">Load error</span>"),
            "{page}"
        );
        assert!(page.contains("<code>tools/broken</code>"), "{page}");
    }
    assert!(catalog.contains("<span class=\"badge badge-bad\">load error</span>"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_database_failure_shows_an_opaque_page_with_the_request_id(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;
    app.state.db.close().await;

    let r = b.get("/admin/agents/assistant").await;

    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let id = r.headers["x-request-id"].to_str().unwrap();
    assert!(r.text.contains(&format!("<code>{id}</code>")), "{}", r.text);
    assert!(r.text.contains("The database is unavailable right now"));
    for leak in ["sqlx", "pool", "closed", "PoolClosed", "panicked"] {
        assert!(!r.text.contains(leak), "{leak} in {}", r.text);
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn argument_rules_are_previewed_saved_flagged_and_removed_from_the_ui(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let mut b = Browser::signed_in(&app, "ada", "admin").await;
    let page = "/admin/agents/meteo/arguments";

    // Preview: the narrowed schema the model will see, nothing saved.
    let preview = b
        .submit(
            page,
            page,
            &[
                ("target", "weather__forecast"),
                ("params", r#"{"days": {"maximum": 3}}"#),
                ("action", "preview"),
            ],
        )
        .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
    assert!(
        preview.text.contains(r#"data-schema="weather__forecast""#),
        "{}",
        preview.text
    );
    assert!(
        preview.text.contains("&#34;maximum&#34;: 3"),
        "{}",
        preview.text
    );
    assert!(
        app.state
            .policy
            .load()
            .agent("meteo")
            .unwrap()
            .record
            .arguments
            .is_empty()
    );

    // Not JSON, or not a rule: refused with the reason, nothing saved.
    let bad = b
        .submit(
            page,
            page,
            &[
                ("target", "weather__forecast"),
                ("params", "{days"),
                ("action", "save"),
            ],
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.text.contains("not JSON"), "{}", bad.text);

    // Saved with a hostile value and a misspelt parameter: kept, escaped, flagged in red on the
    // agent page and the dashboard.
    let saved = b
        .submit(
            page,
            page,
            &[
                ("target", "weather__forecast"),
                ("params", r#"{"dayz": {"maximum": 3}, "city": {"enum": ["<script>alert(1)</script>", "Paris"]}}"#),
                ("action", "save"),
            ],
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.text);
    let editor = b.get(page).await.text;
    assert!(!editor.contains("<script>alert"), "{editor}");
    assert!(editor.contains("&#60;script&#62;"), "{editor}");
    assert!(
        editor.contains(r#"data-problem="unknown_parameter""#),
        "{editor}"
    );
    let dashboard = b.get("/admin").await.text;
    assert!(
        dashboard.contains(r#"data-problem="argument-rule""#),
        "{dashboard}"
    );
    assert!(
        dashboard.contains("did you mean <code>days</code>?"),
        "{dashboard}"
    );
    let agent = b.get("/admin/agents/meteo").await.text;
    assert!(agent.contains(r#"data-problem="argument-rule""#), "{agent}");

    // Recorded under the admin's name.
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE event_type = 'admin.change' AND admin_user = 'admin:ada'
         AND details::jsonb->>'action' = 'arguments.set'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(n, 1);

    let removed = b
        .submit(
            page,
            page,
            &[("target", "weather__forecast"), ("action", "remove")],
        )
        .await;
    assert_eq!(removed.status, StatusCode::SEE_OTHER, "{}", removed.text);
    assert!(
        app.state
            .policy
            .load()
            .agent("meteo")
            .unwrap()
            .record
            .arguments
            .is_empty()
    );

    // A viewer sees the rules but cannot change them.
    let mut viewer = Browser::signed_in(&app, "vic", "viewer").await;
    let view = viewer.get(page).await;
    assert_eq!(view.status, StatusCode::OK);
    assert!(!view.text.contains(r#"name="params""#), "{}", view.text);
}
