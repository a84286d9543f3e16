//! Logins: password changes and re-hashes, and the lockout counters of failed
//! logins.

use sqlx::Row;
use uuid::Uuid;

use super::revocation::Change;
use super::rows::Target;
use super::sessions::outdate_user;
use super::{Store, StoreError};
use crate::vocab::revocation::{Published, Revocation};

/// Sets a user's password as a password change does: every older token of
/// the user is outdated and their sessions end, in the caller's transaction
/// (API keys stay). A password set is nobody's re-hash: the hash it
/// re-hashed is forgotten. `false` when there is no such user.
pub(super) async fn set_password_ending_sessions(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    hash: &str,
    now_secs: i64,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE users SET password_hash = $1, password_rehashed_from = NULL, \
         version = version + 1 WHERE id = $2",
    )
    .bind(hash)
    .bind(user_id.to_string())
    .execute(&mut *conn)
    .await?;
    outdate_user(&mut *conn, user_id, now_secs).await?;
    Ok(updated.rows_affected() > 0)
}

/// A re-hash: the same password, so no token ends. The user remembers the
/// first hash of a chain of re-hashes (`password_rehashed_from`), which an
/// import compares with the platform's hash it imported last
/// (the import's `password_from_platform`): a re-hash of the
/// platform's password is still the platform's.
async fn rehash(
    conn: &mut sqlx::AnyConnection,
    user_id: Uuid,
    from: Option<&str>,
    to: &str,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE users SET password_rehashed_from = COALESCE(password_rehashed_from, password_hash), \
         password_hash = $1 WHERE id = $2 AND ($3 IS NULL OR password_hash = $3)",
    )
    .bind(to)
    .bind(user_id.to_string())
    .bind(from)
    .execute(&mut *conn)
    .await?;
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
                None => rehash(&mut tx, user_id, None, hash).await?,
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

    /// Replaces the hash `from` a user's password had with its re-hash `to`
    /// (the same password, hashed anew: at login, an imported bcrypt hash
    /// becomes Argon2id). Nothing else changes, and nothing when the hash is
    /// no longer `from` (the password was set meanwhile, by the user or the
    /// platform's sync, and stays). `false` then.
    pub(crate) async fn rehash_password(
        &self,
        user_id: Uuid,
        from: &str,
        to: &str,
    ) -> Result<bool, StoreError> {
        // A transaction, the one unit of work a transaction pooler keeps
        // on one server connection.
        let mut tx = self.pool.begin().await?;
        let rehashed = rehash(&mut tx, user_id, Some(from), to).await?;
        tx.commit().await?;
        Ok(rehashed)
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
            let updated =
                sqlx::query("UPDATE users SET enabled = 0, version = version + 1 WHERE id = $1")
                    .bind(user_id.to_string())
                    .execute(&mut *tx)
                    .await?;
            outdate_user(&mut tx, user_id, now_secs).await?;
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
