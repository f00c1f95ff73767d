//! The build script finds the conformance cases by their parameters: a
//! case whose signature rustfmt wrapped over several lines must still be
//! found, or it would silently drop out of every store's run.
#![allow(clippy::unwrap_used)]

include!("../build/case_names.rs");

#[test]
fn wrapped_signatures_are_cases_and_helpers_are_not() {
    let source = "
pub async fn one_line(store: Arc<dyn Store>) {}
pub async fn wrapped(
    store: Arc<dyn Store>,
) {}
pub async fn wrapped_without_comma(
    store: Arc<dyn Store>
) {}
pub async fn helper<F>(store: Arc<dyn Store>, f: F) {}
pub async fn other(store: Arc<dyn Store>, n: usize) {}
async fn private(store: Arc<dyn Store>) {}
pub fn not_async(store: Arc<dyn Store>) {}
//! one `pub async fn NAME(store: Arc<dyn Store>)` per case
";
    assert_eq!(
        case_names(source, "(store: Arc<dyn Store>)"),
        vec!["one_line", "wrapped", "wrapped_without_comma"]
    );
}
