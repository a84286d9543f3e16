//! Authentication: from a parsed [`Credential`] to a verified [`Identity`].

pub mod api_key;
pub mod cache;
pub mod credential;
pub mod jwt;
pub mod limiter;
pub mod live;
pub mod outcomes;
pub mod password;
pub mod revocation;

use std::sync::Arc;

use uuid::Uuid;

use self::api_key::KeyDigest;
use self::cache::{Caches, KeyState, Lookup, SessionState, UserState, VerifiedToken};
use self::credential::{Credential, CredentialError, Secret};
use self::jwt::{TokenError, TokenKeys};
use crate::error::ApiError;
use crate::identity::{AuthMethod, Identity, Principal, id_header_value};
use crate::store::{Revocation, Store, StoreError, UserRecord};
use crate::telemetry::Metrics;

/// Why a request was not authenticated. Each maps to one contract error and one
/// bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    Unknown,
    Disabled,
    Expired,
    Outdated,
    TokenExpired,
    BadSignature,
    WrongScope,
    PlaintextRefused,
    StoreUnavailable,
}

impl AuthFailure {
    /// Every failure, for creating each metric series up front.
    pub const ALL: [AuthFailure; 11] = [
        AuthFailure::Missing,
        AuthFailure::Malformed,
        AuthFailure::Unknown,
        AuthFailure::Disabled,
        AuthFailure::Expired,
        AuthFailure::Outdated,
        AuthFailure::TokenExpired,
        AuthFailure::BadSignature,
        AuthFailure::WrongScope,
        AuthFailure::PlaintextRefused,
        AuthFailure::StoreUnavailable,
    ];

    /// No credential could be read, so it is counted under method `none`.
    pub fn is_parse_failure(self) -> bool {
        matches!(self, AuthFailure::Missing | AuthFailure::Malformed)
    }

    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Unknown => "unknown",
            AuthFailure::Disabled => "disabled",
            AuthFailure::Expired | AuthFailure::TokenExpired => "expired",
            AuthFailure::Outdated => "outdated",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::WrongScope => "wrong_scope",
            AuthFailure::PlaintextRefused => "plaintext_refused",
            AuthFailure::StoreUnavailable => "store_error",
        }
    }

    pub fn to_api_error(self) -> ApiError {
        match self {
            AuthFailure::Missing | AuthFailure::Malformed => ApiError::authentication_failed(),
            AuthFailure::Unknown | AuthFailure::WrongScope => ApiError::invalid_credentials(),
            AuthFailure::Disabled => ApiError::not_active(),
            AuthFailure::Expired => ApiError::api_key_expired(),
            AuthFailure::TokenExpired | AuthFailure::BadSignature | AuthFailure::Outdated => {
                ApiError::token_expired()
            }
            AuthFailure::PlaintextRefused => ApiError::api_key_over_plain_http(),
            AuthFailure::StoreUnavailable => ApiError::unavailable(),
        }
    }
}

impl From<CredentialError> for AuthFailure {
    fn from(e: CredentialError) -> Self {
        match e {
            CredentialError::Missing => AuthFailure::Missing,
            CredentialError::Malformed => AuthFailure::Malformed,
        }
    }
}

impl From<TokenError> for AuthFailure {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Expired => AuthFailure::TokenExpired,
            TokenError::BadSignature => AuthFailure::BadSignature,
            // A malformed bearer value is a bad credential, not a bad header.
            TokenError::Malformed => AuthFailure::Unknown,
            TokenError::WrongScope => AuthFailure::WrongScope,
        }
    }
}

/// Verifies credentials through the caches, falling back to the store on a miss.
pub struct Authenticator {
    store: Store,
    tokens: Arc<TokenKeys>,
    caches: Caches,
    metrics: Arc<Metrics>,
}

