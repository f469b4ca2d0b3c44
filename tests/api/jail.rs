//! A tool script attacks the gateway's perimeter from inside a default sandbox: its backends
//! over TCP, UDP and pathname UNIX sockets, the host's other addresses, root-only files, the
//! metadata of paths it was not given, and the process table. Each attack runs for real
//! through the router, as root, and once more unconfined (`--script-sandbox off`) to show that
//! it is real.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, single_op, write_group};
use crate::sandbox::{pids_with, unique_sleep, wait_until_gone};

fn obj() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": true})
}

/// Tries each way out named in its input and prints, for each, `true` or why it failed. A TCP
/// attempt with a greeting also reads it: the bytes came from the listener itself.
const PROBE: &str = r#"#!/usr/bin/env python3
import json, os, socket, sys

a = json.load(sys.stdin)
out = {"uid": os.getuid()}

def attempt(name, f):
    try:
        f()
        out[name] = True
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"

def tcp(host, port, greeting):
    with socket.create_connection((host, port), timeout=5) as s:
        got = b""
        s.settimeout(5)
        while len(got) < len(greeting):
            chunk = s.recv(64)
            if not chunk:
                break
            got += chunk
        if got != greeting.encode():
            raise OSError(f"read {got!r}")

def udp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", (host, port))

def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)

for name, (host, port, greeting) in a.get("tcp", {}).items():
    attempt(name, lambda: tcp(host, port, greeting))
for name, (host, port) in a.get("udp", {}).items():
    attempt(name, lambda: udp(host, port))
for name, path in a.get("unix", {}).items():
    attempt(name, lambda: unix(path))
for name, path in a.get("stat", {}).items():
    attempt(name, lambda: os.stat(path))
for name, path in a.get("read", {}).items():
    attempt(name, lambda: open(path, "rb").read(1))
print(json.dumps(out))
"#;

/// A listener on `addr` that writes `greeting` to every connection; returns its address.
fn greeter(addr: SocketAddr, greeting: &'static str) -> SocketAddr {
    let listener = TcpListener::bind(addr).unwrap();
    let bound = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.write_all(greeting.as_bytes());
        }
    });
    bound
}

/// A non-loopback address of this host (the one its default route leaves from): the private
/// network the gateway sits on.
fn host_address() -> Option<IpAddr> {
    for (bind, toward) in [
        ("0.0.0.0:0", "198.51.100.1:9"),
        ("[::]:0", "[2001:db8::1]:9"),
    ] {
        let Ok(socket) = UdpSocket::bind(bind) else {
            continue;
        };
        if socket.connect(toward).is_ok()
            && let Ok(local) = socket.local_addr()
            && !local.ip().is_unspecified()
            && !local.ip().is_loopback()
        {
            return Some(local.ip());
        }
    }
    None
}

/// Whether a connection is waiting on `listener` (one the script made would be: the kernel
/// completes the handshake before `connect` returns).
fn pending_tcp(listener: &TcpListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    listener.accept().is_ok()
}

fn pending_unix(listener: &UnixListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    listener.accept().is_ok()
}

/// Whether a datagram is waiting: loopback delivers it before `sendto` returns in the script.
fn pending_udp(socket: &UdpSocket) -> bool {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    socket.recv(&mut buf).is_ok()
}

