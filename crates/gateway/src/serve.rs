//! [`serve`]: the start checks, the store, one engine and layer per route,
//! the router, the admin listener, and graceful shutdown.
//!
//! The orchestrating module: it sits on top of the others (configuration,
//! plan, stores, proxy, admin) and nothing below depends on it. The
//! pre-launch checklist runs here, inside [`serve()`], so every way of
//! starting the gateway (the CLI, a test, a program embedding the library)
//! refuses the same configurations.
//!
//! The service stack of a route, outermost first:
//! 1. the dispatcher: longest matching prefix, else a 404 problem;
//! 2. `IdempotencyLayer`: key, tenant, fingerprint, claim; the owner's
//!    upstream call runs detached so a client leaving does not cancel it;
//! 3. [`Proxy`]: the upstream call with its layered timeouts.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response};
use idemgate_check::{Finding, Severity};
use idemgate_engine::{AggregatingStore, CachedStore, Engine, Policy, Store};
use idemgate_telemetry::{InstrumentedStore, Telemetry};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

use crate::config::{GatewayConfig, RouteConfig};
use crate::error::GatewayError;
use crate::plan;
use crate::problem::{no_route, path_not_normalized};
use crate::proxy::Proxy;

/// The engine of a route: the shared store with the route's TTLs. The
/// layer decides what a duplicate gets, so the engine never waits itself.
pub fn engine(store: Arc<dyn Store>, route: &RouteConfig) -> Engine {
    Engine::new(store).with_policy(Policy {
        // `heartbeat = false` on the route: the lease must then outlast the
        // whole run (`idemgate check` compares pending_ttl with total).
        heartbeat: route.heartbeat,
        ..Policy::default()
            .pending_ttl(route.pending_ttl)
            .done_ttl(route.done_ttl)
    })
}

/// The store as every route uses it, and its timeline gatherer (to flush
/// at shutdown). From the inside out:
///
/// - store latency by backend and op, errors counted: the calls that reach
///   the store, under the two wrappers that save calls;
/// - replay timeline entries written once per key and flush, with a count;
/// - replays of hot keys answered from memory for up to a second after the
///   store confirmed them (`replay_cache` bytes; 0 caches nothing). Wrapped
///   even when the cache is off: a forget (the admin endpoint) must wait
///   out the copies other replicas hold.
pub fn wrap_store(
    store: Arc<dyn Store>,
    replay_cache: usize,
) -> (Arc<dyn Store>, Arc<AggregatingStore>) {
    let instrumented: Arc<dyn Store> = Arc::new(InstrumentedStore::new(store));
    let gathered = Arc::new(AggregatingStore::new(instrumented));
    let hits = Telemetry::global().replay_cache_hits();
    let cached = CachedStore::new(Arc::clone(&gathered) as Arc<dyn Store>, replay_cache)
        .on_hit(Arc::new(move || hits.increment(1)));
    (Arc::new(cached), gathered)
}

type RouteService = idemgate_layer::Idempotency<Proxy>;

/// Sends each request to the route with the longest matching prefix.
#[derive(Clone, Debug)]
struct Dispatch {
    /// Longest prefix first.
    routes: Arc<[(String, RouteService)]>,
}

impl tower::Service<Request<Body>> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let path = req.uri().path();
        if !is_normalized(path) {
            let resp = path_not_normalized(path);
            return Box::pin(async move { Ok(resp) });
        }
        let svc = self
            .routes
            .iter()
            .find(|(prefix, _)| crate::config::prefix_matches(prefix, path))
            .map(|(_, svc)| svc.clone());
        match svc {
            Some(svc) => Box::pin(svc.oneshot(req)),
            None => {
                let resp = no_route(path);
                Box::pin(async move { Ok(resp) })
            }
        }
    }
}

/// `router` with a guard that turns a panic while handling a request into
/// a 500 `internal` problem for that request alone, counted in
/// `idemgate_panics_total{at="request"}`. The connection and the process go
/// on. (A panic in an owner's execution is caught closer, by the layer,
/// which also releases its key.) Both listeners of `serve` use it.
pub fn guard_panics(router: Router) -> Router {
    router.layer(tower_http::catch_panic::CatchPanicLayer::custom(
        |panic: Box<dyn std::any::Any + Send>| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Telemetry::shared().panicked("request");
            tracing::error!(panic = %what.chars().take(200).collect::<String>(), "a request's handling panicked; answered 500");
            axum::response::IntoResponse::into_response(idemgate_layer::Problem::internal())
        },
    ))
}

