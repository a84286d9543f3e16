//! The `api_keys` table: the key record (a digest, never the value), its
//! reads, writes and listing, and the per-user cap on creation.

use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::paging::{Listing, like_pattern};
use super::revocation::Change;
use super::rows::{ApiKeyRecord, KEY_COLUMNS, Target, key_from_row};
use super::{Dialect, Page, PageRequest, Store, StoreError, conflict_on};
use crate::vocab::revocation::{Published, Revocation};
use crate::vocab::scope::Scopes;

impl Store {
    /// Inserts `key` with no cap on its user's keys (tests set up with it).
    #[cfg(test)]
    pub(crate) async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        self.insert_api_key_capped(key, i64::MAX).await.map(|_| ())
    }

    /// Inserts `key` unless its user already holds `cap` keys: `Ok(false)`,
    /// nothing written. Counting and inserting are one statement; on
    /// PostgreSQL the owner's row is locked first, so concurrent creations
    /// for one user are counted one after another (SQLite writes one at a
    /// time anyway).
    pub(crate) async fn insert_api_key_capped(
        &self,
        key: &ApiKeyRecord,
        cap: i64,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
             WHERE (SELECT COUNT(*) FROM api_keys WHERE user_id = $10) < $11"
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
            .bind(key.scopes.as_deref().map(Scopes::to_stored))
            .bind(key.user_id.to_string())
            .bind(cap)
            .execute(&mut *tx)
            .await;
        if result.map_err(conflict_on("digest"))?.rows_affected() == 0 {
            return Ok(false);
        }
        let scopes = key.scopes.as_deref().map(Scopes::to_stored);
        let event = self
            .record_with_scopes(&mut tx, Target::ApiKey(key.id), scopes)
            .await?;
        event.commit(tx).await?;
        Ok(true)
    }

    pub(crate) async fn api_key_by_digest(
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

    /// A user's API keys by creation time.
    pub(crate) async fn api_keys_page(
        &self,
        user_id: Uuid,
        page: &PageRequest,
    ) -> Result<Page<ApiKeyRecord>, StoreError> {
        let mut filter = String::from(" WHERE user_id = $1");
        let mut binds = vec![user_id.to_string()];
        if let Some(text) = page.text_search.as_deref().filter(|t| !t.is_empty()) {
            binds.push(like_pattern(text));
            filter.push_str(" AND LOWER(description) LIKE $2 ESCAPE '\\'");
        }
        let listing = Listing {
            table: "api_keys",
            columns: KEY_COLUMNS,
            filter,
            binds,
            order: "created_time, id".into(),
        };
        self.page(listing, page, key_from_row).await
    }

    /// Returns false when no such key.
    pub(crate) async fn set_api_key_description(
        &self,
        id: Uuid,
        description: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let result = sqlx::query("UPDATE api_keys SET description = $1 WHERE id = $2")
            .bind(description)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        let changed = result.rows_affected() > 0;
        let event = self.record_if(&mut tx, changed, Target::ApiKey(id)).await?;
        event.commit(tx).await?;
        Ok(changed)
    }
}
