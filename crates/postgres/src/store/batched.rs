//! The claims, completions and lease renewals the store batches
//! (`crate::batch`): their parameters, their answers, and their
//! statements, alone and together.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{Attempt, Fenced, Fingerprint, Lease, Record, ScopedKey, StoreError};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::{Inner, PostgresStore};
use crate::batch::Kind;
use crate::error::map_error;
use crate::rows::{attempt_json, decode_record, fence_param, to_u64, ttl_param};

/// One parameter of a batch statement: `value` of every job, in order.
fn column<'a, J, T>(jobs: &[&'a J], value: impl Fn(&'a J) -> T) -> Vec<T> {
    jobs.iter().map(|j| value(j)).collect()
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

impl ClaimJob {
    /// The claim of `key` by a new lease with `token`.
    pub(crate) fn new(
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        token: u128,
        pending_ttl: Duration,
    ) -> Self {
        Self {
            id: key.storage_id(),
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            client_key: key.key.as_str().to_owned(),
            fingerprint: *fingerprint.as_bytes(),
            token: token.to_be_bytes(),
            ttl_ms: ttl_param(pending_ttl),
        }
    }
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
    type Owner = Inner;
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

    async fn run_one(owner: &Arc<Inner>, job: &ClaimJob) -> Result<Self::Out, StoreError> {
        let store = PostgresStore::from(owner);
        let row = store
            .bounded(Self::WHAT, async |c: &mut PgConnection| {
                store.claim_on(c, job).await
            })
            .await?;
        Ok(Claimed::from_row(row))
    }

    async fn run_many(
        owner: &Arc<Inner>,
        jobs: &[&ClaimJob],
    ) -> Result<Result<Vec<Self::Out>, sqlx::Error>, StoreError> {
        let store = PostgresStore::from(owner);
        store
            .bounded_answer(Self::WHAT, async |c: &mut PgConnection| {
                store.claim_many_on(c, jobs).await
            })
            .await
    }
}

impl PostgresStore {
    /// The batch claim statement on `conn`: each job's answer, in order.
    async fn claim_many_on(
        &self,
        conn: &mut PgConnection,
        jobs: &[&ClaimJob],
    ) -> Result<Vec<Result<Claimed, StoreError>>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.claim_batch)))
            .bind(column(jobs, |j| j.id.as_str()))
            .bind(column(jobs, |j| j.tenant.as_str()))
            .bind(column(jobs, |j| j.namespace.as_str()))
            .bind(column(jobs, |j| j.client_key.as_str()))
            .bind(column(jobs, |j| &j.fingerprint[..]))
            .bind(column(jobs, |j| &j.token[..]))
            .bind(column(jobs, |j| j.ttl_ms))
            .fetch_all(&mut *conn)
            .await?;
        let mut by_id = rows_by_id(rows)?;
        Ok(jobs
            .iter()
            .map(|j| Claimed::from_row(by_id.remove(&j.id)))
            .collect())
    }
}

/// A batch statement's rows by their `id` column: the statement returns
/// rows in no set order, and each job takes its own key's row (or none).
fn rows_by_id(rows: Vec<PgRow>) -> Result<HashMap<String, PgRow>, sqlx::Error> {
    let mut by_id = HashMap::with_capacity(rows.len());
    for row in rows {
        let id: String = row.try_get("id")?;
        by_id.insert(id, row);
    }
    Ok(by_id)
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
    type Owner = Inner;
    type Job = CompleteJob;
    type Out = Fenced;
    const WHAT: &'static str = "complete";

    fn id(job: &CompleteJob) -> &str {
        &job.id
    }

    fn bytes(job: &CompleteJob) -> usize {
        job.payload.len() + job.entry.len()
    }

    async fn run_one(owner: &Arc<Inner>, job: &CompleteJob) -> Result<Fenced, StoreError> {
        let store = PostgresStore::from(owner);
        store
            .bounded(Self::WHAT, async |c: &mut PgConnection| {
                store.complete_on(c, job).await
            })
            .await
    }

    async fn run_many(
        owner: &Arc<Inner>,
        jobs: &[&CompleteJob],
    ) -> Result<Result<Vec<Fenced>, sqlx::Error>, StoreError> {
        let store = PostgresStore::from(owner);
        store
            .bounded_answer(Self::WHAT, async |c: &mut PgConnection| {
                store.complete_many_on(c, jobs).await
            })
            .await
    }
}

