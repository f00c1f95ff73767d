//! [`PostgresOptions`]: the store's connection, pool and schema settings,
//! kept apart from the store so the URL parser and the store share them.

use std::time::Duration;

/// Settings of a [`PostgresStore`]. `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Schema holding the store's tables (default `idemgate`); created on
    /// connect. Lower-case letters, digits and `_` only.
    pub schema: String,
    /// Name of the records table (default `records`).
    pub records_table: String,
    /// Name of the timeline table (default `timeline`).
    pub timeline_table: String,
    /// Pool size when the store opens its own pool (default 10).
    pub max_connections: u32,
    /// Upper bound on one store operation, waiting for a pooled connection
    /// included (default 5 s). [`PostgresStore::complete_in`] is not bounded:
    /// it runs on the caller's connection.
    pub operation_timeout: Duration,
    /// How often expired rows are purged (default 30 s); `None` disables the
    /// background purge (call [`PostgresStore::purge_expired`] yourself).
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

    /// Sets (or with `None` disables) the background purge interval.
    pub fn purge_interval(mut self, every: Option<Duration>) -> Self {
        self.purge_interval = every;
        self
    }
}
