//! Parsing the credential a request presents into a typed [`Credential`].
//!
//! Pure: no I/O, no allocation beyond the value itself. Rules (contract,
//! "Credentials on a request"): `X-Authorization` is read first, `Authorization`
//! only when `X-Authorization` is absent or blank; the value is `Bearer <jwt>` or
//! `ApiKey <key>` with exactly one space; anything else, a repeated header or two
//! values joined by a comma is refused.

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};

pub use crate::identity::X_AUTHORIZATION;

/// Longest credential value accepted; real keys and tokens are far shorter.
const MAX_VALUE_LEN: usize = 8 * 1024;

/// A secret taken from a request. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What a request claims to be, before verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    Bearer(Secret),
    ApiKey(Secret),
}

/// Why no credential could be read. Both answer 401 "Authentication failed";
/// they differ only in the metric they count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("no credentials")]
    Missing,
    #[error("malformed credentials")]
    Malformed,
}

/// Reads the request's credential header.
pub fn parse(headers: &HeaderMap) -> Result<Credential, CredentialError> {
    let value = match single_value(headers, &X_AUTHORIZATION)? {
        Some(value) if !is_blank(value) => value,
        _ => match single_value(headers, &AUTHORIZATION)? {
            Some(value) if !is_blank(value) => value,
            _ => return Err(CredentialError::Missing),
        },
    };
    parse_value(value)
}

/// The header's only value; a repeated header is malformed.
fn single_value<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a [u8]>, CredentialError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(CredentialError::Malformed);
    }
    Ok(first.map(|v| v.as_bytes()))
}

fn is_blank(value: &[u8]) -> bool {
    value.iter().all(|b| *b == b' ' || *b == b'\t')
}

/// Parses one header value: `Bearer <v>` or `ApiKey <v>`.
pub(crate) fn parse_value(value: &[u8]) -> Result<Credential, CredentialError> {
    let (scheme, rest) = match value.iter().position(|b| *b == b' ') {
        Some(i) => (&value[..i], &value[i + 1..]),
        None => return Err(CredentialError::Malformed),
    };
    if rest.is_empty() || rest.len() > MAX_VALUE_LEN || !rest.iter().all(|b| is_token_byte(*b)) {
        return Err(CredentialError::Malformed);
    }
    // Only visible ASCII without ',' passed the check, so this cannot fail.
    let secret = std::str::from_utf8(rest).map_err(|_| CredentialError::Malformed)?;
    match scheme {
        b"Bearer" => Ok(Credential::Bearer(Secret::new(secret))),
        b"ApiKey" => Ok(Credential::ApiKey(Secret::new(secret))),
        _ => Err(CredentialError::Malformed),
    }
}

