//! Claims, completions and lease renewals of concurrent requests batched
//! into one statement (`PostgresOptions::batch_statements`) keep every
//! promise of the single-key statements: one winner per key, each key's
//! own answer (never a neighbour's), takeovers with higher fences, fenced
//! and idempotent completions, fenced renewals — and a key whose row lock
//! is held elsewhere holds up no other key of its batch. The statements
//! are planned once per connection, never for their parameters.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    AttemptOutcome, Claim, Fenced, Lease, RecordState, ScopedKey, Store, StoreErrorKind,
};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::{SHORT_TTL, acquired, attempt, fp, fresh_key};

/// A lease or retention no test outlives.
const LONG: Duration = Duration::from_secs(300);
use sqlx::AssertSqlSafe;
use tokio::sync::Barrier;

/// A store on the shared server whose claims and completions go through
/// `workers` batch statements of each kind: one makes batches form as soon
/// as two requests overlap.
async fn batching_store(workers: u32) -> Arc<PostgresStore> {
    let shared = support::shared_store().await;
    let opts = PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(8)
        .batch_statements(workers);
    Arc::new(
        PostgresStore::from_pool_with(shared.pool().clone(), opts)
            .await
            .expect("a batching store over the shared pool"),
    )
}

/// Claims every key `claimers` times at once (one barrier for all);
/// per key, the claims' answers.
async fn claim_all_at_once(
    store: &Arc<PostgresStore>,
    keys: &[ScopedKey],
    claimers: usize,
    ttl: Duration,
) -> Vec<Vec<Claim>> {
    let barrier = Arc::new(Barrier::new(keys.len() * claimers));
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        for _ in 0..claimers {
            let (store, key, barrier) = (Arc::clone(store), key.clone(), Arc::clone(&barrier));
            tasks.push((
                i,
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim(&key, &fp(&format!("key-{i}")), ttl).await
                }),
            ));
        }
    }
    let mut answers: Vec<Vec<Claim>> = keys.iter().map(|_| Vec::new()).collect();
    for (i, task) in tasks {
        answers[i].push(task.await.unwrap().unwrap());
    }
    answers
}

/// The one lease among a key's answers; every other answer is that
/// lease's PENDING record, with the key's own fingerprint.
fn the_winner(i: usize, answers: Vec<Claim>) -> Lease {
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for answer in answers {
        match answer {
            Claim::Acquired(lease) => winners.push(lease),
            Claim::Existing(record) => seen.push(record),
        }
    }
    assert_eq!(winners.len(), 1, "key {i}: {} winners", winners.len());
    let winner = winners.pop().unwrap();
    assert_eq!(winner.fingerprint, fp(&format!("key-{i}")), "key {i}");
    for record in seen {
        assert_eq!(record.fingerprint, fp(&format!("key-{i}")), "key {i}");
        assert_eq!(
            record.state,
            RecordState::Pending {
                fence: winner.fence,
                lease_expires_at_ms: winner.expires_at_ms
            },
            "key {i}: another claimer saw something else than the winner's lease"
        );
    }
    winner
}