impl PostgresStore {
    /// One UPDATE for all; a job it did not complete is checked alone, as
    /// a single completion that matched nothing is (a retry whose first
    /// reply was lost is still applied).
    async fn complete_many_on(
        &self,
        conn: &mut PgConnection,
        jobs: &[&CompleteJob],
    ) -> Result<Vec<Fenced>, sqlx::Error> {
        let done: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.sql.complete_batch)))
                .bind(column(jobs, |j| j.id.as_str()))
                .bind(column(jobs, |j| &j.token[..]))
                .bind(column(jobs, |j| j.fence))
                .bind(column(jobs, |j| j.payload.as_ref()))
                .bind(column(jobs, |j| j.ttl_ms))
                .bind(column(jobs, |j| j.entry.as_str()))
                .fetch_all(&mut *conn)
                .await?;
        let done: HashSet<String> = done.into_iter().collect();
        let mut outs = Vec::with_capacity(jobs.len());
        for job in jobs {
            outs.push(if done.contains(&job.id) {
                Fenced::Applied
            } else {
                self.completed_on(conn, job).await?
            });
        }
        Ok(outs)
    }
}

/// A lease renewal's parameters, as the renewal statements bind them.
#[derive(Debug)]
pub(crate) struct RenewJob {
    pub(crate) id: String,
    pub(crate) token: [u8; 16],
    pub(crate) fence: i64,
    pub(crate) ttl_ms: i64,
}

impl RenewJob {
    /// The renewal of `lease` for `pending_ttl`; `None` when its fence
    /// cannot be one of ours (so it is stale).
    pub(crate) fn new(lease: &Lease, pending_ttl: Duration) -> Option<Self> {
        Some(Self {
            id: lease.key.storage_id(),
            token: lease.token.to_be_bytes(),
            fence: fence_param(lease)?,
            ttl_ms: ttl_param(pending_ttl),
        })
    }
}

/// The new lease expiry a renewal statement returned for its row.
fn renewed_until(row: &PgRow) -> Result<u64, StoreError> {
    to_u64(row.try_get("exp_ms").map_err(map_error)?, "expiry")
}

/// Lease renewals, batched: every in-flight key renews every third of its
/// lease, so a busy replica sends many at once.
#[derive(Debug)]
pub(crate) struct Renewals;

impl Kind for Renewals {
    type Owner = Inner;
    type Job = RenewJob;
    /// The new lease expiry, or `None` when the lease is not current.
    type Out = Result<Option<u64>, StoreError>;
    const WHAT: &'static str = "renew";

    fn id(job: &RenewJob) -> &str {
        &job.id
    }

    async fn run_one(owner: &Arc<Inner>, job: &RenewJob) -> Result<Self::Out, StoreError> {
        PostgresStore::from(owner).renew_alone(job).await
    }

    async fn run_many(
        owner: &Arc<Inner>,
        jobs: &[&RenewJob],
    ) -> Result<Result<Vec<Self::Out>, sqlx::Error>, StoreError> {
        let store = PostgresStore::from(owner);
        store
            .bounded_answer(Self::WHAT, async |c: &mut PgConnection| {
                store.renew_many_on(c, jobs).await
            })
            .await
    }
}

impl PostgresStore {
    /// The single-key renewal statement, within the operation bound.
    pub(crate) async fn renew_alone(
        &self,
        job: &RenewJob,
    ) -> Result<Result<Option<u64>, StoreError>, StoreError> {
        let row = self
            .bounded(Renewals::WHAT, async |c: &mut PgConnection| {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.renew)))
                    .bind(&job.id)
                    .bind(&job.token[..])
                    .bind(job.fence)
                    .bind(job.ttl_ms)
                    .fetch_optional(&mut *c)
                    .await
            })
            .await?;
        Ok(row.as_ref().map(renewed_until).transpose())
    }

    /// The batch renewal statement on `conn`: each job's answer, in order
    /// (a lease the statement did not find current is stale).
    async fn renew_many_on(
        &self,
        conn: &mut PgConnection,
        jobs: &[&RenewJob],
    ) -> Result<Vec<Result<Option<u64>, StoreError>>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.renew_batch)))
            .bind(column(jobs, |j| j.id.as_str()))
            .bind(column(jobs, |j| &j.token[..]))
            .bind(column(jobs, |j| j.fence))
            .bind(column(jobs, |j| j.ttl_ms))
            .fetch_all(&mut *conn)
            .await?;
        let mut by_id = rows_by_id(rows)?;
        Ok(jobs
            .iter()
            .map(|j| by_id.remove(&j.id).as_ref().map(renewed_until).transpose())
            .collect())
    }
}
