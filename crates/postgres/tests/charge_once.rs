//! The transactional path under the worst crash: the `charge_once` example's
//! logic runs in child processes that are SIGKILLed between the charge and
//! the commit, and in several processes at once. After retries there is
//! exactly one charge, one report and a DONE record — never a charge
//! without its result.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/charge_once.rs"]
mod charge_once;

use std::process::Stdio;
use std::time::Duration;

use charge_once::{Config, Outcome, PAUSE_MARKER};
use idemgate_engine::{ClientKey, ScopedKey, Store};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::io::{AsyncBufReadExt, BufReader};

const CHILD: &str = "IDEMGATE_CHARGE_ONCE_CHILD";

/// Entry point of the child processes (never run directly: ignored, and
/// started by the tests below with `--ignored --exact`).
#[tokio::test]
#[ignore = "child process of the charge_once tests"]
async fn child_entry() {
    assert!(std::env::var(CHILD).is_ok(), "only run as a child process");
    let outcome = charge_once::run(&Config::from_env()).await.unwrap();
    println!("child outcome: {outcome:?}");
}

fn child(cfg: &Config, pause: bool) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_entry", "--exact", "--ignored", "--nocapture"])
        .env(CHILD, "1")
        .env("DATABASE_URL", &cfg.url)
        .env("CHARGE_ONCE_SCHEMA", &cfg.schema)
        .env("CHARGE_ONCE_KEY", &cfg.key)
        .env(
            "CHARGE_ONCE_PAUSE",
            if pause { "before_commit" } else { "no" },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

fn config() -> Config {
    Config {
        url: support::shared_url(),
        schema: support::run_schema().to_owned(),
        key: format!("op-{:016x}", rand::random::<u64>()),
        pause_before_commit: false,
    }
}

async fn counts(pool: &PgPool, cfg: &Config) -> (i64, i64) {
    let count = |table: &str| {
        let sql = format!(
            "SELECT count(*) FROM {}.{table} WHERE op_key = $1",
            cfg.schema
        );
        let key = cfg.key.clone();
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .bind(key)
                .fetch_one(pool)
                .await
                .unwrap()
        }
    };
    (count("charges").await, count("reports").await)
}

async fn assert_done_once(cfg: &Config) {
    let store = support::shared_store().await;
    assert_eq!(
        counts(store.pool(), cfg).await,
        (1, 1),
        "one charge, one report"
    );
    let key = ScopedKey::new("acme", "charge-report", ClientKey::parse(&cfg.key).unwrap());
    let record = store.get(&key).await.unwrap().expect("a DONE record");
    assert!(record.is_done());
    let result: serde_json::Value = serde_json::from_slice(record.payload().unwrap()).unwrap();
    let report_id = result["report_id"].as_i64().unwrap();
    let body: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT body FROM {}.reports WHERE id = $1",
        cfg.schema
    )))
    .bind(report_id)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(body.contains(&result["charge_id"].to_string()), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_charge_and_commit_then_retried_charges_once() {
    let cfg = config();
    let store = support::shared_store().await;
    for round in 0..3 {
        let mut proc = child(&cfg, true).spawn().unwrap();
        let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
        let paused = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains(PAUSE_MARKER) {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        assert!(paused, "round {round}: the child never reached the charge");
        // The charge is written but not committed: invisible to others.
        assert_eq!(counts(store.pool(), &cfg).await, (0, 0));
        proc.kill().await.unwrap(); // SIGKILL
        // Nothing of the killed run survives: its transaction rolled back.
        assert_eq!(counts(store.pool(), &cfg).await, (0, 0));
    }
    // The retry waits for the dead owner's lease to lapse, then runs once.
    match charge_once::run(&cfg).await.unwrap() {
        Outcome::Executed(_) => {}
        other => panic!("the retry must execute, got {other:?}"),
    }
    assert_done_once(&cfg).await;
    // Further retries replay and never charge again.
    match charge_once::run(&cfg).await.unwrap() {
        Outcome::Replayed(_) => {}
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_done_once(&cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_processes_charge_once() {
    for _ in 0..3 {
        let cfg = config();
        let children: Vec<_> = (0..4)
            .map(|_| child(&cfg, false).spawn().unwrap())
            .collect();
        for c in children {
            let out = c.wait_with_output().await.unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        assert_done_once(&cfg).await;
    }
}