/// Claims every key `claimers` times at once; each key's one lease.
async fn winners(
    store: &Arc<PostgresStore>,
    keys: &[ScopedKey],
    claimers: usize,
    ttl: Duration,
) -> Vec<Lease> {
    claim_all_at_once(store, keys, claimers, ttl)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, answers)| the_winner(i, answers))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_claims_keep_one_winner_and_each_keys_own_answer() {
    let store = batching_store(1).await;
    for _round in 0..12 {
        let keys: Vec<ScopedKey> = (0..24).map(|_| fresh_key()).collect();
        let answers = claim_all_at_once(&store, &keys, 6, LONG).await;
        let mut fences: Vec<u64> = answers
            .into_iter()
            .enumerate()
            .map(|(i, a)| the_winner(i, a).fence)
            .collect();
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), keys.len(), "two keys were given one fence");
    }
    assert!(
        store.batched_jobs() > 0,
        "no two claims shared a statement: the batch path was not exercised"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_claims_take_expired_leases_over_and_fence_the_old_owners() {
    let store = batching_store(1).await;
    let keys: Vec<ScopedKey> = (0..16).map(|_| fresh_key()).collect();
    let old: Vec<Lease> = winners(&store, &keys, 1, SHORT_TTL).await;
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    let new: Vec<Lease> = winners(&store, &keys, 4, LONG).await;
    let ok = attempt(AttemptOutcome::Executed);
    let mut tasks = Vec::new();
    for (i, (old, new)) in old.iter().zip(&new).enumerate() {
        assert!(
            new.fence > old.fence,
            "key {i}: the takeover's fence is not higher"
        );
        for (lease, body) in [(old.clone(), "old"), (new.clone(), "new")] {
            let (store, ok) = (Arc::clone(&store), ok.clone());
            tasks.push(tokio::spawn(async move {
                let written = store
                    .complete(&lease, Bytes::from(format!("{body}-{i}")), LONG, &ok)
                    .await
                    .unwrap();
                (i, body, written)
            }));
        }
    }
    for task in tasks {
        let (i, body, written) = task.await.unwrap();
        let expected = if body == "new" {
            Fenced::Applied
        } else {
            Fenced::Stale
        };
        assert_eq!(written, expected, "key {i}: the {body} owner's completion");
    }
    for (i, key) in keys.iter().enumerate() {
        match store.get(key).await.unwrap().map(|r| r.state) {
            Some(RecordState::Done { payload, .. }) => {
                assert_eq!(payload, Bytes::from(format!("new-{i}")), "key {i}");
            }
            other => panic!("key {i}: {other:?}"),
        }
    }
    assert!(store.batched_jobs() > 0, "the batch path was not exercised");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_completions_are_fenced_idempotent_and_keep_each_keys_payload() {
    let store = batching_store(1).await;
    let keys: Vec<ScopedKey> = (0..32).map(|_| fresh_key()).collect();
    let leases: Vec<Lease> = winners(&store, &keys, 1, LONG).await;
    let ok = attempt(AttemptOutcome::Executed);
    let barrier = Arc::new(Barrier::new(keys.len() * 3));
    let mut tasks = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let forged = Lease {
            token: lease.token ^ 1,
            ..lease.clone()
        };
        // The completion, its retry (same lease and payload: applied
        // either way) and a forged token's (never applied), all at once.
        for (what, lease) in [
            ("first", lease.clone()),
            ("retry", lease.clone()),
            ("forged", forged),
        ] {
            let (store, ok, barrier) = (Arc::clone(&store), ok.clone(), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let written = store
                    .complete(&lease, Bytes::from(format!("payload-{i}")), LONG, &ok)
                    .await
                    .unwrap();
                (i, what, written)
            }));
        }
    }
    let mut applied: HashMap<usize, usize> = HashMap::new();
    for task in tasks {
        let (i, what, written) = task.await.unwrap();
        let expected = if what == "forged" {
            Fenced::Stale
        } else {
            Fenced::Applied
        };
        assert_eq!(written, expected, "key {i}: the {what} completion");
        *applied.entry(i).or_default() += usize::from(written == Fenced::Applied);
    }
    assert!(applied.values().all(|n| *n == 2));
    for (i, key) in keys.iter().enumerate() {
        match store.get(key).await.unwrap().map(|r| r.state) {
            Some(RecordState::Done { payload, .. }) => {
                assert_eq!(payload, Bytes::from(format!("payload-{i}")), "key {i}");
            }
            other => panic!("key {i}: {other:?}"),
        }
        let executed = store
            .timeline(key)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Executed)
            .count();
        assert_eq!(executed, 1, "key {i}: the retry wrote a second entry");
    }
    assert!(store.batched_jobs() > 0, "the batch path was not exercised");
}

