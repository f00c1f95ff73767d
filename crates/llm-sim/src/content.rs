//! Deterministic "model output" and token counting.
//!
//! The text is a function of the conversation only (roles and message
//! text, not JSON key order, `stream`, or the model name), so two
//! executions of the same request produce the same words: only ids and
//! timestamps tell them apart.

use serde_json::Value;

/// Words the simulated model speaks; one word is one token.
const WORDS: &[&str] = &[
    "the",
    "request",
    "ran",
    "once",
    "and",
    "only",
    "once",
    "because",
    "a",
    "key",
    "was",
    "held",
    "while",
    "tokens",
    "flowed",
    "upstream",
    "retries",
    "arrive",
    "late",
    "timeouts",
    "say",
    "nothing",
    "about",
    "work",
    "done",
    "replay",
    "stored",
    "answers",
    "instead",
    "of",
    "paying",
    "twice",
    "lease",
    "fence",
    "stream",
    "event",
    "gateway",
    "model",
    "prompt",
    "completion",
    "idempotent",
    "record",
    "pending",
    "settled",
    "budget",
    "latency",
    "client",
    "server",
    "reset",
    "stall",
    "wait",
    "attach",
    "cached",
    "billed",
    "usage",
    "chunk",
    "delta",
    "signal",
    "quiet",
    "steady",
    "careful",
    "exactly",
    "safe",
    "again",
];

/// The text parts of one message's `content`: a string, or an array of
/// blocks whose `text` fields are taken (other blocks are ignored).
pub(crate) fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// The conversation reduced to what determines the output: (role, text)
/// pairs in order.
#[derive(Debug, Default)]
pub(crate) struct Conversation {
    turns: Vec<(String, String)>,
}

impl Conversation {
    pub(crate) fn push(&mut self, role: &str, text: String) {
        self.turns.push((role.to_owned(), text));
    }

    /// Whitespace-separated words of all text, at least 1.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        let words: usize = self
            .turns
            .iter()
            .map(|(_, text)| text.split_whitespace().count())
            .sum();
        u64::try_from(words).unwrap_or(u64::MAX).max(1)
    }

    /// FNV-1a over the turns, with separators so that ("ab","c") and
    /// ("a","bc") differ. Stable across platforms and Rust versions.
    fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for (role, text) in &self.turns {
            eat(role.as_bytes());
            eat(&[0x1f]);
            eat(text.as_bytes());
            eat(&[0x1e]);
        }
        h
    }

    /// `n` tokens of output. Token 0 is a bare word, later tokens carry a
    /// leading space, so concatenating the tokens gives the full text.
    pub(crate) fn tokens(&self, n: u32) -> Vec<String> {
        let mut state = self.hash();
        (0..n)
            .map(|i| {
                let word = WORDS[(splitmix64(&mut state) % WORDS.len() as u64) as usize];
                if i == 0 {
                    word.to_owned()
                } else {
                    format!(" {word}")
                }
            })
            .collect()
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conv(turns: &[(&str, &str)]) -> Conversation {
        let mut c = Conversation::default();
        for (r, t) in turns {
            c.push(r, (*t).to_owned());
        }
        c
    }

    #[test]
    fn same_conversation_same_words() {
        let a = conv(&[("user", "hello there")]).tokens(10);
        let b = conv(&[("user", "hello there")]).tokens(10);
        let c = conv(&[("user", "hello  there!")]).tokens(10);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 10);
        assert!(!a[0].starts_with(' '));
        assert!(a[1..].iter().all(|t| t.starts_with(' ')));
    }

    #[test]
    fn separators_matter() {
        assert_ne!(
            conv(&[("user", "ab"), ("user", "c")]).tokens(8),
            conv(&[("user", "a"), ("user", "bc")]).tokens(8)
        );
    }

    #[test]
    fn prompt_tokens_count_words_min_one() {
        assert_eq!(conv(&[]).prompt_tokens(), 1);
        assert_eq!(conv(&[("user", "  ")]).prompt_tokens(), 1);
        assert_eq!(
            conv(&[("system", "be brief"), ("user", "one two three")]).prompt_tokens(),
            5
        );
    }

    #[test]
    fn content_blocks() {
        assert_eq!(text_of(&json!("x y")), "x y");
        assert_eq!(
            text_of(
                &json!([{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}])
            ),
            "a b"
        );
        assert_eq!(text_of(&json!(null)), "");
    }
}
