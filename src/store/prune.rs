//! Deleting dead rows in bounded batches: ended sessions, sessions whose
//! refresh token can no longer be valid, expired activation tokens, used
//! single sign-on states whose cookie expired, and audit events past their
//! retention.
//!
//! Each call deletes at most `limit` rows in one short statement, so a big
//! backlog never holds a long lock. The deletes are idempotent: replicas
//! pruning the same store at once delete each row once and otherwise find
//! nothing. The condition is checked again on the rows being deleted, so a
//! row that changed after it was selected is left alone.

use sqlx::AssertSqlSafe;

use super::{Store, StoreError};

/// What a prune statement deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneKind {
    /// Sessions ended (logout, refresh-token reuse, password change, disabled
    /// or locked user) before the cutoff.
    EndedSessions,
    /// Live sessions whose refresh token last rotated before the cutoff.
    ExpiredSessions,
    /// Activation tokens that expired before the cutoff (used ones are
    /// deleted when they are used).
    ActivationTokens,
    /// Used single sign-on states whose cookie expired before the cutoff: a
    /// cookie that old is refused as expired, remembered or not.
    SsoStates,
    /// Audit events written before the cutoff.
    AuditEvents,
}

impl PruneKind {
    pub const ALL: [PruneKind; 5] = [
        PruneKind::EndedSessions,
        PruneKind::ExpiredSessions,
        PruneKind::ActivationTokens,
        PruneKind::SsoStates,
        PruneKind::AuditEvents,
    ];

    /// The metric label and log field.
    pub fn label(self) -> &'static str {
        match self {
            PruneKind::EndedSessions => "ended_sessions",
            PruneKind::ExpiredSessions => "expired_sessions",
            PruneKind::ActivationTokens => "activation_tokens",
            PruneKind::SsoStates => "sso_states",
            PruneKind::AuditEvents => "audit_events",
        }
    }

    /// (table, key column, condition on `$1` = the cutoff in epoch ms). Each
    /// condition is served by an index (migrations 4, 5 and 14).
    fn target(self) -> (&'static str, &'static str, &'static str) {
        match self {
            PruneKind::EndedSessions => ("sessions", "id", "ended = 1 AND ended_time < $1"),
            PruneKind::ExpiredSessions => ("sessions", "id", "ended = 0 AND refreshed_time < $1"),
            PruneKind::ActivationTokens => ("activation_tokens", "digest", "expires_at < $1"),
            PruneKind::SsoStates => ("sso_used_states", "digest", "expires_at < $1"),
            PruneKind::AuditEvents => ("audit_events", "id", "created_time < $1"),
        }
    }
}

impl Store {
    /// Deletes at most `limit` rows of `kind` that died before `cutoff_ms`;
    /// returns how many were deleted.
    pub(crate) async fn prune(
        &self,
        kind: PruneKind,
        cutoff_ms: i64,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let (table, key, condition) = kind.target();
        let sql = format!(
            "DELETE FROM {table} WHERE {key} IN \
             (SELECT {key} FROM {table} WHERE {condition} LIMIT $2) AND {condition}"
        );
        let result = sqlx::query(AssertSqlSafe(sql))
            .bind(cutoff_ms)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }
}
