//! Counters of what the simulated provider did, shared by every request.
//!
//! All counters sit behind one std `Mutex` (never held across `.await`), so
//! a [`StatsSnapshot`] is one consistent cut: a test that sees
//! `completed == 1` also sees the tokens that generation billed.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

/// A copy of the counters at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// HTTP requests received on the two generation endpoints
    /// (`/v1/chat/completions`, `/v1/messages`), whatever became of them.
    pub requests: u64,
    /// Generations started: requests that reached the model (see the crate
    /// docs for which injected failures count).
    pub executions: u64,
    /// Generations that ran to the end, even if the client had left.
    pub completed: u64,
    /// Responses the client abandoned before they were fully produced.
    pub client_disconnects: u64,
    /// Requests that carried an `x-sim-fail` instruction.
    pub failures_injected: u64,
    /// Prompt tokens billed (once per generation that started producing).
    pub prompt_tokens_billed: u64,
    /// Completion tokens billed: every token generated, delivered or not.
    pub completion_tokens_billed: u64,
}

/// One execution, as [`Stats::log`] lists it: which request reached the
/// model, under which key, for whom, and when. A checker matches these
/// against what clients were answered (every response names its execution:
/// the `N` of `chatcmpl-N` / `msg_simN`, and `x-sim-execution`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execution {
    /// The execution's number (process-wide, never rewound).
    pub sequence: u64,
    /// The idempotency key it was sent with ("" without one).
    pub key: String,
    /// The credential it was sent with, as received: the value of
    /// `Authorization`, else `x-api-key` ("" without either). The simulator
    /// checks no credential; this is what a gateway's tenant is made of.
    pub credential: String,
    /// SHA-256 of the request body, hex.
    pub body_sha256: String,
    /// When the execution started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The request's `x-sim-tag` header ("" without one): a test names
    /// its request there, and a gateway forwards it, so an execution can
    /// be traced to the request that caused it.
    pub tag: String,
}

/// Who an execution is for: what [`Execution`] records beside its number
/// and time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) key: String,
    pub(crate) credential: String,
    pub(crate) body_sha256: String,
    pub(crate) tag: String,
}

/// The live counters. Share it as `Arc<Stats>`; read it with
/// [`Stats::snapshot`].
#[derive(Debug, Default)]
pub struct Stats {
    /// One lock for everything: each update is a few integer additions.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    counters: StatsSnapshot,
    /// Executions per idempotency key ("" for requests without one).
    ///
    /// A B-tree, not a hash map: every fresh key adds an entry under the
    /// one lock every request takes, and a hash map doubles its table by
    /// moving every entry at once. At 114,688 keys that move stalled the
    /// simulator for 45 ms, and whichever benchmark row was running then
    /// wore it as its own tail. A B-tree grows a node at a time.
    per_key: BTreeMap<String, u64>,
    /// Every execution since the last reset, oldest first.
    log: Vec<Execution>,
    /// Source of response ids. Never reset, so that ids stay unique for the
    /// life of the process even across [`Stats::reset`].
    sequence: u64,
}

impl Stats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the integers torn in
        // a way that matters; keep counting.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of all counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.lock().counters.clone()
    }

    /// Executions counted under `idempotency_key` ("" = requests without a
    /// key).
    pub fn executions_for(&self, idempotency_key: &str) -> u64 {
        self.lock()
            .per_key
            .get(idempotency_key)
            .copied()
            .unwrap_or(0)
    }

    /// Executions of every key seen since the last reset.
    pub fn executions_by_key(&self) -> BTreeMap<String, u64> {
        self.lock().per_key.clone()
    }

    /// Every execution since the last reset, oldest first.
    pub fn log(&self) -> Vec<Execution> {
        self.lock().log.clone()
    }

    /// Zeroes every counter, forgets every key and empties the log.
    /// Response ids keep growing.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.counters = StatsSnapshot::default();
        inner.per_key.clear();
        inner.log.clear();
    }

    pub(crate) fn request(&self) {
        self.lock().counters.requests += 1;
    }

    pub(crate) fn failure_injected(&self) {
        self.lock().counters.failures_injected += 1;
    }

    /// Counts one execution for `caller`, logs it, and returns its
    /// process-wide sequence number (used in response ids).
    pub(crate) fn execution(&self, caller: &Caller) -> u64 {
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut inner = self.lock();
        inner.counters.executions += 1;
        *inner.per_key.entry(caller.key.clone()).or_insert(0) += 1;
        inner.sequence += 1;
        let sequence = inner.sequence;
        inner.log.push(Execution {
            sequence,
            key: caller.key.clone(),
            credential: caller.credential.clone(),
            body_sha256: caller.body_sha256.clone(),
            started_ms,
            tag: caller.tag.clone(),
        });
        sequence
    }

    pub(crate) fn bill(&self, prompt_tokens: u64, completion_tokens: u64) {
        let mut inner = self.lock();
        inner.counters.prompt_tokens_billed += prompt_tokens;
        inner.counters.completion_tokens_billed += completion_tokens;
    }

    /// Bills the last `completion_tokens` and counts the generation as
    /// completed, in one step.
    pub(crate) fn complete(&self, completion_tokens: u64) {
        let mut inner = self.lock();
        inner.counters.completion_tokens_billed += completion_tokens;
        inner.counters.completed += 1;
    }

    pub(crate) fn client_disconnect(&self) {
        self.lock().counters.client_disconnects += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(key: &str) -> Caller {
        Caller {
            key: key.to_owned(),
            credential: "Bearer t".to_owned(),
            body_sha256: "00".to_owned(),
            tag: String::new(),
        }
    }

    #[test]
    fn reset_zeroes_counters_but_not_the_sequence() {
        let stats = Stats::new();
        stats.request();
        assert_eq!(stats.execution(&caller("a")), 1);
        assert_eq!(stats.execution(&caller("a")), 2);
        let log = stats.log();
        assert_eq!(log.len(), 2);
        assert_eq!((log[1].sequence, log[1].key.as_str()), (2, "a"));
        assert_eq!(log[1].credential, "Bearer t");
        stats.bill(3, 4);
        stats.complete(5);
        assert_eq!(stats.executions_for("a"), 2);
        assert_eq!(
            stats.snapshot(),
            StatsSnapshot {
                requests: 1,
                executions: 2,
                completed: 1,
                prompt_tokens_billed: 3,
                completion_tokens_billed: 9,
                ..StatsSnapshot::default()
            }
        );
        stats.reset();
        assert_eq!(stats.snapshot(), StatsSnapshot::default());
        assert_eq!(stats.executions_for("a"), 0);
        assert!(stats.log().is_empty());
        assert_eq!(stats.execution(&caller("a")), 3);
    }
}
