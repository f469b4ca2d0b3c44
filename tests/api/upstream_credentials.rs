//! Upstream MCP servers that need each caller's own credential, against a server built with the
//! official TypeScript SDK (`tests/fixtures/echo-upstream/server.mjs`) that requires a bearer
//! token (or, over stdio, a token in its environment) and answers with whose token it got.

use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, repo_path, until};
use crate::upstream::{everything_entry, free_port, put_upstream, text, wait_for_tools};

pub const LISTER: &str = "tok-lister-000000000001";
pub const TOKEN_A: &str = "tok-agent-a-7f3e9c21aa";
pub const TOKEN_B: &str = "tok-agent-b-51d0b8e4cc";

fn tokens() -> String {
    json!({LISTER: "lister", TOKEN_A: "agent-a", TOKEN_B: "agent-b"}).to_string()
}

/// The fixture, beside the official SDK the reference server brought (so its imports resolve).
fn echo_entry() -> PathBuf {
    let deps = everything_entry();
    let root = deps
        .ancestors()
        .find(|p| p.ends_with("test-deps"))
        .unwrap()
        .to_owned();
    let fixture = std::fs::read(repo_path("tests/fixtures/echo-upstream/server.mjs")).unwrap();
    let entry = root.join("echo-upstream.mjs");
    if std::fs::read(&entry).ok().as_deref() != Some(fixture.as_slice()) {
        // Written aside and renamed: parallel test processes never see half a file.
        let staging = root.join(format!("echo-upstream.{}.mjs", std::process::id()));
        std::fs::write(&staging, &fixture).unwrap();
        std::fs::rename(&staging, &entry).unwrap();
    }
    entry
}

