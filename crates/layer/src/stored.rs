//! The stored form of a response: what a replay sends back.
//!
//! A versioned binary encoding rather than JSON: bodies and SSE events are
//! arbitrary bytes (JSON would base64 them, a third larger), and decoding
//! must be cheap and total — a stored payload that does not decode is
//! answered with a clean 500, never a panic. The first four bytes are a magic
//! and a version, so a later format can be read next to this one.
//!
//! Layout (integers big-endian):
//! ```text
//! "IGR" version:u8=1
//! status:u16
//! header_count:u16 { name_len:u16 name value_len:u32 value }*
//! kind:u8 (0 = body, 1 = events)
//!   body:   len:u32 bytes
//!   events: count:u32 { len:u32 bytes }*
//! usage:u8 (0 = none, 1 = present) [prompt_tokens:u64 completion_tokens:u64]
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::sse;

const MAGIC: &[u8; 3] = b"IGR";
const VERSION: u8 = 1;

/// Token counts of an LLM response, from its `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: u64,
    /// Completion (output) tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt plus completion tokens.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The body of a stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredBody {
    /// A complete body.
    Bytes(Bytes),
    /// An SSE stream: each event as sent (with its rewritten `id:` line and
    /// its terminating blank line). Event `i` (from 0) has id `RUN-{i + 1}`.
    Events(Vec<Bytes>),
}

impl StoredBody {
    /// Total size in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::Events(events) => events.iter().map(Bytes::len).sum(),
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// Status code.
    pub status: StatusCode,
    /// The headers kept for replay.
    pub headers: HeaderMap,
    /// Body or event stream.
    pub body: StoredBody,
    /// Token usage, when the response reported it.
    pub usage: Option<Usage>,
}

/// Why a stored payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not a stored response (wrong magic).
    #[error("not a stored response")]
    NotAResponse,
    /// Written by a newer version of this crate.
    #[error("stored response format version {0} is not supported")]
    UnsupportedVersion(u8),
    /// Shorter than its own lengths say.
    #[error("stored response is truncated")]
    Truncated,
    /// Bytes left after the last field.
    #[error("stored response has trailing bytes")]
    Trailing,
    /// A field holds an invalid value.
    #[error("stored response has an invalid {0}")]
    Invalid(&'static str),
}

/// Why a response could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A length does not fit its field (over 4 GiB, over 65535 headers).
    #[error("stored response is too large to encode ({0})")]
    TooLarge(&'static str),
}

impl StoredResponse {
    /// The binary form.
    ///
    /// # Errors
    /// [`EncodeError::TooLarge`] when a length does not fit its field.
    pub fn encode(&self) -> Result<Bytes, EncodeError> {
        let mut out = BytesMut::with_capacity(64 + self.body.len());
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        out.put_u16(self.status.as_u16());
        let count =
            u16::try_from(self.headers.len()).map_err(|_| EncodeError::TooLarge("headers"))?;
        out.put_u16(count);
        for (name, value) in &self.headers {
            let n = name.as_str().as_bytes();
            out.put_u16(u16::try_from(n.len()).map_err(|_| EncodeError::TooLarge("header name"))?);
            out.put_slice(n);
            put_blob(&mut out, value.as_bytes(), "header value")?;
        }
        match &self.body {
            StoredBody::Bytes(b) => {
                out.put_u8(0);
                put_blob(&mut out, b, "body")?;
            }
            StoredBody::Events(events) => {
                out.put_u8(1);
                out.put_u32(
                    u32::try_from(events.len()).map_err(|_| EncodeError::TooLarge("events"))?,
                );
                for e in events {
                    put_blob(&mut out, e, "event")?;
                }
            }
        }
        match self.usage {
            None => out.put_u8(0),
            Some(u) => {
                out.put_u8(1);
                out.put_u64(u.prompt_tokens);
                out.put_u64(u.completion_tokens);
            }
        }
        Ok(out.freeze())
    }

