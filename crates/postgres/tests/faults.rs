//! The store under real network faults: the shared PostgreSQL reached
//! through a [`FaultProxy`] that cuts, resets, refuses, stalls and slows the
//! store's connections at each step of a record's life. The scenarios are
//! the testkit's (`idemgate_testkit::fault::scenarios`).

mod support;

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::FaultProxy;
use idemgate_testkit::fault::scenarios::Rig;
use sqlx::postgres::PgConnectOptions;

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{addr}{tail}")
}

/// A store behind a fresh proxy to the shared server, and one without it,
/// both in this run's schema. The proxied store has one pooled connection
/// (so the warm-up prepares every statement a scenario sends), a 1 s
/// operation bound, and no background tasks.
async fn rig() -> Rig {
    let direct = support::shared_store().await;
    let url = support::shared_url();
    let opts = PgConnectOptions::from_str(&url).expect("a valid URL");
    let target = (opts.get_host(), opts.get_port())
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .expect("the server's address resolves");
    let proxy = FaultProxy::start(target).await.expect("start the proxy");
    let opts = PostgresOptions {
        migrate: false,
        ..PostgresOptions::default()
            .schema(support::run_schema())
            .max_connections(1)
            .operation_timeout(Duration::from_secs(1))
            .purge_interval(None)
            .background_timeline(false)
    };
    let store = PostgresStore::connect_with(&via(&url, proxy.addr()), opts)
        .await
        .expect("connect through the proxy");
    // sqlx pings every connection it gets back (a request of the store's
    // own, after each operation); the store is quiet once it is idle.
    let pool = store.pool().clone();
    let quiet = move || pool.num_idle() == pool.size() as usize;
    Rig {
        proxy,
        store: Arc::new(store),
        direct: Arc::new(direct),
        quiet: Some(Box::new(quiet)),
    }
}

#[test]
fn urls_are_rerouted_through_the_proxy() {
    let addr: SocketAddr = "127.0.0.1:4242".parse().expect("addr");
    assert_eq!(
        via("postgres://postgres@127.0.0.1:5432/test", addr),
        "postgres://postgres@127.0.0.1:4242/test"
    );
    assert_eq!(
        via("postgres://u:p@db.example:5432?sslmode=disable", addr),
        "postgres://u:p@127.0.0.1:4242?sslmode=disable"
    );
    assert_eq!(via("postgres://db", addr), "postgres://127.0.0.1:4242");
}

idemgate_testkit::fault_suite!(faults_postgres, rig);

/// A connection that goes silent just after answering, while the pool
/// checks it on its way back, must not keep its pool slot: the store bounds
/// that check like an operation, drops the connection, and opens a new one.
/// sqlx's own check waits without a limit, so without the bound the rig's
/// one pooled connection would stay taken and every later operation would
/// time out waiting for it.
#[tokio::test(flavor = "current_thread")]
async fn a_connection_silent_after_its_answer_gives_its_slot_back() {
    let rig = rig().await;
    let key = idemgate_testkit::fresh_key();
    assert!(rig.store.get(&key).await.expect("get").is_none());
    // On this single-threaded runtime the connection's way back to the
    // pool (spawned as the operation ended) has not run yet: it starts
    // after the freeze, so its check finds the connection silent.
    assert_eq!(rig.proxy.freeze_live(), 1, "the one pooled connection");
    let (got, failures) = idemgate_testkit::fault::scenarios::until_ok(
        "get after the connection froze on its way back",
        || rig.store.get(&key),
    )
    .await;
    assert!(got.is_none());
    eprintln!("get after a freeze on the way back: {failures} temporary errors first");
}
