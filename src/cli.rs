//! Runs the subcommands.

use std::process::ExitCode;

use crate::config::{Cli, ClientCommand, Command, KeysCommand, PolicyArgs, PolicyCommand};
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
            let pool = db::connect(&db_args.database_url, 2).await?;
            db::migrate(&pool, &db_args.database_url).await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command } => policy_command(command).await,
        Command::Client { command } => client_command(command).await,
        Command::Keys {
            command: KeysCommand::Rotate { db: db_args },
        } => {
            let pool = db::connect(&db_args.database_url, 2).await?;
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
            let pool = db::connect(&args.db.database_url, 2).await?;
            db::migrate(&pool, &args.db.database_url).await?;
            let n = policy::files::export(&pool, &args.dir).await?;
            println!("exported {n} agent(s) to {}", args.dir.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn apply(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&args.db.database_url, 2).await?;
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
            let pool = db::connect(&db_args.database_url, 2).await?;
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
            let pool = db::connect(&db_args.database_url, 2).await?;
            let clients = db::policy::clients(&pool, agent.as_deref()).await?;
            println!("{}", serde_json::to_string_pretty(&clients)?);
            Ok(ExitCode::SUCCESS)
        }
        ClientCommand::Delete {
            db: db_args,
            client_id,
        } => {
            let pool = db::connect(&db_args.database_url, 2).await?;
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
