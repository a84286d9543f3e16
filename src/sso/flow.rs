//! One sign-in's state between the authorization redirect and the
//! callback, kept in the browser: the cookie `keygate_oauth2`, signed with
//! HMAC-SHA256 under a key derived from keygate's token signing key, holding
//! the provider, the `state`, the `nonce`, the PKCE verifier and when it
//! expires, so any replica takes the callback. What the server keeps is
//! which sign-ins have ended: the callback takes each one once, recording
//! its [`Flow::state_digest`] in the store until the cookie expires, so a
//! saved cookie never ends a second sign-in.
//!
//! The cookie is `HttpOnly; Secure; SameSite=Lax` (the callback is a
//! top-level GET from the provider, which Lax lets through) and scoped to
//! `/login/oauth2/`, the callback's path.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// The cookie's name.
pub const COOKIE: &str = "keygate_oauth2";

/// The cookie's path: the callback's.
pub const COOKIE_PATH: &str = "/login/oauth2/";

/// How long a sign-in may take, in seconds.
pub const LIFETIME_SECS: i64 = 600;

/// A sign-in under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flow {
    /// The provider's `name`.
    #[serde(rename = "p")]
    pub provider: String,
    #[serde(rename = "s")]
    pub state: String,
    #[serde(rename = "n")]
    pub nonce: String,
    /// The PKCE code verifier (RFC 7636).
    #[serde(rename = "v")]
    pub verifier: String,
    /// Epoch seconds.
    #[serde(rename = "e")]
    pub expires: i64,
}

/// Why a callback's cookie was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    #[error("no sign-in cookie")]
    Missing,
    #[error("the sign-in cookie is not keygate's")]
    Forged,
    #[error("the sign-in expired")]
    Expired,
    #[error("state does not match")]
    State,
    /// Its callback was taken before (here or on another replica).
    #[error("the sign-in was already used")]
    Used,
}

impl Flow {
    /// A new sign-in with `provider`, at `now` (epoch seconds): fresh
    /// random state, nonce and verifier.
    pub fn start(provider: &str, now: i64) -> Result<Flow, aws_lc_rs::error::Unspecified> {
        Ok(Flow {
            provider: provider.to_owned(),
            state: random_text(24)?,
            nonce: random_text(24)?,
            verifier: random_text(48)?,
            expires: now + LIFETIME_SECS,
        })
    }

    /// The PKCE S256 challenge of the verifier.
    pub fn challenge(&self) -> String {
        let digest =
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, self.verifier.as_bytes());
        URL_SAFE_NO_PAD.encode(digest.as_ref())
    }

    /// What the store remembers of a used sign-in: SHA-256 of its state,
    /// base64url (the state itself stays in the browser).
    pub fn state_digest(&self) -> String {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, self.state.as_bytes());
        URL_SAFE_NO_PAD.encode(digest.as_ref())
    }

    /// When the cookie expires, in epoch milliseconds.
    pub fn expires_ms(&self) -> i64 {
        self.expires.saturating_mul(1000)
    }

    /// The cookie's value: the state as JSON, then its MAC, each base64url.
    pub fn seal(&self, key: &CookieKey) -> String {
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default());
        let tag = aws_lc_rs::hmac::sign(&key.0, payload.as_bytes());
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The sign-in `value` holds, if keygate sealed it, it has not expired at
    /// `now`, and its state is `state` (compared in constant time).
    pub fn open(
        value: Option<&str>,
        key: &CookieKey,
        state: &str,
        now: i64,
    ) -> Result<Flow, FlowError> {
        let value = value.ok_or(FlowError::Missing)?;
        let (payload, tag) = value.split_once('.').ok_or(FlowError::Forged)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| FlowError::Forged)?;
        aws_lc_rs::hmac::verify(&key.0, payload.as_bytes(), &tag).map_err(|_| FlowError::Forged)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| FlowError::Forged)?;
        let flow: Flow = serde_json::from_slice(&bytes).map_err(|_| FlowError::Forged)?;
        if now >= flow.expires {
            return Err(FlowError::Expired);
        }
        aws_lc_rs::constant_time::verify_slices_are_equal(flow.state.as_bytes(), state.as_bytes())
            .map_err(|_| FlowError::State)?;
        Ok(flow)
    }
}

/// The `Set-Cookie` value that stores `sealed`.
pub fn set_cookie(sealed: &str) -> String {
    format!(
        "{COOKIE}={sealed}; Path={COOKIE_PATH}; Max-Age={LIFETIME_SECS}; HttpOnly; Secure; SameSite=Lax"
    )
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path={COOKIE_PATH}; Max-Age=0; HttpOnly; Secure; SameSite=Lax")
}

