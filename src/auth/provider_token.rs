//! A single sign-on provider's access token as an API credential
//! (`[[oidc]] accept_access_tokens`).
//!
//! A bearer token goes to one verifier, chosen by the issuer it claims
//! before anything is verified ([`crate::sso::token::claimed_issuer`]):
//! keygate's own issuer, or none of a provider's, to keygate's key; a
//! provider's issuer to that provider's keys only. Each verifier then checks
//! the issuer again, so a token can never be taken by the other's key.
//!
//! Verified once, a provider token is kept like keygate's own
//! ([`crate::auth::cache`]): by the start of its signature (a provider's
//! private-key signature nobody else can make), a hit counting only for the
//! same token byte for byte, never past its `exp`. Every hit checks `exp`
//! and the user again (disabled, tokens outdated), as for keygate's tokens.
//! The user is found by the mapped e-mail claim; an access token creates
//! nobody.

use std::sync::Arc;

use uuid::Uuid;

use super::cache::{VerifiedProviderToken, VerifiedToken};
use super::{AuthFailure, AuthRefusal, Authenticator, token_key};
use crate::identity::{AuthMethod, Identity, id_header_value};
use crate::sso::Provider;
use crate::sso::mapping;
use crate::sso::token::{TokenRefusal, claimed_issuer};

/// A bearer token verified by the one verifier it went to.
pub(super) enum Bearer {
    Own(Arc<VerifiedToken>),
    Provider(Arc<VerifiedProviderToken>),
}

impl Authenticator {
    /// `token` verified, from the caches when it is there: a token found in
    /// keygate's own cache was verified by keygate's key, one in the
    /// providers' by its provider's, so the hits of both ask nothing else.
    /// A token in neither goes to the verifier its claimed issuer names.
    pub(super) async fn bearer(&self, token: &str) -> Result<Bearer, AuthFailure> {
        let key = token_key(token);
        if let Some(hit) = self.caches.tokens.get(&key)
            && *hit.token == *token
        {
            return Ok(Bearer::Own(hit));
        }
        if self.providers.accept_access_tokens() {
            if let Some(hit) = self.caches.provider_tokens.get(&key)
                && *hit.token == *token
            {
                return Ok(Bearer::Provider(hit));
            }
            if let Some(provider) = self.provider_of(token) {
                return self
                    .verify_provider(key, provider, token)
                    .await
                    .map(Bearer::Provider);
            }
        }
        self.verify_own(key, token).map(Bearer::Own)
    }

    /// The provider whose access token `token` claims to be, if that
    /// provider's tokens are accepted; `None` sends it to keygate's key.
    pub(super) fn provider_of(&self, token: &str) -> Option<&Arc<Provider>> {
        if !self.providers.accept_access_tokens() {
            return None;
        }
        let issuer = claimed_issuer(token)?;
        if issuer == self.tokens.issuer() {
            return None;
        }
        self.providers.accepting_access_tokens_of(&issuer)
    }

    /// The identity of a verified provider token: checked again on every
    /// use (its `exp`, the user enabled, its tokens not outdated).
    pub(super) async fn provider_identity(
        &self,
        verified: &VerifiedProviderToken,
    ) -> Result<Identity, AuthRefusal> {
        let refused = |failure| AuthRefusal {
            failure,
            key_id: None,
            user_id: Some(verified.user_id),
        };
        if verified.exp <= crate::clock::now_secs() {
            return Err(refused(AuthFailure::TokenExpired));
        }
        let user = self
            .user_state(verified.user_id)
            .await
            .map_err(refused)?
            .ok_or(refused(AuthFailure::Outdated))?;
        if !user.enabled {
            return Err(refused(AuthFailure::Disabled));
        }
        if verified.iat < user.tokens_valid_after {
            return Err(refused(AuthFailure::Outdated));
        }
        Ok(Identity::new(
            user.principal.clone(),
            AuthMethod::Provider {
                token_id: verified.token_id,
            },
            verified.token_header.clone(),
        ))
    }

    /// Verifies a provider's token (a cache miss) and keeps it.
    async fn verify_provider(
        &self,
        key: [u8; 32],
        provider: &Provider,
        token: &str,
    ) -> Result<Arc<VerifiedProviderToken>, AuthFailure> {
        let now = crate::clock::now_secs();
        let claims = match provider.verify_access_token(token, now).await {
            Some(Ok(claims)) => claims,
            Some(Err(refusal)) => {
                tracing::info!(target: "keygate::security", provider = provider.name(), %refusal, "refused a provider's access token");
                return Err(failure_of(&refusal));
            }
            None => return Err(AuthFailure::Unknown),
        };
        let person = mapping::person(&claims, &provider.settings).map_err(|refusal| {
            tracing::info!(target: "keygate::security", provider = provider.name(), reason = %refusal.message(), "a provider's access token names no usable user");
            AuthFailure::Unknown
        })?;
        let email = person.email;
        let user = self
            .look_up(move |store| async move { store.user_by_email(&email).await })
            .await
            .map_err(|e| self.store_failure(&e))?
            .ok_or(AuthFailure::Unknown)?;
        let exp = claims.get("exp").and_then(|v| v.as_i64()).unwrap_or(0);
        let iat = claims.get("iat").and_then(|v| v.as_i64()).unwrap_or(0);
        let token_id = token_id(token);
        let verified = Arc::new(VerifiedProviderToken {
            token: token.into(),
            exp,
            iat,
            user_id: user.id,
            token_id,
            token_header: id_header_value(&token_id),
        });
        let left = (exp - now).max(0) as u64;
        let lifetime = self
            .caches
            .lifetimes
            .known
            .min(std::time::Duration::from_secs(left));
        self.caches
            .provider_tokens
            .insert(key, verified.clone(), lifetime);
        Ok(verified)
    }
}

/// The id of a provider token: the first 128 bits of its SHA-256, the same
/// for every request that carries it.
fn token_id(token: &str) -> Uuid {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest.as_ref()[..16]);
    Uuid::from_bytes(bytes)
}

fn failure_of(refusal: &TokenRefusal) -> AuthFailure {
    match refusal {
        TokenRefusal::Expired => AuthFailure::TokenExpired,
        TokenRefusal::Signature => AuthFailure::BadSignature,
        TokenRefusal::Key(crate::sso::jwks::KeyError::Unavailable(_)) => {
            AuthFailure::StoreUnavailable
        }
        _ => AuthFailure::Unknown,
    }
}
