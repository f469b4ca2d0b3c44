//! Strangers who prove nothing: failed bearer and credential checks from one source draw on
//! one budget (429 past it, shared by every instance through Redis), identical refusals from a
//! source are written as their first row and one row with their count, and nobody can spend
//! the budget of a legitimate agent from another source.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{Request, StatusCode, header};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Reply, TestApp, mcp_request, refusals_on_record, repo_path};
use toolgate::limits::FAILURES_PER_IP;

/// `req` as it arrives from `ip` over a real connection.
fn from(ip: &str, mut req: Request<Body>) -> Request<Body> {
    let addr = SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 40_000);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// `tools/list` on /mcp from `ip` with `token`.
async fn list(app: &TestApp, ip: &str, token: &str) -> Reply {
    let headers = [
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let req = mcp_request(Some(token), json!(1), "tools/list", json!({}), &headers);
    app.send(from(ip, req)).await
}

async fn token_from(app: &TestApp, ip: &str, id: &str, secret: &str) -> Reply {
    let req = Request::post("/oauth/token")
        .header("content-type", "application/x-www-form-urlencoded")
        .header(
            "authorization",
            format!("Basic {}", STANDARD.encode(format!("{id}:{secret}"))),
        )
        .body(Body::from("grant_type=client_credentials"))
        .unwrap();
    app.send(from(ip, req)).await
}

async fn rows(pool: &PgPool, filter: &str) -> Vec<(String, Option<String>, Option<String>)> {
    sqlx::query_as(&format!(
        "SELECT outcome, error, details FROM audit_events WHERE {filter} ORDER BY id"
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Finding 10: 300 requests with a bad bearer token to /mcp from one address.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_bad_bearer_flood_is_limited_and_summarised_not_written_row_by_row(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let good = app.token_with(&id, &secret).await;
    let stranger = "198.51.100.7";

    let mut statuses = Vec::new();
    for batch in 0..10 {
        let sent = (0..30).map(|i| {
            let app = &app;
            async move { list(app, stranger, &format!("not.a.token{batch}-{i}")).await }
        });
        statuses.extend(futures::future::join_all(sent).await);
    }
    let unauthorized = statuses
        .iter()
        .filter(|r| r.status == StatusCode::UNAUTHORIZED)
        .count();
    let limited: Vec<&Reply> = statuses
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    println!(
        "300 bad bearer tokens: {unauthorized} x 401, {} x 429",
        limited.len()
    );
    assert_eq!(unauthorized + limited.len(), 300);
    assert!(
        !limited.is_empty(),
        "no request was refused by the source's budget"
    );
    assert!(unauthorized >= FAILURES_PER_IP.0 as usize);
    let wait: u64 = limited[0].headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);

    // The agent's valid token works from the flooded address and from any other.
    for ip in [stranger, "203.0.113.20"] {
        let r = list(&app, ip, &good).await;
        assert_eq!(r.status, StatusCode::OK, "{ip}: {}", r.text);
    }

    // Every refusal is on record, in far fewer rows than refusals.
    let filter = format!("event_type = 'auth.rejected' AND remote_addr = '{stranger}'");
    assert_eq!(refusals_on_record(&app, &filter).await, 300);
    let written = rows(&pool, &filter).await;
    println!("audit rows for them: {}", written.len());
    assert!(written.len() <= 6, "{written:?}");
    // The first refusal is its own row, written as it happened.
    let (outcome, error, details) = &written[0];
    assert_eq!(outcome, "denied");
    assert!(error.as_deref().unwrap().contains("token"), "{error:?}");
    assert!(details.is_none());
    // And the counts say what followed.
    let counted: Vec<(String, u64)> = written
        .iter()
        .filter_map(|(o, _, d)| {
            let d: serde_json::Value = serde_json::from_str(d.as_deref()?).ok()?;
            Some((o.clone(), d["summary"]["repeats"].as_u64()?))
        })
        .collect();
    assert!(
        counted
            .iter()
            .any(|(o, n)| o == "rate_limited" && *n as usize == limited.len() - 1),
        "{counted:?}"
    );
}

/// A stranger who knows an agent's client id and fails against it from many addresses spends
/// that client id's budget, but not for the source the agent signs in from.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stranger_cannot_lock_an_agent_out_by_failing_against_its_client_id(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, secret) = app.client_for("assistant").await;
    let agent_host = "192.0.2.40";
    let r = token_from(&app, agent_host, &id, &secret).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let mut limited = false;
    for i in 0..60 {
        let r = token_from(
            &app,
            &format!("10.9.{}.{}", i / 200, i % 200),
            &id,
            "tgs_guess",
        )
        .await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            limited = true;
            break;
        }
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    }
    assert!(limited, "the client id's budget never ran out");
    // The guesses are still refused from new addresses...
    let r = token_from(&app, "10.9.9.9", &id, &secret).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    // ...but the agent, from where it authenticated before, gets its token.
    let r = token_from(&app, agent_host, &id, &secret).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// With Redis, a source's failures count on every instance: spending half the budget on one
/// and the rest on another is refused.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_source_that_failed_on_one_instance_is_limited_on_another(pool: PgPool) {
    let prefix = format!("toolgate-test:{}:", uuid::Uuid::new_v4());
    let redis = [
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--redis-key-prefix",
        &prefix,
    ];
    let a = TestApp::with(
        pool.clone(),
        &repo_path("tools"),
        Some(&repo_path("policies")),
        &redis,
    )
    .await;
    let b = TestApp::with(pool.clone(), &repo_path("tools"), None, &redis).await;
    let stranger = "198.51.100.77";
    let half = FAILURES_PER_IP.0 * 3 / 4;
    for i in 0..half {
        let r = list(&a, stranger, &format!("bad{i}")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    }
    let mut refused_on_b = None;
    for i in 0..half {
        let r = list(&b, stranger, &format!("bad{i}")).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            refused_on_b = Some(i);
            break;
        }
    }
    let Some(after) = refused_on_b else {
        panic!("{half} failures on each of two instances and neither refused the source")
    };
    println!("instance b refused the source after {after} failures of its own");
    assert!(after < half);
    // Another source is not affected on either.
    let r = list(&b, "198.51.100.78", "bad").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

/// A real `toolgate serve` over `pool`, with `env` set (the perimeter flags are read from the
/// environment, which older builds ignore) and at most `files` open file descriptors.
struct Served {
    child: std::process::Child,
    addr: SocketAddr,
    logs: tempfile::NamedTempFile,
}

impl Served {
    async fn start(pool: &PgPool, env: &[(&str, &str)], files: Option<u64>) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let o = pool.connect_options();
        let url = format!(
            "postgres://{}@{}:{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap()
        );
        let logs = tempfile::NamedTempFile::new().unwrap();
        // util-linux's prlimit sets the descriptor limit of the server alone.
        let mut cmd = match files {
            Some(n) => {
                let mut c = std::process::Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg(env!("CARGO_BIN_EXE_toolgate"));
                c
            }
            None => std::process::Command::new(env!("CARGO_BIN_EXE_toolgate")),
        };
        cmd.args(["serve", "--database-url", &url])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .arg("--tools-dir")
            .arg(repo_path("tools"))
            .arg("--policies-dir")
            .arg(repo_path("policies"))
            .env_remove("DATABASE_URL")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(logs.reopen().unwrap());
        let child = cmd.spawn().unwrap();
        let served = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            logs,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Ok(Ok(Some((200, _)))) = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                get_from(served.addr, "127.0.0.1", "/readyz"),
            )
            .await
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serve did not start: {}",
                std::fs::read_to_string(served.logs.path()).unwrap()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        served
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connection to `addr` from the local address `from` (any of 127.0.0.0/8).
async fn connect_from(addr: SocketAddr, from: &str) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse().unwrap(), 0))?;
    socket.connect(addr).await
}

