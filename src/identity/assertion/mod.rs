//! The signed identity assertion of `identity = "assertion"` routes: a JWT
//! in `X-Auth-Assertion`, signed with keygate's asymmetric key (ES256 or
//! EdDSA) and verifiable by any upstream against `/.well-known/jwks.json`.
//!
//! - `keys.rs`: one key, its kid (RFC 7638 thumbprint) and public JWK;
//! - `ring.rs`: the key set shared through the store, and its reload;
//! - here: the claims, and the [`Minter`] that signs them.

pub mod keys;
pub mod ring;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderValue;
use serde::Serialize;
use uuid::Uuid;

use super::passport::Minter;
use super::{AuthMethod, Identity};
use crate::error::ApiError;
use crate::vocab::scope::Scopes;
pub use ring::KeyRing;

/// The claims of an assertion, in the order they are written.
#[derive(Debug, Serialize)]
struct Claims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: Uuid,
    email: &'a str,
    tenant_id: Uuid,
    customer_id: Uuid,
    authority: &'static str,
    auth_method: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<Uuid>,
    /// The grants of a scoped API key, so an upstream can narrow further;
    /// absent for an unscoped key and a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    scopes: Option<&'a Scopes>,
    /// `true` for a public customer's public user; absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    public: bool,
    iat: u64,
    nbf: u64,
    exp: u64,
    jti: Uuid,
}

/// Signs assertions with the current key of a [`KeyRing`].
pub struct AssertionMinter {
    ring: Arc<KeyRing>,
    issuer: String,
    lifetime: Duration,
    /// `assertion.reuse`: may one assertion serve several requests?
    reuse: bool,
}

impl AssertionMinter {
    pub fn new(ring: Arc<KeyRing>, issuer: String, lifetime: Duration) -> AssertionMinter {
        AssertionMinter {
            ring,
            issuer,
            lifetime,
            reuse: true,
        }
    }

    /// With `assertion.reuse`: `false` signs a fresh assertion, with a
    /// fresh `jti`, for every request.
    pub fn with_reuse(mut self, reuse: bool) -> AssertionMinter {
        self.reuse = reuse;
        self
    }

    /// The compact JWS of `identity` for `audience`, issued at `now` (epoch s).
    fn sign(&self, audience: &str, identity: &Identity, now: u64) -> Option<String> {
        let keys = self.ring.load();
        let key = &keys.signer;
        let p = &identity.principal;
        let (key_id, session_id) = match identity.method {
            AuthMethod::ApiKey { key_id } => (Some(key_id), None),
            AuthMethod::Jwt { session_id } => (None, Some(session_id)),
            AuthMethod::Provider { token_id } => (None, Some(token_id)),
        };
        let claims = Claims {
            iss: &self.issuer,
            aud: audience,
            sub: p.user_id,
            email: &p.email,
            tenant_id: p.tenant_id,
            customer_id: p.customer_id,
            authority: p.authority.as_str(),
            auth_method: identity.method.label(),
            key_id,
            session_id,
            scopes: identity.scopes(),
            public: p.is_public,
            iat: now,
            nbf: now,
            exp: now + self.lifetime.as_secs(),
            jti: Uuid::new_v4(),
        };
        let header = serde_json::json!({
            "alg": key.public.algorithm.as_str(),
            "typ": "JWT",
            "kid": key.public.kid,
        });
        let mut token = URL_SAFE_NO_PAD.encode(header.to_string());
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).ok()?));
        let signature = key.sign(token.as_bytes())?;
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        Some(token)
    }
}

impl Minter for AssertionMinter {
    fn mint(&self, audience: &str, identity: &Identity) -> Result<HeaderValue, ApiError> {
        let now = crate::clock::now_ms().max(0) as u64 / 1000;
        self.sign(audience, identity, now)
            .and_then(|token| HeaderValue::from_str(&token).ok())
            .ok_or_else(|| {
                tracing::error!("signing an identity assertion failed");
                ApiError::internal()
            })
    }

    fn lifetime(&self) -> Duration {
        self.lifetime
    }

