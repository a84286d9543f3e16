//! The `reset_tokens` table: one-time tokens, sent by mail, with which an
//! active user sets a new password. Only digests are stored.

use sqlx::Row;
use uuid::Uuid;

use super::logins::set_password_ending_sessions;
use super::revocation::Change;
use super::rows::Target;
use super::{Store, StoreError};
use crate::vocab::revocation::{Published, Revocation};

/// What the lookup of a token mailed in a link found: a reset token, or an
/// activation token ([`super::ActivationToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailedToken {
    /// No such token: never issued, used, replaced by a newer one (a reset
    /// token), or pruned.
    Unknown,
    /// Issued, but past its lifetime.
    Expired,
    /// Valid, for this user.
    Valid(Uuid),
}

/// What a reset token's lookup found.
pub type ResetToken = MailedToken;

impl Store {
    /// Stores a new reset token digest for a user, replacing the user's older
    /// ones (only the newest link works) and dropping every expired token.
    pub(crate) async fn replace_reset_token(
        &self,
        user_id: Uuid,
        digest: &str,
        expires_at: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM reset_tokens WHERE user_id = $1 OR expires_at <= $2")
            .bind(user_id.to_string())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO reset_tokens (digest, user_id, expires_at) VALUES ($1, $2, $3)")
            .bind(digest)
            .bind(user_id.to_string())
            .bind(expires_at)
            .execute(&mut *tx)
            .await?;
        let event = self.record(&mut tx, Target::User(user_id)).await?;
        event.commit(tx).await?;
        Ok(())
    }

    /// What a reset token is, without using it.
    pub(crate) async fn reset_token(
        &self,
        digest: &str,
        now_ms: i64,
    ) -> Result<ResetToken, StoreError> {
        let row = sqlx::query("SELECT user_id, expires_at FROM reset_tokens WHERE digest = $1")
            .bind(digest)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else {
            return Ok(ResetToken::Unknown);
        };
        let expires_at: i64 = row.try_get(1)?;
        if expires_at <= now_ms {
            return Ok(ResetToken::Expired);
        }
        Ok(ResetToken::Valid(parse_uuid(row.try_get(0)?)?))
    }

    /// Uses a reset token once, atomically: the token is consumed by a single
    /// `DELETE ... RETURNING` (of two concurrent uses, one wins) and the
    /// password is set as a password change sets it: every earlier session
    /// and token of the user ends, API keys stay. The outcome is the user id,
    /// or `None` for an unknown, expired or already used token.
    pub(crate) async fn reset_password(
        &self,
        digest: &str,
        password_hash: &str,
        now_ms: i64,
        now_secs: i64,
    ) -> Result<Published<Option<Uuid>>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let row = sqlx::query(
                "DELETE FROM reset_tokens WHERE digest = $1 AND expires_at > $2 RETURNING user_id",
            )
            .bind(digest)
            .bind(now_ms)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                return Change::new(tx, None, None, None);
            };
            let user_id = parse_uuid(row.try_get(0)?)?;
            let changed =
                set_password_ending_sessions(&mut tx, user_id, password_hash, now_secs).await?;
            let revocation = changed.then_some(Revocation::User(user_id));
            let audit = changed.then_some(Target::User(user_id));
            Change::new(tx, changed.then_some(user_id), revocation, audit)
        })
        .await
    }
}

fn parse_uuid(text: String) -> Result<Uuid, StoreError> {
    Uuid::parse_str(&text).map_err(|_| StoreError::Corrupt(format!("bad uuid {text:?}")))
}
