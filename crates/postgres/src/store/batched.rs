//! The claims, completions and lease renewals the store batches
//! (`crate::batch`): their parameters, their answers, and their
//! statements, alone and together. Claims and completions share one
//! queue ([`Writes`]); renewals have their own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, Fenced, Fingerprint, Lease, Record, ScopedKey, StoreError, StoreErrorKind,
};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::{Inner, PostgresStore};
use crate::batch::Kind;
use crate::error::{BACKEND, map_error};
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

impl PostgresStore {
    /// The batch claim statement on `conn`: each job's answer, in order.
    async fn claim_many_on(
        &self,
        conn: &mut PgConnection,
        jobs: &[&ClaimJob],
    ) -> Result<Vec<Result<Claimed, StoreError>>, sqlx::Error> {
        let query = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.claim_batch)));
        let rows = bind_claims(query, jobs).fetch_all(&mut *conn).await?;
        let mut by_id = rows_by_id(rows)?;
        Ok(jobs
            .iter()
            .map(|j| Claimed::from_row(by_id.remove(&j.id)))
            .collect())
    }
}

/// A query of a batch statement.
type BatchQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// `query` with the claims' seven parameters bound, in the order the
/// claim batch (and the claim part of the write batch) reads them.
fn bind_claims<'q>(query: BatchQuery<'q>, jobs: &[&'q ClaimJob]) -> BatchQuery<'q> {
    query
        .bind(column(jobs, |j| j.id.as_str()))
        .bind(column(jobs, |j| j.tenant.as_str()))
        .bind(column(jobs, |j| j.namespace.as_str()))
        .bind(column(jobs, |j| j.client_key.as_str()))
        .bind(column(jobs, |j| &j.fingerprint[..]))
        .bind(column(jobs, |j| &j.token[..]))
        .bind(column(jobs, |j| j.ttl_ms))
}

/// `query` with the completions' six parameters bound, in the order the
/// completion batch (and the completion part of the write batch) reads
/// them.
fn bind_completions<'q>(query: BatchQuery<'q>, jobs: &[&'q CompleteJob]) -> BatchQuery<'q> {
    query
        .bind(column(jobs, |j| j.id.as_str()))
        .bind(column(jobs, |j| &j.token[..]))
        .bind(column(jobs, |j| j.fence))
        .bind(column(jobs, |j| j.payload.as_ref()))
        .bind(column(jobs, |j| j.ttl_ms))
        .bind(column(jobs, |j| j.entry.as_str()))
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

/// A claim or a completion. The two share one queue, so a statement
/// can carry both: under load, claims of new keys and completions of
/// keys claimed earlier wait at the same moment, and one statement (one
/// commit, one round of wake-ups) serves them all. A key is in a batch
/// at most once, so a claim and a completion of the same key (a takeover
/// and the expired owner's late completion) never meet in one statement.
#[derive(Debug)]
pub(crate) enum Write {
    Claim(ClaimJob),
    Complete(CompleteJob),
}

/// A [`Write`]'s answer, of the same variant.
#[derive(Debug)]
pub(crate) enum Written {
    Claim(Result<Claimed, StoreError>),
    Complete(Fenced),
}

impl Written {
    /// The claim's answer; an internal error if this answers a completion.
    pub(crate) fn claimed(self) -> Result<Claimed, StoreError> {
        match self {
            Self::Claim(claimed) => claimed,
            Self::Complete(_) => Err(mismatched("claim")),
        }
    }

    /// The completion's answer; an internal error if this answers a claim.
    pub(crate) fn completed(self) -> Result<Fenced, StoreError> {
        match self {
            Self::Complete(fenced) => Ok(fenced),
            Self::Claim(_) => Err(mismatched("completion")),
        }
    }
}

/// What a caller gets should a batch answer its job with another kind's
/// answer: never, as every path answers each job in its own kind.
fn mismatched(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        BACKEND,
        format!("the batch answered a {what} with another operation's answer"),
    )
}

/// Claims and completions, batched together.
#[derive(Debug)]
pub(crate) struct Writes;

impl Kind for Writes {
    type Owner = Inner;
    type Job = Write;
    type Out = Written;
    const WHAT: &'static str = "claim and complete";

    fn id(job: &Write) -> &str {
        match job {
            Write::Claim(j) => &j.id,
            Write::Complete(j) => &j.id,
        }
    }

    fn what(job: &Write) -> &'static str {
        match job {
            Write::Claim(_) => "claim",
            Write::Complete(_) => "complete",
        }
    }

    fn bytes(job: &Write) -> usize {
        match job {
            Write::Claim(_) => 0,
            Write::Complete(j) => j.payload.len() + j.entry.len(),
        }
    }

    fn share(out: &Written, to: &Write) -> Option<Written> {
        match (out, to) {
            (Written::Claim(Ok(Claimed::Existing(record))), Write::Claim(_)) => {
                Some(Written::Claim(Ok(Claimed::Existing(record.clone()))))
            }
            _ => None,
        }
    }

    async fn run_one(owner: &Arc<Inner>, job: &Write) -> Result<Written, StoreError> {
        let store = PostgresStore::from(owner);
        match job {
            Write::Claim(job) => Ok(Written::Claim(store.claim_alone(job).await)),
            Write::Complete(job) => store.complete_alone(job).await.map(Written::Complete),
        }
    }

    async fn run_many(
        owner: &Arc<Inner>,
        jobs: &[&Write],
    ) -> Result<Result<Vec<Written>, sqlx::Error>, StoreError> {
        let store = PostgresStore::from(owner);
        let claims: Vec<&ClaimJob> = jobs
            .iter()
            .filter_map(|j| match j {
                Write::Claim(c) => Some(c),
                Write::Complete(_) => None,
            })
            .collect();
        let completions: Vec<&CompleteJob> = jobs
            .iter()
            .filter_map(|j| match j {
                Write::Complete(c) => Some(c),
                Write::Claim(_) => None,
            })
            .collect();
        if completions.is_empty() {
            return store
                .bounded_answer("claim", async |c: &mut PgConnection| {
                    let outs = store.claim_many_on(c, &claims).await?;
                    Ok(outs.into_iter().map(Written::Claim).collect())
                })
                .await;
        }
        if claims.is_empty() {
            return store
                .bounded_answer("complete", async |c: &mut PgConnection| {
                    let outs = store.complete_many_on(c, &completions).await?;
                    Ok(outs.into_iter().map(Written::Complete).collect())
                })
                .await;
        }
        store
            .bounded_answer(Self::WHAT, async |c: &mut PgConnection| {
                store.write_many_on(c, jobs, &claims, &completions).await
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
        let query = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.complete_batch)));
        let rows = bind_completions(query, jobs).fetch_all(&mut *conn).await?;
        let done: HashSet<String> = rows_by_id(rows)?.into_keys().collect();
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

impl PostgresStore {
    /// The statement of claims and completions together on `conn`: each
    /// job's answer, in order. As in [`PostgresStore::complete_many_on`],
    /// a completion the statement did not apply is checked alone.
    async fn write_many_on(
        &self,
        conn: &mut PgConnection,
        jobs: &[&Write],
        claims: &[&ClaimJob],
        completions: &[&CompleteJob],
    ) -> Result<Vec<Written>, sqlx::Error> {
        self.inner.mixed_statements.fetch_add(1, Ordering::Relaxed);
        let query = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.write_batch)));
        let rows = bind_completions(bind_claims(query, claims), completions)
            .fetch_all(&mut *conn)
            .await?;
        // Keys are distinct across the batch: a claim's row and a
        // completion's never share an id.
        let mut by_id = rows_by_id(rows)?;
        let mut outs = Vec::with_capacity(jobs.len());
        for job in jobs {
            outs.push(match job {
                Write::Claim(j) => Written::Claim(Claimed::from_row(by_id.remove(&j.id))),
                Write::Complete(j) => Written::Complete(if by_id.remove(&j.id).is_some() {
                    Fenced::Applied
                } else {
                    self.completed_on(conn, j).await?
                }),
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
