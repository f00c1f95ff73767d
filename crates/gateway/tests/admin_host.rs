//! The admin listener answers requests addressed to it by IP address,
//! `localhost` or a configured name, and refuses any other `Host` (421):
//! a page whose name was re-bound to 127.0.0.1 (DNS rebinding) cannot read
//! the metrics, the probes or the dashboard. Raw sockets, so each request
//! carries exactly the `Host` written here.

mod support;

use idemgate_gateway::config::RawConfig;
use support::TestGateway;

/// Sends `GET path` to the admin listener with the `Host` header `host`
/// (none: an HTTP/1.0 request without one); returns the status and text.
async fn get(admin: &str, path: &str, host: Option<&str>) -> (u16, String) {
    let host_line = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
    let version = if host.is_some() { "1.1" } else { "1.0" };
    let request = format!("GET {path} HTTP/{version}\r\n{host_line}Connection: close\r\n\r\n");
    support::raw_exchange(admin, &request).await
}

#[tokio::test]
async fn only_ip_addresses_localhost_and_listed_names_reach_the_admin_listener() {
    let gw = TestGateway::builder("http://127.0.0.1:9")
        .config(|c: &mut RawConfig| {
            c.admin_hosts = Some(vec!["Metrics.Internal".into()]);
        })
        .start()
        .await;
    let port = gw.admin.rsplit(':').next().expect("a port").to_owned();
    for host in [
        format!("127.0.0.1:{port}"),
        "localhost".to_owned(),
        format!("localhost:{port}"),
        format!("metrics.internal:{port}"),
    ] {
        for path in ["/metrics", "/healthz", "/"] {
            let (status, text) = get(&gw.admin, path, Some(&host)).await;
            assert_eq!(status, 200, "{host} {path}: {text}");
        }
    }
    // HTTP/1.0 without Host: a probe by address.
    assert_eq!(get(&gw.admin, "/healthz", None).await.0, 200);
    for host in [
        format!("rebound.example:{port}"),
        "127.0.0.1.rebound.example".to_owned(),
        "localhost.rebound.example".to_owned(),
    ] {
        for path in ["/metrics", "/healthz", "/readyz", "/", "/admin/stats"] {
            let (status, text) = get(&gw.admin, path, Some(&host)).await;
            assert_eq!(status, 421, "{host} {path}: {text}");
            assert!(
                text.contains("https://idemgate.dev/problems/admin-host-refused"),
                "{text}"
            );
            assert!(!text.contains("idempotency_"), "no metric leaks: {text}");
        }
    }
    gw.stop().await.expect("a clean stop");
}
