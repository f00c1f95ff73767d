//! Prints the pgbench script of one fresh key as this build's store sends
//! it (claim, then completion), after creating the store's tables in the
//! given schema: `bench/gateway.sh` runs it as the floor of the gateway's
//! PostgreSQL path.
//!
//! ```text
//! cargo run --release -p idemgate-postgres --example pgbench_script -- URL SCHEMA
//! ```

use idemgate_postgres::{PostgresOptions, PostgresStore, pgbench};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema)) = (args.next(), args.next()) else {
        eprintln!("usage: pgbench_script URL SCHEMA");
        std::process::exit(2);
    };
    let opts = PostgresOptions::default().schema(schema);
    // Connecting creates the schema and its tables.
    let store = PostgresStore::connect_with(&url, opts.clone()).await?;
    print!("{}", pgbench::fresh_key_script(&opts));
    eprintln!(
        "variables to define (pgbench -D): {}",
        pgbench::VARIABLES.join(", ")
    );
    drop(store);
    Ok(())
}
