//! OAuth: the token endpoint, and every token attack refused with 401.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::TestApp;

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn parts(token: &str) -> (Value, Value, String) {
    let mut it = token.split('.');
    let h = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap()).unwrap();
    let p = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap()).unwrap();
    (h, p, it.next().unwrap().to_owned())
}

/// Re-signs claims with the gateway's own key, for attacks that need a valid signature.
async fn forge(pool: &PgPool, header_kid: Option<&str>, claims: &Value) -> String {
    let key = toolgate::db::keys::current_signing_key(pool)
        .await
        .unwrap()
        .unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.typ = Some("at+jwt".into());
    header.kid = Some(header_kid.unwrap_or(&key.kid).to_owned());
    jsonwebtoken::encode(
        &header,
        claims,
        &jsonwebtoken::EncodingKey::from_ed_der(&key.private_pkcs8),
    )
    .unwrap()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_token_carries_the_contract_claims(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let (header, claims, _) = parts(&token);

    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(claims["sub"], "assistant");
    assert_eq!(claims["iss"], "http://127.0.0.1:8787");
    assert_eq!(claims["aud"], "http://127.0.0.1:8787/mcp");
    assert_eq!(claims["tool_prefixes"], json!(["search__"]));
    assert_eq!(claims["scope"], "tools");
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(lifetime, 900);
    assert!(
        claims["jti"].as_str().is_some()
            && claims["client_id"].as_str().unwrap().starts_with("tgc_")
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn every_client_authentication_method_works(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;

    let basic = app
        .token_request(
            &[("grant_type", "client_credentials")],
            Some((&id, &secret)),
        )
        .await;
    let post = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("client_id", &id),
                ("client_secret", &secret),
            ],
            None,
        )
        .await;
    let wrong = app
        .token_request(
            &[("grant_type", "client_credentials")],
            Some((&id, "tgs_wrong")),
        )
        .await;
    let unknown = app
        .token_request(
            &[("grant_type", "client_credentials")],
            Some(("tgc_nobody", &secret)),
        )
        .await;

    assert_eq!(basic.status, StatusCode::OK, "{}", basic.text);
    assert_eq!(basic.headers["cache-control"], "no-store");
    assert_eq!(post.status, StatusCode::OK, "{}", post.text);
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.body["error"], "invalid_client");
    assert_eq!(unknown.body, wrong.body);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn private_key_jwt_clients_authenticate_with_a_signed_assertion(pool: PgPool) {
    let app = TestApp::new(pool).await;
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
    assert!(r.body.get("client_secret").is_none());
    let client_id = r.body["client_id"].as_str().unwrap().to_owned();
    let now = chrono::Utc::now().timestamp();
    let assertion = |jti: &str| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        h.kid = Some(key.kid.clone());
        let claims = json!({"iss": client_id, "sub": client_id, "aud": "http://127.0.0.1:8787/oauth/token", "iat": now, "exp": now + 60, "jti": jti});
        jsonwebtoken::encode(
            &h,
            &claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&key.private_pkcs8),
        )
        .unwrap()
    };
    let form = |a: &str| {
        vec![
            ("grant_type".to_owned(), "client_credentials".to_owned()),
            (
                "client_assertion_type".to_owned(),
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".to_owned(),
            ),
            ("client_assertion".to_owned(), a.to_owned()),
        ]
    };
    let first = assertion("one");
    let ok_form = form(&first);
    let pairs: Vec<(&str, &str)> = ok_form
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();

    let ok = app.token_request(&pairs, None).await;
    let replayed = app.token_request(&pairs, None).await;

    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    assert_eq!(
        replayed.status,
        StatusCode::UNAUTHORIZED,
        "a replayed assertion was accepted"
    );
    let token = ok.body["access_token"].as_str().unwrap();
    assert_eq!(
        app.tool_names(token).await,
        ["weather__current", "weather__forecast"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn resource_and_scope_are_checked(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;
    let basic = Some((id.as_str(), secret.as_str()));

    let wrong_resource = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("resource", "https://other.example/mcp"),
            ],
            basic,
        )
        .await;
    let unknown_scope = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("scope", "tools:weather"),
            ],
            basic,
        )
        .await;
    let bad_grant = app
        .token_request(&[("grant_type", "password")], basic)
        .await;
    let narrowed = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("scope", "tools:search__query"),
                ("resource", "http://127.0.0.1:8787/mcp"),
            ],
            basic,
        )
        .await;

    assert_eq!(wrong_resource.body["error"], "invalid_target");
    assert_eq!(unknown_scope.body["error"], "invalid_scope");
    assert_eq!(bad_grant.body["error"], "unsupported_grant_type");
    assert_eq!(narrowed.status, StatusCode::OK, "{}", narrowed.text);
    let token = narrowed.body["access_token"].as_str().unwrap();
    assert_eq!(app.tool_names(token).await, ["search__query"]);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn token_attacks_are_refused_with_401(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let good = app.token_with(&id, &secret).await;
    let (header, claims, sig) = parts(&good);
    let now = chrono::Utc::now().timestamp();
    let public = toolgate::db::keys::published_keys(&pool).await.unwrap()[0]
        .public_key
        .clone();

    let mut attacks: Vec<(&str, String)> = Vec::new();
    attacks.push((
        "alg none",
        format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "at+jwt"})),
            b64(&claims)
        ),
    ));
    let hs = {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.typ = Some("at+jwt".into());
        h.kid = header["kid"].as_str().map(str::to_owned);
        jsonwebtoken::encode(
            &h,
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&public),
        )
        .unwrap()
    };
    attacks.push(("HS256 with the public key", hs));
    let mut c = claims.clone();
    c["aud"] = json!("https://other.example/mcp");
    attacks.push(("wrong aud", forge(&pool, None, &c).await));
    let mut c = claims.clone();
    c["iss"] = json!("https://evil.example");
    attacks.push(("wrong iss", forge(&pool, None, &c).await));
    let mut c = claims.clone();
    c["exp"] = json!(now - 120);
    c["iat"] = json!(now - 1000);
    attacks.push(("expired", forge(&pool, None, &c).await));
    let mut c = claims.clone();
    c["tool_prefixes"] = json!(["weather__"]);
    attacks.push((
        "tampered payload",
        format!("{}.{}.{}", b64(&header), b64(&c), sig),
    ));
    attacks.push((
        "unknown kid",
        forge(&pool, Some("not-a-key"), &claims).await,
    ));
    attacks.push(("garbage", "not.a.jwt".to_owned()));

    for (name, token) in &attacks {
        let r = app.get("/openapi.json", Some(token)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{name} was accepted");
        let challenge = r.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("resource_metadata=\"http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp\""), "{challenge}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{name}: {challenge}"
        );
        let said = if *name == "expired" { "expired" } else { "" };
        assert!(
            challenge.contains(&format!("error_description=\"{said}")),
            "{name}: {challenge}"
        );
        assert_eq!(r.body["error"], "invalid_token", "{name}");
    }
    let none = app.mcp(None, "tools/list", json!({})).await;
    assert_eq!(
        none.status,
        StatusCode::UNAUTHORIZED,
        "no token was accepted"
    );
    // No token is not an invalid one (RFC 6750 §3.1): the challenge only says where to get one.
    let challenge = none.headers["www-authenticate"].to_str().unwrap();
    assert!(!challenge.contains("error="), "{challenge}");
    assert!(challenge.contains("scope=\"tools\""), "{challenge}");

    // The good token still works, until revoked.
    assert_eq!(
        app.get("/openapi.json", Some(&good)).await.status,
        StatusCode::OK
    );
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("token", good.as_str())])
        .finish();
    use base64::engine::general_purpose::STANDARD;
    let revoke = app
        .send(
            http::Request::post("/oauth/revoke")
                .header("content-type", "application/x-www-form-urlencoded")
                .header(
                    "authorization",
                    format!("Basic {}", STANDARD.encode(format!("{id}:{secret}"))),
                )
                .body(axum::body::Body::from(body))
                .unwrap(),
        )
        .await;
    assert_eq!(revoke.status, StatusCode::OK, "{}", revoke.text);
    assert_eq!(
        app.get("/openapi.json", Some(&good)).await.status,
        StatusCode::UNAUTHORIZED,
        "a revoked jti was accepted"
    );

    // A token of a deleted client dies with the client.
    let other = app.token_with(&id, &secret).await;
    // Used once first, so that its signature check is remembered: the deletion still binds.
    assert_eq!(
        app.get("/openapi.json", Some(&other)).await.status,
        StatusCode::OK
    );
    let deleted = app
        .admin("DELETE", &format!("/api/v1/clients/{id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get("/openapi.json", Some(&other)).await.status,
        StatusCode::UNAUTHORIZED,
        "a deleted client's token was accepted"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_grant_added_reaches_a_token_that_follows_the_grants_and_never_a_narrowed_one(
    pool: PgPool,
) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;
    let live = app.token_with(&id, &secret).await;
    let narrowed = app
        .token_request(
            &[
                ("grant_type", "client_credentials"),
                ("scope", "tools:search"),
            ],
            Some((&id, &secret)),
        )
        .await;
    assert_eq!(narrowed.status, StatusCode::OK, "{}", narrowed.text);
    assert_eq!(narrowed.body["scope"], "tools:search");
    let narrowed = narrowed.body["access_token"].as_str().unwrap().to_owned();

    // Added in the admin UI, as an admin would: the existing token sees it on its next request.
    let mut b = crate::web::Browser::signed_in(&app, "ada", "admin").await;
    let added = b
        .submit(
            "/admin/grants/new",
            "/admin/grants",
            &[
                ("agent", "assistant"),
                ("target", "weather"),
                ("action", "save"),
            ],
        )
        .await;
    assert!(
        added.status.is_redirection() || added.status.is_success(),
        "{}",
        added.text
    );
    let page = b.get("/admin/agents/assistant").await;
    assert!(
        page.text.contains("data-grant-reach") && page.text.contains("next request"),
        "the agent page does not say which tokens see a grant"
    );
    let all = [
        "search__get",
        "search__query",
        "weather__current",
        "weather__forecast",
    ];
    assert_eq!(
        app.tool_names(&live).await,
        all,
        "a token issued before the grant did not see it"
    );
    let call = app
        .call(&live, "weather__current", json!({"city": "Paris"}))
        .await;
    assert!(call.body["error"].is_null(), "{}", call.text);
    assert_eq!(
        app.tool_names(&narrowed).await,
        ["search__get", "search__query"],
        "a token issued for tools:search widened"
    );
    let call = app
        .call(&narrowed, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(call.body["error"]["code"], -32602, "{}", call.text);

    let removed = app
        .admin("DELETE", "/api/v1/agents/assistant/grants/weather", None)
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.tool_names(&live).await,
        ["search__get", "search__query"],
        "a removed grant is still visible"
    );
    let call = app
        .call(&live, "weather__current", json!({"city": "Paris"}))
        .await;
    assert_eq!(call.body["error"]["code"], -32602);

    // The API says the same when a grant is added.
    let added = app
        .admin(
            "POST",
            "/api/v1/agents/assistant/grants",
            Some(json!({"target": "weather__current"})),
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text);
    assert!(
        added.body["reaches"]
            .as_str()
            .is_some_and(|r| r.contains("next request")),
        "{}",
        added.text
    );
    assert_eq!(
        app.tool_names(&live).await,
        ["search__get", "search__query", "weather__current"]
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn scopes_are_published_generic_and_openid_ones_are_ignored(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;
    for doc in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
    ] {
        let r = app.get(doc, None).await;
        assert_eq!(r.body["scopes_supported"], json!(["tools"]), "{doc}");
    }
    let asked = |scope: &'static str| {
        let (id, secret) = (id.clone(), secret.clone());
        let app = &app;
        async move {
            app.token_request(
                &[("grant_type", "client_credentials"), ("scope", scope)],
                Some((&id, &secret)),
            )
            .await
        }
    };
    let r = asked("openid email profile offline_access").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["scope"], "tools");
    let r = asked("openid tools:search").await;
    assert_eq!(r.body["scope"], "tools:search", "{}", r.text);
    let r = asked("tools").await;
    assert_eq!(r.body["scope"], "tools", "{}", r.text);
    let r = asked("tools:weather").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["error"], "invalid_scope");
    let r = asked("admin").await;
    assert_eq!(r.body["error"], "invalid_scope");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn metadata_documents_point_at_each_other(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let prm = app
        .get("/.well-known/oauth-protected-resource/mcp", None)
        .await;
    let asm = app
        .get("/.well-known/oauth-authorization-server", None)
        .await;
    let jwks = app.get("/.well-known/jwks.json", None).await;

    assert_eq!(prm.body["resource"], "http://127.0.0.1:8787/mcp");
    assert_eq!(prm.body["authorization_servers"][0], asm.body["issuer"]);
    assert_eq!(
        asm.body["token_endpoint"],
        "http://127.0.0.1:8787/oauth/token"
    );
    assert_eq!(jwks.body["keys"][0]["kty"], "OKP");
    assert_eq!(jwks.body["keys"][0]["crv"], "Ed25519");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn key_rotation_keeps_tokens_of_the_previous_key(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let before = app.token_for("assistant").await;

    toolgate::service::keys::rotate(&pool, "test")
        .await
        .unwrap();
    app.state.reload_policy().await.unwrap();
    let after = app.token_for("assistant").await;

    assert_ne!(parts(&before).0["kid"], parts(&after).0["kid"]);
    assert_eq!(
        app.get("/openapi.json", Some(&before)).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.get("/openapi.json", Some(&after)).await.status,
        StatusCode::OK
    );
    let jwks = app.get("/.well-known/jwks.json", None).await;
    assert_eq!(jwks.body["keys"].as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_token_not_yet_valid_or_issued_in_the_future_is_refused(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let good = app.token_for("assistant").await;
    let (_, claims, _) = parts(&good);
    let now = chrono::Utc::now().timestamp();

    let mut later = claims.clone();
    later["nbf"] = json!(now + 3600);
    later["exp"] = json!(now + 3600 + 900);
    let mut future_iat = claims.clone();
    future_iat["iat"] = json!(now + 3600);
    let mut within_leeway = claims.clone();
    within_leeway["nbf"] = json!(now + 3);
    within_leeway["iat"] = json!(now + 3);
    let mut past_leeway = claims.clone();
    past_leeway["iat"] = json!(now + 30);

    for (name, c) in [
        ("nbf in an hour", &later),
        ("iat in an hour", &future_iat),
        ("iat 30 s ahead, past the 5 s leeway", &past_leeway),
    ] {
        let token = forge(&pool, None, c).await;
        let r = app.get("/openapi.json", Some(&token)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{name} was accepted");
        assert_eq!(r.body["error"], "invalid_token", "{name}: {}", r.text);
        let mcp = app.mcp(Some(&token), "tools/list", json!({})).await;
        assert_eq!(
            mcp.status,
            StatusCode::UNAUTHORIZED,
            "{name} was accepted on /mcp"
        );
    }
    // Clocks a little apart still work: the leeway is documented as 5 s by default.
    let skewed = forge(&pool, None, &within_leeway).await;
    assert_eq!(
        app.get("/openapi.json", Some(&skewed)).await.status,
        StatusCode::OK
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_client_assertion_not_yet_valid_or_issued_in_the_future_is_refused(pool: PgPool) {
    let app = TestApp::new(pool).await;
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
    let client_id = r.body["client_id"].as_str().unwrap().to_owned();
    let now = chrono::Utc::now().timestamp();
    let sign = |extra: Value| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        h.kid = Some(key.kid.clone());
        let mut claims = json!({"iss": client_id, "sub": client_id, "aud": "http://127.0.0.1:8787/oauth/token", "iat": now, "exp": now + 300, "jti": uuid::Uuid::new_v4().to_string()});
        claims
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        jsonwebtoken::encode(
            &h,
            &claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&key.private_pkcs8),
        )
        .unwrap()
    };
    let app = &app;
    let request = |assertion: String| async move {
        app.token_request(
            &[
                ("grant_type", "client_credentials"),
                (
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                ),
                ("client_assertion", &assertion),
            ],
            None,
        )
        .await
    };

    let not_yet = request(sign(json!({"nbf": now + 240}))).await;
    let future_iat = request(sign(json!({"iat": now + 240}))).await;
    let fine = request(sign(json!({"nbf": now - 10}))).await;

    assert_eq!(not_yet.status, StatusCode::UNAUTHORIZED, "{}", not_yet.text);
    assert_eq!(not_yet.body["error"], "invalid_client");
    assert_eq!(
        future_iat.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        future_iat.text
    );
    assert_eq!(future_iat.body["error"], "invalid_client");
    assert_eq!(fine.status, StatusCode::OK, "{}", fine.text);
}

/// A token whose signature check is remembered is still refused once it expires, once its key
/// is no longer trusted, and once it is revoked: the memory skips only what cannot change.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_remembered_token_still_expires_and_dies_with_its_key(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let good = app.token_for("assistant").await;
    let (_, claims, _) = parts(&good);

    // Expired 2 s ago: inside the clock leeway (5 s by default) for a few seconds more.
    let leeway = app.state.settings.token_leeway_secs as i64;
    assert_eq!(leeway, 5, "the documented default leeway");
    let now = chrono::Utc::now().timestamp();
    let mut late = claims.clone();
    late["exp"] = json!(now - 2);
    late["jti"] = json!(uuid::Uuid::new_v4().to_string());
    let late = forge(&pool, None, &late).await;
    assert_eq!(
        app.get("/openapi.json", Some(&late)).await.status,
        StatusCode::OK
    );
    assert!(!app.state.verified_tokens.is_empty());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The clock is what is awaited here: the token must be seen past exp + leeway.
    while chrono::Utc::now().timestamp() <= now - 2 + leeway {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let refused = app.get("/openapi.json", Some(&late)).await;
    assert_eq!(
        refused.status,
        StatusCode::UNAUTHORIZED,
        "a remembered token was accepted after it expired"
    );
    let challenge = refused.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"invalid_token\", error_description=\"expired\""),
        "{challenge}"
    );

    // Two rotations: its key is no longer published, nor trusted.
    assert_eq!(
        app.get("/openapi.json", Some(&good)).await.status,
        StatusCode::OK
    );
    toolgate::service::keys::rotate(&pool, "test")
        .await
        .unwrap();
    toolgate::service::keys::rotate(&pool, "test")
        .await
        .unwrap();
    app.state.reload_policy().await.unwrap();
    assert_eq!(
        app.get("/openapi.json", Some(&good)).await.status,
        StatusCode::UNAUTHORIZED,
        "a remembered token outlived its signing key"
    );
}

/// What remembering a token's signature check saves per request: the full check against a
/// remembered one, in turns, same token, same snapshot. A measurement, not a timed test:
/// `cargo nextest run --run-ignored only -E 'test(token_check_cost)' --no-capture`.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on demand"]
async fn token_check_cost(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let token = app.token_for("assistant").await;
    let snapshot = app.state.policy.load();
    let expected = app.state.settings.expected_token();
    let cache = toolgate::auth::token::VerifiedTokens::default();
    let mut full = Vec::new();
    let mut remembered = Vec::new();
    for _ in 0..5000 {
        let t = std::time::Instant::now();
        toolgate::auth::token::verify(&token, &snapshot, &expected).unwrap();
        full.push(t.elapsed().as_secs_f64() * 1e6);
        let t = std::time::Instant::now();
        cache.verify(&token, &snapshot, &expected).unwrap();
        remembered.push(t.elapsed().as_secs_f64() * 1e6);
    }
    full.sort_by(f64::total_cmp);
    remembered.sort_by(f64::total_cmp);
    println!(
        "token check p50: full {:.1} µs, remembered {:.1} µs ({:.1}x less)",
        full[2500],
        remembered[2500],
        full[2500] / remembered[2500]
    );
}
