use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    toolgate::cli::run(toolgate::config::Cli::parse()).await
}
