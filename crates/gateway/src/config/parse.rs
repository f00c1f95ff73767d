//! The small parsers: durations, sizes, header names, listen addresses,
//! upstream URLs and store URLs. (Mode names are serde enums, read with
//! the raw configuration: [`super::raw`].)
//!
//! Each one turns the text of one field into its typed value and, when it
//! cannot, says what a valid value looks like; the field-taking ones name
//! the field in their [`ConfigError`]. They hold no policy about which
//! field gets which default: that is the validation's job
//! ([`super::route`], [`super::gateway`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;
use url::Url;

use super::error::ConfigError;
use super::raw::RawSize;
use super::secret::redact_text;

/// Where records are kept.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// In this process only (`memory:`).
    Memory,
    /// An SQLite file (`sqlite:PATH`).
    Sqlite(PathBuf),
    /// A Redis node (`redis://…` or `rediss://…`).
    Redis(Url),
    /// A Redis Cluster (`redis+cluster://…`).
    RedisCluster(Url),
    /// PostgreSQL (`postgres://…`).
    Postgres(Url),
}

impl StoreUrl {
    /// Parses a store URL: `memory:`, `sqlite:PATH`, `redis://…` (or
    /// `rediss://…` with TLS), `redis+cluster://…` (`rediss+cluster://…`),
    /// `postgres://…`.
    ///
    /// # Errors
    /// An unknown scheme or a malformed URL, as a message.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "memory:" {
            return Ok(Self::Memory);
        }
        if let Some(path) = s.strip_prefix("sqlite:") {
            if path.is_empty() || path.starts_with("//") {
                return Err("`sqlite:` needs a file path, e.g. `sqlite:idemgate.db`".into());
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        let url = Url::parse(s).map_err(|e| {
            format!(
                "`{}` is not a store URL ({e}); use sqlite:PATH, memory:, redis://…, redis+cluster://… or postgres://…",
                redact_text(s)
            )
        })?;
        match url.scheme() {
            "redis" | "rediss" => Ok(Self::Redis(url)),
            "redis+cluster" | "rediss+cluster" => Ok(Self::RedisCluster(url)),
            "postgres" => Ok(Self::Postgres(url)),
            other => Err(format!(
                "unknown store scheme `{other}`; use sqlite:PATH, memory:, redis://…, redis+cluster://… or postgres://…"
            )),
        }
    }

    /// The backend name (`memory`, `sqlite`, `redis`, `redis-cluster`, `postgres`).
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Redis(_) => "redis",
            Self::RedisCluster(_) => "redis-cluster",
            Self::Postgres(_) => "postgres",
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory:"),
            Self::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            Self::Redis(u) | Self::RedisCluster(u) | Self::Postgres(u) => {
                f.write_str(&redact_text(u.as_str()))
            }
        }
    }
}

/// Passwords never reach logs.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// A listen address (`127.0.0.1:8080`).
pub(super) fn addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.trim().parse().map_err(|e| {
        ConfigError::invalid(
            field,
            format!("`{s}` is not an address like 127.0.0.1:8080 ({e})"),
        )
    })
}

/// An upstream base URL: http (https with the `tls` feature), a host, no
/// query or fragment (the request's own path and query are appended).
pub(super) fn upstream_url(field: &str, s: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(s.trim())
        .map_err(|e| ConfigError::invalid(field, format!("`{s}` is not a URL ({e})")))?;
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "tls") => {}
        "https" => {
            return Err(ConfigError::invalid(
                field,
                "https upstreams need the gateway built with the `tls` feature",
            ));
        }
        other => {
            return Err(ConfigError::invalid(
                field,
                format!("scheme `{other}`: expected http or https"),
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(field, "has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::invalid(
            field,
            "must not have a query or fragment",
        ));
    }
    Ok(url)
}

/// A header name (lowercased).
pub(super) fn header(field: &str, s: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(s.as_bytes())
        .map_err(|_| ConfigError::invalid(field, format!("`{s}` is not a header name")))
}

/// A positive duration (`500ms`, `30s`, `24h`, `1h 30m`); `default` when
/// absent.
pub(super) fn duration(
    field: &str,
    s: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let d = duration_or_zero(field, s, default)?;
    if d.is_zero() && s.is_some() {
        return Err(ConfigError::invalid(field, "must be greater than zero"));
    }
    Ok(d)
}

