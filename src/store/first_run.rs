//! What a first run asks of the store: whether one exists yet (a dry run of
//! the import must not create it), and whether the bootstrap administrator
//! is still as `keygate serve` created it (the import removes it then, once
//! the platform's own administrator can log in).

use std::time::Duration;

use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError, quiet, reach_postgres};
use crate::vocab::settings::Pooler;

impl Store {
    /// Whether `url` names a store that exists: the SQLite file, or
    /// keygate's tables in the PostgreSQL database. Creates nothing.
    pub async fn exists(url: &str, timeout: Duration, pooler: Pooler) -> Result<bool, StoreError> {
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let file = path.split('?').next().unwrap_or_default();
            let on_disk = !file.is_empty() && file != ":memory:";
            return Ok(!on_disk || std::path::Path::new(file).is_file());
        }
        use sqlx::Connection;
        use sqlx::postgres::{PgConnectOptions, PgConnection};
        reach_postgres(url, timeout, pooler).await?;
        let options: PgConnectOptions = url.parse().map_err(|e| {
            StoreError::Setup(format!("the store URL is not a PostgreSQL URL: {e}"))
        })?;
        let options = quiet(options, pooler);
        let mut connection = PgConnection::connect_with(&options).await?;
        let found: bool =
            sqlx::query_scalar("SELECT to_regclass('keygate_migrations') IS NOT NULL")
                .fetch_one(&mut connection)
                .await?;
        let _ = connection.close().await;
        Ok(found)
    }

    /// When a key was last imported from the platform (epoch ms, 0: never):
    /// a replica that sees it move forgets the key values it found unknown.
    pub(crate) async fn last_key_import(&self) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(imported_time), 0) FROM platform_rows WHERE kind = 'key'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Whether an administrator imported from the platform can log in:
    /// enabled, with a password.
    pub(crate) async fn imported_admin_can_log_in(&self) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM users u JOIN platform_rows p ON p.kind = 'user' AND p.id = u.id \
             WHERE u.authority = 'SYS_ADMIN' AND u.enabled = 1 AND u.password_hash <> ''",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)? > 0)
    }

    /// What has been done with or as a user since its creation: a changed
    /// password or profile (its version), API keys, sessions (a login),
    /// second factors, and audit events it made. Empty: never used.
    pub(crate) async fn uses_of(&self, id: Uuid, version: i64) -> Result<Vec<String>, StoreError> {
        let mut uses = Vec::new();
        if version > 1 {
            uses.push("its password or profile was changed".to_owned());
        }
        let id = id.to_string();
        for (sql, what) in [
            (
                "SELECT COUNT(*) FROM api_keys WHERE user_id = $1",
                "it has API keys",
            ),
            (
                "SELECT COUNT(*) FROM sessions WHERE user_id = $1",
                "it has logged in",
            ),
            (
                "SELECT COUNT(*) FROM two_factor WHERE user_id = $1",
                "it has a second factor",
            ),
            (
                "SELECT COUNT(*) FROM audit_events WHERE actor_id = $1",
                "changes were made as it",
            ),
        ] {
            let row = sqlx::query(sql).bind(&id).fetch_one(&self.pool).await?;
            if row.try_get::<i64, _>(0)? > 0 {
                uses.push(what.to_owned());
            }
        }
        Ok(uses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{OpenOptions, SessionRecord, UserRecord};
    use crate::vocab::identity::{Authority, NULL_UUID};

    async fn fresh() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/k.db", dir.path().display());
        let store = Store::open(&url, OpenOptions::server(2)).await.unwrap();
        (dir, store)
    }

    fn admin(email: &str) -> UserRecord {
        UserRecord {
            authority: Authority::SysAdmin,
            tenant_id: NULL_UUID,
            password_hash: "$argon2id$fake".into(),
            ..UserRecord::test_user(email)
        }
    }

    #[tokio::test]
    async fn a_missing_sqlite_store_is_found_missing_and_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data/k.db");
        let url = format!("sqlite://{}", file.display());
        let timeout = Duration::from_secs(1);
        assert!(!Store::exists(&url, timeout, Pooler::None).await.unwrap());
        assert!(!dir.path().join("data").exists(), "nothing created");
        Store::open(&url, OpenOptions::server(1))
            .await
            .unwrap()
            .close()
            .await;
        assert!(Store::exists(&url, timeout, Pooler::None).await.unwrap());
    }

    #[tokio::test]
    async fn a_bootstrap_admin_is_unused_until_it_logs_in_or_is_changed() {
        let (_dir, store) = fresh().await;
        let user = admin("sysadmin@keygate.local");
        store.insert_user(&user).await.unwrap();
        assert!(store.uses_of(user.id, 1).await.unwrap().is_empty());
        assert_eq!(
            store.uses_of(user.id, 2).await.unwrap(),
            ["its password or profile was changed"]
        );
        let session = SessionRecord::open(user.id, 1, "jti".into());
        store.insert_session(&session).await.unwrap();
        assert_eq!(
            store.uses_of(user.id, 1).await.unwrap(),
            ["it has logged in"]
        );
    }

    #[tokio::test]
    async fn only_an_imported_admin_who_can_log_in_counts_as_a_successor() {
        let (_dir, store) = fresh().await;
        let local = admin("local@example.com");
        store.insert_user(&local).await.unwrap();
        assert!(
            !store.imported_admin_can_log_in().await.unwrap(),
            "not imported"
        );
        let pending = UserRecord {
            password_hash: String::new(),
            ..admin("pending@example.com")
        };
        let imported = admin("imported@example.com");
        for user in [&pending, &imported] {
            store.insert_user(user).await.unwrap();
        }
        let remember = async |id: Uuid| {
            sqlx::query(
                "INSERT INTO platform_rows (kind, id, fields, imported_time) VALUES ('user', $1, '{}', 1)",
            )
            .bind(id.to_string())
            .execute(&store.pool)
            .await
            .unwrap();
        };
        remember(pending.id).await;
        assert!(
            !store.imported_admin_can_log_in().await.unwrap(),
            "no password"
        );
        remember(imported.id).await;
        assert!(store.imported_admin_can_log_in().await.unwrap());
        // A store alone: no caches or sockets to apply the revocation to.
        let _ = store.set_user_enabled(imported.id, false, 1).await.unwrap();
        assert!(
            !store.imported_admin_can_log_in().await.unwrap(),
            "disabled"
        );
    }

    #[tokio::test]
    async fn the_last_key_import_moves_with_each_imported_key_row() {
        let (_dir, store) = fresh().await;
        assert_eq!(store.last_key_import().await.unwrap(), 0, "never");
        for (kind, time) in [("key", 5_i64), ("user", 9), ("key", 7)] {
            sqlx::query(
                "INSERT INTO platform_rows (kind, id, fields, imported_time) VALUES ($1, $2, '{}', $3)",
            )
            .bind(kind)
            .bind(Uuid::new_v4().to_string())
            .bind(time)
            .execute(&store.pool)
            .await
            .unwrap();
        }
        assert_eq!(store.last_key_import().await.unwrap(), 7, "keys only");
    }
}
