//! What the layer counts, through [`idemgate_telemetry`]: one outcome per
//! request, hits and tokens saved, keys met in flight, keys released (and
//! why), stream events lost.
//!
//! The names are [`idemgate_telemetry::names`]; the layer records through
//! [`Telemetry::shared`](idemgate_telemetry::Telemetry::shared), which never
//! installs a recorder: the application picks the exporter (the gateway
//! installs Prometheus). Every series carries the route (namespace) and, for
//! requests, a fixed [`RequestOutcome`]; never a key or a tenant. Keys feed the
//! requests-per-key distribution, as a hash that is never exported, and the
//! in-memory table of recent keys the admin dashboard lists (tenant id,
//! route and key, as the key's timeline names them; see
//! [`idemgate_telemetry::RecentKeys`]). A released key carries its reason
//! (`ReleaseReason`), a fixed label too.
//!
//! Each request is counted once, with its final outcome: an owner when its
//! execution ends (`executed`, `failed`, `fenced`), before the client hears
//! the end, so a client that saw its answer also sees it counted.

use idemgate_engine::{AttemptOutcome, ScopedKey};
#[cfg(test)]
use idemgate_telemetry::key_id;
pub use idemgate_telemetry::{ReleaseReason, RequestOutcome, names};
use idemgate_telemetry::{RouteTelemetry, RunningKey, Telemetry};

use crate::config::{LayerConfig, OutcomeUnknownMode};
use crate::stored::Usage;

/// The outcome counted for a request whose timeline entry is `attempt`
/// ([`RequestOutcome::of_attempt`]); every attempt the layer's requests
/// record is one.
pub(crate) fn counted(attempt: AttemptOutcome) -> RequestOutcome {
    RequestOutcome::of_attempt(attempt).unwrap_or(RequestOutcome::Failed)
}

/// The route's metrics.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    route: RouteTelemetry,
}

impl Metrics {
    pub(crate) fn new(config: &LayerConfig) -> Self {
        let route = Telemetry::shared().route(config.namespace.as_str());
        route.describe(config.on_outcome_unknown == OutcomeUnknownMode::Store);
        Self { route }
    }

    /// A request that ended with `outcome`; `key` when it had one.
    pub(crate) fn request(&self, outcome: RequestOutcome, key: Option<&ScopedKey>) {
        match key {
            Some(k) => self.route.key_request(outcome, k),
            None => self.route.request(outcome, None),
        }
    }

    /// A request answered from a stored result: a hit, and the tokens its
    /// stored `usage` says a second execution would have billed.
    pub(crate) fn replayed(&self, outcome: RequestOutcome, key: &ScopedKey, usage: Option<Usage>) {
        self.request(outcome, Some(key));
        // Only a hit saved a call: an operation read is the asker's own
        // result, paid for once by its execution.
        if let Some(u) = usage.filter(|_| outcome.is_hit()) {
            self.route.tokens_saved(u.total());
        }
    }

    /// A request that met its key PENDING (whatever it does next: refused,
    /// waiting, joining). How it ends is counted by [`Metrics::request`].
    pub(crate) fn met_inflight(&self, key: &ScopedKey) {
        self.route.key_conflict(key);
    }

    /// An execution of `key` begins: listed in flight until the guard drops.
    pub(crate) fn running(&self, key: &ScopedKey) -> RunningKey {
        self.route.key_running(key)
    }

    /// An execution whose key was released instead of stored.
    pub(crate) fn released(&self, reason: ReleaseReason) {
        self.route.released(reason);
    }

    /// An execution that failed after its request was sent (whether its key
    /// was then released or stored as `outcome-unknown`).
    pub(crate) fn outcome_unknown(&self) {
        self.route.outcome_unknown();
    }

    /// A completion write that failed with a temporary store error: the
    /// result is held in memory and the write retried.
    pub(crate) fn completion_held(&self) {
        self.route.completion_held();
    }

    /// Events relayed on a stream that then broke: not stored.
    pub(crate) fn events_lost(&self, n: usize) {
        self.route
            .stream_events_lost(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_engine::ClientKey;

    #[test]
    fn key_ids_separate_tenants_and_routes() {
        let k = |t: &str, n: &str, c: &str| {
            let key = ClientKey::parse(c).expect("a valid literal");
            key_id(&ScopedKey::new(t, n, key))
        };
        assert_eq!(k("t", "r", "a"), k("t", "r", "a"));
        assert_ne!(k("t", "r", "a"), k("u", "r", "a"));
        assert_ne!(k("t", "r", "a"), k("t", "s", "a"));
        assert_ne!(k("t", "r", "a"), k("t", "r", "b"));
    }

    #[test]
    fn release_reasons_keep_their_labels() {
        let labels = ReleaseReason::ALL.map(ReleaseReason::as_str);
        assert_eq!(
            labels,
            [
                "completion_timeout",
                "shutdown",
                "retryable_failure",
                "retryable_status",
                "outcome_unknown",
                "too_large",
                "body_error",
                "stream_error",
                "error_event",
                "unterminated_stream",
                "event_too_large",
                "encode",
            ]
        );
        let delivered: Vec<_> = ReleaseReason::ALL
            .into_iter()
            .filter(|r| r.delivered())
            .collect();
        assert_eq!(delivered, [ReleaseReason::TooLarge]);
    }
}
