//! [`PostgresStore`]: the `Store` trait over PostgreSQL, plus
//! [`PostgresStore::complete_in`] for committing DONE inside the caller's
//! own transaction.
//!
//! Each `Store` call is one short step on a pooled connection (a claim is
//! a single statement), so a claim stays atomic across replicas and no
//! transaction stays open while the work itself runs.

mod batched;

pub(crate) use batched::{ClaimJob, Claimed, CompleteJob, RenewJob, Renewals, Write, Writes};

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::backend::KeyedNotify;
use idemgate_engine::{Attempt, Fenced, Lease, LeaseGuard, StoreError, StoreErrorKind};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use crate::batch::{Batcher, Counts};
use crate::connections::{Connections, Unlent};
use crate::error::{BACKEND, map_error};
use crate::options::PostgresOptions;
use crate::rows::{applied, fence_param};
use crate::sql::{SCHEMA_VERSION, Sql, valid_identifier};
use crate::timeline::TimelineWriter;

/// The PostgreSQL store. Cheap to clone: clones share the pool.
///
/// One row per scoped key in `<schema>.records` (primary key: the storage
/// id) and one row per attempt in `<schema>.timeline`. Every operation is
/// one statement, hence one round trip; fences come from one sequence, so
/// they grow across every claim the database ever made.
///
/// Waiters ([`Store::changed`](idemgate_engine::Store::changed)) are woken at once by changes made through
/// this store instance and otherwise poll every 50 ms. `LISTEN/NOTIFY` was
/// not used: a `NOTIFY` in the completing transaction takes a database-wide
/// lock at commit, serialising every completion, and a listener can miss
/// notifications while it reconnects, so waiters would have to poll anyway.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

impl From<&Arc<Inner>> for PostgresStore {
    fn from(inner: &Arc<Inner>) -> Self {
        Self {
            inner: Arc::clone(inner),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    /// The connections the `Store` operations run on.
    pub(crate) connections: Arc<Connections>,
    pub(crate) sql: Sql,
    pub(crate) opts: PostgresOptions,
    pub(crate) notify: KeyedNotify,
    /// Background writer of timeline entries that change no record.
    pub(crate) timeline: Option<TimelineWriter>,
    /// The queues of batched claims and completions (one queue) and of
    /// renewals (`batch`); `None` when batching is off (each runs its own
    /// statement).
    pub(crate) writes: Option<Batcher<Writes>>,
    pub(crate) renewals: Option<Batcher<Renewals>>,
    /// Statements that carried claims and completions together.
    pub(crate) mixed_statements: AtomicU64,
}

impl PostgresStore {
    /// Connects with default options. See [`PostgresStore::connect_with`].
    ///
    /// # Errors
    /// As [`PostgresStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Opens a pool to `url` (`postgres://user@host:port/db`, with
    /// `?sslmode=…&sslrootcert=…` for TLS) and, unless disabled, creates or
    /// upgrades the schema.
    ///
    /// # Errors
    /// `Rejected` for a malformed URL or option, a server certificate that
    /// is not trusted, or a database whose schema is newer than this build;
    /// `Unavailable` when the server cannot be reached.
    pub async fn connect_with(url: &str, opts: PostgresOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(map_error)?
            .application_name("idemgate");
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(1))
            .acquire_timeout(opts.operation_timeout)
            // A ping before every use would double the round trips; a dead
            // connection instead fails one operation with `Unavailable`
            // and is discarded.
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(map_error)?;
        Self::from_pool_with(pool, opts).await
    }

    /// A store over an existing pool, with default options.
    ///
    /// # Errors
    /// As [`PostgresStore::from_pool_with`].
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        Self::from_pool_with(pool, PostgresOptions::default()).await
    }

