//! Store behaviour, checked on SQLite always and on PostgreSQL when
//! `KEYGATE_TEST_DATABASE_URL` is set (each test in a schema of its own).
//!
//! Each behaviour is one `check_*` function; `store_tests!` runs every check
//! once per backend, so both dialects are held to the same expectations.

use std::ops::Deref;

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::*;
use crate::identity::NULL_UUID;

const PG_ENV: &str = "KEYGATE_TEST_DATABASE_URL";

/// A store on a database of its own, and how to reach and remove it.
struct TestDb {
    store: Store,
    url: String,
    /// PostgreSQL: (base URL, schema) to drop at the end.
    schema: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Deref for TestDb {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl TestDb {
    async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let store = Store::connect(&url, 4).await.unwrap();
        assert_eq!(store.dialect(), Dialect::Sqlite);
        TestDb {
            store,
            url,
            schema: None,
            _dir: Some(dir),
        }
    }

    /// None when PostgreSQL is not configured; panics when it is but fails.
    async fn postgres() -> Option<TestDb> {
        let Ok(base) = std::env::var(PG_ENV) else {
            println!("{PG_ENV} is not set: PostgreSQL variant not run");
            return None;
        };
        let schema = format!("kg_test_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let mut admin = PgConnection::connect(&base)
            .await
            .unwrap_or_else(|e| panic!("{PG_ENV} is set but connecting failed: {e}"));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let _ = admin.close().await;
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-c%20search_path%3D{schema}");
        let store = Store::connect(&url, 2).await.unwrap();
        assert_eq!(store.dialect(), Dialect::Postgres);
        let current = sqlx::query("SELECT current_schema()::text")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(current.try_get::<String, _>(0).unwrap(), schema);
        Some(TestDb {
            store,
            url,
            schema: Some((base, schema)),
            _dir: None,
        })
    }

    /// Closes the store and drops the PostgreSQL schema (best effort).
    async fn finish(self) {
        self.store.close().await;
        if let Some((base, schema)) = self.schema {
            if let Ok(mut admin) = PgConnection::connect(&base).await {
                let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
                let _ = sqlx::raw_sql(AssertSqlSafe(drop)).execute(&mut admin).await;
                let _ = admin.close().await;
            }
        }
    }
}

/// Two `#[tokio::test]`s per check: `sqlite::<check>` and `postgres::<check>`.
macro_rules! store_tests {
    ($($check:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $check() {
                    let db = super::TestDb::sqlite().await;
                    super::$check(&db).await;
                    db.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $check() {
                    let Some(db) = super::TestDb::postgres().await else { return };
                    super::$check(&db).await;
                    db.finish().await;
                }
            )*
        }
    };
}

store_tests!(
    check_migrations_are_idempotent,
    check_ping_answers,
    check_users_are_found_by_id_and_any_case_email,
    check_duplicate_email_is_a_conflict,
    check_users_list_by_created_time_then_email,
    check_disabling_a_user_outdates_tokens_and_ends_sessions,
    check_deleting_a_user_removes_their_keys_and_sessions,
    check_api_keys_are_found_listed_toggled_and_deleted,
    check_duplicate_digest_is_a_conflict,
    check_sessions_are_found_and_ended,
    check_settings_first_value_wins,
    check_flags_and_i64_round_trip,
    check_refresh_rotation_accepts_only_the_current_token,
    check_password_change_outdates_tokens_and_ends_sessions_but_rehash_does_not,
    check_lockout_counts_locks_and_is_lifted_by_enabling,
    check_activation_token_is_used_once_when_raced,
    check_activation_never_sets_the_password_of_an_active_account,
    check_activation_ends_earlier_sessions_of_the_user,
);

fn user(email: &str, created_time: i64) -> UserRecord {
    UserRecord {
        id: Uuid::new_v4(),
        created_time,
        tenant_id: Uuid::new_v4(),
        customer_id: NULL_UUID,
        email: email.into(),
        authority: Authority::TenantAdmin,
        first_name: "First".into(),
        last_name: String::new(),
        phone: "+1 555".into(),
        additional_info: Some(r#"{"description":"x"}"#.into()),
        version: 1,
        enabled: true,
        password_hash: "$argon2id$fake".into(),
        tokens_valid_after: 0,
    }
}

fn key(user: &UserRecord, digest: &str, created_time: i64) -> ApiKeyRecord {
    ApiKeyRecord {
        id: Uuid::new_v4(),
        created_time,
        tenant_id: user.tenant_id,
        user_id: user.id,
        digest: digest.into(),
        description: format!("key {digest}"),
        enabled: true,
        expiration_time: 0,
    }
}

fn session(user: &UserRecord) -> SessionRecord {
    SessionRecord {
        id: Uuid::new_v4(),
        user_id: user.id,
        created_time: 1_700_000_000_000,
        ended: false,
        refresh_jti: "jti-1".into(),
    }
}

async fn check_migrations_are_idempotent(db: &TestDb) {
    let u = user("keep@example.com", 1);
    db.insert_user(&u).await.unwrap();
    // A second process on the same database: no migration runs twice, data stays.
    let again = Store::connect(&db.url, 2).await.unwrap();
    assert_eq!(again.user_by_id(u.id).await.unwrap(), Some(u));
    let row = sqlx::query("SELECT COUNT(*) FROM keygate_migrations")
        .fetch_one(&again.pool)
        .await
        .unwrap();
    let expected = migrate::count(again.dialect()) as i64;
    assert_eq!(row.try_get::<i64, _>(0).unwrap(), expected);
    again.close().await;
}

async fn check_ping_answers(store: &Store) {
    store.ping().await.unwrap();
    assert_eq!(store.user_count().await.unwrap(), 0);
}

async fn check_users_are_found_by_id_and_any_case_email(store: &Store) {
    let u = user("alice@example.com", 1_700_000_000_123);
    store.insert_user(&u).await.unwrap();
    assert_eq!(store.user_by_id(u.id).await.unwrap(), Some(u.clone()));
    let by_email = store.user_by_email(" Alice@Example.COM ").await.unwrap();
    assert_eq!(by_email, Some(u.clone()));
    assert_eq!(store.user_by_id(Uuid::new_v4()).await.unwrap(), None);
    assert_eq!(store.user_by_email("bob@example.com").await.unwrap(), None);
    assert_eq!(store.user_count().await.unwrap(), 1);
}

async fn check_duplicate_email_is_a_conflict(store: &Store) {
    let (first, again) = (user("dup@example.com", 1), user("dup@example.com", 2));
    store.insert_user(&first).await.unwrap();
    let err = store.insert_user(&again).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict("email")), "{err:?}");
    assert_eq!(store.user_count().await.unwrap(), 1);
}

async fn check_users_list_by_created_time_then_email(store: &Store) {
    for (email, t) in [
        ("c@x.io", 30),
        ("b@x.io", 10),
        ("a@x.io", 30),
        ("d@x.io", 20),
    ] {
        store.insert_user(&user(email, t)).await.unwrap();
    }
    let listed = store.list_users().await.unwrap();
    let emails: Vec<&str> = listed.iter().map(|u| u.email.as_str()).collect();
    assert_eq!(emails, ["b@x.io", "d@x.io", "a@x.io", "c@x.io"]);
}

async fn check_disabling_a_user_outdates_tokens_and_ends_sessions(store: &Store) {
    let (u, other) = (user("off@example.com", 1), user("on@example.com", 2));
    store.insert_user(&u).await.unwrap();
    store.insert_user(&other).await.unwrap();
    let (s, other_s) = (session(&u), session(&other));
    store.insert_session(&s).await.unwrap();
    store.insert_session(&other_s).await.unwrap();

    let (t1, t2) = (1_750_000_000, 1_760_000_000);
    assert!(store.set_user_enabled(u.id, false, t1).await.unwrap());
    let off = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(!off.enabled);
    assert_eq!(off.version, 2);
    assert_eq!(off.tokens_valid_after, t1);
    assert!(store.session_by_id(s.id).await.unwrap().unwrap().ended);
    // Nobody else is touched.
    assert_eq!(
        store.session_by_id(other_s.id).await.unwrap(),
        Some(other_s)
    );
    assert_eq!(store.user_by_id(other.id).await.unwrap(), Some(other));

    // Enabling again bumps the version and keeps the outdating time.
    assert!(store.set_user_enabled(u.id, true, t2).await.unwrap());
    let on = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(on.enabled);
    assert_eq!(on.version, 3);
    assert_eq!(on.tokens_valid_after, t1);

    let nobody = Uuid::new_v4();
    assert!(!store.set_user_enabled(nobody, false, t2).await.unwrap());
}

async fn check_deleting_a_user_removes_their_keys_and_sessions(store: &Store) {
    let (u, other) = (user("gone@example.com", 1), user("stays@example.com", 2));
    store.insert_user(&u).await.unwrap();
    store.insert_user(&other).await.unwrap();
    let (k, other_k) = (key(&u, "d1", 1), key(&other, "d2", 1));
    store.insert_api_key(&k).await.unwrap();
    store.insert_api_key(&other_k).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();

    assert!(store.delete_user(u.id).await.unwrap());
    assert_eq!(store.user_by_id(u.id).await.unwrap(), None);
    assert_eq!(store.api_key_by_id(k.id).await.unwrap(), None);
    assert_eq!(store.api_key_by_digest("d1").await.unwrap(), None);
    assert_eq!(store.session_by_id(s.id).await.unwrap(), None);
    assert!(!store.delete_user(u.id).await.unwrap());

    let kept = store.api_key_by_id(other_k.id).await.unwrap();
    assert_eq!(kept, Some(other_k));
    assert_eq!(store.user_count().await.unwrap(), 1);
}

async fn check_api_keys_are_found_listed_toggled_and_deleted(store: &Store) {
    let u = user("keys@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let (late, early) = (key(&u, "late", 2_000), key(&u, "early", 1_000));
    store.insert_api_key(&late).await.unwrap();
    store.insert_api_key(&early).await.unwrap();

    let by_digest = store.api_key_by_digest("late").await.unwrap();
    assert_eq!(by_digest, Some(late.clone()));
    let by_id = store.api_key_by_id(early.id).await.unwrap();
    assert_eq!(by_id, Some(early.clone()));
    assert_eq!(store.api_key_by_digest("nope").await.unwrap(), None);
    // Ordered by created_time, not by insertion.
    let listed = store.list_api_keys(u.id).await.unwrap();
    assert_eq!(listed, [early.clone(), late.clone()]);
    let nobody = Uuid::new_v4();
    assert!(store.list_api_keys(nobody).await.unwrap().is_empty());

    assert!(store.set_api_key_enabled(late.id, false).await.unwrap());
    assert!(!store.api_key_by_id(late.id).await.unwrap().unwrap().enabled);
    assert!(store.set_api_key_enabled(late.id, true).await.unwrap());
    assert!(store.api_key_by_id(late.id).await.unwrap().unwrap().enabled);
    assert!(!store.set_api_key_enabled(nobody, false).await.unwrap());

    assert!(store.delete_api_key(late.id).await.unwrap());
    assert!(!store.delete_api_key(late.id).await.unwrap());
    assert_eq!(store.list_api_keys(u.id).await.unwrap(), [early]);
}

async fn check_duplicate_digest_is_a_conflict(store: &Store) {
    let u = user("digest@example.com", 1);
    store.insert_user(&u).await.unwrap();
    store.insert_api_key(&key(&u, "same", 1)).await.unwrap();
    let err = store.insert_api_key(&key(&u, "same", 2)).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict("digest")), "{err:?}");
    assert_eq!(store.list_api_keys(u.id).await.unwrap().len(), 1);
}

