//! Databases for the tests: the shared server (127.0.0.1:5432, db `test`)
//! under a random schema per test process. Private instances (initdb in a
//! temp dir, own port) for tests that restart the server, count statements
//! or speak TLS only are testkit's `postgres_server::Server`.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use idemgate_postgres::{PostgresOptions, PostgresStore};

pub use idemgate_testkit::postgres_server::shared_url;

pub use idemgate_testkit::require;

/// A schema name for this test process: `igtest_<unix secs>_<random>`.
pub fn run_schema() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        format!("igtest_{secs}_{:08x}", rand::random::<u32>())
    })
}

/// Drops test schemas left by runs more than an hour old (a process cannot
/// drop its own at exit: statics are never dropped).
pub async fn drop_stale_schemas(pool: &sqlx::PgPool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'igtest\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for name in names {
        let secs = name
            .split('_')
            .nth(1)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        if secs.saturating_add(3600) < now
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE"
            )))
            .execute(pool)
            .await;
        }
    }
}

/// A store on the shared server under this process's schema.
pub async fn shared_store() -> PostgresStore {
    let url = shared_url();
    let opts = PostgresOptions::default()
        .schema(run_schema())
        .max_connections(8);
    match PostgresStore::connect_with(&url, opts).await {
        Ok(store) => {
            static CLEANED: OnceLock<()> = OnceLock::new();
            if CLEANED.set(()).is_ok() {
                drop_stale_schemas(store.pool()).await;
            }
            store
        }
        Err(e) if e.kind() == idemgate_engine::StoreErrorKind::Unavailable => {
            require(&format!("PostgreSQL at {url} ({e})"), false);
            unreachable!()
        }
        Err(e) => panic!("setting up the store in schema {}: {e}", run_schema()),
    }
}
