//! `Authenticator` over a real SQLite store, real token keys and real caches.

use std::time::Duration;

use http::StatusCode;

use super::*;
use crate::config::CacheSettings;
use crate::identity::Authority;
use crate::store::SessionRecord;

const SECRET: &[u8] = &[7u8; 64];

fn token_keys(secret: &[u8]) -> TokenKeys {
    TokenKeys::new(
        secret,
        "thingsboard.io",
        Duration::from_secs(9000),
        Duration::from_secs(604_800),
    )
}

struct Fixture {
    auth: Authenticator,
    store: Store,
    tokens: Arc<TokenKeys>,
    metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Fixture {
        Fixture::with_budget(None).await
    }

    /// With an unknown-key budget per client address, when given.
    async fn with_budget(budget: Option<Rate>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let store = Store::connect(&url, 4).await.unwrap();
        let tokens = Arc::new(token_keys(SECRET));
        let metrics = Arc::new(Metrics::new());
        let caches = Caches::new(
            &CacheSettings {
                capacity: 1000,
                ttl: Duration::from_secs(60),
                negative_ttl: Duration::from_secs(5),
            },
            &metrics,
            Arc::new(crate::identity::Passports::new(1000, &metrics)),
        );
        let mut auth = Authenticator::new(store.clone(), tokens.clone(), caches, metrics.clone());
        if let Some(rate) = budget {
            auth = auth.with_unknown_key_budget(rate, 1000);
        }
        Fixture {
            auth,
            store,
            tokens,
            metrics,
            _dir: dir,
        }
    }

    async fn user(&self, email: &str) -> UserRecord {
        let user = UserRecord {
            first_name: "Test".into(),
            created_time: crate::clock::now_ms(),
            password_hash: password::hash("password123".into()).await.unwrap(),
            ..UserRecord::test_user(email)
        };
        self.store.insert_user(&user).await.unwrap();
        user
    }

    /// A new key of `user`: its id and the credential presenting it.
    async fn key(&self, user: &UserRecord, expiration_time: i64) -> (Uuid, Credential) {
        self.scoped_key(user, expiration_time, None).await
    }

    /// A new key of `user` limited to `scopes` (none: the user's rights).
    async fn scoped_key(
        &self,
        user: &UserRecord,
        expiration_time: i64,
        scopes: Option<Arc<crate::vocab::scope::Scopes>>,
    ) -> (Uuid, Credential) {
        let generated = api_key::generate("tb_").unwrap();
        let record = crate::store::ApiKeyRecord {
            id: Uuid::new_v4(),
            created_time: crate::clock::now_ms(),
            tenant_id: user.tenant_id,
            user_id: user.id,
            digest: generated.digest.to_hex(),
            description: "test".into(),
            enabled: true,
            expiration_time,
            scopes,
        };
        self.store.insert_api_key(&record).await.unwrap();
        (record.id, Credential::ApiKey(generated.value))
    }

    /// A stored session of `user` and an access token of it issued at `iat`.
    async fn token(&self, user: &UserRecord, iat: i64) -> (Uuid, Credential) {
        let session = SessionRecord::open(user.id, crate::clock::now_ms(), "jti".into());
        self.store.insert_session(&session).await.unwrap();
        let signed = self.tokens.sign_access(user, session.id, iat).unwrap();
        (session.id, bearer(&signed.token))
    }

    async fn accepted(&self, credential: &Credential) -> Identity {
        self.auth.verify(credential).await.unwrap()
    }

    async fn refused(&self, credential: &Credential) -> AuthFailure {
        self.auth.verify(credential).await.unwrap_err()
    }

    fn caches(&self) -> &Caches {
        self.auth.caches()
    }

    /// Changes a key in the store only, behind the caches' back.
    async fn set_key_enabled(&self, id: Uuid, enabled: bool) {
        assert!(
            self.store
                .set_api_key_enabled(id, enabled)
                .await
                .unwrap()
                .outcome
        );
    }

    /// Changes a user in the store only, behind the caches' back.
    async fn set_user_enabled(&self, id: Uuid, enabled: bool, now_secs: i64) {
        let store = &self.store;
        assert!(
            store
                .set_user_enabled(id, enabled, now_secs)
                .await
                .unwrap()
                .outcome
        );
    }

