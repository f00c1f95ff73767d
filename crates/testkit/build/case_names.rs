// Shared by the build script and `tests/case_names.rs`.

/// Every `pub async fn NAME(…)` of `source` whose parameter list is
/// `signature`, however the lines are broken: rustfmt wraps a long
/// signature, and a wrapped case must not drop out of every store's run.
/// Whitespace and a trailing comma are ignored; a generic function is a
/// helper, never a case.
fn case_names(source: &str, signature: &str) -> Vec<String> {
    let squash = |s: &str| {
        let mut t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        if t.ends_with(",)") {
            t.remove(t.len() - 2);
        }
        t
    };
    let wanted = squash(signature);
    let mut names = Vec::new();
    // Only where a line starts with the declaration (comments and strings
    // that mention one are not cases).
    let mut offset = 0;
    let starts: Vec<usize> = source
        .split_inclusive('\n')
        .filter_map(|line| {
            let at = offset + (line.len() - line.trim_start().len());
            offset += line.len();
            line.trim_start().starts_with("pub async fn ").then_some(at)
        })
        .collect();
    for at in starts {
        let rest = &source[at + "pub async fn ".len()..];
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (name, after) = rest.split_at(name_len);
        if !after.starts_with('(') {
            continue;
        }
        let Some(close) = after.find(')') else {
            continue;
        };
        if squash(&after[..=close]) == wanted {
            names.push(name.to_owned());
        }
    }
    names
}
