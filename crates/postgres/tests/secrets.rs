//! A password in the store URL never shows: not in the error of a store
//! that cannot be opened (its `Display` or its `Debug`, the driver's
//! source included) — a closed port, a malformed URL or option, a role the
//! server does not know — nor in the `Debug` of an open store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::{assert_error_hides, assert_hidden, closed_port};

const PW: &str = "s3cr3t-pw";

fn options() -> PostgresOptions {
    PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(2)
        .operation_timeout(Duration::from_secs(1))
}

#[tokio::test]
async fn failed_opens_never_show_the_password() {
    // A server that is not there, reached plainly and with TLS settings.
    let closed = format!("postgres://u:{PW}@127.0.0.1:{}/test", closed_port());
    let urls = [
        closed.clone(),
        format!("{closed}?sslmode=require"),
        format!("{closed}?sslmode=bogus"),
        format!("{closed}?sslmode=verify-full&sslrootcert=/nonexistent.pem"),
        format!("postgres://u:{PW}@127.0.0.1:notaport/test"),
        format!("postgres://u:{PW}@[::1/test"),
        // The shared server (trust authentication) does not know this role.
        format!(
            "postgres://igtest_no_such_role:{PW}@{}",
            support::shared_url().trim_start_matches("postgres://postgres@")
        ),
    ];
    for url in &urls {
        let err = PostgresStore::connect_with(url, options())
            .await
            .expect_err("nothing to connect to");
        assert_error_hides(PW, url, &err);
    }
}

#[tokio::test]
async fn an_open_store_does_not_show_the_password() {
    // Trust authentication accepts any password.
    let url = support::shared_url().replacen("postgres@", &format!("postgres:{PW}@"), 1);
    let store = match PostgresStore::connect_with(&url, options()).await {
        Ok(store) => store,
        Err(e) => {
            support::require(
                &format!("PostgreSQL at {} ({e})", support::shared_url()),
                false,
            );
            unreachable!()
        }
    };
    assert_hidden(PW, "the store", &format!("{store:?}"));
    assert_hidden(PW, "the pool", &format!("{:?}", store.pool()));
}