pub struct Echo {
    child: std::process::Child,
    pub port: u16,
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Echo {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts it with `env` added to its environment, e.g. `USERINFO_URL` and `AS_ISSUER` to
    /// make it the resource server of an OAuth authorization server (see the fixture).
    pub async fn start_with(env: &[(&str, &str)]) -> Self {
        let entry = echo_entry();
        for _ in 0..5 {
            let port = free_port();
            let mut child = std::process::Command::new("node")
                .arg(&entry)
                .args(["http", &port.to_string()])
                .env("TOKENS", tokens())
                .envs(env.iter().copied())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            for _ in 0..300 {
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    return Self { child, port };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("the echo upstream did not start");
    }

    /// The upstream's own admin revokes `token`.
    async fn revoke(&self, token: &str) {
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/revoke", self.port))
            .header("content-type", "text/plain")
            .body(token.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
}

pub fn key() -> String {
    toolgate::credentials::KeyRing::generate("k1").unwrap()
}

async fn app_with(pool: PgPool, key: &str) -> TestApp {
    TestApp::with(pool, &repo_path("tools"), None, &["--credential-key", key]).await
}

async fn set(app: &TestApp, agent: &str, group: &str, value: &str) {
    let r = app
        .admin(
            "PUT",
            &format!("/api/v1/agents/{agent}/credentials/{group}/ECHO_TOKEN"),
            Some(json!({"value": value})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// What the upstream said a call carried, over MCP or REST.
async fn whoami(app: &TestApp, token: &str, rest: bool, note: &str) -> String {
    if rest {
        let r = app
            .post_json("/tools/echo/whoami", Some(token), json!({"note": note}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body["content"][0]["text"].as_str().unwrap().to_owned()
    } else {
        let r = app.call(token, "echo__whoami", json!({"note": note})).await;
        assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
        text(&r.body)
    }
}

async fn audit_text(pool: &PgPool) -> String {
    sqlx::query_scalar::<_, Option<String>>("SELECT string_agg(e::text, '\n') FROM audit_events e")
        .fetch_one(pool)
        .await
        .unwrap()
        .unwrap_or_default()
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn each_agent_reaches_an_http_upstream_as_itself_on_two_instances(pool: PgPool) {
    let echo = Echo::start().await;
    let key = key();
    let one = app_with(pool.clone(), &key).await;
    // The catalog is read with the upstream's own identity; each call carries its caller's.
    put_upstream(
        &one,
        "echo",
        json!({
            "transport": "http",
            "url": format!("http://127.0.0.1:{}/mcp", echo.port),
            "headers": {"Authorization": format!("Bearer {LISTER}")},
            "credentials": {"ECHO_TOKEN": {"per": "agent", "inject": "header Authorization \"Bearer {}\""}},
            "pin": false
        }),
    )
    .await;
    let a = one.agent("a", &["echo"]).await;
    let b = one.agent("b", &["echo"]).await;
    let c = one.agent("c", &["echo"]).await;
    set(&one, "a", "echo", TOKEN_A).await;
    set(&one, "b", "echo", TOKEN_B).await;
    wait_for_tools(&one, &a, "echo").await;
    // The upstream's own token is not shown back either.
    let listed = one.admin("GET", "/api/v1/upstreams", None).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert!(!listed.text.contains(LISTER), "{}", listed.text);
    assert!(listed.text.contains("[redacted]"), "{}", listed.text);

    // An agent that cannot fill the upstream's slot is flagged, with the request that fills it.
    let shown = one.admin("GET", "/api/v1/agents/c", None).await;
    let flags = shown.body["agent"]["credential_problems"].to_string();
    assert!(
        flags.contains("ECHO_TOKEN")
            && flags.contains("/api/v1/agents/c/credentials/echo/ECHO_TOKEN"),
        "{}",
        shown.text
    );

    // A second instance on the same database.
    let two = app_with(pool.clone(), &key).await;
    wait_for_tools(&two, &b, "echo").await;

    // Random interleavings of agents, instances and surfaces, many at once: every answer is
    // the caller's own identity, never the other's nor the lister's.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..6 {
        let mut calls = Vec::new();
        for i in 0..8 {
            let r = next();
            let (token, who) = if r & 1 == 0 {
                (&a, "agent-a")
            } else {
                (&b, "agent-b")
            };
            let app = if r & 2 == 0 { &one } else { &two };
            let rest = r & 4 == 0;
            let note = format!("r{round}c{i}");
            calls.push(async move {
                let said = whoami(app, token, rest, &note).await;
                assert_eq!(said, format!("{who} {note}"), "rest={rest}");
            });
        }
        futures::future::join_all(calls).await;
    }

    // No value: a clear tool error (MCP) or 409 (REST) naming the slot and how to fill it,
    // and no fallback to the upstream's own identity.
    let r = one.call(&c, "echo__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    let said = text(&r.body);
    assert!(
        said.contains("ECHO_TOKEN")
            && said.contains("PUT /api/v1/agents/c/credentials/echo/ECHO_TOKEN"),
        "{said}"
    );
    let r = two
        .post_json("/tools/echo/whoami", Some(&c), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("ECHO_TOKEN"), "{}", r.text);

    // A value that would smuggle a second header is not sent, and the error names the slot,
    // not the value.
    set(&one, "c", "echo", "tok-evil\r\nX-Injected: 1").await;
    let r = one.call(&c, "echo__whoami", json!({})).await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert!(
        text(&r.body).contains("`ECHO_TOKEN` cannot be sent"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("X-Injected"), "{}", r.text);

    // An upstream that repeats the credential it got hands back no credential.
    let r = one.call(&a, "echo__leak", json!({})).await;
    assert!(!r.text.contains(TOKEN_A), "{}", r.text);
    assert!(!r.text.contains(LISTER), "{}", r.text);

    // The upstream revokes a's token: a's calls say so (its tools stay listed, not silently
    // gone) and b, on the same upstream, is not failed by a's refusals.
    echo.revoke(TOKEN_A).await;
    for _ in 0..4 {
        let r = one.call(&a, "echo__whoami", json!({})).await;
        assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
        assert!(text(&r.body).contains("upstream `echo`"), "{}", r.text);
        assert!(!r.text.contains(TOKEN_A), "{}", r.text);
    }
    assert!(
        one.tool_names(&a)
            .await
            .contains(&"echo__whoami".to_owned())
    );
    assert_eq!(whoami(&one, &b, false, "still").await, "agent-b still");
    assert_eq!(whoami(&one, &b, true, "still").await, "agent-b still");
    // A new value from the admin is used at once (a fresh connection).
    set(&one, "a", "echo", TOKEN_B).await;
    until(Duration::from_secs(10), "the new value is used", || async {
        let r = one.call(&a, "echo__whoami", json!({})).await;
        text(&r.body) == "agent-b"
    })
    .await;

    // On record by slot and owner, never by value.
    one.state.audit.flush().await.unwrap();
    two.state.audit.flush().await.unwrap();
    let record = audit_text(&pool).await;
    for secret in [TOKEN_A, TOKEN_B, LISTER] {
        assert!(!record.contains(secret), "{secret} is on record");
    }
    let used: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE event_type = 'tool.call' AND outcome = 'started' AND agent = 'b' \
         AND details::jsonb->'credentials' @> '[{\"slot\": \"ECHO_TOKEN\", \"per\": \"agent\", \"owner\": \"b\"}]'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(used > 0, "no call of b names the slot it used");
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stdio_upstream_gets_one_child_per_caller_bounded_and_reaped(pool: PgPool) {
    let entry = echo_entry();
    let app = app_with(pool.clone(), &key()).await;
    put_upstream(
        &app,
        "secho",
        json!({
            "transport": "stdio",
            "command": "node",
            "args": [entry, "stdio"],
            "env": {"TOKENS": tokens()},
            "credentials": {"ECHO_TOKEN": {"per": "agent", "inject": "env"}},
            "max_principal_connections": 2,
            "principal_idle_secs": 2,
            "pin": false
        }),
    )
    .await;
    let a = app.agent("a", &["secho"]).await;
    let b = app.agent("b", &["secho"]).await;
    let c = app.agent("c", &["secho"]).await;
    set(&app, "a", "secho", TOKEN_A).await;
    set(&app, "b", "secho", TOKEN_B).await;
    set(&app, "c", "secho", LISTER).await;
    wait_for_tools(&app, &a, "secho").await;

    let who = |token: String| {
        let app = &app;
        async move {
            let r = app.call(&token, "secho__whoami", json!({})).await;
            assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
            text(&r.body)
        }
    };
    assert_eq!(who(a.clone()).await, "agent-a");
    assert_eq!(who(b.clone()).await, "agent-b");
    let health = || async {
        let r = app.admin("GET", "/api/v1/upstreams", None).await;
        r.body["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == "secho")
            .and_then(|u| u["health"]["caller_connections"].as_u64())
    };
    assert_eq!(health().await, Some(2), "one child per caller");
    // A third caller past the bound closes the least recently used child, and nobody's
    // answer is another's.
    assert_eq!(who(c.clone()).await, "lister");
    assert_eq!(health().await, Some(2));
    assert_eq!(who(a.clone()).await, "agent-a");
    assert_eq!(who(b.clone()).await, "agent-b");
    // Unused children are reaped.
    until(
        Duration::from_secs(20),
        "idle children are reaped",
        || async { health().await == Some(0) },
    )
    .await;
    assert_eq!(who(a).await, "agent-a");
}

#[test]
fn an_upstream_credential_is_declared_where_it_can_be_injected() {
    use toolgate::upstream::UpstreamSpec;
    let spec = |v: Value| -> Result<(), String> {
        serde_json::from_value::<UpstreamSpec>(v)
            .map_err(|e| e.to_string())?
            .validate()
    };
    let http = |credentials: Value| json!({"transport": "http", "url": "http://127.0.0.1:1/mcp", "credentials": credentials});
    spec(http(
        json!({"T": {"per": "agent", "inject": "header Authorization \"Bearer {}\""}}),
    ))
    .unwrap();
    spec(http(
        json!({"T": {"per": "person", "inject": "header X-Api-Key {}"}}),
    ))
    .unwrap();
    for (bad, says) in [
        (json!({"T": {"per": "agent", "inject": "env"}}), "headers"),
        (
            json!({"T": {"per": "agent", "inject": "header Authorization Bearer"}}),
            "{}",
        ),
        (
            json!({"T": {"per": "agent", "inject": "header Host {}"}}),
            "transport",
        ),
        (
            json!({"T": {"per": "agent", "inject": "cookie x"}}),
            "neither",
        ),
        (
            json!({"T": {"per": "anyone", "inject": "env"}}),
            "unknown variant",
        ),
        (
            json!({"TOOLGATE_X": {"per": "agent", "inject": "header A {}"}}),
            "configuration",
        ),
        (
            json!({"T": {"per": "agent", "inject": "header A {}"}, "U": {"per": "agent", "inject": "header a {}"}}),
            "twice",
        ),
        // Connecting is a person's act: no agent or shared slot, no environment.
        (
            json!({"T": {"per": "agent", "inject": "header A {}", "oauth": {"client_id": "c"}}}),
            "per: person",
        ),
        (
            json!({"T": {"per": "person", "inject": "header A {}", "oauth": {"client_id": ""}}}),
            "client_id",
        ),
        (
            json!({"T": {"per": "person", "inject": "header A {}", "oauth": {"client_id": "c", "issuer": "http://as.example"}}}),
            "https",
        ),
        (
            json!({"T": {"per": "person", "inject": "header A {}", "oauth": {"client_id": "c", "scopes": ["a b"]}}}),
            "scopes",
        ),
        (
            json!({"T": {"per": "person", "inject": "header A {}", "oauth": {"client_id": "c", "secret": "x"}}}),
            "unknown field",
        ),
        // Exchange is per caller, as a header, and not mixed with connecting.
        (
            json!({"T": {"per": "shared", "inject": "header A {}", "exchange": {"token_endpoint": "https://sts.example/token", "client_id": "c"}}}),
            "per: agent",
        ),
        (
            json!({"T": {"per": "person", "inject": "header A {}", "oauth": {"client_id": "c"}, "exchange": {"token_endpoint": "https://sts.example/token", "client_id": "c"}}}),
            "without `oauth`",
        ),
        (
            json!({"T": {"per": "agent", "inject": "header A {}", "exchange": {"token_endpoint": "http://sts.example/token", "client_id": "c"}}}),
            "https",
        ),
        (
            json!({"T": {"per": "agent", "inject": "header A {}", "exchange": {"token_endpoint": "https://sts.example/token", "client_id": "c", "client_secret_env": "not a var"}}}),
            "client_secret_env",
        ),
    ] {
        let e = spec(http(bad.clone())).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
    // As the README writes them in a policy file, the typed slot, the connected one and the
    // exchanged one: each validates, and a policy export reads back the same.
    for written in [
        "transport: http\nurl: https://mcp.warehouse.example/mcp\nheaders: {X-Api-Key: \"svc-lister-key\"}\ncredentials:\n  WAREHOUSE:\n    per: agent\n    inject: header Authorization \"Bearer {}\"\n    exchange:\n      token_endpoint: https://sts.example/oauth/token\n      client_id: toolgate\n      client_secret_env: STS_CLIENT_SECRET\n      audience: https://mcp.warehouse.example\n      scopes: [warehouse.read]\n",
        "transport: http\nurl: https://mcp.example.com/mcp\ncredentials:\n  GITHUB_TOKEN:\n    per: person\n    inject: header Authorization \"Bearer {}\"\n",
        "transport: http\nurl: https://mcp.tracker.example/mcp\nheaders: {X-Api-Key: \"svc-lister-key\"}\ncredentials:\n  TRACKER:\n    per: person\n    inject: header Authorization \"Bearer {}\"\n    oauth:\n      client_id: toolgate\n      client_secret_env: TRACKER_CLIENT_SECRET\n      scopes: [read]\n",
    ] {
        let yaml: UpstreamSpec = serde_yaml::from_str(written).unwrap();
        yaml.validate().unwrap();
        assert_eq!(
            serde_yaml::from_str::<UpstreamSpec>(&serde_yaml::to_string(&yaml).unwrap()).unwrap(),
            yaml,
            "{written}"
        );
    }
    let stdio = json!({"transport": "stdio", "command": "x", "env": {"T": "v"},
        "credentials": {"T": {"per": "agent", "inject": "env"}}});
    assert!(spec(stdio).unwrap_err().contains("one source"));
    let stdio = json!({"transport": "stdio", "command": "x",
        "credentials": {"T": {"per": "agent", "inject": "header A {}"}}});
    assert!(spec(stdio).unwrap_err().contains("environment"));
}

/// The cost of an upstream call that uses a stored per-agent credential (opened for the call,
/// injected as a header, on the caller's own connection) next to the same call to the same
/// server configured with the same token as a static header, interleaved in one run. A
/// benchmark, not a timed test:
/// `cargo nextest run --test api --run-ignored only -E 'test(upstream_credential_call_cost)' --no-capture`.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
#[ignore = "a measurement; run on its own"]
async fn upstream_credential_call_cost(pool: PgPool) {
    let echo = Echo::start().await;
    let app = app_with(pool, &key()).await;
    let url = format!("http://127.0.0.1:{}/mcp", echo.port);
    put_upstream(
        &app,
        "fixed",
        json!({"transport": "http", "url": url, "headers": {"Authorization": format!("Bearer {TOKEN_A}")}, "pin": false}),
    )
    .await;
    put_upstream(
        &app,
        "stored",
        json!({"transport": "http", "url": url, "headers": {"Authorization": format!("Bearer {LISTER}")},
            "credentials": {"ECHO_TOKEN": {"per": "agent", "inject": "header Authorization \"Bearer {}\""}}, "pin": false}),
    )
    .await;
    let t = app.agent("bench", &["fixed", "stored"]).await;
    set(&app, "bench", "stored", TOKEN_A).await;
    wait_for_tools(&app, &t, "fixed").await;
    wait_for_tools(&app, &t, "stored").await;
    let (s50, f50) = crate::helpers::interleaved_p50(
        &app,
        &t,
        ["/tools/stored/whoami", "/tools/fixed/whoami"],
        320,
        |r| {
            assert_eq!(r.body["content"][0]["text"], "agent-a", "{}", r.text);
        },
    )
    .await;
    println!(
        "upstream call p50: stored per-agent credential {s50:.0} µs, same token as a static header {f50:.0} µs; ratio {:.3}",
        s50 / f50
    );
}

/// `policy check` flags an agent granted a group that needs each person's credential while no
/// person may act as it: its calls could never carry one. With a person, it passes.
#[test]
fn policy_check_flags_person_credentials_no_person_can_fill() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    let policies = dir.path().join("policies");
    let mut doc = crate::helpers::single_op("whoami", json!({"type": "object"}), json!({}));
    doc["x-toolgate-credentials"] = json!({"GH_TOKEN": {"per": "person", "inject": "env"}});
    crate::helpers::write_group(
        &tools,
        "gh",
        &doc,
        &[("whoami.sh", "#!/bin/sh\necho '{}'\n")],
    );
    std::fs::create_dir_all(policies.join("agents/bot")).unwrap();
    std::fs::create_dir_all(policies.join("upstreams")).unwrap();
    std::fs::write(
        policies.join("upstreams/up.yaml"),
        "transport: http\nurl: http://127.0.0.1:1/mcp\ncredentials:\n  UP_TOKEN:\n    per: person\n    inject: header Authorization \"Bearer {}\"\n",
    )
    .unwrap();
    let check = |users: &str| {
        std::fs::write(
            policies.join("agents/bot/agent.md"),
            format!("---\ntools: [gh, up]\n{users}---\nA bot.\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["policy", "check", "--dir"])
            .arg(&policies)
            .arg("--tools-dir")
            .arg(&tools)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, said) = check("");
    assert!(!ok, "{said}");
    for slot in ["`GH_TOKEN`", "`UP_TOKEN`"] {
        assert!(
            said.lines()
                .any(|l| l.contains(slot) && l.contains("no person may act as agent `bot`")),
            "{said}"
        );
    }
    let (_, said) = check("users: [alice]\n");
    assert!(!said.contains("no person may act"), "{said}");
}
