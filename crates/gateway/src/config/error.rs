//! [`ConfigError`]: why a configuration was refused.
//!
//! A leaf of the configuration: every phase (reading the sources, the small
//! parsers, the validation of routes) reports through it, and an error
//! always names the field it is about (`routes[1].timeouts.idle`), so a bad
//! file is fixed from the message alone.

use std::path::PathBuf;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A source could not be read or parsed (TOML syntax, wrong value type,
    /// unknown field). The message names the key and the source.
    #[error("configuration: {0}")]
    Load(#[source] Box<figment::Error>),
    /// The configuration file does not exist.
    #[error("configuration file {0} not found")]
    MissingFile(PathBuf),
    /// A value was read but is not valid.
    #[error("configuration field `{field}`: {message}")]
    Invalid {
        /// Path of the offending field, e.g. `routes[0].timeouts.idle`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    pub(super) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A source's error: a value that is not one of a mode's names
    /// (`on_inflight = "queue"`) is [`ConfigError::Invalid`], naming the
    /// field by its path (`routes[0].on_inflight`) and the names accepted,
    /// whichever source it came from; anything else is
    /// [`ConfigError::Load`].
    fn from_figment(e: Box<figment::Error>) -> Self {
        if let figment::error::Kind::UnknownVariant(found, expected) = &e.kind
            && e.count() == 1
            && !e.path.is_empty()
        {
            return Self::invalid(
                field_path(&e.path),
                format!("`{found}`: expected {}", one_of(expected)),
            );
        }
        Self::Load(e)
    }

    /// The field the error is about, when it names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Load(e) => e.path.last().map(String::as_str),
            Self::MissingFile(_) => None,
        }
    }
}

impl From<Box<figment::Error>> for ConfigError {
    fn from(e: Box<figment::Error>) -> Self {
        Self::from_figment(e)
    }
}

/// A figment key path as the configuration's messages write it:
/// `["routes", "0", "on_inflight"]` is `routes[0].on_inflight`.
fn field_path(path: &[String]) -> String {
    let mut out = String::new();
    for part in path {
        if part.bytes().all(|b| b.is_ascii_digit()) && !out.is_empty() {
            out.push('[');
            out.push_str(part);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

/// `` `a` ``, `` `a` or `b` ``, `` `a`, `b` or `c` ``.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        None => "nothing".to_owned(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names_are_written_as_in_the_file() {
        let path = |p: &[&str]| field_path(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            path(&["routes", "0", "on_inflight"]),
            "routes[0].on_inflight"
        );
        assert_eq!(
            path(&["routes", "12", "client_retry", "jitter"]),
            "routes[12].client_retry.jitter"
        );
        assert_eq!(path(&["client_retry", "jitter"]), "client_retry.jitter");
        assert_eq!(one_of(&["none"]), "`none`");
        assert_eq!(one_of(&["a", "b"]), "`a` or `b`");
        assert_eq!(one_of(&["a", "b", "c"]), "`a`, `b` or `c`");
    }
}
