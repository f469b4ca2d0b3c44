//! Runs the subcommands.

use std::process::ExitCode;

use crate::config::{
    AdminCommand, AuditCommand, Cli, ClientCommand, Command, KeysCommand, PolicyArgs,
    PolicyCommand, ToolsCommand,
};
use crate::pool::loader::{LoaderSettings, load_pool};
use crate::{app, db, policy, service, telemetry};

pub async fn run(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Serve(_)) {
        restore_default_sigpipe();
    }
    let telemetry = telemetry::init(cli.log_format);
    let code = match dispatch(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // The batch exporter runs on its own thread and blocks while it flushes.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    code
}

/// A command's output piped into `head` must end the command quietly, as it does `ls` or
/// `grep`. Rust ignores SIGPIPE, so `println!` to a closed pipe panics instead: restore the
/// default for every command but `serve`, whose sockets must never kill it. Sockets are not
/// affected either way: the standard library writes to them with `MSG_NOSIGNAL`.
#[allow(unsafe_code)]
fn restore_default_sigpipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: called before any thread of ours could depend on the old disposition, and
    // SIG_DFL installs no handler code.
    if let Err(e) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        tracing::debug!(error = %e, "cannot restore the default SIGPIPE disposition");
    }
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            app::serve(*args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(args) => {
            let db_args = args.db;
            // With `serve`, the only command that may create the database.
            let pool = db::connect(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            println!("migrations applied");
            if let Some(role) = &args.serving_role {
                db::roles::grant_serving(&pool, role).await?;
                println!(
                    "granted role {role} what serving needs (the audit log: append and read only)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command } => policy_command(command).await,
        Command::Client { command } => client_command(command).await,
        Command::Audit { command } => audit_command(command).await,
        Command::Admin { command } => admin_command(command).await,
        Command::Tools { command } => tools_command(command).await,
        Command::Agent { api, command } => crate::cli_api::agent(api, command).await,
        Command::Grant { api, command } => crate::cli_api::grant(api, command).await,
        Command::User { api, command } => crate::cli_api::user(api, command).await,
        Command::Secrets { command } => secrets_command(command).await,
        Command::Keys {
            command: KeysCommand::Rotate { db: db_args },
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let kid = service::keys::rotate(&pool, "cli").await?;
            println!("{}", serde_json::json!({"kid": kid}));
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn secrets_command(command: crate::config::SecretsCommand) -> anyhow::Result<ExitCode> {
    use crate::config::SecretsCommand;
    match command {
        SecretsCommand::Keygen { id } => {
            // Checked as the server will parse it.
            let key = crate::credentials::KeyRing::generate(&id)?;
            crate::credentials::KeyRing::parse(std::slice::from_ref(&key))
                .map_err(|e| anyhow::anyhow!(e))?;
            println!("{key}");
            Ok(ExitCode::SUCCESS)
        }
        SecretsCommand::RotateKek { db: db_args, keys } => {
            let ring = keys.ring()?;
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let done = service::credentials::rotate_kek(&pool, &ring, "cli").await?;
            println!("{}", serde_json::to_string(&done)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn policy_command(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Check(args) => {
            // Checking needs only the folders, not a database.
            let catalog = load_pool(&args.tools_dir, None, &LoaderSettings::default());
            for e in catalog.load_errors() {
                eprintln!("warning: tools/{e}");
            }
            let (policies, mut problems) = policy::files::read_dir(&args.dir);
            problems.extend(policy::files::check(&policies, &catalog));
            if problems.is_empty() {
                println!(
                    "{}: {} agent(s), every grant matches at least one tool",
                    args.dir.display(),
                    policies.agents.len()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                for p in &problems {
                    println!("{p}");
                }
                eprintln!("{} problem(s)", problems.len());
                Ok(ExitCode::FAILURE)
            }
        }
        PolicyCommand::Apply(args) => apply(args).await,
        PolicyCommand::Export(args) => {
            let pool = db::connect_existing(&args.db.database_url, 2).await?;
            db::migrate(&pool, &args.db.database_url).await?;
            let n = policy::files::export(&pool, &args.dir).await?;
            println!("exported {n} agent(s) to {}", args.dir.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn apply(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    let pool = db::connect_existing(&args.db.database_url, 2).await?;
    db::migrate(&pool, &args.db.database_url).await?;
    let catalog = load_pool(&args.tools_dir, None, &LoaderSettings::default());
    let report = policy::files::apply_dir(
        &pool,
        &args.dir,
        &catalog,
        "cli:policy-apply",
        args.dry_run,
        args.strict,
        args.prune,
    )
    .await?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if report.changes.is_empty() {
        println!("no changes");
    }
    for c in &report.changes {
        println!("{c}");
    }
    for r in &report.revocations {
        println!("{r}");
    }
    for k in &report.kept {
        println!("{k}");
    }
    if !report.applied {
        println!("(dry run: nothing was changed)");
    }
    // The rest applied, but the database holds what the files do not: a distinct code, so
    // that a pipeline notices the drift and can still tell it from a failure (1).
    if report.kept.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(3))
    }
}

async fn client_command(command: ClientCommand) -> anyhow::Result<ExitCode> {
    match command {
        ClientCommand::RegisterPublic {
            db: db_args,
            client_id,
            name,
            redirect_uris,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            service::clients::put_public(&pool, "cli", &client_id, &name, &redirect_uris).await?;
            println!(
                "{}",
                serde_json::json!({"client_id": client_id, "client_name": name, "redirect_uris": redirect_uris})
            );
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::DeletePublic {
            db: db_args,
            client_id,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            service::clients::delete_public(&pool, "cli", &client_id).await?;
            println!("deleted public client {client_id}");
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::ListPublic { db: db_args } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let clients = service::clients::list_public(&pool).await?;
            println!("{}", serde_json::to_string_pretty(&clients)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::Create {
            db: db_args,
            agent,
            description,
            jwks_file,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let jwks = match jwks_file {
                Some(p) => Some(serde_json::from_str(&std::fs::read_to_string(&p)?)?),
                None => None,
            };
            let client = service::clients::create(&pool, "cli", &agent, &description, jwks).await?;
            println!("{}", serde_json::to_string_pretty(&client)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::List { db: db_args, agent } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let clients = service::clients::list(&pool, agent.as_deref()).await?;
            println!("{}", serde_json::to_string_pretty(&clients)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::Delete {
            db: db_args,
            client_id,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            match service::clients::delete(&pool, "cli", &client_id).await {
                Ok(()) => {
                    println!("deleted {client_id}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(service::ServiceError::NotFound(_)) => {
                    eprintln!("no client {client_id}");
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

async fn audit_command(command: AuditCommand) -> anyhow::Result<ExitCode> {
    use futures::StreamExt;
    use std::io::Write;

    use crate::audit::checkpoint::{self, PublicKey, SigningKey};
    use crate::audit::export;
    use crate::db::audit::Snapshot;
    match command {
        AuditCommand::Export {
            db: db_args,
            format,
            since,
            until,
            agent,
            tool,
            event_type,
            outcome,
            person,
            client_id,
            after_id,
            min_latency_ms,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let filter = db::audit::AuditFilter {
                since,
                until,
                agent,
                tool,
                event_type,
                outcome,
                person,
                client_id,
                after_id,
                min_latency_ms,
                after_tx: None,
            };
            let reader = service::audit_access::Reader {
                who: "cli",
                channel: service::audit_access::Channel::Cli,
            };
            let chunks = service::audit_access::export(&pool, reader, format, filter).await?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut chunks = std::pin::pin!(chunks);
            while let Some(chunk) = chunks.next().await {
                out.write_all(&chunk?)?;
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            db: db_args,
            file,
            public_key,
            checkpoints,
        } => {
            let key = public_key.as_deref().map(PublicKey::load).transpose()?;
            let mut extra = match &checkpoints {
                Some(path) => read_checkpoints(path)?,
                None => Vec::new(),
            };
            let (ok, lines) = match file {
                Some(path) => verify_file(&path, &mut extra, key.as_ref())?,
                None => {
                    let pool = db::connect_existing(&db_args.database_url, 2).await?;
                    let mut items = std::pin::pin!(db::audit::snapshot(
                        pool,
                        db::audit::AuditFilter::default()
                    ));
                    let mut run: Option<export::Verification> = None;
                    while let Some(item) = items.next().await {
                        match item? {
                            Snapshot::Expect(e) => {
                                let (expect, mut stored) = *e;
                                stored.append(&mut extra);
                                run = Some(export::Verification::new(
                                    Some(expect),
                                    None,
                                    &dedup(stored),
                                    key.as_ref(),
                                ));
                            }
                            Snapshot::Cursor(_) => {}
                            Snapshot::Row(row) => {
                                if let Some(r) = run.as_mut() {
                                    r.row(&row);
                                }
                            }
                        }
                    }
                    run.ok_or_else(|| anyhow::anyhow!("the database returned nothing to verify"))?
                        .finish(None, false)
                }
            };
            for l in &lines {
                println!("{l}");
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        AuditCommand::Keygen { out } => {
            let mut public = out.clone().into_os_string();
            public.push(".pub");
            let public = std::path::PathBuf::from(public);
            let id = SigningKey::generate(&out, &public)?;
            println!(
                "{}",
                serde_json::json!({"key_id": id, "private_key": out, "public_key": public})
            );
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Checkpoint { db: db_args, key } => {
            let key = SigningKey::load(&key)?;
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let c = checkpoint::publish(&pool, &key).await?;
            println!("{}", serde_json::to_string(&c)?);
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Checkpoints { db: db_args, after } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let mut conn = pool.acquire().await?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            db::checkpoints::each_checkpoint::<anyhow::Error>(&mut conn, after, |c| {
                serde_json::to_writer(&mut out, &c)?;
                out.write_all(b"\n")?;
                Ok(())
            })
            .await?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Retention { db: db_args, days } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let dropped = crate::audit::apply_retention(&pool, days).await?;
            println!("{}", serde_json::json!({"dropped_partitions": dropped}));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Checkpoints in JSONL, as `audit checkpoints` prints them: the ones a verifier needs (a
/// copy kept for years holds one every few seconds of activity).
fn read_checkpoints(
    path: &std::path::Path,
) -> anyhow::Result<Vec<crate::audit::checkpoint::SignedCheckpoint>> {
    use std::io::BufRead;
    let file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut needed = crate::audit::checkpoint::Needed::default();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        needed.offer(
            serde_json::from_str(&line).map_err(|e| {
                anyhow::anyhow!("{}:{}: not a checkpoint: {e}", path.display(), n + 1)
            })?,
        );
    }
    Ok(needed.into_vec())
}

/// The checkpoints of two sources (the log's and a copy kept elsewhere), each once, and of
/// those only the ones a verifier needs.
fn dedup(
    mut cs: Vec<crate::audit::checkpoint::SignedCheckpoint>,
) -> Vec<crate::audit::checkpoint::SignedCheckpoint> {
    let mut seen = std::collections::HashSet::new();
    cs.retain(|c| seen.insert(c.signature.clone()));
    cs.into_iter()
        .collect::<crate::audit::checkpoint::Needed>()
        .into_vec()
}

/// Verifies a JSONL export offline: its header (filter, heads, ledger, checkpoints), rows
/// grouped by chain in chain_seq order like the database walk, and its closing line.
fn verify_file(
    path: &std::path::Path,
    extra: &mut Vec<crate::audit::checkpoint::SignedCheckpoint>,
    key: Option<&crate::audit::checkpoint::PublicKey>,
) -> anyhow::Result<(bool, Vec<String>)> {
    use std::io::BufRead;

    use crate::audit::chain::ChainedEvent;
    use crate::audit::export::{ExportHeader, ExportTrailer, Verification};
    let reader = std::io::BufReader::new(
        std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?,
    );
    let mut run: Option<Verification> = None;
    let mut trailer: Option<ExportTrailer> = None;
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |e: serde_json::Error| {
            anyhow::anyhow!("{}:{}: not an audit record: {e}", path.display(), n + 1)
        };
        let value: serde_json::Value = serde_json::from_str(&line).map_err(bad)?;
        if trailer.is_some() {
            anyhow::bail!(
                "{}:{}: a line after the export's closing line",
                path.display(),
                n + 1
            );
        }
        if value.get("toolgate_audit_export").is_some() {
            if n != 0 || run.is_some() {
                anyhow::bail!(
                    "{}:{}: an export header in the middle",
                    path.display(),
                    n + 1
                );
            }
            let h: ExportHeader = serde_json::from_value(value).map_err(bad)?;
            let mut cs = h.checkpoints;
            cs.append(extra);
            run = Some(Verification::new(Some(h.expect), h.filter, &dedup(cs), key));
        } else if value.get("toolgate_audit_export_end").is_some() {
            trailer = Some(serde_json::from_value(value).map_err(bad)?);
        } else {
            let row: ChainedEvent = crate::audit::siem::parse_row(value).map_err(bad)?;
            run.get_or_insert_with(|| {
                Verification::new(None, None, &dedup(std::mem::take(extra)), key)
            })
            .row(&row);
        }
    }
    let run = run.unwrap_or_else(|| Verification::new(None, None, &[], key));
    Ok(run.finish(trailer.as_ref(), true))
}

async fn tools_command(command: ToolsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ToolsCommand::Pending { db: db_args, json } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let pending = service::pins::held(&pool).await?;
            if json {
                let rows: Vec<serde_json::Value> = pending
                    .iter()
                    .map(|p| {
                        let mut v = serde_json::json!(p);
                        v["diff"] = crate::pool::definition::diff(
                            p.previous_definition.as_ref(),
                            &p.definition,
                        )
                        .into();
                        v
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(ExitCode::SUCCESS);
            }
            if pending.is_empty() {
                println!("no tool is held");
            }
            for p in &pending {
                let status = match &p.rejected_by {
                    Some(by) => format!("rejected by {by}"),
                    None => "pending".to_owned(),
                };
                println!(
                    "{} ({status}, {} change, first seen {})",
                    p.name,
                    p.source,
                    p.first_seen.format("%Y-%m-%d %H:%M:%S UTC")
                );
                println!(
                    "  approved: {}",
                    p.previous_hash.as_deref().unwrap_or("none (a new tool)")
                );
                println!("  held:     {}", p.hash);
                let diff =
                    crate::pool::definition::diff(p.previous_definition.as_ref(), &p.definition);
                if diff.is_empty() {
                    println!("  (same definition: the script or App file behind it changed)");
                }
                // JSON escapes control characters, so outside text cannot drive the terminal.
                for line in diff.lines() {
                    println!("  {line}");
                }
                println!();
            }
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Approve {
            db: db_args,
            name,
            hash,
        } => decide_tool(&db_args, &name, hash.as_deref(), true).await,
        ToolsCommand::Reject {
            db: db_args,
            name,
            hash,
        } => decide_tool(&db_args, &name, hash.as_deref(), false).await,
    }
}

/// `tools approve` (or `reject`) of the held definition of `name` with `hash`, by default its
/// newest: the command line has no catalog to say which one is served.
async fn decide_tool(
    db_args: &crate::config::DbArgs,
    name: &str,
    hash: Option<&str>,
    approve: bool,
) -> anyhow::Result<ExitCode> {
    let pool = db::connect_existing(&db_args.database_url, 2).await?;
    db::migrate(&pool, &db_args.database_url).await?;
    let verdict = if approve {
        db::pins::Verdict::Approve
    } else {
        db::pins::Verdict::Reject
    };
    let decided = match service::pins::decide(&pool, "cli", name, hash, verdict).await {
        Ok(d) => Some(d),
        Err(service::ServiceError::NotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    match decided {
        Some(d) => {
            let key = if approve { "approved" } else { "rejected" };
            println!("{}", serde_json::json!({ key: d }));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("no held definition of tool {name}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn admin_command(command: AdminCommand) -> anyhow::Result<ExitCode> {
    match command {
        AdminCommand::CreateUser {
            db: db_args,
            username,
            role,
        } => {
            use std::io::{BufRead, IsTerminal};
            if std::io::stdin().is_terminal() {
                eprintln!(
                    "password for {username} (one line; it is echoed, so prefer piping it in):"
                );
            }
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            let password = line.trim_end_matches(['\r', '\n']);
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            crate::service::accounts::create(&pool, "cli", &username, password, &role).await?;
            println!(
                "{}",
                serde_json::json!({"username": username, "role": role})
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
