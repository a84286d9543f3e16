//! A provider's signing keys (its JWKS, RFC 7517) and their cache.
//!
//! Each key decides the algorithms a token signed with it may use: its `alg`
//! when it names one, else every algorithm of its type (RSA: RS* and PS*; an
//! EC key: the one of its curve; Ed25519: EdDSA). Symmetric (`oct`) keys and
//! keys for encryption are never used: a provider's tokens are verified with
//! its public keys only, so a token "signed" with HS256 over a public key is
//! refused however it was made.
//!
//! The cache is fetched again when a token names a key it does not hold,
//! at most once per [`KeyCache::period`] whatever the number of unknown
//! `kid`s: a flood of made-up `kid`s costs the provider one fetch a period.

use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

/// Least time between two fetches of a provider's key set.
pub const REFETCH_PERIOD: Duration = Duration::from_secs(60);

/// One usable signing key.
#[derive(Clone)]
pub struct ProviderKey {
    pub kid: Option<String>,
    pub key: DecodingKey,
    /// The algorithms a token verified with this key may name.
    pub algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for ProviderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderKey")
            .field("kid", &self.kid)
            .field("algorithms", &self.algorithms)
            .finish_non_exhaustive()
    }
}

/// The usable signing keys of a JWKS document; the others (encryption,
/// symmetric, unknown types) are left out, not an error.
pub fn parse_set(body: &[u8]) -> Result<Vec<ProviderKey>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWK set: {e}"))?;
    Ok(set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter_map(|jwk| usable(&jwk))
        .collect())
}

/// `jwk` as a signing key, if it is one keygate verifies with.
fn usable(jwk: &Jwk) -> Option<ProviderKey> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let by_type: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            &[Algorithm::EdDSA]
        }
        _ => return None,
    };
    let algorithms = match jwk.common.key_algorithm {
        None => by_type.to_vec(),
        Some(named) => {
            let named = Algorithm::from_str(&named.to_string()).ok()?;
            if !by_type.contains(&named) {
                return None;
            }
            vec![named]
        }
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(ProviderKey {
        kid: jwk.common.key_id.clone(),
        key,
        algorithms,
    })
}

/// Where a cache gets a provider's keys from (the provider over HTTPS; a
/// fake in tests).
pub trait KeySource {
    fn fetch_keys(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<ProviderKey>, String>> + Send;
}

/// Why no key was found for a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The provider's keys hold none for the token (after a fetch, or with
    /// the period's fetch already spent).
    #[error("no signing key {0:?} at the provider")]
    Unknown(Option<String>),
    /// The key set could not be fetched.
    #[error("the provider's keys could not be fetched: {0}")]
    Unavailable(String),
}

/// A provider's keys, fetched when a token names one not held.
pub struct KeyCache {
    keys: RwLock<Arc<Vec<Arc<ProviderKey>>>>,
    /// When the keys were last fetched (or tried); one fetch at a time.
    fetched: tokio::sync::Mutex<Option<Instant>>,
    period: Duration,
}

impl KeyCache {
    pub fn new(period: Duration) -> KeyCache {
        KeyCache {
            keys: RwLock::new(Arc::new(Vec::new())),
            fetched: tokio::sync::Mutex::new(None),
            period,
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// The key for a token's `kid` (a token without one: the only key).
    pub async fn key(
        &self,
        kid: Option<&str>,
        source: &impl KeySource,
    ) -> Result<Arc<ProviderKey>, KeyError> {
        self.key_at(kid, source, Instant::now()).await
    }

    /// [`KeyCache::key`] at `now`.
    pub async fn key_at(
        &self,
        kid: Option<&str>,
        source: &impl KeySource,
        now: Instant,
    ) -> Result<Arc<ProviderKey>, KeyError> {
        if let Some(key) = self.held(kid) {
            return Ok(key);
        }
        let mut fetched = self.fetched.lock().await;
        // Another request may have fetched while this one waited.
        if let Some(key) = self.held(kid) {
            return Ok(key);
        }
        if fetched.is_some_and(|at| now.saturating_duration_since(at) < self.period) {
            return Err(KeyError::Unknown(kid.map(str::to_owned)));
        }
        *fetched = Some(now);
        let keys = source.fetch_keys().await.map_err(KeyError::Unavailable)?;
        self.replace(keys);
        self.held(kid)
            .ok_or_else(|| KeyError::Unknown(kid.map(str::to_owned)))
    }

    /// Fetches the keys now unless they were fetched (or tried) already: a
    /// provider's keys loaded at start, before the first token needs them.
    pub async fn load(&self, source: &impl KeySource) -> Result<usize, String> {
        let mut fetched = self.fetched.lock().await;
        if fetched.is_some() {
            return Ok(self.keys.read().unwrap_or_else(|e| e.into_inner()).len());
        }
        *fetched = Some(Instant::now());
        let keys = source.fetch_keys().await?;
        let count = keys.len();
        self.replace(keys);
        Ok(count)
    }

    fn replace(&self, keys: Vec<ProviderKey>) {
        let keys = Arc::new(keys.into_iter().map(Arc::new).collect());
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    fn held(&self, kid: Option<&str>) -> Option<Arc<ProviderKey>> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner()).clone();
        match kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)).cloned(),
            None if keys.len() == 1 => keys.first().cloned(),
            None => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An EC P-256 public key (RFC 7515 appendix A.3) as a JWK.
    pub(crate) const EC_JWK: &str = r#"{"kty":"EC","crv":"P-256","kid":"ec1",
        "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
        "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;

