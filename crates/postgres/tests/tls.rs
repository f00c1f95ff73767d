//! The store over TLS: the whole conformance suite against a private
//! PostgreSQL that accepts TCP connections over TLS only, connected with
//! `sslmode=verify-full` and `sslrootcert=` (the CA made by this test
//! process); `sslmode=require` without a CA; and the connections that must
//! fail: a plain one, and `verify-full` against a certificate the given CA
//! did not sign.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idemgate_engine::{Store, StoreErrorKind};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::postgres_server::Server as Private;
use idemgate_testkit::tls::TestCerts;

/// This process's TLS server (shared by its tests; stopped when the
/// process ends).
async fn server() -> &'static Private {
    static SERVER: OnceLock<Private> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        SERVER.get_or_init(|| Private::start_tls(&TestCerts::generate()))
    })
    .await
    .expect("start the TLS server")
}

/// `verify-full`: the certificate must be signed by `ca` and name
/// `localhost`.
fn verify_full_url(server: &Private, ca: &std::path::Path) -> String {
    format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        ca.display()
    )
}

/// The server by IP address (no name for a certificate to match) with
/// `sslmode`.
fn ip_url(server: &Private, sslmode: &str) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode={sslmode}",
        server.port
    )
}

fn options() -> PostgresOptions {
    PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(8)
        .operation_timeout(Duration::from_secs(5))
}

async fn make() -> Arc<dyn Store> {
    let server = server().await;
    let store = PostgresStore::connect_with(&verify_full_url(server, server.ca()), options())
        .await
        .expect("connect with verify-full, trusting the test CA");
    Arc::new(store)
}

idemgate_testkit::conformance_suite!(conformance_postgres_tls, make);

/// Whether the store's own connection is encrypted, by the server's word.
async fn encrypted(store: &PostgresStore) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("read pg_stat_ssl")
}

#[tokio::test]
async fn verify_full_and_require_connect_encrypted() {
    let server = server().await;
    let full = PostgresStore::connect_with(&verify_full_url(server, server.ca()), options())
        .await
        .expect("verify-full with the CA");
    assert!(encrypted(&full).await, "verify-full is encrypted");
    // `require` encrypts without checking the certificate, as libpq does.
    let require = PostgresStore::connect_with(&ip_url(server, "require"), options())
        .await
        .expect("require without a CA");
    assert!(encrypted(&require).await, "require is encrypted");
}

#[tokio::test]
async fn a_plain_connection_is_refused_by_a_tls_only_server() {
    let server = server().await;
    let err = PostgresStore::connect_with(&ip_url(server, "disable"), options())
        .await
        .expect_err("pg_hba.conf has hostssl lines only");
    assert!(err.to_string().contains("no encryption"), "{err}");
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let other = TestCerts::generate().write(dir.path());
    let opts = options();
    let bound = opts.operation_timeout;
    let started = Instant::now();
    let err = PostgresStore::connect_with(&verify_full_url(server, &other.ca), opts)
        .await
        .expect_err("a certificate the CA did not sign is refused");
    // A refusal, not a hang: the connect call ends within its own bound.
    assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
    let shown = err.to_string();
    assert!(
        shown.contains("certificate is not trusted") && shown.contains("sslrootcert"),
        "the error names the certificate and the fix: {shown}"
    );
    assert_eq!(err.kind(), StoreErrorKind::Rejected, "{shown}");
}