async fn check_sessions_are_found_and_ended(store: &Store) {
    let u = user("sessions@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.session_by_id(s.id).await.unwrap(), Some(s.clone()));
    assert_eq!(store.session_by_id(Uuid::new_v4()).await.unwrap(), None);

    assert!(store.end_session(s.id).await.unwrap());
    let ended = store.session_by_id(s.id).await.unwrap().unwrap();
    assert_eq!(ended, SessionRecord { ended: true, ..s });
    assert!(!store.end_session(Uuid::new_v4()).await.unwrap());
}

async fn check_settings_first_value_wins(store: &Store) {
    assert_eq!(
        store.get_or_create_setting("KEY", "aaa").await.unwrap(),
        "aaa"
    );
    assert_eq!(
        store.get_or_create_setting("KEY", "bbb").await.unwrap(),
        "aaa"
    );
    assert_eq!(
        store.get_or_create_setting("NEW", "ccc").await.unwrap(),
        "ccc"
    );
}

/// Flags are 0/1 integers and times are i64 on both dialects; the extremes
/// and both flag values must come back as they went in.
async fn check_flags_and_i64_round_trip(store: &Store) {
    let mut u = user("bits@example.com", i64::MAX);
    u.enabled = false;
    u.version = i64::from(u32::MAX) + 7;
    u.tokens_valid_after = i64::MIN;
    u.additional_info = None;
    store.insert_user(&u).await.unwrap();
    assert_eq!(store.user_by_id(u.id).await.unwrap(), Some(u.clone()));

    let mut k = key(&u, "bits", i64::MIN);
    k.enabled = false;
    k.expiration_time = 4_102_444_800_000;
    store.insert_api_key(&k).await.unwrap();
    assert_eq!(store.api_key_by_id(k.id).await.unwrap(), Some(k.clone()));
    let mut on = key(&u, "bits-on", 0);
    on.expiration_time = i64::MAX;
    store.insert_api_key(&on).await.unwrap();
    assert_eq!(store.api_key_by_digest("bits-on").await.unwrap(), Some(on));

    let mut s = session(&u);
    s.ended = true;
    s.created_time = -1;
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.session_by_id(s.id).await.unwrap(), Some(s));
}