    /// A store over an existing pool. The `Store` operations run on
    /// connections the store opens itself, up to `opts.max_connections`,
    /// with the pool's connect options (its `after_connect` hook is not
    /// run on them); the pool serves the migration, the background
    /// timeline writer, the purge and your own transactions. Creates or upgrades the schema unless
    /// `opts.migrate` is false, and starts the background purge (inside a
    /// tokio runtime) unless `opts.purge_interval` is `None`; the purge stops
    /// when the last clone of the store is dropped.
    ///
    /// # Errors
    /// `Rejected` for an invalid schema or table name, or a database whose
    /// schema is newer than this build; other errors from the migration.
    pub async fn from_pool_with(pool: PgPool, opts: PostgresOptions) -> Result<Self, StoreError> {
        for (what, name) in [
            ("schema", &opts.schema),
            ("records table", &opts.records_table),
            ("timeline table", &opts.timeline_table),
        ] {
            if !valid_identifier(name) {
                return Err(StoreError::new(
                    StoreErrorKind::Rejected,
                    BACKEND,
                    format!(
                        "{what} name {name:?} must be 1-48 lower-case letters, digits or '_', \
                         not starting with a digit"
                    ),
                ));
            }
        }
        let sql = Sql::for_options(&opts);
        let timeline = if opts.background_timeline {
            TimelineWriter::start(
                pool.clone(),
                Arc::clone(&sql.record_attempts),
                opts.operation_timeout,
            )
        } else {
            None
        };
        // Batch workers need a runtime to run on, as the purge does.
        let batch_workers = usize::try_from(opts.batch_statements).unwrap_or(0);
        let batching = batch_workers > 0 && tokio::runtime::Handle::try_current().is_ok();
        let (writes, writes_rx) = Batcher::unless_off(batching, opts.operation_timeout);
        let (renewals, renewals_rx) = Batcher::unless_off(batching, opts.operation_timeout);
        let store = Self {
            inner: Arc::new(Inner {
                connections: Connections::new(
                    pool.connect_options(),
                    opts.max_connections,
                    opts.operation_timeout,
                ),
                pool,
                sql,
                opts,
                notify: KeyedNotify::new(),
                timeline,
                writes,
                renewals,
                mixed_statements: AtomicU64::new(0),
            }),
        };
        if let Some(rx) = writes_rx {
            rx.start(Arc::downgrade(&store.inner), batch_workers);
        }
        if let Some(rx) = renewals_rx {
            rx.start(Arc::downgrade(&store.inner), batch_workers);
        }
        if store.inner.opts.migrate {
            store.migrate().await?;
        }
        if let (Some(every), Ok(handle)) = (
            store.inner.opts.purge_interval,
            tokio::runtime::Handle::try_current(),
        ) {
            handle.spawn(purge_task(Arc::downgrade(&store.inner), every));
        }
        Ok(store)
    }

