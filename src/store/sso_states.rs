//! The `sso_used_states` table: single sign-on states whose callback keygate
//! has taken (digests only), each kept until its sign-in's cookie expires.
//!
//! A sign-in's state lives in the browser's signed cookie; remembering the
//! used ones here, in the shared store, is what stops a saved cookie from
//! ending a second sign-in (with a fresh code the provider hands out for the
//! same state, nonce and PKCE challenge) on this replica or any other.
//! Expired rows go with the other dead rows ([`super::PruneKind::SsoStates`]).

use super::{Store, StoreError};

impl Store {
    /// Takes the sign-in whose state has `digest`, remembering it until
    /// `expires_at` (epoch ms, its cookie's expiry). `true` for its first
    /// use, `false` when it was taken before, here or on another replica.
    ///
    /// One statement, atomic on the primary key: of two uses at once,
    /// exactly one inserts the row, and the other finds the conflict. It
    /// runs outside any transaction, so it holds no connection between
    /// statements (safe behind a transaction-pooling PgBouncer).
    pub(crate) async fn take_sso_state(
        &self,
        digest: &str,
        expires_at: i64,
    ) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO sso_used_states (digest, expires_at) VALUES ($1, $2) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }
}
