//! The store over TLS: the whole conformance suite against a private
//! Redis that speaks only TLS (`rediss://localhost:<port>/?tls_ca=…`, a
//! certificate signed by a CA made by this test process), record
//! operations on a private Redis Cluster that speaks only TLS, and the
//! connections that must fail: a server whose certificate the given CA did
//! not sign, or that the system's roots do not know.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Instant;

use idemgate_engine::{Store, StoreErrorKind};
use idemgate_redis::RedisStore;

async fn tls_url() -> &'static str {
    tokio::task::spawn_blocking(support::tls_url)
        .await
        .expect("start the TLS server")
}

async fn make() -> Arc<dyn Store> {
    let url = tls_url().await;
    let store = RedisStore::connect_with(url, support::options())
        .await
        .expect("connect over TLS, trusting the test CA");
    Arc::new(store)
}

idemgate_testkit::conformance_suite!(conformance_redis_tls, make);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_keeps_records() {
    let url = tokio::task::spawn_blocking(support::tls_cluster_url)
        .await
        .expect("start the TLS cluster");
    let store = RedisStore::connect_with(url, support::options())
        .await
        .expect("connect to the TLS cluster, trusting the test CA");
    assert!(store.is_cluster());
    let store: Arc<dyn Store> = Arc::new(store);
    idemgate_testkit::cases::existing_record_returned(Arc::clone(&store)).await;
    idemgate_testkit::cases::fenced_complete_and_release(Arc::clone(&store)).await;
    idemgate_testkit::cases::race_execute_once(store).await;
}

/// `rediss://` to the private server, trusting `ca` (none: the system's
/// roots), must fail: within the store's connection bound, as a store
/// error that says the certificate is not trusted.
async fn refused_with(ca: Option<&std::path::Path>) {
    let url = tls_url().await;
    let port = url
        .trim_start_matches("rediss://localhost:")
        .split('/')
        .next()
        .expect("the URL has a port");
    let url = match ca {
        Some(ca) => format!("rediss://localhost:{port}/?tls_ca={}", ca.display()),
        None => format!("rediss://localhost:{port}/"),
    };
    let opts = support::options();
    let bound = opts.connection_timeout + opts.operation_timeout;
    let started = Instant::now();
    let err = RedisStore::connect_with(&url, opts)
        .await
        .expect_err("a certificate the client does not trust is refused");
    // A refusal, not a hang: the connect call ends within its own bound.
    assert!(
        started.elapsed() < bound * 2,
        "took {:?}",
        started.elapsed()
    );
    let shown = err.to_string();
    assert!(
        shown.contains("certificate is not trusted") && shown.contains("tls_ca"),
        "the error names the certificate and the fix: {shown}"
    );
    assert_eq!(err.kind(), StoreErrorKind::Rejected, "{shown}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let other = idemgate_testkit::tls::TestCerts::generate().write(dir.path());
    refused_with(Some(&other.ca)).await;
}

#[tokio::test]
async fn a_server_certificate_unknown_to_the_system_roots_is_refused() {
    refused_with(None).await;
}

#[tokio::test]
async fn a_plain_connection_to_a_tls_port_is_not_mistaken_for_a_store() {
    let url = tls_url().await;
    let plain = url
        .replace("rediss://", "redis://")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let err = RedisStore::connect_with(&plain, support::options())
        .await
        .expect_err("a TLS-only server does not answer plain text");
    assert_ne!(err.kind(), StoreErrorKind::Corrupt, "{err}");
}
