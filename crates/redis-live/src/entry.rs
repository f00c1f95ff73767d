//! Stream entries: ids, fields, and decoding of `XRANGE` / `XREAD` replies.
//!
//! | id | field | meaning |
//! |---|---|---|
//! | `<fence>-0` | `h` | response head (status and headers, encoded as a stored response without body) |
//! | `<fence>-<n>` | `e` | event `n`, with its `id: n` line |
//! | `<fence>-<last + 1>` | `x` | end: `1` stored DONE, `0` failed |
//!
//! With a key ring, the values of `h` and `e` entries are sealed, bound to
//! the stream key, the entry id and the field ([`seal_entry`],
//! [`open_entry`]): an entry copied to another stream or position does not
//! open. Such an entry is a store error of kind `Corrupt`, like a record
//! that does not open, and the failure hook counts it: a duplicate that
//! meets it while joining gets the store-error answer, a follower that
//! meets it mid-stream sees the stream break.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idemgate_engine::{StoreError, StoreErrorKind};
use idemgate_layer::stored::{StoredBody, StoredResponse};
use idemgate_redis::BACKEND;
use idemgate_seal::SealError;
use redis::Value;

use crate::options::FanoutOptions;

/// Largest sequence part of an id, for the upper end of a range.
pub(crate) const MAX_SEQ: u64 = u64::MAX;

/// The id of entry `seq` of the owner with `fence`.
pub(crate) fn id(fence: u64, seq: u64) -> String {
    format!("{fence}-{seq}")
}

/// One decoded entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) fence: u64,
    pub(crate) seq: u64,
    pub(crate) kind: Kind,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Head(Bytes),
    Event(Bytes),
    End {
        complete: bool,
    },
    /// Not written by this version: ignored.
    Other,
}

/// The domain label of the associated data of a sealed stream entry.
const LIVE_AD_LABEL: &str = "idemgate/live/v1";

fn entry_ad(stream: &str, fence: u64, seq: u64, field: &str) -> Vec<u8> {
    idemgate_seal::associated_data([
        LIVE_AD_LABEL,
        stream,
        &fence.to_string(),
        &seq.to_string(),
        field,
    ])
}

/// Reports a seal or open failure to the hook, and makes it a store error.
fn failed(opts: &FanoutOptions, e: SealError, what: String) -> StoreError {
    if let Some(hook) = &opts.on_seal_failure {
        hook(e.kind());
    }
    StoreError::new(StoreErrorKind::Corrupt, BACKEND, format!("{what}: {e}")).with_source(e)
}

/// The value written for entry `fence-seq` of `stream`: sealed with the
/// key ring if there is one.
///
/// # Errors
/// `Corrupt` when sealing failed (the writer then stops).
pub(crate) fn seal_entry(
    opts: &FanoutOptions,
    stream: &str,
    fence: u64,
    seq: u64,
    field: &str,
    value: Bytes,
) -> Result<Bytes, StoreError> {
    match opts.key_ring.as_deref() {
        None => Ok(value),
        Some(ring) => ring
            .seal(&entry_ad(stream, fence, seq, field), &value)
            .map(Bytes::from)
            .map_err(|e| {
                failed(
                    opts,
                    e,
                    format!("live stream entry {fence}-{seq} ({field}) could not be sealed"),
                )
            }),
    }
}

/// The plaintext of entry `fence-seq` of `stream`.
///
/// # Errors
/// `Corrupt` when it does not open (a key this process does not hold, a
/// changed byte, an entry written without sealing).
pub(crate) fn open_entry(
    opts: &FanoutOptions,
    stream: &str,
    fence: u64,
    seq: u64,
    field: &str,
    value: &Bytes,
) -> Result<Bytes, StoreError> {
    match opts.key_ring.as_deref() {
        None => Ok(value.clone()),
        Some(ring) => ring
            .open(&entry_ad(stream, fence, seq, field), value)
            .map(Bytes::from)
            .map_err(|e| {
                failed(
                    opts,
                    e,
                    format!("live stream entry {fence}-{seq} ({field}) does not open"),
                )
            }),
    }
}

