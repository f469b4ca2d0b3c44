//! Account management and session rules: the `/api/v1/users` API and the account pages, the
//! idle and absolute session limits, disabling (which ends sessions at once), the last-admin
//! guard, CSRF, the member role, password sign-in turned off, one-time reset links, and the
//! SSO callback's refusal of a state that did not start in this browser.

use axum::body::Body;
use http::{Request, StatusCode, header};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path};
use crate::web::{Browser, csrf_of, location};

const PASSWORD: &str = "correct horse battery staple";

async fn app_with(pool: PgPool, args: &[&str]) -> TestApp {
    TestApp::with(
        pool,
        &repo_path("tools"),
        Some(&repo_path("policies")),
        args,
    )
    .await
}

/// Whether the browser's session still opens the dashboard (a dead one is sent to sign in).
async fn is_signed_in(b: &mut Browser<'_>) -> bool {
    let r = b.get("/admin").await;
    match r.status {
        StatusCode::OK => true,
        StatusCode::SEE_OTHER => {
            assert!(location(&r).starts_with("/admin/login"), "{}", location(&r));
            false
        }
        s => panic!("unexpected {s}: {}", r.text),
    }
}

/// The latest control-plane change of `resource`: its actor and details.
async fn last_change(app: &TestApp, resource: &str) -> (String, Value, Option<String>) {
    let (actor, details, request_id): (String, String, Option<String>) = sqlx::query_as(
        "SELECT admin_user, details, request_id FROM audit_events
         WHERE event_type = 'admin.change' AND resource = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(resource)
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    (actor, serde_json::from_str(&details).unwrap(), request_id)
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn disabling_an_account_ends_its_sessions_at_once_and_it_cannot_sign_in(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let _ada = Browser::signed_in(&app, "ada", "admin").await;
    let mut bob = Browser::signed_in(&app, "bob", "viewer").await;
    assert!(is_signed_in(&mut bob).await);

    let r = app.admin("POST", "/api/v1/users/bob/disable", None).await;

    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["disabled"], true);
    assert!(
        !is_signed_in(&mut bob).await,
        "the session outlived the account"
    );
    let again = bob.login("bob", PASSWORD).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "{}", again.text);
    assert!(again.text.contains("disabled"));
    // A wrong password on a disabled account says only "wrong": no oracle.
    let wrong = bob.login("bob", "not the password at all").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let (actor, details, request_id) = last_change(&app, "admin_user:bob").await;
    assert_eq!(actor, "api:admin-token");
    assert_eq!(details["action"], "admin_user.disable");
    assert_eq!(details["after"]["sessions_ended"], 1);
    assert!(request_id.is_some(), "the change names its request");

    let r = app.admin("POST", "/api/v1/users/bob/enable", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let back = bob.login("bob", PASSWORD).await;
    assert_eq!(back.status, StatusCode::SEE_OTHER, "{}", back.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_session_unused_for_the_idle_timeout_has_ended(pool: PgPool) {
    let app = app_with(pool, &["--session-idle-minutes", "5"]).await;
    let mut ada = Browser::signed_in(&app, "ada", "admin").await;
    let backdate = |minutes: i32| {
        let db = app.state.db.clone();
        async move {
            sqlx::query(
                "UPDATE admin_sessions SET last_seen_at = now() - make_interval(mins => $1)",
            )
            .bind(minutes)
            .execute(&db)
            .await
            .unwrap();
        }
    };

    backdate(4).await;
    assert!(is_signed_in(&mut ada).await, "used within the idle timeout");
    // That request moved the idle deadline.
    let idle_secs: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM now() - last_seen_at)::float8 FROM admin_sessions",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert!(idle_secs < 60.0, "{idle_secs}");

    backdate(6).await;
    assert!(!is_signed_in(&mut ada).await, "idle past the timeout");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_session_ends_at_its_absolute_lifetime_however_active(pool: PgPool) {
    let app = app_with(pool, &["--session-max-hours", "2"]).await;
    let mut ada = Browser::signed_in(&app, "ada", "admin").await;
    let lifetime: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM expires_at - created_at)::float8 FROM admin_sessions",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert!((lifetime - 7200.0).abs() < 5.0, "{lifetime}");
    let cookie = ada.get("/admin/login").await;
    assert_eq!(cookie.status, StatusCode::SEE_OTHER);

    // Just used, but past its end.
    sqlx::query(
        "UPDATE admin_sessions SET created_at = now() - interval '2 hours 1 minute',
         expires_at = now() - interval '1 minute', last_seen_at = now()",
    )
    .execute(&app.state.db)
    .await
    .unwrap();

    assert!(!is_signed_in(&mut ada).await);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_last_enabled_admin_cannot_be_disabled_deleted_or_demoted(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut ada = Browser::signed_in(&app, "ada", "admin").await;

    for (method, uri, body) in [
        ("POST", "/api/v1/users/ada/disable", None),
        ("DELETE", "/api/v1/users/ada", None),
        (
            "PUT",
            "/api/v1/users/ada/role",
            Some(json!({"role": "viewer"})),
        ),
    ] {
        let r = app.admin(method, uri, body).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{method} {uri}: {}", r.text);
        assert!(
            r.body["error"]
                .as_str()
                .unwrap()
                .contains("last enabled admin")
        );
    }
    // The same through the pages, by ada herself.
    let r = ada
        .submit("/admin/accounts/ada", "/admin/accounts/ada/disable", &[])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = ada
        .submit(
            "/admin/accounts/ada",
            "/admin/accounts/ada/role",
            &[("role", "member")],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let ada_row = app.admin("GET", "/api/v1/users/ada", None).await;
    assert_eq!(ada_row.body["role"], "admin");
    assert_eq!(ada_row.body["disabled"], false);

    // A disabled admin does not count: it cannot manage anything.
    let r = app
        .admin(
            "POST",
            "/api/v1/users",
            Some(json!({"username": "grace", "password": PASSWORD, "role": "admin"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = app.admin("POST", "/api/v1/users/grace/disable", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = app.admin("POST", "/api/v1/users/ada/disable", None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);

    // With a second enabled admin, either may go.
    app.admin("POST", "/api/v1/users/grace/enable", None).await;
    let r = app
        .admin(
            "PUT",
            "/api/v1/users/ada/role",
            Some(json!({"role": "viewer"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = app.admin("DELETE", "/api/v1/users/grace", None).await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "grace is now the last: {}",
        r.text
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn account_forms_need_the_sessions_csrf_token_and_the_admin_role(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut ada = Browser::signed_in(&app, "ada", "admin").await;
    let mut vic = Browser::signed_in(&app, "vic", "viewer").await;

    for (uri, form) in [
        ("/admin/accounts/vic/disable", vec![]),
        ("/admin/accounts/vic/delete", vec![]),
        ("/admin/accounts/vic/role", vec![("role", "admin")]),
        ("/admin/accounts/vic/end-sessions", vec![]),
        ("/admin/accounts/vic/reset", vec![]),
        (
            "/admin/accounts",
            vec![("username", "x"), ("password", PASSWORD), ("role", "admin")],
        ),
    ] {
        let mut fields = vec![("csrf", "forged")];
        fields.extend(form.iter().copied());
        let r = ada.post(uri, &fields).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}: {}", r.text);
        assert!(r.text.contains("did not come from this site"), "{uri}");
    }
    assert!(is_signed_in(&mut vic).await, "nothing changed");
    let vic_row = app.admin("GET", "/api/v1/users/vic", None).await;
    assert_eq!(vic_row.body["role"], "viewer");

    // A viewer's own valid token does not let it change accounts either.
    let r = vic
        .submit(
            "/admin/accounts",
            "/admin/accounts/vic/role",
            &[("role", "admin")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let vic_row = app.admin("GET", "/api/v1/users/vic", None).await;
    assert_eq!(vic_row.body["role"], "viewer");
    // But it can read the list.
    let list = vic.get("/admin/accounts").await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(list.text.contains("ada"));
    assert!(!list.text.contains("New local account"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_member_is_refused_on_every_admin_page_but_sign_out(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut mo = Browser::signed_in(&app, "mo", "member").await;

    for page in [
        "/admin",
        "/admin/agents",
        "/admin/grants",
        "/admin/tools",
        "/admin/limits",
        "/admin/audit",
        "/admin/audit/export",
        "/admin/accounts",
        "/admin/accounts/mo",
        "/admin/agents/nobody-at-all",
    ] {
        let r = mo.get(page).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{page}: {}", r.text);
        assert!(
            r.text.contains("member role may not use the admin pages"),
            "{page}"
        );
    }
    // Its CSRF token is in no page it may see; a forged one still meets the role check first.
    let r = mo
        .post("/admin/agents", &[("csrf", "x"), ("name", "sneaky")])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(app.state.policy.load().agent("sneaky").is_none());
    let csrf: String = sqlx::query_scalar("SELECT csrf_token FROM admin_sessions")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    let r = mo.post("/admin/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(location(&r).starts_with("/admin/login"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn password_sign_in_off_refuses_even_a_right_password(pool: PgPool) {
    let app = app_with(pool, &["--password-sign-in", "off"]).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    let mut b = Browser::new(&app);
    let form = b.get("/admin/login").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(!form.text.contains("type=\"password\""), "{}", form.text);

    // The form is gone, but a crafted post is refused too.
    let csrf = b.cookies_value("toolgate_login");
    let r = b
        .post(
            "/admin/login",
            &[("csrf", &csrf), ("username", "ada"), ("password", PASSWORD)],
        )
        .await;

    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.text.contains("Password sign-in is turned off"));
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM admin_sessions")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_reset_link_sets_a_password_once_and_ends_the_accounts_sessions(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let _ada = Browser::signed_in(&app, "ada", "admin").await;
    let mut bob = Browser::signed_in(&app, "bob", "viewer").await;

    let r = app
        .admin("POST", "/api/v1/users/bob/password-reset", None)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let url = r.body["reset_url"].as_str().unwrap().to_owned();
    let path = url
        .strip_prefix("http://127.0.0.1:8787")
        .unwrap()
        .to_owned();
    let token = path.rsplit('=').next().unwrap().to_owned();
    assert!(path.starts_with("/admin/reset?token="), "{path}");
    let stored: String = sqlx::query_scalar("SELECT token_sha256 FROM admin_password_resets")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_ne!(stored, token, "only the hash is stored");

    let mut stranger = Browser::new(&app);
    let form = stranger.get(&path).await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.text);
    let csrf = csrf_of(&form.text);
    let post = "/admin/reset";
    // Without the form's cookie (a cross-site post), nothing happens.
    let mut other = Browser::new(&app);
    let r = other
        .post(
            post,
            &[
                ("token", &token),
                ("csrf", &csrf),
                ("password", "a brand new passphrase"),
                ("confirm", "a brand new passphrase"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = stranger
        .post(
            post,
            &[
                ("token", &token),
                ("csrf", &csrf),
                ("password", "short"),
                ("confirm", "short"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = stranger
        .post(
            post,
            &[
                ("token", &token),
                ("csrf", &csrf),
                ("password", "a brand new passphrase"),
                ("confirm", "a brand new passphrase"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);

    assert!(!is_signed_in(&mut bob).await, "the old session ended");
    assert_eq!(
        bob.login("bob", PASSWORD).await.status,
        StatusCode::UNAUTHORIZED
    );
    let fresh = bob.login("bob", "a brand new passphrase").await;
    assert_eq!(fresh.status, StatusCode::SEE_OTHER);
    // Used once.
    let again = Browser::new(&app).get(&path).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN);
    assert!(again.text.contains("expired or was used"));
    // A link for a made-up token is the same page, and junk is not looked up.
    let junk = Browser::new(&app)
        .get("/admin/reset?token=%3Cscript%3E")
        .await;
    assert_eq!(junk.status, StatusCode::FORBIDDEN);
    assert!(!junk.text.contains("<script>"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn the_api_lists_accounts_and_ends_one_session_of_many(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let _ada = Browser::signed_in(&app, "ada", "admin").await;
    let mut bob1 = Browser::signed_in(&app, "bob", "auditor").await;
    let mut bob2 = Browser::new(&app);
    assert_eq!(
        bob2.login("bob", PASSWORD).await.status,
        StatusCode::SEE_OTHER
    );

    let list = app.admin("GET", "/api/v1/users", None).await;
    assert_eq!(list.status, StatusCode::OK);
    let names: Vec<&str> = list.body["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["username"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ada", "bob"]);
    assert!(!list.text.contains("argon2"), "no password hash leaves");
    let sessions = app.admin("GET", "/api/v1/users/bob/sessions", None).await;
    let ids: Vec<String> = sessions.body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2);
    // Newest first: bob2's.
    let r = app
        .admin(
            "DELETE",
            &format!("/api/v1/users/bob/sessions/{}", ids[0]),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    assert!(is_signed_in(&mut bob1).await);
    assert!(!is_signed_in(&mut bob2).await);
    // Another account's session id does not end anything of bob's.
    let r = app
        .admin(
            "DELETE",
            &format!("/api/v1/users/ada/sessions/{}", ids[1]),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(is_signed_in(&mut bob1).await);
    // Without the admin token, nothing.
    let r = app.get("/api/v1/users", None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = app
        .admin(
            "PUT",
            "/api/v1/users/bob/role",
            Some(json!({"role": "root"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = app.admin("DELETE", "/api/v1/users/nobody", None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_sso_callback_is_refused_unless_this_browser_started_it(pool: PgPool) {
    // Nothing listens at the issuer: these refusals happen before the provider is asked.
    let app = app_with(
        pool,
        &[
            "--oidc-issuer",
            "http://127.0.0.1:9/",
            "--oidc-client-id",
            "toolgate",
            "--oidc-role-map",
            "toolgate-admins=admin",
        ],
    )
    .await;
    let mut b = Browser::new(&app);
    let login = b.get("/admin/login").await;
    assert!(
        login.text.contains("Sign in with 127.0.0.1"),
        "{}",
        login.text
    );

    // An attacker's own callback URL, opened in the victim's browser (login CSRF).
    let r = b
        .get("/admin/sso/callback?state=attackers-state&code=attackers-code")
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.text.contains("did not start in this browser"));
    // A matching cookie for a state that was never issued.
    let req = Request::get("/admin/sso/callback?state=made-up&code=x")
        .header(header::COOKIE, "toolgate_sso=made-up")
        .body(Body::empty())
        .unwrap();
    let r = app.send(req).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM admin_sessions")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    // A live flow, answered by another issuer (RFC 9207 mix-up): refused, and used up.
    let flow = toolgate::db::sso_flows::SsoFlow {
        nonce: "n".into(),
        pkce_verifier: "v".into(),
        next_url: "/admin".into(),
    };
    toolgate::db::sso_flows::insert_flow(
        &app.state.db,
        &toolgate::web::session::sha256_hex("live-state"),
        &flow,
        chrono::Utc::now() + chrono::Duration::minutes(5),
    )
    .await
    .unwrap();
    let callback = |iss: &str| {
        Request::get(format!(
            "/admin/sso/callback?state=live-state&code=c&iss={iss}"
        ))
        .header(header::COOKIE, "toolgate_sso=live-state")
        .body(Body::empty())
        .unwrap()
    };
    let r = app.send(callback("https%3A%2F%2Fevil.example")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.text.contains("another provider"), "{}", r.text);
    let r = app.send(callback("http%3A%2F%2F127.0.0.1%3A9%2F")).await;
    assert!(
        r.text.contains("did not start in this browser"),
        "a flow answers once"
    );
    // The provider being down is a clear 502, not a crash.
    let r = b.get("/admin/sso/start").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text);
    assert!(r.text.contains("cannot be reached"));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn sso_flags_that_cannot_work_are_refused_at_start(pool: PgPool) {
    drop(pool);
    use clap::Parser;
    for args in [
        vec![
            "--oidc-issuer",
            "https://id.example.com",
            "--oidc-role-map",
            "a=admin",
        ],
        vec![
            "--oidc-issuer",
            "https://id.example.com",
            "--oidc-client-id",
            "x",
        ],
        vec![
            "--oidc-issuer",
            "https://id.example.com",
            "--oidc-client-id",
            "x",
            "--oidc-role-map",
            "a=root",
        ],
        vec!["--oidc-client-id", "x"],
        vec![
            "--oidc-issuer",
            "https://id.example.com",
            "--oidc-client-id",
            "x",
            "--oidc-role-map",
            "a=admin",
            "--oidc-approver-map",
            "finance-team=Finance Team",
        ],
    ] {
        let mut all = vec!["toolgate", "serve"];
        all.extend(&args);
        let toolgate::config::Command::Serve(serve) =
            toolgate::config::Cli::try_parse_from(all).unwrap().command
        else {
            unreachable!()
        };
        // What `serve` checks at start: the core's settings, then the admin UI's own (SSO).
        let checked = toolgate::state::Settings::from_args(&serve)
            .and_then(|settings| toolgate::app::Surfaces::from_args(&serve, &settings));
        assert!(checked.is_err(), "{args:?} was accepted");
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_admin_manages_an_account_through_the_pages(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut ada = Browser::signed_in(&app, "ada", "admin").await;

    let r = ada
        .submit(
            "/admin/accounts",
            "/admin/accounts",
            &[
                ("username", "grace"),
                ("password", PASSWORD),
                ("role", "viewer"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(location(&r), "/admin/accounts/grace");
    let mut grace = Browser::new(&app);
    assert_eq!(
        grace.login("grace", PASSWORD).await.status,
        StatusCode::SEE_OTHER
    );

    let r = ada
        .submit(
            "/admin/accounts/grace",
            "/admin/accounts/grace/role",
            &[("role", "auditor")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let page = ada.get("/admin/accounts/grace").await;
    assert!(page.text.contains("now has the role"), "{}", page.text);
    assert!(page.text.contains(">auditor</span>"));
    // Her session shows, with where it came from, and ending it signs her out.
    assert!(page.text.contains("name=\"session\""));
    let (actor, details, _) = last_change(&app, "admin_user:grace").await;
    assert_eq!(actor, "admin:ada");
    assert_eq!(details["before"]["role"], "viewer");
    assert_eq!(details["after"]["role"], "auditor");

    let confirm = ada.get("/admin/accounts/grace/end-sessions").await;
    assert_eq!(confirm.status, StatusCode::OK);
    let r = ada
        .submit(
            "/admin/accounts/grace/end-sessions",
            "/admin/accounts/grace/end-sessions",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(!is_signed_in(&mut grace).await);

    let r = ada
        .submit(
            "/admin/accounts/grace/delete",
            "/admin/accounts/grace/delete",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        grace.login("grace", PASSWORD).await.status,
        StatusCode::UNAUTHORIZED
    );
    let gone = ada.get("/admin/accounts/grace").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    // The reset link page is rendered once, for the admin, and names the link.
    let r = ada
        .submit("/admin/accounts/ada", "/admin/accounts/ada/reset", &[])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("/admin/reset?token="));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn two_admins_disabling_each_other_at_once_leave_one_enabled(pool: PgPool) {
    let app = TestApp::new(pool).await;
    for name in ["ada", "grace"] {
        toolgate::service::accounts::create(&app.state.db, "test", name, PASSWORD, "admin")
            .await
            .unwrap();
    }
    for _ in 0..10 {
        let (a, b) = tokio::join!(
            toolgate::service::accounts::set_disabled(&app.state, "admin:grace", "ada", true),
            toolgate::service::accounts::set_disabled(&app.state, "admin:ada", "grace", true),
        );
        assert!(a.is_ok() != b.is_ok(), "exactly one may pass: {a:?} {b:?}");
        let enabled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM admin_users WHERE role = 'admin' AND disabled_at IS NULL",
        )
        .fetch_one(&app.state.db)
        .await
        .unwrap();
        assert_eq!(enabled, 1);
        sqlx::query("UPDATE admin_users SET disabled_at = NULL")
            .execute(&app.state.db)
            .await
            .unwrap();
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_federated_account_is_keyed_by_issuer_and_subject_never_by_name(pool: PgPool) {
    use toolgate::db::accounts::{Federated, sign_in_federated};
    use toolgate::db::sessions::end_federated_sessions;
    let app = TestApp::new(pool).await;
    // A local `alice` exists; the provider's alice must not become her.
    toolgate::service::accounts::create(&app.state.db, "test", "alice", PASSWORD, "viewer")
        .await
        .unwrap();
    let names = ["alice".to_owned(), "alice-2".to_owned()];
    let mut tx = app.state.db.begin().await.unwrap();
    let first = sign_in_federated(&mut tx, "https://op.example", "sub-1", &names, "admin")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let Federated::Account { id, username } = first else {
        panic!("{first:?}")
    };
    assert_eq!(username, "alice-2");
    // The same subject again, now mapped to auditor: same account, new role, audited.
    let mut tx = app.state.db.begin().await.unwrap();
    let again = sign_in_federated(&mut tx, "https://op.example", "sub-1", &names, "auditor")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(again, Federated::Account { id: i, .. } if i == id));
    let role = app.admin("GET", "/api/v1/users/alice-2", None).await;
    assert_eq!(role.body["role"], "auditor");
    assert_eq!(role.body["sign_in"], "oidc");
    let (actor, details, _) = last_change(&app, "admin_user:alice-2").await;
    assert_eq!(actor, "sso:https://op.example");
    assert_eq!(details["before"]["role"], "admin");
    let local = app.admin("GET", "/api/v1/users/alice", None).await;
    assert_eq!(local.body["role"], "viewer");
    // Another issuer with the same subject is another person.
    let mut tx = app.state.db.begin().await.unwrap();
    let other =
        sign_in_federated(&mut tx, "https://other.example", "sub-1", &names, "viewer").await;
    tx.rollback().await.unwrap();
    assert!(
        other.is_err(),
        "both names taken and no fallback given: {other:?}"
    );

    // Signed in, then taken out of every mapped group: the next attempt ends its sessions.
    sqlx::query(
        "INSERT INTO admin_sessions (token_sha256, user_id, csrf_token, expires_at)
         VALUES ('x', $1, 'c', now() + interval '1 hour')",
    )
    .bind(id)
    .execute(&app.state.db)
    .await
    .unwrap();
    let mut tx = app.state.db.begin().await.unwrap();
    let ended = end_federated_sessions(&mut tx, "https://op.example", "sub-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ended, 1);
    // A disabled federated account is reported as such, and not re-roled.
    app.admin("POST", "/api/v1/users/alice-2/disable", None)
        .await;
    let mut tx = app.state.db.begin().await.unwrap();
    let disabled = sign_in_federated(&mut tx, "https://op.example", "sub-1", &names, "admin")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        matches!(disabled, Federated::Disabled { .. }),
        "{disabled:?}"
    );
    let role = app.admin("GET", "/api/v1/users/alice-2", None).await;
    assert_eq!(role.body["role"], "auditor");
}
