//! A password in the store URL never shows: not in the error of a store
//! that cannot be opened (its `Display` or its `Debug`, the driver's
//! source included), whatever went wrong — a closed port, a malformed URL,
//! a TLS setting that cannot be used, a password the server refuses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use idemgate_redis::{Endpoint, RedisStore};
use idemgate_testkit::{assert_error_hides, assert_hidden, closed_port};

const PW: &str = "s3cr3t-pw";

#[tokio::test]
async fn failed_opens_never_show_the_password() {
    let port = closed_port();
    let urls = [
        format!("redis://:{PW}@127.0.0.1:{port}/"),
        format!("redis://user:{PW}@127.0.0.1:{port}/0"),
        format!("rediss://:{PW}@127.0.0.1:{port}/"),
        format!("redis+cluster://:{PW}@127.0.0.1:{port},127.0.0.1:{port}/"),
        format!("rediss+cluster://:{PW}@127.0.0.1:{port}/"),
        format!("redis://:{PW}@127.0.0.1:99999/"),
        format!("redis://:{PW}@[::1/"),
        format!("redis://:{PW}@127.0.0.1:{port}/notadb"),
        format!("rediss://:{PW}@127.0.0.1:{port}/?tls_ca=/nonexistent/ca.pem"),
        format!("redis://:{PW}@127.0.0.1:{port}/?tls_ca=/nonexistent/ca.pem"),
    ];
    let opts = support::options().connection_timeout(Duration::from_millis(300));
    for url in &urls {
        let err = RedisStore::connect_with(url, opts.clone())
            .await
            .expect_err("nothing to connect to");
        assert_error_hides(PW, url, &err);
        if let Ok(endpoint) = Endpoint::parse(url) {
            assert_hidden(PW, url, &format!("{endpoint:?}"));
        }
    }
}

#[tokio::test]
async fn a_refused_password_is_not_repeated() {
    // The shared server has no password set: `AUTH` with one is refused.
    let url = format!(
        "redis://:{PW}@{}/",
        support::SHARED_URL.trim_start_matches("redis://")
    );
    let err = RedisStore::connect_with(&url, support::options())
        .await
        .expect_err("AUTH with a password the server does not have");
    assert_hidden(PW, "a refused AUTH", &format!("{err} | {err:?}"));
}
