//! Unit tests of the parent module.

use super::*;

#[test]
fn tokens_match_only_when_equal() {
    assert!(token_matches(b"s3cret-token", b"s3cret-token"));
    assert!(!token_matches(b"s3cret-tokeN", b"s3cret-token"));
    assert!(!token_matches(b"s3cret", b"s3cret-token"));
    assert!(!token_matches(b"", b"s3cret-token"));
    assert!(!token_matches(b"s3cret-token-and-more", b"s3cret-token"));
}

#[test]
fn bearer_tokens_are_read_case_insensitively() {
    let mut h = HeaderMap::new();
    assert_eq!(bearer(&h), None);
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer abc"),
    );
    assert_eq!(bearer(&h), Some(&b"abc"[..]));
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("bearer  abc "),
    );
    assert_eq!(bearer(&h), Some(&b"abc"[..]));
    h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
    assert_eq!(bearer(&h), None);
    h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bear"));
    assert_eq!(bearer(&h), None);
}

#[test]
fn namespaces_resolve_by_id_or_prefix() {
    let routes = [
        RouteName {
            id: "chat".into(),
            prefix: "/v1".into(),
            done_ttl: Duration::from_secs(60),
        },
        RouteName {
            id: "msgs".into(),
            prefix: "/anthropic".into(),
            done_ttl: Duration::from_secs(60),
        },
    ];
    let id = |n: Option<&str>| find_route(&routes, n).map(|r| r.id.clone()).ok();
    assert_eq!(id(Some("chat")), Some("chat".into()));
    assert_eq!(id(Some("/anthropic")), Some("msgs".into()));
    assert_eq!(id(Some("/nope")), None);
    assert_eq!(
        find_route(&routes, None).err(),
        Some(RouteLookup::Ambiguous)
    );
    assert_eq!(
        find_route(&routes[..1], None).map(|r| r.id.clone()).ok(),
        Some("chat".into())
    );
}