/// Claims and completions waiting at the same moment share statements,
/// and each keeps its promise: fresh keys get one winner each, current
/// leases complete with their own payload, and where an expired owner's
/// late completion meets a takeover claim of its key, exactly one of the
/// two wins — the completion (the claim then reads its DONE record) or
/// the takeover (the completion is then stale and the fence is higher).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_and_completions_share_statements_and_keep_every_promise() {
    const ROUNDS: usize = 8;
    let store = batching_store(1).await;
    let ok = attempt(AttemptOutcome::Executed);
    // Every round's expiring keys are claimed up front, so one wait
    // outlasts all their leases.
    let expiring: Vec<Vec<(ScopedKey, Lease)>> = {
        let mut rounds = Vec::new();
        for _ in 0..ROUNDS {
            let keys: Vec<ScopedKey> = (0..6).map(|_| fresh_key()).collect();
            let leases = winners(&store, &keys, 1, SHORT_TTL).await;
            rounds.push(keys.into_iter().zip(leases).collect());
        }
        rounds
    };
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    let mut current: Vec<(ScopedKey, Lease)> = Vec::new();
    for (round, expired) in expiring.into_iter().enumerate() {
        let fresh: Vec<ScopedKey> = (0..8).map(|_| fresh_key()).collect();
        let barrier = Arc::new(Barrier::new(
            current.len() + 2 * expired.len() + 2 * fresh.len(),
        ));
        let mut completions = Vec::new();
        for (i, (_, lease)) in current.iter().enumerate() {
            let (store, ok, barrier, lease) = (
                Arc::clone(&store),
                ok.clone(),
                Arc::clone(&barrier),
                lease.clone(),
            );
            completions.push(tokio::spawn(async move {
                barrier.wait().await;
                let body = Bytes::from(format!("current-{round}-{i}"));
                store.complete(&lease, body, LONG, &ok).await.unwrap()
            }));
        }
        let mut late = Vec::new();
        for (i, (key, old)) in expired.iter().enumerate() {
            let (store, ok, barrier, key, old) = (
                Arc::clone(&store),
                ok.clone(),
                Arc::clone(&barrier),
                key.clone(),
                old.clone(),
            );
            late.push(tokio::spawn(async move {
                let takeover = {
                    let (store, barrier, key) =
                        (Arc::clone(&store), Arc::clone(&barrier), key.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store
                            .claim(&key, &fp(&format!("expired-{round}-{i}")), LONG)
                            .await
                            .unwrap()
                    })
                };
                barrier.wait().await;
                let body = Bytes::from(format!("late-{round}-{i}"));
                let written = store.complete(&old, body, LONG, &ok).await.unwrap();
                (written, takeover.await.unwrap(), old)
            }));
        }
        let claimed = {
            let (store, fresh, barrier) = (Arc::clone(&store), fresh.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut tasks = Vec::new();
                for (i, key) in fresh.into_iter().enumerate() {
                    for _ in 0..2 {
                        let (store, key, barrier) =
                            (Arc::clone(&store), key.clone(), Arc::clone(&barrier));
                        tasks.push((
                            i,
                            tokio::spawn(async move {
                                barrier.wait().await;
                                store.claim(&key, &fp(&format!("key-{i}")), LONG).await
                            }),
                        ));
                    }
                }
                let mut answers: Vec<Vec<Claim>> = (0..8).map(|_| Vec::new()).collect();
                for (i, task) in tasks {
                    answers[i].push(task.await.unwrap().unwrap());
                }
                answers
            })
        };
        for (i, written) in completions.into_iter().enumerate() {
            assert_eq!(
                written.await.unwrap(),
                Fenced::Applied,
                "round {round}: current key {i}"
            );
        }
        for (i, (key, _)) in current.iter().enumerate() {
            match store.get(key).await.unwrap().map(|r| r.state) {
                Some(RecordState::Done { payload, .. }) => assert_eq!(
                    payload,
                    Bytes::from(format!("current-{round}-{i}")),
                    "round {round}: current key {i}"
                ),
                other => panic!("round {round}: current key {i}: {other:?}"),
            }
        }
        for (i, task) in late.into_iter().enumerate() {
            let (written, takeover, old) = task.await.unwrap();
            match (written, takeover) {
                (Fenced::Applied, Claim::Existing(record)) => match record.state {
                    RecordState::Done { payload, .. } => assert_eq!(
                        payload,
                        Bytes::from(format!("late-{round}-{i}")),
                        "round {round}: expired key {i}"
                    ),
                    other => panic!(
                        "round {round}: expired key {i}: the completion applied, yet the claim read {other:?}"
                    ),
                },
                (Fenced::Stale, Claim::Acquired(new)) => assert!(
                    new.fence > old.fence,
                    "round {round}: expired key {i}: the takeover's fence is not higher"
                ),
                (written, takeover) => panic!(
                    "round {round}: expired key {i}: completion {written:?} with claim {takeover:?}"
                ),
            }
        }
        let answers = claimed.await.unwrap();
        current = fresh
            .into_iter()
            .zip(answers)
            .enumerate()
            .map(|(i, (key, answers))| (key, the_winner(i, answers)))
            .collect();
    }
    assert!(
        store.mixed_statements() > 0,
        "no statement carried claims and completions together"
    );
}

