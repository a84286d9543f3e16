//! Keeping keygate in sync with the platform's database while `keygate
//! serve` runs (`[platform] database_url`): every `sync_interval` one
//! replica reads the platform's database and applies what changed through
//! the import ([`super::import`], one code path), then applies what the
//! writes revoked to its caches and open sockets the way every change does
//! ([`crate::auth::Authenticator::revoke`]); other replicas hear of it by
//! notification.
//!
//! The platform's tables have no column that moves on every change a sync
//! needs (`tb_user.version` misses `user_credentials` and `api_key`), so
//! each round asks the platform's database for a digest of what the import
//! reads ([`Source::fingerprint`]): the rows are read and compared only
//! when it moved since the last round applied.
//!
//! With several replicas on a PostgreSQL store, one applies at a time: the
//! round runs under a session advisory lock on the store
//! ([`Store::try_sync_lock`]); a replica that does not get it skips the
//! round. An SQLite store serves one replica.
//!
//! The platform's database down leaves keygate serving from its own store
//! (`/readyz` stays ready): the error is logged once per outage, and once on
//! recovery, and counted every round.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::watch;

use super::source::Source;
use super::{ImportError, Options, Origin, Report, Skipped};
use crate::auth::Authenticator;
use crate::config::SyncSettings;
use crate::store::Store;
use crate::telemetry::Metrics;

/// The sync task's state between rounds.
pub struct Sync {
    store: Store,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    settings: SyncSettings,
    /// Seals the platform's second factors as the server does.
    sealer: Arc<crate::auth::at_rest::Sealer>,
    /// Whether this keygate sends mail (EMAIL second factors follow then).
    mail: bool,
    /// The digest of the platform's rows the last applied round read.
    applied: Option<String>,
    /// Whether the last round failed (an outage is logged once).
    failing: bool,
    /// With the platform's signing key from the store (not configured):
    /// the issuer to sign with when the stored one is blank. The key the
    /// platform rotates to is then followed every round.
    follow_key: Option<String>,
    /// `login.max_bcrypt_cost`.
    max_bcrypt_cost: u32,
    /// The rows the last applied round held back (kind, id, reason): a row
    /// still held back is logged, audited and counted once, not every round.
    held_back: HashSet<(&'static str, String, String)>,
    /// Whether a bootstrap administrator kept for having been used was told
    /// of (once, not every round).
    told_bootstrap_kept: bool,
    /// [`Store::last_key_import`] as this replica last read it.
    keys_imported_at: Option<i64>,
}

/// What one round did.
#[derive(Debug)]
pub enum Round {
    /// Another replica holds the lock.
    NotMine,
    /// Nothing the import reads changed since the last round applied.
    Unchanged,
    Applied(Box<Report>),
}

impl Sync {
    pub fn new(
        store: Store,
        auth: Arc<Authenticator>,
        metrics: Arc<Metrics>,
        settings: SyncSettings,
        sealer: Arc<crate::auth::at_rest::Sealer>,
        mail: bool,
        max_bcrypt_cost: u32,
    ) -> Sync {
        Sync {
            store,
            auth,
            metrics,
            settings,
            sealer,
            mail,
            applied: None,
            failing: false,
            follow_key: None,
            max_bcrypt_cost,
            held_back: HashSet::new(),
            told_bootstrap_kept: false,
            keys_imported_at: None,
        }
    }

    /// Follows the platform's signing key as the store holds it, with
    /// `fallback_issuer` for a blank stored issuer; `None`: the key is
    /// configured and stays.
    pub fn following_the_signing_key(mut self, fallback_issuer: Option<String>) -> Sync {
        self.follow_key = fallback_issuer;
        self
    }

