//! What was imported from the platform: the `platform_rows` table (each
//! imported user and key as it was on the platform), the writes of an
//! import, and the platform's signing settings (in `settings`).
//!
//! Added rows are written in batches, one transaction each, with an audit
//! event per row. A change to a row keygate already holds goes through one
//! revoking write per row, like any change that can end credentials.

use std::collections::{HashMap, HashSet};

use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::audit::Pending;
use super::revocation::Change;
use super::rows::{KEY_COLUMNS, Target, USER_COLUMNS, key_from_row, user_from_row, values};
use super::sessions::outdate_user;
use super::{ApiKeyRecord, Store, StoreError, UserRecord};
use crate::vocab::identity::{Authority, NULL_UUID};
use crate::vocab::revocation::{Published, Revocation};
use crate::vocab::settings::Pooler;

/// A platform user as keygate imports it: the platform's values, mapped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlatformUser {
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
    pub enabled: bool,
    /// The bcrypt hash, or empty while the user has not set a password.
    pub password_hash: String,
    /// The digest of a pending activation token, and when it expires (epoch ms).
    pub activation: Option<(String, i64)>,
    /// The digest of a pending password-reset token, and when it expires
    /// (epoch ms). Absent from what older imports recorded.
    #[serde(default)]
    pub reset: Option<(String, i64)>,
}

impl PlatformUser {
    /// The fields a user edits in the platform's UI (everything but the
    /// credentials).
    pub fn same_profile(&self, other: &PlatformUser) -> bool {
        (
            &self.email,
            self.authority,
            self.tenant_id,
            self.customer_id,
            &self.first_name,
            &self.last_name,
            &self.phone,
            &self.additional_info,
        ) == (
            &other.email,
            other.authority,
            other.tenant_id,
            other.customer_id,
            &other.first_name,
            &other.last_name,
            &other.phone,
            &other.additional_info,
        )
    }
}

/// A platform API key as keygate imports it: its value only as the digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlatformKey {
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

/// What to change in a user keygate holds: each field is set only when it
/// changed on the platform's side since the last import.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserUpdate {
    pub profile: bool,
    /// Of the profile, what a token carries and access depends on changed:
    /// the e-mail, authority, tenant or customer.
    pub identity: bool,
    pub enabled: Option<bool>,
    pub password_hash: Option<String>,
    /// `Some(None)`: the pending token is gone.
    pub activation: Option<Option<(String, i64)>>,
    pub reset: Option<ResetUpdate>,
}

/// A password-reset token that changed on the platform since the last
/// import.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetUpdate {
    /// The digest imported last time, gone from the platform: dropped from
    /// keygate if keygate still holds it.
    pub gone: Option<String>,
    /// The platform's new token (digest, expiry): it replaces the user's
    /// reset tokens, as a newer link does in keygate.
    pub token: Option<(String, i64)>,
}

impl UserUpdate {
    pub fn is_empty(&self) -> bool {
        *self == UserUpdate::default()
    }
}

/// What to change in a key keygate holds (as [`UserUpdate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    pub digest: Option<String>,
    pub description: Option<String>,
    pub enabled: Option<bool>,
    pub expiration_time: Option<i64>,
}

impl KeyUpdate {
    pub fn is_empty(&self) -> bool {
        *self == KeyUpdate::default()
    }
}

/// The kind of an imported row, as stored in `platform_rows.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    User,
    Key,
    /// A user's imported second factors (the id is the user's).
    TwoFactor,
}

impl RowKind {
    fn as_str(self) -> &'static str {
        match self {
            RowKind::User => "user",
            RowKind::Key => "key",
            RowKind::TwoFactor => "two_factor",
        }
    }
}

/// The first key of the advisory lock of the sync; the second is the hash
/// of the store's schema, so stores in one database do not contend.
const SYNC_LOCK: i32 = 0x6b67_7379; // "kgsy"

/// The right to apply a sync with the platform's database: one replica at
/// a time. On PostgreSQL a session advisory lock held on one of the store's
/// connections, or, behind a transaction pooler (where a session outlives
/// no transaction), on a connection of its own over `store.notify_url`; on
/// SQLite (one replica) always granted.
pub struct SyncLock {
    conn: Option<Held>,
}

