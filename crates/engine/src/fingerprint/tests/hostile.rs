//! Structure-aware generators of bodies far beyond what clients send and
//! what the other generators build: nesting to 10,000 levels, 100,000
//! members or items, strings and numbers of up to 1 MiB. Each case is
//! big, so the case count is low; the fuzz targets (`fuzz/`) cover the
//! small shapes.

use proptest::prelude::*;

use super::super::*;
use super::{on_small_stack, reference};

/// What a generated body must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Canonical,
    TooDeep,
    Duplicate,
}

/// A body twice: compact, and with whitespace around every token.
#[derive(Debug, Clone)]
struct Body {
    shape: String,
    compact: Vec<u8>,
    spaced: Vec<u8>,
    expect: Expect,
}

/// `parts` joined by `sep`, compact and spaced.
fn joined(parts: &[String], sep: &str, open: &str, close: &str) -> (String, String) {
    (
        format!("{open}{}{close}", parts.join(sep)),
        format!("{open}\n\t{}\r\n{close}", parts.join(&format!(" {sep}\n "))),
    )
}

fn deep(depth: usize, objects: bool) -> Body {
    let (mut compact, mut spaced) = (String::new(), String::new());
    for level in 0..depth {
        if objects && level % 2 == 1 {
            compact.push_str("{\"k\":");
            spaced.push_str("{ \"k\" :\n");
        } else {
            compact.push('[');
            spaced.push_str("[ ");
        }
    }
    compact.push_str("-0.5e7");
    spaced.push_str("-0.5e7");
    for level in (0..depth).rev() {
        let close = if objects && level % 2 == 1 { '}' } else { ']' };
        compact.push(close);
        spaced.push_str(" \r");
        spaced.push(close);
    }
    Body {
        shape: format!("{depth} levels"),
        compact: compact.into_bytes(),
        spaced: spaced.into_bytes(),
        expect: if depth > MAX_JSON_DEPTH {
            Expect::TooDeep
        } else {
            Expect::Canonical
        },
    }
}

fn wide_object(members: usize, duplicate: bool) -> Body {
    // Keys in descending order: every one moves when sorted.
    let mut parts: Vec<String> = (0..members)
        .rev()
        .map(|i| format!("\"k{i:06}\":{i}"))
        .collect();
    let duplicate = duplicate && members > 1;
    if duplicate {
        parts.push("\"k000000\":\"again\"".to_owned());
    }
    let (compact, spaced) = joined(&parts, ",", "{", "}");
    Body {
        shape: format!("{members} members"),
        compact: compact.into_bytes(),
        spaced: spaced.into_bytes(),
        expect: if duplicate {
            Expect::Duplicate
        } else {
            Expect::Canonical
        },
    }
}

fn wide_array(items: usize) -> Body {
    let parts: Vec<String> = (0..items)
        .map(|i| ["1", "\"s\"", "{}", "[]", "null"][i % 5].to_owned())
        .collect();
    let (compact, spaced) = joined(&parts, ",", "[", "]");
    Body {
        shape: format!("{items} items"),
        compact: compact.into_bytes(),
        spaced: spaced.into_bytes(),
        expect: Expect::Canonical,
    }
}

fn long_string(len: usize, escaped: bool) -> Body {
    let text = if escaped {
        "\\u00e9\\n\\\"\\ud83d\\ude00".repeat(len / 24 + 1)
    } else {
        "a".repeat(len)
    };
    Body {
        shape: format!("a string of {} bytes", text.len()),
        compact: format!("{{\"s\":\"{text}\"}}").into_bytes(),
        spaced: format!(" {{ \"s\" : \"{text}\" }} ").into_bytes(),
        expect: Expect::Canonical,
    }
}

fn long_number(digits: usize) -> Body {
    let n = format!(
        "-{}.{}e+{}",
        "9".repeat(digits),
        "1".repeat(digits),
        "7".repeat(digits)
    );
    Body {
        shape: format!("a number of {} digits", 3 * digits),
        compact: format!("[{n}]").into_bytes(),
        spaced: format!("[ {n} ]").into_bytes(),
        expect: Expect::Canonical,
    }
}

fn hostile_body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (1usize..=10_000, any::<bool>()).prop_map(|(d, o)| deep(d, o)),
        (100usize..=MAX_JSON_DEPTH + 2, any::<bool>()).prop_map(|(d, o)| deep(d, o)),
        (0usize..=100_000, any::<bool>()).prop_map(|(n, d)| wide_object(n, d)),
        (0usize..=100_000).prop_map(wide_array),
        (0usize..=1 << 20, any::<bool>()).prop_map(|(n, e)| long_string(n, e)),
        (1usize..=100_000).prop_map(long_number),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Depth, width and size never change the rules: a body within the
    /// limit is canonicalised (the same with or without whitespace, and
    /// the same again when canonicalised twice), a deeper one is refused
    /// as too deep and a repeated key as ambiguous, all on a 64 KiB stack.
    #[test]
    fn hostile_shapes_are_canonicalised_or_refused_by_the_rules(body in hostile_body()) {
        let shape = body.shape.clone();
        let expect = body.expect;
        let (compact, spaced, again) = on_small_stack(move || {
            let compact = digest_body(None, &body.compact, &["/k".to_owned()]);
            let spaced = digest_body(None, &body.spaced, &["/k".to_owned()]);
            let again = canonical_json(&body.compact)
                .map(|c| canonical_json(&c) == Some(c));
            (compact, spaced, again)
        });
        prop_assert_eq!(&compact, &spaced, "{}", shape);
        match expect {
            Expect::Canonical => {
                prop_assert!(compact.is_ok(), "{}: {:?}", shape, compact);
                prop_assert_eq!(again, Some(true), "{}", shape);
            }
            Expect::TooDeep => prop_assert_eq!(
                compact,
                Err(BodyError::TooDeep { limit: MAX_JSON_DEPTH }),
                "{}", shape
            ),
            Expect::Duplicate => prop_assert!(
                matches!(compact, Err(BodyError::DuplicateKey { .. })),
                "{}: {:?}", shape, compact
            ),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Up to the depth the earlier canonicaliser could take, wide and
    /// long bodies give its canonical form byte for byte.
    #[test]
    fn hostile_shapes_within_the_limit_match_the_earlier_form(
        body in prop_oneof![
            (1usize..=MAX_JSON_DEPTH, any::<bool>()).prop_map(|(d, o)| deep(d, o)),
            (0usize..=20_000, Just(false)).prop_map(|(n, d)| wide_object(n, d)),
            (0usize..=1 << 18, any::<bool>()).prop_map(|(n, e)| long_string(n, e)),
        ]
    ) {
        prop_assert_eq!(
            canonical_json(&body.spaced),
            reference::canonical(&body.spaced, &[]),
            "{}", body.shape
        );
    }
}
