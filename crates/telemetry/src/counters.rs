//! [`Counters`]: the counters one label set (a route, or none) bumps on
//! every request, each looked up in the recorder once.
//!
//! `metrics::counter!(name, labels)` builds the labels, hashes the key and
//! searches the registry on every call: a few allocations and a lock per
//! series per request, a few percent of a replay's CPU. The series of a
//! route never change, so each is resolved on its first use and its handle
//! kept. First use, not construction, so the exposition is as before: a
//! series appears when it is first counted (or registered at zero), and a
//! handle always belongs to the recorder installed by then.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Label};

use crate::{RequestOutcome, names};

/// Handles of the per-request counters of one label set.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    labels: Vec<Label>,
    requests: [OnceLock<Counter>; RequestOutcome::ALL.len()],
    hit: OnceLock<Counter>,
    fenced: OnceLock<Counter>,
    conflict: OnceLock<Counter>,
    tokens_saved: OnceLock<Counter>,
    events_lost: OnceLock<Counter>,
    /// Requests by outcome, mirrored for the dashboard's per-route figures.
    totals: [AtomicU64; RequestOutcome::ALL.len()],
}

impl Counters {
    /// The counters labelled with `labels`.
    pub(crate) fn new(labels: Vec<Label>) -> Self {
        Self {
            labels,
            ..Self::default()
        }
    }

    /// The label set every series here carries.
    pub(crate) fn labels(&self) -> &[Label] {
        &self.labels
    }

    fn handle<'a>(&'a self, cell: &'a OnceLock<Counter>, name: &'static str) -> &'a Counter {
        cell.get_or_init(|| metrics::counter!(name, self.labels.clone()))
    }

    /// Counts `outcome` in the mirrored totals.
    pub(crate) fn count(&self, outcome: RequestOutcome) {
        if let Some(c) = self.totals.get(outcome.index()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The mirrored total of `outcome`.
    pub(crate) fn total(&self, outcome: RequestOutcome) -> u64 {
        self.totals
            .get(outcome.index())
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// `idempotency_requests_total{…, outcome}`.
    pub(crate) fn request(&self, outcome: RequestOutcome) -> Option<&Counter> {
        // `None` is unreachable: every outcome has a slot.
        let cell = self.requests.get(outcome.index())?;
        Some(cell.get_or_init(|| {
            let mut labels = self.labels.clone();
            labels.push(Label::new("outcome", outcome.as_str()));
            metrics::counter!(names::REQUESTS, labels)
        }))
    }

    /// `idempotency_hit_total`.
    pub(crate) fn hit(&self) -> &Counter {
        self.handle(&self.hit, names::HIT)
    }

    /// `idempotency_fenced_total`.
    pub(crate) fn fenced(&self) -> &Counter {
        self.handle(&self.fenced, names::FENCED)
    }

    /// `idempotency_inflight_conflict_total`.
    pub(crate) fn conflict(&self) -> &Counter {
        self.handle(&self.conflict, names::INFLIGHT_CONFLICT)
    }

    /// `idempotency_tokens_saved_total`.
    pub(crate) fn tokens_saved(&self) -> &Counter {
        self.handle(&self.tokens_saved, names::TOKENS_SAVED)
    }

    /// `idempotency_stream_events_lost_total`.
    pub(crate) fn events_lost(&self) -> &Counter {
        self.handle(&self.events_lost, names::STREAM_EVENTS_LOST)
    }
}