    /// Counts its fetches and answers the keys it holds.
    pub(crate) struct Fake {
        pub keys: &'static str,
        pub fetches: AtomicUsize,
    }

    impl KeySource for Fake {
        async fn fetch_keys(&self) -> Result<Vec<ProviderKey>, String> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            parse_set(self.keys.as_bytes())
        }
    }

    #[test]
    fn only_signing_keys_of_public_types_are_kept_with_their_algorithms() {
        let set = format!(
            r#"{{"keys":[{EC_JWK},
            {{"kty":"oct","k":"c2VjcmV0","kid":"hmac"}},
            {{"kty":"RSA","use":"enc","n":"sXch","e":"AQAB","kid":"enc"}},
            {{"kty":"RSA","alg":"PS256","n":"sXch","e":"AQAB","kid":"rsa"}},
            {{"kty":"EC","crv":"P-256","alg":"RS256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","kid":"mismatch"}},
            {{"kty":"weird"}}]}}"#
        );
        let keys = parse_set(set.as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["ec1", "rsa"]);
        assert_eq!(keys[0].algorithms, [Algorithm::ES256]);
        assert_eq!(keys[1].algorithms, [Algorithm::PS256]);
        assert!(parse_set(b"[]").is_err());
    }

    #[tokio::test]
    async fn a_flood_of_unknown_kids_costs_one_fetch_per_period() {
        let cache = KeyCache::new(Duration::from_secs(60));
        let fake = Fake {
            keys: Box::leak(format!(r#"{{"keys":[{EC_JWK}]}}"#).into_boxed_str()),
            fetches: AtomicUsize::new(0),
        };
        let start = Instant::now();
        assert!(cache.key_at(Some("ec1"), &fake, start).await.is_ok());
        assert_eq!(fake.fetches.load(Ordering::SeqCst), 1);
        for i in 0..1000 {
            let kid = format!("made-up-{i}");
            let refused = cache.key_at(Some(&kid), &fake, start).await.unwrap_err();
            assert_eq!(refused, KeyError::Unknown(Some(kid)));
        }
        assert_eq!(fake.fetches.load(Ordering::SeqCst), 1, "within the period");
        // A known key never fetches.
        assert!(cache.key_at(Some("ec1"), &fake, start).await.is_ok());
        let later = start + Duration::from_secs(61);
        for i in 0..1000 {
            let kid = format!("other-{i}");
            assert!(cache.key_at(Some(&kid), &fake, later).await.is_err());
        }
        assert_eq!(
            fake.fetches.load(Ordering::SeqCst),
            2,
            "one more period, one more fetch"
        );
        // A token without kid takes the only key.
        assert!(cache.key_at(None, &fake, later).await.is_ok());
    }

    #[tokio::test]
    async fn concurrent_unknown_kids_wait_for_one_fetch() {
        let cache = Arc::new(KeyCache::new(Duration::from_secs(60)));
        let fake = Arc::new(Fake {
            keys: r#"{"keys":[]}"#,
            fetches: AtomicUsize::new(0),
        });
        let now = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..50 {
            let (cache, fake) = (cache.clone(), fake.clone());
            tasks.push(tokio::spawn(async move {
                cache.key_at(Some(&format!("k{i}")), &*fake, now).await
            }));
        }
        for task in tasks {
            assert!(task.await.unwrap().is_err());
        }
        assert_eq!(fake.fetches.load(Ordering::SeqCst), 1);
    }
}
