//! The credential store: users, API keys (digests only), sessions and settings.
//!
//! One implementation over sqlx's `Any` driver serves both SQLite (the embedded
//! default) and PostgreSQL; the SQL is written once in the common dialect, and
//! each dialect has its own migrations. Multi-row changes run in transactions.

mod admin;
mod audit;
use audit::Target;
pub use audit::{Actor, Audit, AuditEvent};
mod migrate;
mod paging;
pub use paging::{Page, PageRequest};
mod prune;
pub mod retention;
pub use prune::PruneKind;
mod revocation;
use revocation::Change;
pub use revocation::{Published, REVOCATION_CHANNEL, Revocation};
mod logins;
mod sessions;
use sessions::END_SESSIONS_OF_USER;
pub use sessions::SessionRecord;

use std::path::Path;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Row};
use uuid::Uuid;

use crate::identity::Authority;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("store: a record with this {0} already exists")]
    Conflict(&'static str),
    #[error("store: corrupt row: {0}")]
    Corrupt(String),
    #[error("store: {0}")]
    Setup(String),
    #[error("store: the customer id belongs to another tenant")]
    ForeignCustomer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A user as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub id: Uuid,
    pub created_time: i64,
    pub tenant_id: Uuid,
    pub customer_id: Uuid,
    pub email: String,
    pub authority: Authority,
    pub first_name: String,
    pub last_name: String,
    pub phone: String,
    pub additional_info: Option<String>,
    pub version: i64,
    pub enabled: bool,
    pub password_hash: String,
    /// Tokens issued (in whole seconds) before this are outdated.
    pub tokens_valid_after: i64,
}

impl std::fmt::Debug for UserRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRecord")
            .field("id", &self.id)
            .field("email", &self.email)
            .field("authority", &self.authority)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// An API key as stored: never the value, only its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: Uuid,
    pub created_time: i64,
    pub tenant_id: Uuid,
    pub user_id: Uuid,
    pub digest: String,
    pub description: String,
    pub enabled: bool,
    /// Epoch ms; 0 means never.
    pub expiration_time: i64,
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    /// Recorded with each change made through this store ([`Store::audited`]).
    audit: Option<std::sync::Arc<Audit>>,
    /// The runtime the store was opened on ([`Store::at_home`]).
    home: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dialect", &self.dialect)
            .finish()
    }
}

const USER_COLUMNS: &str = "id, created_time, tenant_id, customer_id, email, authority, first_name, \
     last_name, phone, additional_info, version, enabled, password_hash, tokens_valid_after";
const KEY_COLUMNS: &str =
    "id, created_time, tenant_id, user_id, digest, description, enabled, expiration_time";

