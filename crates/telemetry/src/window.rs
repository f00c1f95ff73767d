//! The windows behind the derived gauges: a sliding hit ratio, its
//! baseline (as the shipped alert rule computes it), and the distribution of
//! requests per key. All are plain data structures driven by an explicit
//! `now`, so their tests step time exactly.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Hits and totals in a ring of time buckets; the ratio covers the last
/// `buckets × bucket length`.
#[derive(Debug)]
pub struct RatioWindow {
    origin: Instant,
    bucket: Duration,
    /// (bucket number since origin, hits, total)
    slots: Vec<(u64, u64, u64)>,
}

impl RatioWindow {
    /// A window of `span` split into `buckets` buckets.
    pub fn new(span: Duration, buckets: u32, origin: Instant) -> Self {
        let buckets = buckets.max(1);
        Self {
            origin,
            bucket: (span / buckets).max(Duration::from_millis(1)),
            slots: vec![(u64::MAX, 0, 0); buckets as usize],
        }
    }

    fn index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos() / self.bucket.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// Counts one request.
    pub fn record(&mut self, hit: bool, now: Instant) {
        let n = self.index(now);
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(n % len) as usize];
        if slot.0 != n {
            *slot = (n, 0, 0);
        }
        slot.1 += u64::from(hit);
        slot.2 += 1;
    }

    /// Hits and requests over the window.
    pub fn counts(&self, now: Instant) -> (u64, u64) {
        let n = self.index(now);
        let len = self.slots.len() as u64;
        self.slots
            .iter()
            .filter(|(b, _, _)| *b != u64::MAX && *b <= n && n - *b < len)
            .fold((0u64, 0u64), |(h, t), (_, sh, st)| (h + sh, t + st))
    }

    /// Hits / requests over the window (0 when there were none).
    pub fn ratio(&self, now: Instant) -> f64 {
        let (hits, total) = self.counts(now);
        if total == 0 {
            0.0
        } else {
            hits as f64 / total as f64
        }
    }
}

/// The hit ratio's baseline as `ops/alerts.yml` defines it
/// (`avg_over_time(idemgate:hit_ratio:rate5m[1h] offset 15m)`): the mean of
/// the five-minute ratio, sampled once a minute, over the hour that ended
/// 15 minutes ago. Minutes are wall-clock minutes (`unix ms / 60 000`).
#[derive(Debug, Default)]
pub struct RatioHistory {
    /// (minute, ratio), oldest first, one per minute at most.
    samples: VecDeque<(u64, f64)>,
}

impl RatioHistory {
    /// How far back the baseline ends, in minutes.
    pub const OFFSET_MINUTES: u64 = 15;
    /// How many minutes the baseline averages.
    pub const SPAN_MINUTES: u64 = 60;

    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `ratio` as minute `minute`'s sample, unless that minute has
    /// one; forgets samples the baseline no longer reaches.
    pub fn sample(&mut self, minute: u64, ratio: f64) {
        if self.samples.back().is_some_and(|(m, _)| *m >= minute) {
            return;
        }
        self.samples.push_back((minute, ratio));
        let reach = Self::OFFSET_MINUTES + Self::SPAN_MINUTES;
        while self
            .samples
            .front()
            .is_some_and(|(m, _)| m.saturating_add(reach) <= minute)
        {
            self.samples.pop_front();
        }
    }

