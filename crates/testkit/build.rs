//! Generates the test-suite macros from their case files, so a case written
//! there runs on every store without being listed anywhere else:
//!
//! - `conformance_suite!` from every `pub async fn NAME(store: Arc<dyn Store>)`
//!   (however rustfmt breaks its lines)
//!   in `src/cases/`;
//! - `fault_suite!` from every `pub async fn NAME(rig: Rig)` in
//!   `src/fault/scenarios.rs`.

use std::{env, fs, path::PathBuf};

/// The names of the functions in `path` (a file, or every `.rs` file of a
/// directory) whose signature ends `signature`.
fn cases(path: &str, signature: &str) -> Vec<String> {
    println!("cargo::rerun-if-changed={path}");
    println!("cargo::rerun-if-changed=build/case_names.rs");
    let files: Vec<String> = if fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        let mut files: Vec<String> = fs::read_dir(path)
            .unwrap_or_else(|e| panic!("read {path}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path().display().to_string()))
            .filter(|p| p.ends_with(".rs"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut source = String::new();
    for file in &files {
        println!("cargo::rerun-if-changed={file}");
        source.push_str(&fs::read_to_string(file).unwrap_or_else(|e| panic!("read {file}: {e}")));
        source.push('\n');
    }
    let file = path;
    let names = case_names(&source, signature);
    assert!(!names.is_empty(), "no cases found in {file}");
    names
}

include!("build/case_names.rs");

/// A `#[macro_export]` macro `name!($suite, $make)` generating `mod $suite`
/// with one `#[tokio::test]` per case, each calling `path::case(super::$make().await)`.
fn suite_macro(name: &str, doc: &str, path: &str, workers: usize, cases: &[String]) -> String {
    let list = cases.join(", ");
    format!(
        r#"{doc}
#[macro_export]
macro_rules! {name} {{
    ($name:ident, $make:ident) => {{
        mod $name {{
            $crate::{name}!(@cases $make; {list});
        }}
    }};
    (@cases $make:ident; $($case:ident),* $(,)?) => {{
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = {workers})]
            async fn $case() {{
                $crate::{path}::$case(super::$make().await).await;
            }}
        )*
    }};
}}
"#
    )
}

fn write(file: &str, text: String) {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    fs::write(out.join(file), text).unwrap_or_else(|e| panic!("write {file}: {e}"));
}

fn main() {
    let conformance = cases("src/cases", "(store: Arc<dyn Store>)");
    let names: Vec<String> = conformance.iter().map(|c| format!("{c:?}")).collect();
    let mut suite = format!(
        "/// The name of every conformance case, in the order of the files in `cases/`.\n\
         pub const CASES: &[&str] = &[{}];\n\n",
        names.join(", ")
    );
    suite.push_str(&suite_macro(
        "conformance_suite",
        "/// Generates `mod $name` with one `#[tokio::test]` per conformance case,\n\
         /// each calling `super::$make().await` for an `Arc<dyn Store>`.",
        "cases",
        4,
        &conformance,
    ));
    write("suite.rs", suite);

    let scenarios = cases("src/fault/scenarios.rs", "(rig: Rig)");
    write(
        "fault_suite.rs",
        suite_macro(
            "fault_suite",
            "/// Generates `mod $name` with one `#[tokio::test]` per fault scenario in\n\
             /// [`fault::scenarios`](crate::fault::scenarios), each calling\n\
             /// `super::$make().await` for a fresh [`Rig`](crate::fault::scenarios::Rig).",
            "fault::scenarios",
            2,
            &scenarios,
        ),
    );
}
