//! What a run measured: the latency distribution (from each request's
//! scheduled send time) and the rate the target kept up with, printed for
//! people or as one `key=value` line for scripts.

use hdrhistogram::Histogram;

use crate::run::Traced;
use crate::{Args, Mode};

/// The measured part of a run.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Latency of every answered request, in µs.
    pub(crate) hist: Histogram<u64>,
    /// Requests answered (any status).
    pub(crate) completed: u64,
    /// Answers that were not 2xx.
    pub(crate) non_2xx: u64,
    /// Connection failures and timeouts.
    pub(crate) errors: u64,
    /// Requests still queued when the run gave up on them.
    pub(crate) unsent: u64,
    /// Answers per second over the measured window.
    pub(crate) achieved: f64,
    /// Every recorded request in due order, when `--trace` asked for it.
    pub(crate) trace: Option<Vec<Traced>>,
}

impl Outcome {
    fn pct(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }

    fn mode(args: &Args) -> &'static str {
        match args.mode {
            Mode::Fresh => "fresh",
            Mode::Replay => "replay",
        }
    }

    /// For people.
    pub(crate) fn text(&self, args: &Args) -> String {
        let ms = |us: u64| format!("{:.2} ms", us as f64 / 1000.0);
        format!(
            "{label}: {mode} keys, held {rate} req/s for {dur:?} (warm-up {warm:?}), {conns} connections\n\
             answered {done} ({non} non-2xx), errors {err}, not sent {unsent}; achieved {ach:.1} req/s\n\
             latency from the scheduled send: p50 {p50}  p90 {p90}  p99 {p99}  p99.9 {p999}  max {max}\n",
            label = args.label,
            mode = Self::mode(args),
            rate = args.rate,
            dur = args.duration,
            warm = args.warmup,
            conns = args.connections,
            done = self.completed,
            non = self.non_2xx,
            err = self.errors,
            unsent = self.unsent,
            ach = self.achieved,
            p50 = ms(self.pct(0.50)),
            p90 = ms(self.pct(0.90)),
            p99 = ms(self.pct(0.99)),
            p999 = ms(self.pct(0.999)),
            max = ms(self.hist.max()),
        )
    }

    /// One `key=value` line (times in µs).
    pub(crate) fn kv(&self, args: &Args) -> String {
        format!(
            "label={} mode={} rate={} achieved={:.1} completed={} non2xx={} errors={} unsent={} \
             p50_us={} p90_us={} p99_us={} p999_us={} max_us={}",
            args.label,
            Self::mode(args),
            args.rate,
            self.achieved,
            self.completed,
            self.non_2xx,
            self.errors,
            self.unsent,
            self.pct(0.50),
            self.pct(0.90),
            self.pct(0.99),
            self.pct(0.999),
            self.hist.max(),
        )
    }

    /// Writes the trace (if any) to `path`: a header line, then one line
    /// per recorded request, `due_us send_delay_us latency_us status`.
    pub(crate) fn write_trace(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(out, "due_us send_delay_us latency_us status")?;
        for r in self.trace.iter().flatten() {
            writeln!(
                out,
                "{} {} {} {}",
                r.due_us, r.send_delay_us, r.latency_us, r.status
            )?;
        }
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_is_one_line_per_request_after_its_header() {
        let outcome = Outcome {
            hist: Histogram::new(3).unwrap(),
            completed: 1,
            non_2xx: 0,
            errors: 1,
            unsent: 0,
            achieved: 1.0,
            trace: Some(vec![
                Traced {
                    due_us: 0,
                    send_delay_us: 12,
                    latency_us: 21_000,
                    status: 200,
                },
                Traced {
                    due_us: 500,
                    send_delay_us: 3,
                    latency_us: 10_000_000,
                    status: 0,
                },
            ]),
        };
        let path = std::env::temp_dir().join(format!("loadgen-trace-{}", std::process::id()));
        outcome.write_trace(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            text,
            "due_us send_delay_us latency_us status\n0 12 21000 200\n500 3 10000000 0\n"
        );
    }
}