impl Store {
    /// Connects, creating the SQLite file and its directory when needed, and
    /// applies pending migrations.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Store::connect_through(url, max_connections, i64::MAX).await
    }

    /// Like [`Store::connect`], applying migrations up to version `last` only.
    async fn connect_through(
        url: &str,
        max_connections: u32,
        last: i64,
    ) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let (dialect, url) = if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let file = path.split('?').next().unwrap_or_default();
            if !file.is_empty() && file != ":memory:" {
                if let Some(parent) = Path::new(file)
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        StoreError::Setup(format!("creating {}: {e}", parent.display()))
                    })?;
                }
            }
            let url = if path.contains("mode=") {
                format!("sqlite://{path}")
            } else if path.contains('?') {
                format!("sqlite://{path}&mode=rwc")
            } else {
                format!("sqlite://{path}?mode=rwc")
            };
            (Dialect::Sqlite, url)
        } else {
            (Dialect::Postgres, url.to_string())
        };
        let mut options = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10));
        if dialect == Dialect::Sqlite {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::raw_sql("PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            });
        }
        let pool = options.connect(&url).await?;
        if dialect == Dialect::Sqlite {
            sqlx::raw_sql("PRAGMA journal_mode = WAL;")
                .execute(&pool)
                .await?;
        }
        let store = Store {
            pool,
            dialect,
            audit: None,
            home: tokio::runtime::Handle::try_current().ok(),
        };
        migrate::run_through(&store.pool, dialect, last).await?;
        Ok(store)
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Runs `work`, which uses this store, on the runtime the store was
    /// opened on. A PostgreSQL connection's socket belongs to the reactor of
    /// the runtime that opened it; connections are served on worker threads
    /// with runtimes of their own (`listener::workers`), which stop with the
    /// server, and a connection opened there would die with them while the
    /// pool still holds it. Work runs to its end even when its caller goes
    /// away (a client hanging up), so a change is never cut off halfway.
    /// Costs one task per call, against a store round trip.
    pub async fn at_home<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let Some(home) = &self.home else {
            return Ok(work.await);
        };
        match home.spawn(work).await {
            Ok(done) => Ok(done),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(StoreError::Setup("the server is stopping".into())),
        }
    }

    /// Closes every connection; later queries fail. For shutdown and tests.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Answers when the store can serve a query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    // --- settings -------------------------------------------------------------

    /// Returns the stored value, or stores `generated` when none exists yet.
    /// Safe when several replicas race: the first insert wins and all read it.
    pub async fn get_or_create_setting(
        &self,
        name: &str,
        generated: &str,
    ) -> Result<String, StoreError> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(generated)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<String, _>(0)?)
    }

    // --- users ----------------------------------------------------------------

    pub async fn user_count(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) FROM users")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    pub async fn insert_user(&self, user: &UserRecord) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO users ({USER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        );
        let mut tx = self.pool.begin().await?;
        let result = sqlx::query(AssertSqlSafe(sql))
            .bind(user.id.to_string())
            .bind(user.created_time)
            .bind(user.tenant_id.to_string())
            .bind(user.customer_id.to_string())
            .bind(user.email.trim().to_lowercase())
            .bind(user.authority.as_str())
            .bind(&user.first_name)
            .bind(&user.last_name)
            .bind(&user.phone)
            .bind(user.additional_info.clone())
            .bind(user.version)
            .bind(i64::from(user.enabled))
            .bind(&user.password_hash)
            .bind(user.tokens_valid_after)
            .execute(&mut *tx)
            .await;
        result.map_err(conflict_on("email"))?;
        if user.customer_id != crate::identity::NULL_UUID {
            claim_customer(&mut tx, user).await?;
        }
        let event = self.record(&mut tx, Target::User(user.id)).await?;
        event.commit(tx).await?;
        Ok(())
    }

    pub async fn user_by_id(&self, id: Uuid) -> Result<Option<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    /// Emails are stored lower-cased; the lookup is case-insensitive.
    pub async fn user_by_email(&self, email: &str) -> Result<Option<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE email = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(email.trim().to_lowercase())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }

    pub async fn list_users(&self) -> Result<Vec<UserRecord>, StoreError> {
        let sql = format!("SELECT {USER_COLUMNS} FROM users ORDER BY created_time, email");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(user_from_row).collect()
    }

    /// Enables or disables a user. Disabling outdates every token of the user
    /// and ends their sessions, in one transaction. The outcome is false when no such user.
    pub async fn set_user_enabled(
        &self,
        id: Uuid,
        enabled: bool,
        now_secs: i64,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let updated = if enabled {
                sqlx::query("UPDATE users SET enabled = $1, version = version + 1 WHERE id = $2")
                    .bind(1_i64)
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?
            } else {
                sqlx::query(
                    "UPDATE users SET enabled = $1, version = version + 1, tokens_valid_after = $2 WHERE id = $3",
                )
                .bind(0_i64)
                .bind(now_secs)
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?
            };
            if enabled {
                // An administrator enabling an account also lifts a lockout.
                sqlx::query("DELETE FROM login_lockouts WHERE user_id = $1")
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query(END_SESSIONS_OF_USER)
                    .bind(now_secs.saturating_mul(1000))
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            let changed = updated.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::User(id), Target::User(id))
        })
        .await
    }

    /// Deletes a user with their keys and sessions. The outcome is false when no such user.
    pub async fn delete_user(&self, id: Uuid) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            for sql in [
                "DELETE FROM api_keys WHERE user_id = $1",
                "DELETE FROM sessions WHERE user_id = $1",
                "DELETE FROM login_lockouts WHERE user_id = $1",
            ] {
                sqlx::query(sql)
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            let deleted = sqlx::query("DELETE FROM users WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
            let changed = deleted.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::User(id), Target::User(id))
        })
        .await
    }

    // --- API keys -------------------------------------------------------------

    pub async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        self.insert_api_key_capped(key, i64::MAX).await.map(|_| ())
    }

    /// Inserts `key` unless its user already holds `cap` keys: `Ok(false)`,
    /// nothing written. Counting and inserting are one statement; on
    /// PostgreSQL the owner's row is locked first, so concurrent creations
    /// for one user are counted one after another (SQLite writes one at a
    /// time anyway).
    pub async fn insert_api_key_capped(
        &self,
        key: &ApiKeyRecord,
        cap: i64,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) SELECT $1, $2, $3, $4, $5, $6, $7, $8 \
             WHERE (SELECT COUNT(*) FROM api_keys WHERE user_id = $9) < $10"
        );
        let mut tx = self.pool.begin().await?;
        if self.dialect == Dialect::Postgres && cap < i64::MAX {
            sqlx::query("SELECT id FROM users WHERE id = $1 FOR UPDATE")
                .bind(key.user_id.to_string())
                .execute(&mut *tx)
                .await?;
        }
        let result = sqlx::query(AssertSqlSafe(sql))
            .bind(key.id.to_string())
            .bind(key.created_time)
            .bind(key.tenant_id.to_string())
            .bind(key.user_id.to_string())
            .bind(&key.digest)
            .bind(&key.description)
            .bind(i64::from(key.enabled))
            .bind(key.expiration_time)
            .bind(key.user_id.to_string())
            .bind(cap)
            .execute(&mut *tx)
            .await;
        if result.map_err(conflict_on("digest"))?.rows_affected() == 0 {
            return Ok(false);
        }
        let event = self.record(&mut tx, Target::ApiKey(key.id)).await?;
        event.commit(tx).await?;
        Ok(true)
    }

    pub async fn api_key_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE digest = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(digest)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| key_from_row(&r)).transpose()
    }

    pub async fn api_key_by_id(&self, id: Uuid) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| key_from_row(&r)).transpose()
    }

    pub async fn list_api_keys(&self, user_id: Uuid) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE user_id = $1 ORDER BY created_time, id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(user_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(key_from_row).collect()
    }

    /// The outcome is false when no such key.
    pub async fn set_api_key_enabled(
        &self,
        id: Uuid,
        enabled: bool,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let result = sqlx::query("UPDATE api_keys SET enabled = $1 WHERE id = $2")
                .bind(i64::from(enabled))
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
            let changed = result.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::Key(id), Target::ApiKey(id))
        })
        .await
    }

    /// The outcome is false when no such key.
    pub async fn delete_api_key(&self, id: Uuid) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let result = sqlx::query("DELETE FROM api_keys WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
            let changed = result.rows_affected() > 0;
            Change::audited(tx, changed, Revocation::Key(id), Target::ApiKey(id))
        })
        .await
    }
}

