//! One run: the schedule releases request `i` at `start + i / rate` from a
//! thread of its own (sub-millisecond sleeps, which tokio's 1 ms timer
//! cannot give), and workers, one per connection, send whatever is due.
//!
//! A request's latency is measured from its scheduled time, not from when
//! a worker got to it: when every connection is busy the requests that
//! wait are late, and the wait is part of what they measured. Requests
//! due during the warm-up are sent but not recorded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::Full;
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use tokio::sync::{Mutex, mpsc};

use crate::report::Outcome;
use crate::target::{Answer, Conn, LoadError, Target};
use crate::{Args, Mode};

/// A request due at `due`.
#[derive(Debug, Clone, Copy)]
struct Job {
    seq: u64,
    due: Instant,
}

/// What every request shares; only the key changes.
#[derive(Debug, Clone)]
struct Template {
    target: Target,
    headers: Vec<(HeaderName, HeaderValue)>,
    key_header: HeaderName,
    body: Bytes,
    mode: Mode,
    keys: u64,
    /// Fresh keys start with it, so two runs never share a key.
    prefix: String,
}

impl Template {
    fn new(target: Target, args: &Args) -> Result<Self, LoadError> {
        let bad =
            |what: &str, e: &dyn std::fmt::Display| LoadError::Request(format!("{what}: {e}"));
        let mut headers = Vec::new();
        let mut typed = false;
        for h in &args.headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| LoadError::Request(format!("header {h:?} is not `Name: value`")))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| bad(h, &e))?;
            let value = HeaderValue::from_str(value.trim()).map_err(|e| bad(h, &e))?;
            typed |= name == CONTENT_TYPE;
            headers.push((name, value));
        }
        if !typed {
            headers.push((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        }
        let host = HeaderValue::from_str(&target.authority).map_err(|e| bad("host", &e))?;
        headers.push((HOST, host));
        let key_header = HeaderName::from_bytes(args.key_header.as_bytes())
            .map_err(|e| bad("key header", &e))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Ok(Self {
            target,
            headers,
            key_header,
            body: Bytes::from(args.body.clone()),
            mode: args.mode,
            keys: u64::try_from(args.keys.max(1)).unwrap_or(u64::MAX),
            prefix: format!("lg{:x}{nanos:x}", std::process::id()),
        })
    }

    fn key(&self, seq: u64) -> String {
        match self.mode {
            Mode::Fresh => format!("{}-{seq}", self.prefix),
            Mode::Replay => format!("replay-{}", seq % self.keys),
        }
    }

    fn request(&self, seq: u64) -> Result<Request<Full<Bytes>>, LoadError> {
        let mut b = Request::post(self.target.path.as_str());
        for (name, value) in &self.headers {
            b = b.header(name, value);
        }
        b.header(&self.key_header, self.key(seq))
            .body(Full::new(self.body.clone()))
            .map_err(|e| LoadError::Request(e.to_string()))
    }
}

/// One recorded request, for `--trace`: when it was due (µs after the
/// measurement began), how late a worker sent it, its latency from the due
/// time (µs), and its status (0: no answer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Traced {
    pub(crate) due_us: u64,
    pub(crate) send_delay_us: u64,
    pub(crate) latency_us: u64,
    pub(crate) status: u16,
}

/// What one worker saw.
struct Tally {
    hist: Histogram<u64>,
    /// Every recorded request, when tracing.
    trace: Option<Vec<Traced>>,
    completed: u64,
    non_2xx: u64,
    errors: u64,
    unsent: u64,
    first_done: Option<Instant>,
    last_done: Option<Instant>,
}

impl Tally {
    fn new(tracing: bool) -> Self {
        Self {
            trace: tracing.then(Vec::new),
            // 1 µs to 1 h, 3 significant digits: constant, valid bounds.
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("constant histogram bounds are valid"),
            completed: 0,
            non_2xx: 0,
            errors: 0,
            unsent: 0,
            first_done: None,
            last_done: None,
        }
    }

    fn merge(&mut self, other: Self) {
        let _ = self.hist.add(&other.hist);
        if let (Some(mine), Some(theirs)) = (&mut self.trace, other.trace) {
            mine.extend(theirs);
        }
        self.completed += other.completed;
        self.non_2xx += other.non_2xx;
        self.errors += other.errors;
        self.unsent += other.unsent;
        self.first_done = match (self.first_done, other.first_done) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_done = self.last_done.max(other.last_done);
    }
}

/// Sends each replay key once, so the run replays them.
async fn warm(conn: &mut Conn, template: &Template) -> Result<(), LoadError> {
    for seq in 0..template.keys {
        match conn.send(template.request(seq)?).await {
            Answer::Status(s) if s.is_success() => {}
            Answer::Status(s) => {
                return Err(LoadError::Warm {
                    key: template.key(seq),
                    why: format!("status {s}"),
                });
            }
            Answer::Failed => {
                return Err(LoadError::Warm {
                    key: template.key(seq),
                    why: "the connection failed".into(),
                });
            }
        }
    }
    Ok(())
}

