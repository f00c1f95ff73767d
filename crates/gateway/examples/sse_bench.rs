//! SSE overhead of the gateway: added time to first event, and the time to
//! replay a stored 500-event stream.
//!
//! Run with: `cargo run --release -p idemgate-gateway --example sse_bench`
//!
//! Everything runs in this process on loopback: the simulated LLM upstream
//! (no first-token delay, no pacing, so the gateway's own cost is what shows),
//! the gateway with an SQLite store in a temp dir, and a streaming client.
//! Each figure is the median and p99 of N runs measured in one go, so the
//! direct and gateway numbers compare as ratios on a noisy machine.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute};
use idemgate_llm_sim::SimConfig;

const RUNS: usize = 60;
const EVENTS: u32 = 500;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn body(tokens: u32) -> String {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{tokens},"messages":[{{"role":"user","content":"bench"}}]}}"#
    )
}

/// Sends one streaming request; returns (time to first byte of the body,
/// time to the end, bytes read).
async fn stream_once(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    tokens: u32,
) -> Result<(Duration, Duration, usize), Error> {
    let started = Instant::now();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench")
        .header("x-sim-tokens", tokens.to_string())
        .body(body(tokens));
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().await?.error_for_status()?;
    let mut stream = resp.bytes_stream();
    let mut first = None;
    let mut bytes = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.is_none() && !chunk.is_empty() {
            first = Some(started.elapsed());
        }
        bytes += chunk.len();
    }
    Ok((first.unwrap_or_default(), started.elapsed(), bytes))
}

fn summary(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (p(0.5), p(0.99))
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let sim = idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::ZERO,
        first_token_delay: Duration::ZERO,
        token_interval: Duration::ZERO,
        completion_tokens: EVENTS,
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let gateway = format!("http://{}", listener.local_addr()?);
    let config = GatewayConfig::from_raw(RawConfig {
        store: Some(format!("sqlite:{}", dir.path().join("bench.db").display())),
        routes: vec![RawRoute {
            prefix: Some("/".into()),
            upstream: Some(sim.url()),
            key: Some(RawKeyMode::Optional),
            on_inflight: Some(RawInflightMode::Attach),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(idemgate_gateway::serve(
        listener,
        admin,
        config,
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::new();
    let direct_url = format!("{}/v1/chat/completions", sim.url());
    let gw_url = format!("{gateway}/v1/chat/completions");

    // Warm up connections and caches.
    for i in 0..5 {
        stream_once(&client, &direct_url, None, 8).await?;
        stream_once(&client, &gw_url, Some(&format!("warm-{i}")), 8).await?;
    }

    // 1. Time to first event, fresh key each time (interleaved runs).
    let (mut direct_ttfe, mut gw_ttfe) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        direct_ttfe.push(stream_once(&client, &direct_url, None, 8).await?.0);
        gw_ttfe.push(
            stream_once(&client, &gw_url, Some(&format!("ttfe-{i}")), 8)
                .await?
                .0,
        );
    }

    // 2. A 500-event stream: generated directly, generated through the
    //    gateway (recorded), and replayed from the store.
    let (mut direct_full, mut fresh_full, mut replay_full) = (Vec::new(), Vec::new(), Vec::new());
    let mut replay_bytes = 0;
    for i in 0..RUNS {
        direct_full.push(stream_once(&client, &direct_url, None, EVENTS).await?.1);
        let key = format!("full-{i}");
        let (_, fresh, fresh_bytes) = stream_once(&client, &gw_url, Some(&key), EVENTS).await?;
        fresh_full.push(fresh);
        let (_, replay, bytes) = stream_once(&client, &gw_url, Some(&key), EVENTS).await?;
        if bytes != fresh_bytes {
            return Err(
                format!("replay of {key} has {bytes} bytes, the original {fresh_bytes}").into(),
            );
        }
        replay_bytes = bytes;
        replay_full.push(replay);
    }
    let executions = sim.stats().executions;

    let (d50, d99) = summary(direct_ttfe);
    let (g50, g99) = summary(gw_ttfe);
    println!("time to first event ({RUNS} runs, fresh keys; upstream first-token delay 0)");
    println!("  direct            p50 {}  p99 {}", ms(d50), ms(d99));
    println!("  through idemgate  p50 {}  p99 {}", ms(g50), ms(g99));
    println!("  added             p50 {}", ms(g50.saturating_sub(d50)));
    let (a50, a99) = summary(direct_full);
    let (f50, f99) = summary(fresh_full);
    let (r50, r99) = summary(replay_full);
    println!("{EVENTS}-event stream ({replay_bytes} bytes), {RUNS} runs");
    println!(
        "  generated directly            p50 {}  p99 {}",
        ms(a50),
        ms(a99)
    );
    println!(
        "  generated through idemgate    p50 {}  p99 {}",
        ms(f50),
        ms(f99)
    );
    println!(
        "  replayed by idemgate          p50 {}  p99 {}",
        ms(r50),
        ms(r99)
    );
    println!("upstream executions: {executions} (replays made none)");

    let _ = stop.send(());
    server.await??;
    Ok(())
}
