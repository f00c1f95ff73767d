//! Starting an in-process gateway on 127.0.0.1:0, shared by the gateway's
//! integration tests (each test file uses what it needs).

#![allow(dead_code)]

use idemgate_gateway::{GatewayConfig, GatewayError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A gateway started by [`spawn`].
pub(crate) struct Spawned {
    /// `http://ADDR` of the proxy listener.
    pub(crate) base: String,
    /// `http://ADDR` of the admin listener.
    pub(crate) admin: String,
    /// Send (or drop) to begin graceful shutdown.
    pub(crate) stop: oneshot::Sender<()>,
    /// The running `serve`.
    pub(crate) task: JoinHandle<Result<(), GatewayError>>,
}

/// Binds both listeners on free loopback ports and runs `serve` in a task.
pub(crate) async fn spawn(config: GatewayConfig) -> Spawned {
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
    Spawned {
        base,
        admin: admin_url,
        stop,
        task,
    }
}