/// `GET path` from `from`: the status and the head, or `None` if the connection ended first.
async fn get_from(
    addr: SocketAddr,
    from: &str,
    path: &str,
) -> std::io::Result<Option<(u16, String)>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = connect_from(addr, from).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out).to_string();
    Ok(text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .map(|c| (c, text)))
}

/// Reads until the server closes the connection (or resets it); what arrived first.
async fn until_closed(s: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

const SHORT: [(&str, &str); 2] = [
    ("TOOLGATE_HEADER_READ_TIMEOUT_SECS", "2"),
    ("TOOLGATE_REQUEST_BODY_TIMEOUT_SECS", "2"),
];

/// Slowloris: a connection that sends nothing, one that sends its headers a line at a time
/// and never ends them, and a keep-alive connection left idle are all closed by the server
/// within the header timeout, whatever the client keeps sending.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn slow_headers_and_idle_connections_are_cut_in_bounded_time(pool: PgPool) {
    use tokio::io::AsyncWriteExt;
    let server = Served::start(&pool, &SHORT, None).await;
    let within = std::time::Duration::from_secs(8);
    let started = std::time::Instant::now();

    let mut silent = connect_from(server.addr, "127.0.0.1").await.unwrap();
    let mut trickling = connect_from(server.addr, "127.0.0.1").await.unwrap();
    trickling
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut idle = connect_from(server.addr, "127.0.0.1").await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let trickle = async {
        // A header line every half second, never the blank line that ends them.
        for i in 0.. {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            if trickling
                .write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return started.elapsed();
            }
        }
        unreachable!()
    };
    let (silent_closed, trickle_closed, idle_answered) = tokio::time::timeout(within, async {
        tokio::join!(
            async {
                until_closed(&mut silent).await;
                started.elapsed()
            },
            trickle,
            async {
                let answered = until_closed(&mut idle).await;
                (started.elapsed(), answered)
            },
        )
    })
    .await
    .unwrap_or_else(|_| panic!("a slow or idle connection was still open after {within:?}"));
    println!(
        "closed after: silent {silent_closed:?}, trickling headers {trickle_closed:?}, idle keep-alive {:?}",
        idle_answered.0
    );
    // The idle connection got its answer first: only then was it idle.
    assert!(
        String::from_utf8_lossy(&idle_answered.1).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&idle_answered.1)
    );
}

