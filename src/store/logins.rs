//! Logins: password changes and re-hashes, and the lockout counters of failed
//! logins.

use sqlx::Row;
use uuid::Uuid;

use super::audit::Target;
use super::revocation::Change;
use super::sessions::end_sessions_of_user;
use super::{Published, Revocation, Store, StoreError};

/// Sets a user's password as a password change does: every older token of
/// the user is outdated and their sessions end, in the caller's transaction
/// (API keys stay). `false` when there is no such user.
pub(super) async fn set_password_ending_sessions(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    hash: &str,
    now_secs: i64,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE users SET password_hash = $1, tokens_valid_after = $2, version = version + 1 WHERE id = $3",
    )
    .bind(hash)
    .bind(now_secs)
    .bind(user_id.to_string())
    .execute(&mut *conn)
    .await?;
    end_sessions_of_user(&mut *conn, user_id, now_secs.saturating_mul(1000), None).await?;
    Ok(updated.rows_affected() > 0)
}

impl Store {
    /// Replaces a user's password hash. With `outdate_at` (a password change),
    /// every older token of the user is outdated and their sessions end, in the
    /// same transaction; without it (a re-hash) nothing else changes.
    pub(crate) async fn update_password(
        &self,
        user_id: Uuid,
        hash: &str,
        outdate_at: Option<i64>,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let changed = match outdate_at {
                Some(now_secs) => {
                    set_password_ending_sessions(&mut tx, user_id, hash, now_secs).await?
                }
                None => {
                    sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
                        .bind(hash)
                        .bind(user_id.to_string())
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        > 0
                }
            };
            let revocation = outdate_at.map(|_| Revocation::User(user_id));
            Change::new(
                tx,
                changed,
                revocation,
                changed.then_some(Target::User(user_id)),
            )
        })
        .await
    }

    /// Counts one more consecutive failed login; returns the count.
    pub(crate) async fn record_login_failure(&self, user_id: Uuid) -> Result<i64, StoreError> {
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
    pub(crate) async fn clear_login_failures(&self, user_id: Uuid) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM login_lockouts WHERE user_id = $1 AND locked = 0")
            .bind(user_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Locks an account: disabled, its tokens outdated and sessions ended, and
    /// marked as locked so logins say why. Enabling the user lifts it.
    pub(crate) async fn lock_user(
        &self,
        user_id: Uuid,
        now_secs: i64,
    ) -> Result<Published<bool>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let updated = sqlx::query(
                "UPDATE users SET enabled = 0, tokens_valid_after = $1, version = version + 1 WHERE id = $2",
            )
            .bind(now_secs)
            .bind(user_id.to_string())
            .execute(&mut *tx)
            .await?;
            end_sessions_of_user(&mut tx, user_id, now_secs.saturating_mul(1000), None).await?;
            sqlx::query(
                "INSERT INTO login_lockouts (user_id, failures, locked) VALUES ($1, 0, 1) \
                 ON CONFLICT (user_id) DO UPDATE SET locked = 1",
            )
            .bind(user_id.to_string())
            .execute(&mut *tx)
            .await?;
            Change::unaudited(tx, updated.rows_affected() > 0, Revocation::User(user_id))
        })
        .await
    }

    pub(crate) async fn is_locked(&self, user_id: Uuid) -> Result<bool, StoreError> {
        let row =
            sqlx::query("SELECT COUNT(*) FROM login_lockouts WHERE user_id = $1 AND locked = 1")
                .bind(user_id.to_string())
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get::<i64, _>(0)? > 0)
    }
}
