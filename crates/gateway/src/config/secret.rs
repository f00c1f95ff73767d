//! Values that must not reach logs: [`Secret`] (the admin token), whose
//! `Debug` prints `***`, and [`redact_text`], which hides the password of a
//! URL (a store URL) in messages: the user-info password, and the query
//! parameters the drivers read a password from (`password`, `pass`,
//! `sslpassword`).
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

/// Query parameters that carry a password: PostgreSQL's `password` and
/// `sslpassword` (libpq, sqlx), Redis's `pass` (redis-rs).
const SECRET_PARAMS: [&str; 3] = ["password", "pass", "sslpassword"];

fn is_secret_param(name: &str) -> bool {
    SECRET_PARAMS
        .iter()
        .any(|p| p.eq_ignore_ascii_case(name.trim()))
}

/// Replaces a password in URL-like text, for messages. Text that is not a
/// URL loses its whole user-info part (`scheme://***@host…`): it may be a
/// mistyped URL with a real password in it.
pub(super) fn redact_text(s: &str) -> String {
    match Url::parse(s) {
        Ok(mut u) => {
            let secret_query = u.query_pairs().any(|(k, _)| is_secret_param(&k));
            if u.password().is_none() && !secret_query {
                return s.to_owned();
            }
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            if secret_query {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_param(&k) {
                            "***".to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => {
            let s = match (s.find("://"), s.rfind('@')) {
                (Some(scheme_end), Some(at)) if at > scheme_end + 3 => {
                    format!("{}***{}", &s[..scheme_end + 3], &s[at..])
                }
                _ => s.to_owned(),
            };
            redact_query_text(&s)
        }
    }
}

/// Hides secret parameters in the query of text that is not a URL.
fn redact_query_text(s: &str) -> String {
    let Some((head, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
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

    #[test]
    fn passwords_in_query_parameters_do_not_show() {
        assert_eq!(
            redact_text("postgres://u@h/db?schema=s&password=hunter2&sslmode=require"),
            "postgres://u@h/db?schema=s&password=***&sslmode=require"
        );
        assert_eq!(
            redact_text("postgres://u:hunter2@h/db?sslpassword=hunter3"),
            "postgres://u:***@h/db?sslpassword=***"
        );
        assert_eq!(
            redact_text("redis://h:6379/?pass=hunter2&prefix=p"),
            "redis://h:6379/?pass=***&prefix=p"
        );
        assert_eq!(
            redact_text("postgres ://h/db?PASSWORD=hunter2&x=1"),
            "postgres ://h/db?PASSWORD=***&x=1"
        );
        assert_eq!(
            redact_text("redis://h:6379/?prefix=passport"),
            "redis://h:6379/?prefix=passport"
        );
    }
}
