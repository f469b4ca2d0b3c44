//! The command line against a database URL with a typo: only `serve` and `migrate` create.

use std::io::Write;
use std::process::{Command, Stdio};

use sqlx::PgPool;

use crate::helpers::repo_path;

async fn database_exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The server part of the test database's URL, with a password added so that the test can see
/// it is not printed (trust auth ignores it).
fn url_for(pool: &PgPool, database: &str) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}:hunter2-secret@{}:{}/{database}",
        o.get_username(),
        o.get_host(),
        o.get_port()
    )
}

#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn commands_other_than_serve_and_migrate_refuse_a_missing_database(pool: PgPool) {
    let name = format!("toolgate_typo_{}", uuid::Uuid::new_v4().simple());
    let url = url_for(&pool, &name);
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().to_str().unwrap();
    let policies = repo_path("policies");
    let tools = repo_path("tools");
    let (policies, tools) = (policies.to_str().unwrap(), tools.to_str().unwrap());
    let commands: Vec<Vec<&str>> = vec![
        vec!["client", "create", "--agent", "assistant"],
        vec!["client", "list"],
        vec!["client", "delete", "tgc_nobody"],
        vec!["policy", "apply", "--dir", policies, "--tools-dir", tools],
        vec!["policy", "export", "--dir", out, "--tools-dir", tools],
        vec!["audit", "export"],
        vec!["audit", "verify"],
        vec!["keys", "rotate"],
        vec![
            "admin",
            "create-user",
            "--username",
            "ops",
            "--role",
            "admin",
        ],
    ];

    for args in &commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .args(["--database-url", &url])
            .env_remove("DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"a password\n")
            .unwrap();
        let done = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        let shown = args.join(" ");

        assert!(!done.status.success(), "`{shown}` succeeded: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "`{shown}` said more than one line: {stderr}"
        );
        assert!(
            lines[0].contains(&format!("database `{name}` does not exist"))
                && lines[0].contains(&format!("@{}:", pool.connect_options().get_host())),
            "`{shown}`: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2-secret"),
            "`{shown}` printed the password: {stderr}"
        );
        assert!(
            !database_exists(&pool, &name).await,
            "`{shown}` created the database"
        );
    }

    let migrated = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["migrate", "--database-url", &url])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    assert!(
        database_exists(&pool, &name).await,
        "migrate did not create"
    );
    let listed = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["client", "list", "--database-url", &url])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&pool)
        .await
        .unwrap();
}

/// `toolgate … | head` must not panic when `head` closes the pipe: the command ends as `ls`
/// does, killed by SIGPIPE, with nothing on stderr. The pipe's read end is closed before the
/// command starts, so its first write always meets a closed pipe.
#[test]
fn output_into_a_closed_pipe_ends_the_command_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let policies = repo_path("policies");
    let tools = repo_path("tools");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["policy", "check", "--dir"])
        .arg(&policies)
        .arg("--tools-dir")
        .arg(&tools)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGPIPE),
        "status {:?}, stderr: {stderr}",
        out.status
    );
}

/// A filter that names a kind the log never records is refused, naming the known ones: a
/// typo must not look like an export with nothing in it.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn audit_export_refuses_an_unknown_event_type_or_outcome(pool: PgPool) {
    let o = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap()
    );
    for (flag, typo, known) in [
        ("--event-type", "tool.reslt", "tool.result"),
        ("--outcome", "sucess", "success"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["audit", "export", flag, typo, "--database-url", &url])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {typo} was accepted");
        assert!(out.stdout.is_empty(), "{flag} {typo} exported");
        assert!(
            stderr.contains(&format!("`{typo}`")) && stderr.contains(known),
            "{stderr}"
        );
    }
    let good = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "audit",
            "export",
            "--event-type",
            "tool.result",
            "--database-url",
            &url,
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
}

/// Names typed on the command line are held to their rule as they are read, before any
/// database is reached.
#[test]
fn a_name_that_breaks_its_rule_is_refused_by_the_command_line() {
    for (args, message) in [
        (
            vec![
                "admin",
                "create-user",
                "--username",
                "a b",
                "--role",
                "admin",
            ],
            "username `a b` must be 1-64",
        ),
        (
            vec!["client", "create", "--agent", "../x"],
            "agent name `../x` must be 1-64",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(&args)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// `toolgate agent|grant|user` against a running server: the changes go through its admin
/// API, so they are live at once and audited; refusals are the API's, with its message.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn agent_grant_and_user_commands_drive_a_running_server(pool: PgPool) {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let port = crate::durability::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = crate::durability::serve(
        &format!("postgres://root@127.0.0.1:5432/{db}"),
        &crate::helpers::repo_path("tools"),
        port,
    );
    crate::durability::wait_ready(&reqwest::Client::new(), &base).await;
    let run = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .env("TOOLGATE_URL", &base)
            .env("TOOLGATE_ADMIN_TOKEN", "kill-test")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(
        &["agent", "create", "helper", "--description", "Helps."],
        "",
    );
    assert!(ok, "{err}");
    assert!(out.contains("\"helper\""), "{out}");
    // A typo is saved but loud; a real group matches tools.
    let (ok, _, err) = run(&["grant", "add", "helper", "serch"], "");
    assert!(ok, "{err}");
    assert!(
        err.contains("matches no tool") && err.contains("search"),
        "{err}"
    );
    let (ok, out, err) = run(&["grant", "add", "helper", "search"], "");
    assert!(ok, "{err}");
    assert!(out.contains("\"matched_tools\": 2"), "{out}");
    let (ok, out, _) = run(&["agent", "show", "helper"], "");
    assert!(ok);
    assert!(out.contains("search__query"), "{out}");
    let (ok, _, err) = run(&["grant", "remove", "helper", "serch"], "");
    assert!(ok, "{err}");
    // Accounts and who may act as the agent.
    let (ok, _, err) = run(
        &["user", "create", "ada", "--role", "viewer"],
        "a long password for ada\n",
    );
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["user", "add-to-agent", "helper", "ada"], "");
    assert!(ok, "{err}");
    let (ok, out, _) = run(&["user", "list"], "");
    assert!(ok && out.contains("\"ada\""), "{out}");
    // Refusals carry the server's message and fail the command.
    let (ok, _, err) = run(&["grant", "add", "nobody", "search"], "");
    assert!(!ok);
    assert!(err.contains("404") && err.contains("nobody"), "{err}");
    // A name is one path segment, never a different route.
    let (ok, _, err) = run(&["agent", "delete", "../users/ada"], "");
    assert!(!ok, "{err}");
    let (ok, out, _) = run(&["user", "list"], "");
    assert!(ok && out.contains("\"ada\""), "{out}");
    let (ok, _, err) = run(&["agent", "delete", "helper"], "");
    assert!(ok, "{err}");
    // Without the token: a clear error, no request.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["agent", "list", "--url", &base])
        .env_remove("TOOLGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin-token"));
}
