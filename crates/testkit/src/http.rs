//! What the tests of the HTTP crates (gateway, client, CLI) share, behind
//! the `http` feature so that the store crates' tests do not build an HTTP
//! client: the replay header of an answer. (A listener on a free loopback
//! port is the gateway's `test_util::loopback`, beside `TestGateway`.)

/// The `Idempotent-Replayed` header of `r`, if any.
pub fn replayed(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