/// The cookie's value among a request's `Cookie` headers; `None` when it
/// is absent or set twice (a second one could be an attacker's).
pub fn find_cookie<'a>(headers: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut found = None;
    for header in headers {
        for pair in header.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=')
                && name == COOKIE
            {
                if found.is_some() {
                    return None;
                }
                found = Some(value);
            }
        }
    }
    found
}

/// The key cookies are signed with.
pub struct CookieKey(aws_lc_rs::hmac::Key);

impl CookieKey {
    /// The key derived from `secret` (keygate's token signing key): an
    /// HMAC of a label, so the cookie key signs nothing else and reveals
    /// nothing of the signing key.
    pub fn derive(secret: &[u8]) -> CookieKey {
        let root = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
        let derived = aws_lc_rs::hmac::sign(&root, b"keygate single sign-on cookie v1");
        CookieKey(aws_lc_rs::hmac::Key::new(
            aws_lc_rs::hmac::HMAC_SHA256,
            derived.as_ref(),
        ))
    }
}

impl std::fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieKey(<redacted>)")
    }
}

/// `bytes` random bytes as base64url text.
fn random_text(bytes: usize) -> Result<String, aws_lc_rs::error::Unspecified> {
    let mut buffer = vec![0u8; bytes];
    aws_lc_rs::rand::fill(&mut buffer)?;
    Ok(URL_SAFE_NO_PAD.encode(buffer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_flow_opens_with_its_state_until_it_expires() {
        let key = CookieKey::derive(b"signing key");
        let flow = Flow::start("corp", 1000).unwrap();
        let sealed = flow.seal(&key);
        assert!(
            !sealed.contains(&flow.verifier),
            "the verifier is not in clear text form"
        );
        assert_eq!(
            Flow::open(Some(&sealed), &key, &flow.state, 1599),
            Ok(flow.clone())
        );
        assert_eq!(
            Flow::open(Some(&sealed), &key, &flow.state, 1600),
            Err(FlowError::Expired)
        );
        assert_eq!(
            Flow::open(Some(&sealed), &key, "other", 1001),
            Err(FlowError::State)
        );
        assert_eq!(
            Flow::open(None, &key, &flow.state, 1001),
            Err(FlowError::Missing)
        );
    }

    #[test]
    fn a_tampered_or_foreign_cookie_is_refused() {
        let key = CookieKey::derive(b"signing key");
        let flow = Flow::start("corp", 1000).unwrap();
        let sealed = flow.seal(&key);
        let other = CookieKey::derive(b"another key");
        assert_eq!(
            Flow::open(Some(&sealed), &other, &flow.state, 1001),
            Err(FlowError::Forged)
        );
        // A payload changed to last longer, with the old tag.
        let (_, tag) = sealed.split_once('.').unwrap();
        let longer = Flow {
            expires: 9_999_999_999,
            ..flow.clone()
        };
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&longer).unwrap());
        assert_eq!(
            Flow::open(Some(&format!("{payload}.{tag}")), &key, &flow.state, 1001),
            Err(FlowError::Forged)
        );
        for junk in ["", ".", "abc", "a.b", "%%%.%%%"] {
            assert_eq!(
                Flow::open(Some(junk), &key, &flow.state, 1001),
                Err(FlowError::Forged)
            );
        }
    }

    #[test]
    fn the_challenge_is_s256_of_the_verifier() {
        // RFC 7636 appendix B.
        let flow = Flow {
            provider: "p".into(),
            state: "s".into(),
            nonce: "n".into(),
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
            expires: 0,
        };
        assert_eq!(
            flow.challenge(),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn the_state_digest_names_the_state_without_showing_it() {
        let flow = Flow::start("corp", 1000).unwrap();
        let digest = flow.state_digest();
        assert_eq!(digest.len(), 43);
        assert!(!digest.contains(&flow.state));
        assert_eq!(digest, flow.clone().state_digest());
        let other = Flow::start("corp", 1000).unwrap();
        assert_ne!(other.state_digest(), digest);
        assert_eq!(flow.expires_ms(), 1_600_000);
    }

    #[test]
    fn the_cookie_is_found_once_or_not_at_all() {
        assert_eq!(
            find_cookie(["a=1; keygate_oauth2=v.t; b=2"].into_iter()),
            Some("v.t")
        );
        assert_eq!(find_cookie(["a=1"].into_iter()), None);
        assert_eq!(
            find_cookie(["keygate_oauth2=x.y", "keygate_oauth2=z.w"].into_iter()),
            None
        );
        let set = set_cookie("v.t");
        for part in [
            "HttpOnly",
            "Secure",
            "SameSite=Lax",
            "Path=/login/oauth2/",
            "Max-Age=600",
        ] {
            assert!(set.contains(part), "{set}");
        }
        assert!(clear_cookie().contains("Max-Age=0"));
    }
}