/// The head entry's value.
pub(crate) fn encode_head(status: StatusCode, headers: HeaderMap) -> Option<Bytes> {
    StoredResponse {
        status,
        headers,
        body: StoredBody::Events(Vec::new()),
        usage: None,
    }
    .encode()
    .ok()
}

/// Status and headers from a head entry's value.
pub(crate) fn decode_head(value: &Bytes) -> Option<(StatusCode, HeaderMap)> {
    let stored = StoredResponse::decode(value).ok()?;
    Some((stored.status, stored.headers))
}

fn bytes_of(v: &Value) -> Option<Bytes> {
    match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        Value::SimpleString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        _ => None,
    }
}

fn parse_id(v: &Value) -> Option<(u64, u64)> {
    let b = bytes_of(v)?;
    let s = std::str::from_utf8(&b).ok()?;
    let (f, q) = s.split_once('-')?;
    Some((f.parse().ok()?, q.parse().ok()?))
}

/// One `[id, [field, value, …]]` element.
fn entry(v: &Value) -> Option<Entry> {
    let Value::Array(parts) = v else {
        return None;
    };
    let [id, fields] = parts.as_slice() else {
        return None;
    };
    let (fence, seq) = parse_id(id)?;
    let fields: Vec<&Value> = match fields {
        Value::Array(f) => f.iter().collect(),
        Value::Map(m) => m.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    let (Some(name), Some(value)) = (fields.first(), fields.get(1)) else {
        return Some(Entry {
            fence,
            seq,
            kind: Kind::Other,
        });
    };
    let value = bytes_of(value)?;
    let kind = match bytes_of(name)?.as_ref() {
        b"h" => Kind::Head(value),
        b"e" => Kind::Event(value),
        b"x" => Kind::End {
            complete: value.as_ref() == b"1",
        },
        _ => Kind::Other,
    };
    Some(Entry { fence, seq, kind })
}

/// Entries of an `XRANGE` reply; `None` if the reply is not one.
pub(crate) fn range(v: &Value) -> Option<Vec<Entry>> {
    match v {
        Value::Array(items) => items.iter().map(entry).collect(),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

/// Entries of an `XREAD` reply for one stream (nil on timeout: empty).
pub(crate) fn read(v: &Value) -> Option<Vec<Entry>> {
    match v {
        Value::Nil => Some(Vec::new()),
        Value::Array(streams) => {
            let mut out = Vec::new();
            for s in streams {
                let Value::Array(pair) = s else {
                    return None;
                };
                out.extend(range(pair.get(1)?)?);
            }
            Some(out)
        }
        Value::Map(streams) => {
            let mut out = Vec::new();
            for (_, entries) in streams {
                out.extend(range(entries)?);
            }
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_decode_into_entries() {
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("17-0"), Value::Array(vec![bulk("h"), bulk("x")])]),
            Value::Array(vec![
                bulk("17-1"),
                Value::Array(vec![bulk("e"), bulk("id: 1\ndata: a\n\n")]),
            ]),
            Value::Array(vec![bulk("17-2"), Value::Array(vec![bulk("x"), bulk("1")])]),
        ]);
        let got = range(&reply).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1].fence, 17);
        assert_eq!(got[1].seq, 1);
        assert_eq!(
            got[1].kind,
            Kind::Event(Bytes::from_static(b"id: 1\ndata: a\n\n"))
        );
        assert_eq!(got[2].kind, Kind::End { complete: true });
        let read_reply = Value::Array(vec![Value::Array(vec![bulk("k"), reply])]);
        assert_eq!(read(&read_reply).unwrap().len(), 3);
        assert_eq!(read(&Value::Nil).unwrap(), Vec::new());
        assert!(range(&Value::Int(3)).is_none());
        assert!(range(&Value::Array(vec![bulk("no-id")])).is_none());
    }

    #[test]
    fn heads_round_trip() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "text/event-stream".parse().unwrap());
        let enc = encode_head(StatusCode::OK, h.clone()).unwrap();
        assert_eq!(decode_head(&enc), Some((StatusCode::OK, h)));
        assert_eq!(decode_head(&Bytes::from_static(b"junk")), None);
    }
}