/// Visible ASCII except the comma that would join two values.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_graphic() && b != b','
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn parsed(pairs: &[(&str, &str)]) -> Result<Credential, CredentialError> {
        parse(&headers(pairs))
    }

    #[test]
    fn bearer_and_api_key_are_read_from_x_authorization() {
        assert_eq!(
            parsed(&[("X-Authorization", "Bearer abc.def.ghi")]),
            Ok(Credential::Bearer(Secret::new("abc.def.ghi")))
        );
        assert_eq!(
            parsed(&[("x-authorization", "ApiKey tb_xyz-_")]),
            Ok(Credential::ApiKey(Secret::new("tb_xyz-_")))
        );
    }

    #[test]
    fn authorization_is_read_only_when_x_authorization_is_absent_or_blank() {
        assert_eq!(
            parsed(&[("Authorization", "ApiKey k1")]),
            Ok(Credential::ApiKey(Secret::new("k1")))
        );
        assert_eq!(
            parsed(&[("X-Authorization", "  "), ("Authorization", "Bearer t")]),
            Ok(Credential::Bearer(Secret::new("t")))
        );
        assert_eq!(
            parsed(&[
                ("X-Authorization", "ApiKey k1"),
                ("Authorization", "Bearer t")
            ]),
            Ok(Credential::ApiKey(Secret::new("k1")))
        );
    }

    #[test]
    fn no_credential_is_missing() {
        assert_eq!(parsed(&[]), Err(CredentialError::Missing));
        assert_eq!(
            parsed(&[("X-Authorization", "")]),
            Err(CredentialError::Missing)
        );
        assert_eq!(
            parsed(&[("X-Authorization", " "), ("Authorization", "")]),
            Err(CredentialError::Missing)
        );
    }

    #[test]
    fn malformed_shapes_are_refused() {
        for value in [
            "Bearer",
            "Bearer ",
            "Bearer  two-spaces",
            "bearer lower",
            "BEARER upper",
            "Basic dXNlcjpwYXNz",
            "ApiKey",
            "ApiKey a b",
            "ApiKey a,ApiKey b",
            "Bearer a,b",
            "ApiKey\tk",
            "Token x",
            "ApiKeyk",
            " ApiKey k",
            "ApiKey k ",
        ] {
            assert_eq!(
                parsed(&[("X-Authorization", value)]),
                Err(CredentialError::Malformed),
                "{value:?}"
            );
        }
    }

    #[test]
    fn repeated_header_is_refused() {
        assert_eq!(
            parsed(&[
                ("X-Authorization", "ApiKey a"),
                ("X-Authorization", "ApiKey b")
            ]),
            Err(CredentialError::Malformed)
        );
        assert_eq!(
            parsed(&[("Authorization", "ApiKey a"), ("Authorization", "ApiKey a")]),
            Err(CredentialError::Malformed)
        );
    }

    #[test]
    fn non_ascii_and_oversized_values_are_refused() {
        let mut map = HeaderMap::new();
        map.insert(
            &X_AUTHORIZATION,
            HeaderValue::from_bytes(b"ApiKey \xff\xfe").unwrap(),
        );
        assert_eq!(parse(&map), Err(CredentialError::Malformed));
        let long = format!("ApiKey {}", "a".repeat(MAX_VALUE_LEN + 1));
        assert_eq!(
            parsed(&[("X-Authorization", &long)]),
            Err(CredentialError::Malformed)
        );
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let credential = Credential::ApiKey(Secret::new("tb_very_secret"));
        assert!(!format!("{credential:?}").contains("very_secret"));
    }

    /// Hostile header values, for the property tests and `fuzz/run`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn scheme() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                Just(b"ApiKey".to_vec()),
                Just(b"Bearer".to_vec()),
                Just(b"apikey".to_vec()),
                Just(b"Basic".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..8),
            ]
        }

        fn header_value() -> impl Strategy<Value = Vec<u8>> {
            (
                scheme(),
                proptest::collection::vec(any::<u8>(), 0..3),
                proptest::collection::vec(any::<u8>(), 0..MAX_VALUE_LEN + 8),
            )
                .prop_map(|(scheme, separator, rest)| [scheme, separator, rest].concat())
        }

        proptest! {
            #[test]
            fn any_header_value_is_read_exactly_or_refused(value in header_value()) {
                match parse_value(&value) {
                    Ok(Credential::ApiKey(secret)) => {
                        prop_assert_eq!([b"ApiKey ", secret.expose().as_bytes()].concat(), value);
                    }
                    Ok(Credential::Bearer(secret)) => {
                        prop_assert_eq!([b"Bearer ", secret.expose().as_bytes()].concat(), value);
                    }
                    Err(_) => {}
                }
            }

            #[test]
            fn a_read_secret_is_visible_ascii_without_separators(value in header_value()) {
                if let Ok(Credential::ApiKey(s) | Credential::Bearer(s)) = parse_value(&value) {
                    let secret = s.expose();
                    prop_assert!(!secret.is_empty() && secret.len() <= MAX_VALUE_LEN);
                    prop_assert!(secret.bytes().all(|b| b.is_ascii_graphic() && b != b','));
                }
            }

            #[test]
            fn every_well_formed_key_is_read_back(secret in "[!-+--~]{1,64}") {
                let value = format!("ApiKey {secret}");
                prop_assert_eq!(
                    parse_value(value.as_bytes()),
                    Ok(Credential::ApiKey(Secret::new(secret)))
                );
            }
        }
    }
}
