//! Secrets never reach the output of the `idemgate` binary: a password in
//! the store URL, the admin token and the encryption key are not in what
//! `serve` writes when its store cannot be opened, nor in its logs (at
//! debug level) while it serves, nor in its admin answers, nor in what
//! `keys show` and `check` print.
//!
//! The running case uses the shared PostgreSQL (trust authentication
//! accepts any password); a missing server fails it.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use idemgate_testkit::postgres_server;
use tokio::process::Command;

mod support;
use support::{free_port, post_chat, sigterm, sim};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

const PW: &str = "s3cr3t-pw";
const ADMIN_TOKEN: &str = "adm1n-t0ken-s3cr3t";

/// A loopback port nothing listens on.
fn assert_hidden(what: &str, output: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!output.contains(s), "{what} shows a secret ({s}): {output}");
    }
}

/// Runs the binary in `dir`; returns its exit code and stdout + stderr.
async fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("IDEMGATE_LOG")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run the binary");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test]
async fn stores_that_cannot_be_opened_never_show_the_password() {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let dead = free_port().await;
    let urls = [
        (format!("redis://:{PW}@127.0.0.1:{dead}/"), "redis"),
        (format!("rediss://user:{PW}@127.0.0.1:{dead}/"), "redis"),
        (
            format!("redis+cluster://:{PW}@127.0.0.1:{dead}/?prefix=p"),
            "redis-cluster",
        ),
        (
            format!("postgres://u:{PW}@127.0.0.1:{dead}/test"),
            "postgres",
        ),
        (
            format!("postgres://u@127.0.0.1:{dead}/test?schema=s&password={PW}"),
            "postgres",
        ),
        (
            format!(
                "postgres://u:{PW}@127.0.0.1:{dead}/test?sslmode=verify-full&sslrootcert=/nonexistent.pem"
            ),
            "postgres",
        ),
    ];
    // Each URL in its own task: a closed PostgreSQL port takes the pool's
    // whole acquire timeout to give up.
    let mut tasks = Vec::new();
    for (url, backend) in urls {
        let dir = dir.path().to_path_buf();
        tasks.push(tokio::spawn(async move {
            let (code, out) = run(
                &dir,
                &[
                    "serve",
                    "--upstream",
                    "http://127.0.0.1:1",
                    "--store",
                    &url,
                    "--listen",
                    "127.0.0.1:0",
                    "--admin-listen",
                    "127.0.0.1:0",
                ],
                &[],
            )
            .await;
            assert_ne!(code, Some(0), "{url} opened: {out}");
            assert!(
                out.contains(&format!("cannot open the {backend} store")),
                "{out}"
            );
            assert_hidden("serve", &out, &[PW]);

            let (code, out) = run(
                &dir,
                &["keys", "show", "k-1", "--tenant", "t", "--store", &url],
                &[],
            )
            .await;
            assert_eq!(code, Some(2), "a store error: {out}");
            assert_hidden("keys show", &out, &[PW]);

            for format in ["text", "json"] {
                let (_, out) = run(
                    &dir,
                    &[
                        "check",
                        "--store",
                        &url,
                        "--upstream",
                        "http://127.0.0.1:1",
                        "--format",
                        format,
                    ],
                    &[],
                )
                .await;
                assert!(out.contains(backend), "{out}");
                assert_hidden("check", &out, &[PW]);
            }
        }));
    }
    for task in tasks {
        task.await.expect("every URL's checks pass");
    }
    // A store URL that does not parse is named without its password.
    let (code, out) = run(
        dir.path(),
        &["check", "--store", &format!("postgres ://u:{PW}@h/db")],
        &[],
    )
    .await;
    assert_eq!(code, Some(2), "{out}");
    assert_hidden("check", &out, &[PW]);
}

