//! How an upstream verifies keygate's identity assertion, as the reference
//! entity service does when it is given a [`AssertionCheck`]: the
//! signature against keygate's JWKS, found by `kid` (an unknown kid fetches
//! the JWKS again, at most once per `refetch_after`, then is refused), the
//! algorithm pinned by the key in the JWKS (never the token's own choice),
//! `exp` and `nbf` with a small leeway, `iss` and `aud`. Keys are only ever
//! taken from the configured JWKS: a token's `jwk`, `jku` or `x5u` header
//! is never followed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::{JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use uuid::Uuid;

/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 5;
/// Largest JWKS document read.
const MAX_JWKS_BYTES: usize = 64 * 1024;

/// What the reference service checks an assertion against.
#[derive(Debug, Clone)]
pub struct AssertionCheck {
    /// keygate's `/.well-known/jwks.json` (plain HTTP).
    pub jwks_url: http::Uri,
    pub issuer: String,
    /// The route's audience.
    pub audience: String,
    /// The shortest time between two fetches of the JWKS.
    pub refetch_after: Duration,
}

/// The claims of a verified assertion the service acts on.
#[derive(Debug, Clone, Deserialize)]
pub struct Asserted {
    pub tenant_id: Uuid,
    pub authority: String,
}

pub struct Verifier {
    check: AssertionCheck,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// The key set last fetched, and when.
    keys: Mutex<(JwkSet, Option<Instant>)>,
}

impl Verifier {
    pub fn new(check: AssertionCheck) -> Verifier {
        crate::auth::jwt::install_crypto_provider();
        Verifier {
            check,
            client: Client::builder(TokioExecutor::new()).build_http(),
            keys: Mutex::new((JwkSet { keys: Vec::new() }, None)),
        }
    }

    /// The verified claims of `token`; `None` for any failure.
    pub async fn verify(&self, token: &str) -> Option<Asserted> {
        let header = jsonwebtoken::decode_header(token).ok()?;
        let kid = header.kid?;
        let (key, alg) = match self.key(&kid) {
            Some(found) => found,
            None => {
                self.refetch().await;
                self.key(&kid)?
            }
        };
        if header.alg != alg {
            return None;
        }
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.check.issuer]);
        validation.set_audience(&[&self.check.audience]);
        validation.set_required_spec_claims(&["exp", "nbf", "iat", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<Asserted>(token, &key, &validation)
            .ok()
            .map(|data| data.claims)
    }

    /// The key and pinned algorithm of `kid` in the key set held.
    fn key(&self, kid: &str) -> Option<(DecodingKey, Algorithm)> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let jwk = keys.0.find(kid)?;
        let alg = match jwk.common.key_algorithm? {
            KeyAlgorithm::ES256 => Algorithm::ES256,
            KeyAlgorithm::EdDSA => Algorithm::EdDSA,
            _ => return None,
        };
        Some((DecodingKey::from_jwk(jwk).ok()?, alg))
    }

    /// Fetches the JWKS again unless it was fetched within `refetch_after`.
    async fn refetch(&self) {
        {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys
                .1
                .is_some_and(|at| at.elapsed() < self.check.refetch_after)
            {
                return;
            }
            keys.1 = Some(Instant::now());
        }
        if let Some(fetched) = self.fetch().await {
            self.keys.lock().unwrap_or_else(|e| e.into_inner()).0 = fetched;
        }
    }

    async fn fetch(&self) -> Option<JwkSet> {
        let response = self.client.get(self.check.jwks_url.clone()).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes();
        serde_json::from_slice(&body).ok()
    }
}
