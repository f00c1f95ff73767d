//! Every crate's `lib.rs` opens with a "Layout" section naming each of its
//! modules: the map a newcomer reads first. This test keeps the map true:
//! a module declared in `lib.rs` but missing from its Layout fails here.
#![allow(clippy::unwrap_used, clippy::panic)] // a test: failing loudly is its job

use std::path::Path;

/// The modules `lib.rs` declares (`mod x;`, `pub mod x;`, …), test-only
/// ones left out.
fn declared(lib: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        let rest = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "));
        if let Some(name) = rest.and_then(|r| r.strip_suffix(';'))
            && !test_only
        {
            out.push(name.trim().to_owned());
        }
        if !line.starts_with("#[") {
            test_only = false;
        }
    }
    out
}

/// The text of the crate doc's `# Layout` section.
fn layout(lib: &str) -> Option<String> {
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .collect();
    let start = doc.iter().position(|l| *l == "# Layout")?;
    let section = doc[start + 1..]
        .iter()
        .take_while(|l| !l.starts_with("# "))
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    Some(section)
}

#[test]
fn every_module_is_on_its_crates_layout() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut missing = Vec::new();
    let mut crates = 0;
    for dir in ["crates", "bench"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let lib_rs = entry.unwrap().path().join("src/lib.rs");
            let Ok(lib) = std::fs::read_to_string(&lib_rs) else {
                continue;
            };
            crates += 1;
            let modules = declared(&lib);
            if modules.is_empty() {
                continue;
            }
            let Some(section) = layout(&lib) else {
                missing.push(format!("{}: no `# Layout` section", lib_rs.display()));
                continue;
            };
            for m in modules {
                if !section.contains(&format!("`{m}`")) {
                    missing.push(format!("{}: module `{m}`", lib_rs.display()));
                }
            }
        }
    }
    assert!(
        crates >= 10,
        "found only {crates} crates under {}",
        root.display()
    );
    assert!(
        missing.is_empty(),
        "missing from Layout:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_check_sees_declarations_and_sections() {
    let lib = "//! Doc.\n//!\n//! # Layout\n//! - [`a`]: one.\n//!\n//! # Other\n//! `b`\n\
               pub mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n";
    assert_eq!(declared(lib), vec!["a", "b"]);
    let section = layout(lib).unwrap();
    assert!(section.contains("`a`") && !section.contains("`b`"));
}
