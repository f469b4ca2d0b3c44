//! Outsiders guessing credentials: every failed check counts against its source address and
//! client id, is refused before any hashing once over the limit, and argon2's memory stays
//! bounded however many guesses arrive at once.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{Request, StatusCode};
use sqlx::PgPool;

use crate::helpers::{ADMIN_TOKEN, Reply, TestApp, repo_path};
use toolgate::auth::secrets::{CONCURRENT_VERIFICATIONS, VERIFIER};
use toolgate::limits::{FAILURES_PER_CLIENT, FAILURES_PER_IP};

/// A request as it arrives from `ip` over a real connection.
fn from(ip: &str, mut req: Request<Body>) -> Request<Body> {
    let addr = SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 40_000);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

fn form_post(uri: &str, basic: Option<(&str, &str)>) -> http::request::Builder {
    let mut b = Request::post(uri).header("content-type", "application/x-www-form-urlencoded");
    if let Some((id, secret)) = basic {
        b = b.header(
            "authorization",
            format!("Basic {}", STANDARD.encode(format!("{id}:{secret}"))),
        );
    }
    b
}

async fn token(app: &TestApp, ip: &str, id: &str, secret: &str) -> Reply {
    let req = form_post("/oauth/token", Some((id, secret)))
        .body(Body::from("grant_type=client_credentials"))
        .unwrap();
    app.send(from(ip, req)).await
}

async fn revoke(app: &TestApp, ip: &str, id: &str, secret: &str) -> Reply {
    let req = form_post("/oauth/revoke", Some((id, secret)))
        .body(Body::from("token=whatever"))
        .unwrap();
    app.send(from(ip, req)).await
}

async fn introspect(app: &TestApp, ip: &str, admin_token: &str) -> Reply {
    let req = Request::post("/oauth/introspect")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", format!("Bearer {admin_token}"))
        .body(Body::from("token=whatever"))
        .unwrap();
    app.send(from(ip, req)).await
}

async fn admin_api(app: &TestApp, ip: &str, admin_token: Option<&str>) -> Reply {
    let mut b = Request::get("/api/v1/agents");
    if let Some(t) = admin_token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    app.send(from(ip, b.body(Body::empty()).unwrap())).await
}

/// Sends guesses until one is refused with 429; that reply and how many were answered 401.
async fn guess_until_refused<F, Fut>(burst: u32, mut guess: F) -> (Reply, u32)
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    for i in 0..burst * 4 {
        let r = guess(i).await;
        if r.status != StatusCode::UNAUTHORIZED {
            return (r, i);
        }
    }
    panic!("{} guesses in a row were all answered 401", burst * 4);
}

/// At least the burst was allowed, and no more than what refilled while the guesses ran.
fn assert_within_budget(allowed: u32, (burst, every): (u32, Duration), started: Instant) {
    let refilled = (started.elapsed().as_secs_f64() / every.as_secs_f64()).ceil() as u32;
    assert!(
        allowed >= burst && allowed <= burst + refilled,
        "{allowed} guesses were allowed; the budget is {burst} plus {refilled} refilled"
    );
}

fn assert_limited(r: &Reply, what: &str) {
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{what}: {}",
        r.text
    );
    let secs: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(secs >= 1, "{what}: Retry-After {secs}");
}