/// The session that holds the sync lock.
enum Held {
    Pooled(sqlx::pool::PoolConnection<sqlx::Any>),
    Direct(sqlx::AnyConnection),
}

impl Held {
    fn conn(&mut self) -> &mut sqlx::AnyConnection {
        match self {
            Held::Pooled(conn) => conn,
            Held::Direct(conn) => conn,
        }
    }
}

impl SyncLock {
    /// Gives the lock up and the connection back.
    pub async fn release(mut self) {
        if let Some(mut held) = self.conn.take() {
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext(current_schema()))")
                .bind(SYNC_LOCK)
                .execute(held.conn())
                .await;
            match held {
                // Closing the connection ends the lock with its session.
                Held::Pooled(conn) if unlocked.is_err() => drop(conn.detach()),
                Held::Pooled(_) => {}
                Held::Direct(conn) => {
                    let _ = sqlx::Connection::close(conn).await;
                }
            }
        }
    }
}

impl Drop for SyncLock {
    /// Not released (the task ended midway): the connection closes rather
    /// than return to the pool holding the lock.
    fn drop(&mut self) {
        if let Some(Held::Pooled(conn)) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

const SIGNING_KEY: &str = "platform.signing_key";
const ISSUER: &str = "platform.issuer";

/// `($1, $2, ...)` from `first` on, for `n` values.
fn placeholders(first: usize, n: usize) -> String {
    let list: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    format!("({})", list.join(", "))
}

impl Store {
    /// The sync lock ([`SyncLock`]) if no other replica holds it.
    pub async fn try_sync_lock(&self) -> Result<Option<SyncLock>, StoreError> {
        if self.dialect != super::Dialect::Postgres {
            return Ok(Some(SyncLock { conn: None }));
        }
        let mut held = match (self.pool.pooler(), &self.direct_url) {
            (Pooler::None, _) => Held::Pooled(self.pool.acquire().await?),
            (Pooler::Transaction, Some(direct)) => {
                Held::Direct(<sqlx::AnyConnection as sqlx::Connection>::connect(direct).await?)
            }
            (Pooler::Transaction, None) => {
                return Err(StoreError::Setup(
                    "the platform sync's lock needs a session of its own behind a transaction \
                     pooler: set store.notify_url"
                        .into(),
                ));
            }
        };
        let row = sqlx::query("SELECT pg_try_advisory_lock($1, hashtext(current_schema()))")
            .bind(SYNC_LOCK)
            .fetch_one(held.conn())
            .await?;
        let locked: bool = row.try_get(0)?;
        Ok(locked.then_some(SyncLock { conn: Some(held) }))
    }

    /// The rows `SELECT {columns} FROM {table} WHERE {column} IN (values)`:
    /// one query per batch; none for no values.
    async fn rows_in(
        &self,
        columns: &str,
        table: &str,
        column: &str,
        values: impl ExactSizeIterator<Item = String>,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        if values.len() == 0 {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {columns} FROM {table} WHERE {column} IN {}",
            placeholders(1, values.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for value in values {
            query = query.bind(value);
        }
        Ok(query.fetch_all(&self.pool).await?)
    }

    /// The users keygate holds with these ids.
    pub async fn users_by_ids(
        &self,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, UserRecord>, StoreError> {
        let ids = ids.iter().map(Uuid::to_string);
        let rows = self.rows_in(USER_COLUMNS, "users", "id", ids).await?;
        rows.iter()
            .map(|row| user_from_row(row).map(|u| (u.id, u)))
            .collect()
    }

    /// Of the users with these ids, those whose password hash is a re-hash
    /// made in keygate, with the hash it re-hashed (the first of a chain).
    pub async fn rehashed_from_by_ids(
        &self,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, String>, StoreError> {
        let ids = ids.iter().map(Uuid::to_string);
        let rows = self
            .rows_in("id, password_rehashed_from", "users", "id", ids)
            .await?;
        let mut rehashed = HashMap::new();
        for row in &rows {
            if let Some(from) = row.try_get::<Option<String>, _>(1)? {
                rehashed.insert(super::uuid_col(row, 0)?, from);
            }
        }
        Ok(rehashed)
    }

    /// The ids of the users holding these e-mail addresses, by the address
    /// as stored (folded, [`crate::email::fold`]).
    pub async fn user_ids_by_emails(
        &self,
        emails: &[String],
    ) -> Result<HashMap<String, Uuid>, StoreError> {
        let emails = emails.iter().map(|e| crate::email::fold(e));
        let rows = self.rows_in("email, id", "users", "email", emails).await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, super::uuid_col(row, 1)?)))
            .collect()
    }

    /// The keys keygate holds with these ids.
    pub async fn api_keys_by_ids(
        &self,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, ApiKeyRecord>, StoreError> {
        let ids = ids.iter().map(Uuid::to_string);
        let rows = self.rows_in(KEY_COLUMNS, "api_keys", "id", ids).await?;
        rows.iter()
            .map(|row| key_from_row(row).map(|k| (k.id, k)))
            .collect()
    }

    /// The ids of the keys holding these digests.
    pub async fn api_key_ids_by_digests(
        &self,
        digests: &[String],
    ) -> Result<HashMap<String, Uuid>, StoreError> {
        let digests = digests.iter().cloned();
        let rows = self
            .rows_in("digest, id", "api_keys", "digest", digests)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, super::uuid_col(row, 1)?)))
            .collect()
    }

    /// The imported rows of `kind` with these ids, as they were on the
    /// platform when last imported.
    pub async fn imported_rows<T: serde::de::DeserializeOwned>(
        &self,
        kind: RowKind,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, T>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = format!(
            "SELECT id, fields FROM platform_rows WHERE kind = $1 AND id IN {}",
            placeholders(2, ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(kind.as_str());
        for id in ids {
            query = query.bind(id.to_string());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let id = super::uuid_col(row, 0)?;
                let fields: String = row.try_get(1)?;
                let fields = serde_json::from_str(&fields)
                    .map_err(|e| StoreError::Corrupt(format!("imported row {id}: {e}")))?;
                Ok((id, fields))
            })
            .collect()
    }

    /// The ids of every imported row of `kind` not in `seen`.
    pub async fn imported_ids_not_in(
        &self,
        kind: RowKind,
        seen: &HashSet<Uuid>,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut rows = sqlx::query("SELECT id FROM platform_rows WHERE kind = $1 ORDER BY id")
            .bind(kind.as_str())
            .fetch(&self.pool);
        let mut missing = Vec::new();
        while let Some(row) = rows.try_next().await? {
            let id = super::uuid_col(&row, 0)?;
            if !seen.contains(&id) {
                missing.push(id);
            }
        }
        Ok(missing)
    }

    /// Adds imported users in one transaction, each with its activation
    /// token, its customer's tenant, its import record and its audit event;
    /// one statement per table.
    pub async fn add_imported_users(
        &self,
        users: &[PlatformUser],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if users.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "INSERT INTO users ({USER_COLUMNS}) VALUES {}",
            values(users.len(), 14)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for user in users {
            query = query
                .bind(user.id.to_string())
                .bind(user.created_time)
                .bind(user.tenant_id.to_string())
                .bind(user.customer_id.to_string())
                .bind(user.email.clone())
                .bind(user.authority.as_str())
                .bind(user.first_name.clone())
                .bind(user.last_name.clone())
                .bind(user.phone.clone())
                .bind(user.additional_info.clone())
                .bind(1_i64)
                .bind(i64::from(user.enabled))
                .bind(user.password_hash.clone())
                .bind(0_i64);
        }
        query.execute(&mut *tx).await?;
        let mut customers: Vec<&PlatformUser> = users
            .iter()
            .filter(|u| u.customer_id != NULL_UUID)
            .collect();
        customers.sort_by_key(|u| u.customer_id);
        customers.dedup_by_key(|u| u.customer_id);
        if !customers.is_empty() {
            let sql = format!(
                "INSERT INTO customer_tenants (customer_id, tenant_id, created_time) VALUES {} \
                 ON CONFLICT (customer_id) DO NOTHING",
                values(customers.len(), 3)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for user in customers {
                query = query
                    .bind(user.customer_id.to_string())
                    .bind(user.tenant_id.to_string())
                    .bind(user.created_time);
            }
            query.execute(&mut *tx).await?;
        }
        for user in users {
            if let Some((digest, expires_at)) = &user.activation {
                upsert_token(&mut tx, TokenKind::Activation, user.id, digest, *expires_at).await?;
            }
            if let Some((digest, expires_at)) = &user.reset {
                upsert_token(&mut tx, TokenKind::Reset, user.id, digest, *expires_at).await?;
            }
        }
        remember_many(
            &mut tx,
            RowKind::User,
            users.iter().map(|u| (u.id, u)),
            now_ms,
        )
        .await?;
        let targets: Vec<Target> = users.iter().map(|u| Target::User(u.id)).collect();
        let events = self.record_many(&mut tx, &targets).await?;
        Pending::commit_all(events, tx).await
    }

    /// Adds imported keys in one transaction, each with its import record
    /// and its audit event; one statement per table.
    pub async fn add_imported_keys(
        &self,
        keys: &[PlatformKey],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "INSERT INTO api_keys (id, created_time, tenant_id, user_id, digest, description, enabled, expiration_time) \
             VALUES {}",
            values(keys.len(), 8)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in keys {
            query = query
                .bind(key.id.to_string())
                .bind(key.created_time)
                .bind(key.tenant_id.to_string())
                .bind(key.user_id.to_string())
                .bind(key.digest.clone())
                .bind(key.description.clone())
                .bind(i64::from(key.enabled))
                .bind(key.expiration_time);
        }
        query.execute(&mut *tx).await?;
        remember_many(
            &mut tx,
            RowKind::Key,
            keys.iter().map(|k| (k.id, k)),
            now_ms,
        )
        .await?;
        let targets: Vec<Target> = keys.iter().map(|k| Target::ApiKey(k.id)).collect();
        let events = self.record_many(&mut tx, &targets).await?;
        Pending::commit_all(events, tx).await
    }

    /// Applies what changed on the platform to a user keygate holds, and
    /// records `platform` as its last imported state. A change that can end
    /// credentials (disabled, a new password, another e-mail, authority,
    /// tenant or customer) outdates the user's tokens and ends their sessions, and is
    /// published like any revocation.
    pub async fn update_imported_user(
        &self,
        platform: &PlatformUser,
        update: &UserUpdate,
        now_secs: i64,
    ) -> Result<Published<bool>, StoreError> {
        let platform = platform.clone();
        let update = update.clone();
        self.revoking_write(|mut tx| async move {
            write_imported_user(&mut tx, &platform, &update).await?;
            write_imported_user_tokens(&mut tx, platform.id, &update).await?;
            let revoking =
                update.identity || update.password_hash.is_some() || update.enabled == Some(false);
            if revoking {
                outdate_user(&mut tx, platform.id, now_secs).await?;
            }
            remember(
                &mut tx,
                RowKind::User,
                platform.id,
                &platform,
                now_secs * 1000,
            )
            .await?;
            let changed = !update.is_empty();
            let revocation = revoking.then_some(Revocation::User(platform.id));
            let audit = changed.then_some(Target::User(platform.id));
            Change::new(tx, changed, revocation, audit)
        })
        .await
    }

    /// Applies what changed on the platform to a key keygate holds (as
    /// [`Store::update_imported_user`]).
    pub async fn update_imported_key(
        &self,
        platform: &PlatformKey,
        update: &KeyUpdate,
        now_ms: i64,
    ) -> Result<Published<bool>, StoreError> {
        let platform = platform.clone();
        let update = update.clone();
        self.revoking_write(|mut tx| async move {
            let id = platform.id.to_string();
            if let Some(digest) = &update.digest {
                sqlx::query("UPDATE api_keys SET digest = $1 WHERE id = $2")
                    .bind(digest)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(description) = &update.description {
                sqlx::query("UPDATE api_keys SET description = $1 WHERE id = $2")
                    .bind(description)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(enabled) = update.enabled {
                sqlx::query("UPDATE api_keys SET enabled = $1 WHERE id = $2")
                    .bind(i64::from(enabled))
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(expiration_time) = update.expiration_time {
                sqlx::query("UPDATE api_keys SET expiration_time = $1 WHERE id = $2")
                    .bind(expiration_time)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
            }
            remember(&mut tx, RowKind::Key, platform.id, &platform, now_ms).await?;
            let changed = !update.is_empty();
            let revocation = changed.then_some(Revocation::Key(platform.id));
            let audit = changed.then_some(Target::ApiKey(platform.id));
            Change::new(tx, changed, revocation, audit)
        })
        .await
    }

    /// Records `platform` as the last imported state of a row whose keygate
    /// side is kept as it is (nothing to change, or changed in keygate).
    pub async fn remember_imported<T: Serialize>(
        &self,
        kind: RowKind,
        id: Uuid,
        platform: &T,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        remember(&mut tx, kind, id, platform, now_ms).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets that a row was imported (it was removed from keygate).
    pub async fn forget_imported(&self, kind: RowKind, id: Uuid) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM platform_rows WHERE kind = $1 AND id = $2")
            .bind(kind.as_str())
            .bind(id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Stores the platform's signing key (base64, as the platform keeps it)
    /// and issuer. Returns false when they were stored already.
    pub async fn set_platform_signing(&self, key: &str, issuer: &str) -> Result<bool, StoreError> {
        if self.platform_signing().await?.as_ref() == Some(&(key.to_owned(), issuer.to_owned())) {
            return Ok(false);
        }
        let mut tx = self.pool.begin().await?;
        for (name, value) in [(SIGNING_KEY, key), (ISSUER, issuer)] {
            sqlx::query(
                "INSERT INTO settings (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )
            .bind(name)
            .bind(value)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The platform's signing key (base64) and issuer, when imported: what
    /// the platform's own tokens are signed with, for the platform identity
    /// mode when its settings name no key. Never keygate's own signing key.
    pub async fn platform_signing(&self) -> Result<Option<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT name, value FROM settings WHERE name IN ($1, $2)")
            .bind(SIGNING_KEY)
            .bind(ISSUER)
            .fetch_all(&self.pool)
            .await?;
        let mut key = None;
        let mut issuer = None;
        for row in rows {
            let name: String = row.try_get(0)?;
            let value: String = row.try_get(1)?;
            if name == SIGNING_KEY {
                key = Some(value);
            } else {
                issuer = Some(value);
            }
        }
        Ok(key.zip(issuer))
    }
}
/// Writes the columns of a user an import changed: the profile, the
/// password, the enabled flag (enabling lifts a lockout).
async fn write_imported_user(
    conn: &mut sqlx::AnyConnection,
    platform: &PlatformUser,
    update: &UserUpdate,
) -> Result<(), StoreError> {
    let id = platform.id.to_string();
    if update.profile {
        sqlx::query(
            "UPDATE users SET email = $1, authority = $2, tenant_id = $3, customer_id = $4, \
             first_name = $5, last_name = $6, phone = $7, additional_info = $8, \
             version = version + 1 WHERE id = $9",
        )
        .bind(&platform.email)
        .bind(platform.authority.as_str())
        .bind(platform.tenant_id.to_string())
        .bind(platform.customer_id.to_string())
        .bind(&platform.first_name)
        .bind(&platform.last_name)
        .bind(&platform.phone)
        .bind(platform.additional_info.clone())
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    }
    if let Some(hash) = &update.password_hash {
        sqlx::query(
            "UPDATE users SET password_hash = $1, password_rehashed_from = NULL, \
             version = version + 1 WHERE id = $2",
        )
        .bind(hash)
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    }
    if let Some(enabled) = update.enabled {
        sqlx::query("UPDATE users SET enabled = $1, version = version + 1 WHERE id = $2")
            .bind(i64::from(enabled))
            .bind(&id)
            .execute(&mut *conn)
            .await?;
        if enabled {
            sqlx::query("DELETE FROM login_lockouts WHERE user_id = $1")
                .bind(&id)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// Writes the activation and reset tokens of a user an import changed.
async fn write_imported_user_tokens(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    update: &UserUpdate,
) -> Result<(), StoreError> {
    let id = user_id.to_string();
    if let Some(activation) = &update.activation {
        sqlx::query("DELETE FROM activation_tokens WHERE user_id = $1")
            .bind(&id)
            .execute(&mut *conn)
            .await?;
        if let Some((digest, expires_at)) = activation {
            upsert_token(
                &mut *conn,
                TokenKind::Activation,
                user_id,
                digest,
                *expires_at,
            )
            .await?;
        }
    }
    if let Some(reset) = &update.reset {
        if let Some((digest, expires_at)) = &reset.token {
            sqlx::query("DELETE FROM reset_tokens WHERE user_id = $1")
                .bind(&id)
                .execute(&mut *conn)
                .await?;
            upsert_token(&mut *conn, TokenKind::Reset, user_id, digest, *expires_at).await?;
        } else if let Some(gone) = &reset.gone {
            sqlx::query("DELETE FROM reset_tokens WHERE user_id = $1 AND digest = $2")
                .bind(&id)
                .bind(gone)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// Which one-time token a platform row carried: an invitation or a reset.
#[derive(Clone, Copy)]
enum TokenKind {
    Activation,
    Reset,
}

/// An activation or password-reset token the platform issued, stored as
/// keygate stores its own (the digest, with the platform's expiry).
async fn upsert_token(
    conn: &mut sqlx::AnyConnection,
    kind: TokenKind,
    user_id: Uuid,
    digest: &str,
    expires_at: i64,
) -> Result<(), StoreError> {
    let sql = match kind {
        TokenKind::Activation => {
            "INSERT INTO activation_tokens (digest, user_id, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (digest) DO UPDATE SET user_id = excluded.user_id, expires_at = excluded.expires_at"
        }
        TokenKind::Reset => {
            "INSERT INTO reset_tokens (digest, user_id, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (digest) DO UPDATE SET user_id = excluded.user_id, expires_at = excluded.expires_at"
        }
    };
    sqlx::query(sql)
        .bind(digest)
        .bind(user_id.to_string())
        .bind(expires_at)
        .execute(conn)
        .await?;
    Ok(())
}

async fn remember<T: Serialize>(
    conn: &mut sqlx::AnyConnection,
    kind: RowKind,
    id: Uuid,
    platform: &T,
    now_ms: i64,
) -> Result<(), StoreError> {
    let fields = serde_json::to_string(platform)
        .map_err(|e| StoreError::Corrupt(format!("imported row {id}: {e}")))?;
    sqlx::query(
        "INSERT INTO platform_rows (kind, id, fields, imported_time) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (kind, id) DO UPDATE SET fields = excluded.fields, imported_time = excluded.imported_time",
    )
    .bind(kind.as_str())
    .bind(id.to_string())
    .bind(fields)
    .bind(now_ms)
    .execute(conn)
    .await?;
    Ok(())
}

async fn remember_many<'a, T: Serialize + 'a>(
    conn: &mut sqlx::AnyConnection,
    kind: RowKind,
    rows: impl ExactSizeIterator<Item = (Uuid, &'a T)>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO platform_rows (kind, id, fields, imported_time) VALUES {} \
         ON CONFLICT (kind, id) DO UPDATE SET fields = excluded.fields, imported_time = excluded.imported_time",
        values(rows.len(), 4)
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for (id, platform) in rows {
        let fields = serde_json::to_string(platform)
            .map_err(|e| StoreError::Corrupt(format!("imported row {id}: {e}")))?;
        query = query
            .bind(kind.as_str())
            .bind(id.to_string())
            .bind(fields)
            .bind(now_ms);
    }
    query.execute(conn).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_row_values_number_every_placeholder_once() {
        assert_eq!(values(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(placeholders(2, 3), "($2, $3, $4)");
    }
}