/// `GET path` on the admin listener at `admin_port`, with `token` as the
/// bearer token when given; asserts the answer's status is `status` and
/// returns its text.
async fn admin_get(
    client: &reqwest::Client,
    admin_port: u16,
    path: &str,
    token: Option<&str>,
    status: u16,
) -> String {
    let mut req = client.get(format!("http://127.0.0.1:{admin_port}{path}"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let r = req.send().await.expect("send the request");
    assert_eq!(r.status(), status, "{path}");
    r.text().await.expect("read the answer")
}

#[tokio::test]
async fn a_running_gateway_never_logs_its_secrets() {
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let key_line = idemgate_seal::generate_key_line("k1").expect("a key line");
    let key_text = key_line
        .split_once(':')
        .map(|(_, k)| k.trim().to_owned())
        .expect("ID:BASE64");
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("*{key_line}\n")).expect("write the key file");
    let schema = format!("igsec{:08x}", rand::random::<u32>());
    let store = format!(
        "{}?schema={schema}",
        postgres_server::shared_url().replacen("postgres@", &format!("postgres:{PW}@"), 1)
    );
    let (port, admin_port) = (free_port().await, free_port().await);
    let log = dir.path().join("log");
    let toml = dir.path().join("gw.toml");
    std::fs::write(
        &toml,
        format!(
            "upstream = {up:?}\nstore = {store:?}\nadmin_token = {ADMIN_TOKEN:?}\n\
             encryption_key_file = \"keys\"\nlisten = \"127.0.0.1:{port}\"\n\
             admin_listen = \"127.0.0.1:{admin_port}\"\n",
            up = sim.url()
        ),
    )
    .expect("write the config");
    let mut child = Command::new(BIN)
        .args(["serve", "--config", "gw.toml"])
        .env("IDEMGATE_LOG", "debug")
        .current_dir(dir.path())
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log file")))
        .stderr(Stdio::from(
            std::fs::File::options()
                .append(true)
                .open(&log)
                .expect("log file"),
        ))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the gateway");
    let client = reqwest::Client::new();
    let mut ready = false;
    for _ in 0..300 {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the gateway exited ({status}); is PostgreSQL running? {log}");
        }
        if client
            .get(format!("http://127.0.0.1:{admin_port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the gateway never became ready");
    let body = r#"{"model":"sim-1","messages":[{"role":"user","content":"hello"}]}"#;
    for _ in 0..2 {
        let r = post_chat(&client, port, "secrets-key-1", body).await;
        assert_eq!(r.status(), 200);
    }
    let stats = admin_get(&client, admin_port, "/admin/stats", Some(ADMIN_TOKEN), 200).await;
    admin_get(
        &client,
        admin_port,
        "/admin/stats",
        Some("not-the-token"),
        401,
    )
    .await;
    // The dashboard page, opened once with the token in its query.
    let page = format!("/?token={ADMIN_TOKEN}");
    let page = admin_get(&client, admin_port, &page, None, 200).await;
    let metrics = admin_get(&client, admin_port, "/metrics", None, 200).await;

    sigterm(&child).await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the gateway exits after SIGTERM")
        .expect("wait for the gateway");
    let logged = std::fs::read_to_string(&log).expect("read the log");
    assert!(status.success(), "exit {status:?}: {logged}");
    assert!(logged.contains("gateway started"), "{logged}");
    let secrets = [PW, ADMIN_TOKEN, key_text.as_str()];
    assert_hidden("the log", &logged, &secrets);
    assert_hidden("/admin/stats", &stats, &secrets);
    assert_hidden("the dashboard page", &page, &secrets);
    assert_hidden("/metrics", &metrics, &secrets);

    let (_, checked) = run(dir.path(), &["check", "--config", "gw.toml"], &[]).await;
    assert!(checked.contains("store postgres"), "{checked}");
    assert_hidden("check", &checked, &secrets);
    let (_, checked) = run(
        dir.path(),
        &["check", "--config", "gw.toml", "--format", "json"],
        &[],
    )
    .await;
    assert_hidden("check --format json", &checked, &secrets);
    let _ = Command::new("psql")
        .args([&postgres_server::shared_url(), "-q", "-c"])
        .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .output()
        .await;
}
