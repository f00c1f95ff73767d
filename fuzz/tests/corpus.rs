//! Replays every committed input of every target through the library:
//! the seed corpus (`corpus/<target>/`) and the inputs that once broke a
//! parser (`regressions/<target>/`). No fuzzer is needed; this runs in
//! `cargo test` and in CI.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `target` on every file under `dir/<name>`, on a thread with the
/// stack of a runtime worker (2 MiB: recursion per nesting level of the
/// corpus's 10,000-level inputs would overflow it); returns how many
/// files ran.
fn replay(dir: &str, name: &str, target: idemgate_fuzz::Target) -> usize {
    let files = inputs(&root().join(dir).join(name));
    let count = files.len();
    for file in files {
        let data = std::fs::read(&file).expect("a readable corpus file");
        let shown = file.display().to_string();
        std::thread::Builder::new()
            .name(shown.clone())
            .stack_size(2 * 1024 * 1024)
            .spawn(move || target(&data))
            .expect("a thread")
            .join()
            .unwrap_or_else(|_| panic!("{shown} broke the target"));
    }
    count
}

#[test]
fn every_target_has_a_corpus_and_every_file_passes() {
    for (name, target) in idemgate_fuzz::TARGETS {
        let seeds = replay("corpus", name, *target);
        assert!(seeds >= 3, "corpus/{name} has {seeds} files");
        replay("regressions", name, *target);
    }
}

#[test]
fn every_corpus_and_regression_directory_names_a_target() {
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("an entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                idemgate_fuzz::target(&name).is_some(),
                "{dir}/{name} is not a target"
            );
        }
    }
}

#[test]
fn every_target_has_a_harness() {
    for (name, _) in idemgate_fuzz::TARGETS {
        let bin = root().join("src/bin").join(format!("{name}.rs"));
        assert!(bin.is_file(), "{} is missing", bin.display());
    }
}
