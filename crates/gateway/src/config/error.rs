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
    Load(#[from] Box<figment::Error>),
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

    /// The field the error is about, when it names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Load(e) => e.path.last().map(String::as_str),
            Self::MissingFile(_) => None,
        }
    }
}
