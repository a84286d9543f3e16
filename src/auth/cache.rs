//! The credential caches and their invalidation.
//!
//! Four bounded moka caches, each filled single-flight from the store on a miss:
//! API keys by digest (unknown keys cached briefly as `None`), users by id,
//! sessions by id, and verified access tokens by digest. A hit never touches the
//! store. Entries live at most `cache.ttl`, which bounds how long a change made
//! elsewhere (another process, a missed notification) can go unseen; changes
//! made through this process invalidate at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use moka::Expiry;
use moka::future::Cache;
use moka::notification::RemovalCause;
use uuid::Uuid;

use super::api_key::KeyDigest;
use super::jwt::AccessClaims;
use crate::config::CacheSettings;
use crate::identity::Principal;
use crate::telemetry::{CacheSeries, Metrics};

/// An API key's verifiable state.
#[derive(Debug)]
pub struct KeyState {
    pub id: Uuid,
    pub user_id: Uuid,
    pub enabled: bool,
    /// Epoch ms; 0 means never.
    pub expiration_time: i64,
    pub id_header: HeaderValue,
}

/// A user's verifiable state.
#[derive(Debug)]
pub struct UserState {
    pub principal: Arc<Principal>,
    pub enabled: bool,
    pub tokens_valid_after: i64,
}

#[derive(Debug)]
pub struct SessionState {
    pub user_id: Uuid,
    pub ended: bool,
}

/// A signature-verified access token.
#[derive(Debug)]
pub struct VerifiedToken {
    pub claims: AccessClaims,
    pub session_header: HeaderValue,
}

/// Cached lookups: `None` records that the store has no such item.
pub type Lookup<T> = Option<Arc<T>>;

/// Unknown items expire after the short negative TTL; known ones after the
/// regular TTL, and verified tokens no later than their own `exp`.
struct Lifetimes {
    negative: Duration,
}

impl<K, T> Expiry<K, Lookup<T>> for Lifetimes {
    fn expire_after_create(&self, _key: &K, value: &Lookup<T>, _now: Instant) -> Option<Duration> {
        value.is_none().then_some(self.negative)
    }
}

struct TokenLifetime {
    max: Duration,
}

impl Expiry<[u8; 32], Arc<VerifiedToken>> for TokenLifetime {
    fn expire_after_create(
        &self,
        _key: &[u8; 32],
        value: &Arc<VerifiedToken>,
        _now: Instant,
    ) -> Option<Duration> {
        let left = (value.claims.exp - crate::clock::now_secs()).max(0) as u64;
        Some(self.max.min(Duration::from_secs(left)))
    }
}

/// Counts entries pushed out by the size bound (not expiry or invalidation).
fn count_evictions<K, V>(
    series: &CacheSeries,
) -> impl Fn(Arc<K>, V, RemovalCause) + Send + Sync + 'static {
    let series = series.clone();
    move |_key, _value, cause| {
        if cause == RemovalCause::Size {
            series.eviction();
        }
    }
}

/// Each cache's lookup counters, resolved when the caches are built.
pub struct CacheCounters {
    pub keys: CacheSeries,
    pub users: CacheSeries,
    pub sessions: CacheSeries,
    pub tokens: CacheSeries,
}

pub struct Caches {
    /// Credentials held open by WebSockets, woken by every revocation.
    pub live: Arc<super::live::LiveCredentials>,
    pub keys: Cache<KeyDigest, Lookup<KeyState>>,
    pub users: Cache<Uuid, Lookup<UserState>>,
    pub sessions: Cache<Uuid, Lookup<SessionState>>,
    pub tokens: Cache<[u8; 32], Arc<VerifiedToken>>,
    pub counters: CacheCounters,
}

impl Caches {
    pub fn new(settings: &CacheSettings, metrics: &Arc<Metrics>) -> Caches {
        let negative = settings.negative_ttl.min(settings.ttl);
        let counters = CacheCounters {
            keys: metrics.init_cache("api_keys"),
            users: metrics.init_cache("users"),
            sessions: metrics.init_cache("sessions"),
            tokens: metrics.init_cache("tokens"),
        };
        Caches {
            live: Arc::default(),
            keys: Cache::builder()
                .name("api_keys")
                .max_capacity(settings.capacity)
                .eviction_listener(count_evictions(&counters.keys))
                .time_to_live(settings.ttl)
                .expire_after(Lifetimes { negative })
                .support_invalidation_closures()
                .build(),
            users: Cache::builder()
                .name("users")
                .max_capacity(settings.capacity)
                .eviction_listener(count_evictions(&counters.users))
                .time_to_live(settings.ttl)
                .expire_after(Lifetimes { negative })
                .build(),
            sessions: Cache::builder()
                .name("sessions")
                .max_capacity(settings.capacity)
                .eviction_listener(count_evictions(&counters.sessions))
                .time_to_live(settings.ttl)
                .expire_after(Lifetimes { negative })
                .support_invalidation_closures()
                .build(),
            tokens: Cache::builder()
                .name("tokens")
                .max_capacity(settings.capacity)
                .eviction_listener(count_evictions(&counters.tokens))
                .expire_after(TokenLifetime { max: settings.ttl })
                .build(),
            counters,
        }
    }

    /// Forget one key, by its digest.
    pub async fn invalidate_key(&self, digest: &KeyDigest) {
        self.keys.invalidate(digest).await;
    }

    /// Forget one key, by its id.
    pub fn invalidate_key_id(&self, id: Uuid) {
        // Only fails when closures are unsupported, which the builder enabled.
        let _ = self
            .keys
            .invalidate_entries_if(move |_, state| state.as_ref().is_some_and(|s| s.id == id));
    }

    /// Forget a user: their keys and tokens are re-checked against the store.
    pub async fn invalidate_user(&self, id: Uuid) {
        self.users.invalidate(&id).await;
    }

    pub async fn invalidate_session(&self, id: Uuid) {
        self.sessions.invalidate(&id).await;
    }

    /// Forget every cached session of a user (password change, lockout).
    pub fn invalidate_sessions_of(&self, user_id: Uuid) {
        // Only fails when closures are unsupported, which the builder enabled.
        let _ = self.sessions.invalidate_entries_if(move |_, state| {
            state.as_ref().is_some_and(|s| s.user_id == user_id)
        });
    }

    /// Forget everything (e.g. after a lost notification channel); every
    /// open socket checks its credential again.
    pub fn invalidate_all(&self) {
        self.keys.invalidate_all();
        self.users.invalidate_all();
        self.sessions.invalidate_all();
        self.tokens.invalidate_all();
        self.live.wake_all();
    }

    /// (name, entry count) of each cache, for metrics.
    pub fn sizes(&self) -> [(&'static str, u64); 4] {
        [
            ("api_keys", self.keys.entry_count()),
            ("users", self.users.entry_count()),
            ("sessions", self.sessions.entry_count()),
            ("tokens", self.tokens.entry_count()),
        ]
    }
}
