//! [`RouteTelemetry`]: what one route records, labelled with its id, and
//! the keyed variants that also feed the recent-keys table. Apart from the
//! process-wide [`Telemetry`] because it is the surface a library (the
//! idempotency layer) records through.

use std::sync::Arc;

use idemgate_engine::ScopedKey;
use idemgate_engine::backend::now_ms;
use metrics::Label;

use crate::counters::Counters;
use crate::{ReleaseReason, RequestOutcome, Telemetry, key_id, names};

/// [`Telemetry`] for one route: everything it records carries
/// `route="<id>"` (a configured route id: low cardinality by construction).
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct RouteTelemetry {
    pub(crate) telemetry: Telemetry,
    pub(crate) route: Arc<str>,
    /// The route's per-request counters, resolved once.
    pub(crate) counters: Arc<Counters>,
}

impl RouteTelemetry {
    pub(crate) fn labels(&self) -> Vec<Label> {
        self.counters.labels().to_vec()
    }

    /// The route label.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Publishes what the route is: `idemgate_route_info{route, charges}`
    /// at 1, so alert rules can single out routes whose repeats cost money
    /// (`charges="true"`: the route keeps an `outcome-unknown` answer
    /// instead of letting a retry run again).
    pub fn describe(&self, charges: bool) {
        let mut labels = self.labels();
        labels.push(Label::new(
            "charges",
            if charges { "true" } else { "false" },
        ));
        metrics::gauge!(names::ROUTE_INFO, labels).set(1.0);
    }

    /// As [`Telemetry::request`].
    pub fn request(&self, outcome: RequestOutcome, key_id: Option<u64>) {
        self.telemetry
            .count_request(&self.counters, outcome, key_id);
    }

    /// As [`Telemetry::inflight_conflict`].
    pub fn inflight_conflict(&self) {
        self.telemetry.count_conflict(&self.counters);
    }

    /// A request with `key` that ended with `outcome`: counted as
    /// [`RouteTelemetry::request`] does, and noted in the recent keys.
    pub fn key_request(&self, outcome: RequestOutcome, key: &ScopedKey) {
        self.request(outcome, Some(key_id(key)));
        self.telemetry.recent().request(key, outcome, now_ms());
    }

    /// A request that met `key` in flight: counted as
    /// [`RouteTelemetry::inflight_conflict`] does, and noted in the recent
    /// keys.
    pub fn key_conflict(&self, key: &ScopedKey) {
        self.inflight_conflict();
        self.telemetry.recent().conflict(key, now_ms());
    }

    /// An execution of `key` begins: the key is listed in flight until the
    /// returned guard is dropped.
    pub fn key_running(&self, key: &ScopedKey) -> RunningKey {
        self.telemetry.recent().started(key, now_ms());
        RunningKey {
            telemetry: self.telemetry.clone(),
            key: key.clone(),
        }
    }

    /// As [`Telemetry::tokens_saved`].
    pub fn tokens_saved(&self, tokens: u64) {
        self.telemetry.count_tokens(&self.counters, tokens);
    }

    /// As [`Telemetry::stream_events_lost`].
    pub fn stream_events_lost(&self, events: u64) {
        self.telemetry.count_events_lost(&self.counters, events);
    }

    /// Counts a completion write that failed with a temporary store error
    /// and will be retried, its result held in memory.
    pub fn completion_held(&self) {
        metrics::counter!(names::COMPLETION_HELD, self.labels()).increment(1);
    }

    /// Counts an execution whose key was released instead of stored.
    pub fn released(&self, reason: ReleaseReason) {
        let mut labels = self.labels();
        labels.push(Label::new("reason", reason.as_str()));
        metrics::counter!(names::RELEASED, labels).increment(1);
    }

    /// Counts an execution that failed after its request was sent.
    pub fn outcome_unknown(&self) {
        metrics::counter!(names::OUTCOME_UNKNOWN, self.labels()).increment(1);
    }
}

/// An execution listed in flight in the recent keys until dropped (see
/// [`RouteTelemetry::key_running`]).
#[derive(Debug)]
pub struct RunningKey {
    telemetry: Telemetry,
    key: ScopedKey,
}

impl Drop for RunningKey {
    fn drop(&mut self) {
        self.telemetry.recent().ended(&self.key);
    }
}
