//! Opening the configured store, and the live-event fan-out that goes with
//! it.
//!
//! | URL | store | live SSE fan-out across replicas |
//! |---|---|---|
//! | `memory:` | [`MemoryStore`] | in-process (one replica only) |
//! | `sqlite:PATH` | [`SqliteStore`](idemgate_sqlite::SqliteStore) | in-process |
//! | `redis://host:port[/db][?prefix=P&wait_replicas=auto\|N]`, `rediss://…` (TLS) | [`RedisStore`] | Redis Streams ([`RedisLiveEvents`]) |
//! | `redis+cluster://host:port[?prefix=P]`, `rediss+cluster://…` (TLS) | [`RedisStore`] on a cluster (one seed node; the rest is discovered) | Redis Streams |
//! | `postgres://user@host:port/db[?schema=S&pool=N&batches=N&sslmode=M]` | [`PostgresStore`] | in-process only: a duplicate on another replica waits for DONE, then replays the whole stream (or the events after its `Last-Event-ID`) |
//!
//! Query parameters the gateway reads are removed before the URL reaches
//! the driver: `prefix` (Redis key prefix, default `idemgate`; lets several
//! deployments or test runs share one Redis), `schema` (PostgreSQL schema,
//! default `idemgate`), `pool` (PostgreSQL pool size, default 10),
//! `batches` (PostgreSQL claim, completion and renewal statements that run
//! at once, each carrying every one of its kind waiting for it, default 1;
//! 0 gives each its own statement, see `PostgresOptions::batch_statements`) and
//! `timeline` (`background`, the default: timeline entries of replays and
//! conflicts are written in batches off the request path; `inline`: each is
//! written before the request is answered, one more round trip), and, for
//! PostgreSQL, `claim_commit` (`sync`, the default; `async`: claims are
//! committed with `synchronous_commit = off`, which a database crash can
//! turn into a second execution, see `PostgresOptions::synchronous_claims`).
//! Every other parameter is passed through: the drivers' own, and the TLS
//! ones — `tls_ca=PATH` for `rediss://` (read by the Redis store, for its
//! connections and the live streams' alike), `sslmode` and `sslrootcert`
//! for PostgreSQL. TLS needs the gateway's `tls` feature.
//!
//! With a key ring, the store is wrapped in a [`SealedStore`]: every
//! payload is sealed before it reaches the backend and opened on read, the
//! same way for every backend, and the Redis live streams seal their
//! entries with the same ring. A payload that does not open is a store
//! error (counted in `idemgate_seal_failures_total{reason}`), so each route
//! applies its `on_store_error` policy to it; a live entry that does not
//! open is counted the same way, and is a store error for the duplicate
//! that reads it.

use std::sync::Arc;

use idemgate_engine::{Engine, MemoryStore, Store, StoreError};
use idemgate_layer::{IdempotencyLayer, LayerConfig, LiveEvents};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_redis::{RedisOptions, RedisStore, WaitReplicas};
use idemgate_redis_live::{FanoutOptions, RedisLiveEvents};
use idemgate_seal::store::FailureHook;
use idemgate_seal::{KeyRing, SealedStore};
use idemgate_telemetry::Telemetry;
use url::Url;

use crate::config::StoreUrl;
use crate::error::GatewayError;

/// An open store, what publishes live events next to it, and how to close it.
pub(crate) struct OpenStore {
    /// The store every route's engine uses.
    pub(crate) store: Arc<dyn Store>,
    /// Set for SQLite, whose writer thread is stopped at shutdown.
    sqlite: Option<Arc<idemgate_sqlite::SqliteStore>>,
    /// Set when replicas share live streams through the store's server.
    live: Option<Arc<dyn LiveEvents>>,
}

impl OpenStore {
    /// The idempotency layer of a route, with the live-event fan-out that
    /// suits the store.
    pub(crate) fn layer(&self, engine: Engine, config: LayerConfig) -> IdempotencyLayer {
        match &self.live {
            Some(live) => IdempotencyLayer::with_live_events(engine, config, Arc::clone(live)),
            None => IdempotencyLayer::new(engine, config),
        }
    }

    /// Stops background work that must end before the process exits.
    pub(crate) fn close(&self) {
        if let Some(s) = &self.sqlite {
            s.close();
        }
    }
}

