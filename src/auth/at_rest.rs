//! Second-factor secrets at rest: TOTP secrets sealed with AES-256-GCM, and
//! backup codes kept as keyed digests, under keys derived (HKDF-SHA256) from
//! a configured secret. Old secrets stay usable for reading, so the secret
//! can be rotated: what was sealed under an old one is resealed under the
//! current one the next time it is written.
//!
//! A sealed value is `v1.<key id>.<Base64url(nonce ‖ ciphertext ‖ tag)>`, its
//! associated data binding it to one user and one purpose, so a row copied
//! onto another user does not open. A backup code digest is
//! `<key id>.<hex HMAC-SHA256(user ‖ code)>`.
//!
//! The same secret also works out one-time tokens that must be shown again
//! while they are valid (an activation link, [`Sealer::derive`]), so the
//! store keeps only their digests.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::{constant_time, hkdf, hmac};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use uuid::Uuid;

const SALT: &[u8] = b"keygate second factor at rest";

/// Keys derived from one secret.
struct KeySet {
    /// Names the secret in what it sealed, without revealing it.
    id: String,
    aead: LessSafeKey,
    codes: hmac::Key,
    derived: hmac::Key,
}

impl KeySet {
    fn derive(secret: &[u8]) -> KeySet {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(secret);
        let expand = |info: &'static [u8]| {
            let mut out = [0u8; 32];
            let info = [info];
            let okm = prk
                .expand(&info, hkdf::HKDF_SHA256)
                .expect("32 bytes is a valid HKDF-SHA256 output length");
            okm.fill(&mut out)
                .expect("32 bytes is a valid HKDF-SHA256 output length");
            out
        };
        let aead_key = expand(b"aes-256-gcm");
        let id_key = expand(b"key id");
        KeySet {
            id: hex(&id_key[..4]),
            aead: LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &aead_key).expect("a 32-byte AES-256 key"),
            ),
            codes: hmac::Key::new(hmac::HMAC_SHA256, &expand(b"backup codes")),
            derived: hmac::Key::new(hmac::HMAC_SHA512, &expand(b"derived tokens")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("sealed under a secret that is no longer configured")]
    UnknownKey,
    #[error("sealed value is damaged or belongs elsewhere")]
    Damaged,
    #[error("no randomness")]
    Random,
}

/// Seals and opens second-factor secrets; the first key is current.
pub struct Sealer {
    keys: Vec<KeySet>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl Sealer {
    /// `current` seals; it and every one of `old` open.
    pub fn new(current: &[u8], old: &[Vec<u8>]) -> Sealer {
        let mut keys = vec![KeySet::derive(current)];
        keys.extend(old.iter().map(|secret| KeySet::derive(secret)));
        Sealer { keys }
    }

    /// The sealer of `[two_factor]`: its `encryption_secret`, else
    /// `fallback` (the token signing key), with the old secrets.
    pub fn configured(settings: &crate::config::TwoFactorSettings, fallback: &[u8]) -> Sealer {
        let current = settings.encryption_secret.as_deref().unwrap_or(fallback);
        Sealer::new(current, &settings.old_encryption_secrets)
    }

    fn key(&self, id: &str) -> Option<&KeySet> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Seals `plain` for `user` and `purpose`.
    pub fn seal(&self, user: Uuid, purpose: &str, plain: &[u8]) -> Result<String, SealError> {
        let key = &self.keys[0];
        let nonce_bytes: [u8; NONCE_LEN] =
            super::api_key::random_bytes().map_err(|_| SealError::Random)?;
        let mut buffer = plain.to_vec();
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(associated(user, purpose).as_bytes()),
                &mut buffer,
            )
            .map_err(|_| SealError::Damaged)?;
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&buffer);
        Ok(format!("v1.{}.{}", key.id, URL_SAFE_NO_PAD.encode(out)))
    }

    /// Opens what [`Sealer::seal`] sealed for the same user and purpose.
    pub fn open(&self, user: Uuid, purpose: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SealError::Damaged);
        };
        let key = self.key(id).ok_or(SealError::UnknownKey)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Damaged)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Damaged);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Damaged)?;
        let mut buffer = sealed.to_vec();
        let plain = key
            .aead
            .open_in_place(
                nonce,
                Aad::from(associated(user, purpose).as_bytes()),
                &mut buffer,
            )
            .map_err(|_| SealError::Damaged)?;
        Ok(plain.to_vec())
    }

    /// The digest a backup code is stored as, under the current key.
    pub fn code_digest(&self, user: Uuid, code: &str) -> String {
        let key = &self.keys[0];
        format!("{}.{}", key.id, code_mac(key, user, code))
    }

    /// Is `digest` the digest of `code` for `user` (under any configured key)?
    pub fn code_matches(&self, user: Uuid, code: &str, digest: &str) -> bool {
        let Some((id, mac)) = digest.split_once('.') else {
            return false;
        };
        let Some(key) = self.key(id) else {
            return false;
        };
        constant_time::verify_slices_are_equal(code_mac(key, user, code).as_bytes(), mac.as_bytes())
            .is_ok()
    }

    /// A 64-byte secret for `user` and `purpose`, worked out from `context`
    /// under the current key: the same inputs give the same secret while
    /// that key is current, and no one without it can work it out.
    pub fn derive(&self, user: Uuid, purpose: &str, context: &[u8]) -> [u8; 64] {
        let mut message = associated(user, purpose).into_bytes();
        message.push(0);
        message.extend_from_slice(context);
        let tag = hmac::sign(&self.keys[0].derived, &message);
        let mut out = [0u8; 64];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Was `sealed` sealed under an old key (to be resealed)?
    pub fn is_stale(&self, sealed: &str) -> bool {
        let id = sealed.split('.').find(|part| *part != "v1");
        id != Some(self.keys[0].id.as_str())
    }
}

