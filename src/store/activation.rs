//! The `activation_tokens` table: one-time tokens with which a new user sets
//! their first password.

use sqlx::Row;
use uuid::Uuid;

use super::revocation::Change;
use super::rows::Target;
use super::sessions::outdate_user;
use super::{Store, StoreError};
use crate::vocab::revocation::{Published, Revocation};

/// How long an activation link stays valid.
pub const ACTIVATION_TTL_MS: i64 = 24 * 3600 * 1000;

/// A pending activation link with less than this left is renewed rather than
/// shown again, as the platform renews its own (`checkUserActivationToken`).
pub const ACTIVATION_RENEW_MS: i64 = 15 * 60 * 1000;

/// An activation token as the store holds it ([`Store::activation_token`]).
pub type ActivationToken = super::reset::MailedToken;

impl Store {
    /// Stores a new activation token digest for a user. The user's other
    /// tokens stay: a link already mailed keeps working until it expires or
    /// the user activates (which consumes them all). The same digest again
    /// only sets its expiry.
    pub(crate) async fn add_activation(
        &self,
        user_id: Uuid,
        digest: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO activation_tokens (digest, user_id, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (digest) DO UPDATE SET expires_at = excluded.expires_at",
        )
        .bind(digest)
        .bind(user_id.to_string())
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        let event = self.record(&mut tx, Target::User(user_id)).await?;
        event.commit(tx).await?;
        Ok(())
    }

    /// The digests and expiry times (epoch ms) of a user's unexpired
    /// activation tokens, the longest-lived first.
    pub(crate) async fn pending_activations(
        &self,
        user_id: Uuid,
        now_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT digest, expires_at FROM activation_tokens \
             WHERE user_id = $1 AND expires_at > $2 ORDER BY expires_at DESC",
        )
        .bind(user_id.to_string())
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    /// The user an unexpired activation token belongs to, without using it.
    pub(crate) async fn activation_user(
        &self,
        digest: &str,
        now_ms: i64,
    ) -> Result<Option<Uuid>, StoreError> {
        let row = sqlx::query(
            "SELECT user_id FROM activation_tokens WHERE digest = $1 AND expires_at > $2",
        )
        .bind(digest)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| parse_uuid(row.try_get(0)?)).transpose()
    }

    /// What an activation token is, without using it: unknown (never
    /// issued, used, or pruned after expiring), expired, or valid for a
    /// user. Expired tokens stay until the retention prunes them
    /// (`retention.activation_tokens`), so a late click is told so.
    pub(crate) async fn activation_token(
        &self,
        digest: &str,
        now_ms: i64,
    ) -> Result<ActivationToken, StoreError> {
        let row =
            sqlx::query("SELECT user_id, expires_at FROM activation_tokens WHERE digest = $1")
                .bind(digest)
                .fetch_optional(&self.pool)
                .await?;
        let Some(row) = row else {
            return Ok(ActivationToken::Unknown);
        };
        let expires_at: i64 = row.try_get(1)?;
        if expires_at <= now_ms {
            return Ok(ActivationToken::Expired);
        }
        Ok(ActivationToken::Valid(parse_uuid(row.try_get(0)?)?))
    }

    /// Uses an activation token once, atomically: the token is consumed by a
    /// single `DELETE ... RETURNING` (of two concurrent uses, one wins), and the
    /// password is set only when the account has none yet. Every earlier
    /// session and token of the user ends, as with any password set. The
    /// outcome is the user id, or `None` for an unknown, expired or already used token or
    /// an account that already has a password.
    pub async fn activate(
        &self,
        digest: &str,
        password_hash: &str,
        now_ms: i64,
        now_secs: i64,
    ) -> Result<Published<Option<Uuid>>, StoreError> {
        self.revoking_write(|mut tx| async move {
            let row = sqlx::query(
                "DELETE FROM activation_tokens WHERE digest = $1 AND expires_at > $2 RETURNING user_id",
            )
            .bind(digest)
            .bind(now_ms)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                return Change::new(tx, None, None, None);
            };
            let user_id: String = row.try_get(0)?;
            sqlx::query("DELETE FROM activation_tokens WHERE user_id = $1")
                .bind(&user_id)
                .execute(&mut *tx)
                .await?;
            let updated = sqlx::query(
                "UPDATE users SET password_hash = $1, password_rehashed_from = NULL, \
                 version = version + 1 WHERE id = $2 AND password_hash = ''",
            )
            .bind(password_hash)
            .bind(&user_id)
            .execute(&mut *tx)
            .await?;
            let user_id = parse_uuid(user_id)?;
            let activated = updated.rows_affected() == 1;
            if activated {
                outdate_user(&mut tx, user_id, now_secs).await?;
            }
            // Consumed either way: a token of an account that has a password is void.
            let revocation = activated.then_some(Revocation::User(user_id));
            let audit = activated.then_some(Target::User(user_id));
            Change::new(tx, activated.then_some(user_id), revocation, audit)
        })
        .await
    }
}

fn parse_uuid(text: String) -> Result<Uuid, StoreError> {
    Uuid::parse_str(&text).map_err(|_| StoreError::Corrupt(format!("bad uuid {text:?}")))
}
