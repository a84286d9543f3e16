//! Assertion signing keys: generated or read from a PKCS#8 document, named
//! by their RFC 7638 thumbprint, and published as JWKs holding only their
//! public members.

use std::path::Path;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair,
};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::config::AssertionAlgorithm;
use crate::store::SigningKeyRecord;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("stored signing key {kid}: {reason}")]
    Stored { kid: String, reason: String },
    #[error("generating a signing key failed")]
    Generate,
}

/// A public key as the JWKS publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub algorithm: AssertionAlgorithm,
    /// The raw public key: the uncompressed P-256 point (65 bytes), or the
    /// Ed25519 key (32 bytes).
    pub raw: Vec<u8>,
    pub kid: String,
}

impl PublicKey {
    /// A public key; `None` when `raw` is not one of `algorithm`.
    pub fn new(algorithm: AssertionAlgorithm, raw: Vec<u8>) -> Option<PublicKey> {
        let fits = match algorithm {
            AssertionAlgorithm::Es256 => raw.len() == 65 && raw[0] == 4,
            AssertionAlgorithm::EdDsa => raw.len() == 32,
        };
        if !fits {
            return None;
        }
        let kid = thumbprint(algorithm, &raw);
        Some(PublicKey {
            algorithm,
            raw,
            kid,
        })
    }

    /// The members that define the key, as RFC 7638 orders them.
    fn members(algorithm: AssertionAlgorithm, raw: &[u8]) -> Value {
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        match algorithm {
            AssertionAlgorithm::Es256 => json!({
                "crv": "P-256",
                "kty": "EC",
                "x": b64(&raw[1..33]),
                "y": b64(&raw[33..65]),
            }),
            AssertionAlgorithm::EdDsa => json!({
                "crv": "Ed25519",
                "kty": "OKP",
                "x": b64(raw),
            }),
        }
    }

    /// The key's JWK: its defining members, `kid`, `alg` and `use`. Never a
    /// private member: there is none to take it from.
    pub fn jwk(&self) -> Value {
        let mut jwk = PublicKey::members(self.algorithm, &self.raw);
        if let Some(members) = jwk.as_object_mut() {
            members.insert("kid".into(), self.kid.clone().into());
            members.insert("alg".into(), self.algorithm.as_str().into());
            members.insert("use".into(), "sig".into());
        }
        jwk
    }
}

