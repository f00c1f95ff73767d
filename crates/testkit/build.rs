//! Generates `conformance_suite!` from the cases in `src/cases.rs`: every
//! `pub async fn NAME(store: Arc<dyn Store>)` there becomes one test in every
//! store's suite, so a case cannot be written and then left out of the list.

use std::fmt::Write as _;
use std::{env, fs, path::PathBuf};

const SIGNATURE: &str = "(store: Arc<dyn Store>)";

fn main() {
    println!("cargo::rerun-if-changed=src/cases.rs");
    let source = fs::read_to_string("src/cases.rs").expect("read src/cases.rs");
    let cases: Vec<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| rest.split_once(SIGNATURE).map(|(name, _)| name))
        .collect();
    assert!(
        !cases.is_empty(),
        "no conformance cases found in src/cases.rs"
    );
    let list = cases.join(", ");
    let mut out = String::new();
    let names: Vec<String> = cases.iter().map(|c| format!("{c:?}")).collect();
    writeln!(
        out,
        "/// The name of every conformance case, in the order of `cases.rs`.\n\
         pub const CASES: &[&str] = &[{}];\n",
        names.join(", ")
    )
    .expect("write to a String");
    writeln!(
        out,
        r#"/// Generates `mod $name` with one `#[tokio::test]` per conformance case,
/// each calling `super::$make().await` for an `Arc<dyn Store>`.
#[macro_export]
macro_rules! conformance_suite {{
    ($name:ident, $make:ident) => {{
        mod $name {{
            $crate::conformance_suite!(@cases $make; {list});
        }}
    }};
    (@cases $make:ident; $($case:ident),* $(,)?) => {{
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {{
                $crate::$case(super::$make().await).await;
            }}
        )*
    }};
}}"#
    )
    .expect("write to a String");
    let dest =
        PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo")).join("suite.rs");
    fs::write(dest, out).expect("write the generated suite");
}
