//! The timeout-and-retry story, with the Rust client.
//!
//! Run with: cargo run -p idemgate-client --example timeout_retry
//!
//! A generation takes 1.2 s; the client's attempt timeout is 0.3 s, so every
//! attempt times out while the model is still working. Everything runs in
//! this process on loopback: the simulated LLM (which bills every
//! generation it runs, even for a client that left) and an idemgate gateway
//! with an in-memory store.
//!
//! - Straight to the LLM, each retry starts a new generation: every attempt
//!   is billed and none is answered.
//! - Through idemgate, the same client and the same retries: every attempt
//!   carries the operation's one key, the gateway keeps the one generation
//!   running, and a retry gets its stored answer. Once.

use std::error::Error;
use std::time::Duration;

use idemgate_client::{Client, ClientAttempt, Delay, DelaySource};
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawInflightMode, RawRoute};
use idemgate_llm_sim::{SimConfig, SimHandle};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const GENERATION_MS: &str = "1200";
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let sim = idemgate_llm_sim::spawn(SimConfig::default()).await?;
    println!(
        "A generation takes {GENERATION_MS} ms; the client gives up on an attempt after {} ms and retries.\n",
        ATTEMPT_TIMEOUT.as_millis()
    );

    // Without idemgate: the client talks to the LLM directly.
    println!("Without idemgate (client -> LLM):");
    let direct = client(&sim.url(), 4)?;
    let request = direct
        .post("/v1/chat/completions")
        .header("x-sim-latency-ms", GENERATION_MS)
        .json(&body());
    let key = request.key().clone();
    match request.send().await {
        Ok(r) => print_attempts(r.attempts()),
        Err(e) => {
            print_attempts(e.attempts());
            println!("  {e}");
        }
    }
    // The abandoned generations run to their end, and are billed.
    settle(&sim).await;
    report(&sim);
    println!(
        "  every attempt sent key {key}; the provider ran it {} times regardless",
        sim.executions_for(key.as_str())
    );
    sim.reset();

    // Through idemgate: the same client, pointed at the gateway.
    let (base, stop, gateway) = gateway(&sim.url()).await?;
    println!("\nThrough idemgate (client -> gateway -> LLM):");
    let through = client(&base, 10)?;
    let request = through
        .post("/v1/chat/completions")
        .header("x-sim-latency-ms", GENERATION_MS)
        .json(&body());
    println!(
        "  key: {} (minted once, before the first attempt)",
        request.key()
    );
    let response = request.send().await?;
    print_attempts(response.attempts());
    println!(
        "  answered: {}, Idempotent-Replayed: {}",
        response.status(),
        response.replayed()
    );
    settle(&sim).await;
    report(&sim);

    let _ = stop.send(());
    gateway.await??;
    sim.shutdown().await;
    Ok(())
}

fn client(base: &str, attempts: u32) -> Result<Client, idemgate_client::Error> {
    Client::builder(base)
        .bearer_auth("sk-local")
        .attempt_timeout(ATTEMPT_TIMEOUT)
        .attempts(attempts)
        .backoff(Duration::from_millis(100), Duration::from_millis(400))
        .build()
}

fn body() -> serde_json::Value {
    serde_json::json!({
        "model": "sim-gpt-small",
        "messages": [{"role": "user", "content": "write the quarterly report"}],
    })
}

fn print_attempts(attempts: &[ClientAttempt]) {
    for a in attempts {
        match a.delay {
            Some(Delay {
                duration, source, ..
            }) => println!(
                "  attempt {}: {}; retry in {} ms ({})",
                a.number,
                a.end,
                duration.as_millis(),
                match source {
                    DelaySource::Backoff => "backoff",
                    _ => "server's delay",
                }
            ),
            None => println!("  attempt {}: {}", a.number, a.end),
        }
    }
}

/// Waits (bounded) until every generation started has run to its end and
/// been billed: the simulated provider, like a real one, finishes a
/// non-streaming generation whose client has left.
async fn settle(sim: &SimHandle) {
    for _ in 0..200 {
        let s = sim.stats();
        if s.completed >= s.executions {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn report(sim: &SimHandle) {
    let s = sim.stats();
    println!(
        "  upstream executions: {}   billed tokens: {} ({} prompt + {} completion)",
        s.executions,
        s.prompt_tokens_billed + s.completion_tokens_billed,
        s.prompt_tokens_billed,
        s.completion_tokens_billed
    );
}

type Serving = tokio::task::JoinHandle<Result<(), idemgate_gateway::GatewayError>>;

/// A gateway on a free loopback port: in-memory store, `/v1` to the LLM, a
/// duplicate of a request in flight waits for its result.
async fn gateway(upstream: &str) -> Result<(String, oneshot::Sender<()>, Serving), Box<dyn Error>> {
    let config = GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        routes: vec![RawRoute {
            prefix: Some("/v1".into()),
            upstream: Some(upstream.into()),
            on_inflight: Some(RawInflightMode::Wait),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let admin = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(idemgate_gateway::serve(
        listener,
        admin,
        config,
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((base, stop, task))
}
