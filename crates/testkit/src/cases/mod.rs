//! The conformance cases: one `pub async fn NAME(store: Arc<dyn Store>)`
//! per behaviour every store must have.
//!
//! The build script reads the files of this directory and generates the list of cases that
//! [`conformance_suite!`](crate::conformance_suite) turns into tests, so a case
//! written here runs on every store without being listed anywhere else. Keep
//! the parameters exactly `(store: Arc<dyn Store>)` (line breaks and a
//! trailing comma do not matter).

mod execution;
mod records;

pub use execution::*;
pub use records::*;

use std::sync::Arc;
use std::time::Duration;

use idemgate_engine::{Attempt, AttemptOutcome, Fenced, Lease, ScopedKey, Store};

use crate::{LONG, eventually, executed, payload};

/// Completes `lease` with `body`, kept for `ttl`, recording `attempt`;
/// returns what the store said (a store error fails the case).
pub(crate) async fn complete(
    store: &dyn Store,
    lease: &Lease,
    body: &[u8],
    ttl: Duration,
    attempt: &Attempt,
) -> Fenced {
    store
        .complete(lease, payload(body), ttl, attempt)
        .await
        .unwrap()
}

/// After a takeover of `key`: completing the `old` lease is fenced,
/// completing the `new` one applies, and the record holds the new owner's
/// payload.
pub(crate) async fn assert_only_the_new_owner_completes(
    store: &dyn Store,
    key: &ScopedKey,
    old: &Lease,
    new: &Lease,
) {
    let ok = executed();
    assert_eq!(complete(store, old, b"old", LONG, &ok).await, Fenced::Stale);
    assert_eq!(
        complete(store, new, b"new", LONG, &ok).await,
        Fenced::Applied
    );
    let rec = store
        .get(key)
        .await
        .unwrap()
        .expect("DONE by the new owner");
    assert_eq!(rec.payload().map(|p| p.to_vec()), Some(b"new".to_vec()));
}

/// The outcomes of `key`'s timeline entries, oldest first.
pub(crate) async fn outcomes(store: &dyn Store, key: &ScopedKey) -> Vec<AttemptOutcome> {
    let timeline = store.timeline(key).await.unwrap();
    timeline.iter().map(|a| a.outcome).collect()
}

/// What a store is to show for a key, written in the background.
#[derive(Clone, Copy)]
pub(crate) enum Shows {
    /// A record, when true, or none.
    Record(bool),
    /// At least this many timeline entries.
    Entries(usize),
}

/// Polls (as [`eventually`]) until `store` shows `what` for `key`; false
/// if it never did.
pub(crate) async fn eventually_shows(store: &Arc<dyn Store>, key: &ScopedKey, what: Shows) -> bool {
    eventually(|| {
        let (store, key) = (Arc::clone(store), key.clone());
        async move {
            match what {
                Shows::Record(present) => store.get(&key).await.unwrap().is_some() == present,
                Shows::Entries(n) => store.timeline(&key).await.unwrap().len() >= n,
            }
        }
    })
    .await
}
