//! Store behaviour, checked on SQLite always and on PostgreSQL when
//! `KEYGATE_TEST_DATABASE_URL` is set (each test in a schema of its own),
//! and once more through a PgBouncer in transaction mode started by the
//! test before that server (each test in a database of its own: a
//! `search_path` set per connection would not survive the pooler).
//!
//! Each behaviour is one `check_*` function; `store_tests!` runs every check
//! once per backend, so both dialects, and both ways of reaching
//! PostgreSQL, are held to the same expectations.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};
use uuid::Uuid;

use super::*;
use crate::store::retention::{CLOCK_SLACK, Pruned, Pruner};
use crate::telemetry::Metrics;
use crate::vocab::identity::{Authority, NULL_UUID};
use crate::vocab::settings::RetentionSettings;

const PG_ENV: &str = "KEYGATE_TEST_DATABASE_URL";

#[path = "../../tests/common/pgbouncer.rs"]
mod pgbouncer_server;

/// A store on a database of its own, and how to reach and remove it.
struct TestDb {
    store: Store,
    url: String,
    /// What `url` reaches.
    pooler: Pooler,
    /// PostgreSQL: (base URL, schema) to drop at the end.
    schema: Option<(String, String)>,
    /// Through PgBouncer: (base URL, database) to drop at the end, and the
    /// PgBouncer (stopped first).
    database: Option<(String, String, pgbouncer_server::PgBouncer)>,
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
        TestDb::sqlite_through(i64::MAX).await
    }

    /// A database migrated up to version `last` only.
    async fn sqlite_through(last: i64) -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let store = Store::connect_through(&url, OpenOptions::server(4), last)
            .await
            .unwrap();
        assert_eq!(store.dialect(), Dialect::Sqlite);
        TestDb {
            store,
            url,
            pooler: Pooler::None,
            schema: None,
            database: None,
            _dir: Some(dir),
        }
    }

    /// How another store on this one's database opens with `connections`.
    fn options(&self, connections: u32) -> OpenOptions {
        OpenOptions::server(connections).through(self.pooler, None)
    }

    /// A store on the test PostgreSQL server; panics when it is not
    /// configured (the PostgreSQL variants are ignored unless asked for) or
    /// fails.
    async fn postgres() -> Option<TestDb> {
        TestDb::postgres_through(i64::MAX).await
    }

    /// Another database of the same dialect as `self`, migrated up to `last`.
    async fn another_through(&self, last: i64) -> TestDb {
        match (self.dialect(), self.pooler) {
            (Dialect::Sqlite, _) => TestDb::sqlite_through(last).await,
            (Dialect::Postgres, Pooler::None) => TestDb::postgres_through(last).await.unwrap(),
            (Dialect::Postgres, Pooler::Transaction) => {
                TestDb::pgbouncer_through(last).await.unwrap()
            }
        }
    }

    async fn postgres_through(last: i64) -> Option<TestDb> {
        let Ok(base) = std::env::var(PG_ENV) else {
            panic!("{PG_ENV} is not set: the PostgreSQL variants need it");
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
        let store = Store::connect_through(&url, OpenOptions::server(2), last)
            .await
            .unwrap();
        assert_eq!(store.dialect(), Dialect::Postgres);
        let current = sqlx::query("SELECT current_schema()::text")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(current.try_get::<String, _>(0).unwrap(), schema);
        Some(TestDb {
            store,
            url,
            pooler: Pooler::None,
            schema: Some((base, schema)),
            database: None,
            _dir: None,
        })
    }

    /// A store on a database of its own on the test PostgreSQL server,
    /// reached through a PgBouncer in transaction mode; `None` (skipped)
    /// when PgBouncer is not installed.
    async fn pgbouncer() -> Option<TestDb> {
        TestDb::pgbouncer_through(i64::MAX).await
    }

    async fn pgbouncer_through(last: i64) -> Option<TestDb> {
        let Ok(base) = std::env::var(PG_ENV) else {
            panic!("{PG_ENV} is not set: the PgBouncer variants need it");
        };
        let Some(bouncer) = pgbouncer_server::PgBouncer::before(&base) else {
            let required = std::env::var_os("KEYGATE_TEST_REQUIRE_TOOLS").is_some()
                || std::env::var_os("CI").is_some();
            assert!(!required, "the PgBouncer store suite needs pgbouncer");
            eprintln!("SKIPPED: the PgBouncer store suite: pgbouncer is not installed");
            return None;
        };
        let database = format!("kg_test_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let mut admin = PgConnection::connect(&base).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let _ = admin.close().await;
        let url = bouncer.url(&database);
        let options = OpenOptions::server(2).through(Pooler::Transaction, None);
        let store = Store::connect_through(&url, options, last).await.unwrap();
        Some(TestDb {
            store,
            url,
            pooler: Pooler::Transaction,
            schema: None,
            database: Some((base, database, bouncer)),
            _dir: None,
        })
    }

    /// Closes the store and drops the PostgreSQL schema or database (best
    /// effort).
    async fn finish(self) {
        self.store.close().await;
        if let Some((base, schema)) = self.schema
            && let Ok(mut admin) = PgConnection::connect(&base).await
        {
            let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
            let _ = sqlx::raw_sql(AssertSqlSafe(drop)).execute(&mut admin).await;
            let _ = admin.close().await;
        }
        if let Some((base, database, bouncer)) = self.database {
            drop(bouncer);
            if let Ok(mut admin) = PgConnection::connect(&base).await {
                let drop = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
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
                #[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
                async fn $check() {
                    let Some(db) = super::TestDb::postgres().await else { return };
                    super::$check(&db).await;
                    db.finish().await;
                }
            )*
        }
        mod pgbouncer {
            $(
                #[tokio::test]
                #[ignore = "needs PostgreSQL and pgbouncer: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
                async fn $check() {
                    let Some(db) = super::TestDb::pgbouncer().await else { return };
                    super::$check(&db).await;
                    db.finish().await;
                }
            )*
        }
    };
}

store_tests!(
    check_migrations_are_idempotent,
    check_a_schema_behind_names_its_pending_migrations_until_migrated,
    check_ping_answers,
    check_users_are_found_by_id_and_any_case_email,
    check_duplicate_email_is_a_conflict,
    check_users_list_by_created_time_then_email,
    check_disabling_a_user_outdates_tokens_and_ends_sessions,
    check_deleting_a_user_removes_their_keys_and_sessions,
    check_api_keys_are_found_listed_toggled_and_deleted,
    check_duplicate_digest_is_a_conflict,
    check_api_keys_per_user_are_capped_even_when_created_at_once,
    check_a_customer_id_stays_with_the_tenant_that_used_it_first,
    check_upgrade_binds_each_customer_id_to_its_earliest_users_tenant,
    check_sessions_are_found_and_ended,
    check_settings_first_value_wins,
    check_flags_and_i64_round_trip,
    check_refresh_rotation_accepts_only_the_current_token,
    check_password_change_outdates_tokens_and_ends_sessions_but_rehash_does_not,
    check_a_rehash_remembers_the_hash_it_replaced_until_a_password_is_set,
    check_lockout_counts_locks_and_is_lifted_by_enabling,
    check_activation_token_is_used_once_when_raced,
    check_activation_never_sets_the_password_of_an_active_account,
    check_activation_ends_earlier_sessions_of_the_user,
    check_a_new_activation_token_keeps_the_pending_ones,
    check_an_activation_token_reads_as_valid_expired_or_unknown_without_being_used,
    check_reset_token_is_used_once_when_raced_and_ends_sessions_keeping_keys,
    check_a_new_reset_token_voids_the_older_and_expired_ones,
    check_sessions_record_rotation_and_first_end_times,
    check_pruning_deletes_dead_sessions_past_retention_only,
    check_pruning_deletes_expired_activation_tokens_only,
    check_a_single_sign_on_state_is_taken_once_across_replicas_when_raced,
    check_pruning_deletes_single_sign_on_states_once_their_cookie_expired,
    check_pruning_respects_batch_and_run_bounds,
    check_concurrent_pruners_delete_each_row_once,
    check_upgrade_keeps_existing_sessions_for_a_refresh_lifetime,
    check_changes_return_the_revocation_they_publish,
    check_an_audited_change_stores_its_event_and_a_failed_one_none,
    check_pruning_deletes_audit_events_past_their_retention_only,
    check_two_factor_configs_are_added_once_defaulted_and_removed,
    check_a_totp_step_is_used_once_when_raced,
    check_a_backup_code_is_used_once_when_raced,
    check_two_factor_rows_go_with_their_user,
    check_a_second_factor_change_ends_every_session_but_the_one_making_it,
    check_a_second_factor_the_platform_changes_ends_every_session_of_the_user,
    check_api_key_scopes_are_stored_as_given_and_absent_when_unscoped,
    check_user_pages_are_scoped_and_sorted_by_the_asked_property,
    check_public_customers_are_replaced_as_a_set_and_name_their_tenant,
    check_revocations_after_name_each_changed_user_and_key_once,
);

async fn check_user_pages_are_scoped_and_sorted_by_the_asked_property(store: &Store) {
    let (tenant, customer) = (Uuid::new_v4(), Uuid::new_v4());
    let admin = UserRecord {
        tenant_id: tenant,
        first_name: "Zoe".into(),
        ..user("admin@scope.io", 1)
    };
    store.insert_user(&admin).await.unwrap();
    for (email, first, t) in [("b@scope.io", "Ann", 3), ("a@scope.io", "Cid", 2)] {
        let u = UserRecord {
            first_name: first.into(),
            ..customer_user(email, tenant, customer, t)
        };
        store.insert_user(&u).await.unwrap();
    }
    store
        .insert_user(&user("elsewhere@scope.io", 4))
        .await
        .unwrap();
    let page = |sort: Option<(&str, bool)>| PageRequest {
        page_size: 10,
        page: 0,
        text_search: None,
        sort: sort.map(|(property, descending)| Sort {
            property: property.into(),
            descending,
        }),
    };
    let emails = |page: &Page<UserRecord>| -> Vec<String> {
        page.data.iter().map(|u| u.email.clone()).collect()
    };
    let customers = UserScope {
        tenant_id: Some(tenant),
        customer_id: Some(customer),
        authority: None,
    };
    let by_time = store.users_page(&customers, &page(None)).await.unwrap();
    assert_eq!(emails(&by_time), ["a@scope.io", "b@scope.io"]);
    assert_eq!(by_time.total, 2);
    let by_name = store
        .users_page(&customers, &page(Some(("firstName", false))))
        .await
        .unwrap();
    assert_eq!(emails(&by_name), ["b@scope.io", "a@scope.io"]);
    let by_email_desc = store
        .users_page(&customers, &page(Some(("email", true))))
        .await
        .unwrap();
    assert_eq!(emails(&by_email_desc), ["b@scope.io", "a@scope.io"]);
    let admins = UserScope {
        tenant_id: Some(tenant),
        customer_id: None,
        authority: Some(Authority::TenantAdmin),
    };
    let admins = store.users_page(&admins, &page(None)).await.unwrap();
    assert_eq!(emails(&admins), ["admin@scope.io"]);
    let own = UserScope {
        tenant_id: Some(tenant),
        customer_id: Some(NULL_UUID),
        authority: None,
    };
    assert_eq!(store.users_page(&own, &page(None)).await.unwrap().total, 1);
    assert_eq!(store.customer_tenant(customer).await.unwrap(), Some(tenant));
    assert_eq!(store.customer_tenant(Uuid::new_v4()).await.unwrap(), None);
}

async fn check_public_customers_are_replaced_as_a_set_and_name_their_tenant(store: &Store) {
    let (tenant, first, second) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let public = |customer_id| PublicCustomer {
        customer_id,
        tenant_id: tenant,
    };
    assert_eq!(store.public_customer(first).await.unwrap(), None);
    let stored = store
        .replace_public_customers(&[public(first), public(second)], 1)
        .await
        .unwrap();
    assert_eq!(stored, 2);
    assert_eq!(
        store.public_customer(first).await.unwrap(),
        Some(public(first))
    );
    assert_eq!(store.customer_tenant(second).await.unwrap(), Some(tenant));
    store
        .replace_public_customers(&[public(second)], 2)
        .await
        .unwrap();
    assert_eq!(store.public_customer(first).await.unwrap(), None);
    assert_eq!(store.public_customers().await.unwrap(), [public(second)]);
    store.replace_public_customers(&[], 3).await.unwrap();
    assert!(store.public_customers().await.unwrap().is_empty());
}

fn factor(provider: &str, use_by_default: bool, secret: &str) -> TwoFactorRecord {
    TwoFactorRecord {
        provider: provider.into(),
        use_by_default,
        secret: secret.into(),
        last_step: 0,
    }
}

async fn check_two_factor_configs_are_added_once_defaulted_and_removed(store: &Store) {
    let u = user("factors@example.com", 1);
    store.insert_user(&u).await.unwrap();
    assert!(
        store
            .add_two_factor(u.id, &factor("TOTP", true, "sealed"), 1, None)
            .await
            .unwrap()
            .outcome
    );
    assert!(
        !store
            .add_two_factor(u.id, &factor("TOTP", false, "other"), 2, None)
            .await
            .unwrap()
            .outcome,
        "a provider is configured once"
    );
    assert!(
        store
            .add_two_factor(u.id, &factor("BACKUP_CODE", true, "[]"), 3, None)
            .await
            .unwrap()
            .outcome
    );
    let rows = store.two_factors(u.id).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].provider, "TOTP");
    assert_eq!(rows[0].secret, "sealed");
    assert!(!rows[0].use_by_default, "the new default took it");
    assert!(rows[1].use_by_default);
    assert!(
        store
            .set_two_factor_default(u.id, "TOTP", true)
            .await
            .unwrap()
    );
    let rows = store.two_factors(u.id).await.unwrap();
    assert!(rows[0].use_by_default && !rows[1].use_by_default);
    assert!(
        !store
            .set_two_factor_default(u.id, "EMAIL", true)
            .await
            .unwrap()
    );
    assert!(
        store
            .remove_two_factor(u.id, "TOTP", 5)
            .await
            .unwrap()
            .outcome
    );
    assert!(
        !store
            .remove_two_factor(u.id, "TOTP", 6)
            .await
            .unwrap()
            .outcome
    );
    assert_eq!(store.two_factors(u.id).await.unwrap().len(), 1);
}

