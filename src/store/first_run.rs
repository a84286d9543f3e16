//! What a first run asks of the store: whether one exists yet (a dry run of
//! the import must not create it), and whether the bootstrap administrator
//! is still as `keygate serve` created it (the import removes it then, once
//! the platform's own administrator can log in).

use std::time::Duration;

use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError, reach_postgres};

impl Store {
    /// Whether `url` names a store that exists: the SQLite file, or
    /// keygate's tables in the PostgreSQL database. Creates nothing.
    pub async fn exists(url: &str, timeout: Duration) -> Result<bool, StoreError> {
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let file = path.split('?').next().unwrap_or_default();
            let on_disk = !file.is_empty() && file != ":memory:";
            return Ok(!on_disk || std::path::Path::new(file).is_file());
        }
        use sqlx::Connection;
        use sqlx::postgres::{PgConnectOptions, PgConnection};
        reach_postgres(url, timeout).await?;
        let options: PgConnectOptions = url.parse().map_err(|e| {
            StoreError::Setup(format!("the store URL is not a PostgreSQL URL: {e}"))
        })?;
        let options = options.options([("client_min_messages", "warning")]);
        let mut connection = PgConnection::connect_with(&options).await?;
        let found: bool =
            sqlx::query_scalar("SELECT to_regclass('keygate_migrations') IS NOT NULL")
                .fetch_one(&mut connection)
                .await?;
        let _ = connection.close().await;
        Ok(found)
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
