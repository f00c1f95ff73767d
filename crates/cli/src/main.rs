//! `idemgate`: the command line of the idempotency gateway.

use clap::{Parser, Subcommand};

/// Makes retries safe: run each operation at most once per idempotency key.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the seed's retry-window rule for a client retry policy.
    Window {
        /// Total attempts, the first included.
        #[arg(long, default_value_t = 3)]
        attempts: u32,
        /// Client timeout per attempt, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Window {
            attempts,
            timeout_secs,
        } => {
            let policy = idemgate_engine::RetryPolicy {
                attempts,
                attempt_timeout: std::time::Duration::from_secs(timeout_secs),
                ..Default::default()
            };
            println!(
                "longest retry window {:?}; done_ttl must be at least {:?}",
                policy.longest_window(),
                policy.min_done_ttl()
            );
        }
    }
    Ok(())
}