async fn check_a_totp_step_is_used_once_when_raced(store: &Store) {
    let u = user("steps@example.com", 1);
    store.insert_user(&u).await.unwrap();
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .add_two_factor(u.id, &factor("TOTP", true, "sealed"), 1, None)
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        store.use_totp_step(u.id, 100, None),
        store.use_totp_step(u.id, 100, None),
    );
    assert_eq!([a.unwrap(), b.unwrap()].iter().filter(|w| **w).count(), 1);
    assert!(
        !store.use_totp_step(u.id, 99, None).await.unwrap(),
        "older step"
    );
    assert!(
        store
            .use_totp_step(u.id, 101, Some("resealed"))
            .await
            .unwrap()
    );
    let rows = store.two_factors(u.id).await.unwrap();
    assert_eq!(
        (rows[0].last_step, rows[0].secret.as_str()),
        (101, "resealed")
    );
}

async fn check_a_backup_code_is_used_once_when_raced(store: &Store) {
    let u = user("codes@example.com", 1);
    store.insert_user(&u).await.unwrap();
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .add_two_factor(u.id, &factor("BACKUP_CODE", false, r#"["a","b"]"#), 1, None)
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        store.use_backup_code(u.id, r#"["a","b"]"#, r#"["b"]"#),
        store.use_backup_code(u.id, r#"["a","b"]"#, r#"["b"]"#),
    );
    assert_eq!([a.unwrap(), b.unwrap()].iter().filter(|w| **w).count(), 1);
    assert_eq!(store.two_factors(u.id).await.unwrap()[0].secret, r#"["b"]"#);
}

async fn check_a_second_factor_the_platform_changes_ends_every_session_of_the_user(store: &Store) {
    let u = user("platform-factor@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let open = || SessionRecord::open(u.id, 10, Uuid::new_v4().to_string());
    let ended = |id| async move { store.session_by_id(id).await.unwrap().unwrap().ended };
    let before = open();
    store.insert_session(&before).await.unwrap();
    let put = store
        .put_imported_two_factor(u.id, &factor("TOTP", true, "sealed"), 20)
        .await
        .unwrap();
    assert_eq!(put.revocation, Some(Revocation::User(u.id)));
    assert!(
        ended(before.id).await,
        "a factor the platform set ends sessions"
    );
    let after = open();
    store.insert_session(&after).await.unwrap();
    let removed = store.remove_two_factor(u.id, "TOTP", 30).await.unwrap();
    assert_eq!(
        (removed.outcome, removed.revocation),
        (true, Some(Revocation::User(u.id)))
    );
    assert!(
        ended(after.id).await,
        "a factor the platform removed ends sessions"
    );
    let last = open();
    store.insert_session(&last).await.unwrap();
    let none = store.remove_two_factor(u.id, "TOTP", 40).await.unwrap();
    assert_eq!((none.outcome, none.revocation), (false, None));
    assert!(!ended(last.id).await, "nothing removed ends nothing");
}

async fn check_a_second_factor_change_ends_every_session_but_the_one_making_it(store: &Store) {
    let u = user("changes@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let open = || SessionRecord::open(u.id, 10, Uuid::new_v4().to_string());
    let (mine, other, third) = (open(), open(), open());
    for session in [&mine, &other, &third] {
        store.insert_session(session).await.unwrap();
    }
    let ended = |id| async move { store.session_by_id(id).await.unwrap().unwrap().ended };
    let added = store
        .add_two_factor(u.id, &factor("TOTP", true, "sealed"), 20, Some(mine.id))
        .await
        .unwrap();
    assert_eq!(
        (added.outcome, added.revocation),
        (true, Some(Revocation::User(u.id)))
    );
    assert!(
        !ended(mine.id).await,
        "the session that made the change goes on"
    );
    assert!(ended(other.id).await && ended(third.id).await);
    let again = store
        .add_two_factor(u.id, &factor("TOTP", true, "other"), 30, None)
        .await
        .unwrap();
    assert_eq!((again.outcome, again.revocation), (false, None));
    assert!(!ended(mine.id).await, "a refused change ends nothing");
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .add_two_factor(u.id, &factor("BACKUP_CODE", false, "[]"), 40, Some(mine.id))
        .await
        .unwrap();
    let later = open();
    store.insert_session(&later).await.unwrap();
    let removed = store
        .remove_second_factor(u.id, "TOTP", 50, Some(later.id))
        .await
        .unwrap();
    assert_eq!(
        (removed.outcome, removed.revocation),
        (true, Some(Revocation::User(u.id)))
    );
    assert!(ended(mine.id).await && !ended(later.id).await);
    assert!(
        store.two_factors(u.id).await.unwrap().is_empty(),
        "backup codes go with the last other provider"
    );
    let none = store
        .remove_second_factor(u.id, "TOTP", 60, None)
        .await
        .unwrap();
    assert_eq!((none.outcome, none.revocation), (false, None));
    assert!(!ended(later.id).await);
}

async fn check_two_factor_rows_go_with_their_user(store: &Store) {
    let u = user("gone@example.com", 1);
    store.insert_user(&u).await.unwrap();
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .add_two_factor(u.id, &factor("TOTP", true, "sealed"), 1, None)
        .await
        .unwrap();
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store.delete_user(u.id).await.unwrap();
    assert!(store.two_factors(u.id).await.unwrap().is_empty());
}

/// A key's scopes come back as they were stored; a key stored without
/// them (every key made before scopes existed) reads as unscoped.
async fn check_api_key_scopes_are_stored_as_given_and_absent_when_unscoped(store: &Store) {
    let u = user("scoped@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let whole = key(&u, "whole", 1);
    let scopes = crate::vocab::scope::Scopes::from_json(&serde_json::json!([
        {"path": "/api/device/", "methods": ["GET", "POST"]},
        {"path": "/api/auth/user", "methods": ["GET"]},
    ]))
    .unwrap();
    let scoped = ApiKeyRecord {
        scopes: Some(std::sync::Arc::new(scopes.clone())),
        ..key(&u, "scoped", 2)
    };
    store.insert_api_key(&whole).await.unwrap();
    store.insert_api_key(&scoped).await.unwrap();
    assert_eq!(store.api_key_by_digest("whole").await.unwrap(), Some(whole));
    let found = store.api_key_by_id(scoped.id).await.unwrap().unwrap();
    assert_eq!(found.scopes.as_deref(), Some(&scopes));
    let listed = store.list_api_keys(u.id).await.unwrap();
    assert_eq!(listed[1].scopes.as_deref(), Some(&scopes));
    // The creation's audit event holds the grants; an unscoped one none.
    let audited = store.audited(Audit::command_line("api_key.create"));
    let recorded = ApiKeyRecord {
        scopes: Some(std::sync::Arc::new(scopes.clone())),
        ..key(&u, "recorded", 3)
    };
    audited.insert_api_key(&recorded).await.unwrap();
    audited.insert_api_key(&key(&u, "plain", 4)).await.unwrap();
    let events = store.audit_events(2).await.unwrap();
    assert_eq!(events[0].scopes, None);
    assert_eq!(events[1].target_id, recorded.id);
    let stored = events[1].scopes.as_deref().unwrap();
    assert_eq!(
        crate::vocab::scope::Scopes::from_stored(stored).unwrap(),
        scopes
    );
}

/// Audit events are kept for `retention.audit_events`, then deleted.
async fn check_pruning_deletes_audit_events_past_their_retention_only(store: &Store) {
    let audited = store.audited(Audit::command_line("user.create"));
    for i in 0..3 {
        audited
            .insert_user(&user(&format!("kept{i}@example.com"), 1))
            .await
            .unwrap();
    }
    let (_tx, rx) = tokio::sync::watch::channel(false);
    // Written now, which is long before NOW: within 100,000 days, not one.
    let keeping = pruner(store, DAY, DAY);
    assert_eq!(keeping.run_once(NOW, &rx).await.unwrap().audit_events, 0);
    assert_eq!(store.audit_events(10).await.unwrap().len(), 3);
    let mut dropping = pruner(store, DAY, DAY);
    dropping.settings.audit_events = DAY;
    assert_eq!(dropping.run_once(NOW, &rx).await.unwrap().audit_events, 3);
    assert!(store.audit_events(10).await.unwrap().is_empty());
}

/// What another process changed is found by reading the audit events after
/// a sequence number: each changed user and key once, in order, and nothing
/// again from the sequence number returned.
async fn check_revocations_after_name_each_changed_user_and_key_once(store: &Store) {
    let start = store.last_audit_seq().await.unwrap();
    let created = user("polled@example.com", 1);
    store
        .audited(Audit::command_line("user.create"))
        .insert_user(&created)
        .await
        .unwrap();
    let k = key(&created, "polled-digest", 2);
    store
        .audited(Audit::command_line("api_key.create"))
        .insert_api_key(&k)
        .await
        .unwrap();
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .audited(Audit::command_line("api_key.disable"))
        .set_api_key_enabled(k.id, false)
        .await
        .unwrap();
    let (last, revocations) = store.revocations_after(start).await.unwrap();
    assert_eq!(
        revocations,
        [Revocation::User(created.id), Revocation::Key(k.id)]
    );
    assert!(last > start);
    assert_eq!(last, store.last_audit_seq().await.unwrap());
    assert_eq!(store.revocations_after(last).await.unwrap(), (last, vec![]));
}

/// A change made through an audited store writes its event with it; a
/// change that fails (a duplicate) or finds nothing to change writes none,
/// and a store not audited writes none either.
async fn check_an_audited_change_stores_its_event_and_a_failed_one_none(store: &Store) {
    let admin = user("audit-admin@example.com", 1);
    store.insert_user(&admin).await.unwrap();
    assert!(store.audit_events(10).await.unwrap().is_empty());

    let by_cli = store.audited(Audit::command_line("user.create"));
    let created = user("audited@example.com", 2);
    by_cli.insert_user(&created).await.unwrap();
    assert!(matches!(
        by_cli.insert_user(&user("AUDITED@example.com", 3)).await,
        Err(StoreError::Conflict("email"))
    ));
    let principal = crate::vocab::identity::Principal::new(
        admin.id,
        admin.tenant_id,
        NULL_UUID,
        admin.authority,
        admin.email.clone(),
    );
    let by_admin = |action| store.audited(Audit::by(&principal, action));
    let k = key(&created, "audited-digest", 4);
    by_admin("api_key.create").insert_api_key(&k).await.unwrap();
    let outcome = by_admin("api_key.disable")
        .set_api_key_enabled(k.id, false)
        .await
        .unwrap();
    assert!(outcome.outcome);
    let missing = by_admin("api_key.delete")
        .delete_api_key(Uuid::new_v4())
        .await
        .unwrap();
    assert!(!missing.outcome);
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = by_admin("user.delete")
        .delete_user(created.id)
        .await
        .unwrap();

    let events = store.audit_events(10).await.unwrap();
    let seen: Vec<(&str, &str, Uuid, &str)> = events
        .iter()
        .rev()
        .map(|e| {
            (
                e.action.as_str(),
                e.target_type.as_str(),
                e.target_id,
                e.actor.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("user.create", "USER", created.id, "command-line"),
            ("api_key.create", "API_KEY", k.id, "audit-admin@example.com"),
            (
                "api_key.disable",
                "API_KEY",
                k.id,
                "audit-admin@example.com"
            ),
            ("user.delete", "USER", created.id, "audit-admin@example.com"),
        ]
    );
    let last = &events[0];
    assert_eq!((last.actor_id, last.tenant_id), (admin.id, admin.tenant_id));
    assert_eq!(events[3].actor_id, NULL_UUID);
    assert_eq!(store.audit_events(2).await.unwrap().len(), 2);
}

/// Every change that can end a credential hands back the revocation it
/// published, so this replica applies exactly what the others are told; a
/// re-hash and a void activation publish none.
async fn check_changes_return_the_revocation_they_publish(store: &Store) {
    let u = pending("revoked@example.com");
    store.insert_user(&u).await.unwrap();
    let k = key(&u, "revoked", 1);
    store.insert_api_key(&k).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    let by_user = Some(Revocation::User(u.id));
    let by_key = Some(Revocation::Key(k.id));

    store.add_activation(u.id, "tok", i64::MAX).await.unwrap();
    let activated = store.activate("tok", "hash", 0, 1).await.unwrap();
    assert_eq!(
        (activated.outcome, activated.revocation),
        (Some(u.id), by_user)
    );
    let void = store.activate("tok", "hash", 0, 1).await.unwrap();
    assert_eq!((void.outcome, void.revocation), (None, None));
    let rehash = store.update_password(u.id, "rehash", None).await.unwrap();
    assert_eq!(rehash.revocation, None);
    let change = store.update_password(u.id, "new", Some(2)).await.unwrap();
    assert_eq!(change.revocation, by_user);
    let ended = store.end_session(s.id, 3).await.unwrap();
    assert_eq!(ended.revocation, Some(Revocation::Session(s.id)));
    let locked = store.lock_user(u.id, 4).await.unwrap();
    assert_eq!(locked.revocation, by_user);
    let enabled = store.set_user_enabled(u.id, true, 5).await.unwrap();
    assert_eq!(enabled.revocation, by_user);
    let disabled = store.set_api_key_enabled(k.id, false).await.unwrap();
    assert_eq!(disabled.revocation, by_key);
    let deleted = store.delete_api_key(k.id).await.unwrap();
    assert_eq!(deleted.revocation, by_key);
    let gone = store.delete_user(u.id).await.unwrap();
    assert_eq!((gone.outcome, gone.revocation), (true, by_user));
}

fn user(email: &str, created_time: i64) -> UserRecord {
    UserRecord {
        created_time,
        first_name: "First".into(),
        phone: "+1 555".into(),
        additional_info: Some(r#"{"description":"x"}"#.into()),
        password_hash: "$argon2id$fake".into(),
        ..UserRecord::test_user(email)
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
        scopes: None,
    }
}

fn session(user: &UserRecord) -> SessionRecord {
    SessionRecord::open(user.id, 1_700_000_000_000, "jti-1".into())
}

async fn check_migrations_are_idempotent(db: &TestDb) {
    let u = user("keep@example.com", 1);
    db.insert_user(&u).await.unwrap();
    // A second process on the same database: no migration runs twice, data stays.
    let again = Store::open(&db.url, db.options(2)).await.unwrap();
    assert_eq!(again.user_by_id(u.id).await.unwrap(), Some(u));
    let row = sqlx::query("SELECT COUNT(*) FROM keygate_migrations")
        .fetch_one(&again.pool)
        .await
        .unwrap();
    let expected = migrate::count(again.dialect()) as i64;
    assert_eq!(row.try_get::<i64, _>(0).unwrap(), expected);
    again.close().await;
}

async fn check_a_schema_behind_names_its_pending_migrations_until_migrated(db: &TestDb) {
    assert_eq!(db.pending_migrations().await.unwrap(), vec![]);
    let total = migrate::count(db.dialect()) as i64;
    let old = db.another_through(total - 2).await;
    let pending = old.pending_migrations().await.unwrap();
    let versions: Vec<i64> = pending.iter().map(|p| p.version).collect();
    assert_eq!(versions, vec![total - 1, total]);
    match Store::open_current(&old.url, old.options(1)).await {
        Err(StoreError::Behind(found)) => {
            assert_eq!(found, pending);
            let text = StoreError::Behind(found).to_string();
            assert!(text.contains(&pending[0].to_string()), "{text}");
            assert!(text.contains("2 pending"), "{text}");
        }
        other => panic!("expected Behind, got {other:?}"),
    }
    // Opening as it is changed nothing; migrating applies what was pending.
    assert_eq!(old.pending_migrations().await.unwrap(), pending);
    assert_eq!(old.migrate().await.unwrap(), pending);
    assert_eq!(old.pending_migrations().await.unwrap(), vec![]);
    let current = Store::open_current(&old.url, old.options(1)).await.unwrap();
    current.close().await;
    old.finish().await;
}

#[tokio::test]
async fn a_missing_schema_has_every_migration_pending() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/fresh.db", dir.path().display());
    let store = Store::open_as_is(&url, OpenOptions::server(1))
        .await
        .unwrap();
    let pending = store.pending_migrations().await.unwrap();
    assert_eq!(pending, Store::migrations_for(&url));
    assert_eq!(pending.len(), migrate::count(Dialect::Sqlite));
    assert_eq!(pending[0].to_string(), "0001_init");
    store.close().await;
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
    assert!(
        store
            .set_user_enabled(u.id, false, t1)
            .await
            .unwrap()
            .outcome
    );
    let off = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(!off.enabled);
    assert_eq!(off.version, 2);
    assert_eq!(off.tokens_valid_after, t1);
    let ended = store.session_by_id(s.id).await.unwrap().unwrap();
    assert!(ended.ended);
    assert_eq!(ended.ended_time, t1 * 1000);
    // Nobody else is touched.
    assert_eq!(
        store.session_by_id(other_s.id).await.unwrap(),
        Some(other_s)
    );
    assert_eq!(store.user_by_id(other.id).await.unwrap(), Some(other));

    // Enabling again bumps the version and keeps the outdating time.
    assert!(
        store
            .set_user_enabled(u.id, true, t2)
            .await
            .unwrap()
            .outcome
    );
    let on = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(on.enabled);
    assert_eq!(on.version, 3);
    assert_eq!(on.tokens_valid_after, t1);

    let nobody = Uuid::new_v4();
    assert!(
        !store
            .set_user_enabled(nobody, false, t2)
            .await
            .unwrap()
            .outcome
    );
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

    assert!(store.delete_user(u.id).await.unwrap().outcome);
    assert_eq!(store.user_by_id(u.id).await.unwrap(), None);
    assert_eq!(store.api_key_by_id(k.id).await.unwrap(), None);
    assert_eq!(store.api_key_by_digest("d1").await.unwrap(), None);
    assert_eq!(store.session_by_id(s.id).await.unwrap(), None);
    assert!(!store.delete_user(u.id).await.unwrap().outcome);

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

    assert!(
        store
            .set_api_key_enabled(late.id, false)
            .await
            .unwrap()
            .outcome
    );
    assert!(!store.api_key_by_id(late.id).await.unwrap().unwrap().enabled);
    assert!(
        store
            .set_api_key_enabled(late.id, true)
            .await
            .unwrap()
            .outcome
    );
    assert!(store.api_key_by_id(late.id).await.unwrap().unwrap().enabled);
    assert!(
        !store
            .set_api_key_enabled(nobody, false)
            .await
            .unwrap()
            .outcome
    );

    assert!(store.delete_api_key(late.id).await.unwrap().outcome);
    assert!(!store.delete_api_key(late.id).await.unwrap().outcome);
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

async fn check_api_keys_per_user_are_capped_even_when_created_at_once(store: &Store) {
    let u = user("capped@example.com", 1);
    store.insert_user(&u).await.unwrap();
    for i in 0..2 {
        let k = key(&u, &format!("cap-{i}"), i);
        assert!(store.insert_api_key_capped(&k, 2).await.unwrap());
    }
    assert!(
        !store
            .insert_api_key_capped(&key(&u, "cap-2", 2), 2)
            .await
            .unwrap()
    );
    assert_eq!(store.list_api_keys(u.id).await.unwrap().len(), 2);
    let raced = user("raced@example.com", 2);
    store.insert_user(&raced).await.unwrap();
    let attempts = (0..12).map(|i| {
        let k = key(&raced, &format!("raced-{i}"), i);
        async move { store.insert_api_key_capped(&k, 5).await.unwrap() }
    });
    let inserted = futures_util::future::join_all(attempts).await;
    assert_eq!(inserted.iter().filter(|i| **i).count(), 5);
    assert_eq!(store.list_api_keys(raced.id).await.unwrap().len(), 5);
}

/// A CUSTOMER_USER of `customer` in `tenant`, created at `created_time`.
fn customer_user(email: &str, tenant: Uuid, customer: Uuid, created_time: i64) -> UserRecord {
    UserRecord {
        tenant_id: tenant,
        customer_id: customer,
        authority: Authority::CustomerUser,
        ..user(email, created_time)
    }
}

async fn check_a_customer_id_stays_with_the_tenant_that_used_it_first(store: &Store) {
    let (a, b, customer) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let first = customer_user("c1@example.com", a, customer, 1);
    store.insert_user(&first).await.unwrap();
    store
        .insert_user(&customer_user("c2@example.com", a, customer, 2))
        .await
        .unwrap();
    let intruder = customer_user("c3@example.com", b, customer, 3);
    let refused = store.insert_user(&intruder).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::ForeignCustomer),
        "{refused:?}"
    );
    assert!(store.user_by_id(intruder.id).await.unwrap().is_none());
    // Still the first tenant's after its users are gone.
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store.delete_user(first.id).await.unwrap();
    let again = customer_user("c4@example.com", b, customer, 4);
    let again = store.insert_user(&again).await;
    assert!(matches!(again, Err(StoreError::ForeignCustomer)));
    store
        .insert_user(&customer_user("c5@example.com", b, Uuid::new_v4(), 5))
        .await
        .unwrap();
    // Racing tenants for a new id: exactly one wins.
    let contested = Uuid::new_v4();
    let racers = (0..8).map(|i| {
        let u = customer_user(&format!("r{i}@example.com"), Uuid::new_v4(), contested, 10);
        async move { store.insert_user(&u).await }
    });
    let results = futures_util::future::join_all(racers).await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(StoreError::ForeignCustomer)))
    );
}

async fn check_upgrade_binds_each_customer_id_to_its_earliest_users_tenant(db: &TestDb) {
    let old = db.another_through(5).await;
    let (a, b, customer) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // Written before customer ids were bound: two tenants share one.
    for (email, tenant, created_time) in [
        ("later@example.com", b, 20_i64),
        ("earliest@example.com", a, 10),
    ] {
        sqlx::query(
            "INSERT INTO users (id, created_time, tenant_id, customer_id, email, authority, enabled, password_hash) \
             VALUES ($1, $2, $3, $4, $5, 'CUSTOMER_USER', 1, '')",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(created_time)
        .bind(tenant.to_string())
        .bind(customer.to_string())
        .bind(email)
        .execute(&old.pool)
        .await
        .unwrap();
    }
    migrate::run_through(&old.pool, old.dialect(), i64::MAX)
        .await
        .unwrap();
    let refused = customer_user("new-b@example.com", b, customer, 30);
    let refused = old.insert_user(&refused).await;
    assert!(matches!(refused, Err(StoreError::ForeignCustomer)));
    old.insert_user(&customer_user("new-a@example.com", a, customer, 30))
        .await
        .unwrap();
    old.finish().await;
}

async fn check_sessions_are_found_and_ended(store: &Store) {
    let u = user("sessions@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.session_by_id(s.id).await.unwrap(), Some(s.clone()));
    assert_eq!(store.session_by_id(Uuid::new_v4()).await.unwrap(), None);

    assert!(
        store
            .end_session(s.id, 1_700_000_000_500)
            .await
            .unwrap()
            .outcome
    );
    let ended = store.session_by_id(s.id).await.unwrap().unwrap();
    let expected = SessionRecord {
        ended: true,
        ended_time: 1_700_000_000_500,
        ..s
    };
    assert_eq!(ended, expected);
    let nobody = Uuid::new_v4();
    assert!(
        !store
            .end_session(nobody, 1_700_000_000_500)
            .await
            .unwrap()
            .outcome
    );
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
    s.refreshed_time = i64::MAX;
    s.ended_time = i64::MIN;
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.session_by_id(s.id).await.unwrap(), Some(s));
}

async fn check_refresh_rotation_accepts_only_the_current_token(store: &Store) {
    let u = user("rotate@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    let t = 1_700_000_900_000;
    assert!(
        store
            .rotate_refresh(s.id, "jti-1", "jti-2", t)
            .await
            .unwrap()
    );
    assert!(
        !store
            .rotate_refresh(s.id, "jti-1", "jti-3", t)
            .await
            .unwrap(),
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
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store.end_session(s.id, t).await.unwrap();
    assert!(
        !store
            .rotate_refresh(s.id, "jti-2", "jti-4", t)
            .await
            .unwrap(),
        "ended session"
    );
    let gone = Uuid::new_v4();
    assert!(
        !store
            .rotate_refresh(gone, "jti-2", "jti-4", t)
            .await
            .unwrap(),
        "no such session"
    );
}

async fn check_password_change_outdates_tokens_and_ends_sessions_but_rehash_does_not(
    store: &Store,
) {
    let u = user("pw@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    assert!(
        store
            .update_password(u.id, "rehashed", None)
            .await
            .unwrap()
            .outcome
    );
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
            .outcome
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(
        (after.password_hash.as_str(), after.tokens_valid_after),
        ("changed", 1_800_000_000)
    );
    assert_eq!(after.version, u.version + 1);
    let ended = store.session_by_id(s.id).await.unwrap().unwrap();
    assert_eq!((ended.ended, ended.ended_time), (true, 1_800_000_000_000));
    assert!(
        !store
            .update_password(Uuid::new_v4(), "x", None)
            .await
            .unwrap()
            .outcome
    );
}

async fn check_a_rehash_remembers_the_hash_it_replaced_until_a_password_is_set(store: &Store) {
    let mut u = user("rehash@example.com", 1);
    u.password_hash = "bcrypt".into();
    store.insert_user(&u).await.unwrap();
    let rehashed_from = async || {
        store
            .rehashed_from_by_ids(&[u.id])
            .await
            .unwrap()
            .get(&u.id)
            .cloned()
    };
    assert_eq!(rehashed_from().await, None);
    // Only the hash the login checked is re-hashed: one set meanwhile stays.
    assert!(
        !store
            .rehash_password(u.id, "stale", "argon-1")
            .await
            .unwrap()
    );
    assert!(
        store
            .rehash_password(u.id, "bcrypt", "argon-1")
            .await
            .unwrap()
    );
    // A chain of re-hashes remembers its first hash.
    assert!(
        store
            .rehash_password(u.id, "argon-1", "argon-2")
            .await
            .unwrap()
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(after.password_hash, "argon-2");
    assert_eq!(rehashed_from().await.as_deref(), Some("bcrypt"));
    // A password set is nobody's re-hash.
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .update_password(u.id, "changed", Some(2))
        .await
        .unwrap();
    assert_eq!(rehashed_from().await, None);
}

async fn check_lockout_counts_locks_and_is_lifted_by_enabling(store: &Store) {
    let u = user("lock@example.com", 1);
    store.insert_user(&u).await.unwrap();
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 1);
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 2);
    store.clear_login_failures(u.id).await.unwrap();
    assert_eq!(store.record_login_failure(u.id).await.unwrap(), 1);
    assert!(!store.is_locked(u.id).await.unwrap());
    assert!(store.lock_user(u.id, 1_800_000_000).await.unwrap().outcome);
    assert!(store.is_locked(u.id).await.unwrap());
    let locked = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(!locked.enabled);
    assert_eq!(locked.tokens_valid_after, 1_800_000_000);
    store.clear_login_failures(u.id).await.unwrap();
    assert!(
        store.is_locked(u.id).await.unwrap(),
        "a success cannot clear a lock"
    );
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
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

async fn check_a_new_activation_token_keeps_the_pending_ones(store: &Store) {
    let u = pending("kept@example.com");
    store.insert_user(&u).await.unwrap();
    store.add_activation(u.id, "old", 2_000).await.unwrap();
    store.add_activation(u.id, "new", 3_000).await.unwrap();
    store.add_activation(u.id, "gone", 500).await.unwrap();
    assert_eq!(
        store.pending_activations(u.id, 1_000).await.unwrap(),
        vec![("new".to_string(), 3_000), ("old".to_string(), 2_000)],
        "unexpired ones, the longest-lived first"
    );
    assert_eq!(
        store.activation_user("old", 1_000).await.unwrap(),
        Some(u.id)
    );
    // Activating with either consumes them all.
    let activated = store.activate("old", "hash", 1_000, 1).await.unwrap();
    assert_eq!(activated.outcome, Some(u.id));
    assert!(store.pending_activations(u.id, 0).await.unwrap().is_empty());
}

async fn check_an_activation_token_reads_as_valid_expired_or_unknown_without_being_used(
    store: &Store,
) {
    use super::ActivationToken;
    let u = pending("looked@example.com");
    store.insert_user(&u).await.unwrap();
    store.add_activation(u.id, "live", 2_000).await.unwrap();
    store.add_activation(u.id, "late", 500).await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            store.activation_token("live", 1_000).await.unwrap(),
            ActivationToken::Valid(u.id)
        );
        assert_eq!(
            store.activation_token("late", 1_000).await.unwrap(),
            ActivationToken::Expired
        );
        assert_eq!(
            store.activation_token("never", 1_000).await.unwrap(),
            ActivationToken::Unknown
        );
    }
    // Read twice, still there to activate with; used, unknown.
    let activated = store.activate("live", "hash", 1_000, 1).await.unwrap();
    assert_eq!(activated.outcome, Some(u.id));
    assert_eq!(
        store.activation_token("live", 1_000).await.unwrap(),
        ActivationToken::Unknown
    );
}

async fn check_activation_token_is_used_once_when_raced(store: &Store) {
    let u = pending("race@example.com");
    store.insert_user(&u).await.unwrap();
    store.add_activation(u.id, "tok", i64::MAX).await.unwrap();
    assert_eq!(store.activation_user("tok", 0).await.unwrap(), Some(u.id));
    let (a, b) = tokio::join!(
        store.activate("tok", "hash-a", 0, 1_800_000_000),
        store.activate("tok", "hash-b", 0, 1_800_000_000),
    );
    let winners = [a.unwrap().outcome, b.unwrap().outcome];
    assert_eq!(winners.iter().flatten().count(), 1, "{winners:?}");
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(matches!(after.password_hash.as_str(), "hash-a" | "hash-b"));
    assert_eq!(store.activation_user("tok", 0).await.unwrap(), None);
    assert_eq!(
        store.activate("tok", "hash-c", 0, 1).await.unwrap().outcome,
        None
    );
}

async fn check_activation_never_sets_the_password_of_an_active_account(store: &Store) {
    let u = user("active@example.com", 1);
    store.insert_user(&u).await.unwrap();
    store.add_activation(u.id, "tok", i64::MAX).await.unwrap();
    assert_eq!(
        store
            .activate("tok", "attacker", 0, 1_800_000_000)
            .await
            .unwrap()
            .outcome,
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
    store.add_activation(u.id, "tok", 10).await.unwrap();
    assert_eq!(
        store.activation_user("tok", 10).await.unwrap(),
        None,
        "expired"
    );
    store.add_activation(u.id, "tok", i64::MAX).await.unwrap();
    assert_eq!(
        store
            .activate("tok", "first", 0, 1_800_000_000)
            .await
            .unwrap()
            .outcome,
        Some(u.id)
    );
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert_eq!(after.tokens_valid_after, 1_800_000_000);
    assert_eq!(after.version, u.version + 1);
    assert!(store.session_by_id(s.id).await.unwrap().unwrap().ended);
}

async fn check_reset_token_is_used_once_when_raced_and_ends_sessions_keeping_keys(store: &Store) {
    let u = user("reset@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    let k = key(&u, "kept", 1);
    store.insert_api_key(&k).await.unwrap();
    store
        .replace_reset_token(u.id, "tok", i64::MAX, 0)
        .await
        .unwrap();
    assert_eq!(
        store.reset_token("tok", 0).await.unwrap(),
        ResetToken::Valid(u.id)
    );
    let (a, b) = tokio::join!(
        store.reset_password("tok", "hash-a", 0, 1_800_000_000),
        store.reset_password("tok", "hash-b", 0, 1_800_000_000),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        [a.outcome, b.outcome].iter().flatten().count(),
        1,
        "one use wins"
    );
    let winner = if a.outcome.is_some() { &a } else { &b };
    assert_eq!(winner.revocation, Some(Revocation::User(u.id)));
    let after = store.user_by_id(u.id).await.unwrap().unwrap();
    assert!(matches!(after.password_hash.as_str(), "hash-a" | "hash-b"));
    assert_eq!(after.tokens_valid_after, 1_800_000_000);
    assert!(store.session_by_id(s.id).await.unwrap().unwrap().ended);
    assert!(
        store.api_key_by_id(k.id).await.unwrap().is_some(),
        "keys stay"
    );
    assert_eq!(
        store.reset_token("tok", 0).await.unwrap(),
        ResetToken::Unknown
    );
}

async fn check_a_new_reset_token_voids_the_older_and_expired_ones(store: &Store) {
    let u = user("again@example.com", 1);
    let other = user("other@example.com", 2);
    store.insert_user(&u).await.unwrap();
    store.insert_user(&other).await.unwrap();
    store
        .replace_reset_token(other.id, "stale", 100, 0)
        .await
        .unwrap();
    assert_eq!(
        store.reset_token("stale", 100).await.unwrap(),
        ResetToken::Expired
    );
    store
        .replace_reset_token(u.id, "first", i64::MAX, 0)
        .await
        .unwrap();
    store
        .replace_reset_token(u.id, "second", i64::MAX, 200)
        .await
        .unwrap();
    assert_eq!(
        store.reset_token("first", 200).await.unwrap(),
        ResetToken::Unknown
    );
    assert_eq!(
        store.reset_token("stale", 0).await.unwrap(),
        ResetToken::Unknown,
        "expired tokens are dropped as new ones are stored"
    );
    assert_eq!(
        store
            .reset_password("first", "h", 200, 1)
            .await
            .unwrap()
            .outcome,
        None
    );
    assert_eq!(
        store
            .reset_password("second", "h", 200, 1)
            .await
            .unwrap()
            .outcome,
        Some(u.id)
    );
}

async fn check_sessions_record_rotation_and_first_end_times(store: &Store) {
    let u = user("times@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let s = session(&u);
    store.insert_session(&s).await.unwrap();
    let read = store.session_by_id(s.id).await.unwrap().unwrap();
    assert_eq!((read.refreshed_time, read.ended_time), (s.created_time, 0));

    let rotated_at = s.created_time + 60_000;
    assert!(
        store
            .rotate_refresh(s.id, "jti-1", "jti-2", rotated_at)
            .await
            .unwrap()
    );
    let read = store.session_by_id(s.id).await.unwrap().unwrap();
    assert_eq!(
        (read.created_time, read.refreshed_time),
        (s.created_time, rotated_at)
    );

    // The first end is the one kept: a later logout, reuse detection, lock
    // or password change does not push the session's death forward.
    let first_end = rotated_at + 1;
    // A store alone: no caches or sockets to apply these revocations to.
    let _ = store.end_session(s.id, first_end).await.unwrap();
    let _ = store.end_session(s.id, first_end + 5).await.unwrap();
    let _ = store.lock_user(u.id, 1_900_000_000).await.unwrap();
    let _ = store
        .update_password(u.id, "new", Some(1_900_000_001))
        .await
        .unwrap();
    let _ = store
        .set_user_enabled(u.id, false, 1_900_000_002)
        .await
        .unwrap();
    let read = store.session_by_id(s.id).await.unwrap().unwrap();
    assert_eq!((read.ended, read.ended_time), (true, first_end));
}

/// A pruner of `store` with these retentions, a one-day refresh lifetime and
/// generous bounds.
fn pruner(store: &Store, sessions: Duration, activation_tokens: Duration) -> Pruner {
    Pruner {
        store: store.clone(),
        settings: RetentionSettings {
            interval: Some(Duration::from_secs(3600)),
            sessions,
            activation_tokens,
            audit_events: 100_000 * DAY,
            batch_size: 2,
            max_rows_per_run: 1000,
        },
        refresh_ttl: DAY,
        metrics: Arc::new(Metrics::new()),
    }
}

const DAY: Duration = Duration::from_secs(86_400);
const HOUR_MS: i64 = 3_600_000;
const NOW: i64 = 1_800_000_000_000;

async fn count(store: &Store, table: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table}");
    let row = sqlx::query(AssertSqlSafe(sql))
        .fetch_one(&store.pool)
        .await
        .unwrap();
    row.try_get::<i64, _>(0).unwrap()
}

/// Stores a session of `u` last rotated at `refreshed`, ended at `ended`.
async fn session_at(store: &Store, u: &UserRecord, refreshed: i64, ended: Option<i64>) -> Uuid {
    let mut s = SessionRecord::open(u.id, refreshed, "jti".into());
    if let Some(at) = ended {
        s.ended = true;
        s.ended_time = at;
    }
    store.insert_session(&s).await.unwrap();
    s.id
}

async fn check_pruning_deletes_dead_sessions_past_retention_only(store: &Store) {
    let u = user("prune@example.com", 1);
    store.insert_user(&u).await.unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let p = pruner(store, Duration::from_secs(3600), DAY);
    let expired_before = NOW - 86_400_000 - CLOCK_SLACK.as_millis() as i64 - HOUR_MS;

    let ended_long_ago = session_at(store, &u, NOW - 2 * HOUR_MS, Some(NOW - HOUR_MS - 1)).await;
    let ended_recently = session_at(store, &u, NOW - 2 * HOUR_MS, Some(NOW - HOUR_MS + 1)).await;
    let expired_long_ago = session_at(store, &u, expired_before - 1, None).await;
    // Its refresh token expired, but not a whole retention (and the clock
    // slack) ago: kept.
    let expired_recently = session_at(store, &u, expired_before + 1, None).await;
    let live = session_at(store, &u, NOW - HOUR_MS, None).await;
    // Opened long ago but rotated since: the rotation is what counts.
    let rotated = session_at(store, &u, expired_before - 10 * HOUR_MS, None).await;
    assert!(
        store
            .rotate_refresh(rotated, "jti", "jti-2", NOW - HOUR_MS)
            .await
            .unwrap()
    );
    // Ended through the store's own paths, long enough ago.
    let logged_out = session_at(store, &u, NOW - 3 * HOUR_MS, None).await;
    // A store alone: no caches or sockets to apply the revocation to.
    let _ = store
        .end_session(logged_out, NOW - 2 * HOUR_MS)
        .await
        .unwrap();

    let pruned = p.run_once(NOW, &rx).await.unwrap();
    assert_eq!(
        pruned,
        Pruned {
            ended_sessions: 2,
            expired_sessions: 1,
            activation_tokens: 0,
            sso_states: 0,
            audit_events: 0,
        }
    );
    for gone in [ended_long_ago, expired_long_ago, logged_out] {
        assert_eq!(store.session_by_id(gone).await.unwrap(), None);
    }
    for kept in [ended_recently, expired_recently, live, rotated] {
        assert!(store.session_by_id(kept).await.unwrap().is_some());
    }
    let metrics = p.metrics.render();
    assert!(
        metrics.contains(r#"keygate_store_pruned_rows_total{kind="ended_sessions"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"keygate_store_pruned_rows_total{kind="expired_sessions"} 1"#),
        "{metrics}"
    );
    // Nothing left to do: a second run deletes nothing.
    assert_eq!(p.run_once(NOW, &rx).await.unwrap().total(), 0);
    drop(tx);
}

async fn check_pruning_deletes_expired_activation_tokens_only(store: &Store) {
    let p = pruner(store, DAY, Duration::from_secs(3600));
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let mut users = Vec::new();
    for (i, expires_at) in [NOW - HOUR_MS - 1, NOW - HOUR_MS + 1, NOW + HOUR_MS]
        .into_iter()
        .enumerate()
    {
        let mut u = user(&format!("act{i}@example.com"), 1);
        u.password_hash = String::new();
        store.insert_user(&u).await.unwrap();
        let digest = format!("digest-{i}");
        store
            .add_activation(u.id, &digest, expires_at)
            .await
            .unwrap();
        users.push((u, digest));
    }
    let pruned = p.run_once(NOW, &rx).await.unwrap();
    assert_eq!(pruned.activation_tokens, 1);
    assert_eq!(count(store, "activation_tokens").await, 2);
    // The unexpired token still activates its user.
    let (fresh, digest) = &users[2];
    assert_eq!(
        store
            .activate(digest, "hash", NOW, NOW / 1000)
            .await
            .unwrap()
            .outcome,
        Some(fresh.id)
    );
    // Pruning removed tokens only, never their users.
    assert_eq!(store.user_count().await.unwrap(), 3);
}

async fn check_a_single_sign_on_state_is_taken_once_across_replicas_when_raced(db: &TestDb) {
    assert!(db.take_sso_state("state-a", NOW).await.unwrap());
    assert!(!db.take_sso_state("state-a", NOW).await.unwrap());
    // Another state is its own.
    assert!(db.take_sso_state("state-b", NOW).await.unwrap());
    // Two replicas (separate pools on the same database), each taking the
    // same state several times at once: exactly one take wins.
    let other = Store::open(&db.url, db.options(2)).await.unwrap();
    let takes = (0..8).map(|i| {
        let store = if i % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        async move { store.take_sso_state("state-c", NOW).await.unwrap() }
    });
    let won = futures_util::future::join_all(takes).await;
    assert_eq!(won.iter().filter(|&&w| w).count(), 1, "{won:?}");
    assert!(!other.take_sso_state("state-a", NOW).await.unwrap());
    assert_eq!(count(db, "sso_used_states").await, 3);
    other.close().await;
}

async fn check_pruning_deletes_single_sign_on_states_once_their_cookie_expired(store: &Store) {
    let p = pruner(store, DAY, DAY);
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let slack = CLOCK_SLACK.as_millis() as i64;
    // Expired longer than the clock slack ago; expired, but within the
    // slack (another replica's clock may still take its cookie); unexpired.
    let expiries = [NOW - slack - 1, NOW - slack + 1, NOW + 600_000];
    for (i, expires_at) in expiries.into_iter().enumerate() {
        assert!(
            store
                .take_sso_state(&format!("state-{i}"), expires_at)
                .await
                .unwrap()
        );
    }
    let pruned = p.run_once(NOW, &rx).await.unwrap();
    assert_eq!(pruned.sso_states, 1);
    assert_eq!(pruned.total(), 1);
    assert_eq!(count(store, "sso_used_states").await, 2);
    // The kept ones are still refused.
    for kept in ["state-1", "state-2"] {
        assert!(!store.take_sso_state(kept, NOW).await.unwrap());
    }
    let metrics = p.metrics.render();
    assert!(
        metrics.contains(r#"keygate_store_pruned_rows_total{kind="sso_states"} 1"#),
        "{metrics}"
    );
}

async fn check_pruning_respects_batch_and_run_bounds(store: &Store) {
    let u = user("bounds@example.com", 1);
    store.insert_user(&u).await.unwrap();
    for _ in 0..7 {
        session_at(store, &u, NOW - 3 * HOUR_MS, Some(NOW - 2 * HOUR_MS)).await;
    }
    let live = session_at(store, &u, NOW, None).await;
    // One statement deletes at most its limit.
    let cutoff = NOW - HOUR_MS;
    assert_eq!(
        store
            .prune(PruneKind::EndedSessions, cutoff, 3)
            .await
            .unwrap(),
        3
    );
    assert_eq!(count(store, "sessions").await, 5);
    // One run deletes at most max_rows_per_run of a kind, in batches.
    let mut p = pruner(store, Duration::from_secs(3600), DAY);
    p.settings.max_rows_per_run = 3;
    let (_tx, rx) = tokio::sync::watch::channel(false);
    assert_eq!(p.run_once(NOW, &rx).await.unwrap().ended_sessions, 3);
    assert_eq!(count(store, "sessions").await, 2);
    assert_eq!(p.run_once(NOW, &rx).await.unwrap().ended_sessions, 1);
    assert_eq!(p.run_once(NOW, &rx).await.unwrap().ended_sessions, 0);
    assert!(store.session_by_id(live).await.unwrap().is_some());
    // A shutdown stops a run before its next batch.
    for _ in 0..3 {
        session_at(store, &u, NOW - 3 * HOUR_MS, Some(NOW - 2 * HOUR_MS)).await;
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    tx.send(true).unwrap();
    assert_eq!(p.run_once(NOW, &rx).await.unwrap().total(), 0);
    assert_eq!(count(store, "sessions").await, 4);
}

async fn check_concurrent_pruners_delete_each_row_once(db: &TestDb) {
    let u = user("replicas@example.com", 1);
    db.insert_user(&u).await.unwrap();
    for _ in 0..40 {
        session_at(db, &u, NOW - 3 * HOUR_MS, Some(NOW - 2 * HOUR_MS)).await;
    }
    let live = session_at(db, &u, NOW, None).await;
    // Two replicas: separate pools on the same database, pruning at once.
    let other = Store::open(&db.url, db.options(2)).await.unwrap();
    let (a, b) = (
        pruner(db, Duration::from_secs(3600), DAY),
        pruner(&other, Duration::from_secs(3600), DAY),
    );
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let (ra, rb) = tokio::join!(a.run_once(NOW, &rx), b.run_once(NOW, &rx));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.ended_sessions + rb.ended_sessions, 40, "{ra:?} {rb:?}");
    assert_eq!(count(db, "sessions").await, 1);
    assert!(db.session_by_id(live).await.unwrap().is_some());
    other.close().await;
}

async fn check_upgrade_keeps_existing_sessions_for_a_refresh_lifetime(db: &TestDb) {
    // A store written before sessions recorded their rotation and end times.
    let old = db.another_through(3).await;
    let u = user("upgrade@example.com", 1);
    old.insert_user(&u).await.unwrap();
    let (live, ended) = (Uuid::new_v4(), Uuid::new_v4());
    for (id, flag) in [(live, 0_i64), (ended, 1)] {
        sqlx::query(
            "INSERT INTO sessions (id, user_id, created_time, ended, refresh_jti) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id.to_string())
        .bind(u.id.to_string())
        .bind(1_000_i64)
        .bind(flag)
        .bind("jti")
        .execute(&old.pool)
        .await
        .unwrap();
    }
    let before = crate::clock::now_ms() - 1000;
    migrate::run_through(&old.pool, old.dialect(), i64::MAX)
        .await
        .unwrap();
    let after = crate::clock::now_ms() + 1000;

    // Both count from the upgrade: the live one's refresh token may have been
    // rotated right before it, whatever its creation time says.
    let live_read = old.session_by_id(live).await.unwrap().unwrap();
    assert!(
        (before..after).contains(&live_read.refreshed_time),
        "{live_read:?}"
    );
    assert_eq!((live_read.ended, live_read.ended_time), (false, 0));
    let ended_read = old.session_by_id(ended).await.unwrap().unwrap();
    assert!(
        (before..after).contains(&ended_read.ended_time),
        "{ended_read:?}"
    );

    let (_tx, rx) = tokio::sync::watch::channel(false);
    let p = pruner(&old, Duration::ZERO, Duration::ZERO);
    let now = crate::clock::now_ms();
    let pruned = p.run_once(now, &rx).await.unwrap();
    assert_eq!(pruned.expired_sessions, 0, "a live session was pruned");
    assert!(old.session_by_id(live).await.unwrap().is_some());
    // Once a refresh lifetime (and the slack) has passed, it goes.
    let later = after + DAY.as_millis() as i64 + CLOCK_SLACK.as_millis() as i64;
    assert_eq!(p.run_once(later, &rx).await.unwrap().expired_sessions, 1);
    old.finish().await;
}
