//! State shared by every instance on one database: single-use client assertions and admin
//! sign-in throttling. Each test runs two gateways (two `App`s) over the same Postgres.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, StatusCode, header};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, repo_path};

const PASSWORD: &str = "correct horse battery staple";

/// Two gateways on one database: A loads the example policies, B starts on what A wrote.
async fn two_instances(pool: &PgPool) -> (TestApp, TestApp) {
    let a = TestApp::new(pool.clone()).await;
    let b = TestApp::with(pool.clone(), &repo_path("tools"), None, &[]).await;
    (a, b)
}

/// A `private_key_jwt` client of `meteo`, registered through instance `app`.
struct KeyClient {
    id: String,
    key: toolgate::auth::keys::GeneratedKey,
}

impl KeyClient {
    async fn register(app: &TestApp) -> Self {
        let key = toolgate::auth::keys::generate().unwrap();
        let jwks = json!({"keys": [toolgate::auth::keys::jwk(&key.kid, &key.public_key)]});
        let r = app
            .admin(
                "POST",
                "/api/v1/agents/meteo/clients",
                Some(json!({"jwks": jwks})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        Self {
            id: r.body["client_id"].as_str().unwrap().to_owned(),
            key,
        }
    }

    fn assertion(&self, jti: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        h.kid = Some(self.key.kid.clone());
        let claims = json!({"iss": self.id, "sub": self.id, "aud": "http://127.0.0.1:8787/oauth/token",
            "iat": now, "exp": now + 60, "jti": jti});
        jsonwebtoken::encode(
            &h,
            &claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&self.key.private_pkcs8),
        )
        .unwrap()
    }
}

async fn present(app: &TestApp, assertion: &str) -> Reply {
    app.token_request(
        &[
            ("grant_type", "client_credentials"),
            (
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            ),
            ("client_assertion", assertion),
        ],
        None,
    )
    .await
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_assertion_used_on_one_instance_is_refused_on_another_and_the_refusal_is_audited(
    pool: PgPool,
) {
    let (a, b) = two_instances(&pool).await;
    let client = KeyClient::register(&a).await;
    let assertion = client.assertion("once-only");

    let first = present(&a, &assertion).await;
    let replayed = present(&b, &assertion).await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert_eq!(
        replayed.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        replayed.text
    );
    assert_eq!(replayed.body["error"], "invalid_client");
    // The refusal is recorded without waiting; the flush makes it durable.
    b.state.audit.flush().await.unwrap();
    let refusals: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT outcome, client_id, error FROM audit_events
         WHERE event_type = 'client_auth.failed' AND instance = $1",
    )
    .bind(b.state.audit.instance())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    let (outcome, client_id, error) = &refusals[0];
    assert_eq!(outcome, "denied");
    assert_eq!(client_id.as_deref(), Some(client.id.as_str()));
    assert!(
        error.as_deref().unwrap_or("").contains("already used"),
        "{error:?}"
    );
    // A fresh assertion from the same client is still good on either instance.
    let fresh = present(&b, &client.assertion("another")).await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn one_assertion_raced_on_two_instances_is_accepted_exactly_once(pool: PgPool) {
    let (a, b) = two_instances(&pool).await;
    for round in 0..5 {
        // A client per round: the refused replays count as its failed authentications.
        let client = KeyClient::register(&a).await;
        let assertion = client.assertion(&format!("race-{round}"));
        let tries = (0..8).map(|i| {
            let app = if i % 2 == 0 { &a } else { &b };
            let assertion = assertion.clone();
            async move { present(app, &assertion).await.status }
        });
        let statuses = futures::future::join_all(tries).await;
        let accepted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!(accepted, 1, "round {round}: {statuses:?}");
        assert!(
            statuses
                .iter()
                .all(|s| [StatusCode::OK, StatusCode::UNAUTHORIZED].contains(s)),
            "{statuses:?}"
        );
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn no_token_is_issued_when_the_assertion_id_cannot_be_recorded(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let client = KeyClient::register(&app).await;
    // The client lookup still works; only the single-use record fails.
    sqlx::query("ALTER TABLE used_client_assertions RENAME TO used_client_assertions_gone")
        .execute(&pool)
        .await
        .unwrap();

    let r = present(&app, &client.assertion("unrecordable")).await;

    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.body["error"], "temporarily_unavailable");
    assert!(r.body.get("access_token").is_none());
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_oversized_jti_is_refused_before_it_reaches_the_database(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let client = KeyClient::register(&app).await;

    let long = present(&app, &client.assertion(&"j".repeat(257))).await;
    let nul = present(&app, &client.assertion("a\0b")).await;
    let longest = present(&app, &client.assertion(&"k".repeat(256))).await;

    assert_eq!(long.status, StatusCode::UNAUTHORIZED, "{}", long.text);
    assert_eq!(nul.status, StatusCode::UNAUTHORIZED, "{}", nul.text);
    assert_eq!(longest.status, StatusCode::OK, "{}", longest.text);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM used_client_assertions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);
}

/// A sign-in attempt from `ip` with a form token of our own (the form's double-submit cookie).
async fn sign_in(app: &TestApp, ip: &str, username: &str, password: &str) -> Reply {
    let csrf = "c".repeat(43);
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("csrf", csrf.as_str()),
            ("username", username),
            ("password", password),
            ("next", "/admin"),
        ])
        .finish();
    let mut req = Request::post("/admin/login")
        .header(header::COOKIE, format!("toolgate_login={csrf}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .unwrap();
    let addr = SocketAddr::new(ip.parse().unwrap(), 40000);
    req.extensions_mut().insert(ConnectInfo(addr));
    app.send(req).await
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn sign_in_failures_on_one_instance_count_on_the_other(pool: PgPool) {
    let (a, b) = two_instances(&pool).await;
    toolgate::service::accounts::create(&a.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();

    // Per username: five tries, spread over two instances and five addresses.
    for i in 0..5 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = sign_in(app, &format!("192.0.2.{i}"), "ada", "guess").await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "try {i}: {}", r.text);
    }
    let sixth = sign_in(&b, "192.0.2.99", "Ada", PASSWORD).await;
    assert_eq!(
        sixth.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        sixth.text
    );
    let retry: u64 = sixth.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&retry), "Retry-After: {retry}");

    // Per address: ten tries over many names, then the address waits on either instance.
    for i in 0..10 {
        let app = if i % 2 == 0 { &b } else { &a };
        let r = sign_in(app, "198.51.100.7", &format!("nobody{i}"), "guess").await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "try {i}: {}", r.text);
    }
    let next = sign_in(&a, "198.51.100.7", "somebody", "guess").await;
    assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS, "{}", next.text);
    // Another address and another name are not held back by either.
    toolgate::service::accounts::create(&a.state.db, "test", "grace", PASSWORD, "admin")
        .await
        .unwrap();
    let other = sign_in(&b, "203.0.113.5", "grace", PASSWORD).await;
    assert_eq!(other.status, StatusCode::SEE_OTHER, "{}", other.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn concurrent_guesses_on_two_instances_get_no_more_than_the_budget(pool: PgPool) {
    let (a, b) = two_instances(&pool).await;
    toolgate::service::accounts::create(&a.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();

    let guesses = (0..24).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        async move {
            sign_in(
                app,
                &format!("10.9.{}.{}", i / 200, i % 200),
                "ada",
                "guess",
            )
            .await
            .status
        }
    });
    let statuses = futures::future::join_all(guesses).await;

    let checked = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert_eq!(checked, 5, "{statuses:?}");
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        19,
        "{statuses:?}"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_spray_of_usernames_from_one_address_adds_no_more_rows_than_its_budget(pool: PgPool) {
    let (a, b) = two_instances(&pool).await;
    let started = std::time::Instant::now();

    for i in 0..60 {
        let app = if i % 2 == 0 { &a } else { &b };
        let long_name = format!("{i}-{}", "x".repeat(10_000));
        let r = sign_in(app, "2001:db8:1:2::1", &long_name, "guess").await;
        assert!(
            [StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS].contains(&r.status),
            "{}",
            r.status
        );
    }
    // Other addresses of the same /64 are the same source.
    let same_64 = sign_in(&a, "2001:db8:1:2::ffff", "someone", "guess").await;
    assert_eq!(same_64.status, StatusCode::TOO_MANY_REQUESTS);

    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM admin_signin_throttle")
        .fetch_all(&pool)
        .await
        .unwrap();
    let users = keys.iter().filter(|k| k.starts_with("user:")).count();
    // Ten at once from one source, then one per 6 s: however slow this machine ran the spray.
    let budget = 10 + (started.elapsed().as_secs() / 6) as usize;
    assert!((10..=budget).contains(&users), "{users} rows: {keys:?}");
    assert!(keys.iter().all(|k| k.chars().count() <= 80), "{keys:?}");
    assert!(keys.contains(&"ip:2001:db8:1:2::".to_owned()), "{keys:?}");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn cleanup_removes_expired_assertion_ids_and_idle_throttles_only(pool: PgPool) {
    let (a, _b) = two_instances(&pool).await;
    let client = KeyClient::register(&a).await;
    assert_eq!(
        present(&a, &client.assertion("live")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        present(&a, &client.assertion("dead")).await.status,
        StatusCode::OK
    );
    sign_in(&a, "192.0.2.1", "idle", "guess").await;
    sign_in(&a, "192.0.2.2", "busy", "guess").await;
    // Age one of each as if their time had passed.
    sqlx::query(
        "UPDATE used_client_assertions SET expires_at = now() - interval '1 second'
         WHERE jti = 'dead'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE admin_signin_throttle SET tat = now() - interval '1 second'
         WHERE key IN ('user:idle', 'ip:192.0.2.1')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let (assertions, throttles) = toolgate::app::prune_shared_state(&pool).await.unwrap();

    assert_eq!((assertions, throttles), (1, 2));
    let jtis: Vec<String> = sqlx::query_scalar("SELECT jti FROM used_client_assertions")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(jtis, ["live"]);
    let mut keys: Vec<String> = sqlx::query_scalar("SELECT key FROM admin_signin_throttle")
        .fetch_all(&pool)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(keys, ["ip:192.0.2.2", "user:busy"]);
    // The live id is still single use after the cleanup.
    assert_eq!(
        present(&a, &client.assertion("live")).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn sign_in_is_refused_when_attempts_cannot_be_counted(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    toolgate::service::accounts::create(&app.state.db, "test", "ada", PASSWORD, "admin")
        .await
        .unwrap();
    sqlx::query("ALTER TABLE admin_signin_throttle RENAME TO admin_signin_throttle_gone")
        .execute(&pool)
        .await
        .unwrap();

    let r = sign_in(&app, "192.0.2.1", "ada", PASSWORD).await;

    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert!(
        r.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .all(|c| !c.to_str().unwrap().starts_with("toolgate_session=")),
        "a session was opened"
    );
}
