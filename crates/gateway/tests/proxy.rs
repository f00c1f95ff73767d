//! The upstream proxy on its own, against a real upstream on 127.0.0.1:0:
//! forwarding, headers, and each timeout phase separately.

mod support;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idemgate_gateway::config::{RawConfig, RawRoute, RawTimeouts};
use idemgate_gateway::{
    GatewayConfig, OutcomeUnknown, Proxy, RetryableFailure, RouteConfig, UpstreamBodyError,
};
use idemgate_llm_sim::SimConfig;

fn route(upstream: &str, timeouts: RawTimeouts, tweak: impl FnOnce(&mut RawRoute)) -> RouteConfig {
    let mut r = RawRoute {
        prefix: Some("/".into()),
        upstream: Some(upstream.into()),
        timeouts: Some(timeouts),
        ..RawRoute::default()
    };
    tweak(&mut r);
    let cfg = GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        routes: vec![r],
        ..RawConfig::default()
    })
    .unwrap_or_else(|e| panic!("config: {e}"));
    cfg.routes[0].clone()
}

fn timeouts(connect: &str, first_byte: &str, idle: &str, total: &str) -> RawTimeouts {
    RawTimeouts {
        connect: Some(connect.into()),
        first_byte: Some(first_byte.into()),
        idle: Some(idle.into()),
        total: Some(total.into()),
    }
}

fn chat(stream: bool, headers: &[(&str, &str)]) -> Request<Body> {
    let body = serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": "why do retries need idempotency"}],
    });
    let mut b = Request::post("/v1/chat/completions").header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body.to_string())).expect("a valid body")
}

fn proxy(route: &RouteConfig) -> Proxy {
    Proxy::new(route).unwrap_or_else(|e| panic!("proxy: {e}"))
}

/// Reads the body to its end; on a body error returns what arrived and the error.
async fn read_all(body: Body) -> (Vec<u8>, Option<axum::Error>) {
    let mut body = body;
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    got.extend_from_slice(d);
                }
            }
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

/// The phase of the upstream body error inside a client-side body error.
fn body_error_phase(e: &axum::Error) -> &'static str {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(b) = err.downcast_ref::<UpstreamBodyError>() {
            return match b {
                UpstreamBodyError::Idle(_) => "idle",
                UpstreamBodyError::Total(_) => "total",
                UpstreamBodyError::Upstream(_) => "upstream",
                _ => "other",
            };
        }
        cur = err.source();
    }
    panic!("not an upstream body error: {e}")
}

#[tokio::test]
async fn forwards_and_streams_the_answer() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), RawTimeouts::default(), |_| {});
    let p = proxy(&r);
    let resp = p
        .forward(chat(false, &[("idempotency-key", "k-plain")]))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (body, err) = read_all(resp.into_body()).await;
    assert!(err.is_none());
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(sim.executions_for("k-plain"), 1);

    let resp = p
        .forward(chat(true, &[("idempotency-key", "k-stream")]))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (body, err) = read_all(resp.into_body()).await;
    assert!(err.is_none());
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(sim.executions_for("k-stream"), 1);
}

/// An upstream that answers with the headers it received.
async fn echo_upstream() -> String {
    use axum::Router;
    use axum::routing::any;
    async fn echo(req: Request<Body>) -> axum::Json<serde_json::Value> {
        let mut map = serde_json::Map::new();
        for (k, v) in req.headers() {
            map.insert(
                k.as_str().to_owned(),
                serde_json::Value::String(v.to_str().unwrap_or("").to_owned()),
            );
        }
        map.insert("x-path".into(), req.uri().to_string().into());
        axum::Json(serde_json::Value::Object(map))
    }
    let url = support::serve(Router::new().fallback(any(echo))).await;
    format!("{url}/base")
}

#[tokio::test]
async fn headers_are_rewritten_for_the_upstream() {
    let up = echo_upstream().await;
    let r = route(&up, RawTimeouts::default(), |r| {
        r.upstream_key_header = Some("x-upstream-key".into());
    });
    let p = proxy(&r);
    let req = Request::post("/v1/x?q=1")
        .header("host", "gateway.example")
        .header("idempotency-key", "\"quoted-key\"")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .header("tracestate", "congo=t61rcWkgMzE")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "secret")
        .header("keep-alive", "timeout=5")
        .body(Body::from("{}"))
        .expect("a valid body");
    let resp = p.forward(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (body, _) = read_all(resp.into_body()).await;
    let seen: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    let host = up.trim_start_matches("http://").trim_end_matches("/base");
    assert_eq!(seen["host"], host, "Host is the upstream's");
    assert_eq!(seen["x-path"], "/base/v1/x?q=1");
    assert_eq!(
        seen["x-upstream-key"], "quoted-key",
        "key forwarded, bare form"
    );
    assert_eq!(
        seen["traceparent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(seen["tracestate"], "congo=t61rcWkgMzE");
    assert!(seen.get("x-hop").is_none(), "named by Connection: {seen}");
    assert!(seen.get("keep-alive").is_none(), "{seen}");
    assert_eq!(seen["content-length"], "2");
}

#[tokio::test]
async fn connection_refused_is_a_retryable_502() {
    let r = route(
        &format!("http://127.0.0.1:{}", idemgate_testkit::closed_port()),
        timeouts("1s", "5s", "5s", "10s"),
        |_| {},
    );
    let resp = proxy(&r).forward(chat(false, &[])).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        resp.extensions().get::<RetryableFailure>().map(|f| f.phase),
        Some("connect")
    );
    assert_eq!(
        resp.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..])
    );
    let (body, _) = read_all(resp.into_body()).await;
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(
        v["type"],
        "https://idemgate.dev/problems/upstream-unavailable"
    );
    assert_eq!(v["status"], 502);
}

