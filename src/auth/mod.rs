//! Authentication: from a parsed [`Credential`] to a verified [`Identity`].

pub(crate) mod api_key;
pub mod at_rest;
pub mod cache;
pub mod credential;
pub(crate) mod in_clear;
pub mod jwt;
pub(crate) mod limiter;
pub(crate) mod live;
pub(crate) mod outcomes;
pub mod password;
mod provider_token;
pub mod revocation;
pub use crate::vocab::scope;
pub mod second_factor;
pub mod totp;

use std::sync::Arc;

use prometheus::IntCounter;
use uuid::Uuid;

use self::api_key::KeyDigest;
use self::cache::{Caches, KeyState, Lookup, SessionState, UserState, VerifiedToken};
use self::credential::{Credential, CredentialError, Secret};
use self::jwt::{TokenError, TokenKeys};
use self::provider_token::Bearer;
use crate::address::AddressKey;
use crate::config::rate::Rate;
use crate::error::ApiError;
use crate::identity::{AuthMethod, Identity, Principal, id_header_value};
use crate::shared_limits::budget::{Budgets, Taken};
use crate::store::{Revocation, Store, StoreError, UserRecord};
use crate::telemetry::Metrics;
pub use crate::vocab::refusal::{AuthFailure, AuthRefusal};

impl AuthFailure {
    pub(crate) fn to_api_error(self) -> ApiError {
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
            // The Retry-After a request gets is the budget's
            // ([`Authenticator::to_api_error`]); one second stands in.
            AuthFailure::LookupsSpent => ApiError::too_many_requests(1),
            AuthFailure::OutOfScope => ApiError::out_of_scope(),
            AuthFailure::SecondFactorPending => ApiError::second_factor_pending(),
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
            TokenError::SecondFactorPending => AuthFailure::SecondFactorPending,
        }
    }
}

/// Why an API key's state could not be fetched.
enum KeyFetch {
    Store(StoreError),
    /// The client's unknown-key budget is spent: the store was not asked.
    Spent,
}

/// Verifies credentials through the caches, falling back to the store on a miss.
pub struct Authenticator {
    store: Store,
    tokens: Arc<TokenKeys>,
    caches: Caches,
    metrics: Arc<Metrics>,
    /// Store lookups of API keys each client address key may cause that find
    /// nothing; `None`: no budget.
    unknown_keys: Option<Budgets<AddressKey>>,
    /// `keygate_auth_store_lookups_total`, by what was looked up.
    lookups: [IntCounter; 3],
    /// Single sign-on providers, whose access tokens may be credentials.
    providers: Arc<crate::sso::Providers>,
}

/// The kinds of `keygate_auth_store_lookups_total`, in [`Authenticator::lookups`] order.
const LOOKUP_KINDS: [&str; 3] = ["api_key", "user", "session"];

impl Authenticator {
    pub fn new(
        store: Store,
        tokens: Arc<TokenKeys>,
        caches: Caches,
        metrics: Arc<Metrics>,
    ) -> Self {
        let lookups = metrics.store_lookups();
        Authenticator {
            store,
            tokens,
            caches,
            unknown_keys: None,
            lookups: LOOKUP_KINDS.map(|kind| lookups.with_label_values(&[kind])),
            metrics,
            providers: Arc::new(crate::sso::Providers::none()),
        }
    }

    /// Takes the access tokens of `providers` that accept them
    /// ([`provider_token`]).
    pub fn with_providers(mut self, providers: Arc<crate::sso::Providers>) -> Authenticator {
        self.providers = providers;
        self
    }

    /// Gives each client address key `rate` store lookups of API keys that
    /// turn out unknown; past it, a key not already cached is answered 429
    /// without asking the store. At most `capacity` addresses are tracked.
    pub(crate) fn with_unknown_key_budget(mut self, rate: Rate, capacity: u64) -> Authenticator {
        self.unknown_keys = Some(Budgets::new("unknown_api_keys", rate, capacity));
        self
    }