async fn fresh_db(pool: &PgPool) -> PgPool {
    let name = format!("toolgate_jail_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").unwrap();
    let mut url = url::Url::parse(&base).unwrap();
    url.set_path(&name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url.as_str())
        .await
        .unwrap();
    toolgate::db::MIGRATOR.run(&pool).await.unwrap();
    pool
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_script_reaches_only_the_pairs_its_group_lists(pool: PgPool) {
    // The gateway's own backends answer here: the attacks aim at something real.
    for backend in ["127.0.0.1:5432", "127.0.0.1:6379"] {
        TcpStream::connect(backend).unwrap_or_else(|e| panic!("{backend} is not up: {e}"));
    }
    let any = |ip: IpAddr| SocketAddr::new(ip, 0);
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let allowed = greeter(any(loopback), "allowed");
    let named = greeter(any(loopback), "named");
    let refused = TcpListener::bind(any(loopback)).unwrap();
    let host_ip = host_address().expect("this host has no address besides loopback");
    let private = TcpListener::bind(any(host_ip)).unwrap();
    let private_allowed = greeter(any(host_ip), "private");
    let udp = UdpSocket::bind(any(loopback)).unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let unix_path = sockets.path().join("db.sock");
    let unix = UnixListener::bind(&unix_path).unwrap();
    let pg_socket = "/var/run/postgresql/.s.PGSQL.5432";

    let ip = host_ip.to_string();
    let input = json!({
        "tcp": {
            "postgres": ["127.0.0.1", 5432, ""],
            "redis": ["127.0.0.1", 6379, ""],
            "loopback": ["127.0.0.1", refused.local_addr().unwrap().port(), ""],
            "private": [ip, private.local_addr().unwrap().port(), ""],
            "listed": ["127.0.0.1", allowed.port(), "allowed"],
            "listed_by_name": ["localhost", named.port(), "named"],
            "listed_private": [ip, private_allowed.port(), "private"],
        },
        "udp": {"udp_loopback": ["127.0.0.1", udp.local_addr().unwrap().port()]},
        "unix": {"unix_socket": unix_path, "postgres_socket": pg_socket},
    });
    let root = tempfile::tempdir().unwrap();
    write_group(
        root.path(),
        "closed",
        &single_op("probe", obj(), json!({})),
        &[("probe.py", PROBE)],
    );
    let mut doc = single_op("probe", obj(), json!({}));
    let listed_ip = match host_ip {
        IpAddr::V6(v6) => format!("[{v6}]:{}", private_allowed.port()),
        IpAddr::V4(v4) => format!("{v4}:{}", private_allowed.port()),
    };
    doc["x-toolgate-sandbox"] = json!({"egress": [
        format!("127.0.0.1:{}", allowed.port()),
        format!("localhost:{}", named.port()),
        listed_ip,
    ]});
    write_group(root.path(), "listed", &doc, &[("probe.py", PROBE)]);
    let app = TestApp::with(pool.clone(), root.path(), None, &[]).await;
    let token = app.agent("prober", &["closed", "listed"]).await;

    let closed = app
        .post_json("/tools/closed/probe", Some(&token), input.clone())
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text);
    for way in [
        "postgres",
        "redis",
        "loopback",
        "private",
        "listed",
        "listed_by_name",
        "listed_private",
        "unix_socket",
        "postgres_socket",
    ] {
        assert_ne!(
            closed.body[way], true,
            "`{way}` got through: {}",
            closed.text
        );
    }
    assert!(!pending_tcp(&refused), "{}", closed.text);
    assert!(!pending_tcp(&private), "{}", closed.text);
    assert!(
        !pending_udp(&udp),
        "a datagram reached loopback: {}",
        closed.text
    );
    assert!(!pending_unix(&unix), "{}", closed.text);

    let listed = app
        .post_json("/tools/listed/probe", Some(&token), input.clone())
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    for way in ["listed", "listed_by_name", "listed_private"] {
        assert_eq!(
            listed.body[way], true,
            "`{way}` was refused: {}",
            listed.text
        );
    }
    for way in [
        "postgres",
        "redis",
        "loopback",
        "private",
        "unix_socket",
        "postgres_socket",
    ] {
        assert_ne!(
            listed.body[way], true,
            "`{way}` got through: {}",
            listed.text
        );
    }
    assert!(!pending_tcp(&refused), "{}", listed.text);
    assert!(!pending_tcp(&private), "{}", listed.text);
    assert!(
        !pending_udp(&udp),
        "a datagram reached loopback: {}",
        listed.text
    );
    assert!(!pending_unix(&unix), "{}", listed.text);

    // Unconfined, the same script reaches all of it: the attacks are real.
    let off = TestApp::with(
        fresh_db(&pool).await,
        root.path(),
        None,
        &["--script-sandbox", "off"],
    )
    .await;
    let token = off.agent("prober", &["closed"]).await;
    let r = off
        .post_json("/tools/closed/probe", Some(&token), input)
        .await;
    for way in ["postgres", "redis", "loopback", "private", "unix_socket"] {
        assert_eq!(r.body[way], true, "unconfined, `{way}` failed: {}", r.text);
    }
    if std::path::Path::new(pg_socket).exists() {
        assert_eq!(r.body["postgres_socket"], true, "{}", r.text);
    }
    assert!(pending_tcp(&refused), "{}", r.text);
    assert!(pending_udp(&udp), "{}", r.text);
    assert!(pending_unix(&unix), "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_default_script_is_unprivileged_and_sees_no_path_it_was_not_given(pool: PgPool) {
    assert!(nix::unistd::Uid::effective().is_root(), "run as root");
    let root = tempfile::tempdir().unwrap();
    write_group(
        root.path(),
        "snoop",
        &single_op("probe", obj(), json!({})),
        &[("probe.py", PROBE)],
    );
    std::fs::write(root.path().join("snoop/own.txt"), "mine").unwrap();
    write_group(
        root.path(),
        "victim",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho {}\n")],
    );
    let victim_file = root.path().join("victim/secret.txt");
    std::fs::write(&victim_file, "hunter2").unwrap();
    // Beside the per-call temporary directories, and in no one's allowed set.
    let tmp_file = tempfile::NamedTempFile::new().unwrap();
    let input = json!({
        "read": {
            "shadow": "/etc/shadow",
            "own_file": root.path().join("snoop/own.txt"),
        },
        "stat": {
            "other_group_file": victim_file,
            "other_group": root.path().join("victim"),
            "postgres_run_dir": "/var/run/postgresql",
            "run": "/run",
            "var": "/var",
            "tmp_file": tmp_file.path(),
            "proc": "/proc/1",
            "shadow_stat": "/etc/shadow",
            "own_file_stat": root.path().join("snoop/own.txt"),
        },
    });
    let app = TestApp::with(pool.clone(), root.path(), None, &[]).await;
    let token = app.agent("snoop", &["snoop"]).await;

    let r = app
        .post_json("/tools/snoop/probe", Some(&token), input.clone())
        .await;

    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_ne!(r.body["uid"], 0, "the script ran as root: {}", r.text);
    for way in [
        "shadow",
        "other_group_file",
        "other_group",
        "postgres_run_dir",
        "run",
        "var",
        "tmp_file",
        "proc",
    ] {
        assert_ne!(r.body[way], true, "`{way}` worked: {}", r.text);
    }
    // What it was given stays: its own folder, and /etc (its metadata included).
    for way in ["own_file", "own_file_stat", "shadow_stat"] {
        assert_eq!(r.body[way], true, "`{way}` failed: {}", r.text);
    }

    // Unconfined, it is root and sees everything: the attacks are real.
    let off = TestApp::with(
        fresh_db(&pool).await,
        root.path(),
        None,
        &["--script-sandbox", "off"],
    )
    .await;
    let token = off.agent("snoop", &["snoop"]).await;
    let r = off
        .post_json("/tools/snoop/probe", Some(&token), input)
        .await;
    assert_eq!(r.body["uid"], 0, "{}", r.text);
    for way in [
        "shadow",
        "other_group_file",
        "postgres_run_dir",
        "var",
        "tmp_file",
    ] {
        assert_eq!(r.body[way], true, "unconfined, `{way}` failed: {}", r.text);
    }
}

/// Forks until the kernel refuses, each child a `sleep` marked for the test, then becomes a
/// `sleep` itself (marked `done`), holding every process it got until the test kills it.
fn bomb(marker: &str, done: &str) -> String {
    format!(
        r#"#!/usr/bin/env python3
import os
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execvp("sleep", ["sleep", "{marker}"])
os.execvp("sleep", ["sleep", "{done}"])
"#
    )
}

/// Starts `n` children that live at once, then lets them go; prints how many it got.
const ROOMY: &str = r#"#!/usr/bin/env python3
import json, os, sys
n = json.load(sys.stdin)["n"]
r, w = os.pipe()
got = 0
for _ in range(n):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    got += 1
os.close(w)
for _ in range(got):
    os.wait()
print(json.dumps({"forked": got}))
"#;

async fn fork_bomb_is_bounded_per_call(pool: PgPool, args: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    let (marker, done) = (unique_sleep(), unique_sleep());
    let root = tempfile::tempdir().unwrap();
    // A script user reaches its folder through file permissions (without a jail, the
    // temporary directory's own mode would stop it).
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let limited = |timeout_ms: u64| {
        let mut doc = single_op("run", obj(), json!({"x-toolgate-timeout-ms": timeout_ms}));
        doc["x-toolgate-sandbox"] = json!({"processes": 16});
        doc
    };
    write_group(
        root.path(),
        "bomb",
        &limited(60_000),
        &[("run.py", &bomb(&marker, &done))],
    );
    write_group(root.path(), "roomy", &limited(30_000), &[("run.py", ROOMY)]);
    let app = TestApp::with(pool, root.path(), None, args).await;
    let token = app.agent("bomber", &["bomb", "roomy"]).await;

    let (bombed, (held, roomy, ready)) = tokio::join!(
        app.post_json("/tools/bomb/run", Some(&token), json!({})),
        async {
            let deadline = Instant::now() + Duration::from_secs(30);
            let holder = loop {
                if let Some(pid) = pids_with(&done).first() {
                    break *pid;
                }
                assert!(Instant::now() < deadline, "the bomb never finished forking");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let held = pids_with(&marker).len();
            // While the bomb holds all it could get, another call forks as much as its own
            // limit allows, and the gateway answers.
            let roomy = app
                .post_json("/tools/roomy/run", Some(&token), json!({"n": 10}))
                .await;
            let ready = app.get("/readyz", None).await;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(holder),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            (held, roomy, ready)
        }
    );
    wait_until_gone(&marker).await;

    assert!(
        (1..16).contains(&held),
        "the bomb held {held} processes with a limit of 16 ({args:?})"
    );
    assert_eq!(roomy.status, StatusCode::OK, "{args:?}: {}", roomy.text);
    assert_eq!(roomy.body["forked"], 10, "{args:?}: {}", roomy.text);
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text);
    assert_eq!(bombed.status, StatusCode::BAD_GATEWAY, "{}", bombed.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_fork_bomb_is_bounded_per_call(pool: PgPool) {
    fork_bomb_is_bounded_per_call(pool, &[]).await;
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_fork_bomb_is_bounded_per_call_with_a_script_user(pool: PgPool) {
    fork_bomb_is_bounded_per_call(pool, &["--script-user", "nobody"]).await;
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_reload_keeps_a_groups_jail_and_a_recreated_folder_gets_a_new_one(pool: PgPool) {
    let script =
        |v: u32| format!("#!/bin/sh\nprintf '{{\"v\": {v}, \"tmp\": \"%s\"}}' \"$TMPDIR\"\n");
    let root = tempfile::tempdir().unwrap();
    let doc = single_op("run", obj(), json!({}));
    write_group(root.path(), "g", &doc, &[("run.sh", &script(1))]);
    // A data file whose content changes below: the group's copies (its scripts and the names
    // of its entries) stay the same, and so does its jail.
    std::fs::write(root.path().join("g/notes.txt"), "first").unwrap();
    let app = TestApp::with(pool, root.path(), None, &[]).await;
    let token = app.agent("caller", &["g"]).await;
    let call = || app.post_json("/tools/g/run", Some(&token), json!({}));
    // The jail's directory holds the calls' TMPDIRs: the same parent, the same jail.
    let jail_of = |r: &crate::helpers::Reply| {
        let tmp = std::path::PathBuf::from(r.body["tmp"].as_str().unwrap());
        tmp.parent().unwrap().to_path_buf()
    };

    let first = call().await;
    assert_eq!(first.body["v"], 1, "{}", first.text);
    std::fs::write(root.path().join("g/notes.txt"), "edited").unwrap();
    app.state.reload_pool();
    let reloaded = call().await;
    assert_eq!(reloaded.body["v"], 1, "{}", reloaded.text);
    assert_eq!(jail_of(&first), jail_of(&reloaded));

    std::fs::remove_dir_all(root.path().join("g")).unwrap();
    write_group(root.path(), "g", &doc, &[("run.sh", &script(2))]);
    app.state.reload_pool();
    let recreated = call().await;
    assert_eq!(recreated.body["v"], 2, "{}", recreated.text);
    assert_ne!(jail_of(&first), jail_of(&recreated));
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_read_path_that_holds_the_tools_directory_shows_no_other_group(pool: PgPool) {
    let outer = tempfile::tempdir().unwrap();
    let tools = outer.path().join("tools");
    write_group(
        &tools,
        "snoop",
        &single_op("probe", obj(), json!({})),
        &[("probe.py", PROBE)],
    );
    write_group(
        &tools,
        "victim",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho {}\n")],
    );
    std::fs::write(outer.path().join("shared.txt"), "for everyone").unwrap();
    let input = json!({
        "stat": {
            "other_group": tools.join("victim/run.sh"),
            "tools_dir_entry": tools.join("victim"),
            "own": tools.join("snoop/probe.py"),
        },
        "read": {"read_path_file": outer.path().join("shared.txt")},
    });
    let read_path = outer.path().to_str().unwrap();
    let app = TestApp::with(pool, &tools, None, &["--script-read-path", read_path]).await;
    let token = app.agent("snoop", &["snoop"]).await;

    let r = app
        .post_json("/tools/snoop/probe", Some(&token), input)
        .await;

    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_ne!(r.body["other_group"], true, "{}", r.text);
    assert_ne!(r.body["tools_dir_entry"], true, "{}", r.text);
    assert_eq!(r.body["own"], true, "{}", r.text);
    assert_eq!(r.body["read_path_file"], true, "{}", r.text);
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_stopped_gateway_leaves_no_jail_directory_behind(pool: PgPool) {
    use crate::sandbox::{db_url, serve, token_from};
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    write_group(
        root.path(),
        "g",
        &single_op("run", obj(), json!({})),
        &[("run.sh", "#!/bin/sh\necho {}\n")],
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let base = format!("http://127.0.0.1:{port}");
    let mut server = serve(&db_url(&db), root.path(), port);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "toolgate serve never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let token = token_from(&http, &base, "caller", &["g"]).await;
    let r = http
        .post(format!("{base}/tools/g/run"))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let pid = server.id().unwrap();
    let jail_dirs = || {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("toolgate-call-{pid}-"))
            })
            .count()
    };
    assert_eq!(jail_dirs(), 1, "the group's jail has no directory");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("the gateway did not stop")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        jail_dirs(),
        0,
        "a stopped gateway left its jail's directory"
    );
}