/// Whether `path` is routed as it reads: no segment is `.` or `..` (also
/// spelled `%2e`), and no segment hides a separator (`%2f`, `%5c`, `\\`).
///
/// Routing matches the path as sent, but building the upstream URL
/// resolves dot segments, so `/v1/../admin` would pass the `/v1` route's
/// checks and reach `/admin` upstream with the client's credential. An
/// upstream that decodes `%2f` before routing would do the same with
/// `/v1/..%2fadmin`. No API path needs any of these, so they are refused
/// (400) rather than resolved.
pub(crate) fn is_normalized(path: &str) -> bool {
    path.split('/').all(|segment| {
        let lower = segment.to_ascii_lowercase();
        let dots = lower.replace("%2e", ".");
        dots != "."
            && dots != ".."
            && !lower.contains("%2f")
            && !lower.contains("%5c")
            && !segment.contains('\\')
    })
}

/// Runs the gateway on `listener` (proxy) and `admin` (health endpoints)
/// until `shutdown` resolves, then shuts down gracefully.
///
/// Before anything is opened, the pre-launch checklist runs on `config`:
/// every finding is logged, and a key template that would merge different
/// operations ([`plan::REFUSED_AT_START`]) refuses the start. A program that
/// embeds the gateway gets the same guarantee as `idemgate serve`.
///
/// Shutdown stops accepting connections, waits up to
/// `config.shutdown_grace` for requests and detached upstream calls to
/// finish (and be stored), then cancels what remains; every cancelled
/// call releases its key, so no PENDING record is left to expire.
///
/// # Errors
/// [`GatewayError::Refused`] for a refused configuration; the store cannot
/// be opened or is not part of this build, an upstream client cannot be
/// built, or a listener fails.
pub async fn serve(
    listener: TcpListener,
    admin: TcpListener,
    config: GatewayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    preflight(&config)?;
    admin_exposure(admin.local_addr()?, &config)?;
    run(listener, admin, config, shutdown).await
}

/// [`serve()`] on the configured addresses (`config.listen` and
/// `config.admin_listen`), bound after the checklist passed, so a refused
/// configuration never holds a port.
///
/// # Errors
/// As [`serve()`], and [`GatewayError::Bind`] when an address cannot be
/// bound.
pub async fn bind_and_serve(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    preflight(&config)?;
    admin_exposure(config.admin_listen, &config)?;
    let bind = |addr, admin| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Bind {
                addr,
                admin,
                source,
            })
    };
    let listener = bind(config.listen, false).await?;
    let admin = bind(config.admin_listen, true).await?;
    run(listener, admin, config, shutdown).await
}

/// The checklist at start: logs every finding (errors as warnings: only
/// the refused rules stop the start), and refuses [`plan::REFUSED_AT_START`].
fn preflight(config: &GatewayConfig) -> Result<(), GatewayError> {
    let findings = plan::findings(config);
    for f in &findings {
        let route = f.route.as_deref().unwrap_or("-");
        match f.severity {
            Severity::Error => {
                tracing::warn!(rule = f.rule, route, fix = %f.fix, "check: {}", f.message);
            }
            Severity::Warning => {
                tracing::info!(rule = f.rule, route, fix = %f.fix, "check: {}", f.message);
            }
            Severity::Info => {
                tracing::debug!(rule = f.rule, route, fix = %f.fix, "check: {}", f.message);
            }
        }
    }
    let refused: Vec<Finding> = plan::start_refusals(&findings)
        .into_iter()
        .cloned()
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(GatewayError::Refused(refused))
    }
}

/// An admin listener other machines can reach needs a token: the
/// dashboard's data, the key timelines and whatever admin actions exist
/// must not be open to the network.
fn admin_exposure(addr: std::net::SocketAddr, config: &GatewayConfig) -> Result<(), GatewayError> {
    if addr.ip().is_loopback() || config.admin_token.is_some() {
        Ok(())
    } else {
        Err(GatewayError::AdminWithoutToken { addr })
    }
}