    /// `keygate_cache_requests_total` for one cache and result.
    fn cache_count(&self, cache: &str, result: &str) -> u64 {
        let prefix =
            format!(r#"keygate_cache_requests_total{{cache="{cache}",result="{result}"}} "#);
        self.metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |n| n.parse().unwrap())
    }
}

fn bearer(token: &str) -> Credential {
    Credential::Bearer(Secret::new(token))
}

fn now() -> i64 {
    crate::clock::now_secs()
}

// --- API keys -------------------------------------------------------------------

#[tokio::test]
async fn valid_api_key_yields_its_users_identity() {
    let f = Fixture::new().await;
    let user = f.user("Keys@Example.com").await;
    let (key_id, key) = f.key(&user, 0).await;
    let identity = f.accepted(&key).await;
    assert_eq!(identity.principal.user_id, user.id);
    assert_eq!(identity.principal.tenant_id, user.tenant_id);
    assert_eq!(identity.principal.authority, Authority::TenantAdmin);
    assert_eq!(identity.principal.email, "keys@example.com");
    assert_eq!(identity.method, AuthMethod::ApiKey { key_id });
    assert_eq!(identity.api_key_id(), Some(key_id));
}

fn from(last: u8) -> AddressKey {
    AddressKey::of(std::net::IpAddr::from([198, 51, 100, last]), 64)
}

#[tokio::test]
async fn sprayed_unknown_keys_stop_reaching_the_store_at_the_address_budget() {
    let budget = Rate {
        limit: 5,
        window: Duration::from_secs(60),
    };
    let f = Fixture::with_budget(Some(budget)).await;
    let user = f.user("cached@example.com").await;
    let (_, valid) = f.key(&user, 0).await;
    f.auth.verify_from(&valid, from(1)).await.unwrap();
    let before = f.auth.lookups[0].get();
    let mut refusals = Vec::new();
    for i in 0..50 {
        let random = Credential::ApiKey(Secret::new(format!("tb_sprayed-{i}")));
        refusals.push(f.auth.verify_from(&random, from(1)).await.unwrap_err());
    }
    assert_eq!(
        f.auth.lookups[0].get() - before,
        5,
        "lookups stop at the budget"
    );
    assert!(refusals[..5].iter().all(|r| *r == AuthFailure::Unknown));
    assert!(
        refusals[5..]
            .iter()
            .all(|r| *r == AuthFailure::LookupsSpent)
    );
    let error = f.auth.to_api_error(AuthFailure::LookupsSpent);
    assert_eq!((error.status.as_u16(), error.retry_after), (429, Some(60)));
    // A cached key still answers from the spent address.
    f.auth.verify_from(&valid, from(1)).await.unwrap();
    // Another address has its own budget.
    let other = Credential::ApiKey(Secret::new("tb_from-elsewhere"));
    let refused = f.auth.verify_from(&other, from(2)).await.unwrap_err();
    assert_eq!(refused, AuthFailure::Unknown);
}

#[tokio::test]
async fn a_known_key_looked_up_costs_no_unknown_key_budget() {
    let budget = Rate {
        limit: 1,
        window: Duration::from_secs(60),
    };
    let f = Fixture::with_budget(Some(budget)).await;
    let user = f.user("known@example.com").await;
    for _ in 0..3 {
        let (_, key) = f.key(&user, 0).await;
        f.auth.verify_from(&key, from(3)).await.unwrap();
    }
    let unknown = Credential::ApiKey(Secret::new("tb_unknown"));
    assert_eq!(
        f.auth.verify_from(&unknown, from(3)).await.unwrap_err(),
        AuthFailure::Unknown
    );
}

