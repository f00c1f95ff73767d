//! `idemgate-loadgen`: holds a fixed request rate against one HTTP/1.1
//! endpoint and reports the latency distribution.
//!
//! Why not wrk: wrk is closed-loop (each connection sends its next request
//! when the previous answer arrives), so it measures the most a target can
//! do, and a slow answer delays the requests behind it without counting
//! their wait (coordinated omission). The question "how much latency does
//! the gateway add at 5,000 req/s" needs an open loop: request `i` is due
//! at `start + i / rate` whatever happened before, and its latency runs
//! from that scheduled time, so time spent queued behind a slow answer is
//! counted.
//!
//! Every request carries an `Idempotency-Key`: a new one each time
//! (`--mode fresh`, every request a first execution), or one of `--keys`
//! keys already answered (`--mode replay`; the keys are sent once before
//! the run).
//!
//! # Layout
//! - `target`: the URL, and one HTTP/1.1 connection that reconnects.
//! - `run`: the schedule (a thread that releases requests on time) and
//!   the workers that send them.
//! - `report`: percentiles and rates, as text or one `key=value` line.

mod report;
mod run;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Which keys the requests carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A new key on every request.
    Fresh,
    /// Keys cycled from a fixed set answered before the run.
    Replay,
}

/// How the result is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// For people.
    Text,
    /// One `key=value` line, for scripts.
    Kv,
}

/// Holds a fixed rate of POST requests against one URL and reports latency
/// measured from each request's scheduled send time.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// `http://host:port/path` (plain HTTP/1.1).
    #[arg(long)]
    url: String,
    /// Requests per second to hold.
    #[arg(long)]
    rate: f64,
    /// How long to measure (`30s`, `500ms`, `2m`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Held before measuring, not recorded.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Connections kept open (the most requests in flight at once).
    #[arg(long, default_value_t = 512)]
    connections: usize,
    /// Runtime threads of the generator.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Which keys the requests carry.
    #[arg(long, value_enum, default_value = "fresh")]
    mode: Mode,
    /// Size of the key set in replay mode.
    #[arg(long, default_value_t = 100)]
    keys: usize,
    /// The header the key goes in.
    #[arg(long, default_value = "Idempotency-Key")]
    key_header: String,
    /// Extra request header, `Name: value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Request body.
    #[arg(
        long,
        default_value = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#
    )]
    body: String,
    /// A request still unanswered this long after it was sent counts as an
    /// error.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Name printed with the result.
    #[arg(long, default_value = "run")]
    label: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Also write every recorded request to this file, one line each:
    /// `due_us send_delay_us latency_us status` (µs after the measurement
    /// began; how late a connection sent it; latency from the due time;
    /// status, 0 for no answer), in due order. `bench/tail.py` reads it.
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
}

/// `250ms`, `8s`, `2m`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("`{s}`: use ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        eprintln!("--rate must be a positive number");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(&args)) {
        Ok(result) => {
            if let Some(path) = &args.trace
                && let Err(e) = result.write_trace(path)
            {
                eprintln!("idemgate-loadgen: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            match args.format {
                Format::Text => print!("{}", result.text(&args)),
                Format::Kv => println!("{}", result.kv(&args)),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemgate-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("8s"), Ok(Duration::from_secs(8)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
