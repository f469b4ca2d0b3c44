//! Runs the subcommands.

use std::process::ExitCode;

use crate::config::{
    AdminCommand, AuditCommand, Cli, ClientCommand, Command, KeysCommand, PolicyArgs, PolicyCommand,
};
use crate::pool::loader::{LoaderSettings, load_pool};
use crate::{app, db, oauth, policy, service, telemetry};

pub async fn run(cli: Cli) -> ExitCode {
    telemetry::init(cli.log_format);
    match dispatch(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            app::serve(*args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(db_args) => {
            // With `serve`, the only command that may create the database.
            let pool = db::connect(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command } => policy_command(command).await,
        Command::Client { command } => client_command(command).await,
        Command::Audit { command } => audit_command(command).await,
        Command::Admin { command } => admin_command(command).await,
        Command::Keys {
            command: KeysCommand::Rotate { db: db_args },
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            let kid = oauth::rotate_key(&pool, "cli").await?;
            println!("{}", serde_json::json!({"kid": kid}));
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
    if !report.applied {
        println!("(dry run: nothing was changed)");
    }
    Ok(ExitCode::SUCCESS)
}

async fn client_command(command: ClientCommand) -> anyhow::Result<ExitCode> {
    match command {
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
            let client = service::create_client(&pool, "cli", &agent, &description, jwks).await?;
            println!("{}", serde_json::to_string_pretty(&client)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::List { db: db_args, agent } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let clients = db::policy::clients(&pool, agent.as_deref()).await?;
            println!("{}", serde_json::to_string_pretty(&clients)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::Delete {
            db: db_args,
            client_id,
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let mut tx = pool.begin().await?;
            let existed = db::policy::delete_client(&mut tx, "cli", &client_id).await?;
            tx.commit().await?;
            if existed {
                println!("deleted {client_id}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("no client {client_id}");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

async fn audit_command(command: AuditCommand) -> anyhow::Result<ExitCode> {
    use futures::StreamExt;
    use std::io::Write;

    use crate::audit::chain::{ChainedEvent, Verifier};
    use crate::audit::export::{self, Format};
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
        } => {
            let pool = db::connect_existing(&db_args.database_url, 2).await?;
            let filter = db::audit::AuditFilter {
                since,
                until,
                agent,
                tool,
                event_type,
                outcome,
            };
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            if format == Format::Csv {
                out.write_all(&export::csv_header())?;
            }
            let mut rows = std::pin::pin!(db::audit::stream(pool, filter));
            while let Some(row) = rows.next().await {
                let row = row?;
                out.write_all(&match format {
                    Format::Csv => export::csv_line(&row),
                    Format::Jsonl => export::jsonl_line(&row),
                })?;
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify { db: db_args, file } => {
            let mut verifier = Verifier::default();
            let result = match file {
                Some(path) => {
                    use std::io::BufRead;
                    let reader = std::io::BufReader::new(std::fs::File::open(&path)?);
                    // An export is grouped by chain and ordered by chain_seq, like the database walk.
                    let mut result = Ok(());
                    for (n, line) in reader.lines().enumerate() {
                        let line = line?;
                        if line.trim().is_empty() {
                            continue;
                        }
                        let row: ChainedEvent = serde_json::from_str(&line).map_err(|e| {
                            anyhow::anyhow!(
                                "{}:{}: not an audit record: {e}",
                                path.display(),
                                n + 1
                            )
                        })?;
                        if let Err(b) = verifier.check(&row) {
                            result = Err(b);
                            break;
                        }
                    }
                    result
                }
                None => {
                    let pool = db::connect_existing(&db_args.database_url, 2).await?;
                    let mut rows =
                        std::pin::pin!(db::audit::stream(pool, db::audit::AuditFilter::default()));
                    let mut result = Ok(());
                    while let Some(row) = rows.next().await {
                        if let Err(b) = verifier.check(&row?) {
                            result = Err(b);
                            break;
                        }
                    }
                    result
                }
            };
            match result {
                Ok(()) => {
                    println!("ok: {} rows, every hash chain intact", verifier.rows);
                    for c in &verifier.trimmed_chains {
                        println!(
                            "note: chain {c} starts after its first rows (dropped by retention)"
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(b) => {
                    println!(
                        "BROKEN: chain {} at chain_seq {}{}: {}",
                        b.chain,
                        b.chain_seq,
                        b.id.map(|i| format!(" (id {i})")).unwrap_or_default(),
                        b.reason
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
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
            crate::web::users::create_user(&pool, "cli", &username, password, &role).await?;
            println!(
                "{}",
                serde_json::json!({"username": username, "role": role})
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
