//! The credential caches and their invalidation.
//!
//! Five bounded [`Table`]s, each filled once per missing key from the store:
//! API keys by digest (unknown keys kept briefly as `None`), users by id,
//! sessions by id, verified access tokens by signature, and verified access
//! tokens of single sign-on providers by signature. A hit never touches
//! the store. Entries live at most `cache.ttl`, which bounds how long a change
//! made elsewhere (another process, a missed notification) can go unseen;
//! changes made through this process invalidate at once.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::api_key::KeyDigest;
use super::jwt::AccessClaims;
use super::scope::Scopes;
use crate::config::CacheSettings;
use crate::identity::{Passports, Principal};
pub use crate::table::Table;
use crate::telemetry::Metrics;

/// An API key's verifiable state, held inline: a million cached keys cost
/// their table entries and nothing more. An unscoped key holds no scopes
/// (one null pointer); a scoped one shares its grants with the record read.
#[derive(Debug, Clone)]
pub struct KeyState {
    pub id: Uuid,
    pub user_id: Uuid,
    pub enabled: bool,
    /// Epoch ms; 0 means never.
    pub expiration_time: i64,
    /// The grants the key is limited to; `None`: its owner's full rights.
    pub scopes: Option<Arc<Scopes>>,
}

/// A user's verifiable state.
#[derive(Debug)]
pub struct UserState {
    pub principal: Arc<Principal>,
    pub enabled: bool,
    pub tokens_valid_after: i64,
}

#[derive(Debug, Clone, Copy)]
pub struct SessionState {
    pub user_id: Uuid,
    pub ended: bool,
}

/// A signature-verified access token.
#[derive(Debug)]
pub struct VerifiedToken {
    pub claims: AccessClaims,
    pub session_header: http::HeaderValue,
    /// The token as verified: a cache hit must present exactly this.
    pub token: Box<str>,
    /// The public user a public customer's token carries
    /// ([`Principal::public`]); `None` for a user's token.
    pub public: Option<Arc<Principal>>,
}

/// A single sign-on provider's access token, signature and claims
/// verified, with the user its e-mail claim found.
#[derive(Debug)]
pub struct VerifiedProviderToken {
    /// The token as verified: a cache hit must present exactly this.
    pub token: Box<str>,
    pub exp: i64,
    pub iat: i64,
    pub user_id: Uuid,
    /// Names the token ([`crate::identity::AuthMethod::Provider`]).
    pub token_id: Uuid,
    pub token_header: http::HeaderValue,
}

/// Cached lookups: `None` records that the store has no such item.
pub type Lookup<T> = Option<T>;

/// How long a lookup is kept: unknown items for the short negative TTL, known
/// ones for the regular TTL.
#[derive(Clone, Copy)]
pub struct Lifetimes {
    pub known: Duration,
    pub unknown: Duration,
}

impl Lifetimes {
    pub fn of<T>(&self, lookup: &Lookup<T>) -> Duration {
        if lookup.is_some() {
            self.known
        } else {
            self.unknown
        }
    }
}

pub struct Caches {
    /// Credentials held open by WebSockets, woken by every revocation.
    pub live: Arc<super::live::LiveCredentials>,
    pub keys: Table<KeyDigest, Lookup<KeyState>>,
    pub users: Table<Uuid, Lookup<Arc<UserState>>>,
    pub sessions: Table<Uuid, Lookup<SessionState>>,
    pub tokens: Table<[u8; 32], Arc<VerifiedToken>>,
    /// Verified access tokens of single sign-on providers, by signature.
    pub provider_tokens: Table<[u8; 32], Arc<VerifiedProviderToken>>,
    /// Assertions and platform tokens kept for reuse: derived from
    /// credentials, so dropped with them.
    pub passports: Arc<Passports>,
    pub lifetimes: Lifetimes,
}

impl Caches {
    pub fn new(
        settings: &CacheSettings,
        metrics: &Arc<Metrics>,
        passports: Arc<Passports>,
    ) -> Caches {
        Caches {
            passports,
            live: Arc::default(),
            keys: Table::new(settings.capacity, metrics.init_cache("api_keys")),
            users: Table::new(settings.capacity, metrics.init_cache("users")),
            sessions: Table::new(settings.capacity, metrics.init_cache("sessions")),
            tokens: Table::new(settings.capacity, metrics.init_cache("tokens")),
            provider_tokens: Table::new(settings.capacity, metrics.init_cache("provider_tokens")),
            lifetimes: Lifetimes {
                known: settings.ttl,
                unknown: settings.negative_ttl.min(settings.ttl),
            },
        }
    }

    /// How long a verified token is kept: the regular TTL, and never past
    /// its own `exp`.
    pub(crate) fn token_lifetime(&self, claims: &AccessClaims) -> Duration {
        let left = (claims.exp - crate::clock::now_secs()).max(0) as u64;
        self.lifetimes.known.min(Duration::from_secs(left))
    }

    /// Forget one key, by its id.
    pub(crate) fn invalidate_key_id(&self, id: Uuid) {
        self.keys
            .invalidate_if(move |_, state| state.as_ref().is_some_and(|s| s.id == id));
        self.passports.forget_credential(id);
    }

    /// Forget what is cached of these key values, the finding that no key
    /// has them included: a key the platform sync just brought in works at
    /// once, not after `cache.negative_ttl`.
    pub fn forget_keys(&self, digests: &[KeyDigest]) {
        for digest in digests {
            self.keys.invalidate(digest);
        }
    }

    /// Forget every key value found unknown: keys were added to the store
    /// elsewhere (another replica's platform sync).
    pub fn forget_unknown_keys(&self) {
        self.keys.invalidate_if(|_, state| state.is_none());
    }

    /// Forget a user: their keys and tokens are re-checked against the store.
    pub fn invalidate_user(&self, id: Uuid) {
        self.users.invalidate(&id);
        self.passports.forget_user(id);
    }

    pub fn invalidate_session(&self, id: Uuid) {
        self.sessions.invalidate(&id);
        self.passports.forget_credential(id);
    }

    /// Forget every cached session of a user (password change, lockout).
    pub(crate) fn invalidate_sessions_of(&self, user_id: Uuid) {
        self.sessions
            .invalidate_if(move |_, state| state.as_ref().is_some_and(|s| s.user_id == user_id));
        self.passports.forget_user(user_id);
    }

    /// Forget everything (e.g. after a lost notification channel); every
    /// open socket checks its credential again.
    pub fn invalidate_all(&self) {
        self.keys.clear();
        self.users.clear();
        self.sessions.clear();
        self.tokens.clear();
        self.provider_tokens.clear();
        self.passports.clear();
        self.live.wake_all();
    }

    /// (name, entry count) of each cache, for metrics.
    pub(crate) fn sizes(&self) -> [(&'static str, u64); 6] {
        [
            ("api_keys", self.keys.len()),
            ("users", self.users.len()),
            ("sessions", self.sessions.len()),
            ("tokens", self.tokens.len()),
            ("provider_tokens", self.provider_tokens.len()),
            ("passports", self.passports.len()),
        ]
    }
}