fn associated(user: Uuid, purpose: &str) -> String {
    format!("keygate/2fa/{purpose}/{user}")
}

fn code_mac(key: &KeySet, user: Uuid, code: &str) -> String {
    let mut message = user.as_bytes().to_vec();
    message.extend_from_slice(code.as_bytes());
    hex(hmac::sign(&key.codes, &message).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: Uuid = Uuid::from_u128(7);

    #[test]
    fn derived_tokens_repeat_for_the_same_inputs_and_differ_for_any_other() {
        let sealer = Sealer::new(b"current secret", &[]);
        let token = sealer.derive(USER, "activation", b"1700000000000");
        assert_eq!(token, sealer.derive(USER, "activation", b"1700000000000"));
        for other in [
            sealer.derive(Uuid::from_u128(8), "activation", b"1700000000000"),
            sealer.derive(USER, "reset", b"1700000000000"),
            sealer.derive(USER, "activation", b"1700000000001"),
            Sealer::new(b"another secret", &[]).derive(USER, "activation", b"1700000000000"),
        ] {
            assert_ne!(token, other);
        }
    }

    #[test]
    fn sealed_secrets_open_only_for_their_user_and_purpose() {
        let sealer = Sealer::new(b"current secret", &[]);
        let sealed = sealer.seal(USER, "totp", b"raw secret").unwrap();
        assert!(sealed.starts_with("v1."));
        assert!(!sealed.contains("raw secret"));
        assert_eq!(sealer.open(USER, "totp", &sealed).unwrap(), b"raw secret");
        assert_eq!(
            sealer.open(Uuid::from_u128(8), "totp", &sealed),
            Err(SealError::Damaged)
        );
        assert_eq!(sealer.open(USER, "other", &sealed), Err(SealError::Damaged));
        let mut tampered = sealed.clone();
        tampered.pop();
        tampered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(sealer.open(USER, "totp", &tampered).is_err());
        assert_ne!(
            sealer.seal(USER, "totp", b"raw secret").unwrap(),
            sealed,
            "every seal has its own nonce"
        );
    }

    #[test]
    fn rotation_opens_old_values_and_marks_them_stale() {
        let old = Sealer::new(b"old secret", &[]);
        let sealed = old.seal(USER, "totp", b"raw").unwrap();
        let digest = old.code_digest(USER, "0123abcd");
        let rotated = Sealer::new(b"new secret", &[b"old secret".to_vec()]);
        assert_eq!(rotated.open(USER, "totp", &sealed).unwrap(), b"raw");
        assert!(rotated.is_stale(&sealed));
        assert!(rotated.code_matches(USER, "0123abcd", &digest));
        let fresh = rotated.seal(USER, "totp", b"raw").unwrap();
        assert!(!rotated.is_stale(&fresh));
        let forgotten = Sealer::new(b"new secret", &[]);
        assert_eq!(
            forgotten.open(USER, "totp", &sealed),
            Err(SealError::UnknownKey)
        );
    }

    #[test]
    fn code_digests_are_keyed_and_per_user() {
        let sealer = Sealer::new(b"secret", &[]);
        let digest = sealer.code_digest(USER, "0123abcd");
        assert!(!digest.contains("0123abcd"));
        assert!(sealer.code_matches(USER, "0123abcd", &digest));
        assert!(!sealer.code_matches(USER, "0123abce", &digest));
        assert!(!sealer.code_matches(Uuid::from_u128(8), "0123abcd", &digest));
        assert!(!Sealer::new(b"other", &[]).code_matches(USER, "0123abcd", &digest));
    }
}
