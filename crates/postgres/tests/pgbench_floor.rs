//! The fresh-key floor `bench/gateway.sh` measures is the store's own
//! statements: pgbench, running the script `idemgate_postgres::pgbench`
//! writes, leaves every key it claimed DONE with the completion's payload
//! and its timeline entry, the end state a claim and a completion of the
//! store leave. A script that no longer matched the statements' parameters
//! would fail here instead of measuring something else. The same holds
//! for the renewal script of `bench/pg_renewals.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use idemgate_postgres::pgbench::{VARIABLES, fresh_key_script, renewal_rows, renewal_script};
use sqlx::Row;

/// Runs `script` with pgbench against the shared server, `transactions`
/// per client on 2 clients, with `-D` `variables` (`NAME=VALUE`); fails
/// (never skips under CI) without pgbench, and when pgbench fails.
async fn pgbench(script: &std::path::Path, transactions: u32, variables: &[String]) {
    let mut command = tokio::process::Command::new("pgbench");
    command.args(["-n", "-M", "prepared", "-c", "2", "-t"]);
    command.arg(transactions.to_string()).arg("-f").arg(script);
    for variable in variables {
        command.arg("-D").arg(variable);
    }
    let out = match command.arg(support::shared_url()).output().await {
        Ok(out) => out,
        Err(e) => {
            support::require(&format!("pgbench ({e})"), false);
            unreachable!()
        }
    };
    assert!(
        out.status.success(),
        "pgbench failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_floor_script_completes_every_key_it_claims() {
    let store = support::shared_store().await;
    let schema = support::run_schema();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fresh.sql");
    std::fs::write(&script, fresh_key_script(store.options())).unwrap();
    let payload = "\\x0123456789abcdef";
    let values = [
        ("tenant", "bench-tenant"),
        ("namespace", "/"),
        ("fingerprint", "\\x00112233"),
        ("token", "\\x0102030405060708"),
        ("payload", payload),
        (
            "entry",
            r#"{"at_ms":1,"replica":"bench","outcome":"executed","latency_us":9}"#,
        ),
        ("pending_ms", "30000"),
        ("done_ms", "60000"),
    ];
    assert_eq!(
        values.map(|(name, _)| name),
        VARIABLES,
        "every variable the script reads is defined"
    );
    let variables: Vec<String> = values
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    pgbench(&script, 25, &variables).await;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) AS keys, \
                count(*) FILTER (WHERE state = 'D' AND payload = '{payload}'::bytea \
                                 AND fence > 0 AND expires_at > now()) AS done, \
                count(*) FILTER (WHERE entry->>'outcome' = 'executed') AS entries \
         FROM {schema}.records WHERE id ~ '^[0-9]+$'"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let (keys, done, entries): (i64, i64, i64) =
        (row.get("keys"), row.get("done"), row.get("entries"));
    assert_eq!(keys, 50, "one key per transaction of 2 clients × 25");
    assert_eq!(done, keys, "every key claimed was completed");
    assert_eq!(
        entries, keys,
        "each completion kept its timeline entry in the row"
    );
}

/// The renewal script `bench/pg_renewals.sh` runs is the store's own
/// renewal: pgbench, on the records `renewal_rows` wrote (leased for an
/// hour), leaves the ones it renewed leased for `pending_ms` from then,
/// still PENDING with their fence, and no other row changed.
#[tokio::test(flavor = "multi_thread")]
async fn the_renewal_script_renews_the_leases_it_picks() {
    let _ = support::shared_store().await; // fails, not skips, without a server under CI
    let schema = format!("{}_renew", support::run_schema());
    let opts = idemgate_postgres::PostgresOptions::default()
        .schema(&schema)
        .max_connections(2)
        .purge_interval(None);
    let store = idemgate_postgres::PostgresStore::connect_with(&support::shared_url(), opts)
        .await
        .unwrap();
    let keys = 20;
    sqlx::raw_sql(sqlx::AssertSqlSafe(renewal_rows(store.options(), keys)))
        .execute(store.pool())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("renew.sql");
    std::fs::write(&script, renewal_script(store.options(), keys)).unwrap();
    pgbench(&script, 10, &["pending_ms=30000".to_owned()]).await;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE expires_at < now() + interval '1 minute') AS renewed, \
                count(*) FILTER (WHERE state = 'P' AND fence = id::bigint) AS pending, \
                count(*) AS all_rows \
         FROM {schema}.records"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let (renewed, pending, all): (i64, i64, i64) =
        (row.get("renewed"), row.get("pending"), row.get("all_rows"));
    assert_eq!(all, 20);
    assert_eq!(pending, all, "every record still PENDING with its fence");
    // 20 renewals of 20 keys picked at random: at least one was picked.
    assert!(renewed >= 1, "no lease was renewed");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(store.pool())
        .await
        .unwrap();
}
