//! The store conformance suite against a private 3-primary Redis Cluster
//! started by this test binary (see `support::cluster_url`).

mod support;

use std::sync::Arc;

use idemgate_engine::Store;
use idemgate_redis::RedisStore;

async fn make() -> Arc<dyn Store> {
    let url = tokio::task::spawn_blocking(support::cluster_url)
        .await
        .unwrap_or_else(|e| panic!("cluster setup: {e}"));
    // Each test process starts its own cluster; under a loaded CI machine
    // its first answers can outlast the production default of 500 ms.
    let opts = support::options().response_timeout(std::time::Duration::from_secs(2));
    let store = RedisStore::connect_with(url, opts)
        .await
        .unwrap_or_else(|e| panic!("connect to the test cluster {url}: {e}"));
    assert!(store.is_cluster());
    Arc::new(store)
}

idemgate_testkit::conformance_suite!(conformance_redis_cluster, make);
