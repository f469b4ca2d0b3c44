//! Token exchange (RFC 8693) slots, with real parts: panva's oidc-provider as the security token
//! service (tests/oidc-provider/op.mjs `--exchange-trust`, which checks toolgate's subject
//! tokens against the gateway's published keys), the echo upstream (official MCP SDK) as its
//! resource server, two gateway instances over one database.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path, until};
use crate::upstream::{put_upstream, text, wait_for_tools};
use crate::upstream_credentials::{Echo, LISTER};
use crate::upstream_oauth_support::AuthServer;
use crate::web::Browser;

/// toolgate's client at the token service (a public client there).
const CLIENT: &str = "toolgate-sts";
/// Lifetime of the tokens the service issues: short, so that renewal is seen.
const TTL: u64 = 20;
/// The test gateway's issuer (its subject tokens say so); its keys are served on a port.
const ISSUER: &str = "http://127.0.0.1:8787";

fn slot(auth: &AuthServer, per: &str) -> Value {
    json!({"per": per, "inject": "header Authorization \"Bearer {}\"",
           "exchange": {"token_endpoint": format!("{}/token", auth.issuer), "client_id": CLIENT,
                        "scopes": ["openid"]}})
}

/// `credential.exchanged` rows whose slot owner is `owner`, oldest first (their times).
async fn exchanges(pool: &PgPool, owner: &str) -> Vec<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar(
        "SELECT at FROM audit_events WHERE details::jsonb->>'action' = 'credential.exchanged'
           AND details::jsonb->'after'->>'owner' = $1 ORDER BY at, id",
    )
    .bind(owner)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn whoami(app: &TestApp, token: &str, group: &str) -> Result<String, String> {
    let r = app
        .call(token, &format!("{group}__whoami"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    if r.body["result"]["isError"] == true {
        Err(text(&r.body))
    } else {
        Ok(text(&r.body))
    }
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn each_caller_is_exchanged_for_its_own_upstream_token_cached_and_renewed_before_expiry(
    pool: PgPool,
) {
    // The gateway's keys, where the token service fetches them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    let auth = AuthServer::start_with(
        "http://127.0.0.1/unused",
        CLIENT,
        TTL,
        &["--exchange-trust", ISSUER, "--exchange-jwks", &jwks],
    )
    .await;
    let echo = Echo::start_with(&[("USERINFO_URL", &format!("{}/me", auth.issuer))]).await;
    let docs = crate::authcode::document_server().await;
    let args = ["--oauth-cimd-allow-private"];
    let one = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &args,
    )
    .await;
    let two = TestApp::with(pool.clone(), &repo_path("tools"), None, &args).await;
    let served = one.router.clone();
    tokio::spawn(async move { axum::serve(listener, served).await });
    for app in [&one, &two] {
        toolgate::state::spawn_policy_listener(app.state.clone());
    }
    let r = one
        .admin("PUT", "/api/v1/agents/assistant/users/alice", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let url = format!("http://127.0.0.1:{}/mcp", echo.port);
    for (group, per) in [("xagent", "agent"), ("xperson", "person")] {
        put_upstream(
            &one,
            group,
            json!({"transport": "http", "url": url,
                   "headers": {"Authorization": format!("Bearer {LISTER}")},
                   "credentials": {"ID": slot(&auth, per)}, "pin": false}),
        )
        .await;
    }
    for (agent, target) in [
        ("assistant", "xagent"),
        ("assistant", "xperson"),
        ("meteo", "xagent"),
    ] {
        let r = one
            .admin(
                "POST",
                &format!("/api/v1/agents/{agent}/grants"),
                Some(json!({"target": target})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let assistant = one.token_for("assistant").await;
    let meteo = one.token_for("meteo").await;
    for app in [&one, &two] {
        wait_for_tools(app, &assistant, "xagent").await;
        wait_for_tools(app, &assistant, "xperson").await;
        wait_for_tools(app, &meteo, "xagent").await;
    }

    // Each agent reaches the upstream as itself, on either instance, over MCP and REST.
    assert_eq!(
        whoami(&one, &assistant, "xagent").await.unwrap(),
        "person:sts|agent=assistant"
    );
    assert_eq!(
        whoami(&two, &meteo, "xagent").await.unwrap(),
        "person:sts|agent=meteo"
    );
    let r = two
        .post_json("/tools/xagent/whoami", Some(&assistant), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["content"][0]["text"], "person:sts|agent=assistant");

    // A person's slot: the agent acting for alice is exchanged as both; the agent alone has
    // no person to exchange, and is told so.
    let mut alice = Browser::signed_in(&one, "alice", "viewer").await;
    let for_alice = crate::authcode::host_token(&one, docs, &mut alice, "assistant").await;
    assert_eq!(
        whoami(&one, &for_alice, "xperson").await.unwrap(),
        "person:sts|agent=assistant|person=alice"
    );
    let alone = whoami(&one, &assistant, "xperson").await.unwrap_err();
    assert!(alone.contains("for no person"), "{alone}");

    // Cached: more calls of the same principal on the same instance exchange nothing more.
    for _ in 0..3 {
        whoami(&one, &assistant, "xagent").await.unwrap();
    }
    assert_eq!(
        exchanges(&pool, "assistant").await.len(),
        2,
        "one per instance"
    );
    assert_eq!(exchanges(&pool, "alice").await.len(), 1);
    let row: Value = sqlx::query_scalar(
        "SELECT details::jsonb FROM audit_events
          WHERE details::jsonb->>'action' = 'credential.exchanged'
            AND details::jsonb->'after'->>'owner' = 'alice'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row["after"]["agent"], "assistant", "{row}");
    assert_eq!(row["after"]["person"], "alice", "{row}");
    assert_eq!(row["after"]["expires_in"], TTL, "{row}");

    // Renewed before expiry: calls go on succeeding, and the next exchange comes before the
    // first token ran out.
    let first = exchanges(&pool, "meteo").await[0];
    let began = Instant::now();
    until(
        Duration::from_secs(3 * TTL),
        "meteo's token is exchanged again",
        || async {
            // Paced under the agent's rate limit: a call a second.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                whoami(&two, &meteo, "xagent").await.unwrap(),
                "person:sts|agent=meteo"
            );
            exchanges(&pool, "meteo").await.len() >= 2
        },
    )
    .await;
    let second = exchanges(&pool, "meteo").await[1];
    assert!(
        (second - first).num_seconds() < TTL as i64,
        "renewed {}s after the first, past its {TTL}s life",
        (second - first).num_seconds()
    );
    assert!(began.elapsed() < Duration::from_secs(3 * TTL));

    // An upstream that repeats the token it got hands back no token.
    let r = one.call(&assistant, "xagent__leak", json!({})).await;
    let said = text(&r.body);
    let leaked = said.strip_prefix("my token is ").is_some_and(|t| {
        t.len() >= 20
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    assert!(!leaked, "{}", r.text);

    // The slot takes no typed value.
    let r = one
        .admin(
            "PUT",
            "/api/v1/agents/assistant/credentials/xagent/ID",
            Some(json!({"value": "typed"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("token service"), "{}", r.text);

    // The token service gone: a caller with no token cached gets a clear error naming the
    // slot, on record as a denied call; nothing is cached from the failure.
    drop(auth);
    let down = whoami(&one, &meteo, "xagent").await.unwrap_err();
    assert!(
        down.contains("slot `ID`") && down.contains("unreachable"),
        "{down}"
    );
    assert_eq!(exchanges(&pool, "meteo").await.len(), 2);
}

/// What a stranger can do with the exchange: forge a subject token, or replay toolgate's own
/// subject token at toolgate.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn subject_tokens_cannot_be_forged_at_the_service_nor_replayed_at_the_gateway(pool: PgPool) {
    use toolgate::credentials::exchange::SubjectClaims;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    let auth = AuthServer::start_with(
        "http://127.0.0.1/unused",
        CLIENT,
        TTL,
        &["--exchange-trust", ISSUER, "--exchange-jwks", &jwks],
    )
    .await;
    let app = TestApp::new(pool.clone()).await;
    let served = app.router.clone();
    tokio::spawn(async move { axum::serve(listener, served).await });
    let key = toolgate::db::keys::current_signing_key(&pool)
        .await
        .unwrap()
        .unwrap();
    let audience = format!("{}/token", auth.issuer);
    let exchange = |subject: String| {
        let endpoint = audience.clone();
        async move {
            let r = reqwest::Client::new()
                .post(endpoint)
                .form(&[
                    ("grant_type", toolgate::credentials::exchange::GRANT_TYPE),
                    ("client_id", CLIENT),
                    ("subject_token", &subject),
                    (
                        "subject_token_type",
                        toolgate::credentials::exchange::JWT_TOKEN_TYPE,
                    ),
                ])
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };

    // The gateway's own subject token is accepted: the service is really checking.
    let good = SubjectClaims::new(ISSUER, &audience, "assistant", "c", None)
        .sign(&key.kid, &key.private_pkcs8)
        .unwrap();
    let (status, body) = exchange(good.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Signed by another key (same kid), for another audience, or expired: refused.
    let other =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let forged = SubjectClaims::new(ISSUER, &audience, "assistant", "c", Some("alice"))
        .sign(&key.kid, other.as_ref())
        .unwrap();
    let elsewhere = SubjectClaims::new(
        ISSUER,
        "https://other.example/token",
        "assistant",
        "c",
        None,
    )
    .sign(&key.kid, &key.private_pkcs8)
    .unwrap();
    let mut old = SubjectClaims::new(ISSUER, &audience, "assistant", "c", None);
    old.iat -= 600;
    old.exp -= 600;
    let old = old.sign(&key.kid, &key.private_pkcs8).unwrap();
    for (what, token) in [
        ("forged", forged),
        ("other audience", elsewhere),
        ("expired", old),
    ] {
        let (status, body) = exchange(token).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert_eq!(body["error"], "invalid_grant", "{what}: {body}");
    }

    // A subject token is no key to the gateway itself.
    let r = app.mcp(Some(&good), "tools/list", json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
}

/// A hostile token service: whatever it answers fails the exchange with a bounded, printable
/// reason, and never puts its words into a header.
#[tokio::test]
async fn a_hostile_token_service_gets_no_token_through() {
    use axum::routing::post;
    use toolgate::credentials::exchange::{SlotExchange, exchange};
    let huge = "x".repeat(1 << 20);
    let app = axum::Router::new()
        .route(
            "/crlf",
            post(|| async {
                axum::Json(json!({"access_token": "abc\r\nX-Evil: 1", "token_type": "Bearer"}))
            }),
        )
        .route(
            "/dpop",
            post(|| async { axum::Json(json!({"access_token": "abc", "token_type": "DPoP"})) }),
        )
        .route(
            "/refresh",
            post(|| async {
                axum::Json(json!({"access_token": "abc", "token_type": "Bearer",
                    "issued_token_type": "urn:ietf:params:oauth:token-type:refresh_token"}))
            }),
        )
        .route(
            "/huge",
            post(move || {
                let huge = huge.clone();
                async move { axum::Json(json!({"access_token": huge, "token_type": "Bearer"})) }
            }),
        )
        .route(
            "/refused",
            post(|| async {
                (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": "invalid_grant",
                        "error_description": format!("<script>x</script>\u{1b}[31m\n{}", "y".repeat(5000))})),
                )
            }),
        )
        .route(
            "/moved",
            post(|| async {
                (
                    StatusCode::FOUND,
                    [(http::header::LOCATION, "http://127.0.0.1:1/elsewhere")],
                )
            }),
        )
        .route(
            "/silent",
            post(|| async {
                std::future::pending::<()>().await;
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let spec = |path: &str| SlotExchange {
        token_endpoint: format!("{base}{path}"),
        client_id: "c".into(),
        client_secret_env: None,
        audience: None,
        scopes: vec![],
        subject_audience: None,
    };
    for (path, says) in [
        ("/crlf", "printable"),
        ("/dpop", "bearer token is needed"),
        ("/refresh", "not an access token"),
        ("/huge", "more than"),
        ("/refused", "invalid_grant"),
        ("/moved", "302"),
        ("/silent", "unreachable"),
    ] {
        let began = Instant::now();
        let e = match exchange(&spec(path), "subject").await {
            Ok(_) => panic!("{path}: a token came through"),
            Err(e) => e,
        };
        assert!(e.contains(says), "{path}: {e}");
        assert!(
            e.len() <= 400 && !e.chars().any(char::is_control),
            "{path}: {e:?}"
        );
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "{path} took {:?}",
            began.elapsed()
        );
    }
}
