//! The `Store` operations of [`PostgresStore`]: each one statement on a
//! pooled connection, and the row decoding they share.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
    StoreErrorKind,
};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use crate::batch::Kind;
use crate::error::{BACKEND, map_error};
use crate::timeline::Entry;

use crate::store::PostgresStore;

use crate::rows::*;

impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let token = Lease::new_token();
            // Under READ COMMITTED the statement's read of the existing row uses
            // the snapshot taken when it started: a row inserted by a claim that
            // committed just after makes the insert conflict (so this claim
            // cannot win) yet is invisible to the read. The statement then
            // returns nothing; running it again, with a fresh snapshot, sees it.
            let job = ClaimJob {
                id: key.storage_id(),
                tenant: key.tenant.clone(),
                namespace: key.namespace.clone(),
                client_key: key.key.as_str().to_owned(),
                fingerprint: *fingerprint.as_bytes(),
                token: token.to_be_bytes(),
                ttl_ms: ttl_param(pending_ttl),
            };
            for _ in 0..5 {
                match self.claim_once(&job).await? {
                    Claimed::Acquired {
                        fence,
                        expires_at_ms,
                    } => {
                        return Ok(Claim::Acquired(Lease {
                            key: key.clone(),
                            token,
                            fence,
                            expires_at_ms,
                            fingerprint: *fingerprint,
                        }));
                    }
                    Claimed::Existing(record) => return Ok(Claim::Existing(record)),
                    Claimed::Raced => {}
                }
            }
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                "claim kept racing with concurrent changes to the key",
            ))
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence_param(lease) else {
                return Ok(Fenced::Stale);
            };
            let row = self
                .bounded("renew", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.renew)))
                        .bind(lease.key.storage_id())
                        .bind(lease.token.to_be_bytes().to_vec())
                        .bind(fence)
                        .bind(ttl_param(pending_ttl))
                        .fetch_optional(&mut *c)
                        .await
                })
                .await?;
            match row {
                Some(row) => {
                    lease.expires_at_ms =
                        to_u64(row.try_get("exp_ms").map_err(map_error)?, "expiry")?;
                    Ok(Fenced::Applied)
                }
                None => Ok(Fenced::Stale),
            }
        })
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let Some(job) = CompleteJob::new(lease, payload, done_ttl, attempt)? else {
                return Ok(Fenced::Stale);
            };
            let written = match &self.inner.completions {
                Some(batches) => batches.run(job).await?,
                None => {
                    self.bounded("complete", async |c: &mut PgConnection| {
                        self.complete_on(c, &job).await
                    })
                    .await?
                }
            };
            if written == Fenced::Applied {
                self.inner.notify.notify(&lease.key.storage_id());
            }
            Ok(written)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence_param(lease) else {
                return Ok(Fenced::Stale);
            };
            let entry = attempt_json(attempt)?;
            let row = self
                .bounded("release", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.release)))
                        .bind(lease.key.storage_id())
                        .bind(lease.token.to_be_bytes().to_vec())
                        .bind(fence)
                        .bind(entry)
                        .bind(ttl_param(timeline_ttl))
                        .fetch_one(&mut *c)
                        .await
                })
                .await?;
            let written = applied(&row)?;
            if written == Fenced::Applied {
                self.inner.notify.notify(&lease.key.storage_id());
            }
            Ok(written)
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let entry = attempt_json(attempt)?;
            let row = self
                .bounded("forget", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.forget)))
                        .bind(key.storage_id())
                        .bind(entry)
                        .bind(ttl_param(timeline_ttl))
                        .fetch_one(c)
                        .await
                })
                .await?;
            let removed = applied(&row)? == Fenced::Applied;
            if removed {
                self.inner.notify.notify(&key.storage_id());
            }
            Ok(removed)
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let row = self
                .bounded("get", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.get)))
                        .bind(key.storage_id())
                        .fetch_optional(&mut *c)
                        .await
                })
                .await?;
            row.as_ref().map(decode_record).transpose()
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let entry = attempt_json(attempt)?;
            if let Some(writer) = &self.inner.timeline {
                writer.push(Entry {
                    id: key.storage_id(),
                    json: entry,
                    keep_ms: ttl_param(ttl),
                });
                return Ok(());
            }
            self.bounded("record_attempt", async |c: &mut PgConnection| {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.record_attempt)))
                    .bind(key.storage_id())
                    .bind(entry)
                    .bind(ttl_param(ttl))
                    .execute(&mut *c)
                    .await
            })
            .await?;
            Ok(())
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let rows = self
                .bounded("timeline", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.timeline)))
                        .bind(key.storage_id())
                        .fetch_all(&mut *c)
                        .await
                })
                .await?;
            rows.iter()
                .map(|row| {
                    let entry: String = row.try_get("entry").map_err(map_error)?;
                    attempt_from_entry(&entry)
                })
                .collect()
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.inner
                .notify
                .wait(&key.storage_id(), max.min(Duration::from_millis(50)))
                .await;
        })
    }
}

/// A claim's parameters, as the claim statements bind them.
#[derive(Clone, Debug)]
pub(crate) struct ClaimJob {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) namespace: String,
    pub(crate) client_key: String,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) token: [u8; 16],
    pub(crate) ttl_ms: i64,
}

