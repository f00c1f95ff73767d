//! Unit tests of the parent module.

use super::*;

fn route(prefix: &str, upstream: &str, strip: bool) -> Proxy {
    let mut cfg = crate::config::GatewayConfig::for_upstream(upstream)
        .map(|c| c.routes[0].clone())
        .expect("a valid upstream");
    cfg.prefix = prefix.into();
    cfg.strip_prefix = strip;
    Proxy::new(&cfg).expect("a valid route")
}

#[test]
fn upstream_urls_join_base_path_and_request_path() {
    let p = route("/v1", "http://up:1/base/", false);
    let uri: http::Uri = "/v1/chat?x=1".parse().expect("a valid literal");
    assert_eq!(
        p.inner.upstream_url(&uri).map(|u| u.to_string()),
        Some("http://up:1/base/v1/chat?x=1".into())
    );
    let p = route("/v1", "http://up:1", true);
    assert_eq!(
        p.inner.upstream_url(&uri).map(|u| u.to_string()),
        Some("http://up:1/chat?x=1".into())
    );
}

#[test]
fn hop_by_hop_headers_are_stripped() {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("close, x-private"),
    );
    h.insert("x-private", HeaderValue::from_static("1"));
    h.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    h.insert("traceparent", HeaderValue::from_static("00-abc-def-01"));
    strip_hop_by_hop(&mut h);
    assert!(h.get("x-private").is_none());
    assert!(h.get(header::CONNECTION).is_none());
    assert!(h.get(header::TRANSFER_ENCODING).is_none());
    assert!(h.get("traceparent").is_some());
}
