//! [`TestGateway`]: a real gateway on real loopback listeners, for the
//! integration tests of this crate and of the crates that talk to it (the
//! client's retry and stream tests). Enabled by the `test-util` feature, as
//! a dev-dependency only: one harness, so a test written for one crate
//! reads the same in the other.
//!
//! Either hand it a whole [`GatewayConfig`] ([`TestGateway::start`]) or let
//! the builder write one: a single `/v1` route in front of `upstream`, keys
//! optional, duplicates waiting, generous upstream timeouts, on an SQLite
//! store in a fresh temporary directory unless told otherwise; the route
//! and the file-level settings are adjustable by closures.

use std::path::Path;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute, RawTimeouts};
use crate::{GatewayConfig, GatewayError};

/// A running gateway. Stop it with [`TestGateway::stop`]; dropping it also
/// begins a graceful shutdown.
#[derive(Debug)]
pub struct TestGateway {
    /// `http://ADDR` of the proxy listener.
    pub base: String,
    /// `http://ADDR` of the admin listener.
    pub admin: String,
    /// Send (or drop) to begin graceful shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The running [`serve`](crate::serve()).
    pub task: JoinHandle<Result<(), GatewayError>>,
    /// Keeps the SQLite store's directory alive as long as the gateway.
    _dir: Option<tempfile::TempDir>,
}

impl TestGateway {
    /// Starts `config` on free loopback ports.
    pub async fn start(config: GatewayConfig) -> Self {
        Self::spawn(config, None).await
    }

    /// A builder for a one-route gateway in front of `upstream`.
    pub fn builder(upstream: &str) -> TestGatewayBuilder {
        TestGatewayBuilder {
            route: Self::route(upstream),
            more: Vec::new(),
            config: RawConfig {
                shutdown_grace: Some("5s".into()),
                ..RawConfig::default()
            },
        }
    }

    /// The route the builder starts from: `/v1` in front of `upstream`,
    /// keys optional, duplicates waiting, upstream timeouts of 1 s to
    /// connect, 10 s to the first byte, 5 s idle and 20 s in all.
    pub fn route(upstream: &str) -> RawRoute {
        RawRoute {
            prefix: Some("/v1".into()),
            upstream: Some(upstream.into()),
            key: Some(RawKeyMode::Optional),
            on_inflight: Some(RawInflightMode::Wait),
            timeouts: Some(RawTimeouts {
                connect: Some("1s".into()),
                first_byte: Some("10s".into()),
                idle: Some("5s".into()),
                total: Some("20s".into()),
            }),
            ..RawRoute::default()
        }
    }

    async fn spawn(config: GatewayConfig, dir: Option<tempfile::TempDir>) -> Self {
        let (listener, base) = loopback().await;
        let (admin, admin_url) = loopback().await;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::serve(listener, admin, config, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            admin: admin_url,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// Begins a graceful shutdown and returns how `serve` ended; panics if
    /// it does not end within 30 s or its task panicked.
    pub async fn stop(mut self) -> Result<(), GatewayError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .unwrap_or_else(|_| panic!("gateway did not stop within 30 s"))
            .expect("the serve task did not panic")
    }
}

/// A listener on a free loopback port, and its `http://ADDR`: for the
/// upstreams and relays tests put in front of or behind a gateway.
pub async fn loopback() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .expect("a bound listener has an address")
    );
    (listener, url)
}

/// Builds a [`TestGateway`]; see [`TestGateway::builder`].
#[derive(Debug)]
pub struct TestGatewayBuilder {
    route: RawRoute,
    /// Routes after the first, as given.
    more: Vec<RawRoute>,
    config: RawConfig,
}

impl TestGatewayBuilder {
    /// Uses `store` (a store URL such as `memory:`) instead of a fresh
    /// SQLite file.
    pub fn store(mut self, store: impl Into<String>) -> Self {
        self.config.store = Some(store.into());
        self
    }

    /// Sets what a duplicate of an in-flight request does.
    pub fn on_inflight(mut self, mode: RawInflightMode) -> Self {
        self.route.on_inflight = Some(mode);
        self
    }

    /// Adjusts the route.
    pub fn route(mut self, tweak: impl FnOnce(&mut RawRoute)) -> Self {
        tweak(&mut self.route);
        self
    }

    /// Sets the total upstream timeout of the route (20 s unless told).
    pub fn total_timeout(mut self, total: &str) -> Self {
        if let Some(t) = &mut self.route.timeouts {
            t.total = Some(total.into());
        }
        self
    }

    /// Adds `route` after the first.
    pub fn and_route(mut self, route: RawRoute) -> Self {
        self.more.push(route);
        self
    }

    /// Adjusts the file-level settings (admin token, shutdown grace, …).
    pub fn config(mut self, tweak: impl FnOnce(&mut RawConfig)) -> Self {
        tweak(&mut self.config);
        self
    }

    /// The configuration this builder describes; `dir` holds the default
    /// SQLite store.
    fn build(self, dir: &Path) -> GatewayConfig {
        let mut raw = self.config;
        raw.store
            .get_or_insert_with(|| format!("sqlite:{}", dir.join("gateway.db").display()));
        raw.routes = std::iter::once(self.route).chain(self.more).collect();
        GatewayConfig::from_raw(raw).unwrap_or_else(|e| panic!("config: {e}"))
    }

    /// The configuration, for a test that edits it further or starts it
    /// twice; the store must have been set with [`Self::store`].
    pub fn into_config(self) -> GatewayConfig {
        assert!(
            self.config.store.is_some(),
            "into_config needs an explicit store"
        );
        self.build(Path::new("."))
    }

    /// Starts the gateway.
    pub async fn start(self) -> TestGateway {
        let dir = tempfile::tempdir().expect("create a temp dir");
        let config = self.build(dir.path());
        TestGateway::spawn(config, Some(dir)).await
    }
}
