//! What one upstream request costs the gateway's process, by HTTP client.
//!
//! The gateway sends every first execution upstream. This sends the same
//! request (a chat completion's POST with its headers, the answer read to
//! its end) in a closed loop from `--tasks` tasks on a two-worker runtime,
//! either through reqwest, configured as the gateway once configured it,
//! or through the parts the gateway now uses (hyper-util's pooled client
//! and tower-http's decompression, `crates/gateway/src/proxy/client.rs`),
//! and prints the rate and this process's CPU time per request
//! (`getrusage`). Point it at any fast upstream, such as nginx `return 200`
//! (BENCHMARKS.md, "The upstream client").

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::{BoxError, Service};
use tower_http::decompression::Decompression;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Which {
    Reqwest,
    Hyper,
}

#[derive(Parser, Debug)]
struct Args {
    /// The client to measure.
    #[arg(long, value_enum)]
    client: Which,
    /// The upstream URL (http only).
    #[arg(long)]
    url: String,
    /// Requests in all.
    #[arg(long, default_value_t = 200_000)]
    requests: usize,
    /// Concurrent tasks (connections).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
}

/// User plus system CPU time of this process.
fn cpu_time() -> Result<Duration, BoxError> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses.
    let rest = stat
        .rsplit_once(')')
        .ok_or("no command name in /proc/self/stat")?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).ok_or("no utime")?.parse::<u64>()?
        + fields.get(12).ok_or("no stime")?.parse::<u64>()?;
    // USER_HZ is 100 on Linux.
    Ok(Duration::from_millis(ticks * 10))
}

fn headers(i: usize) -> Result<http::HeaderMap, BoxError> {
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    h.insert(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer bench"),
    );
    h.insert(
        "idempotency-key",
        http::HeaderValue::from_str(&format!("key-{i}"))?,
    );
    Ok(h)
}

async fn with_reqwest(url: String, n: usize) -> Result<(), BoxError> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .build()?;
    for i in 0..n {
        let request = client
            .request(http::Method::POST, reqwest::Url::parse(&url)?)
            .headers(headers(i)?)
            .body(Bytes::from_static(BODY))
            .build()?;
        let mut body = client.execute(request).await?.bytes_stream();
        while let Some(chunk) = body.next().await {
            chunk?;
        }
    }
    Ok(())
}

async fn with_hyper(
    client: Client<HttpConnector, Full<Bytes>>,
    url: http::Uri,
    n: usize,
) -> Result<(), BoxError> {
    for i in 0..n {
        let mut request = http::Request::new(Full::new(Bytes::from_static(BODY)));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = url.clone();
        *request.headers_mut() = headers(i)?;
        let response = Decompression::new(&client).call(request).await?;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            frame?;
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let per_task = args.requests / args.tasks.max(1);
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let hyper_client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_timer(TokioTimer::new())
        .build(http);
    let uri: http::Uri = args.url.parse()?;
    let (started, cpu_before) = (Instant::now(), cpu_time()?);
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        tasks.push(match args.client {
            Which::Reqwest => tokio::spawn(with_reqwest(args.url.clone(), per_task)),
            Which::Hyper => tokio::spawn(with_hyper(hyper_client.clone(), uri.clone(), per_task)),
        });
    }
    for task in tasks {
        task.await??;
    }
    let (elapsed, cpu) = (started.elapsed(), cpu_time()? - cpu_before);
    let sent = per_task * args.tasks;
    println!(
        "{:?}: {sent} requests, {:.0} req/s, {:.1} µs of CPU per request",
        args.client,
        sent as f64 / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / sent as f64
    );
    Ok(())
}