/// A duration that may be zero (`0s`, `500ms`); `default` when absent.
pub(super) fn duration_or_zero(
    field: &str,
    s: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match s {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s.trim()).map_err(|e| {
            ConfigError::invalid(
                field,
                format!("`{s}` is not a duration like 500ms, 30s or 24h ({e})"),
            )
        }),
    }
}

/// A positive size in bytes: a number, or text with a unit.
pub(super) fn size(field: &str, s: &RawSize) -> Result<usize, ConfigError> {
    let bytes = size_or_zero(field, s)?;
    if bytes == 0 {
        return Err(ConfigError::invalid(field, "must be greater than zero"));
    }
    Ok(bytes)
}

/// A size in bytes, where `0` means "none" (a feature turned off).
pub(super) fn size_or_zero(field: &str, s: &RawSize) -> Result<usize, ConfigError> {
    let bytes = match s {
        RawSize::Bytes(n) => *n,
        RawSize::Text(t) => parse_size(t).ok_or_else(|| {
            ConfigError::invalid(
                field,
                format!("`{t}` is not a size like 65536, 512KiB or 10MiB"),
            )
        })?,
    };
    usize::try_from(bytes).map_err(|_| ConfigError::invalid(field, "too large"))
}

/// `65536`, `512KiB`, `10 MiB`, `1MB`: bytes, decimal (KB, MB, GB) or
/// binary (KiB, MiB, GiB) units, any case.
fn parse_size(t: &str) -> Option<u64> {
    let t = t.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => 1 << 10,
        "mb" => 1_000_000,
        "mib" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<impl fmt::Debug, ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("10 MiB"), Some(10 << 20));
        assert_eq!(parse_size("1MB"), Some(1_000_000));
        assert_eq!(parse_size("2gib"), Some(2 << 30));
        assert_eq!(parse_size("1XB"), None);
        assert_eq!(parse_size("MiB"), None);
        assert_eq!(parse_size("1k"), None, "one spelling per unit: KB");
        assert_eq!(parse_size("99999999999GiB"), None, "overflow");
        assert_eq!(size("f", &RawSize::Bytes(64)).ok(), Some(64));
        assert_eq!(size("f", &RawSize::Text("1KiB".into())).ok(), Some(1024));
        assert_eq!(
            field_of(size("body_limit", &RawSize::Bytes(0))),
            "body_limit"
        );
        assert_eq!(
            field_of(size("body_limit", &RawSize::Text("lots".into()))),
            "body_limit"
        );
    }

    #[test]
    fn durations() {
        let d = Duration::from_secs(7);
        assert_eq!(duration("f", None, d).ok(), Some(d));
        assert_eq!(
            duration("f", Some(" 1h 30m "), d).ok(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            duration("f", Some("500ms"), d).ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(field_of(duration("ttl", Some("0s"), d)), "ttl");
        assert_eq!(field_of(duration("ttl", Some("soon"), d)), "ttl");
        assert_eq!(field_of(duration("ttl", Some("-1s"), d)), "ttl");
        assert_eq!(
            duration_or_zero("f", Some("0s"), d).ok(),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn headers_addresses_and_upstreams() {
        assert_eq!(
            header("h", "X-Request-Key").map(|h| h.to_string()).ok(),
            Some("x-request-key".to_owned())
        );
        assert_eq!(field_of(header("h", "a:b")), "h");
        assert_eq!(
            addr("listen", " 127.0.0.1:8080 ").map(|a| a.port()).ok(),
            Some(8080)
        );
        assert_eq!(field_of(addr("listen", "1.2.3.4")), "listen");
        assert_eq!(
            upstream_url("u", "http://h:1/base").map(String::from).ok(),
            Some("http://h:1/base".to_owned())
        );
        for bad in ["ftp://h", "not a url", "http://h/?q=1", "http://h/#f"] {
            assert_eq!(field_of(upstream_url("u", bad)), "u", "{bad}");
        }
        assert_eq!(
            upstream_url("u", "https://h").is_ok(),
            cfg!(feature = "tls")
        );
    }

    /// A rejection names `field` in its value and its message, and says
    /// what was expected.
    fn names_the_field<T: fmt::Debug>(
        r: Result<T, ConfigError>,
        field: &str,
    ) -> Result<Option<T>, proptest::test_runner::TestCaseError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                proptest::prop_assert_eq!(e.field(), Some(field));
                let shown = e.to_string();
                let quoted = format!("`{field}`");
                proptest::prop_assert!(shown.contains(&quoted), "{shown}");
                proptest::prop_assert!(shown.len() > field.len() + 24, "{shown}");
                Ok(None)
            }
        }
    }

    proptest::proptest! {
        /// Durations: any text is a positive duration or an error naming
        /// the field; nothing panics.
        #[test]
        fn any_text_as_a_duration(s in "\\PC{0,24}|[0-9 ]{1,12}(ns|us|ms|s|m|h|d|w|y)?") {
            let d = Duration::from_secs(1);
            if let Some(got) = names_the_field(duration("routes[0].pending_ttl", Some(&s), d), "routes[0].pending_ttl")? {
                proptest::prop_assert!(!got.is_zero());
            }
            let _ = names_the_field(duration_or_zero("client_retry.compensation_delay", Some(&s), d), "client_retry.compensation_delay")?;
        }

        /// Sizes, as text or a number: positive bytes or an error naming
        /// the field.
        #[test]
        fn any_text_or_number_as_a_size(s in "\\PC{0,16}|[0-9]{1,22} ?[KMGkmgi]{0,2}[bB]?", n in proptest::num::u64::ANY) {
            for raw in [RawSize::Text(s.clone()), RawSize::Bytes(n)] {
                if let Some(got) = names_the_field(size("routes[0].body_limit", &raw), "routes[0].body_limit")? {
                    proptest::prop_assert!(got > 0);
                }
            }
        }

        /// Header names: accepted ones are the lowercased text.
        #[test]
        fn any_text_as_a_header(s in "\\PC{0,20}|[!-~]{1,20}") {
            if let Some(h) = names_the_field(header("routes[0].tenant_headers", &s), "routes[0].tenant_headers")? {
                proptest::prop_assert_eq!(h.as_str(), s.to_ascii_lowercase());
            }
        }

        /// Addresses and upstream URLs: accepted ones are what they claim.
        #[test]
        fn any_text_as_an_address_or_upstream(s in "\\PC{0,30}|(http|https|ftp)://[a-z0-9.:@/?#%-]{0,30}|[0-9.:\\[\\]]{0,24}") {
            let _ = names_the_field(addr("listen", &s), "listen")?;
            if let Some(url) = names_the_field(upstream_url("routes[0].upstream", &s), "routes[0].upstream")? {
                proptest::prop_assert!(matches!(url.scheme(), "http" | "https"));
                proptest::prop_assert!(url.host_str().is_some_and(|h| !h.is_empty()));
                proptest::prop_assert!(url.query().is_none() && url.fragment().is_none());
            }
        }

        /// Store URLs: any text is a store or a message that shows the
        /// valid forms, and never shows a password it was given.
        #[test]
        fn any_text_as_a_store_url(s in "\\PC{0,30}|(sqlite|memory|redis|rediss|redis\\+cluster|postgres|mysql):(//)?[a-z0-9.:@/?=&-]{0,24}", pw in "[a-z]{6}9Zq") {
            for text in [s.clone(), format!("postgres://u:{pw}@{s}"), format!("redis://:{pw}@{s}")] {
                match StoreUrl::parse(&text) {
                    Ok(url) => {
                        let shown = format!("{url} {url:?}");
                        proptest::prop_assert!(!shown.contains(&pw), "{}", shown);
                    }
                    Err(m) => {
                        proptest::prop_assert!(m.contains("sqlite:"), "{m}");
                        proptest::prop_assert!(!m.contains(&pw), "{m}");
                    }
                }
            }
        }
    }

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("memory:"), Ok(StoreUrl::Memory));
        assert_eq!(
            StoreUrl::parse("sqlite:/tmp/x.db"),
            Ok(StoreUrl::Sqlite("/tmp/x.db".into()))
        );
        assert!(matches!(
            StoreUrl::parse("redis://h:6379"),
            Ok(StoreUrl::Redis(_))
        ));
        assert!(matches!(
            StoreUrl::parse("redis+cluster://h:7000"),
            Ok(StoreUrl::RedisCluster(_))
        ));
        assert!(matches!(
            StoreUrl::parse("postgres://u:p@h/db"),
            Ok(StoreUrl::Postgres(_))
        ));
        // One spelling per store: the documented one.
        for other in [
            "mysql://h",
            "sqlite:",
            "sqlite://x.db",
            "memory",
            "memory://",
            "postgresql://h/db",
        ] {
            assert!(StoreUrl::parse(other).is_err(), "{other}");
        }
        let shown = format!("{:?}", StoreUrl::parse("postgres://u:hunter2@h/db"));
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = StoreUrl::parse("postgres ://u:hunter2@h/db").err();
        assert!(err.is_some_and(|e| !e.contains("hunter2")));
    }
}
