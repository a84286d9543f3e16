//! Verifying a provider's tokens: the ID token of a sign-in and, where a
//! provider's access tokens are accepted, those.
//!
//! The key decides the algorithm ([`super::jwks`]): a token's `alg` must be
//! one its key allows, so `none`, HS256 over a public key, or an RSA
//! algorithm with an EC key never verify. Then `iss` equal to the issuer,
//! `aud` holding the expected audience, `exp` and `nbf` (a minute's leeway
//! for clocks), `iat` not in the future; for an ID token, `azp` equal to
//! the client id when present (and required when `aud` names several), and
//! `nonce` equal to the one the sign-in sent, compared in constant time.

use std::collections::HashSet;

use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Validation, decode, decode_header};
use serde_json::{Map, Value};

use super::jwks::{KeyCache, KeyError, KeySource};

/// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: u64 = 60;

/// The claims of a verified token.
pub type Claims = Map<String, Value>;

/// Why a provider's token was refused; the message names no claim value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("malformed token")]
    Malformed,
    #[error("{0}")]
    Key(KeyError),
    #[error("the token's algorithm is not its key's")]
    Algorithm,
    #[error("signature does not match")]
    Signature,
    #[error("wrong issuer")]
    Issuer,
    #[error("wrong audience")]
    Audience,
    #[error("authorized party is not this client")]
    AuthorizedParty,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet")]
    NotYetValid,
    #[error("issued in the future")]
    IssuedAt,
    #[error("nonce does not match")]
    Nonce,
}

/// What a token must show.
pub struct Expected<'a> {
    pub issuer: &'a str,
    /// A value `aud` must hold.
    pub audience: &'a str,
    /// An ID token: the client id `azp` must equal, and the sign-in's nonce.
    pub id_token: Option<IdToken<'a>>,
}

/// What only an ID token must show.
pub struct IdToken<'a> {
    pub client_id: &'a str,
    pub nonce: &'a str,
}

/// Header members that would have a verifier fetch or trust a key the
/// token names itself, or obey extensions it does not know.
const REFUSED_HEADER_MEMBERS: [&str; 5] = ["crit", "jku", "x5u", "x5c", "jwk"];

/// `token` verified with `keys` (fetched from `source` when it names a key
/// not held) against `expected`, at `now` (epoch seconds).
pub async fn verify(
    token: &str,
    keys: &KeyCache,
    source: &impl KeySource,
    expected: &Expected<'_>,
    now: i64,
) -> Result<Claims, TokenRefusal> {
    check_header(token)?;
    let header = decode_header(token).map_err(|_| TokenRefusal::Malformed)?;
    let key = keys
        .key(header.kid.as_deref(), source)
        .await
        .map_err(TokenRefusal::Key)?;
    if !key.algorithms.contains(&header.alg) {
        return Err(TokenRefusal::Algorithm);
    }
    let mut validation = Validation::new(header.alg);
    validation.algorithms = vec![header.alg];
    validation.leeway = LEEWAY_SECS;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.set_issuer(&[expected.issuer]);
    validation.aud = Some(HashSet::from([expected.audience.to_owned()]));
    validation.validate_aud = true;
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let claims = decode::<Claims>(token, &key.key, &validation)
        .map_err(|e| refusal(e.kind()))?
        .claims;
    check_claims(&claims, expected, now)?;
    Ok(claims)
}

fn refusal(kind: &ErrorKind) -> TokenRefusal {
    match kind {
        ErrorKind::ExpiredSignature => TokenRefusal::Expired,
        ErrorKind::ImmatureSignature => TokenRefusal::NotYetValid,
        ErrorKind::InvalidSignature => TokenRefusal::Signature,
        ErrorKind::InvalidIssuer => TokenRefusal::Issuer,
        ErrorKind::InvalidAudience => TokenRefusal::Audience,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => TokenRefusal::Algorithm,
        _ => TokenRefusal::Malformed,
    }
}

/// What the library does not check: `iat`, and an ID token's `azp` and `nonce`.
fn check_claims(claims: &Claims, expected: &Expected<'_>, now: i64) -> Result<(), TokenRefusal> {
    let iat = claims
        .get("iat")
        .and_then(Value::as_i64)
        .ok_or(TokenRefusal::Malformed)?;
    if iat > now.saturating_add(LEEWAY_SECS as i64) {
        return Err(TokenRefusal::IssuedAt);
    }
    let Some(id) = &expected.id_token else {
        return Ok(());
    };
    let several_audiences = claims
        .get("aud")
        .and_then(Value::as_array)
        .is_some_and(|aud| aud.len() > 1);
    match claims.get("azp") {
        Some(Value::String(azp)) if azp == id.client_id => {}
        None if !several_audiences => {}
        _ => return Err(TokenRefusal::AuthorizedParty),
    }
    let nonce = claims
        .get("nonce")
        .and_then(Value::as_str)
        .ok_or(TokenRefusal::Nonce)?;
    aws_lc_rs::constant_time::verify_slices_are_equal(nonce.as_bytes(), id.nonce.as_bytes())
        .map_err(|_| TokenRefusal::Nonce)
}

/// Refuses, before any key is looked up, a header naming a key or an
/// extension ([`REFUSED_HEADER_MEMBERS`]), a nested token (`cty`), or a
/// `typ` other than a JWT's or an access token's (RFC 9068).
fn check_header(token: &str) -> Result<(), TokenRefusal> {
    let header: Map<String, Value> = part(token, 0).ok_or(TokenRefusal::Malformed)?;
    let refused = REFUSED_HEADER_MEMBERS
        .iter()
        .any(|name| header.contains_key(*name));
    let typ_ok = header.get("typ").is_none_or(|typ| {
        typ.as_str().is_some_and(|typ| {
            typ.eq_ignore_ascii_case("JWT")
                || typ.eq_ignore_ascii_case("at+jwt")
                || typ.eq_ignore_ascii_case("application/at+jwt")
        })
    });
    if refused || !typ_ok || header.contains_key("cty") {
        return Err(TokenRefusal::Malformed);
    }
    Ok(())
}

/// The `index`th dot-separated part of a compact JWT, decoded as JSON.
fn part<T: serde::de::DeserializeOwned>(token: &str, index: usize) -> Option<T> {
    let mut parts = token.split('.');
    let encoded = parts.nth(index)?;
    if token.split('.').count() != 3 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The `iss` a bearer token claims, before anything is verified: it only
/// chooses which verifier hears the token, each verifying its own issuer.
pub fn claimed_issuer(token: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Issuer {
        iss: Option<String>,
    }
    part::<Issuer>(token, 1)?.iss
}
