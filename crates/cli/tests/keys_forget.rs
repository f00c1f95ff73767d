//! `idemgate keys forget`: the operator clears a key, as its own process.
//!
//! On SQLite, the whole story through a real gateway in front of the
//! simulated LLM: a charging route keeps a first-byte timeout as a final
//! `outcome-unknown` answer, the retry replays it, the operator forgets the
//! key, and the next retry runs again. On Redis and PostgreSQL (a random
//! prefix / schema per run), a record written through the engine is
//! forgotten by the command.

mod support;
use support::{assert_says, on_fresh_stores, sim, text};

use std::path::Path;
use std::process::Output;

use idemgate_engine::{AttemptOutcome, ClientKey, Engine, Fingerprint, ScopedKey};
use idemgate_gateway::test_util::TestGateway;
use idemgate_gateway::{GatewayConfig, Overrides, StoreUrl, open_records};
use idemgate_testkit::http::replayed;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
const CREDENTIAL: &str = "Bearer sk-forget-test";

async fn keys_forget(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(["keys", "forget"])
        .args(args)
        .env("IDEMGATE_CREDENTIAL", CREDENTIAL)
        .current_dir(cwd)
        .output()
        .await
        .expect("run the binary")
}

/// One request with `key`; `hang` makes the simulator never answer.
async fn charge(url: &str, key: &str, hang: bool) -> (u16, Option<String>, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", CREDENTIAL)
        .header("idempotency-key", key)
        .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"charge it"}]}"#);
    if hang {
        req = req.header("x-sim-fail", "hang");
    }
    let r = req.send().await.expect("send the request");
    let status = r.status().as_u16();
    let replayed = replayed(&r);
    let body = r.text().await.unwrap_or_default();
    (status, replayed, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_forget_clears_an_outcome_unknown_answer_on_sqlite() {
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let db = dir.path().join("gateway.db");
    let file = dir.path().join("gw.toml");
    std::fs::write(
        &file,
        format!(
            "upstream = {up:?}\nstore = {store:?}\n\n[[routes]]\nprefix = \"/v1\"\nkey = \"require\"\ncharges = true\n\n[routes.timeouts]\nfirst_byte = \"300ms\"\n",
            up = sim.url(),
            store = format!("sqlite:{}", db.display()),
        ),
    )
    .expect("write the configuration");
    let config = GatewayConfig::load(Some(&file), &Overrides::default()).expect("load");
    let gw = TestGateway::start(config).await;
    let url = gw.base.clone();

    let key = "charge-order-81";
    let (status, replayed, body) = charge(&url, key, true).await;
    assert_eq!((status, replayed.as_deref()), (504, Some("false")));
    assert!(body.contains("outcome-unknown"), "{body}");
    let (status, replayed, _) = charge(&url, key, false).await;
    assert_eq!((status, replayed.as_deref()), (504, Some("true")));
    assert_eq!(sim.executions_for(key), 1);

    let config = file.display().to_string();
    let out = keys_forget(&[key, "--config", &config], dir.path()).await;
    assert_says(&out, "forgot key");

    let (status, replayed, _) = charge(&url, key, false).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("false")));
    assert_eq!(sim.executions_for(key), 2);

    // Nothing stored for this key: exit 1, said on stderr.
    let out = keys_forget(&["never-sent", "--config", &config], dir.path()).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("no record"),
        "{}",
        text(&out.stderr)
    );
    // A malformed key is a usage error.
    let out = keys_forget(&["", "--config", &config], dir.path()).await;
    assert_eq!(out.status.code(), Some(2));

    gw.stop().await.expect("it ended without error");
}

async fn forgets_on(url: String) {
    let parsed = StoreUrl::parse(&url).expect("a valid literal");
    let store = open_records(&parsed, None)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e} (is the server running?)"));
    let engine = Engine::new(std::sync::Arc::clone(&store));
    let key = ScopedKey::new("tenant-1", "/v1", ClientKey::mint());
    let fp = Fingerprint::of_request("POST", "/v1", b"{}", &[]);
    engine
        .execute(&key, &fp, || async { Ok::<_, std::io::Error>(42u32) })
        .await
        .expect("execute");
    let args = [
        key.key.as_str(),
        "--tenant",
        "tenant-1",
        "--namespace",
        "/v1",
        "--store",
        &url,
    ];
    let dir = tempfile::tempdir().expect("create a temp dir");
    let out = keys_forget(&args, dir.path()).await;
    assert!(out.status.success(), "{url}: {}", text(&out.stderr));
    assert_eq!(store.get(&key).await.expect("read"), None, "{url}");
    let outcomes: Vec<_> = store
        .timeline(&key)
        .await
        .expect("timeline")
        .iter()
        .map(|a| a.outcome)
        .collect();
    assert!(
        outcomes.contains(&AttemptOutcome::Forgotten),
        "{outcomes:?}"
    );
    // Forgotten already: nothing left to forget.
    let out = keys_forget(&args, dir.path()).await;
    assert_eq!(out.status.code(), Some(1), "{url}");
}

on_fresh_stores!(forgets_on("forget"):
    keys_forget_clears_a_redis_key,
    keys_forget_clears_a_postgres_key);