fn open_error(
    url: &StoreUrl,
    source: impl std::error::Error + Send + Sync + 'static,
) -> GatewayError {
    GatewayError::StoreOpen {
        backend: url.backend(),
        url: url.to_string(),
        source: Box::new(source),
    }
}

/// Opens the store named by `url`, sealing its payloads with `ring` if
/// there is one.
pub(crate) async fn open_store(
    url: &StoreUrl,
    ring: Option<Arc<KeyRing>>,
) -> Result<OpenStore, GatewayError> {
    let mut opened = open_backend(url, ring.clone()).await?;
    if let Some(ring) = ring {
        opened.store = Arc::new(SealedStore::new(opened.store, ring).on_failure(seal_failures()));
    }
    Ok(opened)
}

/// Counts a payload or live entry that could not be sealed or opened in
/// `idemgate_seal_failures_total{reason}`.
fn seal_failures() -> FailureHook {
    Arc::new(|kind: &idemgate_seal::SealErrorKind| {
        Telemetry::shared().seal_failure(idemgate_seal::store::failure_reason(kind));
    })
}

/// Loads the key ring at `path`.
///
/// # Errors
/// [`GatewayError::KeyFile`] naming the file (and the line), never the
/// key text.
pub fn load_key_ring(path: &std::path::Path) -> Result<Arc<KeyRing>, GatewayError> {
    KeyRing::from_file(path)
        .map(Arc::new)
        .map_err(|source| GatewayError::KeyFile {
            path: path.to_path_buf(),
            source,
        })
}

async fn open_backend(
    url: &StoreUrl,
    ring: Option<Arc<KeyRing>>,
) -> Result<OpenStore, GatewayError> {
    match url {
        StoreUrl::Memory => Ok(OpenStore {
            store: Arc::new(MemoryStore::new()),
            sqlite: None,
            live: None,
        }),
        StoreUrl::Sqlite(path) => {
            let path = path.clone();
            let opened =
                tokio::task::spawn_blocking(move || idemgate_sqlite::SqliteStore::open(path))
                    .await
                    .map_err(|e| open_error(url, e))?
                    .map_err(|e| open_error(url, e))?;
            let sqlite = Arc::new(opened);
            Ok(OpenStore {
                store: Arc::clone(&sqlite) as Arc<dyn Store>,
                sqlite: Some(sqlite),
                live: None,
            })
        }
        StoreUrl::Redis(u) | StoreUrl::RedisCluster(u) => {
            let (driver_url, params) = split_params(u, &["prefix", "timeline", "wait_replicas"]);
            let mut opts = RedisOptions::default().background_timeline(background(url, &params)?);
            if let Some(wanted) = param(&params, "wait_replicas") {
                let wanted = WaitReplicas::parse(wanted).map_err(|e| {
                    open_error(
                        url,
                        StoreError::new(idemgate_engine::StoreErrorKind::Rejected, "redis", e),
                    )
                })?;
                opts = opts.wait_replicas(wanted);
            }
            let mut fanout = FanoutOptions::default();
            if let Some(ring) = ring {
                fanout = fanout.key_ring(ring).on_seal_failure(seal_failures());
            }
            if let Some(prefix) = param(&params, "prefix") {
                opts = opts.prefix(prefix);
                fanout = fanout.prefix(prefix);
            }
            let store = RedisStore::connect_with(&driver_url, opts)
                .await
                .map_err(|e| open_error(url, e))?;
            let live = RedisLiveEvents::connect(&driver_url, fanout)
                .await
                .map_err(|e| open_error(url, e))?;
            Ok(OpenStore {
                store: Arc::new(store),
                sqlite: None,
                live: Some(Arc::new(live)),
            })
        }
        StoreUrl::Postgres(u) => {
            let (driver_url, params) = split_params(u, POSTGRES_PARAMS);
            let mut opts = PostgresOptions::default()
                .background_timeline(background(url, &params)?)
                .synchronous_claims(synchronous_claims(url, &params)?);
            if let Some(schema) = param(&params, "schema") {
                opts = opts.schema(schema);
            }
            if let Some(pool) = param(&params, "pool") {
                opts = opts.max_connections(count(url, "pool", pool, 1)?);
            }
            if let Some(batches) = param(&params, "batches") {
                opts = opts.batch_statements(count(url, "batches", batches, 0)?);
            }
            let store = PostgresStore::connect_with(&driver_url, opts)
                .await
                .map_err(|e| open_error(url, e))?;
            Ok(OpenStore {
                store: Arc::new(store),
                sqlite: None,
                live: None,
            })
        }
    }
}

