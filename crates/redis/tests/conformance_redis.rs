//! The store conformance suite against the shared single-node Redis
//! (127.0.0.1:6379), under a random key prefix per run.

mod support;

use std::sync::Arc;

use idemgate_engine::Store;
use idemgate_redis::RedisStore;

async fn make() -> Arc<dyn Store> {
    let opts = support::options();
    match RedisStore::connect_with(support::SHARED_URL, opts).await {
        Ok(store) => Arc::new(store),
        Err(e) => {
            support::require(&format!("Redis at {} ({e})", support::SHARED_URL), false);
            unreachable!()
        }
    }
}

idemgate_testkit::conformance_suite!(conformance_redis, make);