impl Authenticator {
    pub fn new(
        store: Store,
        tokens: Arc<TokenKeys>,
        caches: Caches,
        metrics: Arc<Metrics>,
    ) -> Self {
        Authenticator {
            store,
            tokens,
            caches,
            metrics,
        }
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    pub fn token_keys(&self) -> &TokenKeys {
        &self.tokens
    }

    /// Applies a revocation a store change of this replica published to its
    /// caches and open sockets, as its notification does on the others
    /// ([`revocation::apply`]): the one way a revocation takes effect here.
    pub async fn revoke(&self, revocation: Option<Revocation>) {
        if let Some(revocation) = revocation {
            revocation::apply(&self.caches, revocation).await;
        }
    }

    /// Disables the key `value` names, if it is a live one: it crossed the wire
    /// in clear. The lookup goes through the caches (and the negative cache), so
    /// random keys sent in clear cannot hammer the store. The key is dropped
    /// here as a disable from the API or another replica drops it.
    pub async fn disable_exposed_key(&self, value: &Secret) {
        let Some(revocation) = self.disabled_exposed_key(value).await else {
            return;
        };
        self.revoke(Some(revocation)).await;
    }

    async fn disabled_exposed_key(&self, value: &Secret) -> Option<Revocation> {
        let identity = self.verify_api_key(value).await.ok()?;
        let key_id = identity.api_key_id()?;
        let disabled = self
            .look_up(move |store| async move { store.set_api_key_enabled(key_id, false).await })
            .await;
        match disabled {
            Ok(published) => {
                self.metrics.key_disabled_on_plaintext();
                tracing::warn!(
                    target: "keygate::security",
                    key_id = %key_id,
                    user_id = %identity.principal.user_id,
                    "disabled an API key that was sent over plain HTTP"
                );
                published.revocation
            }
            Err(error) => {
                tracing::error!(%error, "disabling an exposed API key failed");
                None
            }
        }
    }

    pub async fn verify(&self, credential: &Credential) -> Result<Identity, AuthFailure> {
        match credential {
            Credential::ApiKey(value) => self.verify_api_key(value).await,
            Credential::Bearer(token) => self.verify_token(token).await,
        }
    }

    /// When a credential stops being valid on its own (epoch ms): a token's
    /// `exp`, a key's expiration time. `None` for a key that never expires,
    /// or a credential that does not verify.
    pub async fn expiry(&self, credential: &Credential) -> Option<i64> {
        match credential {
            Credential::Bearer(token) => {
                let verified = self.verified_token(token.expose()).await.ok()?;
                Some(verified.claims.exp.saturating_mul(1000))
            }
            Credential::ApiKey(value) => {
                let key = self.key_state(KeyDigest::of(value.expose())).await.ok()??;
                (key.expiration_time != 0).then_some(key.expiration_time)
            }
        }
    }

    async fn verify_api_key(&self, value: &Secret) -> Result<Identity, AuthFailure> {
        let digest = KeyDigest::of(value.expose());
        let key = self.key_state(digest).await?.ok_or(AuthFailure::Unknown)?;
        if !key.enabled {
            return Err(AuthFailure::Disabled);
        }
        if key.expiration_time != 0 && crate::clock::now_ms() >= key.expiration_time {
            return Err(AuthFailure::Expired);
        }
        let user = self
            .user_state(key.user_id)
            .await?
            .ok_or(AuthFailure::Disabled)?;
        if !user.enabled {
            return Err(AuthFailure::Disabled);
        }
        Ok(Identity::new(
            user.principal.clone(),
            AuthMethod::ApiKey { key_id: key.id },
            id_header_value(&key.id),
        ))
    }

    async fn verify_token(&self, token: &Secret) -> Result<Identity, AuthFailure> {
        let verified = self.verified_token(token.expose()).await?;
        let claims = &verified.claims;
        // Every hit re-checks expiry and revocation.
        if claims.exp <= crate::clock::now_secs() {
            return Err(AuthFailure::TokenExpired);
        }
        let user = self
            .user_state(claims.user_id)
            .await?
            .ok_or(AuthFailure::Outdated)?;
        if !user.enabled {
            return Err(AuthFailure::Disabled);
        }
        if claims.iat < user.tokens_valid_after {
            return Err(AuthFailure::Outdated);
        }
        // A session that is gone (never stored, or pruned once dead) is
        // refused exactly like an ended one.
        let session = self
            .session_state(claims.session_id)
            .await?
            .ok_or(AuthFailure::Outdated)?;
        if session.ended || session.user_id != claims.user_id {
            return Err(AuthFailure::Outdated);
        }
        Ok(Identity::new(
            user.principal.clone(),
            AuthMethod::Jwt {
                session_id: claims.session_id,
            },
            verified.session_header.clone(),
        ))
    }

    /// Signature checks are pure CPU; their results are cached. The cache
    /// is looked up by the start of the token's signature, a MAC under the
    /// signing key that no one else can produce, and a hit counts only when
    /// the whole token is byte for byte the one verified: a token whose
    /// header or claims were altered misses, and its signature check fails.
    /// Keying by a SHA-256 of the whole token cost more than everything else
    /// in the check (criterion `verify/jwt_hit` 544 ns, of which the digest
    /// of a 400-byte token was about 300).
    async fn verified_token(&self, token: &str) -> Result<Arc<VerifiedToken>, AuthFailure> {
        let key = token_key(token);
        if let Some(hit) = self.caches.tokens.get(&key)
            && *hit.token == *token
        {
            return Ok(hit);
        }
        let claims = self.tokens.verify_access(token)?;
        let lifetime = self.caches.token_lifetime(&claims);
        let verified = Arc::new(VerifiedToken {
            session_header: id_header_value(&claims.session_id),
            claims,
            token: token.into(),
        });
        self.caches.tokens.insert(key, verified.clone(), lifetime);
        Ok(verified)
    }

    async fn key_state(&self, digest: KeyDigest) -> Result<Lookup<KeyState>, AuthFailure> {
        let lifetimes = self.caches.lifetimes;
        self.caches
            .keys
            .get_or_fetch(&digest, || async move {
                let record = self
                    .look_up(
                        move |store| async move { store.api_key_by_digest(&digest.to_hex()).await },
                    )
                    .await?;
                let state = record.map(|k| KeyState {
                    id: k.id,
                    user_id: k.user_id,
                    enabled: k.enabled,
                    expiration_time: k.expiration_time,
                });
                Ok::<_, StoreError>((state, lifetimes.of(&state)))
            })
            .await
            .map_err(|e| self.store_failure(&e))
    }

    async fn user_state(&self, id: Uuid) -> Result<Lookup<Arc<UserState>>, AuthFailure> {
        let lifetimes = self.caches.lifetimes;
        self.caches
            .users
            .get_or_fetch(&id, || async move {
                let record = self
                    .look_up(move |store| async move { store.user_by_id(id).await })
                    .await?;
                let state = record.map(|u| Arc::new(user_state(&u)));
                Ok::<_, StoreError>((state.clone(), lifetimes.of(&state)))
            })
            .await
            .map_err(|e| self.store_failure(&e))
    }

    async fn session_state(&self, id: Uuid) -> Result<Lookup<SessionState>, AuthFailure> {
        let lifetimes = self.caches.lifetimes;
        self.caches
            .sessions
            .get_or_fetch(&id, || async move {
                let record = self
                    .look_up(move |store| async move { store.session_by_id(id).await })
                    .await?;
                let state = record.map(|s| SessionState {
                    user_id: s.user_id,
                    ended: s.ended,
                });
                Ok::<_, StoreError>((state, lifetimes.of(&state)))
            })
            .await
            .map_err(|e| self.store_failure(&e))
    }

    /// Runs `work` on the store where the store lives ([`Store::at_home`]).
    async fn look_up<T, F>(&self, work: impl FnOnce(Store) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        self.store.at_home(work(self.store.clone())).await?
    }

    fn store_failure(&self, error: &StoreError) -> AuthFailure {
        tracing::error!(%error, "credential lookup failed");
        AuthFailure::StoreUnavailable
    }
}

/// The tokens cache's key for `token`: the first 32 characters of its
/// signature (192 bits of an HMAC-SHA512), zero-padded when shorter.
fn token_key(token: &str) -> [u8; 32] {
    let signature = token.rsplit_once('.').map_or(token, |(_, s)| s).as_bytes();
    let mut key = [0u8; 32];
    let n = signature.len().min(32);
    key[..n].copy_from_slice(&signature[..n]);
    key
}

/// What verification needs of a stored user.
pub fn user_state(user: &UserRecord) -> UserState {
    UserState {
        principal: Arc::new(Principal::new(
            user.id,
            user.tenant_id,
            user.customer_id,
            user.authority,
            user.email.clone(),
        )),
        enabled: user.enabled,
        tokens_valid_after: user.tokens_valid_after,
    }
}

#[cfg(test)]
mod tests;