    /// The baseline at minute `minute`: the mean of the samples of the
    /// minutes in `(minute − 75, minute − 15]`; `None` without one (as
    /// Prometheus has no baseline, and the alert cannot fire, before then).
    pub fn baseline(&self, minute: u64) -> Option<f64> {
        let end = minute.checked_sub(Self::OFFSET_MINUTES)?;
        let (sum, n) = self
            .samples
            .iter()
            .filter(|(m, _)| m.saturating_add(Self::SPAN_MINUTES) > end && *m <= end)
            .fold((0.0, 0u32), |(s, n), (_, r)| (s + r, n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }

    /// Minutes until the baseline has its first sample (0 once it has one).
    pub fn minutes_to_baseline(&self, minute: u64) -> u64 {
        match self.samples.front() {
            Some((first, _)) => (first + Self::OFFSET_MINUTES).saturating_sub(minute),
            None => Self::OFFSET_MINUTES,
        }
    }
}

/// Requests per key over a window, kept as two generations of half the
/// window each (so old keys age out without a timer per key), bounded in
/// the number of keys tracked.
///
/// A key lives in one generation at a time: a request for a key of the
/// previous generation carries its count into the current one. A key that
/// got no request for a whole generation ages out, and its total is
/// *finished*: [`KeyCounts::take_finished`] hands those totals to the
/// requests-per-key histogram, one observation per key.
#[derive(Debug)]
pub struct KeyCounts {
    half: Duration,
    generation_start: Instant,
    current: HashMap<u64, u32>,
    previous: HashMap<u64, u32>,
    max_keys: usize,
    finished: Vec<u32>,
}

impl KeyCounts {
    /// Counts over `window`, tracking at most `max_keys` keys per generation.
    pub fn new(window: Duration, max_keys: usize, now: Instant) -> Self {
        Self {
            half: (window / 2).max(Duration::from_millis(1)),
            generation_start: now,
            current: HashMap::new(),
            previous: HashMap::new(),
            max_keys,
            finished: Vec::new(),
        }
    }

    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.generation_start);
        if age >= self.half * 2 {
            self.finished.extend(self.previous.drain().map(|(_, c)| c));
            self.finished.extend(self.current.drain().map(|(_, c)| c));
            self.generation_start = now;
        } else if age >= self.half {
            self.finished.extend(self.previous.drain().map(|(_, c)| c));
            self.previous = std::mem::take(&mut self.current);
            self.generation_start += self.half;
        }
    }

    /// Counts one request for key `id`.
    pub fn record(&mut self, id: u64, now: Instant) {
        self.rotate(now);
        if let Some(c) = self.current.get_mut(&id) {
            *c = c.saturating_add(1);
        } else if let Some(c) = self.previous.remove(&id) {
            self.current.insert(id, c.saturating_add(1));
        } else if self.current.len() < self.max_keys {
            self.current.insert(id, 1);
        }
    }

    /// The totals of keys that aged out since the last call (each key
    /// once), after aging out what `now` says is over.
    pub fn take_finished(&mut self, now: Instant) -> Vec<u32> {
        self.rotate(now);
        std::mem::take(&mut self.finished)
    }

    /// Ends every key now (at shutdown, or in tests): their totals join
    /// the finished ones, and the counts start over.
    pub fn finish_all(&mut self, now: Instant) -> Vec<u32> {
        self.rotate(now);
        self.finished.extend(self.previous.drain().map(|(_, c)| c));
        self.finished.extend(self.current.drain().map(|(_, c)| c));
        std::mem::take(&mut self.finished)
    }

    fn counts(&self, now: Instant) -> Vec<u32> {
        let age = now.saturating_duration_since(self.generation_start);
        let mut merged: HashMap<u64, u32> = if age >= self.half * 2 {
            HashMap::new()
        } else if age >= self.half {
            self.current.clone()
        } else {
            let mut m = self.previous.clone();
            for (k, c) in &self.current {
                *m.entry(*k).or_default() += c;
            }
            m
        };
        let mut v: Vec<u32> = merged.drain().map(|(_, c)| c).collect();
        v.sort_unstable();
        v
    }

