//! Store operations of the session endpoints: refresh-token rotation, password
//! changes and the login lockout counters.

use sqlx::Row;
use uuid::Uuid;

use super::audit::Target;
use super::{Published, Revocation, Store, StoreError};

impl Store {
    /// Moves a live session from refresh token `old_jti` to `new_jti`, issued
    /// at `now_ms`. False when the session is ended or gone, or `old_jti` is no
    /// longer current (a retired refresh token came back, or a concurrent
    /// refresh won).
    pub async fn rotate_refresh(
        &self,
        session_id: Uuid,
        old_jti: &str,
        new_jti: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "UPDATE sessions SET refresh_jti = $1, refreshed_time = $4 \
             WHERE id = $2 AND refresh_jti = $3 AND ended = 0",
        )
        .bind(new_jti)
        .bind(session_id.to_string())
        .bind(old_jti)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Replaces a user's password hash. With `outdate_at` (a password change),
    /// every older token of the user is outdated and their sessions end, in the
    /// same transaction; without it (a re-hash) nothing else changes.
    pub async fn update_password(
        &self,
        user_id: Uuid,
        hash: &str,
        outdate_at: Option<i64>,
    ) -> Result<Published<bool>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = match outdate_at {
            Some(now_secs) => {
                sqlx::query(
                    "UPDATE users SET password_hash = $1, tokens_valid_after = $2, version = version + 1 WHERE id = $3",
                )
                .bind(hash)
                .bind(now_secs)
                .bind(user_id.to_string())
                .execute(&mut *tx)
                .await?
            }
            None => {
                sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
                    .bind(hash)
                    .bind(user_id.to_string())
                    .execute(&mut *tx)
                    .await?
            }
        };
        let mut revocation = None;
        if let Some(now_secs) = outdate_at {
            sqlx::query(super::END_SESSIONS_OF_USER)
                .bind(now_secs.saturating_mul(1000))
                .bind(user_id.to_string())
                .execute(&mut *tx)
                .await?;
            revocation = Some(self.publish(&mut tx, Revocation::User(user_id)).await?);
        }
        let changed = updated.rows_affected() > 0;
        let event = self
            .record_if(&mut tx, changed, Target::User(user_id))
            .await?;
        event.commit(tx).await?;
        Ok(Published {
            outcome: changed,
            revocation,
        })
    }

    /// Counts one more consecutive failed login; returns the count.
    pub async fn record_login_failure(&self, user_id: Uuid) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO login_lockouts (user_id, failures, locked) VALUES ($1, 1, 0) \
             ON CONFLICT (user_id) DO UPDATE SET failures = login_lockouts.failures + 1 \
             RETURNING failures",
        )
        .bind(user_id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// A successful login resets the consecutive-failure count.
    pub async fn clear_login_failures(&self, user_id: Uuid) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM login_lockouts WHERE user_id = $1 AND locked = 0")
            .bind(user_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Locks an account: disabled, its tokens outdated and sessions ended, and
    /// marked as locked so logins say why. Enabling the user lifts it.
    pub async fn lock_user(
        &self,
        user_id: Uuid,
        now_secs: i64,
    ) -> Result<Published<bool>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE users SET enabled = 0, tokens_valid_after = $1, version = version + 1 WHERE id = $2",
        )
        .bind(now_secs)
        .bind(user_id.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query(super::END_SESSIONS_OF_USER)
            .bind(now_secs.saturating_mul(1000))
            .bind(user_id.to_string())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO login_lockouts (user_id, failures, locked) VALUES ($1, 0, 1) \
             ON CONFLICT (user_id) DO UPDATE SET locked = 1",
        )
        .bind(user_id.to_string())
        .execute(&mut *tx)
        .await?;
        let revocation = self.publish(&mut tx, Revocation::User(user_id)).await?;
        tx.commit().await?;
        Ok(Published::revoking(updated.rows_affected() > 0, revocation))
    }

    pub async fn is_locked(&self, user_id: Uuid) -> Result<bool, StoreError> {
        let row =
            sqlx::query("SELECT COUNT(*) FROM login_lockouts WHERE user_id = $1 AND locked = 1")
                .bind(user_id.to_string())
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get::<i64, _>(0)? > 0)
    }
}