#[tokio::test]
async fn a_scoped_keys_grants_come_from_the_cache_without_a_store_lookup() {
    let f = Fixture::new().await;
    let user = f.user("scoped@example.com").await;
    let scopes = crate::auth::scope::Scopes::from_json(&serde_json::json!([
        {"path": "/api/device/", "methods": ["GET"]}
    ]))
    .unwrap();
    let (_, credential) = f.scoped_key(&user, 0, Some(Arc::new(scopes.clone()))).await;
    let first = f.accepted(&credential).await;
    assert_eq!(first.scopes(), Some(&scopes));
    let before = f.auth.lookups[0].get();
    let cached = f.accepted(&credential).await;
    assert_eq!(f.auth.lookups[0].get(), before, "a hit reads no store");
    assert_eq!(cached.scopes(), Some(&scopes));
    let upstream = || crate::auth::scope::Effect::Upstream;
    assert!(cached.permits(&http::Method::GET, "/api/device/x", upstream));
    assert!(!cached.permits(&http::Method::POST, "/api/device/x", upstream));
    let credential_class = || crate::auth::scope::Effect::Credential;
    assert!(!cached.permits(&http::Method::GET, "/api/device/x", credential_class));
    let (_, unscoped) = f.key(&user, 0).await;
    let whole = f.accepted(&unscoped).await;
    assert_eq!(whole.scopes(), None);
    assert!(whole.permits(&http::Method::DELETE, "/anything", upstream));
    assert!(whole.permits(&http::Method::GET, "/anything", credential_class));
}

#[tokio::test]
async fn identical_concurrent_unknown_keys_share_one_store_lookup() {
    let f = Fixture::new().await;
    let unknown = Credential::ApiKey(Secret::new("tb_the-same-unknown-key"));
    let before = f.auth.lookups[0].get();
    let all = (0..64).map(|_| f.auth.verify_from(&unknown, from(4)));
    let refusals = futures_util::future::join_all(all).await;
    assert!(
        refusals
            .iter()
            .all(|r| matches!(r, Err(AuthFailure::Unknown)))
    );
    assert_eq!(f.auth.lookups[0].get() - before, 1);
}

#[tokio::test]
async fn unknown_api_key_is_refused_and_negatively_cached() {
    let f = Fixture::new().await;
    let unknown = Credential::ApiKey(Secret::new("tb_no-such-key"));
    assert_eq!(f.refused(&unknown).await, AuthFailure::Unknown);
    assert_eq!(f.cache_count("api_keys", "miss"), 1);
    assert_eq!(f.cache_count("api_keys", "hit"), 0);
    assert_eq!(f.refused(&unknown).await, AuthFailure::Unknown);
    assert_eq!(f.cache_count("api_keys", "miss"), 1);
    assert_eq!(f.cache_count("api_keys", "hit"), 1);
}

#[tokio::test]
async fn disabled_api_key_is_refused() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (key_id, key) = f.key(&user, 0).await;
    f.set_key_enabled(key_id, false).await;
    assert_eq!(f.refused(&key).await, AuthFailure::Disabled);
}

#[tokio::test]
async fn expired_api_key_is_refused_and_unexpired_one_accepted() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (_, expired) = f.key(&user, crate::clock::now_ms() - 1_000).await;
    assert_eq!(f.refused(&expired).await, AuthFailure::Expired);
    let (_, later) = f.key(&user, crate::clock::now_ms() + 3_600_000).await;
    f.accepted(&later).await;
}

#[tokio::test]
async fn api_key_of_disabled_user_is_refused() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (_, key) = f.key(&user, 0).await;
    f.set_user_enabled(user.id, false, now()).await;
    assert_eq!(f.refused(&key).await, AuthFailure::Disabled);
}

#[tokio::test]
async fn api_key_of_deleted_user_is_refused() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (key_id, key) = f.key(&user, 0).await;
    f.accepted(&key).await;
    assert!(f.store.delete_user(user.id).await.unwrap().outcome);
    // Forgetting the user is enough while the key is still cached...
    f.caches().invalidate_user(user.id);
    assert_eq!(f.refused(&key).await, AuthFailure::Disabled);
    // ...and once the key is forgotten too, the store no longer knows it.
    f.caches().invalidate_key_id(key_id);
    assert_eq!(f.refused(&key).await, AuthFailure::Unknown);
}