    /// Runs a round at once, then one every interval, until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(
            interval = ?self.settings.interval,
            "syncing with the platform's database"
        );
        loop {
            self.round().await;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.settings.interval) => {}
            }
        }
    }

    /// One round, counted and logged. Every replica then signs platform
    /// tokens with the key in the store, which the replica that applied the
    /// round may just have changed.
    pub async fn round(&mut self) -> Option<Round> {
        let round = self.import_round().await;
        self.follow_signing_key().await;
        self.follow_key_imports().await;
        round
    }

    /// A key the platform rotated to reaches this replica's platform tokens
    /// within one round, without a restart: the round that imported it
    /// stored it, and every replica reads it here. Tokens signed with the
    /// old key, which the platform refuses from now on, are dropped.
    async fn follow_signing_key(&self) {
        let Some(fallback_issuer) = &self.follow_key else {
            return;
        };
        let (text, issuer) = match self.store.platform_signing().await {
            Ok(Some(stored)) => stored,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "reading the platform's signing key failed");
                return;
            }
        };
        use base64::Engine as _;
        let Some(key) = crate::config::platform_key_engine()
            .decode(text.trim())
            .ok()
            .filter(|bytes| bytes.len() >= 64)
        else {
            // The import stores only keys HS512 can use.
            return;
        };
        let issuer = if issuer.trim().is_empty() {
            fallback_issuer.as_str()
        } else {
            issuer.as_str()
        };
        if self.auth.caches().passports.rekey_platform(&key, issuer) {
            tracing::warn!(
                "the platform's signing key changed: platform tokens are signed with the new key from now on"
            );
        }
    }

    /// A key the sync imported works on every replica from the next round,
    /// whatever `cache.negative_ttl`: a replica that did not apply the round
    /// (or restarted) sees the store's last key import move and forgets the
    /// key values it found unknown (the one that applied it forgot the
    /// imported ones already).
    async fn follow_key_imports(&mut self) {
        let latest = match self.store.last_key_import().await {
            Ok(latest) => latest,
            Err(error) => {
                tracing::debug!(%error, "reading when keys were last imported failed");
                return;
            }
        };
        if self.keys_imported_at.replace(latest) != Some(latest) {
            self.auth.caches().forget_unknown_keys();
        }
    }

    async fn import_round(&mut self) -> Option<Round> {
        match self.try_round().await {
            Ok(round) => {
                if self.failing {
                    tracing::info!("the platform's database is reachable again; syncing");
                    self.failing = false;
                }
                if !matches!(round, Round::NotMine) {
                    self.metrics.sync_succeeded(crate::clock::now_secs());
                }
                Some(round)
            }
            Err(error) => {
                self.metrics.sync_failed();
                if !self.failing {
                    tracing::error!(
                        %error,
                        "sync with the platform's database failed; serving from keygate's store until it recovers (logged once per outage)"
                    );
                    self.failing = true;
                }
                None
            }
        }
    }

    async fn try_round(&mut self) -> Result<Round, ImportError> {
        let Some(lock) = self.store.try_sync_lock().await? else {
            return Ok(Round::NotMine);
        };
        let mut source = Source::open(&self.settings.database_url).await?;
        let result = self.apply(&mut source).await;
        source.close().await;
        lock.release().await;
        result
    }

    async fn apply(&mut self, source: &mut Source) -> Result<Round, ImportError> {
        source.check_schema().await?;
        let fingerprint = source.fingerprint().await?;
        if self.applied.as_ref() == Some(&fingerprint) {
            return Ok(Round::Unchanged);
        }
        let options = Options {
            database_url: self.settings.database_url.clone(),
            dry_run: false,
            // The platform owns the users: one deleted there goes here too.
            prune: true,
            origin: Origin::Sync,
            sealer: self.sealer.clone(),
            mail: self.mail,
            max_bcrypt_cost: self.max_bcrypt_cost,
        };
        let quiet = |_: &str| {};
        let result = super::import(&self.store, &options, source, &quiet).await;
        let report = match result {
            Ok(report) => report,
            Err(error) => return Err(error),
        };
        for revocation in &report.revocations {
            self.auth.revoke(Some(*revocation)).await;
        }
        // A key tried before this round brought it in was cached as unknown.
        self.auth.caches().forget_keys(&report.new_key_values);
        self.count(&report);
        self.held_back(&report).await;
        self.bootstrap_admin(&report);
        self.applied = Some(fingerprint);
        Ok(Round::Applied(Box::new(report)))
    }

    fn count(&self, report: &Report) {
        let applied = [
            ("users_added", report.users.added),
            ("users_updated", report.users.updated),
            ("users_removed", report.users.removed),
            ("keys_added", report.keys.added),
            ("keys_updated", report.keys.updated),
            ("keys_removed", report.keys.removed),
        ];
        let mut any = false;
        for (kind, rows) in applied {
            self.metrics.sync_applied(kind, rows);
            any |= rows > 0;
        }
        if any {
            tracing::info!(
                users_added = report.users.added,
                users_updated = report.users.updated,
                users_removed = report.users.removed,
                keys_added = report.keys.added,
                keys_updated = report.keys.updated,
                keys_removed = report.keys.removed,
                "applied the platform's changes"
            );
        }
    }

    /// Says what became of the bootstrap administrator: removed (audited
    /// by the import), or kept for having been used (told once).
    fn bootstrap_admin(&mut self, report: &Report) {
        let Some(admin) = &report.bootstrap_admin else {
            return;
        };
        match admin.reason.as_deref() {
            None => tracing::warn!(
                email = %admin.email,
                "removed the bootstrap administrator: an administrator imported from the platform can log in"
            ),
            Some(reason) if !self.told_bootstrap_kept => {
                tracing::warn!(
                    email = %admin.email,
                    reason,
                    "kept the bootstrap administrator beside the platform's administrator"
                );
                self.told_bootstrap_kept = true;
            }
            Some(_) => {}
        }
    }

    /// Announces the rows held back that the last round did not hold back
    /// ([`super::announce`]: a log line and an audit event each) and counts
    /// them by reason; a row held back round after round is told once.
    async fn held_back(&mut self, report: &Report) {
        let now: HashSet<(&'static str, String, String)> = report
            .skipped
            .iter()
            .map(|s| (s.kind, s.id.clone(), s.reason.clone()))
            .collect();
        let new: Vec<Skipped> = report
            .skipped
            .iter()
            .filter(|s| {
                !self
                    .held_back
                    .contains(&(s.kind, s.id.clone(), s.reason.clone()))
            })
            .cloned()
            .collect();
        for skipped in &new {
            self.metrics.platform_row_skipped(skipped.code);
        }
        super::announce(&self.store, Origin::Sync, &new).await;
        self.held_back = now;
    }
}
