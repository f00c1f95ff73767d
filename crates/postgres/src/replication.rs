//! The server settings the store's promises depend on, which `idemgate
//! check` asks a PostgreSQL server for.
//!
//! - Whether it keeps a committed DONE across a failover. A standby
//!   promoted after a failover has what was replicated to it. With
//!   asynchronous replication a commit is acknowledged before any standby
//!   has it, so an answer the store confirmed can vanish, and the retry
//!   that needed it runs the work again. Only a synchronous standby
//!   (`synchronous_standby_names` set, `synchronous_commit` at `on` or
//!   `remote_apply`) closes that gap.
//! - Whether autovacuum runs. Every completion and every lease renewal
//!   leaves the record's old row version behind, and the purge's deletes
//!   leave theirs: without autovacuum the tables and their indexes grow
//!   without bound (600,000 dead rows in ten minutes at 1,000 fresh
//!   keys/s).

use std::time::Duration;

use idemgate_engine::{StoreError, StoreErrorKind};
use sqlx::{Connection, PgConnection};

use crate::error::{BACKEND, map_error};

/// The server's settings that decide whether a commit waits for a
/// standby, and whether dead row versions are vacuumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// `synchronous_standby_names` (empty: no synchronous standby).
    pub synchronous_standby_names: String,
    /// `synchronous_commit` (`on`, `remote_apply`, `remote_write`, `local`,
    /// `off`).
    pub synchronous_commit: String,
    /// `autovacuum` (`on` or `off`).
    pub autovacuum: String,
}

impl ServerSettings {
    /// Whether a commit is acknowledged only once a standby has applied
    /// or flushed it.
    pub fn commits_survive_failover(&self) -> bool {
        !self.synchronous_standby_names.trim().is_empty()
            && matches!(self.synchronous_commit.as_str(), "on" | "remote_apply")
    }

    /// Whether autovacuum reclaims the row versions that completions,
    /// renewals and purges leave behind.
    pub fn vacuums(&self) -> bool {
        self.autovacuum == "on"
    }
}

/// Asks the server at `url` (one connection, closed after; nothing
/// written) within `timeout`.
///
/// # Errors
/// `Unavailable` when the server cannot be reached in time; the driver's
/// error otherwise (messages carry no password).
pub async fn server_settings(url: &str, timeout: Duration) -> Result<ServerSettings, StoreError> {
    let ask = async {
        let mut conn = PgConnection::connect(url).await.map_err(map_error)?;
        let show = async |name: &str, conn: &mut PgConnection| {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                .fetch_one(conn)
                .await
                .map_err(map_error)
        };
        let settings = ServerSettings {
            synchronous_standby_names: show("synchronous_standby_names", &mut conn).await?,
            synchronous_commit: show("synchronous_commit", &mut conn).await?,
            autovacuum: show("autovacuum", &mut conn).await?,
        };
        // Closing is a courtesy; the answer is already in hand.
        let _ = conn.close().await;
        Ok(settings)
    };
    tokio::time::timeout(timeout, ask)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!("no answer within {timeout:?}"),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_synchronous_standby_with_a_waiting_commit_survives() {
        let s = |names: &str, commit: &str| ServerSettings {
            synchronous_standby_names: names.into(),
            synchronous_commit: commit.into(),
            autovacuum: "on".into(),
        };
        assert!(s("FIRST 1 (s1, s2)", "on").commits_survive_failover());
        assert!(s("s1", "remote_apply").commits_survive_failover());
        assert!(!s("", "on").commits_survive_failover());
        assert!(!s("  ", "remote_apply").commits_survive_failover());
        assert!(!s("s1", "local").commits_survive_failover());
        assert!(!s("s1", "off").commits_survive_failover());
        assert!(!s("s1", "remote_write").commits_survive_failover());
    }

    #[test]
    fn only_autovacuum_on_vacuums() {
        let s = |autovacuum: &str| ServerSettings {
            synchronous_standby_names: String::new(),
            synchronous_commit: "on".into(),
            autovacuum: autovacuum.into(),
        };
        assert!(s("on").vacuums());
        assert!(!s("off").vacuums());
    }
}