/// The RFC 7638 thumbprint: SHA-256 of the required members, serialised
/// with sorted keys and no whitespace, base64url.
fn thumbprint(algorithm: AssertionAlgorithm, raw: &[u8]) -> String {
    // serde_json's map keeps keys sorted, and `to_string` adds no spaces.
    let canonical = PublicKey::members(algorithm, raw).to_string();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, canonical.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

enum Pair {
    Es256(EcdsaKeyPair),
    EdDsa(Ed25519KeyPair),
}

/// A private key that signs assertions, with its public half.
pub struct SigningKey {
    pair: Pair,
    pub public: PublicKey,
    /// The PKCS#8 document it was read from.
    pkcs8: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.public.kid)
            .field("algorithm", &self.public.algorithm)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new random key.
    pub fn generate(algorithm: AssertionAlgorithm) -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let document = match algorithm {
            AssertionAlgorithm::Es256 => {
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            }
            AssertionAlgorithm::EdDsa => Ed25519KeyPair::generate_pkcs8(&rng),
        }
        .map_err(|_| KeyError::Generate)?;
        SigningKey::from_pkcs8(algorithm, document.as_ref()).map_err(|_| KeyError::Generate)
    }

    /// The key of a PKCS#8 document of `algorithm`.
    pub fn from_pkcs8(algorithm: AssertionAlgorithm, der: &[u8]) -> Result<SigningKey, String> {
        let (pair, raw) = match algorithm {
            AssertionAlgorithm::Es256 => {
                let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der)
                    .map_err(|e| format!("not a P-256 private key: {e}"))?;
                let raw = pair.public_key().as_ref().to_vec();
                (Pair::Es256(pair), raw)
            }
            AssertionAlgorithm::EdDsa => {
                let pair = Ed25519KeyPair::from_pkcs8(der)
                    .map_err(|e| format!("not an Ed25519 private key: {e}"))?;
                let raw = pair.public_key().as_ref().to_vec();
                (Pair::EdDsa(pair), raw)
            }
        };
        let public = PublicKey::new(algorithm, raw).ok_or("unexpected public key shape")?;
        Ok(SigningKey {
            pair,
            public,
            pkcs8: der.to_vec(),
        })
    }

    /// The key in a PEM file (`-----BEGIN PRIVATE KEY-----`, PKCS#8): a
    /// P-256 or an Ed25519 key, whichever it is.
    pub fn from_pem_file(path: &Path) -> Result<SigningKey, KeyError> {
        let error = |reason: String| KeyError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read(path).map_err(|e| error(format!("cannot read: {e}")))?;
        SigningKey::from_pem(&text).map_err(error)
    }

    /// The key in PEM text; see [`SigningKey::from_pem_file`].
    pub fn from_pem(text: &[u8]) -> Result<SigningKey, String> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(text).map_err(|_| {
            "not a PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----); convert one with \
             `openssl pkcs8 -topk8 -nocrypt`"
                .to_string()
        })?;
        let der = der.secret_pkcs8_der();
        SigningKey::from_pkcs8(AssertionAlgorithm::Es256, der)
            .or_else(|_| SigningKey::from_pkcs8(AssertionAlgorithm::EdDsa, der))
            .map_err(|_| "the key is neither a P-256 (ES256) nor an Ed25519 (EdDSA) key".into())
    }

    /// The key of a stored record; `Ok(None)` for a key kept in a file.
    pub fn from_record(record: &SigningKeyRecord) -> Result<Option<SigningKey>, KeyError> {
        if record.private_key.is_empty() {
            return Ok(None);
        }
        let stored = |reason: String| KeyError::Stored {
            kid: record.kid.clone(),
            reason,
        };
        let algorithm = AssertionAlgorithm::parse(&record.algorithm)
            .ok_or_else(|| stored(format!("unknown algorithm {:?}", record.algorithm)))?;
        let der = STANDARD
            .decode(&record.private_key)
            .map_err(|_| stored("private key is not base64".into()))?;
        let key = SigningKey::from_pkcs8(algorithm, &der).map_err(stored)?;
        if key.public.kid != record.kid {
            return Err(stored("kid does not match the key".into()));
        }
        Ok(Some(key))
    }

    /// The record that stores this key: with its private half, or without
    /// (`keep_private` false, for a key kept in a file).
    pub fn record(&self, keep_private: bool, now_ms: i64) -> SigningKeyRecord {
        SigningKeyRecord {
            id: Uuid::new_v4(),
            kid: self.public.kid.clone(),
            algorithm: self.public.algorithm.as_str().into(),
            public_key: URL_SAFE_NO_PAD.encode(&self.public.raw),
            private_key: if keep_private {
                STANDARD.encode(&self.pkcs8)
            } else {
                String::new()
            },
            created_time: now_ms,
            retired_time: 0,
        }
    }

    /// The JWS signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Option<Vec<u8>> {
        match &self.pair {
            Pair::Es256(pair) => pair
                .sign(&SystemRandom::new(), message)
                .ok()
                .map(|s| s.as_ref().to_vec()),
            Pair::EdDsa(pair) => Some(pair.sign(message).as_ref().to_vec()),
        }
    }
}