    /// Reads the binary form. Total: any input gives a value or an error.
    ///
    /// # Errors
    /// [`DecodeError`] when `payload` is not a valid stored response.
    pub fn decode(payload: &Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader {
            buf: payload,
            pos: 0,
        };
        if r.take(3)? != MAGIC.as_slice() {
            return Err(DecodeError::NotAResponse);
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError::Invalid("status"))?;
        let count = r.u16()?;
        let mut headers = HeaderMap::new();
        for _ in 0..count {
            let n = usize::from(r.u16()?);
            let name = HeaderName::from_bytes(r.take(n)?)
                .map_err(|_| DecodeError::Invalid("header name"))?;
            let len = r.len32()?;
            let value = HeaderValue::from_bytes(r.take(len)?)
                .map_err(|_| DecodeError::Invalid("header value"))?;
            headers.append(name, value);
        }
        let body = match r.u8()? {
            0 => {
                let len = r.len32()?;
                StoredBody::Bytes(r.slice(len)?)
            }
            1 => {
                let count = r.len32()?;
                // Each event needs at least its 4-byte length: do not trust
                // `count` for the allocation.
                let mut events = Vec::with_capacity(count.min(r.remaining() / 4));
                for _ in 0..count {
                    let len = r.len32()?;
                    events.push(r.slice(len)?);
                }
                StoredBody::Events(events)
            }
            _ => return Err(DecodeError::Invalid("body kind")),
        };
        let usage = match r.u8()? {
            0 => None,
            1 => Some(Usage {
                prompt_tokens: r.u64()?,
                completion_tokens: r.u64()?,
            }),
            _ => return Err(DecodeError::Invalid("usage flag")),
        };
        if r.remaining() != 0 {
            return Err(DecodeError::Trailing);
        }
        Ok(Self {
            status,
            headers,
            body,
            usage,
        })
    }

    /// The body as one buffer (events concatenated, from event `skip`).
    pub fn body_bytes(&self, skip: usize) -> Bytes {
        match &self.body {
            StoredBody::Bytes(b) => b.clone(),
            StoredBody::Events(events) => concat(events.get(skip..).unwrap_or_default()),
        }
    }
}

/// The events concatenated.
pub(crate) fn concat(events: &[Bytes]) -> Bytes {
    let mut out = BytesMut::with_capacity(events.iter().map(Bytes::len).sum());
    for e in events {
        out.put_slice(e);
    }
    out.freeze()
}

fn put_blob(out: &mut BytesMut, b: &[u8], what: &'static str) -> Result<(), EncodeError> {
    out.put_u32(u32::try_from(b.len()).map_err(|_| EncodeError::TooLarge(what))?);
    out.put_slice(b);
    Ok(())
}

struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn slice(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.buf.slice(start..self.pos))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn len32(&mut self) -> Result<usize, DecodeError> {
        usize::try_from(u32::from_be_bytes(self.array()?)).map_err(|_| DecodeError::Truncated)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
}

/// Usage of a JSON response body: OpenAI's `usage.{prompt,completion}_tokens`
/// or Anthropic's `usage.{input,output}_tokens`.
pub fn usage_of_json(body: &[u8]) -> Option<Usage> {
    memchr::memmem::find(body, b"\"usage\"")?;
    let mut acc = StreamUsage::default();
    acc.add_json(body);
    acc.finish()
}

/// The two places a body or event carries usage. Every other member is
/// skipped without being built (a response's `choices` can be large).
#[derive(Debug, serde::Deserialize)]
struct UsageCarrier {
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
}

/// Accumulates usage over an SSE stream: OpenAI's final chunk carries
/// `usage`; Anthropic's `message_start` carries `message.usage.input_tokens`
/// and `message_delta` carries `usage.output_tokens`. Later figures win.
#[derive(Debug, Default, Clone)]
pub struct StreamUsage {
    prompt: Option<u64>,
    completion: Option<u64>,
}

impl StreamUsage {
    /// Looks at one event (as sent, with its field lines).
    pub fn add_event(&mut self, event: &[u8]) {
        if memchr::memmem::find(event, b"\"usage\"").is_none() {
            return;
        }
        self.add_json(&sse::data_of(event));
    }

    /// Looks at one JSON document: its `message.usage`, then its `usage`.
    fn add_json(&mut self, json: &[u8]) {
        // Not an object, or a member given twice: read it whole, the last
        // of a repeated member winning.
        let carrier = serde_json::from_slice::<UsageCarrier>(json)
            .ok()
            .or_else(|| {
                let mut v = serde_json::from_slice::<Value>(json).ok()?;
                Some(UsageCarrier {
                    usage: v.get_mut("usage").map(Value::take),
                    message: v.get_mut("message").map(Value::take),
                })
            });
        let Some(c) = carrier else { return };
        if let Some(u) = c.message.as_ref().and_then(|m| m.get("usage")) {
            self.add_usage(u);
        }
        if let Some(u) = &c.usage {
            self.add_usage(u);
        }
    }

    fn add_usage(&mut self, u: &Value) {
        let field = |a: &str, b: &str| u.get(a).or_else(|| u.get(b)).and_then(Value::as_u64);
        if let Some(p) = field("prompt_tokens", "input_tokens") {
            self.prompt = Some(p);
        }
        if let Some(c) = field("completion_tokens", "output_tokens") {
            self.completion = Some(c);
        }
    }