/// The documented cache bound: a change made behind the cache's back is seen
/// only once the entry is invalidated (or its TTL ends).
#[tokio::test]
async fn disabled_key_is_accepted_from_cache_until_invalidated() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (key_id, key) = f.key(&user, 0).await;
    f.accepted(&key).await;
    f.set_key_enabled(key_id, false).await;
    f.accepted(&key).await;
    f.caches().invalidate_key_id(key_id);
    assert_eq!(f.refused(&key).await, AuthFailure::Disabled);
}

#[tokio::test]
async fn invalidating_a_disabled_user_refuses_keys_and_tokens_at_once() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (_, key) = f.key(&user, 0).await;
    let (_, token) = f.token(&user, now()).await;
    f.accepted(&key).await;
    f.accepted(&token).await;
    f.set_user_enabled(user.id, false, now()).await;
    // Until then the cached user state still answers (the cache bound)...
    f.accepted(&key).await;
    f.accepted(&token).await;
    // ...and forgetting the user refuses both credentials at once.
    f.caches().invalidate_user(user.id);
    assert_eq!(f.refused(&key).await, AuthFailure::Disabled);
    assert_eq!(f.refused(&token).await, AuthFailure::Disabled);
}

#[tokio::test]
async fn cache_hit_never_touches_the_store() {
    let f = Fixture::new().await;
    let user = f.user("a@example.com").await;
    let (_, key) = f.key(&user, 0).await;
    let (_, token) = f.token(&user, now()).await;
    f.accepted(&key).await;
    f.accepted(&token).await;
    f.store.close().await;
    // The store is really gone: a lookup that misses the cache fails...
    let unknown = Credential::ApiKey(Secret::new("tb_not-cached"));
    assert_eq!(f.refused(&unknown).await, AuthFailure::StoreUnavailable);
    // ...while cached credentials still authenticate.
    assert_eq!(f.accepted(&key).await.principal.user_id, user.id);
    assert_eq!(f.accepted(&token).await.principal.user_id, user.id);
}

// --- JWTs -----------------------------------------------------------------------

#[tokio::test]
async fn access_token_of_live_session_is_accepted() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let (session_id, token) = f.token(&user, now()).await;
    let identity = f.accepted(&token).await;
    assert_eq!(identity.method, AuthMethod::Jwt { session_id });
    assert_eq!(identity.principal.user_id, user.id);
    assert_eq!(identity.principal.email, "jwt@example.com");
    assert_eq!(identity.api_key_id(), None);
}

#[tokio::test]
async fn token_of_ended_session_is_outdated() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let (session_id, token) = f.token(&user, now()).await;
    f.accepted(&token).await;
    assert!(
        f.store
            .end_session(session_id, crate::clock::now_ms())
            .await
            .unwrap()
            .outcome
    );
    f.caches().invalidate_session(session_id);
    assert_eq!(f.refused(&token).await, AuthFailure::Outdated);
}

#[tokio::test]
async fn token_issued_before_tokens_valid_after_is_outdated() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let cutoff = now();
    // Disabling and enabling again moves tokens_valid_after to `cutoff`.
    f.set_user_enabled(user.id, false, cutoff).await;
    f.set_user_enabled(user.id, true, cutoff).await;
    let (_, older) = f.token(&user, cutoff - 1).await;
    assert_eq!(f.refused(&older).await, AuthFailure::Outdated);
    let (_, same_second) = f.token(&user, cutoff).await;
    f.accepted(&same_second).await;
}

#[tokio::test]
async fn token_of_unknown_session_is_outdated() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let signed = f.tokens.sign_access(&user, Uuid::new_v4(), now()).unwrap();
    assert_eq!(
        f.refused(&bearer(&signed.token)).await,
        AuthFailure::Outdated
    );
}