    /// The client error of `failure`: a spent lookup budget carries its
    /// window as `Retry-After`.
    pub(crate) fn to_api_error(&self, failure: AuthFailure) -> ApiError {
        match (&self.unknown_keys, failure) {
            (Some(budget), AuthFailure::LookupsSpent) => {
                ApiError::too_many_requests(budget.rate().window.as_secs())
            }
            _ => failure.to_api_error(),
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
    /// random keys sent in clear cannot hammer the store, and the lookup of a
    /// key that turns out unknown is paid from `client`'s budget. The key is
    /// dropped here as a disable from the API or another replica drops it.
    pub(crate) async fn disable_exposed_key(&self, value: &Secret, client: Option<AddressKey>) {
        let Some(revocation) = self.disabled_exposed_key(value, client).await else {
            return;
        };
        self.revoke(Some(revocation)).await;
    }

    async fn disabled_exposed_key(
        &self,
        value: &Secret,
        client: Option<AddressKey>,
    ) -> Option<Revocation> {
        let identity = self.verify_api_key(value, client).await.ok()?;
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
        let verified = match credential {
            Credential::ApiKey(value) => self.verify_api_key(value, None).await,
            Credential::Bearer(token) => self.verify_token(token).await,
        };
        verified.map_err(|refusal| refusal.failure)
    }

    /// [`Authenticator::verify_explained`] without the explanation.
    #[cfg(test)]
    pub(crate) async fn verify_from(
        &self,
        credential: &Credential,
        client: AddressKey,
    ) -> Result<Identity, AuthFailure> {
        self.verify_explained(credential, client)
            .await
            .map_err(|refusal| refusal.failure)
    }

    /// [`Authenticator::verify`] for a request from `client`, whose unknown
    /// API keys are paid from its budget, saying whose credential a refused
    /// one is when that is known (for the access log).
    pub(crate) async fn verify_explained(
        &self,
        credential: &Credential,
        client: AddressKey,
    ) -> Result<Identity, AuthRefusal> {
        match credential {
            Credential::ApiKey(value) => self.verify_api_key(value, Some(client)).await,
            Credential::Bearer(token) => self.verify_token(token).await,
        }
    }

    /// When a credential stops being valid on its own (epoch ms): a token's
    /// `exp`, a key's expiration time. `None` for a key that never expires,
    /// or a credential that does not verify.
    pub async fn expiry(&self, credential: &Credential) -> Option<i64> {
        match credential {
            Credential::Bearer(token) => match self.bearer(token.expose()).await.ok()? {
                Bearer::Own(verified) => Some(verified.claims.exp.saturating_mul(1000)),
                Bearer::Provider(verified) => Some(verified.exp.saturating_mul(1000)),
            },
            Credential::ApiKey(value) => {
                let key = self
                    .key_state(KeyDigest::of(value.expose()), None)
                    .await
                    .ok()??;
                (key.expiration_time != 0).then_some(key.expiration_time)
            }
        }
    }

    async fn verify_api_key(
        &self,
        value: &Secret,
        client: Option<AddressKey>,
    ) -> Result<Identity, AuthRefusal> {
        let digest = KeyDigest::of(value.expose());
        let key = self
            .key_state(digest, client)
            .await?
            .ok_or(AuthFailure::Unknown)?;
        let refused = |failure| AuthRefusal {
            failure,
            key_id: Some(key.id),
            user_id: Some(key.user_id),
        };
        if !key.enabled {
            return Err(refused(AuthFailure::Disabled));
        }
        if key.expiration_time != 0 && crate::clock::now_ms() >= key.expiration_time {
            return Err(refused(AuthFailure::Expired));
        }
        let user = self
            .user_state(key.user_id)
            .await
            .map_err(refused)?
            .ok_or(refused(AuthFailure::Disabled))?;
        if !user.enabled {
            return Err(refused(AuthFailure::Disabled));
        }
        Ok(Identity::new(
            user.principal.clone(),
            AuthMethod::ApiKey { key_id: key.id },
            id_header_value(&key.id),
        )
        .with_scopes(key.scopes))
    }

    /// A bearer token, by the verifier its claimed issuer chooses: a
    /// provider's ([`provider_token`]) or keygate's.
    async fn verify_token(&self, token: &Secret) -> Result<Identity, AuthRefusal> {
        let verified = match self.bearer(token.expose()).await? {
            Bearer::Own(verified) => verified,
            Bearer::Provider(verified) => return self.provider_identity(&verified).await,
        };
        let claims = &verified.claims;
        let refused = |failure| AuthRefusal {
            failure,
            key_id: None,
            user_id: Some(claims.user_id),
        };
        // Every hit re-checks expiry and revocation.
        if claims.exp <= crate::clock::now_secs() {
            return Err(refused(AuthFailure::TokenExpired));
        }
        // A public user is no user of the store: as on the platform, its
        // token is the identity until it expires; its refresh re-checks
        // that the customer is still public.
        if let Some(public) = &verified.public {
            return Ok(Identity::new(
                public.clone(),
                AuthMethod::Jwt {
                    session_id: claims.session_id,
                },
                verified.session_header.clone(),
            ));
        }
        let user = self
            .user_state(claims.user_id)
            .await
            .map_err(refused)?
            .ok_or(refused(AuthFailure::Outdated))?;
        if !user.enabled {
            return Err(refused(AuthFailure::Disabled));
        }
        if claims.iat < user.tokens_valid_after {
            return Err(refused(AuthFailure::Outdated));
        }
        // A session that is gone (never stored, or pruned once dead) is
        // refused exactly like an ended one.
        let session = self
            .session_state(claims.session_id)
            .await
            .map_err(refused)?
            .ok_or(refused(AuthFailure::Outdated))?;
        if session.ended || session.user_id != claims.user_id {
            return Err(refused(AuthFailure::Outdated));
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
    ///
    /// Here: a token verified with keygate's key (a miss of
    /// [`Authenticator::bearer`]), and kept.
    fn verify_own(&self, key: [u8; 32], token: &str) -> Result<Arc<VerifiedToken>, AuthFailure> {
        let claims = self.tokens.verify_access(token)?;
        let lifetime = self.caches.token_lifetime(&claims);
        let public = claims
            .is_public
            .then(|| Arc::new(Principal::public(claims.customer_id, claims.tenant_id)));
        let verified = Arc::new(VerifiedToken {
            public,
            session_header: id_header_value(&claims.session_id),
            claims,
            token: token.into(),
        });
        self.caches.tokens.insert(key, verified.clone(), lifetime);
        Ok(verified)
    }

    /// A key's state from the cache, else from the store. A lookup from
    /// `client` is paid from its unknown-key budget before the store is asked,
    /// and given back when the key exists: only misses cost it.
    async fn key_state(
        &self,
        digest: KeyDigest,
        client: Option<AddressKey>,
    ) -> Result<Lookup<KeyState>, AuthFailure> {
        let lifetimes = self.caches.lifetimes;
        self.caches
            .keys
            .get_or_fetch(&digest, || async move {
                let paid = self.pay_lookup(client)?;
                self.lookups[0].inc();
                let record = self
                    .look_up(
                        move |store| async move { store.api_key_by_digest(&digest.to_hex()).await },
                    )
                    .await
                    .map_err(KeyFetch::Store)?;
                if let (Some(paid), Some(_)) = (paid, &record) {
                    paid.give_back();
                }
                let state = record.map(|k| KeyState {
                    id: k.id,
                    user_id: k.user_id,
                    enabled: k.enabled,
                    expiration_time: k.expiration_time,
                    scopes: k.scopes,
                });
                let lifetime = lifetimes.of(&state);
                Ok((state, lifetime))
            })
            .await
            .map_err(|e| match e {
                KeyFetch::Store(e) => self.store_failure(&e),
                KeyFetch::Spent => AuthFailure::LookupsSpent,
            })
    }

    /// Takes one unit of `client`'s unknown-key budget, if it has one.
    fn pay_lookup(&self, client: Option<AddressKey>) -> Result<Option<Taken>, KeyFetch> {
        let (Some(budget), Some(client)) = (&self.unknown_keys, client) else {
            return Ok(None);
        };
        match budget.take(client) {
            Ok(paid) => Ok(Some(paid)),
            Err(_) => {
                self.metrics.rate_limited("unknown_api_keys");
                tracing::warn!(target: "keygate::security", %client, "unknown API key budget spent: answered without a store lookup");
                Err(KeyFetch::Spent)
            }
        }
    }

    async fn user_state(&self, id: Uuid) -> Result<Lookup<Arc<UserState>>, AuthFailure> {
        let lifetimes = self.caches.lifetimes;
        self.caches
            .users
            .get_or_fetch(&id, || async move {
                self.lookups[1].inc();
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
                self.lookups[2].inc();
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
pub(crate) fn user_state(user: &UserRecord) -> UserState {
    UserState {
        principal: Arc::new(
            Principal::new(
                user.id,
                user.tenant_id,
                user.customer_id,
                user.authority,
                user.email.clone(),
            )
            .with_names(&user.first_name, &user.last_name),
        ),
        enabled: user.enabled,
        tokens_valid_after: user.tokens_valid_after,
    }
}

#[cfg(test)]
mod tests;