/// Flags are stored as 0/1 integers in both dialects.
fn flag(row: &AnyRow, index: usize) -> Result<bool, StoreError> {
    Ok(row.try_get::<i64, _>(index)? != 0)
}

/// Binds `user`'s customer id to their tenant when no tenant used it before;
/// refuses it ([`StoreError::ForeignCustomer`]) when another tenant did. Two
/// tenants racing for a new id: the second insert waits on the first's row
/// (PostgreSQL) or its write lock (SQLite), then reads the first's tenant.
async fn claim_customer(
    conn: &mut sqlx::AnyConnection,
    user: &UserRecord,
) -> Result<(), StoreError> {
    let customer = user.customer_id.to_string();
    let tenant = user.tenant_id.to_string();
    sqlx::query(
        "INSERT INTO customer_tenants (customer_id, tenant_id, created_time) \
         VALUES ($1, $2, $3) ON CONFLICT (customer_id) DO NOTHING",
    )
    .bind(&customer)
    .bind(&tenant)
    .bind(user.created_time)
    .execute(&mut *conn)
    .await?;
    let owner: String =
        sqlx::query_scalar("SELECT tenant_id FROM customer_tenants WHERE customer_id = $1")
            .bind(&customer)
            .fetch_one(&mut *conn)
            .await?;
    if owner != tenant {
        return Err(StoreError::ForeignCustomer);
    }
    Ok(())
}

/// A unique-constraint violation as a conflict on `what`; any other error
/// as it is.
fn conflict_on(what: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |error| match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => StoreError::Conflict(what),
        other => other.into(),
    }
}

fn uuid_col(row: &AnyRow, index: usize) -> Result<Uuid, StoreError> {
    let text: String = row.try_get(index)?;
    Uuid::parse_str(&text).map_err(|_| StoreError::Corrupt(format!("bad uuid {text:?}")))
}

fn user_from_row(row: &AnyRow) -> Result<UserRecord, StoreError> {
    let authority: String = row.try_get(5)?;
    Ok(UserRecord {
        id: uuid_col(row, 0)?,
        created_time: row.try_get(1)?,
        tenant_id: uuid_col(row, 2)?,
        customer_id: uuid_col(row, 3)?,
        email: row.try_get(4)?,
        authority: Authority::parse(&authority)
            .ok_or_else(|| StoreError::Corrupt(format!("bad authority {authority:?}")))?,
        first_name: row.try_get(6)?,
        last_name: row.try_get(7)?,
        phone: row.try_get(8)?,
        additional_info: row.try_get(9)?,
        version: row.try_get(10)?,
        enabled: flag(row, 11)?,
        password_hash: row.try_get(12)?,
        tokens_valid_after: row.try_get(13)?,
    })
}

fn key_from_row(row: &AnyRow) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: uuid_col(row, 0)?,
        created_time: row.try_get(1)?,
        tenant_id: uuid_col(row, 2)?,
        user_id: uuid_col(row, 3)?,
        digest: row.try_get(4)?,
        description: row.try_get(5)?,
        enabled: flag(row, 6)?,
        expiration_time: row.try_get(7)?,
    })
}

#[cfg(test)]
mod tests;