/// The tokens cache is looked up by the start of the signature: another
/// user's claims presented under a cached token's signature must be
/// checked, and refused, not taken for the cached token.
#[tokio::test]
async fn altered_claims_under_the_signature_of_a_cached_token_are_refused() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let admin = f.user("admin@example.com").await;
    let (session_id, _) = f.token(&user, now()).await;
    let (admin_session, _) = f.token(&admin, now()).await;
    let genuine = f
        .tokens
        .sign_access(&user, session_id, now())
        .unwrap()
        .token;
    f.accepted(&bearer(&genuine)).await;
    let other = f
        .tokens
        .sign_access(&admin, admin_session, now())
        .unwrap()
        .token;
    let (_, signature) = genuine.rsplit_once('.').unwrap();
    let (claims, _) = other.rsplit_once('.').unwrap();
    let forged = format!("{claims}.{signature}");
    assert_eq!(f.refused(&bearer(&forged)).await, AuthFailure::BadSignature);
    let identity = f.accepted(&bearer(&genuine)).await;
    assert_eq!(
        identity.principal.user_id, user.id,
        "the cached token still passes"
    );
}

#[tokio::test]
async fn refresh_token_is_the_wrong_scope() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let (session_id, _) = f.token(&user, now()).await;
    let refresh = f.tokens.sign_refresh(&user, session_id, "jti", now());
    let refresh = bearer(&refresh.unwrap().token);
    assert_eq!(f.refused(&refresh).await, AuthFailure::WrongScope);
}

#[tokio::test]
async fn token_signed_with_another_key_is_a_bad_signature() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    let (session_id, _) = f.token(&user, now()).await;
    let foreign = token_keys(&[8u8; 64]).sign_access(&user, session_id, now());
    let foreign = bearer(&foreign.unwrap().token);
    assert_eq!(f.refused(&foreign).await, AuthFailure::BadSignature);
}

#[tokio::test]
async fn expired_token_is_refused_as_expired() {
    let f = Fixture::new().await;
    let user = f.user("jwt@example.com").await;
    // Issued 10 000 s ago with a 9 000 s lifetime.
    let (_, token) = f.token(&user, now() - 10_000).await;
    assert_eq!(f.refused(&token).await, AuthFailure::TokenExpired);
}

// --- errors ---------------------------------------------------------------------

#[test]
fn failures_map_to_the_contract_errors() {
    use AuthFailure::*;
    const UNAUTHORIZED: StatusCode = StatusCode::UNAUTHORIZED;
    let table = [
        (Missing, UNAUTHORIZED, 10, "Authentication failed"),
        (Malformed, UNAUTHORIZED, 10, "Authentication failed"),
        (Unknown, UNAUTHORIZED, 10, "Invalid username or password"),
        (WrongScope, UNAUTHORIZED, 10, "Invalid username or password"),
        (Disabled, UNAUTHORIZED, 10, "User account is not active"),
        (Expired, UNAUTHORIZED, 10, "API key is expired"),
        (TokenExpired, UNAUTHORIZED, 11, "Token has expired"),
        (BadSignature, UNAUTHORIZED, 11, "Token has expired"),
        (Outdated, UNAUTHORIZED, 11, "Token has expired"),
        (
            PlaintextRefused,
            StatusCode::FORBIDDEN,
            20,
            "API keys are accepted only over HTTPS",
        ),
        (
            StoreUnavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            2,
            "Service is temporarily unavailable",
        ),
        (
            OutOfScope,
            StatusCode::FORBIDDEN,
            20,
            "This API key's scopes do not allow this request",
        ),
        (
            SecondFactorPending,
            StatusCode::UNAUTHORIZED,
            10,
            "A second factor is pending: finish the login at /api/auth/2fa/verification/check first",
        ),
    ];
    // A new variant does not compile here until the table above covers it.
    let _covered = |f: AuthFailure| match f {
        Missing | Malformed | Unknown | WrongScope | Disabled | Expired | TokenExpired
        | BadSignature | Outdated | PlaintextRefused | StoreUnavailable | OutOfScope
        | SecondFactorPending => (),
        // Checked below: it carries a Retry-After.
        LookupsSpent => (),
    };
    let spent = LookupsSpent.to_api_error();
    assert_eq!(
        (spent.status, spent.code),
        (StatusCode::TOO_MANY_REQUESTS, 33)
    );
    assert!(spent.retry_after.is_some());
    for (failure, status, code, message) in table {
        let error = failure.to_api_error();
        assert_eq!(
            (error.status, error.code, &*error.message),
            (status, code, message),
            "{failure:?}"
        );
        assert_eq!(error.retry_after, None, "{failure:?}");
    }
}
