//! `idemgate keys generate-encryption-key` as a real process: it prints one
//! key-file line that the key ring accepts, and refuses a bad id.

use std::process::Command;

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
