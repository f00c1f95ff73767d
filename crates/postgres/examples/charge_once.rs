//! Charge credits and save a report exactly once: the business writes and the
//! DONE record commit in **one** PostgreSQL transaction.
//!
//! Run with: `cargo run -p idemgate-postgres --example charge_once`
//! (run it twice: the second run replays; `DATABASE_URL` defaults to
//! `postgres://postgres@127.0.0.1:5432/test`).
//!
//! Both ways a charge goes wrong are impossible here: a retry after a crash
//! cannot charge twice (the key is claimed first, and DONE commits with the
//! charge), and a crash between the charge and the commit cannot leave a
//! charge without its result (both roll back together; the lease then
//! expires and a retry runs the whole operation again).
//!
//! Environment: `DATABASE_URL`, `CHARGE_ONCE_SCHEMA` (default
//! `charge_once_demo`), `CHARGE_ONCE_KEY` (the idempotency key, default
//! `order-8123-q3-report`), and `CHARGE_ONCE_PAUSE=before_commit`, which makes
//! the program print `CHARGED-NOT-COMMITTED` after the charge and wait there
//! (so a test can kill it at the worst moment).

use std::error::Error;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_engine::{
    Attempt, AttemptOutcome, Begin, ClientKey, Engine, Fenced, Fingerprint, Policy, ScopedKey,
};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use sqlx::{AssertSqlSafe, Row};

/// Printed once the charge is written but not committed (pause mode only).
pub const PAUSE_MARKER: &str = "CHARGED-NOT-COMMITTED";

/// Credits one run charges.
const CREDITS: i64 = 5;

/// What one run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database URL.
    pub url: String,
    /// Schema of the business tables and of the idempotency store.
    pub schema: String,
    /// The idempotency key of the operation.
    pub key: String,
    /// Stop between the charge and the commit, printing [`PAUSE_MARKER`].
    pub pause_before_commit: bool,
}

impl Config {
    /// Reads the configuration from the environment.
    pub fn from_env() -> Self {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        Self {
            url: var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
            schema: var("CHARGE_ONCE_SCHEMA", "charge_once_demo"),
            key: var("CHARGE_ONCE_KEY", "order-8123-q3-report"),
            pause_before_commit: std::env::var("CHARGE_ONCE_PAUSE")
                .is_ok_and(|v| v == "before_commit"),
        }
    }
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This run charged and saved the report; the stored result.
    Executed(String),
    /// An earlier run did; its stored result.
    Replayed(String),
}

type BoxError = Box<dyn Error + Send + Sync>;

/// Charges and reports once for `cfg.key`, or replays the stored result.
///
/// # Errors
/// Database errors, a key still in flight after the wait, or a lost lease.
pub async fn run(cfg: &Config) -> Result<Outcome, BoxError> {
    let opts = PostgresOptions::default()
        .schema(&cfg.schema)
        .max_connections(4);
    let store = PostgresStore::connect_with(&cfg.url, opts).await?;
    let pool = store.pool().clone();
    let s = &cfg.schema;
    sqlx::raw_sql(AssertSqlSafe(format!(
        // One implicit transaction; the lock serialises concurrent first runs.
        "SELECT pg_advisory_xact_lock(hashtext('{s}.charge_once_tables')); \
         CREATE TABLE IF NOT EXISTS {s}.charges (id bigserial PRIMARY KEY, op_key text NOT NULL, credits bigint NOT NULL); \
         CREATE TABLE IF NOT EXISTS {s}.reports (id bigserial PRIMARY KEY, op_key text NOT NULL, body text NOT NULL);"
    )))
    .execute(&pool)
    .await?;

    // A short lease: if this process dies mid-way, a retry takes over within
    // seconds; while it lives, the engine's heartbeat keeps the claim.
    let engine = Engine::new(Arc::new(store.clone()))
        .with_policy(Policy::default().pending_ttl(Duration::from_secs(2)));
    let key = ScopedKey::new("acme", "charge-report", ClientKey::parse(&cfg.key)?);
    let request = serde_json::json!({"credits": CREDITS, "report": "q3"});
    let fingerprint = Fingerprint::of_value(&request)?;

    let mut guard = match engine
        .begin_waiting(&key, &fingerprint, Duration::from_secs(20))
        .await?
    {
        Begin::Owner(guard) => guard,
        Begin::Done(record) => {
            let payload = record.payload().cloned().unwrap_or_default();
            return Ok(Outcome::Replayed(String::from_utf8(payload.to_vec())?));
        }
        Begin::Inflight(_) => return Err("another run still holds the key".into()),
    };

    let at_ms = idemgate_engine::backend::now_ms();
    let started = Instant::now();
    let mut tx = pool.begin().await?;
    // First statement: the record is this transaction's until it ends, so
    // no other owner can take the key over while the charge is made.
    if store.lock_in(&mut tx, &mut guard).await? == Fenced::Stale {
        tx.rollback().await?;
        return Err("the lease was taken over before the charge".into());
    }
    let charge_id: i64 = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {s}.charges (op_key, credits) VALUES ($1, $2) RETURNING id"
    )))
    .bind(&cfg.key)
    .bind(CREDITS)
    .fetch_one(&mut *tx)
    .await?
    .try_get("id")?;
    if cfg.pause_before_commit {
        println!("{PAUSE_MARKER}");
        std::io::stdout().flush()?;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let report_id: i64 = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {s}.reports (op_key, body) VALUES ($1, $2) RETURNING id"
    )))
    .bind(&cfg.key)
    .bind(format!("Q3 report, charge {charge_id}"))
    .fetch_one(&mut *tx)
    .await?
    .try_get("id")?;
    let result = serde_json::json!({"charge_id": charge_id, "report_id": report_id}).to_string();
    let attempt = Attempt {
        at_ms,
        replica: engine.replica().to_owned(),
        outcome: AttemptOutcome::Executed,
        status: None,
        latency_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        repeated: None,
    };
    let done_ttl = engine.policy().done_ttl;
    match store
        .complete_in(
            &mut tx,
            guard.lease(),
            result.clone().into(),
            done_ttl,
            &attempt,
        )
        .await?
    {
        Fenced::Applied => {
            tx.commit().await?;
            // The record is DONE now: the guard's release on drop finds no
            // PENDING record of ours and changes nothing.
            drop(guard);
            Ok(Outcome::Executed(result))
        }
        Fenced::Stale => {
            tx.rollback().await?;
            Err("the lease was taken over; nothing was committed".into())
        }
    }
}

#[allow(dead_code)] // the tests include this file for `run` only
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cfg = Config::from_env();
    match run(&cfg).await? {
        Outcome::Executed(r) => println!("executed now: {r}"),
        Outcome::Replayed(r) => println!("replayed, not charged again: {r}"),
    }
    Ok(())
}
