//! The store under real network faults: the shared Redis (127.0.0.1:6379)
//! reached through a [`FaultProxy`] that cuts, resets, refuses, stalls and
//! slows the store's connections at each step of a record's life. The
//! scenarios are the testkit's (`idemgate_testkit::fault::scenarios`).

mod support;

use std::sync::Arc;

use idemgate_redis::RedisStore;
use idemgate_testkit::FaultProxy;
use idemgate_testkit::fault::scenarios::Rig;

/// A store behind a fresh proxy to the shared Redis, and one without it,
/// both under this run's key prefix, with the store's default timeouts.
async fn rig() -> Rig {
    let direct = match RedisStore::connect_with(support::SHARED_URL, support::options()).await {
        Ok(store) => store,
        Err(e) => {
            support::require(&format!("Redis at {} ({e})", support::SHARED_URL), false);
            unreachable!()
        }
    };
    let target = support::SHARED_URL
        .strip_prefix("redis://")
        .and_then(|a| a.parse().ok())
        .expect("the shared URL is redis://<ip>:<port>");
    let proxy = FaultProxy::start(target).await.expect("start the proxy");
    let store = RedisStore::connect_with(&format!("redis://{}", proxy.addr()), support::options())
        .await
        .expect("connect through the proxy");
    Rig {
        proxy,
        store: Arc::new(store),
        direct: Arc::new(direct),
        // The connection manager sends nothing of its own.
        quiet: None,
    }
}

idemgate_testkit::fault_suite!(faults_redis, rig);
