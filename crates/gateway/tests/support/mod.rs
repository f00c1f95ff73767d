//! [`TestGateway`]: an in-process gateway on 127.0.0.1:0, shared by the
//! gateway's integration tests.
//!
//! Either hand it a whole [`GatewayConfig`] ([`TestGateway::start`]) or let
//! the builder write one: a single `/v1` route in front of `upstream`, on an
//! SQLite store in a fresh temporary directory unless told otherwise, with
//! the route and the file-level settings adjustable by closures.

#![allow(dead_code)]

pub(crate) mod observability;

use std::time::Duration;

use idemgate_gateway::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute, RawTimeouts};
use idemgate_gateway::{GatewayConfig, GatewayError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running gateway. Stop it with [`TestGateway::stop`]; dropping it also
/// begins a graceful shutdown.
pub(crate) struct TestGateway {
    /// `http://ADDR` of the proxy listener.
    pub(crate) base: String,
    /// `http://ADDR` of the admin listener.
    pub(crate) admin: String,
    /// Send (or drop) to begin graceful shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The running `serve`.
    pub(crate) task: JoinHandle<Result<(), GatewayError>>,
    /// Keeps the SQLite store's directory alive as long as the gateway.
    _dir: Option<tempfile::TempDir>,
}

impl TestGateway {
    /// Starts `config` on free loopback ports.
    pub(crate) async fn start(config: GatewayConfig) -> Self {
        Self::spawn(config, None).await
    }

    /// A builder for a one-route gateway in front of `upstream`.
    pub(crate) fn builder(upstream: &str) -> TestGatewayBuilder {
        TestGatewayBuilder {
            route: RawRoute {
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
            },
            config: RawConfig {
                shutdown_grace: Some("5s".into()),
                ..RawConfig::default()
            },
        }
    }

    async fn spawn(config: GatewayConfig, dir: Option<tempfile::TempDir>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let base = format!(
            "http://{}",
            listener
                .local_addr()
                .expect("a bound listener has an address")
        );
        let admin_url = format!(
            "http://{}",
            admin.local_addr().expect("a bound listener has an address")
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(idemgate_gateway::serve(
            listener,
            admin,
            config,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            base,
            admin: admin_url,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// Begins a graceful shutdown and returns how `serve` ended.
    pub(crate) async fn stop(mut self) -> Result<(), GatewayError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .unwrap_or_else(|_| panic!("gateway did not stop within 30 s"))
            .expect("the serve task did not panic")
    }

    /// The admin listener's `/metrics` text.
    pub(crate) async fn metrics(&self, client: &reqwest::Client) -> String {
        let r = client
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        r.text().await.expect("read the response body")
    }
}

/// Builds a [`TestGateway`]; see [`TestGateway::builder`].
pub(crate) struct TestGatewayBuilder {
    route: RawRoute,
    config: RawConfig,
}

impl TestGatewayBuilder {
    /// Uses `store` (a store URL) instead of a fresh SQLite file.
    pub(crate) fn store(mut self, store: impl Into<String>) -> Self {
        self.config.store = Some(store.into());
        self
    }

    /// Adjusts the route.
    pub(crate) fn route(mut self, tweak: impl FnOnce(&mut RawRoute)) -> Self {
        tweak(&mut self.route);
        self
    }

    /// Adjusts the file-level settings (admin token, shutdown grace, …).
    pub(crate) fn config(mut self, tweak: impl FnOnce(&mut RawConfig)) -> Self {
        tweak(&mut self.config);
        self
    }

    /// The configuration this builder describes; `dir` holds the default
    /// SQLite store.
    fn build(self, dir: &std::path::Path) -> GatewayConfig {
        let mut raw = self.config;
        raw.store
            .get_or_insert_with(|| format!("sqlite:{}", dir.join("gateway.db").display()));
        raw.routes = vec![self.route];
        GatewayConfig::from_raw(raw).unwrap_or_else(|e| panic!("config: {e}"))
    }

    /// The configuration, for a test that edits it further or starts it
    /// twice; the store must have been set with [`Self::store`].
    pub(crate) fn into_config(self) -> GatewayConfig {
        assert!(
            self.config.store.is_some(),
            "into_config needs an explicit store"
        );
        self.build(std::path::Path::new("."))
    }

    /// Starts the gateway.
    pub(crate) async fn start(self) -> TestGateway {
        let dir = tempfile::tempdir().expect("create a temp dir");
        let config = self.build(dir.path());
        TestGateway::spawn(config, Some(dir)).await
    }
}

/// The `Idempotent-Replayed` header, if any.
pub(crate) fn replayed(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The `type` of a problem+json answer.
pub(crate) async fn problem_type(r: reqwest::Response) -> String {
    let bytes = r.bytes().await.expect("read the problem");
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON problem");
    v["type"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `cond` holds, polling (bounded, not a timing assertion).
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}
