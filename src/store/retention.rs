//! Periodic pruning of dead store rows: ended sessions, sessions whose refresh
//! token can no longer be valid, expired activation tokens and audit events,
//! each kept for its configured retention first, and used single sign-on
//! states once their cookie has expired ([`super::prune`] deletes).
//!
//! A run deletes in batches of `retention.batch_size` rows, at most
//! `retention.max_rows_per_run` of each kind, and stops between batches when
//! the server shuts down. Every replica runs it; the deletes are idempotent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{PruneKind, Store, StoreError};
use crate::telemetry::Metrics;
use crate::vocab::settings::RetentionSettings;

/// Added to the refresh lifetime before a live session counts as expired:
/// covers replicas whose clocks disagree and the moment between recording a
/// rotation and signing its token, so no session is pruned while a refresh
/// token of it could still be accepted.
pub const CLOCK_SLACK: Duration = Duration::from_secs(60);

/// The first run comes this soon after start (or after one interval, if
/// shorter), so replicas restarted more often than the interval still prune.
const FIRST_RUN_AFTER: Duration = Duration::from_secs(60);

/// Rows deleted by one run, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub ended_sessions: u64,
    pub expired_sessions: u64,
    pub activation_tokens: u64,
    pub sso_states: u64,
    pub audit_events: u64,
}

impl Pruned {
    fn add(&mut self, kind: PruneKind, rows: u64) {
        match kind {
            PruneKind::EndedSessions => self.ended_sessions += rows,
            PruneKind::ExpiredSessions => self.expired_sessions += rows,
            PruneKind::ActivationTokens => self.activation_tokens += rows,
            PruneKind::SsoStates => self.sso_states += rows,
            PruneKind::AuditEvents => self.audit_events += rows,
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.ended_sessions
            + self.expired_sessions
            + self.activation_tokens
            + self.sso_states
            + self.audit_events
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Rows of `kind` that died before the returned time (epoch ms) have been
/// dead for their whole retention at `now_ms`.
pub(crate) fn cutoff(
    kind: PruneKind,
    settings: &RetentionSettings,
    refresh_ttl: Duration,
    now_ms: i64,
) -> i64 {
    match kind {
        PruneKind::EndedSessions => now_ms.saturating_sub(millis(settings.sessions)),
        PruneKind::ExpiredSessions => now_ms
            .saturating_sub(millis(refresh_ttl))
            .saturating_sub(millis(CLOCK_SLACK))
            .saturating_sub(millis(settings.sessions)),
        PruneKind::ActivationTokens => now_ms.saturating_sub(millis(settings.activation_tokens)),
        // Nothing to keep once the cookie is refused as expired, on every
        // replica: its clock may be behind this one's by the slack.
        PruneKind::SsoStates => now_ms.saturating_sub(millis(CLOCK_SLACK)),
        PruneKind::AuditEvents => now_ms.saturating_sub(millis(settings.audit_events)),
    }
}

/// Prunes one store by its retention settings.
pub struct Pruner {
    pub store: Store,
    pub settings: RetentionSettings,
    /// The refresh-token lifetime (`jwt.refresh_token_expiration_time`).
    pub refresh_ttl: Duration,
    pub metrics: Arc<Metrics>,
}

impl Pruner {
    /// One run at `now_ms`: every kind in batches, within the per-run bound.
    /// Deleted rows are counted as they go, also when a later batch fails.
    pub(crate) async fn run_once(
        &self,
        now_ms: i64,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Pruned, (Pruned, StoreError)> {
        let mut pruned = Pruned::default();
        for kind in PruneKind::ALL {
            let before = cutoff(kind, &self.settings, self.refresh_ttl, now_ms);
            let mut deleted = 0_u64;
            while deleted < self.settings.max_rows_per_run && !*shutdown.borrow() {
                let left = self.settings.max_rows_per_run - deleted;
                let limit = u64::from(self.settings.batch_size).min(left) as u32;
                let rows = match self.store.prune(kind, before, limit).await {
                    Ok(rows) => rows,
                    Err(error) => return Err((pruned, error)),
                };
                deleted += rows;
                pruned.add(kind, rows);
                self.metrics.pruned(kind.label(), rows);
                if rows < u64::from(limit) {
                    break;
                }
                // Let other users of the store in between batches.
                tokio::task::yield_now().await;
            }
        }
        Ok(pruned)
    }

    /// Runs every `interval` until shutdown, logging each run that deleted
    /// something and each that failed. The pruning series exist (at 0) as
    /// soon as this is called.
    pub fn run(
        self,
        interval: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = ()> + Send {
        self.metrics
            .init_pruning(&PruneKind::ALL.map(PruneKind::label));
        self.run_every(interval, shutdown)
    }

    async fn run_every(self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut wait = interval.min(FIRST_RUN_AFTER);
        loop {
            if *shutdown.borrow() {
                return;
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = interval;
            let started = Instant::now();
            let (pruned, error) = match self.run_once(crate::clock::now_ms(), &shutdown).await {
                Ok(pruned) => (pruned, None),
                Err((pruned, error)) => (pruned, Some(error)),
            };
            self.metrics.prune_run(error.is_none());
            let elapsed_ms = started.elapsed().as_millis() as u64;
            if let Some(error) = error {
                tracing::warn!(
                    %error,
                    ended_sessions = pruned.ended_sessions,
                    expired_sessions = pruned.expired_sessions,
                    activation_tokens = pruned.activation_tokens,
                    sso_states = pruned.sso_states,
                    audit_events = pruned.audit_events,
                    elapsed_ms,
                    "pruning the store failed; retrying at the next run"
                );
            } else if pruned.total() > 0 {
                tracing::info!(
                    ended_sessions = pruned.ended_sessions,
                    expired_sessions = pruned.expired_sessions,
                    activation_tokens = pruned.activation_tokens,
                    sso_states = pruned.sso_states,
                    audit_events = pruned.audit_events,
                    elapsed_ms,
                    "pruned dead rows from the store"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RetentionSettings {
        RetentionSettings {
            interval: Some(Duration::from_secs(3600)),
            sessions: Duration::from_secs(100),
            activation_tokens: Duration::from_secs(10),
            audit_events: Duration::from_secs(1000),
            batch_size: 2,
            max_rows_per_run: 5,
        }
    }

    #[test]
    fn cutoffs_keep_each_kind_for_its_retention() {
        let s = settings();
        let ttl = Duration::from_secs(900);
        let now = 10_000_000;
        assert_eq!(
            cutoff(PruneKind::EndedSessions, &s, ttl, now),
            now - 100_000
        );
        assert_eq!(
            cutoff(PruneKind::ExpiredSessions, &s, ttl, now),
            now - 900_000 - 60_000 - 100_000
        );
        assert_eq!(
            cutoff(PruneKind::ActivationTokens, &s, ttl, now),
            now - 10_000
        );
        assert_eq!(cutoff(PruneKind::SsoStates, &s, ttl, now), now - 60_000);
        assert_eq!(
            cutoff(PruneKind::AuditEvents, &s, ttl, now),
            now - 1_000_000
        );
    }

    #[test]
    fn huge_retentions_saturate_instead_of_wrapping() {
        let s = RetentionSettings {
            sessions: Duration::MAX,
            ..settings()
        };
        for kind in [PruneKind::EndedSessions, PruneKind::ExpiredSessions] {
            assert!(cutoff(kind, &s, Duration::MAX, 5) <= i64::MIN + 6);
        }
    }
}