    /// The `q` quantile (nearest rank) of requests per key; 0 with no keys.
    pub fn quantile(&self, q: f64, now: Instant) -> f64 {
        let v = self.counts(now);
        if v.is_empty() {
            return 0.0;
        }
        let rank = (q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize;
        f64::from(v[rank.saturating_sub(1).min(v.len() - 1)])
    }

    /// Keys in the window.
    pub fn tracked(&self, now: Instant) -> usize {
        self.counts(now).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_covers_the_window_and_forgets_older_buckets() {
        let t0 = Instant::now();
        let mut w = RatioWindow::new(Duration::from_secs(300), 10, t0);
        for i in 0..100 {
            w.record(i % 4 == 0, t0 + Duration::from_secs(1));
        }
        assert!((w.ratio(t0 + Duration::from_secs(2)) - 0.25).abs() < 1e-9);
        // Five minutes later the first bucket has left the window.
        for _ in 0..10 {
            w.record(true, t0 + Duration::from_secs(301));
        }
        assert!((w.ratio(t0 + Duration::from_secs(302)) - 1.0).abs() < 1e-9);
        assert_eq!(w.ratio(t0 + Duration::from_secs(1000)), 0.0);
    }

    #[test]
    fn baseline_is_the_hour_that_ended_fifteen_minutes_ago() {
        let mut h = RatioHistory::new();
        assert_eq!(h.baseline(100), None);
        assert_eq!(h.minutes_to_baseline(100), 15);
        // Minutes 0..=59 at 0.1, then 60.. at 0.5.
        for m in 0..60 {
            h.sample(m, 0.1);
            h.sample(m, 0.9); // a second sample in a minute is ignored
        }
        h.sample(60, 0.5);
        // Not before 15 minutes of history.
        assert_eq!(h.baseline(14), None);
        assert_eq!(h.minutes_to_baseline(10), 5);
        assert!((h.baseline(15).expect("minute 0 counts") - 0.1).abs() < 1e-9);
        assert_eq!(h.minutes_to_baseline(15), 0);
        // At minute 75: minutes 1..=60 (59 × 0.1 and one 0.5).
        let b = h.baseline(75).expect("a full hour");
        assert!((b - (59.0 * 0.1 + 0.5) / 60.0).abs() < 1e-9, "{b}");
        for m in 61..120 {
            h.sample(m, 0.5);
        }
        // At minute 134: minutes 60..=119, all 0.5.
        assert!((h.baseline(134).expect("a full hour") - 0.5).abs() < 1e-9);
        // Samples out of reach are forgotten.
        assert!(h.samples.len() <= 76, "{}", h.samples.len());
    }

    #[test]
    fn ten_keys_three_sends_each() {
        let t0 = Instant::now();
        let mut k = KeyCounts::new(Duration::from_secs(600), 1000, t0);
        for key in 0..10u64 {
            for _ in 0..3 {
                k.record(key, t0);
            }
        }
        assert_eq!(k.quantile(0.5, t0), 3.0);
        assert_eq!(k.quantile(0.99, t0), 3.0);
        assert_eq!(k.tracked(t0), 10);
    }

    #[test]
    fn skewed_distribution_quantiles() {
        let t0 = Instant::now();
        let mut k = KeyCounts::new(Duration::from_secs(600), 1000, t0);
        for key in 0..99u64 {
            k.record(key, t0);
        }
        for _ in 0..7 {
            k.record(1000, t0);
        }
        assert_eq!(k.quantile(0.5, t0), 1.0);
        assert_eq!(k.quantile(0.99, t0), 1.0);
        assert_eq!(k.quantile(1.0, t0), 7.0);
    }

    #[test]
    fn counts_span_generations_then_age_out() {
        let t0 = Instant::now();
        let mut k = KeyCounts::new(Duration::from_secs(600), 1000, t0);
        k.record(1, t0);
        k.record(1, t0 + Duration::from_secs(301)); // next generation
        assert_eq!(k.quantile(0.5, t0 + Duration::from_secs(302)), 2.0);
        assert_eq!(k.tracked(t0 + Duration::from_secs(1300)), 0);
    }

    #[test]
    fn a_key_is_finished_once_with_its_total_after_a_quiet_generation() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut k = KeyCounts::new(s(600), 1000, t0);
        k.record(1, t0);
        k.record(2, t0);
        k.record(1, t0 + s(100));
        // Key 1 comes back in the next generation: its count carries on.
        k.record(1, t0 + s(320));
        assert!(k.take_finished(t0 + s(320)).is_empty());
        // Key 2 was quiet for a generation: finished with 1 request.
        assert_eq!(k.take_finished(t0 + s(610)), vec![1]);
        assert_eq!(k.take_finished(t0 + s(611)), Vec::<u32>::new());
        // Key 1 goes quiet too: finished with all three.
        assert_eq!(k.take_finished(t0 + s(910)), vec![3]);
        assert_eq!(k.tracked(t0 + s(910)), 0);
    }

    #[test]
    fn finish_all_ends_every_key() {
        let t0 = Instant::now();
        let mut k = KeyCounts::new(Duration::from_secs(600), 1000, t0);
        for _ in 0..3 {
            k.record(7, t0);
        }
        k.record(8, t0);
        let mut done = k.finish_all(t0);
        done.sort_unstable();
        assert_eq!(done, vec![1, 3]);
        assert_eq!(k.tracked(t0), 0);
    }

    #[test]
    fn key_cap_bounds_memory() {
        let t0 = Instant::now();
        let mut k = KeyCounts::new(Duration::from_secs(600), 5, t0);
        for key in 0..100u64 {
            k.record(key, t0);
        }
        assert_eq!(k.tracked(t0), 5);
    }
}