/// The public key of a stored record; `None` when the record is corrupt.
pub fn public_of(record: &SigningKeyRecord) -> Option<PublicKey> {
    let algorithm = AssertionAlgorithm::parse(&record.algorithm)?;
    let raw = URL_SAFE_NO_PAD.decode(&record.public_key).ok()?;
    PublicKey::new(algorithm, raw).filter(|key| key.kid == record.kid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_p256_kid_is_its_rfc7638_thumbprint() {
        // RFC 7638 has no P-256 example; this one is computed by hand from
        // the canonical form the RFC defines, with fixed coordinates.
        let mut raw = vec![4u8];
        raw.extend([1u8; 32]);
        raw.extend([2u8; 32]);
        let key = PublicKey::new(AssertionAlgorithm::Es256, raw).unwrap();
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            URL_SAFE_NO_PAD.encode([1u8; 32]),
            URL_SAFE_NO_PAD.encode([2u8; 32])
        );
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, canonical.as_bytes());
        assert_eq!(key.kid, URL_SAFE_NO_PAD.encode(digest.as_ref()));
    }

    #[test]
    fn an_ed25519_kid_matches_the_rfc8037_example() {
        // RFC 8037, appendix A.3: the thumbprint of the example Ed25519 key.
        let raw = URL_SAFE_NO_PAD
            .decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
            .unwrap();
        let key = PublicKey::new(AssertionAlgorithm::EdDsa, raw).unwrap();
        assert_eq!(key.kid, "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
    }

    #[test]
    fn a_jwk_holds_only_public_members() {
        for algorithm in [AssertionAlgorithm::Es256, AssertionAlgorithm::EdDsa] {
            let key = SigningKey::generate(algorithm).unwrap();
            let jwk = key.public.jwk();
            let mut names: Vec<&str> = jwk
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            names.sort_unstable();
            let expected: &[&str] = match algorithm {
                AssertionAlgorithm::Es256 => &["alg", "crv", "kid", "kty", "use", "x", "y"],
                AssertionAlgorithm::EdDsa => &["alg", "crv", "kid", "kty", "use", "x"],
            };
            assert_eq!(names, expected);
            assert_eq!(jwk["alg"], algorithm.as_str());
            assert_eq!(jwk["use"], "sig");
            assert!(jwk.get("d").is_none());
        }
    }

    #[test]
    fn a_stored_key_reads_back_as_the_same_key() {
        for algorithm in [AssertionAlgorithm::Es256, AssertionAlgorithm::EdDsa] {
            let key = SigningKey::generate(algorithm).unwrap();
            let record = key.record(true, 1);
            let back = SigningKey::from_record(&record).unwrap().unwrap();
            assert_eq!(back.public, key.public);
            assert_eq!(public_of(&record), Some(key.public.clone()));
            let file_kept = key.record(false, 1);
            assert!(file_kept.private_key.is_empty());
            assert!(SigningKey::from_record(&file_kept).unwrap().is_none());
            assert_eq!(public_of(&file_kept), Some(key.public));
        }
    }

    #[test]
    fn a_stored_key_whose_kid_does_not_match_is_refused() {
        let key = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
        let mut record = key.record(true, 1);
        record.kid = "another".into();
        assert!(matches!(
            SigningKey::from_record(&record),
            Err(KeyError::Stored { .. })
        ));
        assert_eq!(public_of(&record), None);
    }

    fn pem(der: &[u8]) -> String {
        let body = STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn pem_files_of_either_algorithm_load_with_their_own_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        for algorithm in [AssertionAlgorithm::Es256, AssertionAlgorithm::EdDsa] {
            let key = SigningKey::generate(algorithm).unwrap();
            let path = dir.path().join(format!("{}.pem", algorithm.as_str()));
            std::fs::write(&path, pem(&key.pkcs8)).unwrap();
            let loaded = SigningKey::from_pem_file(&path).unwrap();
            assert_eq!(loaded.public, key.public);
        }
    }

    #[test]
    fn a_bad_pem_file_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.pem");
        std::fs::write(
            &path,
            "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n",
        )
        .unwrap();
        let error = SigningKey::from_pem_file(&path).unwrap_err().to_string();
        assert!(error.contains("PKCS#8"), "{error}");
        assert!(error.contains("bad.pem"), "{error}");
        std::fs::write(&path, pem(b"not a key")).unwrap();
        let error = SigningKey::from_pem_file(&path).unwrap_err().to_string();
        assert!(error.contains("neither a P-256"), "{error}");
        let missing = SigningKey::from_pem_file(&dir.path().join("none.pem")).unwrap_err();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }

    #[test]
    fn signatures_have_the_jws_length_of_their_algorithm() {
        let es = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
        assert_eq!(es.sign(b"m").unwrap().len(), 64);
        let ed = SigningKey::generate(AssertionAlgorithm::EdDsa).unwrap();
        assert_eq!(ed.sign(b"m").unwrap().len(), 64);
    }
}
