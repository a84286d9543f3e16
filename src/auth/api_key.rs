//! API key values: generation and the digest under which they are stored and cached.
//!
//! A key is the configured prefix followed by base64url (no padding) of 64
//! random bytes. Only its SHA-256 digest is ever stored; lookups are by digest,
//! so no comparison of secret bytes happens in user space.

use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::credential::Secret;

/// SHA-256 of a presented key value: the cache and store lookup key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest(pub [u8; 32]);

impl KeyDigest {
    pub fn of(value: &str) -> KeyDigest {
        let mut out = [0u8; 32];
        out.copy_from_slice(digest(&SHA256, value.as_bytes()).as_ref());
        KeyDigest(out)
    }

    /// The digest of [`KeyDigest::to_hex`]'s text; `None` for other text.
    pub fn from_hex(text: &str) -> Option<KeyDigest> {
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(KeyDigest(out))
    }

    /// Lower-case hex, as stored.
    pub fn to_hex(self) -> String {
        use std::fmt::Write;
        self.0.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyDigest({}…)", &self.to_hex()[..8])
    }
}

/// A freshly generated key: the value, shown once, and its digest.
pub struct GeneratedKey {
    pub value: Secret,
    pub digest: KeyDigest,
}

/// Generates a new key value with the given prefix.
pub fn generate(prefix: &str) -> Result<GeneratedKey, aws_lc_rs::error::Unspecified> {
    let value = format!("{prefix}{}", URL_SAFE_NO_PAD.encode(random_bytes::<64>()?));
    let digest = KeyDigest::of(&value);
    Ok(GeneratedKey {
        value: Secret::new(value),
        digest,
    })
}

/// Cryptographically secure random bytes.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], aws_lc_rs::error::Unspecified> {
    let mut bytes = [0u8; N];
    SystemRandom::new().fill(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_prefix_and_86_random_characters() {
        let key = generate("tb_").unwrap();
        let value = key.value.expose();
        assert!(value.starts_with("tb_"));
        assert_eq!(value.len(), 3 + 86);
        assert!(
            value[3..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(key.digest, KeyDigest::of(value));
        assert_ne!(generate("tb_").unwrap().value, key.value);
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            KeyDigest::of("abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!format!("{:?}", KeyDigest::of("abc")).contains("b00361a3"));
    }

    #[test]
    fn a_stored_digest_reads_back_as_the_digest_it_was() {
        let digest = KeyDigest::of("tb_value");
        assert_eq!(KeyDigest::from_hex(&digest.to_hex()), Some(digest));
        assert_eq!(KeyDigest::from_hex("abc"), None);
        let signed = format!("+{}", &digest.to_hex()[1..]);
        assert_eq!(KeyDigest::from_hex(&signed), None);
    }
}