#[tokio::test]
async fn a_hanging_upstream_hits_the_first_byte_timeout() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), timeouts("1s", "300ms", "5s", "10s"), |_| {});
    let resp = proxy(&r)
        .forward(chat(
            false,
            &[("x-sim-fail", "hang"), ("idempotency-key", "hang-1")],
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    // Sent, then no answer: the upstream may be running it.
    assert_eq!(
        resp.extensions().get::<OutcomeUnknown>().map(|f| f.phase),
        Some("first_byte")
    );
    assert!(resp.extensions().get::<RetryableFailure>().is_none());
    let (body, _) = read_all(resp.into_body()).await;
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(v["type"], "https://idemgate.dev/problems/upstream-timeout");
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), timeouts("1s", "5s", "300ms", "30s"), |_| {});
    let resp = proxy(&r)
        .forward(chat(
            true,
            &[
                ("x-sim-fail", "stall-after:3"),
                ("x-sim-first-token-ms", "10"),
            ],
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "headers arrived in time");
    let (got, err) = read_all(resp.into_body()).await;
    assert!(!got.is_empty(), "the events before the stall were relayed");
    let err = err.unwrap_or_else(|| panic!("a stalled stream must end in a body error"));
    assert_eq!(body_error_phase(&err), "idle");
}

#[tokio::test]
async fn a_long_stream_hits_the_total_timeout() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    // Each gap (20 ms) is well inside idle; the whole stream (~4 s) is not
    // inside total.
    let r = route(&sim.url(), timeouts("1s", "400ms", "2s", "500ms"), |_| {});
    let resp = proxy(&r)
        .forward(chat(
            true,
            &[
                ("x-sim-tokens", "200"),
                ("x-sim-token-interval-ms", "20"),
                ("x-sim-first-token-ms", "10"),
            ],
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (got, err) = read_all(resp.into_body()).await;
    assert!(!got.is_empty());
    let err = err.unwrap_or_else(|| panic!("a too-long stream must end in a body error"));
    assert_eq!(body_error_phase(&err), "total");
}

#[tokio::test]
async fn a_reset_mid_stream_is_a_body_error() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), timeouts("1s", "5s", "5s", "30s"), |_| {});
    let resp = proxy(&r)
        .forward(chat(true, &[("x-sim-fail", "reset-after:2")]))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (_, err) = read_all(resp.into_body()).await;
    let err = err.unwrap_or_else(|| panic!("a reset must end in a body error"));
    assert_eq!(body_error_phase(&err), "upstream");
}

/// With one upstream slot, a request that waits in the queue for longer
/// than its first-byte timeout still succeeds: the clock starts when it is
/// sent, not when it arrives.
#[tokio::test]
async fn queue_wait_does_not_eat_the_upstream_budget() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), timeouts("1s", "300ms", "1s", "5s"), |r| {
        r.concurrency_limit = Some(1);
    });
    let p = proxy(&r);
    // The first request takes its slot at once and holds it for its whole
    // stream (~30 tokens × 30 ms ≈ 900 ms, three first-byte timeouts).
    let first = p
        .forward(chat(
            true,
            &[
                ("x-sim-tokens", "30"),
                ("x-sim-token-interval-ms", "30"),
                ("x-sim-first-token-ms", "10"),
                ("idempotency-key", "q-first"),
            ],
        ))
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    let first_body = tokio::spawn(read_all(first.into_body()));
    // The second waits behind it, then has its full budget.
    let second = p
        .forward(chat(
            false,
            &[("x-sim-latency-ms", "150"), ("idempotency-key", "q-second")],
        ))
        .await;
    assert_eq!(second.status(), StatusCode::OK, "queued request timed out");
    let (_, err) = read_all(second.into_body()).await;
    assert!(err.is_none());
    let (_, err) = first_body.await.expect("it succeeds");
    assert!(err.is_none());
    // Both ran, one after the other.
    assert_eq!(sim.executions_for("q-first"), 1);
    assert_eq!(sim.executions_for("q-second"), 1);
}

#[tokio::test]
async fn a_streaming_request_body_over_the_limit_is_not_forwarded_whole() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let r = route(&sim.url(), RawTimeouts::default(), |r| {
        r.body_limit = Some(idemgate_gateway::config::RawSize::Bytes(64));
    });
    // A sized body over the limit: 413 before anything is sent.
    let resp = proxy(&r).forward(chat(false, &[])).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(sim.stats().requests, 0);
}
