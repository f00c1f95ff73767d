//! The store under real network faults: the shared PostgreSQL reached
//! through a [`FaultProxy`] that cuts, resets, refuses, stalls and slows the
//! store's connections at each step of a record's life. The scenarios are
//! the testkit's (`idemgate_testkit::fault::scenarios`).

mod support;

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idemgate_engine::{RecordState, Store};
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
    // An operation left mid-way settles its connection with a ping of the
    // store's own; the store is quiet once no connection is in use.
    let probe = store.clone();
    let quiet = move || probe.busy_connections() == 0;
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

/// A connection that goes silent while idle, just after answering, must
/// not keep its slot: the next operation on it overruns the bound, the
/// store closes the connection, and the one after opens a new one. (The
/// store's connections go back with no check of their own, so the silence
/// is met by the next operation, within its bound, never by a wait without
/// a limit.)
#[tokio::test(flavor = "current_thread")]
async fn a_connection_silent_after_its_answer_gives_its_slot_back() {
    let rig = rig().await;
    let key = idemgate_testkit::fresh_key();
    assert!(rig.store.get(&key).await.expect("get").is_none());
    // The store's one connection (and the sqlx pool's, idle).
    assert!(
        rig.proxy.freeze_live() >= 1,
        "the store's connection is live"
    );
    let (got, failures) = idemgate_testkit::fault::scenarios::until_ok(
        "get after the connection froze while idle",
        || rig.store.get(&key),
    )
    .await;
    assert!(got.is_none());
    eprintln!("get after a freeze while idle: {failures} temporary errors first");
}

/// An operation is one round trip: once it has returned, nothing more
/// goes to the server on its connection. (sqlx's pool sends a check of its
/// own after every operation; the store's connections go back without
/// one.) The next operation reuses the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_operation_sends_nothing_after_its_answer() {
    let rig = rig().await;
    let key = idemgate_testkit::fresh_key();
    assert!(rig.store.get(&key).await.expect("warm-up get").is_none());
    for i in 0..5 {
        assert!(rig.store.get(&key).await.expect("get").is_none());
        let after = rig.proxy.stats();
        // Long enough for any task spawned on the way back to run.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = rig.proxy.stats();
        assert_eq!(
            later.bytes_to_server, after.bytes_to_server,
            "get {i}: bytes went to the server after its answer"
        );
        assert_eq!(later.accepted, after.accepted, "get {i}: a new connection");
    }
}

/// A caller that stops waiting mid-statement leaves its connection with
/// an answer still on the wire. The store settles that connection before
/// it lends it again, and keeps it: the next operations read their own
/// answers, not the abandoned one's, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_abandoned_mid_statement_leaves_a_usable_connection() {
    let rig = rig().await;
    let (key, other) = (idemgate_testkit::fresh_key(), idemgate_testkit::fresh_key());
    let claim = rig
        .store
        .claim(&key, &idemgate_testkit::fp("{}"), Duration::from_secs(30))
        .await
        .expect("claim");
    let lease = idemgate_testkit::acquired(claim);
    let accepted = rig.proxy.stats().accepted;
    rig.proxy
        .stall_direction(idemgate_testkit::fault::Direction::ToClient, true);
    let abandoned = tokio::time::timeout(Duration::from_millis(200), rig.store.get(&key)).await;
    assert!(
        abandoned.is_err(),
        "the get answered through a stalled link"
    );
    rig.proxy.heal();
    for _ in 0..3 {
        assert!(rig.store.get(&other).await.expect("get").is_none());
        let record = rig.store.get(&key).await.expect("get").expect("PENDING");
        assert!(
            matches!(record.state, RecordState::Pending { fence, .. } if fence == lease.fence),
            "{record:?}"
        );
    }
    assert_eq!(
        rig.proxy.stats().accepted,
        accepted,
        "the abandoned operation's connection was replaced, not settled"
    );
}

/// A server that ends the session (here its backend is terminated, as a
/// restart or an operator would) costs one failed operation, not two: the
/// error that says so (SQLSTATE 57P01) closes the connection rather than
/// giving it back, so the next operation opens a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_costs_one_operation() {
    let direct = support::shared_store().await;
    let opts = PostgresOptions {
        migrate: false,
        ..PostgresOptions::default()
            .schema(support::run_schema())
            .max_connections(1)
            .purge_interval(None)
            .background_timeline(false)
    };
    let store = PostgresStore::connect_with(&support::shared_url(), opts)
        .await
        .expect("connect");
    let key = idemgate_testkit::fresh_key();
    for round in 0..3 {
        let pid: i32 = store
            .on_own_connection(async |c: &mut sqlx::PgConnection| {
                sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(c)
                    .await
            })
            .await
            .expect("the backend's pid");
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(direct.pool())
            .await
            .expect("terminate");
        assert!(ended, "round {round}: the backend was not terminated");
        let first = store.get(&key).await;
        assert!(
            first.is_err(),
            "round {round}: the terminated session answered: {first:?}"
        );
        let second = store.get(&key).await;
        assert!(
            matches!(second, Ok(None)),
            "round {round}: the operation after the failed one failed too: {second:?} (first: {first:?})"
        );
    }
}