/// Renewals of many leases at once share statements, and each keeps the
/// single-key promise: a current lease is extended by its own TTL (each
/// key renews for a different one here, so a neighbour's expiry would
/// show), a forged token, an older fence or a completed key is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_renewals_extend_each_current_lease_and_refuse_stale_ones() {
    let store = batching_store(1).await;
    let keys: Vec<ScopedKey> = (0..48).map(|_| fresh_key()).collect();
    let leases: Vec<Lease> = winners(&store, &keys, 1, LONG).await;
    // Every fourth key is done before the renewals: its lease is over.
    let ok = attempt(AttemptOutcome::Executed);
    for lease in leases.iter().step_by(4) {
        let done = store.complete(lease, Bytes::from_static(b"done"), LONG, &ok);
        assert_eq!(done.await.unwrap(), Fenced::Applied);
    }
    let before = store.renew_statements();
    let barrier = Arc::new(Barrier::new(keys.len() * 3));
    let mut tasks = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let forged = Lease {
            token: lease.token ^ 1,
            ..lease.clone()
        };
        let older = Lease {
            fence: lease.fence - 1,
            ..lease.clone()
        };
        for (what, mut lease) in [("own", lease.clone()), ("forged", forged), ("older", older)] {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let ttl = LONG + Duration::from_secs(60 * (i as u64 + 1));
                let renewed = store.renew(&mut lease, ttl).await.unwrap();
                (i, what, renewed, lease)
            }));
        }
    }
    let mut renewed = HashMap::new();
    for task in tasks {
        let (i, what, written, lease) = task.await.unwrap();
        let current = what == "own" && i % 4 != 0;
        let expected = if current {
            Fenced::Applied
        } else {
            Fenced::Stale
        };
        assert_eq!(written, expected, "key {i}: the {what} renewal");
        if current {
            renewed.insert(i, lease);
        }
    }
    let statements = store.renew_statements() - before;
    for (i, key) in keys.iter().enumerate() {
        let state = store.get(key).await.unwrap().map(|r| r.state);
        let Some(lease) = renewed.get(&i) else {
            assert!(
                matches!(state, Some(RecordState::Done { .. })),
                "key {i}: {state:?}"
            );
            continue;
        };
        assert_eq!(
            state,
            Some(RecordState::Pending {
                fence: lease.fence,
                lease_expires_at_ms: lease.expires_at_ms
            }),
            "key {i}"
        );
        // Its own TTL: one more minute per key than the previous key's.
        let extended = lease.expires_at_ms - leases[i].expires_at_ms;
        let own = 60_000 * (i as u64 + 1);
        assert!(
            extended.abs_diff(own) < 30_000,
            "key {i}: extended by {extended} ms, not by its own {own} ms"
        );
    }
    assert!(
        (1..144).contains(&statements),
        "{} renewals took {statements} batch statements",
        keys.len() * 3
    );
}

/// The store's connections plan each statement once and keep that plan:
/// a claim, completion or renewal is never planned again for its
/// parameters. (Left to choose, the server plans the first five runs of a
/// prepared statement for their parameters, and may keep doing so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stores_statements_are_planned_once_not_per_run() {
    let shared = support::shared_store().await;
    // One connection: every statement below runs on the one the check
    // reads afterwards.
    let opts = PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(1)
        .purge_interval(None)
        .background_timeline(false)
        .batch_statements(1);
    let store = Arc::new(
        PostgresStore::from_pool_with(shared.pool().clone(), opts)
            .await
            .expect("a store of one connection"),
    );
    let ok = attempt(AttemptOutcome::Executed);
    let rounds = 8;
    let mut held: Vec<Lease> = Vec::new();
    for round in 0..rounds {
        // Each round claims new keys while the last round's complete, so
        // statements of claims alone, of completions alone and of both
        // together all run on the connection.
        let keys: Vec<ScopedKey> = (0..6).map(|_| fresh_key()).collect();
        let completing = {
            let (store, ok, leases) = (Arc::clone(&store), ok.clone(), std::mem::take(&mut held));
            tokio::spawn(async move {
                let mut tasks = Vec::new();
                for (i, lease) in leases.into_iter().enumerate() {
                    let (store, ok) = (Arc::clone(&store), ok.clone());
                    tasks.push(tokio::spawn(async move {
                        let body = Bytes::from(format!("payload-{round}-{i}"));
                        store.complete(&lease, body, LONG, &ok).await.unwrap()
                    }));
                }
                let mut written = Vec::new();
                for task in tasks {
                    written.push(task.await.unwrap());
                }
                written
            })
        };
        for (i, mut lease) in winners(&store, &keys, 2, LONG)
            .await
            .into_iter()
            .enumerate()
        {
            let renewed = store.renew(&mut lease, LONG).await.unwrap();
            assert_eq!(
                renewed,
                Fenced::Applied,
                "round {round}: key {i}'s own lease was not renewed"
            );
            held.push(lease);
        }
        for (i, written) in completing.await.unwrap().into_iter().enumerate() {
            assert_eq!(
                written,
                Fenced::Applied,
                "round {round}: the last round's key {i} not completed"
            );
        }
    }
    let plans: Vec<(String, i64, i64)> = store
        .on_own_connection(async |c: &mut sqlx::PgConnection| {
            sqlx::query_as(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements \
                 WHERE NOT from_sql",
            )
            .fetch_all(c)
            .await
        })
        .await
        .expect("the connection's prepared statements");
    let ran = |what: &str| {
        plans
            .iter()
            .filter(|(statement, ..)| statement.contains(what))
            .map(|(_, generic, custom)| generic + custom)
            .sum::<i64>()
    };
    assert!(
        ran("done AS (UPDATE") > 0,
        "no statement carried claims and completions together: {plans:?}"
    );
    for what in ["INSERT INTO", "SET state = 'D'", "SET expires_at"] {
        assert!(
            ran(what) >= rounds,
            "a statement with `{what}` ran {} times on the connection: {plans:?}",
            ran(what)
        );
    }
    for (statement, generic, custom) in &plans {
        assert_eq!(
            *custom, 0,
            "planned for its parameters {custom} times (and {generic} generic): {statement}"
        );
    }
}