    /// Creates the schema or brings it to this build's version, under an
    /// advisory lock so that replicas starting together migrate once.
    ///
    /// # Errors
    /// `Rejected` when the database's schema version is newer than this
    /// build knows (an older binary must not write a newer layout).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let sql = &self.inner.sql;
        let mut tx = self.inner.pool.begin().await.map_err(map_error)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idemgate-migrate:{}", sql.schema))
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        sqlx::raw_sql(AssertSqlSafe(Arc::clone(&sql.bootstrap)))
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        let current: Option<i32> = sqlx::query(AssertSqlSafe(Arc::clone(&sql.version)))
            .fetch_one(&mut *tx)
            .await
            .and_then(|row| row.try_get("version"))
            .map_err(map_error)?;
        let current = current.unwrap_or(0);
        if current > SCHEMA_VERSION {
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                BACKEND,
                format!(
                    "schema {:?} is at version {current}, newer than the {SCHEMA_VERSION} this \
                     build knows; upgrade idemgate",
                    sql.schema
                ),
            ));
        }
        for step in sql
            .migrations
            .iter()
            .skip(usize::try_from(current).unwrap_or(0))
        {
            sqlx::raw_sql(AssertSqlSafe(Arc::clone(step)))
                .execute(&mut *tx)
                .await
                .map_err(map_error)?;
        }
        tx.commit().await.map_err(map_error)
    }

    /// The pool (for the caller's own transactions, e.g. with
    /// [`PostgresStore::complete_in`]).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The options in force.
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.opts
    }

    /// Deletes expired records and timeline entries now, in batches of
    /// `purge_batch` rows; returns how many rows went.
    ///
    /// # Errors
    /// A store error from a batch; rows deleted by earlier batches stay deleted.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        for stmt in [
            &self.inner.sql.purge_records,
            &self.inner.sql.purge_timeline,
        ] {
            loop {
                let done = self
                    .bounded("purge", async |c: &mut PgConnection| {
                        sqlx::query(AssertSqlSafe(Arc::clone(stmt)))
                            .execute(&mut *c)
                            .await
                    })
                    .await?
                    .rows_affected();
                total += done;
                if done < u64::from(self.inner.opts.purge_batch.max(1)) {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Makes the key's PENDING record the caller's transaction's until it
    /// ends: stops `guard`'s heartbeat (once a renewal on its way has
    /// landed), then locks the record's row in `conn`. Returns
    /// [`Fenced::Stale`] when the lease is no longer current.
    ///
    /// Call it as the **first statement** of a transaction that ends with
    /// [`PostgresStore::complete_in`]. At REPEATABLE READ and SERIALIZABLE
    /// it is required: the transaction's snapshot is taken by its first
    /// statement, and a heartbeat renewal committed after it would make
    /// the completion fail with a serialization error. With the row
    /// locked, nothing else writes it until the commit, and no other owner
    /// can take the key over however long the transaction runs (a claim
    /// waits for the commit, then finds DONE). At READ COMMITTED it is
    /// optional and gives the same protection against a takeover.
    ///
    /// # Errors
    /// A store error; the caller's transaction must then be rolled back.
    pub async fn lock_in(
        &self,
        conn: &mut PgConnection,
        guard: &mut LeaseGuard,
    ) -> Result<Fenced, StoreError> {
        guard.pause_heartbeat().await;
        let lease = guard.lease();
        let Some(fence) = fence_param(lease) else {
            return Ok(Fenced::Stale);
        };
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.lock)))
            .bind(lease.key.storage_id())
            .bind(lease.token.to_be_bytes().to_vec())
            .bind(fence)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_error)?;
        applied(&row)
    }

    /// PENDING → DONE **inside the caller's transaction**: the business
    /// writes made on `conn` and the DONE record commit or roll back together.
    /// Begin the transaction with [`PostgresStore::lock_in`] (required at
    /// REPEATABLE READ and SERIALIZABLE).
    ///
    /// Same contract as [`Store::complete`](idemgate_engine::Store::complete); the DONE record (and its
    /// timeline entry) exists only once the caller commits. The row is
    /// locked from this call until the commit, so a concurrent claim waits
    /// and then sees DONE. Returns [`Fenced::Stale`] when the lease is no
    /// longer current: the caller must then roll back its writes, since
    /// another owner has (or will have) done the work.
    ///
    /// ```no_run
    /// # async fn demo(store: idemgate_postgres::PostgresStore, mut guard: idemgate_engine::LeaseGuard,
    /// #     attempt: idemgate_engine::Attempt) -> Result<(), Box<dyn std::error::Error>> {
    /// use idemgate_engine::Fenced;
    /// let mut tx = store.pool().begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE").await?;
    /// if store.lock_in(&mut tx, &mut guard).await? == Fenced::Stale {
    ///     return Ok(()); // another owner has the key
    /// }
    /// sqlx::query("INSERT INTO charges (amount) VALUES (5)").execute(&mut *tx).await?;
    /// let ttl = std::time::Duration::from_secs(86_400);
    /// match store.complete_in(&mut tx, guard.lease(), "ok".into(), ttl, &attempt).await? {
    ///     idemgate_engine::Fenced::Applied => tx.commit().await?,
    ///     idemgate_engine::Fenced::Stale => tx.rollback().await?,
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A store error; the caller's transaction is then unusable (PostgreSQL
    /// aborts it) and must be rolled back.
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &Attempt,
    ) -> Result<Fenced, StoreError> {
        let Some(job) = CompleteJob::new(lease, payload, done_ttl, attempt)? else {
            return Ok(Fenced::Stale);
        };
        self.complete_on(conn, &job).await.map_err(map_error)
    }

    /// The completion's statements on `conn`: the UPDATE, then, only when
    /// it matched nothing, the check for the DONE row this very lease
    /// wrote with this payload (a retry whose first reply was lost).
    pub(crate) async fn complete_on(
        &self,
        conn: &mut PgConnection,
        job: &CompleteJob,
    ) -> Result<Fenced, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.complete)))
            .bind(&job.id)
            .bind(&job.token[..])
            .bind(job.fence)
            .bind(job.payload.as_ref())
            .bind(job.ttl_ms)
            .bind(&job.entry)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() > 0 {
            return Ok(Fenced::Applied);
        }
        self.completed_on(conn, job).await
    }

    /// Whether the key's DONE row is the one `job`'s lease wrote with its
    /// payload: a completion retried after its reply was lost is applied.
    pub(crate) async fn completed_on(
        &self,
        conn: &mut PgConnection,
        job: &CompleteJob,
    ) -> Result<Fenced, sqlx::Error> {
        let again: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.sql.completed)))
            .bind(&job.id)
            .bind(&job.token[..])
            .bind(job.fence)
            .bind(job.payload.as_ref())
            .fetch_one(&mut *conn)
            .await?;
        Ok(if again > 0 {
            Fenced::Applied
        } else {
            Fenced::Stale
        })
    }

    /// Runs `run` on one of the store's connections within the operation
    /// bound, waiting for the connection included. The connection goes
    /// back as soon as `run` has read its whole answer (see
    /// [`Connections`]); one whose statement overran the bound, or that
    /// failed outside the database, is closed: it may have gone silent.
    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        run: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        self.bounded_answer(what, run).await?.map_err(map_error)
    }

    /// As [`PostgresStore::bounded`], but an error the server answered
    /// with, on a connection that stays usable, comes back as the inner
    /// `Err` (a batch then runs its jobs one by one); the outer `Err` is
    /// everything else: no connection, a time-out, a failed connection.
    pub(crate) async fn bounded_answer<T>(
        &self,
        what: &'static str,
        run: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<Result<T, sqlx::Error>, StoreError> {
        let timed_out = || {
            StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!("{what} did not finish in time"),
            )
        };
        let deadline = tokio::time::Instant::now() + self.inner.opts.operation_timeout;
        let mut lent = match self.inner.connections.lend(deadline).await {
            Ok(lent) => lent,
            Err(Unlent::TimedOut) => return Err(timed_out()),
            Err(Unlent::Connect(e)) => return Err(map_error(e)),
        };
        match tokio::time::timeout_at(deadline, run(lent.conn())).await {
            Ok(result) => lent.finish(result).map_err(map_error),
            Err(_) => {
                lent.overran();
                Err(timed_out())
            }
        }
    }

    /// Runs `run` on one of the store's own connections, as an operation
    /// (for tests that look at a connection's state, e.g. its prepared
    /// statements).
    #[doc(hidden)]
    pub async fn on_own_connection<T>(
        &self,
        run: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        self.bounded("a test's statement", run).await
    }

    /// Claims, completions and renewals so far that shared their
    /// statement with another (for tests that must see batches form).
    #[doc(hidden)]
    pub fn batched_jobs(&self) -> u64 {
        let shared = |counts: &Counts| counts.shared.load(Ordering::Relaxed);
        self.inner.writes.as_ref().map_or(0, |b| shared(b.counts()))
            + self
                .inner
                .renewals
                .as_ref()
                .map_or(0, |b| shared(b.counts()))
    }

    /// Renewal statements the batch workers have sent so far (for tests
    /// that count round trips).
    #[doc(hidden)]
    pub fn renew_statements(&self) -> u64 {
        self.inner
            .renewals
            .as_ref()
            .map_or(0, |b| b.counts().statements.load(Ordering::Relaxed))
    }

    /// Statements of claims and completions the batch workers have sent
    /// so far (for tests that count round trips).
    #[doc(hidden)]
    pub fn write_statements(&self) -> u64 {
        self.inner
            .writes
            .as_ref()
            .map_or(0, |b| b.counts().statements.load(Ordering::Relaxed))
    }

    /// Statements that carried claims and completions together so far
    /// (for tests that must see such statements form).
    #[doc(hidden)]
    pub fn mixed_statements(&self) -> u64 {
        self.inner.mixed_statements.load(Ordering::Relaxed)
    }

    /// The store's own connections in use right now, an abandoned
    /// operation's settling included (tests wait for none before they
    /// freeze the network).
    #[doc(hidden)]
    pub fn busy_connections(&self) -> usize {
        self.inner.connections.busy()
    }

    /// One claim: through the batch queue when batching is on.
    pub(crate) async fn claim_once(&self, job: &ClaimJob) -> Result<Claimed, StoreError> {
        match &self.inner.writes {
            Some(batches) => batches.run(Write::Claim(job.clone())).await?.claimed(),
            None => self.claim_alone(job).await,
        }
    }

    /// The single-key claim statement, within the operation bound.
    pub(crate) async fn claim_alone(&self, job: &ClaimJob) -> Result<Claimed, StoreError> {
        let row = self
            .bounded("claim", async |c: &mut PgConnection| {
                self.claim_on(c, job).await
            })
            .await?;
        Claimed::from_row(row)
    }

    /// The single-key completion (and, when it matched nothing, the check
    /// of an earlier write), within the operation bound.
    pub(crate) async fn complete_alone(&self, job: &CompleteJob) -> Result<Fenced, StoreError> {
        self.bounded("complete", async |c: &mut PgConnection| {
            self.complete_on(c, job).await
        })
        .await
    }

    /// The single-key claim statement on `conn`.
    pub(crate) async fn claim_on(
        &self,
        conn: &mut PgConnection,
        job: &ClaimJob,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.claim)))
            .bind(&job.id)
            .bind(&job.tenant)
            .bind(&job.namespace)
            .bind(&job.client_key)
            .bind(&job.fingerprint[..])
            .bind(&job.token[..])
            .bind(job.ttl_ms)
            .fetch_optional(&mut *conn)
            .await
    }
}

async fn purge_task(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let store = PostgresStore { inner };
        if let Err(e) = store.purge_expired().await {
            tracing::warn!(error = %e, "purging expired idempotency records failed");
        }
    }
}
