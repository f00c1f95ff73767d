//! Values that must not reach logs: [`Secret`] (the admin token), whose
//! `Debug` prints `***`, and [`redact_text`], which hides the password of a
//! URL (a store URL) in messages.
//!
//! Configuration is logged and printed (`Debug` of a whole
//! [`GatewayConfig`](super::GatewayConfig), the store in `gateway started`),
//! so hiding has to be the types' own behaviour, not each caller's care.

use std::fmt;

use url::Url;

/// A secret that `Debug` does not print.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself; compare it in constant time.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Replaces a password in URL-like text, for messages. Text that is not a
/// URL loses its whole user-info part (`scheme://***@host…`): it may be a
/// mistyped URL with a real password in it.
pub(super) fn redact_text(s: &str) -> String {
    match Url::parse(s) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => s.to_owned(),
        Err(_) => match (s.find("://"), s.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end + 3 => {
                format!("{}***{}", &s[..scheme_end + 3], &s[at..])
            }
            _ => s.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_show() {
        let s = Secret::new("hunter2");
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(
            redact_text("postgres://u:hunter2@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_text("sqlite:x.db"), "sqlite:x.db");
        assert_eq!(
            redact_text("postgres ://u:hunter2@h/db"),
            "postgres ://***@h/db"
        );
    }
}
