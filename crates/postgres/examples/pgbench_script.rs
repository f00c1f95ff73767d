//! Prints the pgbench script of one fresh key as this build's store sends
//! it (claim, then completion), after creating the store's tables in the
//! given schema: `bench/gateway.sh` runs it as the floor of the gateway's
//! PostgreSQL path. With `renewal N`, it writes N PENDING records instead
//! and prints the script of one renewal of a random one of them
//! (`bench/pg_renewals.sh`).
//!
//! ```text
//! cargo run --release -p idemgate-postgres --example pgbench_script -- URL SCHEMA [renewal N]
//! ```

use idemgate_postgres::{PostgresOptions, PostgresStore, pgbench};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema)) = (args.next(), args.next()) else {
        eprintln!("usage: pgbench_script URL SCHEMA [renewal N]");
        std::process::exit(2);
    };
    let renewals = match (args.next().as_deref(), args.next()) {
        (None, _) => None,
        (Some("renewal"), Some(n)) => Some(n.parse::<u64>()?),
        _ => {
            eprintln!("usage: pgbench_script URL SCHEMA [renewal N]");
            std::process::exit(2);
        }
    };
    let opts = PostgresOptions::default().schema(schema);
    // Connecting creates the schema and its tables.
    let store = PostgresStore::connect_with(&url, opts.clone()).await?;
    if let Some(keys) = renewals {
        sqlx::raw_sql(sqlx::AssertSqlSafe(pgbench::renewal_rows(&opts, keys)))
            .execute(store.pool())
            .await?;
        print!("{}", pgbench::renewal_script(&opts, keys));
        eprintln!("variables to define (pgbench -D): pending_ms");
        drop(store);
        return Ok(());
    }
    print!("{}", pgbench::fresh_key_script(&opts));
    eprintln!(
        "variables to define (pgbench -D): {}",
        pgbench::VARIABLES.join(", ")
    );
    drop(store);
    Ok(())
}
