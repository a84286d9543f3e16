//! The `signing_keys` table: the keys that sign identity assertions, one of
//! them current. Private keys are read only by the server that signs with
//! them; listings return them too, and callers show only public members.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::rows::Target;
use super::{Store, StoreError, conflict_on, uuid_col};

/// A signing key as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeyRecord {
    pub id: Uuid,
    /// The key's id in assertions and the JWKS (its RFC 7638 thumbprint).
    pub kid: String,
    /// `ES256` or `EdDSA`.
    pub algorithm: String,
    /// The raw public key, base64url without padding.
    pub public_key: String,
    /// The PKCS#8 document, base64; empty for a key kept in a file.
    pub private_key: String,
    /// Epoch ms.
    pub created_time: i64,
    /// Epoch ms when it stopped being current; 0 while it is.
    pub retired_time: i64,
}

impl std::fmt::Debug for SigningKeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyRecord")
            .field("id", &self.id)
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm)
            .field("created_time", &self.created_time)
            .field("retired_time", &self.retired_time)
            .finish_non_exhaustive()
    }
}

const SIGNING_KEY_COLUMNS: &str =
    "id, kid, algorithm, public_key, private_key, created_time, retired_time";

impl Store {
    /// Every signing key, newest first; the current one has `retired_time` 0.
    pub async fn signing_keys(&self) -> Result<Vec<SigningKeyRecord>, StoreError> {
        let sql = format!(
            "SELECT {SIGNING_KEY_COLUMNS} FROM signing_keys ORDER BY created_time DESC, id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(signing_key_from_row).collect()
    }

    /// Makes `key` current unless a key is current already; `Ok(false)`
    /// then, nothing written. Replicas racing on an empty table all end with
    /// the one key that won.
    pub async fn insert_signing_key_if_none(
        &self,
        key: &SigningKeyRecord,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO signing_keys ({SIGNING_KEY_COLUMNS}, current_slot) \
             VALUES ($1, $2, $3, $4, $5, $6, 0, 1) ON CONFLICT DO NOTHING"
        );
        let mut tx = self.pool.begin().await?;
        let inserted = bind_key(sqlx::query(AssertSqlSafe(sql)), key)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if !inserted {
            return Ok(false);
        }
        let event = self.record(&mut tx, Target::SigningKey(key.id)).await?;
        event.commit(tx).await?;
        Ok(true)
    }

    /// Makes `key` current and retires the key that was (stamped `now_ms`),
    /// in one transaction; returns the retired key's kid. A key with the
    /// same kid already stored is made current again instead of inserted.
    pub async fn rotate_signing_key(
        &self,
        key: &SigningKeyRecord,
        now_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let retired =
            sqlx::query("SELECT kid FROM signing_keys WHERE current_slot = 1 AND kid <> $1")
                .bind(&key.kid)
                .fetch_optional(&mut *tx)
                .await?
                .map(|row| row.try_get::<String, _>(0))
                .transpose()?;
        sqlx::query(
            "UPDATE signing_keys SET current_slot = NULL, retired_time = $1 \
             WHERE current_slot = 1 AND kid <> $2",
        )
        .bind(now_ms)
        .bind(&key.kid)
        .execute(&mut *tx)
        .await?;
        let revived = sqlx::query(
            "UPDATE signing_keys SET current_slot = 1, retired_time = 0 WHERE kid = $1",
        )
        .bind(&key.kid)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if revived == 0 {
            let sql = format!(
                "INSERT INTO signing_keys ({SIGNING_KEY_COLUMNS}, current_slot) \
                 VALUES ($1, $2, $3, $4, $5, $6, 0, 1)"
            );
            bind_key(sqlx::query(AssertSqlSafe(sql)), key)
                .execute(&mut *tx)
                .await
                .map_err(conflict_on("current signing key"))?;
        }
        let event = self.record(&mut tx, Target::SigningKey(key.id)).await?;
        event.commit(tx).await?;
        Ok(retired)
    }

    /// Deletes keys retired before `before_ms`: no assertion they signed is
    /// still valid. Returns how many.
    pub async fn delete_signing_keys_retired_before(
        &self,
        before_ms: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM signing_keys WHERE current_slot IS NULL \
             AND retired_time > 0 AND retired_time < $1",
        )
        .bind(before_ms)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

fn bind_key<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    key: &SigningKeyRecord,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    query
        .bind(key.id.to_string())
        .bind(key.kid.clone())
        .bind(key.algorithm.clone())
        .bind(key.public_key.clone())
        .bind(key.private_key.clone())
        .bind(key.created_time)
}

fn signing_key_from_row(row: &AnyRow) -> Result<SigningKeyRecord, StoreError> {
    Ok(SigningKeyRecord {
        id: uuid_col(row, 0)?,
        kid: row.try_get(1)?,
        algorithm: row.try_get(2)?,
        public_key: row.try_get(3)?,
        private_key: row.try_get(4)?,
        created_time: row.try_get(5)?,
        retired_time: row.try_get(6)?,
    })
}
