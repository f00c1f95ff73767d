//! The admin listener answers only requests addressed to it by an IP
//! address, `localhost`, or a configured name (`admin_hosts`).
//!
//! A browser on the operator's machine can be pointed at a page whose host
//! name the attacker later re-binds to 127.0.0.1 (DNS rebinding): the
//! page's scripts then reach the admin listener as a same-origin site, and
//! read `/metrics`, the probes and the dashboard page. Such a request
//! carries the attacker's host name in `Host`, so it is refused (421)
//! before any handler runs. A request by IP address (a scraper, a probe,
//! `curl 127.0.0.1:9464`) cannot come from a re-bound name, and is
//! answered; so is one without `Host` at all (HTTP/1.0).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use http::{HeaderValue, Response, StatusCode, header};

use super::AdminState;
use crate::problem::problem;

/// Refuses a request whose `Host` names neither an IP address, `localhost`
/// nor one of the configured names.
pub(super) async fn check(State(s): State<AdminState>, req: Request, next: Next) -> Response<Body> {
    match req.headers().get(header::HOST) {
        Some(host) if !allowed(host, &s.admin_hosts) => problem(
            StatusCode::MISDIRECTED_REQUEST,
            "admin-host-refused",
            "Host not served",
            "the admin listener answers requests by IP address, localhost or a name listed in admin_hosts",
        ),
        _ => next.run(req).await,
    }
}

/// Whether `Host: value` may reach the admin listener.
pub(crate) fn allowed(value: &HeaderValue, names: &[String]) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    let host = without_port(text.trim());
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse::<std::net::Ipv6Addr>().is_ok();
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost") || names.contains(&host)
}

/// `host[:port]` without its port (an IPv6 literal keeps its brackets).
fn without_port(text: &str) -> &str {
    if text.starts_with('[') {
        return text.find(']').map_or(text, |end| &text[..=end]);
    }
    match text.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(host: &str) -> bool {
        allowed(
            &HeaderValue::from_str(host).unwrap(),
            &["metrics.internal".to_owned()],
        )
    }

    #[test]
    fn ip_addresses_localhost_and_listed_names_only() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:9464",
            "10.1.2.3:9464",
            "[::1]",
            "[::1]:9464",
            "localhost",
            "LOCALHOST:9464",
            "app.localhost",
            "metrics.internal:9464",
            "Metrics.Internal.",
        ] {
            assert!(ok(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9464",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::1",
            "[not-an-ip]",
            "",
            "metrics.internal.evil",
        ] {
            assert!(!ok(host), "{host}");
        }
    }
}
