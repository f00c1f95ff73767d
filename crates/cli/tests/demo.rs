//! `idemgate demo` as a newcomer runs it: one command, no setup. The
//! assertions read the printed table, so they hold the demo to what it
//! tells people.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// The two figures of a table row (without, with idemgate). Rows are the
/// lines indented by two spaces; paragraphs are not indented.
fn row(out: &str, label: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.strip_prefix("  ").is_some_and(|l| l.starts_with(label)))
        .unwrap_or_else(|| panic!("no row `{label}` in:\n{out}"));
    let figures: Vec<u64> = line[line.find(label).map_or(0, |i| i + label.len())..]
        .split_whitespace()
        .map(|f| {
            f.replace(',', "")
                .parse()
                .unwrap_or_else(|e| panic!("`{f}` in `{line}`: {e}"))
        })
        .collect();
    assert_eq!(figures.len(), 2, "{line}");
    (figures[0], figures[1])
}

#[test]
fn the_demo_shows_duplicates_without_idemgate_and_none_with_it() {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let out = Command::new(BIN)
        .args(["demo", "--quick", "--seed", "7", "--operations", "10"])
        .current_dir(dir.path())
        .output()
        .expect("run the binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (ops_direct, ops) = row(&stdout, "operations ");
    assert_eq!((ops_direct, ops), (10, 10));

    // With idemgate: each operation ran the model once and charged once,
    // whatever the timing was.
    let (exec_direct, exec) = row(&stdout, "LLM executions");
    let (charges_direct, charges) = row(&stdout, "charges made");
    let (dup_direct, dup) = row(&stdout, "duplicate charges");
    assert_eq!(exec, ops, "{stdout}");
    assert_eq!(charges, ops, "{stdout}");
    assert_eq!(dup, 0, "{stdout}");
    let (_, answered) = row(&stdout, "operations answered");
    assert_eq!(
        answered, ops,
        "every operation is answered in the end: {stdout}"
    );

    // Without: the timeouts turned into executions and charges.
    assert!(exec_direct > ops_direct, "{stdout}");
    assert_eq!(
        charges_direct, exec_direct,
        "every execution charged: {stdout}"
    );
    assert_eq!(dup_direct, charges_direct - ops_direct, "{stdout}");
    let (timeouts_direct, _) = row(&stdout, "client timeouts");
    assert!(timeouts_direct > 0, "{stdout}");

    // The savings line is the difference of the table's figures.
    let (tokens_direct, tokens) = row(&stdout, "billed tokens");
    assert!(tokens < tokens_direct, "{stdout}");
    let saved = format!(
        "Saved by idemgate: {} billed tokens",
        group(tokens_direct - tokens)
    );
    assert!(stdout.contains(&saved), "`{saved}` in {stdout}");
    assert!(stdout.contains("idemgate serve --upstream"), "{stdout}");
    assert!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or_default()
            == 0,
        "the demo leaves nothing in the working directory"
    );
}

#[test]
fn no_operations_is_a_usage_error() {
    let out = Command::new(BIN)
        .args(["demo", "--operations", "0"])
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least one operation"));
}

fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