/// A request whose body trickles in is answered 408 once its deadline passes and its
/// connection closed; meanwhile others are served as usual.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_slow_body_is_cut_and_holds_up_nobody(pool: PgPool) {
    use tokio::io::AsyncWriteExt;
    let server = Served::start(&pool, &SHORT, None).await;
    let started = std::time::Instant::now();
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = connect_from(server.addr, "127.0.0.1").await.unwrap();
        s.write_all(
            b"POST /oauth/token HTTP/1.1\r\nhost: 127.0.0.1\r\n\
              content-type: application/x-www-form-urlencoded\r\ncontent-length: 100000\r\n\r\ngrant_type=",
        )
        .await
        .unwrap();
        slow.push(s);
    }
    let trickle = async {
        let mut answers = Vec::new();
        for mut s in slow {
            answers.push(async move {
                let (mut read, mut write) = s.split();
                let feed = async {
                    loop {
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        if write.write_all(b"a").await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                };
                let answer = async {
                    use tokio::io::AsyncReadExt;
                    let mut out = Vec::new();
                    let _ = read.read_to_end(&mut out).await;
                    (started.elapsed(), out)
                };
                tokio::select! {
                    a = answer => a,
                    () = feed => unreachable!(),
                }
            });
        }
        futures::future::join_all(answers).await
    };
    // Others are served while the slow bodies are pending.
    let others = async {
        let mut worst = std::time::Duration::ZERO;
        for _ in 0..10 {
            let t = std::time::Instant::now();
            let r = get_from(server.addr, "127.0.0.1", "/healthz")
                .await
                .unwrap();
            assert_eq!(r.map(|(s, _)| s), Some(200));
            worst = worst.max(t.elapsed());
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        worst
    };
    let within = std::time::Duration::from_secs(10);
    let (answers, worst) = tokio::time::timeout(within, async { tokio::join!(trickle, others) })
        .await
        .unwrap_or_else(|_| panic!("a trickling body was still being read after {within:?}"));
    println!(
        "slow bodies answered after {:?} .. {:?}; others served in at most {worst:?}",
        answers.iter().map(|a| a.0).min().unwrap(),
        answers.iter().map(|a| a.0).max().unwrap()
    );
    for (_, out) in &answers {
        let text = String::from_utf8_lossy(out);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    assert!(worst < std::time::Duration::from_secs(1), "{worst:?}");
}

/// One source opening connections and sending nothing cannot take every file descriptor:
/// another source is still served.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn held_open_connections_from_one_source_do_not_starve_another(pool: PgPool) {
    let mut env = SHORT.to_vec();
    env.push(("TOOLGATE_MAX_CONNECTIONS_PER_SOURCE", "50"));
    // Few descriptors, so that what a stranger holds decides whether others get any.
    let server = Served::start(&pool, &env, Some(256)).await;
    let mut held = Vec::new();
    for _ in 0..400 {
        match connect_from(server.addr, "127.0.0.1").await {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        get_from(server.addr, "127.0.0.2", "/healthz"),
    )
    .await;
    println!(
        "{} connections opened from 127.0.0.1; 127.0.0.2 answered in {:?}",
        held.len(),
        started.elapsed()
    );
    assert!(
        matches!(answer, Ok(Ok(Some((200, _))))),
        "another source was not served while one held {} connections: {answer:?}\n{}",
        held.len(),
        std::fs::read_to_string(server.logs.path()).unwrap_or_default()
    );
}
