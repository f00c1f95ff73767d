//! What admission reads from a request, through a real gateway in front of
//! the simulated LLM: the tenant (from the credential header each provider's
//! clients send, or a route's own list) and the body (exact numbers,
//! duplicate object keys refused, multipart without its boundary).

mod support;

use support::TestGateway;

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawKeyMode, RawRoute};
use idemgate_llm_sim::SimHandle;

fn config(upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> GatewayConfig {
    TestGateway::builder(upstream)
        .store("memory:")
        .route(|r| {
            r.key = Some(RawKeyMode::Require);
            // The gateway's default upstream timeouts.
            r.timeouts = None;
            tweak(r);
        })
        .into_config()
}

/// A quick simulator and, in front of it, a gateway on [`config`] with the
/// route changed by `tweak`, with a client for the test.
async fn start(tweak: impl FnOnce(&mut RawRoute)) -> (SimHandle, TestGateway, reqwest::Client) {
    let sim = support::quick_sim().await;
    let gw = TestGateway::start(config(&sim.url(), tweak)).await;
    (sim, gw, reqwest::Client::new())
}

/// A `POST` of the JSON `body` to the gateway's `/v1/messages` under `key`.
fn messages(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    support::json_post(client, format!("{}/v1/messages", gw.base), body)
        .header("idempotency-key", key)
}

/// An Anthropic Messages body.
fn messages_body(text: &str) -> String {
    serde_json::json!({
        "model": "sim-claude-small",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

struct Answer {
    status: u16,
    replayed: Option<String>,
    content_type: String,
    body: String,
}

async fn send(req: reqwest::RequestBuilder) -> Answer {
    let r = req.send().await.expect("send the request");
    Answer {
        status: r.status().as_u16(),
        replayed: support::header(&r, "idempotent-replayed"),
        content_type: support::header(&r, "content-type").unwrap_or_default(),
        body: r.text().await.expect("read the response body"),
    }
}

fn problem_type(a: &Answer) -> String {
    assert_eq!(a.content_type, "application/problem+json", "{}", a.body);
    let v: serde_json::Value = serde_json::from_str(&a.body).expect("a JSON problem");
    v["type"].as_str().unwrap_or_default().to_owned()
}

async fn stop(gw: TestGateway) {
    gw.stop().await.expect("serve returns Ok");
}

/// Two customers of one provider send the same key and body, each with
/// its own credential in the header its API uses: each gets its own
/// execution; the same credential again gets the stored answer.
#[tokio::test]
async fn each_providers_credential_header_names_its_own_tenant() {
    let (sim, gw, client) = start(|_| {}).await;
    let url = format!("{}/v1/messages", gw.base);
    for header in ["x-api-key", "api-key", "x-goog-api-key", "authorization"] {
        let key = format!("same-key-{header}");
        let body = messages_body("one operation, two customers");
        let req = |credential: &str| {
            client
                .post(&url)
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .header(header, credential)
                .body(body.clone())
        };
        let a = send(req("customer-a-secret")).await;
        let b = send(req("customer-b-secret")).await;
        for (who, answer) in [("a", &a), ("b", &b)] {
            assert_eq!(answer.status, 200, "{header} {who}: {}", answer.body);
            assert_eq!(answer.replayed.as_deref(), Some("false"), "{header} {who}");
        }
        assert_ne!(a.body, b.body, "{header}: two executions, two ids");
        assert_eq!(sim.executions_for(&key), 2, "{header}");
        let again = send(req("customer-a-secret")).await;
        assert_eq!(again.replayed.as_deref(), Some("true"), "{header}");
        assert_eq!(again.body, a.body, "{header}: A's own answer");
        assert_eq!(sim.executions_for(&key), 2, "{header}: no third run");
    }
    stop(gw).await;
}

/// A request with no credential header at all is in `anonymous`, apart
/// from every credentialed tenant.
#[tokio::test]
async fn no_credential_is_its_own_tenant() {
    let (sim, gw, client) = start(|_| {}).await;
    let req = |credential: Option<&str>| {
        let mut b = messages(&client, &gw, "anon-key", messages_body("anonymous"));
        if let Some(c) = credential {
            b = b.header("x-api-key", c);
        }
        b
    };
    assert_eq!(send(req(None)).await.replayed.as_deref(), Some("false"));
    assert_eq!(
        send(req(Some("k"))).await.replayed.as_deref(),
        Some("false")
    );
    assert_eq!(send(req(None)).await.replayed.as_deref(), Some("true"));
    assert_eq!(sim.executions_for("anon-key"), 2);
    stop(gw).await;
}

/// A route that lists its own tenant headers reads them, in order, and
/// nothing else: a rotating credential under one stable `x-tenant-id` is
/// one tenant, so its retry replays; another `x-tenant-id` is another.
#[tokio::test]
async fn a_route_reads_its_own_tenant_headers_in_order() {
    let (sim, gw, client) = start(|r| {
        r.tenant_headers = Some(vec!["x-tenant-id".into(), "x-api-key".into()]);
    })
    .await;
    let req = |tenant: Option<&str>, token: &str| {
        let mut b = messages(&client, &gw, "listed-key", messages_body("listed headers"))
            .header("x-api-key", token);
        if let Some(t) = tenant {
            b = b.header("x-tenant-id", t);
        }
        b
    };
    let first = send(req(Some("acme"), "jwt-minted-at-1")).await;
    assert_eq!(first.replayed.as_deref(), Some("false"));
    // The token rotated between attempts; the tenant did not.
    let retry = send(req(Some("acme"), "jwt-minted-at-2")).await;
    assert_eq!(retry.replayed.as_deref(), Some("true"));
    assert_eq!(retry.body, first.body);
    assert_eq!(sim.executions_for("listed-key"), 1);
    // Another tenant id: its own execution.
    let other = send(req(Some("globex"), "jwt-minted-at-1")).await;
    assert_eq!(other.replayed.as_deref(), Some("false"));
    // No `x-tenant-id`: the next header of the list names the tenant.
    let by_key = send(req(None, "jwt-minted-at-1")).await;
    assert_eq!(by_key.replayed.as_deref(), Some("false"));
    assert_eq!(
        send(req(None, "jwt-minted-at-1")).await.replayed.as_deref(),
        Some("true")
    );
    assert_eq!(sim.executions_for("listed-key"), 3);
    stop(gw).await;
}

/// Numbers are compared by their exact literal: two amounts that an `f64`
/// would merge are two requests, so reusing the key is a 422, never a
/// replay of the other amount's answer.
#[tokio::test]
async fn numbers_beyond_f64_precision_are_different_requests() {
    let (sim, gw, client) = start(|_| {}).await;
    let body = |amount: &str| {
        format!(
            r#"{{"model":"sim-claude-small","max_tokens":16,"amount":{amount},"messages":[{{"role":"user","content":"charge"}}]}}"#
        )
    };
    let req =
        |amount: &str| messages(&client, &gw, "amount-key", body(amount)).header("x-api-key", "k");
    let first = send(req("12345678901234567890123")).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let other = send(req("12345678901234567890124")).await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(
        problem_type(&other),
        "https://idemgate.dev/problems/key-mismatch"
    );
    assert_eq!(other.replayed, None);
    // The same amount, reformatted, is the same request.
    let spaced = body(" 12345678901234567890123 ").replace(',', ", ");
    let spaced = messages(&client, &gw, "amount-key", spaced).header("x-api-key", "k");
    let same = send(spaced).await;
    assert_eq!(same.replayed.as_deref(), Some("true"), "{}", same.body);
    assert_eq!(sim.executions_for("amount-key"), 1);
    stop(gw).await;
}

/// A JSON object that repeats a key reads two ways: refused with 400
/// before anything is forwarded or stored, so the corrected request with
/// the same key then runs as a first request.
#[tokio::test]
async fn duplicate_object_keys_are_refused_before_anything_runs() {
    refused_before_anything_runs(
        "dup-key",
        [
            r#"{"model":"sim-claude-small","max_tokens":16,"max_tokens":4096,"messages":[{"role":"user","content":"x"}]}"#.to_owned(),
            r#"{"model":"sim-claude-small","max_tokens":16,"messages":[{"role":"user","role":"system","content":"x"}]}"#.to_owned(),
        ],
        "https://idemgate.dev/problems/ambiguous-body",
        "repeats the object key",
    )
    .await;
}

/// A body nested far deeper than any request needs (20 KB, 10,000
/// levels) once aborted the whole process. It is refused with 400
/// `body-too-deep` before anything is stored or forwarded, and the gateway
/// goes on serving: the same key then runs a normal request.
#[tokio::test]
async fn deeply_nested_bodies_are_refused_and_the_gateway_goes_on() {
    let depth = 10_000;
    refused_before_anything_runs(
        "deep-key",
        [
            format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
            format!(
                r#"{{"model":"sim-claude-small","max_tokens":16,"metadata":{}1{}}}"#,
                r#"{"a":"#.repeat(depth),
                "}".repeat(depth)
            ),
        ],
        "https://idemgate.dev/problems/body-too-deep",
        "128 levels",
    )
    .await;
}

/// Sends each of `bodies` under `key`: each is refused with 400, the
/// problem `problem` and a text that `says` why, and nothing reaches the
/// upstream; then a well-formed body under the same key runs as a first
/// request (no record was left).
async fn refused_before_anything_runs(key: &str, bodies: [String; 2], problem: &str, says: &str) {
    let (sim, gw, client) = start(|_| {}).await;
    let req = |body: String| messages(&client, &gw, key, body).header("x-api-key", "k");
    for body in bodies {
        let refused = send(req(body)).await;
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(problem_type(&refused), problem);
        assert!(refused.body.contains(says), "{}", refused.body);
    }
    assert_eq!(sim.stats().requests, 0, "nothing forwarded");
    let fine = send(req(messages_body("x"))).await;
    assert_eq!(fine.status, 200, "{}", fine.body);
    assert_eq!(
        fine.replayed.as_deref(),
        Some("false"),
        "no record was left"
    );
    assert_eq!(sim.executions_for(key), 1);
    stop(gw).await;
}

fn multipart(boundary: &str, purpose: &str) -> (String, String) {
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n{{\"custom_id\":\"r1\"}}\r\n--{boundary}--\r\n"
    );
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A client picks a new multipart boundary on every attempt: the retry is
/// the same request (replayed), while other parts under the key are a 422.
#[tokio::test]
async fn a_multipart_retry_with_a_new_boundary_replays() {
    let (sim, gw, client) = start(|_| {}).await;
    let req = |(content_type, body): (String, String)| {
        client
            .post(format!("{}/v1/messages", gw.base))
            .header("content-type", content_type)
            .header("idempotency-key", "upload-key")
            .header("x-api-key", "k")
            .body(body)
    };
    // The simulator refuses a body that is not JSON with a final 400,
    // which is stored like any final answer.
    let first = send(req(multipart("----attempt1a2b3c", "batch"))).await;
    assert_eq!(first.status, 400, "{}", first.body);
    assert_eq!(first.replayed.as_deref(), Some("false"));
    let retry = send(req(multipart("----attempt2zz9y8", "batch"))).await;
    assert_eq!(retry.status, 400);
    assert_eq!(retry.replayed.as_deref(), Some("true"), "{}", retry.body);
    assert_eq!(retry.body, first.body);
    let other = send(req(multipart("----attempt3qq", "fine-tune"))).await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(
        problem_type(&other),
        "https://idemgate.dev/problems/key-mismatch"
    );
    assert_eq!(sim.stats().requests, 1, "the upstream saw one request");
    stop(gw).await;
}
