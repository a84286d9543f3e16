//! The `two_factor` table: each user's configured second factors. What a row
//! holds is sealed or digested before it gets here (`auth::at_rest`); the
//! store never sees a secret in clear.

use sqlx::Row;
use uuid::Uuid;

use super::revocation::Change;
use super::rows::Target;
use super::sessions::end_sessions_of_user;
use super::{Store, StoreError, flag};
use crate::vocab::revocation::Published;

/// One configured provider of one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwoFactorRecord {
    /// `TOTP` or `BACKUP_CODE`.
    pub provider: String,
    pub use_by_default: bool,
    /// A sealed TOTP secret, or the JSON list of backup code digests.
    pub secret: String,
    /// The last TOTP step accepted.
    pub last_step: i64,
}

impl Store {
    /// The user's configured providers, oldest first.
    pub(crate) async fn two_factors(
        &self,
        user_id: Uuid,
    ) -> Result<Vec<TwoFactorRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT provider, use_by_default, secret, last_step FROM two_factor \
             WHERE user_id = $1 ORDER BY created_time, provider",
        )
        .bind(user_id.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(TwoFactorRecord {
                    provider: row.try_get(0)?,
                    use_by_default: flag(row, 1)?,
                    secret: row.try_get(2)?,
                    last_step: row.try_get(3)?,
                })
            })
            .collect()
    }

    /// When each of the user's providers was configured, by provider.
    pub async fn two_factor_times(
        &self,
        user_id: Uuid,
    ) -> Result<std::collections::HashMap<String, i64>, StoreError> {
        let rows = sqlx::query("SELECT provider, created_time FROM two_factor WHERE user_id = $1")
            .bind(user_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    /// Stores an imported provider in place of the user's one of that type,
    /// if any, configured at `now_ms`; every session of the user ends.
    pub async fn put_imported_two_factor(
        &self,
        user_id: Uuid,
        record: &TwoFactorRecord,
        now_ms: i64,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            if record.use_by_default {
                sqlx::query("UPDATE two_factor SET use_by_default = 0 WHERE user_id = $1")
                    .bind(user_id.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(
                "INSERT INTO two_factor (user_id, provider, use_by_default, secret, last_step, created_time) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (user_id, provider) DO UPDATE SET \
                 use_by_default = excluded.use_by_default, secret = excluded.secret, \
                 last_step = excluded.last_step, created_time = excluded.created_time",
            )
            .bind(user_id.to_string())
            .bind(&record.provider)
            .bind(i64::from(record.use_by_default))
            .bind(&record.secret)
            .bind(record.last_step)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            // A second factor the platform configured ends the user's
            // sessions, as one configured in keygate ends the others.
            end_sessions_of_user(&mut tx, user_id, now_ms, None).await?;
            Change::of_user(tx, user_id, true)
        })
        .await
    }

    /// Adds a provider; `false` when the user has it already. A provider
    /// saved as the default takes that from the others. Every session of the
    /// user but `keep` (the one that configured it) ends with it, as a
    /// password change ends them: a refresh token from before the change
    /// cannot go on rolling.
    pub(crate) async fn add_two_factor(
        &self,
        user_id: Uuid,
        record: &TwoFactorRecord,
        now_ms: i64,
        keep: Option<Uuid>,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let inserted = sqlx::query(
                "INSERT INTO two_factor (user_id, provider, use_by_default, secret, last_step, created_time) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (user_id, provider) DO NOTHING",
            )
            .bind(user_id.to_string())
            .bind(&record.provider)
            .bind(i64::from(record.use_by_default))
            .bind(&record.secret)
            .bind(record.last_step)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            if inserted {
                if record.use_by_default {
                    sqlx::query(
                        "UPDATE two_factor SET use_by_default = 0 WHERE user_id = $1 AND provider <> $2",
                    )
                    .bind(user_id.to_string())
                    .bind(&record.provider)
                    .execute(&mut *tx)
                    .await?;
                }
                end_sessions_of_user(&mut tx, user_id, now_ms, keep).await?;
            }
            Change::of_user(tx, user_id, inserted)
        })
        .await
    }

    /// Sets whether a provider is the default; `false` when the user has no such provider.
    pub(crate) async fn set_two_factor_default(
        &self,
        user_id: Uuid,
        provider: &str,
        use_by_default: bool,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        if use_by_default {
            sqlx::query("UPDATE two_factor SET use_by_default = 0 WHERE user_id = $1")
                .bind(user_id.to_string())
                .execute(&mut *tx)
                .await?;
        }
        let found = sqlx::query(
            "UPDATE two_factor SET use_by_default = $1 WHERE user_id = $2 AND provider = $3",
        )
        .bind(i64::from(use_by_default))
        .bind(user_id.to_string())
        .bind(provider)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let event = self
            .record_if(&mut tx, found, Target::User(user_id))
            .await?;
        event.commit(tx).await?;
        Ok(found)
    }

    /// Removes a provider the user removes themselves, and their backup
    /// codes with the last other provider; `false` when the user had none
    /// such. Every session of the user but `keep` (the one that removed it)
    /// ends with it, as with [`Store::add_two_factor`].
    pub(crate) async fn remove_second_factor(
        &self,
        user_id: Uuid,
        provider: &str,
        now_ms: i64,
        keep: Option<Uuid>,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let removed = delete_provider(&mut tx, user_id, provider).await?;
            if removed {
                let others: i64 = sqlx::query(
                    "SELECT COUNT(*) FROM two_factor WHERE user_id = $1 AND provider <> 'BACKUP_CODE'",
                )
                .bind(user_id.to_string())
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
                if others == 0 {
                    sqlx::query(
                        "DELETE FROM two_factor WHERE user_id = $1 AND provider = 'BACKUP_CODE'",
                    )
                    .bind(user_id.to_string())
                    .execute(&mut *tx)
                    .await?;
                }
                end_sessions_of_user(&mut tx, user_id, now_ms, keep).await?;
            }
            Change::of_user(tx, user_id, removed)
        })
        .await
    }

    /// Removes a provider the platform removed; `false` when the user had
    /// none such. Every session of the user ends with it.
    pub async fn remove_two_factor(
        &self,
        user_id: Uuid,
        provider: &str,
        now_ms: i64,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let removed = delete_provider(&mut tx, user_id, provider).await?;
            // A second factor the platform removed ends the user's
            // sessions, as one removed in keygate ends the others.
            if removed {
                end_sessions_of_user(&mut tx, user_id, now_ms, None).await?;
            }
            Change::of_user(tx, user_id, removed)
        })
        .await
    }

    /// Records that the TOTP code of `step` was used, and reseals the secret
    /// when given; `false` when that step or a later one was used already (a
    /// replayed code), so of two concurrent uses of one code one wins.
    pub(crate) async fn use_totp_step(
        &self,
        user_id: Uuid,
        step: i64,
        resealed: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let used = sqlx::query(
            "UPDATE two_factor SET last_step = $1, secret = COALESCE($2, secret) \
             WHERE user_id = $3 AND provider = 'TOTP' AND last_step < $1",
        )
        .bind(step)
        .bind(resealed)
        .bind(user_id.to_string())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let event = self.record_if(&mut tx, used, Target::User(user_id)).await?;
        event.commit(tx).await?;
        Ok(used)
    }

    /// Replaces the backup code digests if they are still `before`: of two
    /// concurrent uses of one code one wins. `false` when they changed.
    pub(crate) async fn use_backup_code(
        &self,
        user_id: Uuid,
        before: &str,
        after: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let used = sqlx::query(
            "UPDATE two_factor SET secret = $1 \
             WHERE user_id = $2 AND provider = 'BACKUP_CODE' AND secret = $3",
        )
        .bind(after)
        .bind(user_id.to_string())
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let event = self.record_if(&mut tx, used, Target::User(user_id)).await?;
        event.commit(tx).await?;
        Ok(used)
    }
}

/// Deletes the user's `provider`; `false` when the user had none such.
async fn delete_provider(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    provider: &str,
) -> Result<bool, StoreError> {
    let deleted = sqlx::query("DELETE FROM two_factor WHERE user_id = $1 AND provider = $2")
        .bind(user_id.to_string())
        .bind(provider)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(deleted == 1)
}
