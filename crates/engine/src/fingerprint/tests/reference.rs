//! The canonicaliser of earlier versions, kept as the reference that the
//! one-pass canonicaliser must match byte for byte on every input both
//! accept (fingerprints of stored records must survive an upgrade). It
//! recurses per nesting level and re-parses each level, so it is only ever
//! called on shallow test inputs.
//!
//! It depends on nothing of this crate, so the fuzz targets (`fuzz/`)
//! compile this same file and compare the two on every input they run.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The earlier canonicaliser refused the body (a repeated key), or a
/// fragment did not parse again.
#[derive(Debug)]
struct Refused;

/// A string in the canonical escaping (`serde_json`'s).
fn write_string(s: &str, out: &mut Vec<u8>) {
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

/// Canonical text by the earlier method, or `None` when it refused or
/// found no JSON.
pub(crate) fn canonical(body: &[u8], ignore: &[String]) -> Option<Vec<u8>> {
    let raw: &RawValue = serde_json::from_slice(body).ok()?;
    let mut out = Vec::new();
    Canonical::new(ignore)
        .write(raw, &mut Vec::new(), &mut out)
        .ok()?;
    Some(out)
}

/// Writes canonical JSON from raw JSON text, leaving out ignored pointers.
struct Canonical {
    /// Ignored pointers, split into unescaped reference tokens.
    ignore: Vec<Vec<String>>,
}

impl Canonical {
    fn new(ignore: &[String]) -> Self {
        let ignore = ignore
            .iter()
            .filter_map(|p| p.strip_prefix('/'))
            .map(|p| {
                p.split('/')
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect()
            })
            .collect();
        Self { ignore }
    }

    fn ignored(&self, path: &[String]) -> bool {
        self.ignore.iter().any(|p| p.as_slice() == path)
    }

    /// Writes `raw` (already validated JSON) at `path` into `out`.
    fn write(
        &self,
        raw: &RawValue,
        path: &mut Vec<String>,
        out: &mut Vec<u8>,
    ) -> Result<(), Refused> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'{') => {
                let Members(mut members) = parse(text)?;
                members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                if members.windows(2).any(|w| w[0].0 == w[1].0) {
                    return Err(Refused);
                }
                out.push(b'{');
                let mut first = true;
                for (key, value) in members {
                    path.push(key);
                    if !self.ignored(path) {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        write_string(path.last().map_or("", String::as_str), out);
                        out.push(b':');
                        self.write(value, path, out)?;
                    }
                    path.pop();
                }
                out.push(b'}');
            }
            Some(b'[') => {
                let items: Vec<&RawValue> = parse(text)?;
                out.push(b'[');
                let mut first = true;
                for (i, item) in items.into_iter().enumerate() {
                    path.push(i.to_string());
                    if !self.ignored(path) {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        self.write(item, path, out)?;
                    }
                    path.pop();
                }
                out.push(b']');
            }
            Some(b'"') => {
                let s: String = parse(text)?;
                write_string(&s, out);
            }
            // Numbers, `true`, `false` and `null`: their exact literal text.
            _ => out.extend_from_slice(text.as_bytes()),
        }
        Ok(())
    }
}

/// Re-parses a fragment that `serde_json` already validated as part of the
/// whole body; a failure here cannot happen for valid input, and is treated
/// as "not canonicalisable" rather than a panic.
fn parse<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, Refused> {
    serde_json::from_str(text).map_err(|_| Refused)
}

/// An object's members in source order, values as raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&'a RawValue>()?));
                }
                Ok(Members(members))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::custom("expected an object"))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}
