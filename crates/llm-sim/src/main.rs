//! `idemgate-llm-sim`: run the simulated LLM provider until Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idemgate_llm_sim::{SimConfig, spawn_on};

/// A simulated OpenAI / Anthropic upstream that counts executions.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Time to produce a whole non-streaming response.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
    /// Time to the first streamed token.
    #[arg(long, default_value_t = 100)]
    first_token_ms: u64,
    /// Time between streamed tokens.
    #[arg(long, default_value_t = 5)]
    token_interval_ms: u64,
    /// Tokens per response.
    #[arg(long, default_value_t = 24)]
    tokens: u32,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = SimConfig {
        latency: Duration::from_millis(args.latency_ms),
        first_token_delay: Duration::from_millis(args.first_token_ms),
        token_interval: Duration::from_millis(args.token_interval_ms),
        completion_tokens: args.tokens,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let handle = match spawn_on(listener, config).await {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", handle.url());
    let result = tokio::signal::ctrl_c().await;
    handle.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot wait for Ctrl-C: {e}");
            ExitCode::FAILURE
        }
    }
}