/// The refused credential checks on record for `resource` with `outcome` (rows, and the counts
/// of summary rows for identical refusals from one source).
async fn audited(app: &TestApp, resource: &str, outcome: &str) -> i64 {
    crate::helpers::refusals_on_record(
        app,
        &format!(
            "event_type = 'client_auth.failed' AND resource = '{resource}' AND outcome = '{outcome}'"
        ),
    )
    .await
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn wrong_secrets_for_one_client_are_refused_before_hashing_from_any_address(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let (other_id, other_secret) = app.client_for("assistant").await;
    let before = VERIFIER.stats().hashed;

    // Each guess from a new address, so only the client id's budget applies. The budget
    // refills while the guesses run, so a few more may pass than the burst.
    let started = Instant::now();
    let (limited, refused) = guess_until_refused(FAILURES_PER_CLIENT.0, |i| {
        let (app, id) = (&app, &id);
        async move { token(app, &format!("10.1.0.{i}"), id, "tgs_guess").await }
    })
    .await;
    let right_secret_meanwhile = token(&app, "10.1.1.2", &id, &secret).await;
    let hashed = VERIFIER.stats().hashed - before;

    assert_within_budget(refused, FAILURES_PER_CLIENT, started);
    assert_limited(&limited, "a guess beyond the client's budget");
    assert_eq!(limited.body["error"], "slow_down");
    assert_limited(&right_secret_meanwhile, "the attacked client id");
    assert_eq!(hashed, u64::from(refused), "a refused guess was hashed");
    // Other clients, and the guessers' addresses for them, are unaffected.
    let other = token(&app, "10.1.0.0", &other_id, &other_secret).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text);
    assert_eq!(
        audited(&app, "/oauth/token", "denied").await,
        i64::from(refused)
    );
    assert_eq!(audited(&app, "/oauth/token", "rate_limited").await, 2);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn one_address_has_one_failure_budget_across_every_credential_endpoint(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let (id, secret) = app.client_for("assistant").await;
    let ip = "192.0.2.50";

    // Wrong admin tokens on the admin API use up the address's budget...
    let started = Instant::now();
    let (limited, denied) = guess_until_refused(FAILURES_PER_IP.0, |_| {
        let app = &app;
        async move { admin_api(app, ip, Some("not-the-admin-token")).await }
    })
    .await;
    assert_within_budget(denied, FAILURES_PER_IP, started);
    // ...and then every credential endpoint refuses this address, right credentials included,
    // before checking anything.
    assert_limited(&limited, "admin API");
    assert_limited(
        &admin_api(&app, ip, Some(ADMIN_TOKEN)).await,
        "admin API, right token",
    );
    assert_limited(&introspect(&app, ip, ADMIN_TOKEN).await, "introspection");
    assert_limited(&revoke(&app, ip, &id, &secret).await, "revocation");
    assert_limited(&token(&app, ip, &id, &secret).await, "token endpoint");
    // Another address is not affected.
    let other = admin_api(&app, "192.0.2.51", Some(ADMIN_TOKEN)).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text);

    assert_eq!(audited(&app, "/api/v1", "denied").await, i64::from(denied));
    assert!(audited(&app, "/api/v1", "rate_limited").await >= 2);
    assert!(audited(&app, "/oauth/introspect", "rate_limited").await >= 1);
    assert!(audited(&app, "/oauth/revoke", "rate_limited").await >= 1);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn revocation_and_introspection_floods_are_answered_429(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;

    // /oauth/revoke confirms right and wrong secrets: guessing there is limited like anywhere.
    let started = Instant::now();
    let (limited, revoke_denied) = guess_until_refused(FAILURES_PER_IP.0, |i| {
        let app = &app;
        async move { revoke(app, "198.51.100.9", &format!("tgc_guess{i}"), "tgs_guess").await }
    })
    .await;
    assert_within_budget(revoke_denied, FAILURES_PER_IP, started);
    assert_limited(&limited, "revocation flood");

    let started = Instant::now();
    let (limited, introspect_denied) = guess_until_refused(FAILURES_PER_IP.0, |_| {
        let app = &app;
        async move { introspect(app, "198.51.100.10", "not-the-admin-token").await }
    })
    .await;
    assert_within_budget(introspect_denied, FAILURES_PER_IP, started);
    assert_limited(&limited, "introspection flood");

    // Asking without any credential guesses nothing and is not counted.
    for _ in 0..FAILURES_PER_IP.0 * 2 {
        let r = admin_api(&app, "198.51.100.11", None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        audited(&app, "/oauth/revoke", "denied").await,
        i64::from(revoke_denied)
    );
    assert_eq!(
        audited(&app, "/oauth/introspect", "denied").await,
        i64::from(introspect_denied)
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn an_unknown_client_id_looks_like_a_wrong_secret_and_costs_no_hash(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let (id, _) = app.client_for("assistant").await;
    // Real verifications first, so the stand-in knows how long one takes: its estimate is a
    // moving average, and one cold first hash on a loaded machine can take several times
    // longer than the ones measured below.
    // (Another client's, so this one's failure budget is left for the measurement.)
    let (warm, _) = app.client_for("assistant").await;
    for i in 0..8 {
        let _ = token(&app, &format!("172.16.0.{i}"), &warm, "tgs_warmup").await;
    }

    let mut wrong = Vec::new();
    let mut unknown = Vec::new();
    let before = VERIFIER.stats().hashed;
    for i in 0..6 {
        let started = Instant::now();
        let w = token(&app, &format!("172.16.1.{i}"), &id, "tgs_guess").await;
        wrong.push((started.elapsed(), w));
        let started = Instant::now();
        let u = token(
            &app,
            &format!("172.16.2.{i}"),
            &format!("tgc_nobody{i}"),
            "tgs_guess",
        )
        .await;
        unknown.push((started.elapsed(), u));
    }
    let hashed = VERIFIER.stats().hashed - before;

    for ((_, w), (_, u)) in wrong.iter().zip(&unknown) {
        assert_eq!(w.status, StatusCode::UNAUTHORIZED);
        assert_eq!(u.status, w.status);
        assert_eq!(u.body, w.body);
        assert_eq!(
            u.headers.get("www-authenticate"),
            w.headers.get("www-authenticate")
        );
    }
    assert_eq!(hashed, 6, "an unknown client id was hashed");
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let w = median(&mut wrong.iter().map(|(d, _)| *d).collect());
    let u = median(&mut unknown.iter().map(|(d, _)| *d).collect());
    assert!(
        u * 2 >= w && u <= w * 2,
        "unknown ids answer in {u:?}, wrong secrets in {w:?}: told apart by timing"
    );
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn concurrent_guessers_never_run_more_than_the_fixed_number_of_verifications(pool: PgPool) {
    let app = TestApp::new(pool).await;
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(app.client_for("assistant").await);
    }
    let (legit_id, legit_secret) = app.client_for("assistant").await;

    let guesses = clients.iter().enumerate().flat_map(|(i, (id, _))| {
        let app = &app;
        (0..6).map(move |j| async move {
            token(app, &format!("10.2.{i}.{j}"), id, "tgs_guess")
                .await
                .status
        })
    });
    let statuses = futures::future::join_all(guesses).await;

    for s in &statuses {
        assert!(
            [
                StatusCode::UNAUTHORIZED,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(s),
            "a guess was answered {s}"
        );
    }
    assert!(
        VERIFIER.stats().most_running <= CONCURRENT_VERIFICATIONS,
        "{:?}",
        VERIFIER.stats()
    );
    let after = token(&app, "10.3.0.1", &legit_id, &legit_secret).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.text);
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The measured attack against a real `toolgate serve`: 12 outsiders from 12 addresses, each
/// guessing one real client's secret as fast as answers come, for 3 s. The server's peak RSS
/// may grow by at most 64 MB over its RSS after one real verification.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_flood_of_wrong_secrets_leaves_a_real_server_within_64_mb(pool: PgPool) {
    let app = TestApp::new(pool.clone()).await;
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(app.client_for("assistant").await);
    }
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
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "serve",
            "--database-url",
            &url,
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--tools-dir")
        .arg(repo_path("tools"))
        .arg("--policies-dir")
        .arg(repo_path("policies"))
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(logs.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "serve did not start: {}",
            std::fs::read_to_string(logs.path()).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (id, secret) = &clients[0];
    let warm = http
        .post(format!("{base}/oauth/token"))
        .basic_auth(id, Some(secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    // Peak RSS counts from here (writing 5 resets VmHWM; root or the same user may).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let baseline = rss_kib(pid, "VmRSS:");

    let until = Instant::now() + Duration::from_secs(3);
    let outsiders = clients.iter().enumerate().map(|(i, (id, _))| {
        let base = base.clone();
        async move {
            let source: IpAddr = format!("127.0.{}.{}", 3 + i / 200, 2 + i % 200)
                .parse()
                .unwrap();
            let http = reqwest::Client::builder()
                .local_address(source)
                .build()
                .unwrap();
            let mut answers = Vec::new();
            while Instant::now() < until {
                match http
                    .post(format!("{base}/oauth/token"))
                    .basic_auth(id, Some("tgs_guess"))
                    .form(&[("grant_type", "client_credentials")])
                    .send()
                    .await
                {
                    Ok(r) => answers.push(r.status()),
                    Err(e) => panic!("a guess got no answer: {e}"),
                }
            }
            answers
        }
    });
    let answers: Vec<StatusCode> = futures::future::join_all(outsiders)
        .await
        .into_iter()
        .flatten()
        .collect();
    let peak = rss_kib(pid, "VmHWM:");
    let now = rss_kib(pid, "VmRSS:");
    let _ = child.kill();
    let _ = child.wait();

    let grew_mb = (peak.saturating_sub(baseline)) as f64 / 1024.0;
    eprintln!(
        "{} guesses; RSS baseline {baseline} KiB, peak {peak} KiB, after {now} KiB",
        answers.len()
    );
    assert!(answers.len() >= 12, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|s| [401, 429, 503].contains(&s.as_u16())),
        "{answers:?}"
    );
    assert!(
        grew_mb <= 64.0,
        "RSS grew by {grew_mb:.1} MB (baseline {baseline} KiB, peak {peak} KiB, now {now} KiB) under {} guesses",
        answers.len()
    );
}
