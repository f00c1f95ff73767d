//! `idemgate keys generate-encryption-key` as a real process: it prints one
//! key-file line that the key ring accepts, and refuses a bad id; the
//! README's "Encryption at rest" commands, run as written, start a gateway
//! that seals what it stores; a second key appended for a rotation is not
//! taken as active.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;
use support::{free_port, post_chat, sim, spawn_quiet, wait_admin};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

fn generate(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["keys", "generate-encryption-key"])
        .args(args)
        .output()
        .expect("run the binary")
}

#[test]
fn prints_a_line_the_key_ring_loads_and_each_run_a_new_key() {
    let out = generate(&["--id", "2026-01"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    assert!(line.starts_with("2026-01:"), "{line}");
    let ring = idemgate_seal::KeyRing::parse(&format!("*{line}")).expect("a valid line");
    assert_eq!(ring.active_key_id(), "2026-01");
    let ring = idemgate_seal::KeyRing::parse(&line).expect("printed as is: one key, active");
    assert_eq!(ring.active_key_id(), "2026-01");

    let other = String::from_utf8(generate(&["--id", "2026-01"]).stdout).expect("utf-8");
    assert_ne!(line, other, "a fresh key each time");

    // Without --id, a time-based id.
    let out = generate(&[]);
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).expect("utf-8");
    idemgate_seal::KeyRing::parse(&format!("*{line}")).expect("a valid line");
}

#[test]
fn a_bad_id_is_refused_with_exit_status_2() {
    let out = generate(&["--id", "no spaces"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(!out.stderr.is_empty());
}

/// The indented commands of the README's "Encryption at rest" section, in
/// order, comments left out.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("read README.md");
    let section = readme
        .split_once("## Encryption at rest\n")
        .map(|(_, rest)| rest)
        .expect("the README has an Encryption at rest section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("    "))
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// `sh -c COMMAND` in `dir`, with the `idemgate` under test first on PATH.
fn shell(dir: &Path, command: &str) -> Command {
    let bin_dir = Path::new(BIN)
        .parent()
        .expect("the binary is in a directory");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", std::env::join_paths(dirs).expect("a PATH"));
    cmd
}

#[tokio::test]
async fn the_readme_commands_start_a_gateway_that_seals_what_it_stores() {
    let commands = readme_commands();
    assert_eq!(
        commands.len(),
        3,
        "generate, chmod, serve: {commands:?} (update this test with the README)"
    );
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let (serve, setup) = commands.split_last().expect("three commands");
    for command in setup {
        let out = shell(dir.path(), command)
            .output()
            .expect("run the command");
        assert!(
            out.status.success(),
            "`{command}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let keys = std::fs::read_to_string(dir.path().join("keys")).expect("the key file");
    assert_eq!(keys.lines().count(), 1, "{} lines", keys.lines().count());
    assert!(!keys.starts_with('*'), "the line as printed, unmarked");

    // The one change: the upstream is the simulated LLM, not the README's.
    assert!(serve.starts_with("idemgate serve "), "{serve}");
    assert!(serve.contains("https://api.openai.com"), "{serve}");
    let serve = serve.replace("https://api.openai.com", &sim.url());
    let (port, admin_port) = (free_port().await, free_port().await);
    let mut child = spawn_quiet(
        tokio::process::Command::from(shell(dir.path(), &format!("exec {serve}")))
            .env("IDEMGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("IDEMGATE_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}")),
        Stdio::null(),
    );
    let client = wait_admin(admin_port, "/readyz", &mut child).await;
    let body = r#"{"model":"sim-1","messages":[{"role":"user","content":"seal me"}]}"#;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let r = post_chat(&client, port, "readme-key-1", body).await;
        assert_eq!(r.status(), 200);
        answers.push(r.text().await.expect("read the answer"));
    }
    assert_eq!(answers[0], answers[1], "the second is the stored answer");
    assert_eq!(sim.executions_for("readme-key-1"), 1);
    let answer: serde_json::Value = serde_json::from_str(&answers[0]).expect("JSON");
    let id = answer["id"]
        .as_str()
        .expect("the answer has an id")
        .to_owned();
    let _ = child.start_kill();
    let _ = child.wait().await;

    // The SQLite store (and its WAL) holds the record, sealed: not the
    // answer's text.
    let mut stored = 0;
    for entry in std::fs::read_dir(dir.path()).expect("list the dir") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("idemgate.db") {
            let bytes = std::fs::read(&path).expect("read the store");
            stored += bytes.len();
            assert!(
                !bytes.windows(id.len()).any(|w| w == id.as_bytes()),
                "{name} holds the answer in the clear"
            );
        }
    }
    assert!(stored > 0, "the default SQLite store was written");
}

#[tokio::test]
async fn a_second_key_appended_unmarked_is_not_taken_as_active() {
    let dir = tempfile::tempdir().expect("create a temp dir");
    for command in [
        "idemgate keys generate-encryption-key --id first > keys",
        "idemgate keys generate-encryption-key --id second >> keys",
    ] {
        let out = shell(dir.path(), command)
            .output()
            .expect("run the command");
        assert!(out.status.success(), "{command}");
    }
    let child = spawn_quiet(
        tokio::process::Command::from(shell(
            dir.path(),
            "exec idemgate serve --upstream http://127.0.0.1:9 --encryption-key-file keys",
        ))
        .env("IDEMGATE_LISTEN", "127.0.0.1:0")
        .env("IDEMGATE_ADMIN_LISTEN", "127.0.0.1:0"),
        Stdio::piped(),
    );
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the gateway refuses to start instead of serving")
        .expect("wait for the gateway");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 keys and none is marked active"),
        "{stderr}"
    );

    // Marked, the first key seals and the second only opens.
    let keys = std::fs::read_to_string(dir.path().join("keys")).expect("the key file");
    let ring = idemgate_seal::KeyRing::parse(&format!("*{keys}")).expect("one marked key");
    assert_eq!(ring.active_key_id(), "first");
    assert_eq!(ring.key_ids().collect::<Vec<_>>(), ["first", "second"]);
}