/// The gateway itself, once the checklist passed.
async fn run(
    listener: TcpListener,
    admin: TcpListener,
    config: GatewayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    // One metrics pipeline: installed before the routes register their
    // series (a recorder installed earlier by the program is kept).
    let telemetry = Telemetry::global();
    let ring = config
        .encryption_key_file
        .as_deref()
        .map(crate::stores::load_key_ring)
        .transpose()?;
    if let Some(r) = &ring {
        tracing::info!(
            active_key = r.active_key_id(),
            "stored responses are sealed"
        );
    }
    let opened = crate::stores::open_store(&config.store, ring).await?;
    let (store, gathered) = wrap_store(Arc::clone(&opened.store), config.replay_cache);

    let mut layers = Vec::with_capacity(config.routes.len());
    let mut routes = Vec::with_capacity(config.routes.len());
    for route in &config.routes {
        let layer = opened.layer(engine(Arc::clone(&store), route), route.layer_config());
        let svc = layer.layer(Proxy::new(route)?);
        routes.push((route.prefix.clone(), svc));
        layers.push(layer);
    }
    let app = guard_panics(Router::new().fallback_service(Dispatch {
        routes: routes.into(),
    }));

    let ready = Arc::new(AtomicBool::new(true));
    let admin_app = guard_panics(crate::admin::router(crate::admin::AdminState {
        store: Arc::clone(&store),
        ready: Arc::clone(&ready),
        telemetry,
        admin_token: config.admin_token.clone(),
        routes: config
            .routes
            .iter()
            .map(|r| crate::admin::RouteName {
                id: r.id.clone(),
                prefix: r.prefix.clone(),
                done_ttl: r.done_ttl,
            })
            .collect(),
        hit_ratio_rule: Arc::new(crate::admin::HitRatioRule::configured(
            config.alert_rules.as_deref(),
        )),
        admin_hosts: config.admin_hosts.clone().into(),
    }));

    let (stop_tx, stop_rx) = watch::channel(false);
    tracing::info!(
        listen = %listener.local_addr()?,
        admin = %admin.local_addr()?,
        store = %config.store,
        routes = config.routes.len(),
        "gateway started"
    );
    let mut main_task = tokio::spawn(crate::listener::serve(
        listener,
        app,
        config.connections,
        stop_rx.clone(),
        true,
    ));
    // The admin listener keeps the same limits, uncounted: its clients are
    // the operator's own (Prometheus, probes, the dashboard).
    let mut admin_task = tokio::spawn(crate::listener::serve(
        admin,
        admin_app,
        config.connections,
        stop_rx,
        false,
    ));

    let upkeep = tokio::spawn(crate::telemetry::upkeep(telemetry));

    let mut failure: Option<GatewayError> = None;
    tokio::select! {
        () = shutdown => {}
        r = &mut main_task => failure = Some(task_error(r)),
        r = &mut admin_task => failure = Some(task_error(r)),
    }

    // Stop accepting; wait up to the grace period for requests and
    // detached upstream calls; then cancel what remains.
    let started = Instant::now();
    let deadline = started + config.shutdown_grace;
    ready.store(false, Ordering::Relaxed);
    let _ = stop_tx.send(true);
    tracing::info!(
        grace_ms = config.shutdown_grace.as_millis() as u64,
        "shutting down"
    );

    let drain_connections = async {
        if !main_task.is_finished()
            && tokio::time::timeout_at(deadline, &mut main_task)
                .await
                .is_err()
        {
            tracing::warn!("connections still open after the grace period; closing them");
            main_task.abort();
        }
    };
    let drain_work = futures_util::future::join_all(
        layers
            .iter()
            .map(|l| l.shutdown(deadline.saturating_duration_since(Instant::now()))),
    );
    let ((), reports) = tokio::join!(drain_connections, drain_work);
    let cancelled: usize = reports.iter().map(|r| r.cancelled).sum();
    if cancelled > 0 {
        tracing::warn!(
            cancelled,
            "upstream calls cancelled at shutdown; their keys were released (kept as outcome-unknown on charging routes once sent)"
        );
    }
    if !admin_task.is_finished()
        && tokio::time::timeout(Duration::from_secs(1), &mut admin_task)
            .await
            .is_err()
    {
        admin_task.abort();
    }
    upkeep.abort();
    // The replays gathered since the last flush, before the store closes.
    gathered.flush().await;
    opened.close();
    tracing::info!(
        took_ms = started.elapsed().as_millis() as u64,
        cancelled,
        "gateway stopped"
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn task_error(r: Result<std::io::Result<()>, tokio::task::JoinError>) -> GatewayError {
    match r {
        Ok(Ok(())) => GatewayError::Io(std::io::Error::other("listener stopped unexpectedly")),
        Ok(Err(e)) => GatewayError::Io(e),
        Err(e) => GatewayError::Io(std::io::Error::other(e)),
    }
}
