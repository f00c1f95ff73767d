//! [`PostgresOptions`]: the store's connection, pool and schema settings,
//! kept apart from the store so the URL parser and the store share them.

use std::time::Duration;

/// Settings of a [`PostgresStore`](crate::PostgresStore). `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Schema holding the store's tables (default `idemgate`); created on
    /// connect. Lower-case letters, digits and `_` only.
    pub schema: String,
    /// Name of the records table (default `records`).
    pub records_table: String,
    /// Name of the timeline table (default `timeline`).
    pub timeline_table: String,
    /// Most connections the store's operations use at once (default 10).
    /// They are the store's own, opened on demand with the pool's connect
    /// options. The sqlx pool (migrations, the background timeline writer,
    /// the purge, the caller's transactions) is another set: when the store
    /// opens it ([`PostgresStore::connect_with`](crate::PostgresStore::connect_with)), it has the same bound.
    pub max_connections: u32,
    /// Upper bound on one store operation, waiting for a pooled connection
    /// included (default 5 s). [`PostgresStore::complete_in`](crate::PostgresStore::complete_in) is not bounded:
    /// it runs on the caller's connection.
    pub operation_timeout: Duration,
    /// How often expired rows are purged (default 30 s); `None` disables the
    /// background purge (call [`PostgresStore::purge_expired`](crate::PostgresStore::purge_expired) yourself).
    pub purge_interval: Option<Duration>,
    /// Rows deleted per purge statement (default 1000).
    pub purge_batch: u32,
    /// Whether connecting creates or upgrades the schema (default true).
    pub migrate: bool,
    /// Whether timeline entries that change no record (replays,
    /// conflicts, mismatches) are written by a background task in batches
    /// (default true), so that a replay costs one round trip instead of two.
    /// Such entries are best effort either way.
    pub background_timeline: bool,
    /// Whether a claim's commit waits for its WAL to be flushed (default
    /// true). `false` commits claims with `synchronous_commit = off` (in
    /// the claim's own statement, so it stays one round trip); results,
    /// releases and forgets stay synchronous, and so do claims that share
    /// a statement with completions.
    ///
    /// The trade: a database crash can lose claims acknowledged in the
    /// last moments before it (up to three `wal_writer_delay`s, 600 ms by
    /// default), while their owners, on replicas that did not crash, go on
    /// running the work. A retry arriving after the database is back then
    /// claims the key and runs the work a second time; the first owner's
    /// completion is fenced and counted (`idempotency_fenced_total`). With
    /// the default, an acknowledged claim survives the crash and the retry
    /// finds the key in flight.
    pub synchronous_claims: bool,
    /// How many statements of claims and completions, and as many of
    /// lease renewals, run at once, each carrying every claim and
    /// completion (renewal) that was waiting when it was sent (default
    /// 1); 0 gives every one a statement of its own. A request that finds a worker free goes at
    /// once, alone, so batching holds nothing back to fill a batch; under
    /// load, one statement and one commit serve many keys, which costs the
    /// server far less CPU per key (half or less, in BENCHMARKS.md). Each
    /// running statement takes one of the `max_connections`.
    pub batch_statements: u32,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: "idemgate".to_owned(),
            records_table: "records".to_owned(),
            timeline_table: "timeline".to_owned(),
            max_connections: 10,
            operation_timeout: Duration::from_secs(5),
            purge_interval: Some(Duration::from_secs(30)),
            purge_batch: 1000,
            migrate: true,
            background_timeline: true,
            synchronous_claims: true,
            batch_statements: 1,
        }
    }
}

impl PostgresOptions {
    /// Sets the schema name.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets the bound on one operation.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Sets whether timeline entries of replays and conflicts are written in
    /// the background.
    pub fn background_timeline(mut self, on: bool) -> Self {
        self.background_timeline = on;
        self
    }

    /// Sets whether claims are committed synchronously (see
    /// [`PostgresOptions::synchronous_claims`] for what turning it off
    /// trades).
    pub fn synchronous_claims(mut self, on: bool) -> Self {
        self.synchronous_claims = on;
        self
    }

    /// Sets how many batch statements of claims and completions, and as
    /// many of renewals, run at once (0: none, one statement per claim,
    /// completion and renewal).
    pub fn batch_statements(mut self, n: u32) -> Self {
        self.batch_statements = n;
        self
    }

    /// Sets (or with `None` disables) the background purge interval.
    pub fn purge_interval(mut self, every: Option<Duration>) -> Self {
        self.purge_interval = every;
        self
    }
}