/// The URL the PostgreSQL driver is given: without the store's own
/// parameters (`schema`, `pool`, `batches`, `timeline`, `claim_commit`).
pub(crate) fn postgres_driver_url(url: &Url) -> String {
    split_params(url, POSTGRES_PARAMS).0
}

const POSTGRES_PARAMS: &[&str] = &["schema", "pool", "batches", "timeline", "claim_commit"];

/// The URL without the query parameters in `ours`, and those parameters.
fn split_params(url: &Url, ours: &[&str]) -> (String, Vec<(String, String)>) {
    let mut kept = url.clone();
    let (mine, theirs): (Vec<_>, Vec<_>) = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .partition(|(k, _)| ours.contains(&k.as_str()));
    if theirs.is_empty() {
        kept.set_query(None);
    } else {
        kept.query_pairs_mut().clear().extend_pairs(theirs);
    }
    (kept.to_string(), mine)
}

/// A numeric parameter, at least `min`.
fn count(url: &StoreUrl, name: &str, value: &str, min: u32) -> Result<u32, GatewayError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= min)
        .ok_or_else(|| {
            open_error(
                url,
                StoreError::new(
                    idemgate_engine::StoreErrorKind::Rejected,
                    url.backend(),
                    format!("{name}={value:?} is not a number of at least {min}"),
                ),
            )
        })
}

/// The `timeline` parameter: whether entries are written in the background.
fn background(url: &StoreUrl, params: &[(String, String)]) -> Result<bool, GatewayError> {
    match param(params, "timeline") {
        None | Some("background") => Ok(true),
        Some("inline") => Ok(false),
        Some(other) => Err(open_error(
            url,
            StoreError::new(
                idemgate_engine::StoreErrorKind::Rejected,
                url.backend(),
                format!("timeline={other:?}: use `background` or `inline`"),
            ),
        )),
    }
}

/// The `claim_commit` parameter: whether a claim's commit waits for its WAL.
fn synchronous_claims(url: &StoreUrl, params: &[(String, String)]) -> Result<bool, GatewayError> {
    match param(params, "claim_commit") {
        None | Some("sync") => Ok(true),
        Some("async") => Ok(false),
        Some(other) => Err(open_error(
            url,
            StoreError::new(
                idemgate_engine::StoreErrorKind::Rejected,
                url.backend(),
                format!("claim_commit={other:?}: use `sync` or `async`"),
            ),
        )),
    }
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Opens the store named by `url` for tools that only read records and
/// timelines (`idemgate keys show`), opening sealed payloads with `ring`.
///
/// # Errors
/// [`GatewayError::StoreOpen`] when the store cannot be reached or opened.
pub async fn open_records(
    url: &StoreUrl,
    ring: Option<Arc<KeyRing>>,
) -> Result<Arc<dyn Store>, GatewayError> {
    Ok(open_store(url, ring).await?.store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_parameters_are_taken_out_and_the_rest_kept() {
        let u = Url::parse("redis://127.0.0.1:6379/2?prefix=run1&protocol=resp3").unwrap();
        let (driver, params) = split_params(&u, &["prefix"]);
        assert_eq!(driver, "redis://127.0.0.1:6379/2?protocol=resp3");
        assert_eq!(param(&params, "prefix"), Some("run1"));
        let u = Url::parse("postgres://u:p@h:5432/test?schema=s1&pool=4").unwrap();
        let (driver, params) = split_params(&u, &["schema", "pool"]);
        assert_eq!(driver, "postgres://u:p@h:5432/test");
        assert_eq!(param(&params, "schema"), Some("s1"));
        assert_eq!(param(&params, "pool"), Some("4"));
        assert_eq!(param(&params, "prefix"), None);
    }

    #[test]
    fn claim_commit_is_sync_unless_asked_otherwise() {
        let url = StoreUrl::parse("postgres://u@h/db").expect("a store URL");
        let with = |v: &str| vec![("claim_commit".to_owned(), v.to_owned())];
        assert!(synchronous_claims(&url, &[]).expect("the default"));
        assert!(synchronous_claims(&url, &with("sync")).expect("sync"));
        assert!(!synchronous_claims(&url, &with("async")).expect("async"));
        assert!(synchronous_claims(&url, &with("off")).is_err());
    }
}