/// A retry storm on a key in flight: every claim finds the owner's lease,
/// and claims of the key waiting together are answered by one read, not
/// a statement each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_on_a_key_in_flight_is_answered_in_a_few_statements() {
    const RETRIES: usize = 200;
    let store = batching_store(1).await;
    let key = fresh_key();
    let owner = acquired(store.claim(&key, &fp("key-0"), LONG).await.unwrap());
    let before = store.write_statements();
    let answers = claim_all_at_once(&store, std::slice::from_ref(&key), RETRIES, LONG).await;
    let statements = store.write_statements() - before;
    for answer in answers.into_iter().flatten() {
        match answer {
            Claim::Existing(record) => assert_eq!(
                record.state,
                RecordState::Pending {
                    fence: owner.fence,
                    lease_expires_at_ms: owner.expires_at_ms
                }
            ),
            Claim::Acquired(lease) => panic!("a retry took the owner's key: {lease:?}"),
        }
    }
    assert!(
        statements < 40,
        "{RETRIES} claims of one key took {statements} statements"
    );
}

/// A claim that must wait for a row lock (here a transaction holding the
/// expired record of its key) is taken out of its batch: the claims of
/// other keys, queued behind it, are answered while the lock is still
/// held, and the waiting claim gets its answer once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_row_lock_holds_up_no_other_key() {
    let store = batching_store(1).await;
    let blocked = fresh_key();
    let old = acquired(
        store
            .claim(&blocked, &fp("blocked"), SHORT_TTL)
            .await
            .unwrap(),
    );
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {}.records WHERE id = $1 FOR UPDATE",
        support::run_schema()
    )))
    .bind(blocked.storage_id())
    .execute(&mut *tx)
    .await
    .unwrap();

    let waiting = {
        let (store, key) = (Arc::clone(&store), blocked.clone());
        tokio::spawn(async move { store.claim(&key, &fp("blocked"), LONG).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let others: Vec<ScopedKey> = (0..20).map(|_| fresh_key()).collect();
    for (i, answers) in claim_all_at_once(&store, &others, 1, LONG)
        .await
        .into_iter()
        .enumerate()
    {
        the_winner(i, answers);
    }
    assert!(
        !waiting.is_finished(),
        "the claim of the locked key did not wait for the lock"
    );
    tx.rollback().await.unwrap();
    let new = acquired(waiting.await.unwrap().unwrap());
    assert!(new.fence > old.fence);
}

/// A server that cannot be reached fails every job of a batch with a
/// temporary error, within the bound: none hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_every_job_of_the_batch() {
    let mut opts = PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(2)
        .operation_timeout(Duration::from_millis(500))
        .purge_interval(None)
        .batch_statements(1);
    opts.migrate = false;
    // A port nothing listens on: connecting fails, and so does every claim.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let store = Arc::new(PostgresStore::from_pool_with(pool, opts).await.unwrap());
    let keys: Vec<ScopedKey> = (0..8).map(|_| fresh_key()).collect();
    let mut tasks = Vec::new();
    for key in keys {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            store.claim(&key, &fp("x"), LONG).await
        }));
    }
    for task in tasks {
        let e = task.await.unwrap().expect_err("no server, no claim");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    }
}
