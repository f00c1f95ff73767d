//! An admin listener other machines can reach needs the admin token: the
//! gateway refuses to start without one, with a message that says what to
//! do, and starts with one (or on loopback without one).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

mod support;

use idemgate_gateway::{GatewayConfig, GatewayError};
use tokio::net::TcpListener;

/// A memory-store gateway whose admin listener is on `admin_listen`, with
/// the admin `token` if given.
fn config(admin_listen: &str, token: Option<&str>) -> GatewayConfig {
    support::closed_upstream_config("memory:", "/", |c| {
        c.admin_listen = Some(admin_listen.into());
        c.admin_token = token.map(str::to_owned);
    })
}

#[tokio::test]
async fn a_non_loopback_admin_listener_without_a_token_refuses_to_start() {
    // `serve` with listeners bound by the caller.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = idemgate_gateway::serve(
        listener,
        admin,
        config("0.0.0.0:0", None),
        std::future::pending(),
    )
    .await
    .expect_err("must refuse");
    assert!(
        matches!(err, GatewayError::AdminWithoutToken { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("admin_token") && msg.contains("127.0.0.1"),
        "{msg}"
    );

    // `bind_and_serve` refuses before binding anything.
    let err = idemgate_gateway::bind_and_serve(config("0.0.0.0:0", None), std::future::pending())
        .await
        .expect_err("must refuse");
    assert!(
        matches!(err, GatewayError::AdminWithoutToken { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn with_a_token_or_on_loopback_the_admin_listener_starts() {
    for (addr, token) in [("0.0.0.0:0", Some("s3cret-admin")), ("127.0.0.1:0", None)] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind(addr).await.unwrap();
        let port = admin.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(idemgate_gateway::serve(
            listener,
            admin,
            config(addr, token),
            async move {
                let _ = stopped.await;
            },
        ));
        let mut up = false;
        for _ in 0..100 {
            if reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(up, "admin on {addr} did not answer");
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }
}
