//! `idemgate serve` as a real process.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

mod support;
use support::{free_port, post_chat, sigterm, sim, spawn_quiet, temp_file, wait_admin};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

#[tokio::test]
async fn serve_with_only_upstream_answers_and_exits_cleanly_on_sigterm() {
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let (port, admin_port) = (free_port().await, free_port().await);
    // Only --upstream on the command line; the listen addresses come from
    // the environment so the test does not need the default ports, and the
    // default SQLite store lands in the temporary directory.
    let mut child = spawn_quiet(
        Command::new(BIN)
            .args(["serve", "--upstream", &sim.url()])
            .env("IDEMGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("IDEMGATE_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
            .current_dir(dir.path()),
        Stdio::piped(),
    );
    let client = wait_admin(admin_port, "/readyz", &mut child).await;
    let health = client
        .get(format!("http://127.0.0.1:{admin_port}/healthz"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(health.status(), 200);

    let body = r#"{"model":"sim-1","messages":[{"role":"user","content":"hello there"}]}"#;
    let mut bodies = Vec::new();
    for attempt in 0..2 {
        let r = post_chat(&client, port, "cli-key-1", body).await;
        assert_eq!(r.status(), 200);
        let replayed = idemgate_testkit::http::replayed(&r);
        assert_eq!(
            replayed.as_deref(),
            Some(if attempt == 0 { "false" } else { "true" })
        );
        bodies.push(r.bytes().await.expect("read the response body"));
    }
    assert_eq!(bodies[0], bodies[1], "the replay is the stored answer");
    assert_eq!(sim.executions_for("cli-key-1"), 1);
    assert!(
        dir.path().join("idemgate.db").exists(),
        "default store is an SQLite file in the working directory"
    );

    sigterm(&child).await;
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("gateway did not exit after SIGTERM"))
        .expect("wait for the process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("SIGTERM received"), "{stderr}");
    assert!(stderr.contains("gateway stopped"), "{stderr}");
}

/// Runs `idemgate` with `args` in `dir`, checks that it fails, and returns
/// what it said on stderr.
async fn refused(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .expect("run the binary");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

#[tokio::test]
async fn a_bad_config_file_exits_non_zero_with_a_message() {
    let (dir, _) = temp_file(
        "bad.toml",
        "upstream = \"http://127.0.0.1:1\"\n[[routes]]\nprefix = \"/\"\non_inflight = \"queue\"\n",
    );
    let stderr = refused(dir.path(), &["serve", "--config", "bad.toml"]).await;
    assert!(stderr.contains("routes[0].on_inflight"), "{stderr}");

    let upstream = ["serve", "--upstream", "http://127.0.0.1:1"];
    let stderr = refused(
        dir.path(),
        &[&upstream[..], &["--store", "mysql://h/db"]].concat(),
    )
    .await;
    assert!(stderr.contains("store"), "{stderr}");

    let stderr = refused(dir.path(), &[&upstream[..], &["--workers", "0"]].concat()).await;
    assert!(
        stderr.contains("field `workers`: must be at least 1"),
        "{stderr}"
    );

    let stderr = refused(dir.path(), &["serve", "--config", "missing.toml"]).await;
    assert!(stderr.contains("missing.toml"), "{stderr}");
}

/// `--workers N` sizes the runtime: the gateway answers with one worker,
/// and three workers make exactly two more runtime threads than one (the
/// blocking pool, named alike, is the same in both).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn workers_size_the_runtime() {
    let sim = sim().await;
    let mut threads = Vec::new();
    for workers in ["1", "3"] {
        let (port, admin_port) = (free_port().await, free_port().await);
        let mut child = spawn_quiet(
            Command::new(BIN)
                .args(["serve", "--upstream", &sim.url(), "--store", "memory:"])
                .args(["--workers", workers])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")]),
            Stdio::null(),
        );
        let client = wait_admin(admin_port, "/readyz", &mut child).await;
        let r = post_chat(
            &client,
            port,
            &format!("workers-{workers}"),
            r#"{"model":"sim-1","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
        assert_eq!(r.status(), 200, "with {workers} workers");
        let pid = child.id().expect("a running child has a pid");
        threads.push(runtime_threads(pid));
        child.kill().await.expect("stop the gateway");
    }
    assert_eq!(threads[1], threads[0] + 2, "runtime threads: {threads:?}");
}

/// Threads of `pid` that its runtime started (named `idemgate-worker`).
#[cfg(target_os = "linux")]
fn runtime_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("list the threads")
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.trim_end() == "idemgate-worker")
        })
        .count()
}

#[tokio::test]
async fn an_unreachable_store_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let (port, admin_port) = (free_port().await, free_port().await);
    // Nothing listens on a port that was just free: every networked store
    // fails to open, and says which store and where.
    let dead = free_port().await;
    for (store, backend) in [
        (format!("redis://127.0.0.1:{dead}"), "redis"),
        (format!("redis+cluster://127.0.0.1:{dead}"), "redis-cluster"),
        (
            format!("postgres://postgres@127.0.0.1:{dead}/test"),
            "postgres",
        ),
    ] {
        let out = Command::new(BIN)
            .args([
                "serve",
                "--upstream",
                "http://127.0.0.1:1",
                "--store",
                &store,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin_port}"),
            ])
            .current_dir(dir.path())
            .output()
            .await
            .expect("run the binary");
        assert!(!out.status.success(), "{store} opened");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot open the {backend} store")),
            "{stderr}"
        );
        assert!(!stderr.contains("not built"), "{stderr}");
    }
}

#[tokio::test]
async fn serve_refuses_a_key_template_that_merges_different_users() {
    let (dir, file) = temp_file(
        "merge.toml",
        "upstream = \"http://127.0.0.1:1\"\nstore = \"memory:\"\n[[routes]]\nprefix = \"/v1\"\nkey = \"derive\"\nkey_template = [\"body\"]\nkey_window = \"10m\"\n",
    );
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&file)
        .current_dir(dir.path())
        .output()
        .await
        .expect("run the binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert!(stderr.contains("route /v1"), "{stderr}");
    assert!(stderr.contains("idemgate check"), "{stderr}");

    // The same file with a user dimension starts (and is stopped at once).
    let (port, admin_port) = (free_port().await, free_port().await);
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:1\"\nstore = \"memory:\"\n[[routes]]\nprefix = \"/v1\"\nkey = \"derive\"\nkey_template = [\"header:x-user-id\", \"body\"]\nkey_window = \"10m\"\n",
    )
    .expect("write the file");
    let mut child = spawn_quiet(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&file)
            .env("IDEMGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("IDEMGATE_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
            .current_dir(dir.path()),
        Stdio::null(),
    );
    wait_admin(admin_port, "/readyz", &mut child).await;
}