async fn check_refresh_rotation_accepts_only_the_current_token(store: &Store) {
    let u = user("rotate@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    assert!(store.rotate_refresh(s.id, "jti-1", "jti-2").await.unwrap());
    assert!(
        !store.rotate_refresh(s.id, "jti-1", "jti-3").await.unwrap(),
        "retired token"
    );
    assert_eq!(
        store
            .session_by_id(s.id)
            .await
            .unwrap()
            .unwrap()
            .refresh_jti,
        "jti-2"
    );
    store.end_session(s.id).await.unwrap();
    assert!(
        !store.rotate_refresh(s.id, "jti-2", "jti-4").await.unwrap(),
        "ended session"
    );
}

async fn check_password_change_outdates_tokens_and_ends_sessions_but_rehash_does_not(
    store: &Store,
) {
    let u = user("pw@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    assert!(store.update_password(u.id, "rehashed", None).await.unwrap());
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(
        (
            after.password_hash.as_str(),
            after.tokens_valid_after,
            after.version
        ),
        ("rehashed", 0, u.version)
    );
    assert!(!store.session_by_id(s.id).await.unwrap().unwrap().ended);
    assert!(
        store
            .update_password(u.id, "changed", Some(1_800_000_000))
            .await
            .unwrap()
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(
        (after.password_hash.as_str(), after.tokens_valid_after),
        ("changed", 1_800_000_000)
    );
    assert_eq!(after.version, u.version + 1);
    assert!(store.session_by_id(s.id).await.unwrap().unwrap().ended);
    assert!(
        !store
            .update_password(Uuid::new_v4(), "x", None)
            .await
            .unwrap()
    );
}

async fn check_lockout_counts_locks_and_is_lifted_by_enabling(store: &Store) {
    let u = user("lock@example.com", 1);
    store.insert_user(&u).await.unwrap();
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 1);
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 2);
    store.clear_login_failures(u.id).await.unwrap();
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 1);
    assert!(!store.is_locked(u.id).await.unwrap());
    assert!(store.lock_user(u.id, 1_800_000_000).await.unwrap());
    assert!(store.is_locked(u.id).await.unwrap());
    let locked = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(!locked.enabled);
    assert_eq!(locked.tokens_valid_after, 1_800_000_000);
    store.clear_login_failures(u.id).await.unwrap();
    assert!(
        store.is_locked(u.id).await.unwrap(),
        "a success cannot clear a lock"
    );
    store
        .set_user_enabled(u.id, true, 1_800_000_001)
        .await
        .unwrap();
    assert!(!store.is_locked(u.id).await.unwrap());
    assert!(store.user_by_id(u.id).await.unwrap().unwrap().enabled);
}

