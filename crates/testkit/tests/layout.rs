//! Every crate's `lib.rs` opens with a "Layout" section naming each of its
//! modules: the map a newcomer reads first. This test keeps the map true:
//! a module declared in `lib.rs` but missing from its Layout fails here,
//! and so does a cycle between the modules of a crate.
#![allow(clippy::unwrap_used, clippy::panic)] // a test: failing loudly is its job

use std::collections::{BTreeMap, BTreeSet};
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

/// The top-level modules of the crate at `src` that each one names
/// (`crate::m`), read from every non-test file below it.
fn module_graph(src: &Path, modules: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let top = rel
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .map(|c| c.trim_end_matches(".rs").to_owned())
                .unwrap_or_default();
            let is_test =
                rel.ends_with("tests.rs") || rel.components().any(|c| c.as_os_str() == "tests");
            if !modules.contains(&top) || is_test || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Code before an inline test module, comments left out.
            let code = text
                .split("#[cfg(test)]\nmod tests {")
                .next()
                .unwrap_or_default();
            let names = graph.entry(top.clone()).or_default();
            for line in code
                .lines()
                .map(str::trim_start)
                .filter(|l| !l.starts_with("//"))
            {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name != top && modules.contains(&name) {
                        names.insert(name);
                    }
                }
            }
        }
    }
    graph
}

/// A cycle in `graph`, if there is one (as the modules along it).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The modules of a crate depend on each other one way: when two need
/// one type, it moves to a leaf module both use.
#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        let Ok(lib) = std::fs::read_to_string(src.join("lib.rs")) else {
            continue;
        };
        let modules = declared(&lib);
        if let Some(found) = cycle(&module_graph(&src, &modules)) {
            cycles.push(format!("{}: {}", src.display(), found.join(" → ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_check_finds_a_cycle_and_passes_a_tree() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry((*a).to_owned())
                .or_default()
                .insert((*b).to_owned());
            g.entry((*b).to_owned()).or_default();
        }
        g
    };
    let found = cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
    assert!(cycle(&edges(&[("a", "b"), ("a", "c"), ("b", "c")])).is_none());
}