/// The moments of a run.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Requests due from here on are recorded.
    measure_from: Instant,
    /// Requests still queued past this are not sent (the target fell too
    /// far behind to finish them in reasonable time).
    give_up: Instant,
    timeout: Duration,
    tracing: bool,
}

async fn work(
    mut conn: Conn,
    jobs: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    template: Arc<Template>,
    window: Window,
) -> Tally {
    let mut tally = Tally::new(window.tracing);
    loop {
        let job = jobs.lock().await.recv().await;
        let Some(job) = job else {
            return tally;
        };
        let recorded = job.due >= window.measure_from;
        if Instant::now() > window.give_up {
            tally.unsent += u64::from(recorded);
            continue;
        }
        let Ok(req) = template.request(job.seq) else {
            tally.errors += u64::from(recorded);
            continue;
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout(window.timeout, conn.send(req)).await;
        let done = Instant::now();
        if !recorded {
            continue;
        }
        let latency_us = micros(done.duration_since(job.due));
        if let Some(trace) = &mut tally.trace {
            trace.push(Traced {
                due_us: micros(job.due.duration_since(window.measure_from)),
                send_delay_us: micros(sent.saturating_duration_since(job.due)),
                latency_us,
                status: match &answer {
                    Ok(Answer::Status(s)) => s.as_u16(),
                    _ => 0,
                },
            });
        }
        match answer {
            Ok(Answer::Status(status)) => {
                tally.hist.saturating_record(latency_us.max(1));
                tally.completed += 1;
                tally.non_2xx += u64::from(!status.is_success());
                tally.first_done = Some(tally.first_done.map_or(done, |f| f.min(done)));
                tally.last_done = tally.last_done.max(Some(done));
            }
            Ok(Answer::Failed) | Err(_) => tally.errors += 1,
        }
    }
}

/// Whole µs, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Runs the load described by `args`.
pub(crate) async fn run(args: &Args) -> Result<Outcome, LoadError> {
    let target = Target::parse(&args.url).await?;
    let template = Template::new(target.clone(), args)?;
    let mut conns = Vec::with_capacity(args.connections.max(1));
    for _ in 0..args.connections.max(1) {
        conns.push(Conn::open(target.clone()).await?);
    }
    if args.mode == Mode::Replay
        && let Some(first) = conns.first_mut()
    {
        warm(first, &template).await?;
    }

    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let window = Window {
        measure_from,
        give_up: end + args.timeout,
        timeout: args.timeout,
        tracing: args.trace.is_some(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let rate = args.rate;
    let schedule = std::thread::Builder::new()
        .name("schedule".into())
        .spawn(move || {
            let mut seq: u64 = 0;
            loop {
                #[allow(clippy::cast_precision_loss)] // exact below 2^53 requests
                let due = start + Duration::from_secs_f64(seq as f64 / rate);
                if due >= end {
                    return;
                }
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if tx.send(Job { seq, due }).is_err() {
                    return;
                }
                seq += 1;
            }
        })
        .map_err(|e| LoadError::Request(format!("cannot start the schedule thread: {e}")))?;

    let jobs = Arc::new(Mutex::new(rx));
    let template = Arc::new(template);
    let mut workers = tokio::task::JoinSet::new();
    for conn in conns {
        workers.spawn(work(conn, Arc::clone(&jobs), Arc::clone(&template), window));
    }
    // Merged only once every worker is done: the idle workers end as
    // soon as the schedule does, while the last requests are still out,
    // and merging their histograms (about 190 kB each) on the runtime
    // thread delayed those requests' answers by a few ms at the end of
    // every run.
    let mut tallies = Vec::with_capacity(args.connections.max(1));
    while let Some(done) = workers.join_next().await {
        if let Ok(tally) = done {
            tallies.push(tally);
        }
    }
    let mut total = Tally::new(args.trace.is_some());
    for tally in tallies {
        total.merge(tally);
    }
    // The schedule ended before the workers saw their queue close.
    let _ = schedule.join();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    // Answers per second between the first and the last answer: the
    // schedule's rate when the target kept up, less when answers trailed.
    let achieved = match (total.first_done, total.last_done) {
        (Some(first), Some(last)) if last > first && total.completed > 1 => {
            (total.completed - 1) as f64 / last.duration_since(first).as_secs_f64()
        }
        _ => 0.0,
    };
    Ok(Outcome {
        hist: total.hist,
        completed: total.completed,
        non_2xx: total.non_2xx,
        errors: total.errors,
        unsent: total.unsent,
        achieved,
        trace: total.trace.map(|mut t| {
            t.sort_unstable_by_key(|r| r.due_us);
            t
        }),
    })
}