/// What a claim statement said about its key.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The claim took the key.
    Acquired { fence: u64, expires_at_ms: u64 },
    /// The key is taken, or done: its record, unchanged.
    Existing(Record),
    /// The statement raced a concurrent change to the key and saw neither
    /// its own insert nor the other's row: it must run again.
    Raced,
}

impl Claimed {
    /// Decodes the claim statement's row for the key (none: it raced).
    pub(crate) fn from_row(row: Option<PgRow>) -> Result<Self, StoreError> {
        let Some(row) = row else {
            return Ok(Self::Raced);
        };
        if row.try_get("acquired").map_err(map_error)? {
            return Ok(Self::Acquired {
                fence: to_u64(row.try_get("fence").map_err(map_error)?, "fence")?,
                expires_at_ms: to_u64(row.try_get("exp_ms").map_err(map_error)?, "expiry")?,
            });
        }
        Ok(Self::Existing(decode_record(&row)?))
    }
}

/// Claims, batched.
#[derive(Debug)]
pub(crate) struct Claims;

impl Kind for Claims {
    type Job = ClaimJob;
    type Out = Result<Claimed, StoreError>;
    const WHAT: &'static str = "claim";

    fn id(job: &ClaimJob) -> &str {
        &job.id
    }

    fn share(out: &Self::Out) -> Option<Self::Out> {
        match out {
            Ok(Claimed::Existing(record)) => Some(Ok(Claimed::Existing(record.clone()))),
            _ => None,
        }
    }

    async fn run_one(
        store: &PostgresStore,
        conn: &mut PgConnection,
        job: &ClaimJob,
    ) -> Result<Self::Out, sqlx::Error> {
        Ok(Claimed::from_row(store.claim_on(conn, job).await?))
    }

    async fn run_many(
        store: &PostgresStore,
        conn: &mut PgConnection,
        jobs: &[&ClaimJob],
    ) -> Result<Vec<Self::Out>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&store.inner.sql.claim_batch)))
            .bind(jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.tenant.as_str()).collect::<Vec<_>>())
            .bind(
                jobs.iter()
                    .map(|j| j.namespace.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                jobs.iter()
                    .map(|j| j.client_key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(jobs.iter().map(|j| &j.fingerprint[..]).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| &j.token[..]).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.ttl_ms).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?;
        let mut by_id = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: String = row.try_get("id")?;
            by_id.insert(id, row);
        }
        Ok(jobs
            .iter()
            .map(|j| Claimed::from_row(by_id.remove(&j.id)))
            .collect())
    }
}

/// A completion's parameters, as the completion statements bind them.
#[derive(Debug)]
pub(crate) struct CompleteJob {
    pub(crate) id: String,
    pub(crate) token: [u8; 16],
    pub(crate) fence: i64,
    pub(crate) payload: Bytes,
    pub(crate) ttl_ms: i64,
    pub(crate) entry: String,
}

impl CompleteJob {
    /// The completion of `lease`; `None` when its fence cannot be one of
    /// ours (so it is stale).
    pub(crate) fn new(
        lease: &Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &Attempt,
    ) -> Result<Option<Self>, StoreError> {
        let Some(fence) = fence_param(lease) else {
            return Ok(None);
        };
        Ok(Some(Self {
            id: lease.key.storage_id(),
            token: lease.token.to_be_bytes(),
            fence,
            payload,
            ttl_ms: ttl_param(done_ttl),
            entry: attempt_json(attempt)?,
        }))
    }
}

/// Completions, batched.
#[derive(Debug)]
pub(crate) struct Completions;

impl Kind for Completions {
    type Job = CompleteJob;
    type Out = Fenced;
    const WHAT: &'static str = "complete";

    fn id(job: &CompleteJob) -> &str {
        &job.id
    }

    fn bytes(job: &CompleteJob) -> usize {
        job.payload.len() + job.entry.len()
    }

    async fn run_one(
        store: &PostgresStore,
        conn: &mut PgConnection,
        job: &CompleteJob,
    ) -> Result<Fenced, sqlx::Error> {
        store.complete_on(conn, job).await
    }

    /// One UPDATE for all; a job it did not complete is checked alone, as
    /// a single completion that matched nothing is (a retry whose first
    /// reply was lost is still applied).
    async fn run_many(
        store: &PostgresStore,
        conn: &mut PgConnection,
        jobs: &[&CompleteJob],
    ) -> Result<Vec<Fenced>, sqlx::Error> {
        let done: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&store.inner.sql.complete_batch)))
                .bind(jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>())
                .bind(jobs.iter().map(|j| &j.token[..]).collect::<Vec<_>>())
                .bind(jobs.iter().map(|j| j.fence).collect::<Vec<_>>())
                .bind(jobs.iter().map(|j| j.payload.as_ref()).collect::<Vec<_>>())
                .bind(jobs.iter().map(|j| j.ttl_ms).collect::<Vec<_>>())
                .bind(jobs.iter().map(|j| j.entry.as_str()).collect::<Vec<_>>())
                .fetch_all(&mut *conn)
                .await?;
        let done: HashSet<String> = done.into_iter().collect();
        let mut outs = Vec::with_capacity(jobs.len());
        for job in jobs {
            outs.push(if done.contains(&job.id) {
                Fenced::Applied
            } else {
                store.completed_on(conn, job).await?
            });
        }
        Ok(outs)
    }
}
