//! `idemgate keys show` against the SQLite file of a real gateway: the
//! gateway runs in this process in front of the simulated LLM, the command
//! runs as its own process on the same file.

mod support;
use support::{assert_exit_says, assert_says, sim, text};

use std::path::Path;
use std::process::Output;

use idemgate_gateway::test_util::TestGateway;
use idemgate_gateway::{GatewayConfig, Overrides};
use idemgate_testkit::http::replayed;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
const KEY: &str = "report-2026-q3";
const CREDENTIAL: &str = "Bearer sk-test-credential";

/// Runs `keys show`; a `"--credential", VALUE` pair in `args` is passed the
/// way the command takes it, in IDEMGATE_CREDENTIAL (never in argv).
async fn keys_show(args: &[&str], cwd: &Path) -> Output {
    let mut argv = Vec::new();
    let mut credential = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == "--credential" {
            credential = it.next().copied();
        } else {
            argv.push(*a);
        }
    }
    let mut cmd = Command::new(BIN);
    cmd.args(["keys", "show"])
        .args(argv)
        .current_dir(cwd)
        .env_remove("IDEMGATE_CREDENTIAL");
    if let Some(c) = credential {
        cmd.env("IDEMGATE_CREDENTIAL", c);
    }
    cmd.output().await.expect("run the binary")
}

/// Runs `keys show --credential-stdin` with `stdin` piped in, or `keys
/// show` with `extra` arguments as given (no credential rewriting).
async fn keys_show_raw(args: &[&str], stdin: Option<&str>, cwd: &Path) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new(BIN)
        .args(["keys", "show"])
        .args(args)
        .current_dir(cwd)
        .env_remove("IDEMGATE_CREDENTIAL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the binary");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
    }
    drop(pipe);
    child.wait_with_output().await.expect("run the binary")
}

async fn chat(client: &reqwest::Client, url: &str) -> (u16, Option<String>) {
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", CREDENTIAL)
        .header("idempotency-key", KEY)
        .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"the quarterly report"}]}"#)
        .send()
        .await
        .expect("send the request");
    let replayed = replayed(&r);
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    (status, replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_show_prints_the_state_and_timeline_a_gateway_stored() {
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let db = dir.path().join("gateway.db");
    let store = format!("sqlite:{}", db.display());
    let config = GatewayConfig::load(
        None,
        &Overrides {
            upstream: Some(sim.url()),
            store: Some(store.clone()),
            ..Overrides::default()
        },
    )
    .expect("load");
    let gw = TestGateway::start(config).await;
    let url = gw.base.clone();

    let client = reqwest::Client::new();
    assert_eq!(chat(&client, &url).await, (200, Some("false".into())));

    // A second process on the same file while the gateway runs: the
    // execution is there (DONE is durable when acknowledged).
    let out = keys_show(
        &[KEY, "--credential", CREDENTIAL, "--store", &store],
        dir.path(),
    )
    .await;
    assert_says(&out, "executed");

    assert_eq!(chat(&client, &url).await, (200, Some("true".into())));
    assert_eq!(sim.executions_for(KEY), 1);
    gw.stop().await.expect("it ended without error");

    // The timeline: one execution, then one replay, in that order.
    let out = keys_show(
        &[KEY, "--credential", CREDENTIAL, "--store", &store],
        dir.path(),
    )
    .await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("key          {KEY}")), "{stdout}");
    assert!(stdout.contains("namespace    /\n"), "{stdout}");
    assert!(
        stdout.contains("state        DONE: 200 response stored"),
        "{stdout}"
    );
    assert!(stdout.contains("TIME (UTC)"), "{stdout}");
    let outcomes: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("20"))
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| ["executed", "replayed", "conflict", "failed"].contains(w))
        })
        .collect();
    assert_eq!(outcomes, vec!["executed", "replayed"], "{stdout}");
    assert!(
        stdout.contains("2 attempts: 1 executed, 1 replayed"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("sk-test-credential"),
        "the credential is never printed"
    );

    // JSON, addressed by the tenant id the gateway logs.
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    let out = keys_show(
        &[
            KEY, "--tenant", &tenant, "--store", &store, "--format", "json",
        ],
        dir.path(),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["state"], "done");
    assert_eq!(v["tenant"], tenant.as_str());
    assert_eq!(v["namespace"], "/");
    assert_eq!(v["record"]["status"], 200);
    let timeline = v["timeline"]
        .as_array()
        .unwrap_or_else(|| panic!("no timeline: {v}"));
    let outcomes: Vec<&str> = timeline
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, vec!["executed", "replayed"]);
    assert_eq!(timeline[0]["status"], 200, "{v}");
    assert!(
        timeline[0]["at_ms"].as_u64() <= timeline[1]["at_ms"].as_u64(),
        "{v}"
    );

    // A bare token is tried as `Bearer <token>` too.
    let out = keys_show(
        &[KEY, "--credential", "sk-test-credential", "--store", &store],
        dir.path(),
    )
    .await;
    assert_says(&out, "`Bearer <credential>`");

    // Another tenant's view of the same key: nothing, exit 1.
    let out = keys_show(
        &[
            KEY,
            "--credential",
            "Bearer sk-someone-else",
            "--store",
            &store,
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("state        absent"));
    assert!(text(&out.stderr).contains("no record and no attempts"));
    let out = keys_show(&[KEY, "--store", &store], dir.path()).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "no credential: the anonymous tenant"
    );

    // Several routes: the namespace must be named.
    std::fs::write(
        dir.path().join("gw.toml"),
        format!(
            "upstream = {:?}\nstore = {store:?}\n[[routes]]\nprefix = \"/\"\n[[routes]]\nprefix = \"/batch\"\n",
            sim.url()
        ),
    )
    .expect("write the file");
    let out = keys_show(
        &[KEY, "--credential", CREDENTIAL, "--config", "gw.toml"],
        dir.path(),
    )
    .await;
    assert_exit_says(&out, 2, "pass --namespace");
    let out = keys_show(
        &[
            KEY,
            "--credential",
            CREDENTIAL,
            "--config",
            "gw.toml",
            "--namespace",
            "/",
        ],
        dir.path(),
    )
    .await;
    assert_says(&out, "replayed");

    // The credential read from standard input finds the same record; on
    // the command line it is refused without being echoed.
    let out = keys_show_raw(
        &[KEY, "--credential-stdin", "--store", &store],
        Some(&format!("{CREDENTIAL}\n")),
        dir.path(),
    )
    .await;
    assert_says(&out, "replayed");
    let out = keys_show_raw(
        &[KEY, "--credential-stdin", "--store", &store],
        None,
        dir.path(),
    )
    .await;
    assert_exit_says(&out, 2, "no credential");
    let out = keys_show_raw(
        &[KEY, "--credential", CREDENTIAL, "--store", &store],
        None,
        dir.path(),
    )
    .await;
    assert_exit_says(&out, 2, "IDEMGATE_CREDENTIAL");
    assert!(!text(&out.stderr).contains("sk-test-credential"));
    assert!(!text(&out.stdout).contains("sk-test-credential"));

    // A mistyped store path is an error, and no file is created there.
    let out = keys_show(&[KEY, "--store", "sqlite:typo.db"], dir.path()).await;
    assert_exit_says(&out, 2, "no store file");
    assert!(!dir.path().join("typo.db").exists());
    // Keys are validated as the gateway validates them.
    let out = keys_show(
        &["bad key with spaces\u{7f}", "--store", &store],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
}