    /// The figures seen so far, if any.
    pub fn finish(&self) -> Option<Usage> {
        if self.prompt.is_none() && self.completion.is_none() {
            return None;
        }
        Some(Usage {
            prompt_tokens: self.prompt.unwrap_or(0),
            completion_tokens: self.completion.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(body: StoredBody) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body,
            usage: Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 9,
            }),
        }
    }

    #[test]
    fn round_trips() {
        for body in [
            StoredBody::Bytes(Bytes::from_static(b"{\"ok\":true}")),
            StoredBody::Bytes(Bytes::new()),
            StoredBody::Events(vec![
                Bytes::from_static(b"id: 1\ndata: a\n\n"),
                Bytes::from_static(b"id: 2\ndata: b\n\n"),
            ]),
            StoredBody::Events(vec![]),
        ] {
            let r = sample(body);
            let bytes = r.encode().unwrap();
            assert_eq!(StoredResponse::decode(&bytes).unwrap(), r);
        }
        let mut none = sample(StoredBody::Bytes(Bytes::from_static(b"x")));
        none.usage = None;
        assert_eq!(
            StoredResponse::decode(&none.encode().unwrap()).unwrap(),
            none
        );
    }

    #[test]
    fn refuses_bad_input_cleanly() {
        let good = sample(StoredBody::Bytes(Bytes::from_static(b"hello")))
            .encode()
            .unwrap();
        assert_eq!(
            StoredResponse::decode(&Bytes::from_static(b"{\"json\":1}")),
            Err(DecodeError::NotAResponse)
        );
        let mut v2 = good.to_vec();
        v2[3] = 2;
        assert_eq!(
            StoredResponse::decode(&Bytes::from(v2)),
            Err(DecodeError::UnsupportedVersion(2))
        );
        for cut in 0..good.len() {
            assert!(
                StoredResponse::decode(&good.slice(..cut)).is_err(),
                "cut {cut}"
            );
        }
        let mut trailing = good.to_vec();
        trailing.push(0);
        assert_eq!(
            StoredResponse::decode(&Bytes::from(trailing)),
            Err(DecodeError::Trailing)
        );
    }

    #[test]
    fn skipping_events_for_last_event_id() {
        let r = sample(StoredBody::Events(vec![
            Bytes::from_static(b"id: 1\ndata: a\n\n"),
            Bytes::from_static(b"id: 2\ndata: b\n\n"),
        ]));
        assert_eq!(r.body_bytes(0), "id: 1\ndata: a\n\nid: 2\ndata: b\n\n");
        assert_eq!(r.body_bytes(1), "id: 2\ndata: b\n\n");
        assert_eq!(r.body_bytes(2), "");
        assert_eq!(r.body_bytes(99), "");
    }

    #[test]
    fn usage_from_openai_and_anthropic_bodies() {
        let openai =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(
            usage_of_json(openai),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 30
            })
        );
        let anthropic = br#"{"type":"message","usage":{"input_tokens":5,"output_tokens":8}}"#;
        assert_eq!(usage_of_json(anthropic).map(|u| u.total()), Some(13));
        assert_eq!(usage_of_json(br#"{"a":1}"#), None);
        assert_eq!(usage_of_json(b"not json \"usage\""), None);
        // Large members are skipped; a repeated `usage` is read as a
        // whole document would be (the last one wins).
        let skipped = br#"{"choices":[{"message":{"content":"a long answer"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        assert_eq!(usage_of_json(skipped).map(|u| u.total()), Some(3));
        let repeated =
            br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":7,"completion_tokens":1}}"#;
        assert_eq!(usage_of_json(repeated).map(|u| u.prompt_tokens), Some(7));
        assert_eq!(usage_of_json(br#"["usage"]"#), None);
    }

    #[test]
    fn usage_from_streams() {
        let mut openai = StreamUsage::default();
        openai.add_event(b"id: 1\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        openai.add_event(
            b"id: 2\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n",
        );
        openai.add_event(b"id: 3\ndata: [DONE]\n\n");
        assert_eq!(
            openai.finish(),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4
            })
        );
        let mut anthropic = StreamUsage::default();
        anthropic.add_event(b"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n");
        anthropic.add_event(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n");
        assert_eq!(
            anthropic.finish(),
            Some(Usage {
                prompt_tokens: 25,
                completion_tokens: 15
            })
        );
        assert_eq!(StreamUsage::default().finish(), None);
    }

    proptest! {
        #[test]
        fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = StoredResponse::decode(&Bytes::from(bytes));
        }

        #[test]
        fn decoding_mutated_payloads_never_panics(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)
        ) {
            let good = sample(StoredBody::Events(vec![
                Bytes::from_static(b"id: 1\ndata: a\n\n"),
                Bytes::from_static(b"id: 2\ndata: b\n\n"),
            ]))
            .encode()
            .unwrap();
            let mut v = good.to_vec();
            for (at, byte) in flips {
                let i = at % v.len();
                v[i] = byte;
            }
            let _ = StoredResponse::decode(&Bytes::from(v));
        }
    }
}
