use std::time::Duration;

use clap::Parser;

fn main() -> std::process::ExitCode {
    toolgate::memory::return_large_allocations();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(toolgate::cli::run(toolgate::config::Cli::parse()));
    // Work abandoned at the drain deadline (a blocking task, say) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}