    fn reusable(&self) -> bool {
        self.reuse
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AssertionAlgorithm, AssertionSettings};
    use crate::identity::{Authority, NULL_UUID, Principal};
    use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};

    async fn ring(algorithm: AssertionAlgorithm) -> Arc<KeyRing> {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/k.db", dir.path().display());
        let store = crate::store::Store::connect(&url, 1).await.unwrap();
        let settings = AssertionSettings {
            issuer: "https://gw.example".into(),
            lifetime: Duration::from_secs(300),
            algorithm,
            signing_key_file: None,
            jwks_max_age: Duration::from_secs(300),
            reuse: true,
        };
        Arc::new(KeyRing::open(&store, &settings).await.unwrap())
    }

    fn identity(method: AuthMethod) -> Identity {
        let principal = Arc::new(Principal::new(
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            NULL_UUID,
            Authority::TenantAdmin,
            "ta@example.com".into(),
        ));
        Identity::new(principal, method, HeaderValue::from_static("x"))
    }

    /// Verifies `token` as an upstream would: against the JWKS, by kid,
    /// with the algorithm pinned.
    fn verify(ring: &KeyRing, token: &str, alg: Algorithm, audience: &str) -> serde_json::Value {
        crate::tls::install_crypto_provider();
        let jwks: JwkSet = serde_json::from_slice(&ring.load().jwks).unwrap();
        let header = jsonwebtoken::decode_header(token).unwrap();
        assert_eq!(header.alg, alg);
        assert_eq!(header.typ.as_deref(), Some("JWT"));
        let jwk = jwks.find(header.kid.as_deref().unwrap()).unwrap();
        let mut validation = Validation::new(alg);
        validation.set_issuer(&["https://gw.example"]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<serde_json::Value>(
            token,
            &DecodingKey::from_jwk(jwk).unwrap(),
            &validation,
        )
        .unwrap()
        .claims
    }

    #[tokio::test]
    async fn an_assertion_carries_exactly_the_identity_claims() {
        let ring = ring(AssertionAlgorithm::Es256).await;
        let minter = AssertionMinter::new(
            ring.clone(),
            "https://gw.example".into(),
            Duration::from_secs(300),
        );
        let key_id = Uuid::from_u128(3);
        let by_key = minter
            .mint("devices", &identity(AuthMethod::ApiKey { key_id }))
            .unwrap();
        let claims = verify(&ring, by_key.to_str().unwrap(), Algorithm::ES256, "devices");
        let names: Vec<&str> = claims
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut expected = vec![
            "iss",
            "aud",
            "sub",
            "email",
            "tenant_id",
            "customer_id",
            "authority",
            "auth_method",
            "key_id",
            "iat",
            "nbf",
            "exp",
            "jti",
        ];
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(claims["sub"], Uuid::from_u128(1).to_string());
        assert_eq!(claims["tenant_id"], Uuid::from_u128(2).to_string());
        assert_eq!(claims["customer_id"], NULL_UUID.to_string());
        assert_eq!(claims["authority"], "TENANT_ADMIN");
        assert_eq!(claims["email"], "ta@example.com");
        assert_eq!(claims["auth_method"], "api-key");
        assert_eq!(claims["key_id"], key_id.to_string());
        let iat = claims["iat"].as_u64().unwrap();
        assert_eq!(claims["nbf"].as_u64(), Some(iat));
        assert_eq!(claims["exp"].as_u64(), Some(iat + 300));
        assert!(Uuid::parse_str(claims["jti"].as_str().unwrap()).is_ok());

        let session_id = Uuid::from_u128(4);
        let by_jwt = minter
            .mint("devices", &identity(AuthMethod::Jwt { session_id }))
            .unwrap();
        let claims = verify(&ring, by_jwt.to_str().unwrap(), Algorithm::ES256, "devices");
        assert_eq!(claims["auth_method"], "jwt");
        assert_eq!(claims["session_id"], session_id.to_string());
        assert!(claims.get("key_id").is_none());
        assert_ne!(by_key, by_jwt);
    }

    #[tokio::test]
    async fn ed25519_assertions_verify_as_eddsa() {
        let ring = ring(AssertionAlgorithm::EdDsa).await;
        let minter = AssertionMinter::new(
            ring.clone(),
            "https://gw.example".into(),
            Duration::from_secs(60),
        );
        let token = minter
            .mint(
                "api",
                &identity(AuthMethod::ApiKey {
                    key_id: Uuid::from_u128(9),
                }),
            )
            .unwrap();
        let claims = verify(&ring, token.to_str().unwrap(), Algorithm::EdDSA, "api");
        assert_eq!(claims["aud"], "api");
        let jwks: serde_json::Value = serde_json::from_slice(&ring.load().jwks).unwrap();
        assert_eq!(jwks["keys"][0]["kty"], "OKP");
        assert_eq!(jwks["keys"][0]["crv"], "Ed25519");
    }

    #[tokio::test]
    async fn an_assertion_for_another_audience_is_refused_by_a_verifier() {
        let ring = ring(AssertionAlgorithm::Es256).await;
        let minter = AssertionMinter::new(
            ring.clone(),
            "https://gw.example".into(),
            Duration::from_secs(60),
        );
        let token = minter
            .mint(
                "billing",
                &identity(AuthMethod::ApiKey {
                    key_id: Uuid::from_u128(9),
                }),
            )
            .unwrap();
        crate::tls::install_crypto_provider();
        let jwks: JwkSet = serde_json::from_slice(&ring.load().jwks).unwrap();
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&["devices"]);
        let key = DecodingKey::from_jwk(&jwks.keys[0]).unwrap();
        assert!(
            jsonwebtoken::decode::<serde_json::Value>(token.to_str().unwrap(), &key, &validation)
                .is_err()
        );
    }
}
