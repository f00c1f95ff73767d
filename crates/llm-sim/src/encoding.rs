//! Compressed answers, as providers behind CDNs send them: gzip or brotli
//! when the request's `Accept-Encoding` offers it, or always when
//! `x-sim-encoding` forces one (a CDN that compresses whatever it is
//! asked). A gateway that stores or scans these bytes without decoding
//! them stores and scans garbage; that is what this lets tests show.
//!
//! A stream is compressed frame by frame with a flush after each, so every
//! event reaches the client when it is generated, as with a real
//! compressing proxy.

use std::io::Write;

use axum::http::HeaderMap;
use bytes::Bytes;

/// Header: force an encoding (`gzip`, `br` or `identity`) whatever the
/// request accepts.
pub const ENCODING_HEADER: &str = "x-sim-encoding";

/// A content coding the simulator can answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    Identity,
    Gzip,
    Brotli,
}

impl Encoding {
    /// The forced encoding, or the best one the request accepts (brotli,
    /// then gzip). The error names the header when its value is unknown.
    pub(crate) fn choose(headers: &HeaderMap) -> Result<Self, String> {
        if let Some(forced) = headers.get(ENCODING_HEADER) {
            return match forced.to_str().map(str::trim) {
                Ok("gzip") => Ok(Self::Gzip),
                Ok("br") => Ok(Self::Brotli),
                Ok("identity") => Ok(Self::Identity),
                _ => Err(format!("{ENCODING_HEADER} must be gzip, br or identity")),
            };
        }
        let accepted: Vec<String> = headers
            .get_all(axum::http::header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter(|c| !c.contains("q=0") || c.contains("q=0."))
            .filter_map(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase())
            .collect();
        Ok(if accepted.iter().any(|c| c == "br") {
            Self::Brotli
        } else if accepted.iter().any(|c| c == "gzip") {
            Self::Gzip
        } else {
            Self::Identity
        })
    }

    /// The `Content-Encoding` value, `None` for identity.
    pub(crate) fn header_value(self) -> Option<&'static str> {
        match self {
            Self::Identity => None,
            Self::Gzip => Some("gzip"),
            Self::Brotli => Some("br"),
        }
    }

    /// A streaming encoder for one body.
    pub(crate) fn encoder(self) -> Encoder {
        match self {
            Self::Identity => Encoder::Identity,
            Self::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
            Self::Brotli => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                22,
            ))),
        }
    }
}

/// Compresses one body, piece by piece.
pub(crate) enum Encoder {
    Identity,
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
}

impl Encoder {
    /// The encoded form of `data`, flushed so that it can be decoded now.
    pub(crate) fn chunk(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        match self {
            Self::Identity => Ok(Bytes::copy_from_slice(data)),
            Self::Gzip(w) => {
                w.write_all(data)?;
                w.flush()?;
                Ok(Bytes::from(std::mem::take(w.get_mut())))
            }
            Self::Brotli(w) => {
                w.write_all(data)?;
                w.flush()?;
                Ok(Bytes::from(std::mem::take(w.get_mut())))
            }
        }
    }

    /// The bytes that close the encoding (empty for identity).
    pub(crate) fn finish(self) -> std::io::Result<Bytes> {
        match self {
            Self::Identity => Ok(Bytes::new()),
            Self::Gzip(w) => w.finish().map(Bytes::from),
            Self::Brotli(w) => Ok(Bytes::from(w.into_inner())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::io::Read;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn the_encoding_is_negotiated_or_forced() {
        let choose = |h: &[(&'static str, &'static str)]| Encoding::choose(&headers(h));
        assert_eq!(choose(&[]), Ok(Encoding::Identity));
        assert_eq!(
            choose(&[("accept-encoding", "gzip, deflate")]),
            Ok(Encoding::Gzip)
        );
        assert_eq!(
            choose(&[("accept-encoding", "gzip, br;q=0.9")]),
            Ok(Encoding::Brotli)
        );
        assert_eq!(
            choose(&[("accept-encoding", "br;q=0, identity")]),
            Ok(Encoding::Identity)
        );
        assert_eq!(
            choose(&[("accept-encoding", "identity"), ("x-sim-encoding", "gzip")]),
            Ok(Encoding::Gzip)
        );
        assert!(choose(&[("x-sim-encoding", "zstd")]).is_err());
    }

    #[test]
    fn pieces_decode_to_the_whole() {
        for enc in [Encoding::Gzip, Encoding::Brotli, Encoding::Identity] {
            let mut e = enc.encoder();
            let mut out = Vec::new();
            out.extend_from_slice(&e.chunk(b"data: a\n\n").unwrap());
            out.extend_from_slice(&e.chunk(b"data: b\n\n").unwrap());
            out.extend_from_slice(&e.finish().unwrap());
            let mut plain = Vec::new();
            match enc {
                Encoding::Gzip => {
                    flate2::read::GzDecoder::new(&out[..])
                        .read_to_end(&mut plain)
                        .unwrap();
                }
                Encoding::Brotli => {
                    brotli::Decompressor::new(&out[..], 4096)
                        .read_to_end(&mut plain)
                        .unwrap();
                }
                Encoding::Identity => plain = out,
            }
            assert_eq!(plain, b"data: a\n\ndata: b\n\n", "{enc:?}");
        }
    }
}