fn pending(email: &str) -> UserRecord {
    UserRecord {
        password_hash: String::new(),
        ..user(email, 1)
    }
}

async fn check_activation_token_is_used_once_when_raced(store: &Store) {
    let u = pending("race@example.com");
    store.insert_user(&u).await.unwrap();
    store
        .replace_activation(u.id, "tok", i64::MAX)
        .await
        .unwrap();
    assert_eq!(store.activation_user("tok", 0).await.unwrap(), Some(u.id));
    let (a, b) = tokio::join!(
        store.activate("tok", "hash-a", 0, 1_800_000_000),
        store.activate("tok", "hash-b", 0, 1_800_000_000),
    );
    let winners = [a.unwrap(), b.unwrap()];
    assert_eq!(winners.iter().flatten().count(), 1, "{winners:?}");
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(matches!(after.password_hash.as_str(), "hash-a" | "hash-b"));
    assert_eq!(store.activation_user("tok", 0).await.unwrap(), None);
    assert_eq!(store.activate("tok", "hash-c", 0, 1).await.unwrap(), None);
}

async fn check_activation_never_sets_the_password_of_an_active_account(store: &Store) {
    let u = user("active@example.com", 1);
    store.insert_user(&u).await.unwrap();
    store
        .replace_activation(u.id, "tok", i64::MAX)
        .await
        .unwrap();
    assert_eq!(
        store
            .activate("tok", "attacker", 0, 1_800_000_000)
            .await
            .unwrap(),
        None
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(after.password_hash, u.password_hash);
    assert_eq!(after.tokens_valid_after, 0);
    // The void token is consumed, not left for another try.
    assert_eq!(store.activation_user("tok", 0).await.unwrap(), None);
}

async fn check_activation_ends_earlier_sessions_of_the_user(store: &Store) {
    let u = pending("sessions@example.com");
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    store.replace_activation(u.id, "tok", 10).await.unwrap();
    assert_eq!(
        store.activation_user("tok", 10).await.unwrap(),
        None,
        "expired"
    );
    store
        .replace_activation(u.id, "tok", i64::MAX)
        .await
        .unwrap();
    assert_eq!(
        store
            .activate("tok", "first", 0, 1_800_000_000)
            .await
            .unwrap(),
        Some(u.id)
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(after.tokens_valid_after, 1_800_000_000);
    assert_eq!(after.version, u.version + 1);
    assert!(store.session_by_id(s.id).await.unwrap().unwrap().ended);
}
